"""A seeded config fuzzer (issue 49, item 2): no config may be CHARGED, THEN FAIL.

Invariant, for every config tried: the run either ends BEFORE the charge (exit 2: invalid config,
exit 3: refused by the budget; the ledger's spent epsilon and delta unchanged, no "charged" event
for the run id, and no ``centers/`` or ``summary.json`` under ``output.path``) or it SUCCEEDS
(exit 0). "Charged, then failed" (the balance changed or a charge was recorded and the exit code
is not 0), an exit code 1 at all, or an exception out of ``main`` is a violation; the assertion
message lists every offending config (its ``--set`` list) and what happened (exit code, the
ledger's spent (epsilon, delta) before and after, whether a charge event was recorded, the error
text the analyst saw and, for a ``RunFailed``, the operator record's).

What is tried (``random.Random(SEED)``, SEED below): the four fixed CLI cases of issue 49 (auto in
2 dimensions with k=1001 on a 120-row table, and with epsilon=100, delta=1e-6; each with
algorithm.name unset (the default) and set to auto), then N_CLI generated configs: 4 + 160 = 164
CLI configs. On ``DPClustering``: the two fixed cases as Params, then N_ML configs of the same
generator (another seed, ML_VALID_SHARE valid) mapped to Params: 2 + 14 = 16 fits.

The generator covers every key of every family (``KEYS`` of dpspark/{maxcover,dplloyd,ldp,auto}/
params.py: auto has none, so any family key given to auto is an unknown key), algorithm.name,
objective, k, privacy.epsilon/delta/budget, domain.lower/upper/radius/dim, input.features,
input.where, input.privacy_unit, output.report, seed, unsafe_fixed_seed, diagnostics, spark.conf,
and unknown keys. VALID_SHARE (15%) of the generated configs are a consistent, valid config of one
family; the others are such a config with 1-3 keys replaced by a boundary or hostile value (0,
negative, 10**12, 1e308, NaN, "nan", strings, lists, bools, null, k larger than n, epsilon 1e-9
and 1e9, delta 0 and 0.5, ...). Hostile values that validation rightly accepts (k=100000, epsilon
1e9, a 1e300-wide domain, a filter that keeps no row, ...) run as well: about 30% of the configs
get past validation and read the data, the rest are refused in milliseconds. The generator never
varies a key whose legitimate failure is exit 1 BEFORE any charge by design (input.path/format/
version: a missing table or version; a candidate_table or ldp report folders that do not exist).

A run still going after RUN_LIMIT seconds is stopped with SIGINT (as a scheduler's timeout would:
``dpspark run`` records the attempt as killed, exit 130) and reported as a TIMEOUT violation,
saying whether it had been charged: on 120 rows no run needs that long.

Data: one 120-row Delta table (3 blobs in [0, 100]^3, plus NaN, +-inf, 1e308 and null values,
duplicated rows, several rows of one person), one public candidate table; a ledger with a huge cap
(epsilon 1e12, delta 0.9, central and local) so the budget refuses nothing by accident, and a
second one with a small cap (epsilon 0.5, delta 1e-7) that SMALL_CAP_SHARE of the configs are
charged to (exit 3). No seed: the runs are private and randomised (a fixed seed is refused with a
ledger by design).

Cost: a config refused at validation costs milliseconds, a run 2-10 s on the shared 2-core machine
(slower under load); the report the test prints (-s) gives the counts and times.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import io
import json
import math
import os
import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import yaml

from dpspark.cli import main
from dpspark.config import TEXT_KEYS
from dpspark.errors import RunKilled

from conftest import blobs

SEED = 4902
N_CLI = 160  # generated CLI configs (plus the fixed ones)
N_ML = 14  # generated DPClustering fits (plus the fixed ones)
VALID_SHARE = 0.15  # share of generated CLI configs left valid
ML_VALID_SHARE = 0.4  # the same for DPClustering (fewer configs: more of them fit)
SMALL_CAP_SHARE = 0.07  # share charged to the small-cap ledger
MIN_CLI_RUNS = 25  # the fuzzer must actually run configs, not only test the parser
MIN_ML_FITS = 4
RUN_LIMIT = 30.0  # seconds: a run still going then is stopped (SIGINT, as a scheduler would) and reported
N_ROWS = 120

NAN = float("nan")
INF = float("inf")


# ---------------------------------------------------------------------------------------------
# The data, the ledgers, the base config (once per module)


def _rows():
    pts = blobs(38, [(20, 20, 30), (80, 30, 60), (50, 80, 10)], 5.0, 49)  # 114 points
    rows = [(float(x), float(y), float(z), i, "ab"[i % 2]) for i, (x, y, z) in enumerate(pts)]
    rows += [
        (NAN, 50.0, 50.0, 1000, "a"),
        (1e308, 1e308, -1e308, 1001, "b"),
        (INF, -INF, 0.0, 1002, None),
        (40.0, None, 20.0, 1003, "x" * 300),
        rows[0], rows[0],  # duplicates: identical records are still different people
    ]
    assert len(rows) == N_ROWS
    # several rows of one person (privacy_unit "user")
    return [r if i % 20 else (r[0], r[1], r[2], 7, r[4]) for i, r in enumerate(rows)]


@pytest.fixture(scope="module")
def fuzz(spark, tmp_path_factory):
    from dpspark import tables

    root = tmp_path_factory.mktemp("config-fuzz")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DPSPARK_LEDGER", raising=False)
        mp.setenv("DPSPARK_OPERATOR_LOG", str(root / "operator"))
        mp.setenv("DPSPARK_LOG_LEVEL", "WARNING")
        data = str(root / "points")
        spark.createDataFrame(_rows(), "x DOUBLE, y DOUBLE, z DOUBLE, user LONG, tag STRING") \
            .coalesce(1).write.format("delta").save(data)
        cands = str(root / "candidates")
        grid = [(float(a), float(b), float(c)) for a in (10, 50, 90) for b in (10, 50, 90) for c in (10, 50, 90)]
        spark.createDataFrame(grid, "x DOUBLE, y DOUBLE, z DOUBLE").coalesce(1).write.format("delta").save(cands)
        ledgers = {"big": str(root / "ledger-big"), "small": str(root / "ledger-small")}
        caps = {"big": ("1e12", "0.9"), "small": ("0.5", "1e-7")}
        for name, path in ledgers.items():
            for guarantee in ("central", "local"):
                assert main(["ledger", "set-budget", "--ledger", path, "--input", data, "--epsilon", caps[name][0],
                             "--delta", caps[name][1], "--guarantee", guarantee], spark=spark) == 0
        base = {
            "input": {"path": data, "format": "delta", "features": ["x", "y"]},
            "domain": {"lower": [0.0, 0.0], "upper": [100.0, 100.0]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6, "ledger": ledgers["big"]},
            "algorithm": {"k": 3},
            "output": {"path": str(root / "unused"), "report": False},
        }
        cfg = root / "base.yaml"
        cfg.write_text(yaml.safe_dump(base))
        yield SimpleNamespace(spark=spark, root=root, data=data, cands=cands, ledgers=ledgers, cfg=str(cfg),
                              key=tables.ledger_key_of(spark, data), operator=str(root / "operator"))


# ---------------------------------------------------------------------------------------------
# The generator


FEATURES = {1: ["x"], 2: ["x", "y"], 3: ["x", "y", "z"]}
GENERIC_HOSTILE = (0, -1, 10**12, 1e308, NAN, "nan", "abc", "", [1, 2], [], True, False, None, 1.5, {"a": 1})
VALID_WHERE = ("x > 10", "x >= 0 AND y <= 100", "tag = 'a'", "NOT (x BETWEEN 10 AND 20)", "lower(tag) = 'b'",
               "coalesce(z, 0) > 5", "user IN (1, 2, 3, 7)", "isnan(x) OR y IS NULL", "startswith(tag, 'a')")
EDGE_WHERE = ("x > 1e9", "user = -1", "isnan(x)", "tag IS NULL", "tag > 5", "x = 'abc'", "x +", "missing > 1",
              "x + 1 > 2", "1/0 = 1", "cast(x as int) = 1", "x > (SELECT 1)", "y < x", "rand() < 0.5",
              "x > 10; DROP TABLE t", "length(tag) > 3", "((((x > 1))))", "x > " + "9" * 400, "NULL")

# Boundary and hostile values per key (besides GENERIC_HOSTILE). ``d`` is the config's dimension.
def _edges(key: str, d: int) -> tuple:
    e = {
        "algorithm.name": ("", "kmeans", "MaxCover", "auto ", 1, ["auto"], "lloyd"),
        "algorithm.objective": ("kmedoids", "", "KMEANS", "kmedian", "kmeans"),
        "algorithm.k": (0, -1, N_ROWS, N_ROWS + 1, 1001, 100_000, 100_001, 10**12, 2.5, "3", "three", 1),
        "privacy.epsilon": (1e-9, 1e9, 100, 0, -1, 1e308, INF, NAN, "nan", "inf", 1e-3, 1e-300),
        "privacy.delta": (0, 0.5, 1, 1e-300, 0.999999, -1e-6, NAN, 1e-6, "0"),
        "privacy.budget.epsilon": (1e-9, 0.01, 1e12, 0, -1, NAN),
        "privacy.budget.delta": (0, 1e-9, 0.5, 1, NAN),
        "domain.lower": ([-1e300] * d, [0.0] * d, [50.0] * d, [0.0] * (d + 1), [NAN] * d, [-INF] * d, ["a"] * d,
                         [99.999] * d, 0, [-1e-9] * d),
        "domain.upper": ([1e300] * d, [100.0] * d, [50.0] * d, [100.0] * (d + 1), [NAN] * d, [INF] * d, [0.0] * d,
                         [1e-9] * d, 100, [1e308] * d),
        "domain.radius": (1e-9, 1e300, 0, -1, NAN, INF, "big", 200),
        "domain.dim": (0, 1, 2, 3, 5, -1),
        "input.features": (["x", "x"], ["tag", "y"], ["missing", "y"], [], ["x", "y", "z", "user"], ["user", "x"],
                           "x", ["y", "x"][:d] if d > 1 else ["z"]),
        "input.where": EDGE_WHERE + VALID_WHERE,
        "input.privacy_unit": ("missing", "x", "tag", "user", "z"),
        "output.report": (True, "yes", 1),
        "seed": (7, -1, "x"),
        "unsafe_fixed_seed": (True, "yes"),
        "diagnostics": (True, 1),
        "spark.conf.spark.sql.ansi.enabled": ("true", "false"),
        "spark.conf.spark.driver.maxResultSize": ("1k",),
        "spark.conf.spark.sql.shuffle.partitions": (2, 0),
        "spark.conf.spark.jars": ("/tmp/x.jar",),
        # maxcover
        "algorithm.candidates": ("grid", "random", "private", "tree", "grid_or_private", "table", "GRID", "all"),
        "algorithm.candidate_table": ("<input>", "", 5, "<cands>"),
        "algorithm.candidate_count": (1, 3, 10_000_000, 10**12, 1000),
        "algorithm.candidate_scales": (1, 20, 21),
        "algorithm.coverage_approx": (1e-9, 0.999999, 1),
        "algorithm.eps_split": ([0.4, 0.3, 0.3], [0.5, 0.5], {"candidates": 0.4, "coverage": 0.3, "counts": 0.3},
                                [1, 0, 0], [0.5, 0.6, 0.1], [NAN, 0.5, 0.5], {"coverage": 1.0}, [1e-300, 0.5, 0.5]),
        "algorithm.eps_candidates": (0.4, 1.0, 1e-12),
        "algorithm.eps_coverage": (0.3, 1.0, 1e-12),
        "algorithm.eps_counts": (0.3, 1.0, 1e-12),
        "algorithm.delta_candidates": (0.5, 1, 1e-12, 0.999999),
        "algorithm.n_upper": (1, 10**15, 10**16, N_ROWS),
        "algorithm.solver": ("weighted_kmeans", "local_search", "weiszfeld", "lloyd"),
        "algorithm.max_signatures": (1, 10**9, 10**9 + 1),
        "algorithm.max_pairs": (1, 10**12, 10**12 + 1),
        "algorithm.lloyd_share": (0.9, 0.91, 1e-12, 0.5),
        # dplloyd
        "algorithm.variant": ("average_k", "allocation_k", "average_nk", "allocation_nk", "dp-kccm"),
        "algorithm.iterations": (1, 2, 1001, 12),
        "algorithm.merge_factor": (1, 2, 100, 101),
        "algorithm.schedule": ("average", "allocation", "linear"),
        "algorithm.noise": ("su", "paper", "gaussian"),
        "algorithm.merge": ("weighted_kmeans", "nearest_pair", "none"),
        "algorithm.min_count": (1e12, 1e13, 1e-300),
        # ldp (no protocol/reports folder that exists: ingest mode is then a config error)
        "algorithm.mode": ("ingest", "simulate", "central"),
        "algorithm.protocol_path": ("", 5),
        "algorithm.reports_path": ("", 5),
        "algorithm.radii": (1, 30, 31),
        "algorithm.hashes": (1, 8, 65),
        "algorithm.buckets": (2, 4096, 4097),
        "algorithm.projection_dim": (1, 64, 65),
        "algorithm.fractions": ([1, 0, 0], [0.5, 0.5], [0.6, 0.6, -0.2], [1e-9, 0.5, 0.5 - 1e-9], [NAN] * 3),
        "algorithm.heavy_z": (0, 100, 101),
        "algorithm.prune_z": (0, 100, 101),
        "algorithm.candidates_per_hash": (1, 10_000, 10_001),
        # unknown keys
        "algorithm.bogus": (1,), "input.bogus": (1,), "privacy.bogus": (1,), "bogus": (1,), "domain.bogus": (1,),
    }
    return e[key]


def _family_keys() -> dict[str, tuple[str, ...]]:
    import importlib

    from dpspark.config import FAMILIES

    return {name: tuple(f"algorithm.{k}" for k in importlib.import_module(mod).KEYS) for name, mod in FAMILIES.items()}


COMMON_KEYS = ("algorithm.name", "algorithm.objective", "algorithm.k", "privacy.epsilon", "privacy.delta",
               "privacy.budget.epsilon", "privacy.budget.delta", "domain.lower", "domain.upper", "domain.radius",
               "domain.dim", "input.features", "input.where", "input.privacy_unit", "output.report", "seed",
               "unsafe_fixed_seed", "diagnostics", "spark.conf.spark.sql.ansi.enabled",
               "spark.conf.spark.driver.maxResultSize", "spark.conf.spark.sql.shuffle.partitions",
               "spark.conf.spark.jars")
UNKNOWN_KEYS = ("algorithm.bogus", "input.bogus", "privacy.bogus", "bogus", "domain.bogus")


@dataclass
class Case:
    name: str
    label: str  # fixed | valid | mutated
    family: str
    pairs: dict = field(default_factory=dict)  # config key -> Python value (None: unset)
    ledger: str = "big"


def _valid_family(rng: random.Random, family: str, objective: str, k: int, d: int, pairs: dict) -> None:
    """A consistent, valid choice of some of the family's keys."""
    maybe = lambda p=0.5: rng.random() < p  # noqa: E731
    if family == "maxcover":
        mode = rng.choice(["grid", "random", "private", "tree", "grid_or_private", "table", None])
        if mode is not None:
            pairs["algorithm.candidates"] = mode
        if mode == "table":
            pairs["algorithm.candidate_table"] = "<cands>"
        if mode in ("grid", "random", "private", "tree") and (d >= 3 or maybe()):
            # d = 3: at most 200 (a 3-D grid of the default 1000 took 40-90 s on this 120-row table)
            pairs["algorithm.candidate_count"] = rng.choice([max(k, 50), 200] + ([1000] if d < 3 else []))
        if mode in ("private", "grid_or_private") and maybe(0.3):
            pairs["algorithm.candidate_scales"] = rng.choice([1, 3, 5])
        if maybe(0.3):
            pairs["algorithm.coverage_approx"] = rng.choice([0.1, 0.5, 0.9])
        if mode not in ("grid_or_private", None) and maybe(0.4):
            private = mode in ("private", "tree")
            if maybe():
                pairs["algorithm.eps_split"] = [0.4, 0.3, 0.3] if private else [0.5, 0.5]
            elif private:
                pairs.update({"algorithm.eps_candidates": 0.4, "algorithm.eps_coverage": 0.3,
                              "algorithm.eps_counts": 0.3})
            else:
                pairs.update({"algorithm.eps_coverage": 0.6, "algorithm.eps_counts": 0.4})
        if mode == "private" and maybe(0.3):
            pairs["algorithm.delta_candidates"] = rng.choice([0.1, 0.5])
        if maybe(0.3):
            pairs["algorithm.n_upper"] = rng.choice([1000, 10**6])
        if maybe(0.3):
            pairs["algorithm.solver"] = "weighted_kmeans" if objective == "kmeans" else rng.choice(["local_search", "weiszfeld"])
        if maybe(0.2):
            pairs["algorithm.max_signatures"] = rng.choice([1000, 2_000_000])
        if maybe(0.2):
            pairs["algorithm.max_pairs"] = rng.choice([10_000, 32_000_000])
        if objective == "kmeans" and maybe(0.2):
            pairs["algorithm.lloyd_share"] = rng.choice([0.0, 0.3, 0.5])
    elif family == "dplloyd":
        variant = rng.choice(["average_k", "allocation_k", "average_nk", "allocation_nk", None])
        if variant is not None:
            pairs["algorithm.variant"] = variant
        schedule = "average" if variant in ("average_k", "average_nk") else "allocation"
        if maybe(0.5):
            pairs["algorithm.iterations"] = rng.choice([3, 5, 8]) if schedule == "allocation" else rng.choice([1, 3, 5])
        if (variant or "allocation_nk").endswith("_nk") and maybe(0.4):
            pairs["algorithm.merge_factor"] = rng.choice([2, 3, 4])
        if maybe(0.2):
            pairs["algorithm.schedule"] = schedule
        if maybe(0.3):
            pairs["algorithm.noise"] = rng.choice(["su", "paper"])
        if maybe(0.3):
            pairs["algorithm.merge"] = rng.choice(["weighted_kmeans", "nearest_pair"])
        if maybe(0.3):
            pairs["algorithm.min_count"] = rng.choice([0.0, 1.0, 5.0])
    elif family == "ldp":
        if maybe(0.2):
            pairs["algorithm.mode"] = "simulate"
        if maybe(0.3):
            pairs["algorithm.radii"] = rng.choice([2, 4, 6])
        if maybe(0.3):
            pairs["algorithm.hashes"] = rng.choice([1, 2])
        if maybe(0.3):
            pairs["algorithm.buckets"] = rng.choice([16, 64, 1024])
        if maybe(0.3):
            pairs["algorithm.projection_dim"] = rng.choice([1, 2, 4])
        if maybe(0.3):
            pairs["algorithm.fractions"] = rng.choice([[0.5, 0.25, 0.25], [0.4, 0.3, 0.3]])
        if maybe(0.2):
            pairs["algorithm.heavy_z"] = rng.choice([2.0, 4.0])
        if maybe(0.2):
            pairs["algorithm.prune_z"] = rng.choice([1.0, 2.0])
        if maybe(0.2):
            pairs["algorithm.candidates_per_hash"] = rng.choice([4, 20])


