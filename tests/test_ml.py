"""dpspark.ml: DPClustering / DPClusteringModel as pyspark.ml stages (issue 16, items 1, 2 and Ivy's chatter).

One seeded fit of the default family (module fixture: auto, which in 2 dimensions with delta > 0
runs maxcover with grid candidates) inside Pipeline([VectorAssembler, DPClustering]) over a
Delta table with a ledger; the other tests reuse it or stop before any fit (refusals, Param errors).
The seed needs unsafeFixedSeed=True: these fits are NOT PRIVATE (reproducible on purpose).
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import blobs
from dpspark import config as config_mod
from dpspark import tables
from dpspark.errors import BudgetRefused, DPSparkError
from dpspark.ml import PARAMS, STATE_KEYS, DPClustering, DPClusteringModel, ParamError
from dpspark.privacy.ledger import Ledger

LOWER, UPPER = [0.0, 0.0], [10.0, 10.0]
CAP = (5.0, 1e-5)


def _estimator(**extra):
    """An explicit maxcover stage (family options such as candidateCount need a named family)."""
    params = dict(k=3, epsilon=1.0, delta=1e-6, lower=LOWER, upper=UPPER, algorithm="maxcover", candidateCount=64,
                  seed=7, unsafeFixedSeed=True)
    params.update(extra)
    return DPClustering(**params)


@pytest.fixture(scope="module")
def fitted(spark, tmp_path_factory):
    """Pipeline([VectorAssembler, DPClustering]) fitted on a Delta table, charged to a ledger.

    The stage sets no algorithm: the default, auto, which here (d = 2, delta > 0) runs maxcover with
    grid candidates. The caller's session has spark.sql.shuffle.partitions=37 during the fit: the
    family's fit must see the estimator's own setting, and 37 must be back afterwards.
    """
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    import dpspark.maxcover.estimator as mc

    base = tmp_path_factory.mktemp("ml")
    points = blobs(500, [(2.0, 2.0), (8.0, 3.0), (5.0, 8.0)], 0.4, seed=3)
    pdf = pd.DataFrame({"id": np.arange(len(points)), "x": points[:, 0], "y": points[:, 1]})
    table = str(base / "points")
    spark.createDataFrame(pdf).repartition(2).write.format("delta").save(table)
    ledger_path = str(base / "ledger")
    key = tables.ledger_key_of(spark, table)
    Ledger(spark, ledger_path).set_budget(key, *CAP)

    seen = {}
    original_fit = mc.MaxCover.fit

    def spy(self, df, *args, **kwargs):  # what the family's own code sees
        seen["partitions"] = df.sparkSession.conf.get("spark.sql.shuffle.partitions")
        return original_fit(self, df, *args, **kwargs)

    key_conf = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key_conf)
    spark.conf.set(key_conf, "37")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(mc.MaxCover, "fit", spy)
            df = spark.read.format("delta").load(table)
            default = DPClustering(k=3, epsilon=1.0, delta=1e-6, lower=LOWER, upper=UPPER, seed=7, unsafeFixedSeed=True,
                                   ledgerPath=ledger_path, ledgerInput=table)
            assert not default.isSet(default.algorithm)
            assembler = VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip")
            pipeline = Pipeline(stages=[assembler, default])
            model = pipeline.fit(df)
        after = spark.conf.get(key_conf)
    finally:
        spark.conf.set(key_conf, before)
    return {"base": base, "table": table, "ledger": ledger_path, "key": key, "df": df, "pdf": pdf,
            "model": model, "pipeline": pipeline, "seen": seen, "after": after}


def _predictions(df) -> list[tuple[int, int]]:
    return sorted((int(r["id"]), r["prediction"]) for r in df.select("id", "prediction").collect())


def test_pipeline_fit_charges_the_ledger_and_round_trips_through_save_load(spark, fitted, tmp_path):
    from pyspark.ml import PipelineModel

    model = fitted["model"]
    stage = model.stages[-1]
    assert isinstance(stage, DPClusteringModel)
    centers = stage.clusterCenters()
    assert len(centers) == 3 and all(isinstance(c, np.ndarray) and c.shape == (2,) for c in centers)
    s = stage.summary
    assert s.algorithm == "auto" and s.k == 3 and s.guarantee == "central"
    # auto's choice, from public inputs only, is in the released parameters: maxcover's spy above saw the fit.
    assert s.parameters["chosen"] == "maxcover" and s.parameters["why"].strip()
    assert "partitions" in fitted["seen"]
    assert math.isclose(s.epsilonSpent, 1.0) and math.isclose(s.deltaSpent, 1e-6)
    assert math.isclose(sum(c["epsilon"] for c in s.charges), 1.0)
    assert s.private is False and "NOT PRIVATE" in s.privacyNote  # seeded on purpose
    assert len(s.noisyWeights) == 3
    assert all(np.all((c >= 0.0) & (c <= 10.0)) for c in centers)  # inside the public domain

    # The ledger holds the charge, with the run's events.
    ledger = Ledger(spark, fitted["ledger"])
    totals = ledger.totals(fitted["key"])
    assert math.isclose(totals.spent_epsilon, 1.0) and math.isclose(totals.spent_delta, 1e-6)
    events = [e["status"] for e in ledger.runs(fitted["key"]) if e["run_id"] == s.runId]
    assert events == ["started", "charged", "fit_started", "succeeded"]
    assert s.ledger["spent_epsilon"] == pytest.approx(1.0)

    # The caller's shuffle partitions did not reach the family's fit, and are back afterwards.
    assert fitted["seen"]["partitions"] != "37"
    assert fitted["after"] == "37"

    # Save the fitted PipelineModel, load it, transform: identical predictions.
    path = str(tmp_path / "pipeline_model")
    os.makedirs(path)  # overwrite() replaces what is there
    model.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    got = _predictions(loaded.transform(fitted["df"]))
    want = _predictions(model.transform(fitted["df"]))
    assert got == want and {p for _, p in got} == {0, 1, 2}
    # ... and in a NEW session (another process, another JVM): the same predictions.
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from pyspark.ml import PipelineModel\n"
        "from dpspark.session import get_session\n"
        "spark = get_session(master='local[1]')\n"
        "df = spark.read.format('delta').load(sys.argv[2])\n"
        "rows = PipelineModel.load(sys.argv[1]).transform(df).select('id', 'prediction').collect()\n"
        "print('PREDICTIONS ' + json.dumps(sorted([int(r['id']), r['prediction']] for r in rows)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    out = subprocess.run([sys.executable, "-c", script, path, fitted["table"]], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("PREDICTIONS "))
    assert [tuple(p) for p in json.loads(line[len("PREDICTIONS "):])] == want
    lstage = loaded.stages[-1]
    assert isinstance(lstage, DPClusteringModel) and lstage.uid == stage.uid
    assert all(np.array_equal(a, b) for a, b in zip(lstage.clusterCenters(), centers))
    assert lstage.summary.asDict() == {**s.asDict(), "ledger": None}
    assert lstage.getK() == 3 and lstage.getLedgerInput() == fitted["table"]

    # The model alone (MLlib's style), and transform on an array column instead of the vector.
    alone = str(tmp_path / "model")
    stage.write().overwrite().save(alone)
    again = DPClusteringModel.load(alone)
    arr = (spark.createDataFrame(fitted["pdf"]).selectExpr("id", "array(x, y) AS arr"))
    on_array = again.copy().setFeaturesCol("arr").setPredictionCol("prediction").transform(arr)
    assert _predictions(on_array) == want


def _saved_files(root: str) -> list[str]:
    out = []
    for folder, _, files in os.walk(root):
        out += [os.path.join(folder, f) for f in files if not f.endswith(".crc") and f != "_SUCCESS"]
    return out


def _leaks(root: str, data: np.ndarray) -> list[str]:
    """What in a saved model is not a Params/released-values metadata file, or holds a data value."""
    problems = []
    values = {repr(float(v)) for v in data.ravel()}
    for f in _saved_files(root):
        if os.path.basename(os.path.dirname(f)) != "metadata" or not os.path.basename(f).startswith("part-"):
            problems.append(f"not a metadata file: {f}")
            continue
        text = open(f, encoding="utf-8").read()
        meta = json.loads(text)
        if set(meta) - {"class", "timestamp", "sparkVersion", "uid", "paramMap", "defaultParamMap", "dpspark"}:
            problems.append(f"unexpected keys in {f}: {sorted(meta)}")
        if "dpspark" in meta and set(meta["dpspark"]) != set(STATE_KEYS):
            problems.append(f"unexpected state in {f}: {sorted(meta['dpspark'])}")
        numbers = set(json.dumps(meta).replace("[", " ").replace("]", " ").replace(",", " ").split())
        hit = numbers & values
        if hit:
            problems.append(f"data value {sorted(hit)[0]} in {f}")
    return problems


def test_saved_model_holds_no_data_rows(fitted, tmp_path):
    path = str(tmp_path / "saved")
    fitted["model"].write().save(path)
    data = fitted["pdf"][["x", "y"]].to_numpy()
    assert _leaks(path, data) == []
    meta = [json.load(open(f)) for f in _saved_files(path) if "DPClustering" in open(f).read()]
    state = next(m["dpspark"] for m in meta if "dpspark" in m)
    assert set(state) == set(STATE_KEYS) and len(state["centers"]) == 3

    # The check catches a saved model that does hold data: a data row in the state, a data file.
    broken = str(tmp_path / "broken")
    shutil.copytree(path, broken)
    stage_meta = next(f for f in _saved_files(broken) if '"dpspark"' in open(f).read())
    meta = json.load(open(stage_meta))
    meta["dpspark"]["centers"].append([float(data[5, 0]), float(data[5, 1])])
    open(stage_meta, "w").write(json.dumps(meta))
    assert any("data value" in p for p in _leaks(broken, data))
    os.makedirs(os.path.join(broken, "stages", "data"))
    open(os.path.join(broken, "stages", "data", "part-0.parquet"), "w").write("rows")
    assert any("not a metadata file" in p for p in _leaks(broken, data))


def test_fit_over_the_cap_is_refused_and_charges_nothing(spark, fitted):
    ledger = Ledger(spark, fitted["ledger"])
    before = ledger.totals(fitted["key"]).spent_epsilon
    est = _estimator(epsilon=CAP[0] - before + 0.5, ledgerPath=fitted["ledger"], ledgerInput=fitted["table"],
                     featuresCol="features")
    assembled = fitted["model"].stages[0].transform(fitted["df"])
    with pytest.raises(BudgetRefused, match="refused"):
        est.fit(assembled)
    assert ledger.totals(fitted["key"]).spent_epsilon == pytest.approx(before)
    assert ledger.runs(fitted["key"])[-1]["status"] == "refused"


def test_dataframe_from_another_table_is_refused_before_the_charge(spark, fitted):
    ledger = Ledger(spark, fitted["ledger"])
    n_events = len(ledger.events())
    # ledgerInput names another existing table (here the ledger's own) than the one the DataFrame reads
    est = _estimator(ledgerPath=fitted["ledger"], ledgerInput=fitted["ledger"], inputCols=["x", "y"])
    with pytest.raises(ParamError, match="ledgerInput") as info:
        est.fit(fitted["df"])
    assert info.value.param == "ledgerInput"
    assert len(ledger.events()) == n_events  # nothing charged, nothing recorded


def test_explain_params_documents_every_param_and_every_family_option():
    est = DPClustering()
    text = est.explainParams()
    assert {p.name for p in est.params} == {name for name, _, _, _ in PARAMS}
    for p in est.params:
        assert f"{p.name}: {p.doc}" in text
        cap = p.name[0].upper() + p.name[1:]
        assert callable(getattr(est, f"get{cap}")) and callable(getattr(est, f"set{cap}"))
    # Every key a family's config accepts is a Param (a new key without one fails here).
    keys = {key for _, key, _, _ in PARAMS}
    for module in config_mod.FAMILIES.values():
        for k in importlib.import_module(module).KEYS:
            assert f"algorithm.{k}" in keys, k
    # copy() keeps the Params and gives an independent instance
    a = _estimator()
    b = a.copy({a.k: 4})
    assert (a.getK(), b.getK()) == (3, 4) and b.getSeed() == 7


@pytest.mark.parametrize("params, param", [
    (dict(k=0), "k"),
    (dict(k=None), "k"),
    (dict(k=5, candidateCount=2), "candidateCount"),
    (dict(upper=[10.0]), "upper"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(delta=0.0), "delta"),  # maxcover needs delta > 0
    (dict(algorithm="auto"), "candidateCount"),  # auto chooses its own parameters: no family option
    (dict(unsafeFixedSeed=False), "seed"),
    (dict(epsSplit=[0.5, 0.5, 0.5]), "epsSplit"),
    (dict(algorithm="dplloyd", candidateCount=None, delta=0.0, iterations=2), "iterations"),
    (dict(algorithm="dplloyd", delta=0.0), "candidateCount"),  # a maxcover option given to dplloyd
    (dict(algorithm="nope"), "algorithm"),
    (dict(objective="kmedoids"), "objective"),
    (dict(inputCols=["x", "y", "z"]), "lower/upper"),  # the bounds or the columns: both named
    (dict(ledgerPath="/tmp/ledger"), "ledgerInput"),
])
def test_bad_param_value_raises_naming_the_param(params, param):
    est = _estimator(**{k: v for k, v in params.items() if v is not None})
    for name, value in params.items():  # None: leave that Param unset
        if value is None:
            est.clear(est.getParam(name))
    with pytest.raises(ValueError) as info:
        est.toConfig()
    assert isinstance(info.value, ParamError) and info.value.param == param
    assert f"Param '{param}'" in str(info.value)


def test_deployment_ledger_needs_ledger_input(monkeypatch):
    """A deployment's $DPSPARK_LEDGER applies to DPClustering too: no ledgerInput, no fit."""
    monkeypatch.setenv(config_mod.LEDGER_ENV, "/srv/dpspark/ledger")
    with pytest.raises(ParamError, match="DPSPARK_LEDGER") as info:
        _estimator().toConfig()
    assert info.value.param == "ledgerInput"
    assert _estimator(ledgerInput="/data/points").toConfig().privacy.ledger == "/srv/dpspark/ledger"


