"""Config loading, --set overrides and validation (no Spark)."""

import pytest

from dpspark.config import load_config, parse_value, validate
from dpspark.errors import ConfigError


def base():
    return {
        "input": {"path": "data/points", "features": ["x", "y"]},
        "domain": {"lower": [0, 0], "upper": [1, 1]},
        "privacy": {"epsilon": 1.0},
        "algorithm": {"name": "dplloyd", "k": 3},
        "output": {"path": "out/x"},
    }


def test_demo_config_validates():
    cfg = load_config("conf/demo.yaml")
    assert cfg.algorithm.name == "auto" and cfg.algorithm.k == 5 and cfg.algorithm.objective == "kmeans"
    assert cfg.domain.lower == (0.0, 0.0) and cfg.domain.upper == (100.0, 100.0)
    assert cfg.privacy.ledger == "out/demo/ledger" and cfg.privacy.delta == 1e-6
    assert cfg.privacy.budget is None  # the cap is the ledger's (scripts/demo.sh sets it)
    assert cfg.seed is None and not cfg.unsafe_fixed_seed and not cfg.diagnostics
    # The comment's "try another family" commands, with their overrides exactly as written.
    commands = [line for line in open("conf/demo.yaml") if "dpspark run --config conf/demo.yaml" in line]
    sets = [[word.strip() for word in command.split("--set")[1:]] for command in commands]
    assert sets == [["algorithm.name=maxcover", "algorithm.candidates=private"],
                    ["algorithm.name=dplloyd", "privacy.delta=0"]]
    maxcover = load_config("conf/demo.yaml", sets[0])
    assert maxcover.algorithm.name == "maxcover" and maxcover.algorithm.params.candidates == "private"
    dplloyd = load_config("conf/demo.yaml", sets[1])
    assert dplloyd.algorithm.params.variant == "allocation_nk" and dplloyd.algorithm.params.iterations == 12


def test_set_overrides_any_key_and_parses_lists():
    cfg = load_config("conf/demo.yaml", ["algorithm.k=7", "domain.lower=1,2", "domain.upper=[50, 60]",
                                         "algorithm.name=dplloyd", "privacy.delta=0",
                                         "algorithm.variant=average_k", "privacy.epsilon=0.5", "seed=3",
                                         "unsafe_fixed_seed=true"])
    assert cfg.algorithm.k == 7 and cfg.domain.lower == (1.0, 2.0) and cfg.domain.upper == (50.0, 60.0)
    assert cfg.algorithm.params.variant == "average_k" and cfg.algorithm.params.schedule == "average"
    assert cfg.privacy.epsilon == 0.5 and cfg.seed == 3 and cfg.unsafe_fixed_seed is True


def test_parse_value():
    assert parse_value("1,2") == [1, 2]
    assert parse_value("[x, y]") == ["x", "y"]
    assert parse_value("null") is None
    assert parse_value("out/run") == "out/run"
    assert parse_value("1e-6") == 1e-6
    assert parse_value("2026-11-30 12:00:00") == "2026-11-30 12:00:00"  # not a datetime


@pytest.mark.parametrize("item, key, want", [
    ("input.where=day IN ('2026-11-29','2026-11-30')", "where", "day IN ('2026-11-29','2026-11-30')"),
    ("input.where=coalesce(x, 0) > 1", "where", "coalesce(x, 0) > 1"),
    ("input.where=x > 1 AND name = 'a: b # c'", "where", "x > 1 AND name = 'a: b # c'"),
    ("input.timestamp=2026-11-30 12:00:00", "timestamp", "2026-11-30 12:00:00"),
    ("input.path=data/a,b", "path", "data/a,b"),
    ("input.where=null", "where", None),
])
def test_set_takes_free_text_keys_as_written(tmp_path, item, key, want):
    """One value per --set flag for text keys: commas, colons and '#' stay in the value, and a
    timestamp stays a string (issue 29, item 4: these were a traceback, a list, or refused)."""
    path = tmp_path / "c.yaml"
    raw = base()
    raw["input"]["format"] = "delta"
    path.write_text(__import__("yaml").safe_dump(raw))
    cfg = load_config(str(path), [item])
    assert getattr(cfg.input, key) == want
    lists = load_config(str(path), ["domain.lower=1,2", "domain.upper=[3, 4]", "input.features=a,b"])
    assert lists.domain.lower == (1.0, 2.0) and lists.domain.upper == (3.0, 4.0) and lists.input.features == ("a", "b")