def _valid(rng: random.Random, name: str) -> Case:
    family = rng.choice(["auto", "auto", "maxcover", "dplloyd", "ldp"])
    d = rng.choices([2, 3, 1], weights=[8, 1, 1])[0]
    objective = "kmeans" if family == "dplloyd" else rng.choice(["kmeans", "kmedian"])
    k = rng.choice([1, 2, 3, 4, 5])
    pairs: dict = {
        "algorithm.name": None if family == "auto" and rng.random() < 0.5 else family,
        "algorithm.objective": objective, "algorithm.k": k,
        "privacy.epsilon": rng.choice([0.5, 1.0, 2.0, 4.0]),
        "privacy.delta": {"dplloyd": 0.0, "maxcover": rng.choice([1e-6, 1e-5]),
                          "auto": rng.choice([0.0, 1e-6, 1e-5]), "ldp": rng.choice([0.0, 1e-6])}[family],
        "input.features": FEATURES[d],
    }
    if rng.random() < 0.8:
        lo, hi = rng.choice([(0.0, 100.0), (-10.0, 110.0), (10.0, 90.0)])
        pairs.update({"domain.lower": [lo] * d, "domain.upper": [hi] * d})
    else:
        pairs.update({"domain.lower": None, "domain.upper": None, "domain.radius": rng.choice([150.0, 200.0])})
    if family != "ldp" and rng.random() < 0.25:
        pairs["input.where"] = rng.choice(VALID_WHERE)
    if rng.random() < 0.2:
        pairs["input.privacy_unit"] = "user"
    if rng.random() < 0.05:
        pairs.update({"privacy.budget.epsilon": 1e6, "privacy.budget.delta": 0.5})
    _valid_family(rng, family, objective, k, d, pairs)
    return Case(name=name, label="valid", family=family, pairs=pairs)


