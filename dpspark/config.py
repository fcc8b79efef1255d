"""Load a job config (YAML; JSON is valid YAML), apply ``--set`` overrides, validate.

Validation happens here and only here, before Spark starts: every problem is a
``ConfigError`` naming the key and what is allowed, and the command line turns
it into exit code 2. The result is a tree of frozen dataclasses.

Every value in the config is PUBLIC: domain bounds, k, the number of
iterations, candidate sets. None of them may be computed from private data,
and nothing here ever looks at the data.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import re
from datetime import date, datetime
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import yaml

from dpspark.errors import ConfigError
from dpspark.checks import check_number  # noqa: F401 (re-exported: the config's number rule)

FORMATS = ("delta", "parquet", "csv")
OBJECTIVES = ("kmeans", "kmedian")

# Families and the module that validates their keys (``validate_params``). A
# family is listed here only once it works end to end.
FAMILIES: dict[str, str] = {
    "auto": "dpspark.auto.params",
    "dplloyd": "dpspark.dplloyd.params",
    "maxcover": "dpspark.maxcover.params",
    "ldp": "dpspark.ldp.params",
}


DEFAULT_ALGORITHM = "auto"  # algorithm.name when the config does not set it


@dataclass(frozen=True)
class InputConfig:
    path: str | None
    format: str = "delta"
    features: tuple[str, ...] = ()
    privacy_unit: str | None = None
    version: int | None = None  # Delta time travel: read this version ...
    timestamp: str | None = None  # ... or the latest version at or before this time
    where: str | None = None  # SQL row filter, applied before contribution bounding
    table: str | None = None  # a catalog table name instead of path (Delta)

    @property
    def name(self) -> str:
        """What the config names: the path, or the catalog table."""
        return self.path if self.path is not None else f"table:{self.table}"


@dataclass(frozen=True)
class DomainConfig:
    """PUBLIC bounds of the data: a box (lower, upper) or an L2 ball of ``radius``."""

    dim: int
    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None
    radius: float | None = None
    # "private": the box is released by the run (dpspark.privacy.bounds), inside its epsilon and
    # delta; lower/upper, if given, are then only the public outer box the estimate searches.
    estimate: str | None = None
    epsilon_share: float | None = None

    @property
    def kind(self) -> str:
        return "ball" if self.radius is not None else "box"


@dataclass(frozen=True)
class BudgetConfig:
    epsilon: float
    delta: float


@dataclass(frozen=True)
class PrivacyConfig:
    epsilon: float
    delta: float
    ledger: str | None = None
    budget: BudgetConfig | None = None


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str
    objective: str
    k: int
    params: Any  # the family's own frozen dataclass


@dataclass(frozen=True)
class OutputConfig:
    path: str
    report: bool = True
    # a catalog name: the run's centers/ and runs/ are registered as <table>_centers, <table>_runs
    # (external Delta tables at their locations under path: dpspark.catalog)
    table: str | None = None


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = None
    app_name: str = "dpspark"
    conf: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Config:
    input: InputConfig
    domain: DomainConfig
    privacy: PrivacyConfig
    algorithm: AlgorithmConfig
    output: OutputConfig
    seed: int | None = None
    diagnostics: bool = False
    spark: SparkConfig = field(default_factory=SparkConfig)
    unsafe_fixed_seed: bool = False

    def to_dict(self) -> dict:
        """Plain, JSON-friendly view of the validated config (for the run record)."""
        return _plain(dataclasses.asdict(self))


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------
# Loading and overrides


def load_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path``, apply ``KEY=VALUE`` overrides, and validate."""
    raw = read_yaml(path)
    for item in overrides:
        apply_override(raw, item)
    return validate(raw)


