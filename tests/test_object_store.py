"""Object storage (issue 27): tables, ledger and outputs on s3a://, and a ledger that stays exact when
separate drivers charge it at once.

A local S3 (moto's server, ``tests/s3mock.py``; the ``s3`` fixture of conftest.py) stands in for the
store; the shared session has the S3A connector (``build_session(object_store=True)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from dpspark import tables
from dpspark.errors import BudgetRefused
from dpspark.privacy.ledger import SINGLE_WRITER_ENV, Ledger, commit_exclusion
from dpspark.session import EXCLUSIVE_LOG_STORE, LOG_STORE_JAR
from s3mock import read_text

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "dpspark" / "java" / "io" / "dpspark" / "delta" / "ExclusiveCreateLogStore.java"
SMALL_FILES_SOURCE = ROOT / "dpspark" / "java" / "io" / "dpspark" / "io" / "SmallFiles.java"


def test_the_log_store_jar_is_built_from_its_source():
    """dpspark/jars/dpspark-logstore.jar records the SHA-256 of each source it was built from
    (scripts/build_logstore.sh): a changed source without a rebuilt jar fails here."""
    with zipfile.ZipFile(LOG_STORE_JAR) as jar:
        recorded = jar.read("META-INF/dpspark-logstore.sha256").decode().strip()
        recorded_files = jar.read("META-INF/dpspark-smallfiles.sha256").decode().strip()
        assert "io/dpspark/delta/ExclusiveCreateLogStore.class" in jar.namelist()
        assert {"io/dpspark/io/SmallFiles$Write.class", "io/dpspark/io/SmallFiles$Delete.class",
                "io/dpspark/io/SmallFiles$Kind.class"} <= set(jar.namelist())
    assert recorded == hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    assert recorded_files == hashlib.sha256(SMALL_FILES_SOURCE.read_bytes()).hexdigest()


def test_the_servers_small_file_functions_write_inspect_and_remove(spark, s3, tmp_path):
    """What a Spark Connect client asks of the server's JVM (tables._on_server, here on the classic
    session, whose JVM has the same jar): bytes arrive exactly (binary, overwritten in place), kinds
    and removal are reported, on s3a and on a local disk; a server without the jar is named."""
    from dpspark.errors import DPSparkError

    for base in ("s3a://lake/small-files", "file:" + str(tmp_path / "small-files")):
        target = base + "/sub/report.png"
        assert tables._on_server(spark, "kind", target) == "missing"
        tables._on_server(spark, "write", target, b"\x89PNG\x00\xff" * 1000)
        assert tables._on_server(spark, "kind", target) == "file"
        assert tables._on_server(spark, "kind", base + "/sub") == "directory"
        tables._on_server(spark, "write", target, b"second")
        data = spark.read.format("binaryFile").load(target).first()["content"]
        assert bytes(data) == b"second"
        assert tables._on_server(spark, "delete", target) is True
        assert tables._on_server(spark, "kind", target) == "missing"
        assert tables._on_server(spark, "delete", target) is False
    missing = dict(tables.SERVER_FILE_FUNCTIONS, kind=("dpspark_no_such_kind", "io.dpspark.io.NoSuchClass", "string"))
    try:
        tables.SERVER_FILE_FUNCTIONS, saved = missing, tables.SERVER_FILE_FUNCTIONS
        with pytest.raises(DPSparkError, match=r"cannot load io\.dpspark\.io\.NoSuchClass .*; start the Spark "
                                               r"Connect server with --jars dpspark/jars/dpspark-logstore\.jar"):
            tables._on_server(spark, "kind", "s3a://lake/small-files/x")
    finally:
        tables.SERVER_FILE_FUNCTIONS = saved


class _Conf:
    def __init__(self, values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class _Session:
    """Only what ``commit_exclusion`` reads: the SparkContext's static conf."""

    def __init__(self, **values):
        self.sparkContext = type("SC", (), {"getConf": lambda _self: _Conf(values)})()
        self.conf = _Conf({})  # the session's runtime settings (the ledger's small-table settings)

    def sql(self, text):
        raise AssertionError(f"no ledger operation may run: {text}")