def _mutate(rng: random.Random, case: Case, family_keys: dict) -> None:
    d = len(case.pairs["input.features"])
    own = family_keys.get(case.family, ())
    others = tuple(k for f, ks in family_keys.items() if f != case.family for k in ks if k not in own)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        r = rng.random()
        if r < 0.5 or not own:
            key = rng.choice(COMMON_KEYS)
        elif r < 0.85:
            key = rng.choice(own)
        elif r < 0.95:
            key = rng.choice(others)
        else:
            key = rng.choice(UNKNOWN_KEYS)
        value = rng.choice(_edges(key, d)) if rng.random() < 0.6 else rng.choice(GENERIC_HOSTILE)
        if key == "domain.radius" and rng.random() < 0.6:  # a ball instead of the box
            case.pairs.update({"domain.lower": None, "domain.upper": None})
        case.pairs[key] = value
    # Files that do not exist are not config errors: a run then ends before its charge with exit 1 by
    # design (a missing candidate table; ldp ingest whose reports are not in). Keep them out.
    table = case.pairs.get("algorithm.candidate_table")
    if isinstance(table, str) and table not in ("", "<input>", "<cands>"):
        case.pairs["algorithm.candidate_table"] = "<cands>"
    if case.pairs.get("algorithm.mode") == "ingest" and all(
            isinstance(case.pairs.get(k), str) and case.pairs.get(k) for k in ("algorithm.protocol_path", "algorithm.reports_path")):
        case.pairs["algorithm.protocol_path"] = None
    case.label = "mutated"