def test_bad_param_fails_fit_before_any_spark_job(fitted):
    with pytest.raises(ParamError, match="Param 'k'"):
        _estimator(k=0, featuresCol="features").fit(fitted["df"])
    with pytest.raises(TypeError, match='param "k"'):
        DPClustering(k="five")
    with pytest.raises(TypeError, match="no Param 'kk'"):
        DPClustering(kk=3)


def test_defaults_are_the_cli_config_defaults():
    est = DPClustering(k=3, lower=LOWER, upper=UPPER, delta=1e-6)
    yaml_text = """
input: {path: data/points, features: [features]}
domain: {lower: [0.0, 0.0], upper: [10.0, 10.0]}
privacy: {delta: 1.0e-6}
algorithm: {k: 3}
output: {path: out}
"""
    cli = config_mod.validate(yaml.safe_load(yaml_text))
    assert cli.algorithm.name == est.getAlgorithm() == "auto"  # the default family, both ways
    ours = est.toConfig()
    assert ours.algorithm == cli.algorithm and ours.privacy == cli.privacy and ours.domain == cli.domain
    assert (ours.seed, ours.unsafe_fixed_seed) == (cli.seed, cli.unsafe_fixed_seed)
    assert est.getObjective() == cli.algorithm.objective == "kmeans"
    assert est.getEpsilon() == cli.privacy.epsilon
    # Each family's defaults too (maxcover with delta 1e-6, the others with the config's default, 0).
    for name, extra in (("auto", {}), ("maxcover", {"delta": 1e-6}), ("dplloyd", {}), ("ldp", {})):
        raw = yaml.safe_load(yaml_text)
        raw["algorithm"]["name"] = name
        raw["privacy"] = dict(extra)
        cli = config_mod.validate(raw)
        ours = DPClustering(k=3, lower=LOWER, upper=UPPER, algorithm=name, **extra).toConfig()
        assert ours.algorithm == cli.algorithm and ours.privacy == cli.privacy
    # A family option set on the Param reaches the family exactly as the YAML key would.
    raw = yaml.safe_load(yaml_text)
    raw["algorithm"].update(name="maxcover", candidates="grid", candidate_count=100)
    assert DPClustering(k=3, lower=LOWER, upper=UPPER, delta=1e-6, algorithm="maxcover", candidates="grid",
                        candidateCount=100).toConfig().algorithm == config_mod.validate(raw).algorithm