def read_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError("--config", f"file not found: {path!r}")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        raise ConfigError("--config", f"{path!r} is not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("--config", f"{path!r} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


# Keys whose value is free text (a filter, a time, a path, a name): ``--set`` passes it as written, one
# value per flag (no comma splitting, no YAML: a filter may hold commas, colons or '#', a timestamp
# must stay a string). ``null`` or an empty value unsets the key.
TEXT_KEYS = frozenset({
    "input.path", "input.table", "input.where", "input.timestamp", "input.privacy_unit", "input.format",
    "output.path", "output.table", "privacy.ledger", "spark.master", "spark.app_name", "algorithm.name",
    "algorithm.objective", "algorithm.candidate_table", "algorithm.protocol_path", "algorithm.reports_path",
})


def parse_value(text: str, key: str | None = None):
    """Parse a ``--set`` value. A key of ``TEXT_KEYS`` takes the text as written (``null`` or nothing:
    unset). Else YAML scalars and lists (``[a, b]``), ``1,2`` is the list [1, 2], and a value YAML
    would read as a date or time stays the string written."""
    stripped = text.strip()
    if key in TEXT_KEYS:
        return None if stripped in ("", "null", "~") else stripped
    if "," in stripped and not stripped.startswith(("[", "{", "'", '"')):
        return [yaml.safe_load(part.strip()) if part.strip() else None for part in stripped.split(",")]
    try:
        value = yaml.safe_load(stripped) if stripped else None
    except yaml.YAMLError:
        return stripped
    if isinstance(value, (datetime, date)):
        return stripped
    if isinstance(value, str):
        try:
            return float(value)  # 1e-6: a number, though YAML 1.1 reads it as a string
        except ValueError:
            pass
    return value


def apply_override(raw: dict, item: str) -> None:
    if "=" not in item:
        raise ConfigError("--set", f"expected KEY=VALUE, got {item!r}")
    key, _, text = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError("--set", f"invalid key {key!r} in {item!r}")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
            node[part] = child
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), f"is not a section, cannot set {key!r}")
        node = child
    node[parts[-1]] = parse_value(text, key)


# ----------------------------------------------------------------------------
# Small typed readers: each names the key and what is allowed


class Section:
    """A mapping being validated: remembers which keys were read."""

    def __init__(self, name: str, data: Any, allowed: tuple[str, ...]):
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(name, f"must be a mapping with keys {list(allowed)}, got {data!r}")
        # A key set to null counts as absent (so `--set algorithm.variant=null` removes a key).
        unknown = sorted({str(k) for k, v in data.items() if v is not None} - set(allowed))
        if unknown:
            raise ConfigError(f"{name}.{unknown[0]}" if name else unknown[0], f"unknown key; allowed keys: {list(allowed)}")
        self.name = name
        self.data = dict(data)

    def key(self, k: str) -> str:
        return f"{self.name}.{k}" if self.name else k

    def has(self, k: str) -> bool:
        return self.data.get(k) is not None

    def raw(self, k: str, default=None):
        v = self.data.get(k)
        return default if v is None else v

    def string(self, k: str, default: str | None = None, required: bool = False, choices: tuple[str, ...] | None = None) -> str | None:
        v = self.data.get(k)
        if v is None:
            if required:
                raise ConfigError(self.key(k), "is required" + (f"; allowed: {list(choices)}" if choices else ""))
            return default
        if not isinstance(v, str) or not v:
            raise ConfigError(self.key(k), f"must be a non-empty string, got {v!r}")
        if choices is not None and v not in choices:
            raise ConfigError(self.key(k), f"{v!r} is not allowed; allowed: {list(choices)}")
        return v

    def number(self, k: str, default: float | None = None, required: bool = False, *, low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False) -> float | None:
        v = self.data.get(k)
        if v is None:
            if required:
                raise ConfigError(self.key(k), "is required")
            return default
        return check_number(self.key(k), v, low=low, high=high, low_open=low_open, high_open=high_open)

    def integer(self, k: str, default: int | None = None, required: bool = False, *, low: int | None = None, high: int | None = None) -> int | None:
        v = self.data.get(k)
        if v is None:
            if required:
                raise ConfigError(self.key(k), "is required")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise ConfigError(self.key(k), f"must be an integer, got {v!r}")
        if low is not None and v < low:
            raise ConfigError(self.key(k), f"must be >= {low}, got {v}")
        if high is not None and v > high:
            raise ConfigError(self.key(k), f"must be <= {high}, got {v}")
        return v

    def boolean(self, k: str, default: bool) -> bool:
        v = self.data.get(k)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ConfigError(self.key(k), f"must be true or false, got {v!r}")
        return v

    def numbers(self, k: str, required: bool = False) -> tuple[float, ...] | None:
        v = self.data.get(k)
        if v is None:
            if required:
                raise ConfigError(self.key(k), "is required (a list of numbers)")
            return None
        if not isinstance(v, (list, tuple)):
            v = [v]
        if not v:
            raise ConfigError(self.key(k), "must be a non-empty list of numbers")
        return tuple(check_number(f"{self.key(k)}[{i}]", x) for i, x in enumerate(v))

    def strings(self, k: str, required: bool = False) -> tuple[str, ...]:
        v = self.data.get(k)
        if v is None:
            if required:
                raise ConfigError(self.key(k), "is required (a list of column names)")
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, str) and x for x in v):
            raise ConfigError(self.key(k), f"must be a non-empty list of column names, got {v!r}")
        if len(set(v)) != len(v):
            raise ConfigError(self.key(k), f"lists a column twice: {list(v)}")
        return tuple(v)