def generate(seed: int, count: int, prefix: str, valid_share: float = VALID_SHARE) -> list[Case]:
    rng = random.Random(seed)
    family_keys = _family_keys()
    assert set(family_keys) == {"auto", "maxcover", "dplloyd", "ldp"}, family_keys
    cases = []
    for i in range(count):
        case = _valid(rng, f"{prefix}{i:03d}")
        if rng.random() >= valid_share:
            _mutate(rng, case, family_keys)
        if rng.random() < SMALL_CAP_SHARE:
            case.ledger = "small"
        cases.append(case)
    return cases


def _fixed(prefix: str, default_name: bool) -> list[Case]:
    """Issue 49's two cases: auto in 2 dimensions with k=1001 on a 120-row table, and with epsilon=100,
    delta=1e-6 (both were charged, then failed with RunFailed)."""
    name = None if default_name else "auto"
    common = {"algorithm.name": name, "input.features": ["x", "y"], "domain.lower": [0.0, 0.0],
              "domain.upper": [100.0, 100.0], "algorithm.objective": "kmeans"}
    tag = "default" if default_name else "auto"
    return [Case(f"{prefix}k1001-{tag}", "fixed", "auto",
                 {**common, "algorithm.k": 1001, "privacy.epsilon": 1.0, "privacy.delta": 1e-6}),
            Case(f"{prefix}eps100-{tag}", "fixed", "auto",
                 {**common, "algorithm.k": 3, "privacy.epsilon": 100.0, "privacy.delta": 1e-6})]