@pytest.mark.parametrize("path, conf, exclusive", [
    ("s3a://lake/ledger", {}, False),  # Delta's S3 store: exists-then-PUT
    ("s3a://lake/ledger", {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}, False),
    ("s3a://lake/ledger", {"spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE}, True),
    ("s3a://lake/ledger", {"spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE,
                           "spark.delta.logStore.class": "io.delta.storage.S3SingleDriverLogStore"}, False),
    ("s3a://lake/ledger", {"spark.delta.logStore.class": "io.delta.storage.S3DynamoDBLogStore"}, True),
    ("s3://lake/ledger", {"spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE}, False),
    ("S3A://lake/ledger", {"spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE}, False),  # Delta: another scheme
    ("hdfs:/ledger", {}, True),
    ("wasbs://c@a.blob.core.windows.net/ledger", {}, False),
    ("hdfs://nn/ledger", {}, True),
    ("abfss://c@a.dfs.core.windows.net/ledger", {}, True),
    ("gs://b/ledger", {}, True),
    ("gs://b/ledger", {"spark.delta.logStore.gs.impl": "io.delta.storage.HDFSLogStore"}, False),
    ("/data/ledger", {}, False),  # a local disk with Delta's store: exists-then-rename
    ("file:/data/ledger", {"spark.delta.logStore.file.impl": "io.delta.storage.HDFSLogStore"}, False),
    ("file:/data/ledger", {"spark.delta.logStore.file.impl": EXCLUSIVE_LOG_STORE}, True),
])
def test_which_storage_gives_the_ledger_exclusive_commits(path, conf, exclusive, monkeypatch):
    """Every storage without exclusive commits is refused (a local disk too), naming the way out."""
    monkeypatch.delenv(SINGLE_WRITER_ENV, raising=False)
    found = commit_exclusion(_Session(**conf), path)
    assert found.exclusive == exclusive, found.reason
    if not exclusive:
        assert SINGLE_WRITER_ENV in found.reason
    monkeypatch.setenv(SINGLE_WRITER_ENV, "1")
    assert commit_exclusion(_Session(**conf), path).exclusive


@pytest.mark.parametrize("path, scheme", [("s3a://lake/ledger", "s3a"), ("/data/ledger", "file")])
def test_a_charge_on_an_unsafe_store_is_refused_before_any_ledger_operation(path, scheme, monkeypatch):
    """Exit 3 (BudgetRefused) naming the setting, and not one SQL statement on the ledger: on s3a and on
    a local disk (a spark-submit or Connect session without dpspark's store)."""
    monkeypatch.delenv(SINGLE_WRITER_ENV, raising=False)
    ledger = Ledger(_Session(), path)
    for call in (lambda: ledger.charge("k", "r", "dplloyd", 1.0, 0.0), lambda: ledger.set_budget("k", 1.0, 0.0),
                 lambda: ledger.claim_charge("k", "r", 1, 2)):
        with pytest.raises(BudgetRefused, match=rf"spark\.delta\.logStore\.{scheme}\.impl=io\.dpspark\.delta\.ExclusiveCreateLogStore"):
            call()


def test_the_shared_session_commits_with_the_exclusive_store(spark):
    assert spark.sparkContext.getConf().get("spark.delta.logStore.s3a.impl") == EXCLUSIVE_LOG_STORE
    assert spark.sparkContext.getConf().get("spark.delta.logStore.file.impl") == EXCLUSIVE_LOG_STORE


@pytest.mark.parametrize("where", ["s3a", "local"])
def test_a_second_writer_of_one_commit_file_fails(spark, s3, tmp_path, where):
    """The store's one promise, on each storage it serves: writing an existing commit file raises
    FileAlreadyExistsException and leaves the first content."""
    table = "s3a://lake/once" if where == "s3a" else str(tmp_path / "once")
    spark.range(3).write.format("delta").mode("overwrite").save(table)
    jvm = spark._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    store = getattr(jvm.io.dpspark.delta, "ExclusiveCreateLogStore")(hadoop)
    commit = jvm.org.apache.hadoop.fs.Path((table if where == "s3a" else "file:" + table) + "/_delta_log/00000000000000000000.json")
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        store.write(commit, jvm.java.util.Collections.singletonList("{}").iterator(), False, hadoop)
    assert spark.read.format("delta").load(table).count() == 3
    fresh = jvm.org.apache.hadoop.fs.Path(commit.getParent(), "00000000000000000099.json")
    store.write(fresh, jvm.java.util.Collections.singletonList('{"x":1}').iterator(), False, hadoop)
    fs = fresh.getFileSystem(hadoop)
    assert fs.exists(fresh)
    fs.delete(fresh, False)


def test_only_the_answers_status_or_error_code_means_the_commit_file_exists(spark):
    """ExclusiveCreateLogStore.existsAnswer decides "already exists" (Delta retries on the next version)
    from the S3 answer's HTTP status (412, 409) or its exact AWS error code, anywhere in the cause chain,
    never from an error's text: version 412's commit file is 00000000000000000412.json, and an I/O
    error naming it that became a retry could charge the ledger twice."""
    jvm = spark._jvm
    exists = jvm.io.dpspark.delta.ExclusiveCreateLogStore.existsAnswer
    s3 = jvm.software.amazon.awssdk.services.s3.model
    details = jvm.software.amazon.awssdk.awscore.exception.AwsErrorDetails
    commit = "s3a://b/ledger/_delta_log/00000000000000000412.json"

    def answer(status, code=None, message=f"PUT {commit}: 412 PreconditionFailed Precondition Failed"):
        builder = s3.S3Exception.builder().statusCode(status).message(message)
        if code is not None:
            builder = builder.awsErrorDetails(details.builder().errorCode(code).build())
        return builder.build()

    def wrapped(cause):  # as S3A hands it on: an IOException caused by the SDK's exception
        return jvm.java.io.IOException(f"failed to write {commit}", cause)

    # A message that names version 412 (or spells the code out) is not an answer.
    assert not exists(jvm.java.io.IOException(f"failed to write {commit}"))
    assert not exists(jvm.java.io.IOException(f"{commit}: 412 Precondition Failed PreconditionFailed "
                                              "ConditionalRequestConflict"))
    assert not exists(wrapped(jvm.java.io.IOException(f"{commit} 412")))
    # The status of the SDK's exception, anywhere in the chain; hadoop-aws's translations carry it too.
    assert exists(wrapped(answer(412)))
    assert exists(wrapped(answer(409)))
    assert exists(answer(412))
    assert exists(jvm.org.apache.hadoop.fs.s3a.AWSServiceIOException(f"PUT {commit}", answer(409)))
    assert exists(jvm.org.apache.hadoop.fs.s3a.RemoteFileChangedException(commit, "PUT", "", answer(412)))
    for status in (500, 403, 404, 400, 503):
        assert not exists(wrapped(answer(status))), status
        assert not exists(jvm.org.apache.hadoop.fs.s3a.AWSServiceIOException(f"PUT {commit}", answer(status))), status
    # The exact AWS error code (S3A: a PreconditionFailed answer with status 200), never a part of one.
    assert exists(wrapped(answer(200, "PreconditionFailed")))
    assert exists(wrapped(answer(200, "ConditionalRequestConflict")))
    assert not exists(wrapped(answer(500, "InternalError")))
    assert not exists(wrapped(answer(200, "PreconditionFailedX")))


DRIVERS, CAP = 4, 2.0  # 4 JVMs: the race takes about 2 min alone on 2 cores (6 took 3.6)
SAFE_ROUNDS = ("s3a://lake/race-0", "s3a://lake/race-1")  # dpspark's log store
UNSAFE_ROUNDS = ("s3://lake/race-2",)  # the same bucket, Delta's default S3 log store


@pytest.fixture(scope="module")
def race(spark, s3, tmp_path_factory):
    """DRIVERS driver processes, each charging epsilon 1 against a cap of CAP, all released at once, once per
    ledger of SAFE_ROUNDS and UNSAFE_ROUNDS. Each commit PUT is held 1 s (``S3Server.commit_delay``), so
    the drivers' commits of one version overlap. {ledger: (charged, refused, errors, ledger total)}."""
    key = "race-input"
    paths = SAFE_ROUNDS + UNSAFE_ROUNDS
    for path in paths:
        Ledger(spark, path.replace("s3://", "s3a://")).set_budget(key, CAP, 0.0)
    sync = tmp_path_factory.mktemp("race")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop(SINGLE_WRITER_ENV, None)
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "ledger_race_driver.py"), "--endpoint", s3.endpoint,
                               "--ledgers", ",".join(paths), "--sync", str(sync), "--name", f"d{i}", "--key", key],
                              env=env, stdout=subprocess.PIPE, stderr=open(sync / f"stderr-{i}", "w"), text=True)
             for i in range(DRIVERS)]
    try:
        s3.commit_delay = 1.0
        for r in range(len(paths)):
            deadline = time.monotonic() + 600
            while len(list(sync.glob(f"ready-{r}-*"))) < DRIVERS:
                assert all(p.poll() is None for p in procs), [(sync / f"stderr-{i}").read_text()[-3000:]
                                                              for i in range(DRIVERS)]
                assert time.monotonic() < deadline, "drivers did not get ready"
                time.sleep(0.05)
            (sync / f"go-{r}").touch()
        outputs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        s3.commit_delay = 0.0
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [(sync / f"stderr-{i}").read_text()[-3000:] for i in range(DRIVERS)]
    results = [json.loads(line) for out in outputs for line in out.splitlines() if line.startswith("{")]
    rows = {}
    for r, path in enumerate(paths):
        got = [x["result"] for x in results if x["round"] == r]
        assert len(got) == DRIVERS
        total = Ledger(spark, path.replace("s3://", "s3a://")).totals(key).spent_epsilon
        rows[path] = (got.count("charged"), got.count("refused"), got.count("error"), total)
    return rows


def test_drivers_charging_one_s3a_ledger_at_once_spend_exactly_the_cap(race):
    """With dpspark's store: in every round exactly 2 of the 4 drivers are charged, 2 are refused, and the
    ledger's total is exactly 2."""
    assert [race[p] for p in SAFE_ROUNDS] == [(2, 2, 0, 2.0)] * len(SAFE_ROUNDS)


def test_the_same_race_with_deltas_default_s3_store_loses_charges(race):
    """The same race on Delta's S3SingleDriverLogStore (exists-then-PUT): more drivers are told they were
    charged than the ledger records: a charge lost, the budget overspent unseen. This is what
    ``commit_exclusion`` refuses, and why the test above can fail."""
    charged, _, _, total = race[UNSAFE_ROUNDS[0]]
    assert charged > total, race


def test_the_demos_job_daily_with_every_path_on_s3a(spark, s3, capsys):
    """The demo's job (conf/demo.yaml: auto, epsilon 1, delta 1e-6) as a daily pipeline on s3a://: the
    ledger's administrator sets a budget, day 1 runs, day 2 pins ``input.version`` to day 1's version
    after new rows arrived, day 3 is refused (the cap is spent), and ``ledger show`` reads it all back;
    the input table, the ledger and every output (centers, runs, summaries, report) on s3a://."""
    from dpspark.cli import main
    from test_pipeline import points_frame

    table, ledger, out = "s3a://lake/daily/points", "s3a://lake/daily/ledger", "s3a://lake/daily/out"
    spark.createDataFrame(points_frame(100)).write.format("delta").save(table)  # version 0
    assert main(["ledger", "set-budget", "--ledger", ledger, "--input", table, "--epsilon", "2.5",
                 "--delta", "1e-5"], spark=spark) == 0
    demo = ["--config", str(ROOT / "conf" / "demo.yaml"), "--set", f"input.path={table}",
            "--set", f"privacy.ledger={ledger}", "--set", f"output.path={out}"]
    assert main(["run", *demo, "--run-id", "day-1"], spark=spark) == 0
    spark.createDataFrame(points_frame(50, seed=2)).write.format("delta").mode("append").save(table)  # version 1
    assert main(["run", *demo, "--set", "input.version=0", "--run-id", "day-2"], spark=spark) == 0
    assert main(["run", *demo, "--run-id", "day-3"], spark=spark) == 3  # 0.5 of 2.5 left

    runs = {r.run_id: r for r in spark.read.format("delta").load(out + "/runs").collect()}
    assert {k: (r.status, r.input_version) for k, r in runs.items()} == {
        "day-1": ("succeeded", 0), "day-2": ("succeeded", 0), "day-3": ("refused", 1)}
    centers = spark.read.format("delta").load(out + "/centers").groupBy("run_id").count().collect()
    assert {r.run_id: r["count"] for r in centers} == {"day-1": 5, "day-2": 5}
    summary = json.loads(read_text(spark, out + "/summary.json"))
    assert summary["run_id"] == "day-2" and len(summary["centers"]) == 5 and summary["private"] is True
    assert read_text(spark, out + "/report.html").strip()
    assert Ledger(spark, ledger).totals(tables_key(spark, table)).spent_epsilon == pytest.approx(2.0)

    capsys.readouterr()
    assert main(["ledger", "show", "--ledger", ledger, "--json"], spark=spark) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [b["spent_epsilon"] for b in shown["balances"]] == [pytest.approx(2.0)]
    assert [e["status"] for e in shown["events"]].count("refused") == 1


def tables_key(spark, table):
    from dpspark import tables

    return tables.ledger_key_of(spark, table)


def test_a_pyspark_ml_fit_charges_a_ledger_on_s3a(spark, s3):
    from pyspark.ml.feature import VectorAssembler

    from dpspark.ml import DPClustering
    from test_pipeline import points_frame

    table, ledger = "s3a://lake/ml/points", "s3a://lake/ml/ledger"
    spark.createDataFrame(points_frame(100)).write.format("delta").save(table)
    Ledger(spark, ledger).set_budget(tables_key(spark, table), 1.0, 1e-5)
    df = VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip").transform(
        spark.read.format("delta").load(table))
    estimator = DPClustering(k=3, epsilon=1.0, delta=1e-6, lower=[0.0, 0.0], upper=[100.0, 100.0],
                             ledgerPath=ledger, ledgerInput=table)
    model = estimator.fit(df)
    assert len(model.clusterCenters()) == 3
    totals = Ledger(spark, ledger).totals(tables_key(spark, table))
    assert (totals.spent_epsilon, totals.spent_delta) == (pytest.approx(1.0), pytest.approx(1e-6))
    with pytest.raises(BudgetRefused):
        estimator.fit(df)


def test_a_partitioned_table_is_pruned_by_input_where_and_charged_on_its_one_balance(spark, s3, tmp_path):
    """A Delta table partitioned by day on s3a://: ``input.where`` on the partition column becomes a
    partition filter of the scan (Delta reads only that day's files), and the run is charged to the
    table's one balance (a filter does not split the budget: docs/privacy.md)."""
    import numpy as np

    from dpspark import tables
    from dpspark.cli import main
    from dpspark.config import load_config
    from test_pipeline import make_config, points_frame

    table, ledger, out = "s3a://lake/parts/points", "s3a://lake/parts/ledger", "s3a://lake/parts/out"
    pdf = points_frame(60)
    pdf["day"] = np.array(["2026-12-01", "2026-12-02", "2026-12-03"])[np.arange(len(pdf)) % 3]
    spark.createDataFrame(pdf).write.format("delta").partitionBy("day").save(table)
    key = tables.ledger_key_of(spark, table)
    Ledger(spark, ledger).set_budget(key, 1.5, 0.0)
    where = {"input.where": "day = '2026-12-02'", "privacy.ledger": ledger, "output.path": out}

    loaded = tables.load_input(spark, load_config(make_config(tmp_path, table, **where)[0]).input)
    plan = loaded.df._jdf.queryExecution().executedPlan().toString()
    partition_filters = plan.split("PartitionFilters: [", 1)[1].split("]", 1)[0]
    assert "day" in partition_filters and "2026-12-02" in partition_filters, plan
    assert loaded.ledger_key == key and loaded.df.count() == len(pdf) // 3

    assert main(["run", "--config", make_config(tmp_path, table, **where)[0], "--run-id", "one-day"], spark=spark) == 0
    assert Ledger(spark, ledger).totals(key).spent_epsilon == pytest.approx(1.0)
    other_day = dict(where, **{"input.where": "day = '2026-12-03'"})
    assert main(["run", "--config", make_config(tmp_path, table, **other_day)[0], "--run-id", "next-day"], spark=spark) == 3


def test_the_dpspark_command_adds_the_s3a_connector_itself(spark, s3, tmp_path):
    """`dpspark ledger set-budget` and `show` as a user runs them, in their own process: the session dpspark
    builds gets the S3A connector and its log store from dpspark; the deployment gives only the endpoint
    (spark-defaults.conf) and the credentials (the AWS variables)."""
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in s3.spark_conf().items()))
    env = dict(os.environ, SPARK_CONF_DIR=str(conf_dir))
    env.pop(SINGLE_WRITER_ENV, None)
    dpspark = str(Path(sys.executable).parent / "dpspark")
    ledger = "s3a://lake/cli/ledger"
    spark.range(3).write.format("delta").save("s3a://lake/cli/people")
    done = subprocess.run([dpspark, "ledger", "set-budget", "--ledger", ledger, "--input", "s3a://lake/cli/people",
                           "--epsilon", "4"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = subprocess.run([dpspark, "ledger", "show", "--ledger", ledger, "--json"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert [b["cap_epsilon"] for b in json.loads(shown.stdout)["balances"]] == [4.0]
    assert Ledger(spark, ledger).balances()[0]["cap_epsilon"] == 4.0


def test_a_deployment_may_choose_another_log_store(tmp_path, monkeypatch):
    """dpspark's sessions use its store for s3a and file unless the deployment's spark-defaults.conf (or
    the session's own settings) chooses one; the ledger then checks what was chosen."""
    from dpspark.session import log_store_conf

    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no spark-defaults.conf there
    both = {"spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE, "spark.delta.logStore.file.impl": EXCLUSIVE_LOG_STORE}
    assert log_store_conf({}) == both
    (tmp_path / "spark-defaults.conf").write_text("# the deployment\nspark.delta.logStore.s3a.impl=io.delta.storage.S3DynamoDBLogStore\n")
    assert log_store_conf({}) == {"spark.delta.logStore.file.impl": EXCLUSIVE_LOG_STORE}
    assert log_store_conf({"spark.delta.logStore.class": "x"}) == {}