@pytest.mark.parametrize("mutate, key, words", [
    (lambda r: r["privacy"].update(epsilon=0), "privacy.epsilon", "> 0"),
    (lambda r: r["privacy"].update(epsilon=-1), "privacy.epsilon", "> 0"),
    (lambda r: r["privacy"].update(delta=1.0), "privacy.delta", "< 1"),
    (lambda r: r["privacy"].update(epsilon="lots"), "privacy.epsilon", "number"),
    (lambda r: r["algorithm"].update(k=0), "algorithm.k", ">= 1"),
    (lambda r: r["algorithm"].update(name="kmeans"), "algorithm.name", "allowed"),
    (lambda r: r["algorithm"].update(variant="best"), "algorithm.variant", "allowed"),
    (lambda r: r["algorithm"].update(variant="average_k", schedule="allocation"), "algorithm.schedule", "contradicts"),
    (lambda r: r["algorithm"].update(objective="kmedian"), "algorithm.objective", "not supported"),
    (lambda r: r["algorithm"].update(iterations=2), "algorithm.iterations", ">= 3"),
    (lambda r: r["algorithm"].update(colour="red"), "algorithm.colour", "unknown key"),
    (lambda r: r["domain"].update(upper=[1, 0]), "domain.upper[1]", "must be >"),
    (lambda r: r["domain"].update(upper=[1]), "domain.upper", "has 1 values"),
    (lambda r: r.pop("domain"), "domain", "required"),
    (lambda r: r["domain"].update(radius=1.0), "domain", "not both"),
    (lambda r: r["input"].update(features=["x", "y", "z"]), "domain.lower/upper", "input.features names 3 columns"),
    (lambda r: r["input"].update(format="xls"), "input.format", "allowed"),
    (lambda r: r["input"].pop("path"), "input.path", "exactly one"),
    (lambda r: r["input"].update(table="db.points"), "input.path", "exactly one"),
    (lambda r: r.update(colour=1), "colour", "unknown key"),
    (lambda r: r["privacy"].update(budget={"epsilon": 3}), "privacy.budget", "ledger"),
    (lambda r: r.update(seed=-4), "seed", ">= 0"),
    # A fixed seed makes the noise reproducible: refused unless the config says it knows (NOT PRIVATE).
    (lambda r: r.update(seed=3), "seed", "unsafe_fixed_seed"),
    (lambda r: r.update(seed=3, unsafe_fixed_seed=False), "seed", "NOT"),
    (lambda r: r.update(seed=3, unsafe_fixed_seed="yes"), "unsafe_fixed_seed", ""),
    # Non-private diagnostics never go with a ledger-charged run.
    (lambda r: (r.update(diagnostics=True), r["privacy"].update(ledger="out/ledger")), "diagnostics", "ledger"),
    # The public candidate table must not be the private input, whatever the spelling.
    (lambda r: r.update(algorithm={"name": "maxcover", "k": 3, "candidates": "table", "candidate_table": "./data/points/"},
                        privacy={"epsilon": 1.0, "delta": 1e-6}), "algorithm.candidate_table", "PUBLIC"),
    (lambda r: r["privacy"].update(delta=1e-6), "privacy.delta", "pure epsilon-DP"),
])
def test_invalid_values_name_the_key(mutate, key, words):
    raw = base()
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert err.value.key == key
    assert words in str(err.value)
    assert f"'{key}'" in str(err.value)


def test_a_seed_with_unsafe_fixed_seed_is_accepted():
    raw = base()
    raw.update(seed=3, unsafe_fixed_seed=True)
    cfg = validate(raw)
    assert cfg.seed == 3 and cfg.unsafe_fixed_seed is True
    raw.update(seed=None)
    assert validate(raw).seed is None  # the flag alone changes nothing
    raw = base()
    raw.update(diagnostics=True)
    assert validate(raw).diagnostics is True  # diagnostics without a ledger: allowed (labelled NON-PRIVATE)
    raw = base()
    raw["algorithm"] = {"name": "maxcover", "k": 3, "candidates": "table", "candidate_table": "data/public_candidates"}
    raw["privacy"] = {"epsilon": 1.0, "delta": 1e-6}
    assert validate(raw).algorithm.params.candidate_table == "data/public_candidates"


def test_ball_domain_and_array_column():
    raw = base()
    raw["domain"] = {"radius": 2.0, "dim": 3}
    raw["input"]["features"] = ["vec"]
    cfg = validate(raw)
    assert cfg.domain.kind == "ball" and cfg.domain.dim == 3
    raw["domain"] = {"radius": 2.0}
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert err.value.key == "domain.dim"


def test_missing_config_file():
    with pytest.raises(ConfigError) as err:
        load_config("does/not/exist.yaml")
    assert err.value.key == "--config"


def test_bad_set_syntax():
    with pytest.raises(ConfigError) as err:
        load_config("conf/demo.yaml", ["algorithm.k"])
    assert err.value.key == "--set"