# ---------------------------------------------------------------------------------------------
# Running a case and judging it


def _render(value, key: str | None = None) -> str:
    """A Python value as ``--set`` text that parses back to it (dpspark.config.parse_value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, str):
        return value if key in TEXT_KEYS else "'" + value + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_render(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _resolve(value, env):
    if value == "<input>":
        return env.data
    if value == "<cands>":
        return env.cands
    return value


def set_list(case: Case, env) -> list[str]:
    return [f"{key}={_render(_resolve(value, env), key)}" for key, value in case.pairs.items()]


def _balance(env, ledger: str) -> dict:
    from dpspark.privacy.ledger import Ledger

    return {(b["input_key"], b["guarantee"]): (b["spent_epsilon"], b["spent_delta"])
            for b in Ledger(env.spark, env.ledgers[ledger]).balances()}


def _charge_events(env, ledger: str, run_id: str) -> list[str]:
    from dpspark.privacy.ledger import Ledger

    return [e["status"] for e in Ledger(env.spark, env.ledgers[ledger]).events(run_id=run_id)]


def _operator_error(env, run_id: str) -> str | None:
    texts = []
    for path in sorted(glob.glob(os.path.join(env.operator, run_id, "attempt-*.json"))):
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        tb = (record.get("traceback") or "").strip().splitlines()
        texts.append(tb[-1] if tb else str(record.get("error")))
    return " | ".join(t for t in texts if t) or None


@dataclass
class Outcome:
    case: Case
    sets: list
    code: object  # exit code, or for DPClustering "ok" / the exception's type
    before: dict
    after: dict
    events: list
    error: str | None
    outputs: list
    seconds: float
    violation: str | None = None


def _judge(o: Outcome, refused: bool, failed: bool, watchdog=None) -> None:
    changed = o.before != o.after
    charged = changed or "charged" in o.events
    if watchdog is not None and watchdog.fired:
        o.violation = (f"TIMEOUT: still running after {RUN_LIMIT:g}s, stopped with SIGINT"
                       + (f" (which did not stop it: {watchdog.injected} RunKilled injected)" if watchdog.injected else "")
                       + ("; it was CHARGED" if charged else " before any charge"))
    elif failed and charged:
        o.violation = "CHARGED, THEN FAILED"
    elif failed:
        o.violation = "failed (exit 1 / unexpected error) before the charge"
    elif refused and charged:
        o.violation = "refused (exit 2/3) but the ledger was charged"
    elif refused and o.outputs:
        o.violation = "refused (exit 2/3) but left outputs: " + ", ".join(o.outputs)


class _Injected(RunKilled):
    """RunKilled raised in the main thread by the watchdog (PyThreadState_SetAsyncExc) when a SIGINT did not
    stop the run."""

    def __init__(self, *args):
        super().__init__(signal.SIGINT)


class _Watchdog:
    """Stops a run that is still going after RUN_LIMIT seconds with SIGINT, the way a scheduler's timeout
    (or Ctrl-C) does: ``dpspark run`` has its own handler for it (RunKilled, exit 130, the attempt
    recorded as killed); during a DPClustering fit the handler installed here raises RunKilled after
    resetting the py4j connection (as the CLI's does). A signal's exception can be lost (raised inside
    a finalizer, e.g. an OpenDP object's ``__del__``, Python ignores it; dpspark's handler raises only
    once): then RunKilled is injected into the main thread every INJECT_EVERY seconds until the run
    ends. Outside a run nothing is sent."""

    INJECT_EVERY = 10.0

    def __init__(self):
        self.fired = False
        self.injected = 0
        self.active = False
        self.lock = threading.Lock()
        self.done = threading.Event()

    def _handler(self, signum, frame):
        if self.active:
            from dpspark.session import reset_py4j_connection

            reset_py4j_connection()
            raise RunKilled(signum)

    def _watch(self):
        if self.done.wait(RUN_LIMIT):
            return
        with self.lock:
            if self.done.is_set():
                return
            self.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        while not self.done.wait(self.INJECT_EVERY):
            with self.lock:
                if self.done.is_set():
                    return
                self.injected += 1
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.main), ctypes.py_object(_Injected))

    def __enter__(self):
        self.main = threading.get_ident()
        self.saved = signal.signal(signal.SIGINT, self._handler)
        self.active = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.done.set()
            self.active = False
            if self.injected:  # one not raised yet stays pending no longer
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.main), None)
        self.thread.join()
        signal.signal(signal.SIGINT, self.saved)
        if self.fired:
            from dpspark.session import reset_py4j_connection

            reset_py4j_connection()  # an exception raised inside a py4j call leaves its answer unread
        return False


def run_cli(env, case: Case) -> Outcome:
    run_id = case.name
    out = os.path.join(str(env.root), "out", run_id)
    sets = set_list(case, env)
    argv = ["run", "--config", env.cfg, "--run-id", run_id, "--json", "--set", f"output.path={out}",
            "--set", f"privacy.ledger={env.ledgers[case.ledger]}"]
    for item in sets:
        argv += ["--set", item]
    before = _balance(env, case.ledger)
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    watchdog = _Watchdog()
    try:
        with watchdog, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv, spark=env.spark)
    except BaseException as exc:  # noqa: BLE001 (SystemExit, anything): judged below
        code = f"raised {type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    after = _balance(env, case.ledger)
    error = None
    lines = [line for line in stdout.getvalue().strip().splitlines() if line.startswith("{")]
    if lines:
        try:
            error = json.loads(lines[-1]).get("error")
        except ValueError:
            pass
    if error is None and code != 0:
        error = stderr.getvalue().strip()[-600:] or None
    if code not in (0, 2, 3):
        op = _operator_error(env, run_id)
        if op:
            error = f"{error} || operator record: {op}"
    outputs = [p for p in ("summary.json", "centers") if os.path.exists(os.path.join(out, p))]
    o = Outcome(case, sets, code, before, after, _charge_events(env, case.ledger, run_id), error, outputs, seconds)
    _judge(o, refused=code in (2, 3), failed=code not in (0, 2, 3), watchdog=watchdog)
    return o


def _ml_params(case: Case, env) -> tuple[dict, list[str]]:
    """The case's config keys as DPClustering Params (keys without a Param are dropped and listed)."""
    from dpspark.ml import PARAMS

    by_key = {key: name for name, key, _, _ in PARAMS if key and key not in ("input.features", "input.path",
                                                                            "privacy.ledger")}
    params, dropped = {}, []
    for key, value in case.pairs.items():
        value = _resolve(value, env)
        if key == "input.features":
            params["inputCols"] = value
        elif key in by_key:
            if value is not None:
                params[by_key[key]] = value
        else:
            dropped.append(key)
    params.update(ledgerPath=env.ledgers[case.ledger], ledgerInput=env.data, runId=case.name)
    return params, dropped


def run_ml(env, case: Case) -> Outcome:
    from dpspark.errors import DPSparkError
    from dpspark.ml import DPClustering

    params, dropped = _ml_params(case, env)
    shown = [f"{k}={v!r}" for k, v in params.items() if k not in ("ledgerPath", "ledgerInput")]
    if dropped:
        shown.append(f"(no Param for: {', '.join(dropped)})")
    before = _balance(env, case.ledger)
    start = time.perf_counter()
    stage, error, code = "construct", None, "ok"
    refused = failed = False
    watchdog = _Watchdog()
    try:
        with watchdog, contextlib.redirect_stderr(io.StringIO()):
            est = DPClustering(**params)
            stage = "fit"
            df = env.spark.read.format("delta").load(env.data)
            est.fit(df)
    except (Exception, RunKilled) as exc:  # noqa: BLE001: judged below
        code = f"{type(exc).__name__} at {stage}"
        error = str(exc)[:600]
        exit_code = getattr(exc, "exit_code", None)
        if isinstance(exc, DPSparkError):
            refused, failed = exit_code in (2, 3), exit_code not in (2, 3)
        else:  # a Param converter's TypeError, a ValueError of the validation: before any Spark job
            refused = isinstance(exc, (TypeError, ValueError))
            failed = not refused
        if failed:
            op = _operator_error(env, case.name)
            if op:
                error = f"{error} || operator record: {op}"
    seconds = time.perf_counter() - start
    after = _balance(env, case.ledger)
    o = Outcome(case, shown, code, before, after, _charge_events(env, case.ledger, case.name), error, [], seconds)
    _judge(o, refused=refused, failed=failed, watchdog=watchdog)
    return o


def _cause(o: Outcome) -> str:
    """A grouping key for violations: the kind and the error text without numbers or paths."""
    text = re.sub(r"(?<![\w(])/[\w.-]+(/[\w.-]+)+", "<path>", str(o.error or ""))
    text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return f"{o.violation}: {text[:160]}"


def _describe(o: Outcome) -> str:
    spent = lambda s: {g: v for (_, g), v in s.items()}  # noqa: E731
    return (f"    {o.case.name} [{o.case.label}, {o.case.family}, ledger={o.case.ledger}] -> {o.code}; "
            f"spent (epsilon, delta) before {spent(o.before)}, after {spent(o.after)}; ledger events {o.events}; "
            f"{o.seconds:.1f}s\n      --set {' '.join(repr(s) for s in o.sets)}\n      error: {o.error}")


def report(what: str, outcomes: list[Outcome], elapsed: float) -> tuple[str, list[Outcome]]:
    bad = [o for o in outcomes if o.violation]
    codes = Counter(str(o.code) if not isinstance(o.code, int) else f"exit {o.code}" for o in outcomes)
    by_label = Counter(f"{o.case.label}:{'ok' if o.code in (0, 'ok') else 'ended'}" for o in outcomes)
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:3]
    lines = [f"{what}: {len(outcomes)} configs tried in {elapsed:.1f}s; outcomes {dict(codes)}; {dict(by_label)}; "
             f"run time of the runs that succeeded {sum(o.seconds for o in outcomes if o.code in (0, 'ok')):.1f}s; "
             f"slowest {[(o.case.name, round(o.seconds, 1)) for o in slow]}"]
    groups = defaultdict(list)
    for o in bad:
        groups[_cause(o)].append(o)
    lines.append(f"{len(bad)} violation(s) in {len(groups)} group(s)")
    for cause, members in groups.items():
        lines.append(f"  [{len(members)}x] {cause}")
        lines.extend(_describe(o) for o in members)
    return "\n".join(lines), bad