def test_estimator_saves_and_loads(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    est = _estimator(variant="average_k", privacyUnitCol="person")
    path = str(tmp_path / "est")
    est.write().overwrite().save(path)
    back = DPClustering.load(path)
    assert back.uid == est.uid
    assert {p.name: v for p, v in back.extractParamMap().items()} == {p.name: v for p, v in est.extractParamMap().items()}
    assert back.isSet(back.variant) and not back.isSet(back.radius)
    pipe = Pipeline(stages=[VectorAssembler(inputCols=["x", "y"], outputCol="features"), est])
    pipe.write().overwrite().save(str(tmp_path / "pipe"))
    assert Pipeline.load(str(tmp_path / "pipe")).getStages()[1].getCandidateCount() == 64


def test_executors_without_numpy_get_a_clear_error(spark, fitted, tmp_path):
    """Spark's workers on a Python without numpy: DPSparkError naming PYSPARK_PYTHON.

    The workers' Python is a fresh venv of the driver's own interpreter (same version), without pip
    and without site packages, so it has no numpy wherever the tests run."""
    import subprocess
    import venv

    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(str(tmp_path / "bare"))
    system = str(tmp_path / "bare" / "bin" / "python")
    assert subprocess.run([system, "-c", "import numpy"], capture_output=True).returncode != 0
    sc = spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = system  # what a session built without PYSPARK_PYTHON uses
    try:
        with pytest.raises(DPSparkError) as info:
            _estimator(inputCols=["x", "y"]).fit(fitted["df"])
    finally:
        sc.pythonExec = saved
    text = str(info.value)
    assert "numpy" in text and "PYSPARK_PYTHON" in text and "get_session" in text


def test_get_session_returns_the_running_session_and_shows_log_lines(spark):
    from dpspark.progress import configure_logging, log
    from dpspark.session import get_session

    before = spark.conf.get("spark.sql.shuffle.partitions")
    assert get_session() is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == before  # dpspark's defaults never override
    buffer = io.StringIO()
    configure_logging(logging.INFO, stream=buffer)
    try:
        log.info("a step line")
    finally:  # back to the CURRENT sys.stderr (a test runner replaces it per test), not today's object
        next(h for h in log.handlers if getattr(h, "_dpspark", False)).use(None)
    assert "[dpspark]" in buffer.getvalue() and "a step line" in buffer.getvalue()


def test_ivy_output_is_shown_when_the_fetch_fails(tmp_path):
    from dpspark.session import fetch_packages

    with pytest.raises(DPSparkError) as info:
        fetch_packages("not-a-maven-coordinate", str(tmp_path / "ivy"), timeout=300)
    text = str(info.value)
    assert "spark-submit exit" in text and "not-a-maven-coordinate" in text.split("its output:", 1)[1]