def test_every_family_is_registered_with_an_estimator():
    from dpspark.config import FAMILIES
    from dpspark.runner import ESTIMATORS

    assert set(FAMILIES) == set(ESTIMATORS)


def test_auto_is_the_default_and_takes_no_family_key():
    """No algorithm.name: auto. auto chooses its own parameters, so a family key is refused, naming it."""
    from dpspark.config import DEFAULT_ALGORITHM

    raw = base()
    del raw["algorithm"]["name"]
    cfg = validate(raw)
    assert DEFAULT_ALGORITHM == "auto" and cfg.algorithm.name == "auto" and cfg.algorithm.k == 3
    raw["algorithm"]["name"] = None  # null counts as absent
    assert validate(raw).algorithm.name == "auto"
    for key, value in (("candidates", "private"), ("variant", "average_k"), ("mode", "simulate")):
        raw = base()
        raw["algorithm"] = {"k": 3, key: value}
        with pytest.raises(ConfigError) as err:
            validate(raw)
        assert err.value.key == f"algorithm.{key}" and f"'algorithm.{key}'" in str(err.value)
        assert "auto" in str(err.value)


@pytest.mark.parametrize("dim, objective, delta, spends", [
    (2, "kmeans", 1e-6, (1.0, 1e-6)),  # maxcover (grid_or_private): (epsilon, delta)
    (3, "kmedian", 1e-6, (1.0, 1e-6)),
    (2, "kmeans", 0.0, (1.0, 0.0)),  # delta 0: the pure tree route, accepted
    (5, "kmeans", 1e-6, (1.0, 0.0)),  # many dimensions: pure epsilon-DP, the configured delta an upper bound
    (5, "kmedian", 1e-6, (1.0, 0.0)),
    (5, "kmeans", 0.0, (1.0, 0.0)),
])
def test_auto_privacy_plan_from_public_inputs(dim, objective, delta, spends):
    from dpspark.runner import estimator_class

    raw = base()
    raw["input"]["features"] = [f"f{j}" for j in range(dim)]
    raw["domain"] = {"lower": [0] * dim, "upper": [1] * dim}
    raw["privacy"] = {"epsilon": 1.0, "delta": delta}
    raw["algorithm"] = {"k": 3, "objective": objective}
    cfg = validate(raw)
    assert cfg.algorithm.name == "auto" and cfg.privacy.delta == delta
    assert estimator_class("auto").from_config(cfg).privacy_plan() == spends


@pytest.mark.parametrize("value, message", [(0, "must be >= 1"), ("x", "must be an integer"), (True, "must be an integer"),
                                            (1.5, "must be an integer"), (10**13, "must be <="), (5000, None)])
def test_max_pairs_is_checked_before_anything_runs(value, message):
    """maxcover's driver bound on incidence pairs: an integer from 1 to 10^12, or exit 2 naming the key."""
    raw = base()
    raw["privacy"]["delta"] = 1e-6
    raw["algorithm"] = {"name": "maxcover", "k": 3, "max_pairs": value}
    if message is None:
        assert validate(raw).algorithm.params.max_pairs == 5000
        raw["algorithm"].pop("max_pairs")
        assert validate(raw).algorithm.params.max_pairs == 32_000_000
        return
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert err.value.key == "algorithm.max_pairs" and message in str(err.value)


@pytest.mark.parametrize("value", [0, -1, "0", "1e4", 1.5, True, "x", 2**30 + 1, str(2**31)])
def test_a_job_config_cannot_make_arrow_batches_unbounded(value):
    """spark.sql.execution.arrow.maxRecordsPerBatch: Spark reads <= 0 as "a whole partition per
    batch", and a batch of the packed points holds rows * d values in a list column with 32-bit
    offsets; a config may give only a positive count with rows * d <= 2^31 - 1 (d = 2 here)."""
    raw = base()
    raw["spark"] = {"conf": {"spark.sql.execution.arrow.maxRecordsPerBatch": value}}
    with pytest.raises(ConfigError, match="maxRecordsPerBatch"):
        validate(raw)


@pytest.mark.parametrize("value, dim", [(1, 2), ("20000", 2), (2**30 - 1, 2), ((2**31 - 1) // 50, 50)])
def test_a_job_config_may_choose_a_bounded_arrow_batch(value, dim):
    raw = base()
    raw["input"]["features"] = [f"x{j}" for j in range(dim)]
    raw["domain"] = {"lower": [0] * dim, "upper": [1] * dim}
    raw["spark"] = {"conf": {"spark.sql.execution.arrow.maxRecordsPerBatch": value}}
    assert dict(validate(raw).spark.conf)["spark.sql.execution.arrow.maxRecordsPerBatch"] == str(value)