def _progress(runner, env, case: Case) -> Outcome:
    """Run one case, one line on stdout before and after (with -s: which config a slow run is)."""
    print(f"  {case.name} ...", end="", flush=True)
    o = runner(env, case)
    print(f" {o.code if isinstance(o.code, int) else str(o.code)[:60]} {o.seconds:.1f}s"
          + (f"  VIOLATION: {o.violation}" if o.violation else ""), flush=True)
    return o


# ---------------------------------------------------------------------------------------------
# The tests


def test_cli_configs_never_charge_then_fail(fuzz):
    """4 fixed + N_CLI = 160 generated configs (164 in all) through ``dpspark run``: each ends before the
    charge (exit 2 or 3, balance unchanged, no outputs) or succeeds (exit 0)."""
    cases = _fixed("fix-cli-", default_name=True) + _fixed("fix-cli-", default_name=False) + generate(SEED, N_CLI, "cli")
    assert len(cases) == 4 + N_CLI
    start = time.perf_counter()
    outcomes = [_progress(run_cli, fuzz, case) for case in cases]
    text, bad = report("CLI", outcomes, time.perf_counter() - start)
    print("\n" + text)
    ran = sum(1 for o in outcomes if o.code == 0)
    assert not bad, f"{len(outcomes)} configs tried (seed {SEED}), {len(bad)} charged-then-failed or other violations:\n{text}"
    assert ran >= MIN_CLI_RUNS, f"{len(outcomes)} configs tried, only {ran} ran to the end: the fuzzer only tests the parser\n{text}"
    assert any(o.code == 3 for o in outcomes), f"{len(outcomes)} configs tried, none refused by the budget\n{text}"


def test_dpclustering_params_never_charge_then_fail(fuzz):
    """2 fixed + N_ML = 14 generated configs (16 in all) as ``DPClustering(...).fit`` with a ledger: each
    raises before the charge (a ParamError/ConfigError/ValueError/TypeError of the validation, or
    BudgetRefused; balance unchanged) or returns a model."""
    cases = _fixed("fix-ml-", default_name=False) + generate(SEED + 1, N_ML, "ml", ML_VALID_SHARE)
    assert len(cases) == 2 + N_ML
    start = time.perf_counter()
    outcomes = [_progress(run_ml, fuzz, case) for case in cases]
    text, bad = report("DPClustering", outcomes, time.perf_counter() - start)
    print("\n" + text)
    fitted = sum(1 for o in outcomes if o.code == "ok")
    assert not bad, f"{len(outcomes)} configs tried (seed {SEED + 1}), {len(bad)} charged-then-failed or other violations:\n{text}"
    assert fitted >= MIN_ML_FITS, f"{len(outcomes)} configs tried, only {fitted} fitted\n{text}"