# ----------------------------------------------------------------------------
# Validation


TOP_KEYS = ("input", "domain", "privacy", "algorithm", "output", "seed", "unsafe_fixed_seed", "diagnostics", "spark")
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}$")


def validate(raw: dict) -> Config:
    top = Section("", raw, TOP_KEYS)
    for required in ("input", "domain", "algorithm", "output"):
        if not top.has(required):
            raise ConfigError(required, "section is required")

    inp = Section("input", raw["input"], ("path", "format", "features", "privacy_unit", "version", "timestamp", "where", "table"))
    if inp.has("path") == inp.has("table"):
        raise ConfigError("input.path", "give exactly one of input.path (a table location) and input.table (a catalog table name)")
    table = _table_name(inp, "table")
    input_cfg = InputConfig(
        path=inp.string("path"),
        format=inp.string("format", "delta", choices=FORMATS),
        features=inp.strings("features", required=True),
        privacy_unit=inp.string("privacy_unit"),
        version=inp.integer("version", None, low=0),
        timestamp=inp.string("timestamp"),
        where=inp.string("where"),
        table=table,
    )
    if input_cfg.version is not None and input_cfg.timestamp is not None:
        raise ConfigError("input.timestamp", "give input.version or input.timestamp, not both")
    if (input_cfg.version is not None or input_cfg.timestamp is not None or table is not None) and input_cfg.format != "delta":
        raise ConfigError("input.format", f"input.version, input.timestamp and input.table need format delta, got {input_cfg.format!r}")
    if input_cfg.timestamp is not None:
        try:
            datetime.fromisoformat(input_cfg.timestamp.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError("input.timestamp", f"{input_cfg.timestamp!r} is not a timestamp (ISO 8601, e.g. '2026-11-30 12:00:00')") from None
    if input_cfg.where is not None:
        from dpspark import rowfilter

        rowfilter.parse(input_cfg.where)  # the grammar, without Spark: every construct total (dpspark/rowfilter.py)
    if input_cfg.privacy_unit in input_cfg.features:
        raise ConfigError("input.privacy_unit", f"{input_cfg.privacy_unit!r} is also a feature column")

    domain_cfg = _validate_domain(Section("domain", raw["domain"], ("lower", "upper", "radius", "dim", "estimate", "epsilon_share")), input_cfg)

    priv = Section("privacy", raw.get("privacy"), ("epsilon", "delta", "ledger", "budget"))
    ledger = _deployment_ledger(priv.string("ledger"))
    epsilon = priv.number("epsilon", 1.0, low=0.0, low_open=True, high=math.inf)
    if math.isinf(epsilon):
        raise ConfigError("privacy.epsilon", "must be finite (a test-only noiseless mode exists in the library, not in configs)")
    delta = priv.number("delta", 0.0, low=0.0, high=1.0, high_open=True)
    budget = None
    if priv.has("budget"):
        b = Section("privacy.budget", priv.raw("budget"), ("epsilon", "delta"))
        budget = BudgetConfig(
            epsilon=b.number("epsilon", required=True, low=0.0, low_open=True, high=1e9),
            delta=b.number("delta", 0.0, low=0.0, high=1.0),
        )
        if ledger is None:
            raise ConfigError("privacy.budget", "needs privacy.ledger (the Delta table that records what each input has spent)")
    privacy_cfg = PrivacyConfig(epsilon=epsilon, delta=delta, ledger=ledger, budget=budget)

    algo_raw = raw["algorithm"]
    if not isinstance(algo_raw, Mapping):
        raise ConfigError("algorithm", f"must be a mapping, got {algo_raw!r}")
    name = algo_raw.get("name", DEFAULT_ALGORITHM)
    if name is None:
        name = DEFAULT_ALGORITHM
    if name not in FAMILIES:
        raise ConfigError("algorithm.name", f"{name!r} is not available; allowed: {sorted(FAMILIES)}")
    family_raw = {k: v for k, v in algo_raw.items() if k not in ("name", "objective", "k") and v is not None}
    common = Section("algorithm", {k: algo_raw.get(k) for k in ("name", "objective", "k")}, ("name", "objective", "k"))
    objective = common.string("objective", "kmeans", choices=OBJECTIVES)
    k = common.integer("k", required=True, low=1, high=100_000)
    validator: Callable = importlib.import_module(FAMILIES[name]).validate_params
    params = validator(Section("algorithm", family_raw, tuple(family_raw)), objective=objective, k=k, dim=domain_cfg.dim, privacy=privacy_cfg)
    algorithm_cfg = AlgorithmConfig(name=name, objective=objective, k=k, params=params)
    if name == "ldp" and domain_cfg.estimate is not None:
        raise ConfigError("domain.estimate", "is not available with algorithm.name=ldp: the local model has no trusted "
                                             "curator to see the records a central estimate needs; give public bounds "
                                             "(lower/upper or radius)")
    if name == "ldp" and input_cfg.where is not None:
        # The local protocol treats the number of reports as public (each user's report is
        # epsilon-LDP; the server's estimates use the exact count). A filter makes that count a
        # statistic of record values (a filter keeping 0 or 1 users is visible in the output at
        # any epsilon), so ldp reads whole tables only.
        raise ConfigError("input.where", "is not allowed with algorithm.name=ldp: the local protocol uses the exact "
                                         "number of reports, which a row filter would make depend on record values; "
                                         "write the selected rows to a table of their own with its own budget, or use "
                                         "a central family (auto, maxcover, dplloyd)")

    out = Section("output", raw["output"], ("path", "report", "table"))
    output_cfg = OutputConfig(path=out.string("path", required=True), report=out.boolean("report", True),
                              table=_table_name(out, "table"))

    seed = top.integer("seed", None, low=0, high=2**63 - 1)
    unsafe_fixed_seed = top.boolean("unsafe_fixed_seed", False)
    if seed is not None and not unsafe_fixed_seed:
        raise ConfigError("seed", "a fixed seed makes every noise draw reproducible from the config, so the run is NOT "
                                  "private; it is a testing aid and needs unsafe_fixed_seed: true as well")
    diagnostics = top.boolean("diagnostics", False)
    if diagnostics and privacy_cfg.ledger is not None:
        raise ConfigError("diagnostics", "non-private diagnostics cannot be switched on in a run charged to a privacy "
                                         "ledger (privacy.ledger is set)")
    cand_table = getattr(params, "candidate_table", None)
    if cand_table and input_cfg.path is not None and _same_local_path(cand_table, input_cfg.path):
        raise ConfigError("algorithm.candidate_table", f"{cand_table!r} is the input table itself: candidates must be PUBLIC")

    sp = Section("spark", raw.get("spark"), ("master", "app_name", "conf"))
    conf = sp.raw("conf", {})
    if not isinstance(conf, Mapping):
        raise ConfigError("spark.conf", f"must be a mapping of Spark settings, got {conf!r}")
    conf = _flat(conf)  # `--set spark.conf.spark.x.y=v` nests on the dots: flatten back
    for name in conf:
        if any(str(name).startswith(p) or str(name).endswith(p) for p in _SPARK_CODE_KEYS):
            raise ConfigError(f"spark.conf.{name}", "loads code into the driver or executors (which hold the private data "
                                                   "and the ledger), so a job config may not set it; pass it to "
                                                   "spark-submit in the deployment instead")
        if any(str(name).startswith(p) for p in _SPARK_SEMANTICS_KEYS):
            raise ConfigError(f"spark.conf.{name}", "changes how Spark evaluates expressions or fails a job on the size "
                                                   "of a collected result: after the charge, success or failure could "
                                                   "then depend on a record; the deployment may set it, a job config may not")
        if not (str(name) in _SPARK_JOB_KEYS or any(str(name).startswith(p) for p in _SPARK_JOB_PREFIXES)):
            raise ConfigError(f"spark.conf.{name}", "is not a setting a job config may choose (the analyst's config may "
                                                   "only tune parallelism; event logs, listeners, progress bars, memory "
                                                   "and result-size limits could show or turn into data-dependent "
                                                   "numbers): pass it to spark-submit in the deployment. Allowed: "
                                                   f"{sorted(_SPARK_JOB_KEYS)} and {list(_SPARK_JOB_PREFIXES)}")
    if ARROW_BATCH_KEY in conf:
        _check_arrow_batch(conf[ARROW_BATCH_KEY], domain_cfg.dim)
    spark_cfg = SparkConfig(
        master=sp.string("master"),
        app_name=sp.string("app_name", "dpspark"),
        conf=tuple(sorted((str(a), _spark_value(b)) for a, b in conf.items())),
    )
    config = Config(input=input_cfg, domain=domain_cfg, privacy=privacy_cfg, algorithm=algorithm_cfg,
                    output=output_cfg, seed=seed, diagnostics=diagnostics, spark=spark_cfg,
                    unsafe_fixed_seed=unsafe_fixed_seed)
    _check_plan(config)
    return config


def _table_name(section: Section, k: str) -> str | None:
    """A catalog table name (``input.table``, ``output.table``): name, db.name or catalog.db.name."""
    name = section.string(k)
    if name is not None and not TABLE_NAME.match(name):
        raise ConfigError(section.key(k), f"{name!r} is not a table name (name, db.name or catalog.db.name)")
    return name


def _check_plan(config: Config) -> None:
    """The family's own validation (its estimator's ``privacy_plan``, which the run calls again before
    its charge), here before Spark starts: a config that the estimator would refuse is a config error
    (exit 2), never a failure after the charge. ``auto`` validates the route it chooses."""
    from dpspark.families import build_estimator

    try:
        plan_eps, plan_delta = build_estimator(config).privacy_plan()
    except ValueError as exc:
        raise ConfigError("algorithm", f"{config.algorithm.name} refuses this config: {exc}") from None
    if plan_eps > config.privacy.epsilon * (1 + 1e-12) or plan_delta > config.privacy.delta * (1 + 1e-12):
        raise ConfigError("privacy.epsilon", f"{config.algorithm.name} would spend epsilon={plan_eps:g}, delta={plan_delta:g}, "
                                             f"over privacy.epsilon={config.privacy.epsilon:g}, privacy.delta={config.privacy.delta:g}")


def _same_local_path(a: str, b: str) -> bool:
    """True when two paths name the same local location (any spelling); URIs compare as written."""
    from dpspark.tables import canonical_path

    return canonical_path(None, a) == canonical_path(None, b)


# Settings that load code (JARs, agents, plugins, extensions) into the JVMs that hold the data.
_SPARK_CODE_KEYS = ("spark.jars", "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
                    "spark.driver.extraClassPath", "spark.executor.extraClassPath", "spark.driver.extraLibraryPath",
                    "spark.executor.extraLibraryPath", "spark.sql.extensions", "spark.plugins", "spark.submit.pyFiles",
                    "spark.files", "spark.archives", "spark.sql.catalog.", "spark.pyspark.python",
                    "spark.pyspark.driver.python", "spark.executorEnv.", "spark.yarn.dist.", "spark.kubernetes.",
                    "spark.sql.ansi.enabled")

# Settings that change what an expression does on a value (legacy parsers and casts, ANSI mode) or
# that fail a job on the size of an aggregate the driver collects (whose size depends on the data):
# either could make an attempt fail after its charge because of one record.
_SPARK_SEMANTICS_KEYS = ("spark.sql.legacy.", "spark.sql.ansi.", "spark.driver.maxResultSize",
                         "spark.sql.storeAssignmentPolicy", "spark.sql.timestampType")

# What a job config may set in spark.conf: parallelism and scheduling only (an allowlist). Everything
# else is the deployment's: event logs and listeners hold per-operator row counts, the console
# progress bar shows which jobs ran, and memory or size limits would let a config pick a threshold
# at which a run fails depending on the data.
_SPARK_JOB_KEYS = frozenset({
    "spark.sql.shuffle.partitions", "spark.default.parallelism", "spark.ui.enabled", "spark.ui.port",
    "spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.files.maxPartitionBytes", "spark.executor.cores",
    "spark.executor.instances", "spark.cores.max", "spark.task.cpus", "spark.locality.wait", "spark.scheduler.mode",
    "spark.databricks.delta.snapshotPartitions",
})
_SPARK_JOB_PREFIXES = ("spark.sql.adaptive.",)

# Rows per Arrow batch of the Python passes. Spark reads 0 or less as "a whole partition in one
# batch", and the packed points are one list column whose Arrow offsets are 32-bit: a batch of more
# than 2^31 - 1 values would fail, at a number of rows the config picked (after the charge, on the
# data's size). So a job config gives a positive count with count * d values within that limit
# (d is public: the domain's); the deployment may set anything.
ARROW_BATCH_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
ARROW_MAX_VALUES = 2**31 - 1


def _check_arrow_batch(value, dim: int) -> None:
    key = f"spark.conf.{ARROW_BATCH_KEY}"
    text = _spark_value(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", text):
        raise ConfigError(key, f"{value!r} should be a positive whole number of rows")
    rows, limit = int(text), ARROW_MAX_VALUES // int(dim)
    if not 1 <= rows <= limit:
        raise ConfigError(key, f"rows={rows} should be >= 1 and <= {limit} (a batch holds rows * d values, d={dim}, "
                               f"at most 2^31 - 1 in Arrow's list column)")

LEDGER_ENV = "DPSPARK_LEDGER"


def _deployment_ledger(configured: str | None) -> str | None:
    """The ledger of the run. A deployment that sets $DPSPARK_LEDGER fixes it: a job config may name
    the same ledger (any spelling) or none, never another one, and cannot switch it off."""
    fixed = os.environ.get(LEDGER_ENV) or None
    if fixed is None:
        return configured
    if configured is not None:
        from dpspark.tables import canonical_path

        if canonical_path(None, configured) != canonical_path(None, fixed):
            raise ConfigError("privacy.ledger", f"{configured!r} is not the deployment's ledger (${LEDGER_ENV}={fixed!r}); "
                                                "leave privacy.ledger unset")
    return fixed


def _flat(conf: Mapping, prefix: str = "") -> dict:
    out = {}
    for key, value in conf.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _spark_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


ESTIMATES = ("private",)
EPSILON_SHARE_MAX = 0.5


def _validate_domain(dom: Section, inp: InputConfig) -> DomainConfig:
    has_box = dom.has("lower") or dom.has("upper")
    estimate = dom.string("estimate", None, choices=ESTIMATES)
    if dom.has("epsilon_share") and estimate is None:
        raise ConfigError("domain.epsilon_share", "is the private estimate's share of epsilon: it needs domain.estimate: private")
    share = None
    if estimate is not None:
        from dpspark.privacy.bounds import DEFAULT_EPSILON_SHARE

        share = dom.number("epsilon_share", DEFAULT_EPSILON_SHARE, low=0.0, low_open=True, high=EPSILON_SHARE_MAX)
        if dom.has("radius"):
            raise ConfigError("domain.radius", "the private estimate releases a box: give no radius with domain.estimate "
                                               "(lower/upper, if given, are the public outer box it searches)")
    if has_box and dom.has("radius"):
        raise ConfigError("domain", "give either a box (lower, upper) or a ball (radius), not both")
    if dom.has("radius"):
        radius = dom.number("radius", low=0.0, low_open=True, high=1e300)
        dim = dom.integer("dim", len(inp.features) if len(inp.features) > 1 else None, low=1)
        if dim is None:
            raise ConfigError("domain.dim", "is required with a ball domain when the features are one array column")
        _check_feature_count(inp, dim, "domain.dim")
        return DomainConfig(dim=dim, radius=radius)
    if not has_box and estimate is not None:
        dim = dom.integer("dim", len(inp.features) if len(inp.features) > 1 else None, low=1)
        if dim is None:
            raise ConfigError("domain.dim", "is required with domain.estimate and no outer box when the features are one "
                                            "array column")
        _check_feature_count(inp, dim, "domain.dim")
        return DomainConfig(dim=dim, estimate=estimate, epsilon_share=share)
    if not has_box:
        raise ConfigError("domain", "needs PUBLIC bounds: lower and upper (a box) or radius (an L2 ball), or "
                                    "estimate: private (a charged private estimate); they are never taken from the data")
    lower = dom.numbers("lower", required=True)
    upper = dom.numbers("upper", required=True)
    if len(lower) != len(upper):
        raise ConfigError("domain.upper", f"has {len(upper)} values but domain.lower has {len(lower)}")
    for i, (lo, hi) in enumerate(zip(lower, upper)):
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ConfigError(f"domain.lower[{i}]", "bounds must be finite")
        if not hi > lo:
            raise ConfigError(f"domain.upper[{i}]", f"must be > domain.lower[{i}]={lo:g}, got {hi:g}")
    dim = dom.integer("dim", len(lower), low=1)
    if dim != len(lower):
        raise ConfigError("domain.dim", f"is {dim} but the box has {len(lower)} dimensions")
    _check_feature_count(inp, dim, "domain.lower/upper")
    return DomainConfig(dim=dim, lower=lower, upper=upper, estimate=estimate, epsilon_share=share)


def _check_feature_count(inp: InputConfig, dim: int, bounds: str) -> None:
    """The d feature columns and the domain's d dimensions agree (one array/vector column takes any d).
    Names both keys: which one is wrong, only the user knows."""
    n = len(inp.features)
    if n != dim and n != 1:
        what = f"give {n} values for each bound" if bounds == "domain.lower/upper" else f"set domain.dim to {n}"
        raise ConfigError(bounds, f"{'have' if bounds == 'domain.lower/upper' else 'is'} {dim} dimension(s) but input.features "
                                  f"names {n} columns {list(inp.features)}: {what}, or name {dim} feature columns "
                                  "(or one array column)")
