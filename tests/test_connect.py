"""dpspark on a Spark Connect session (issue 29, item 7).

One local Spark Connect server for the module, started with docs/cluster.md's command as written
(read from its ``connect-server`` block: pyspark's ``SparkConnectServer`` with Delta Lake, bound to
127.0.0.1) on a free port, stopped with SIGTERM at the end (killed if it hangs); one more, started
with a relative PYSPARK_PYTHON, shows a server whose workers cannot start charges nothing. The session is built by
``build_session`` from ``$DPSPARK_REMOTE``. Checked here: a ledgered ``DPClustering.fit`` is charged
and a second one over the cap is refused; ``dpspark run`` with a ledger writes centers, runs and
summary.json; the lineage check of a Connect DataFrame accepts a plain read of ledgerInput and
plain selections (and VectorAssembler with handleInvalid='skip') and refuses the rest, before any
charge; a parquet input with a ledger is refused before the charge; with output.path, the ledger
and the operator log on the local S3 (no disk shared with the client) every output is written there.

The classic suite shares one local SparkSession in this process: pyspark decides between its
classic and Connect code paths by ``$SPARK_CONNECT_MODE_ENABLED``, which is set only while this
module runs (and put back after, with ``$DPSPARK_REMOTE``). Fits use a fixed seed: NOT PRIVATE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import ROOT, blobs
from test_readme import command_lines
from dpspark import tables
from dpspark.errors import BudgetRefused, DPSparkError
from dpspark.privacy.ledger import Ledger

LOWER, UPPER = [0.0, 0.0], [10.0, 10.0]
SERVER_START_TIMEOUT = 240.0
_ENV = ("SPARK_CONNECT_MODE_ENABLED", "DPSPARK_REMOTE", "SPARK_REMOTE")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# docs/cluster.md's server command, as the tests run it: read from the block under this marker.
CLUSTER_DOC = ROOT / "docs" / "cluster.md"
SERVER_MARK = "<!-- connect-server: tests/test_connect.py starts its servers with this block -->"
DOC_PORT = "spark.connect.grpc.binding.port=15002"
DOC_PYTHON = 'PYSPARK_PYTHON="$PWD/.venv/bin/python"'
# Added to the documented command for the tests only: speed and quiet logs, nothing dpspark relies on.
TEST_ONLY_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
}


def documented_connect_commands() -> list[str]:
    """docs/cluster.md's Connect block as logical commands (continuations joined): the server, then the client."""
    text = CLUSTER_DOC.read_text(encoding="utf-8")
    assert SERVER_MARK in text, "docs/cluster.md lost its connect-server block"
    body = text.split(SERVER_MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return command_lines(body)


def _start_server(port: int, log_path: str, python: str = DOC_PYTHON, extra_conf: dict | None = None) -> subprocess.Popen:
    """A local Spark Connect server with Delta Lake (what a deployment runs, on one machine): docs/cluster.md's
    command as written, run by bash from a scratch copy of the project root (symlinks to its .venv, .cache
    and dpspark/: the server writes spark-warehouse/ into its working directory), with the port replaced,
    ``python`` in place of its PYSPARK_PYTHON setting and TEST_ONLY_CONF (and ``extra_conf``: the local
    S3's settings, as a deployment gives its store's) added. Its own process group."""
    from dpspark import session

    server = documented_connect_commands()[0]
    assert server.count(DOC_PORT) == 1 and server.count(DOC_PYTHON) == 1, server
    server = server.replace(DOC_PORT, f"spark.connect.grpc.binding.port={port}").replace(DOC_PYTHON, python)
    conf = {**TEST_ONLY_CONF, "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={session.SPARK_LOG_CONFIG} "
                                                               + session.SMALL_JOB_JAVA_OPTIONS,
            **(extra_conf or {})}
    server += "".join(f" --conf {shlex.quote(f'{key}={value}')}" for key, value in conf.items())
    scratch = os.path.dirname(log_path)
    for name in (".venv", ".cache", "dpspark"):
        os.symlink(ROOT / name, os.path.join(scratch, name))
    env = {k: v for k, v in os.environ.items()
           if k not in _ENV and k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_HOME", "PYSPARK_PYTHON")}
    with open(log_path, "wb") as log:
        return subprocess.Popen(["bash", "-c", server], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, cwd=scratch, start_new_session=True)


def _wait_for(server: subprocess.Popen, port: int, log_path: str) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.25)
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        tail = handle.read()[-3000:]
    pytest.fail(f"the Spark Connect server did not start (exit {server.poll()}); its log ends:\n{tail}")


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (bash, spark-submit, the JVM: started by ``_start_server``),
    SIGKILL if it hangs."""
    if server.poll() is None:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        except ProcessLookupError:
            pass


SERVER: dict = {}  # the module server's "url", for client processes


def _client_env() -> dict:
    """The environment of a client process of the module's server: a thin client (no JVM of its own)."""
    env = {k: v for k, v in os.environ.items() if k not in _ENV and k not in (
        "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "DPSPARK_LEDGER", "DPSPARK_OPERATOR_LOG")}
    env["DPSPARK_REMOTE"] = SERVER["url"]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return env


def s3_server_conf(s3) -> dict:
    """What a deployment gives a Connect server for s3a:// (docs/object-store.md): the S3A connector's
    JARs, dpspark's log store for s3a, the endpoint and credentials (here the local S3's)."""
    from s3mock import connector_class_path
    from dpspark.session import EXCLUSIVE_LOG_STORE

    return {"spark.driver.extraClassPath": os.pathsep.join(connector_class_path()),
            "spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE, **s3.spark_conf(),
            "spark.hadoop.fs.s3a.access.key": "testing", "spark.hadoop.fs.s3a.secret.key": "testing"}


@pytest.fixture(scope="module")
def connect(tmp_path_factory, s3):
    """A Spark Connect session to a local server started for this module (which also reaches the
    local S3 of ``s3``: bucket ``lake``)."""
    from dpspark.session import build_session, is_connect

    base = tmp_path_factory.mktemp("connect-server")
    port = _free_port()
    log_path = str(base / "server.log")
    saved = {name: os.environ.get(name) for name in _ENV}
    server = _start_server(port, log_path, extra_conf=s3_server_conf(s3))
    session = None
    try:
        _wait_for(server, port, log_path)
        os.environ.pop("SPARK_REMOTE", None)
        os.environ["DPSPARK_REMOTE"] = SERVER["url"] = f"sc://127.0.0.1:{port}"
        session = build_session(app_name="dpspark-connect-tests")  # from $DPSPARK_REMOTE
        os.environ.pop("DPSPARK_REMOTE")  # the CLI below is given the session
        assert is_connect(session)
        yield session
    finally:
        if session is not None:
            try:
                session.stop()
            except Exception:
                pass
        _stop(server)
        for name, value in saved.items():  # the classic suite after this module: pyspark's classic paths
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def points_frame(n_per: int = 150, seed: int = 3) -> pd.DataFrame:
    x = blobs(n_per, [(2.0, 2.0), (8.0, 3.0), (5.0, 8.0)], 0.4, seed)
    return pd.DataFrame({"id": np.arange(len(x)), "x": x[:, 0], "y": x[:, 1]})


@pytest.fixture(scope="module")
def data(connect, tmp_path_factory):
    base = tmp_path_factory.mktemp("connect-data")
    table, other = str(base / "points"), str(base / "other")
    pdf = points_frame()
    connect.createDataFrame(pdf).repartition(2).write.format("delta").save(table)
    connect.read.format("delta").load(table).write.format("delta").save(other)
    return types.SimpleNamespace(base=base, table=table, other=other, pdf=pdf,
                                 key=tables.ledger_key_of(connect, table))


def _estimator(**extra):
    from dpspark.ml import DPClustering

    params = dict(k=3, epsilon=1.0, delta=1e-6, lower=LOWER, upper=UPPER, algorithm="maxcover", candidateCount=32,
                  seed=7, unsafeFixedSeed=True, inputCols=["x", "y"])
    if "featuresCol" in extra:
        del params["inputCols"]
    params.update(extra)
    return DPClustering(**params)


# ---------------------------------------------------------------------------------------------
# The session


def test_the_session_is_connect_with_delta_and_no_jvm_calls(connect):
    from dpspark import session

    assert connect.conf.get("spark.sql.codegen.hugeMethodLimit") == "8000"  # PLAN_CONF, a runtime setting
    session.check_connect_server(connect)
    session.reset_py4j_connection(connect)  # returns at once: no py4j connection
    with session.quiet_spark_logs(connect):  # a no-op there
        assert connect.range(3).count() == 3
    fake = types.SimpleNamespace(conf=types.SimpleNamespace(get=lambda key, default=None: ""))
    with pytest.raises(DPSparkError, match="spark.sql.extensions"):
        session.check_connect_server(fake)


def test_the_remote_url_is_the_deployments(monkeypatch):
    from dpspark import session

    monkeypatch.delenv("DPSPARK_REMOTE", raising=False)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert session.remote_url() is None
    monkeypatch.setenv("SPARK_REMOTE", "sc://a:1")
    assert session.remote_url() == "sc://a:1"
    monkeypatch.setenv("DPSPARK_REMOTE", "sc://b:2")
    assert session.remote_url() == "sc://b:2"
    monkeypatch.setenv("DPSPARK_REMOTE", "local[2]")
    with pytest.raises(DPSparkError, match="sc://host:port"):
        session.build_session()


def test_the_documented_server_binds_localhost_and_runs_an_absolute_python():
    """docs/cluster.md's Connect server command (the one ``_start_server`` runs): bound to 127.0.0.1, its
    workers' Python an absolute path (a relative one names nothing in the workers' temporary directory:
    issue 50), no Python version in any path, and a word on authentication for a real deployment."""
    commands = documented_connect_commands()
    server, client = commands[0], commands[-1]
    assert len(commands) == 2 and "SparkConnectServer" in server
    assert "--conf spark.connect.grpc.binding.address=127.0.0.1 " in server
    assert DOC_PYTHON in server and DOC_PORT in server
    assert not re.search(r"python3\.\d+", "\n".join(commands))
    assert client.startswith("DPSPARK_REMOTE=sc://127.0.0.1:15002 .venv/bin/dpspark run ")
    after = CLUSTER_DOC.read_text(encoding="utf-8").split(SERVER_MARK, 1)[1]
    assert "must put authentication in front of it" in after[:4000]


# ---------------------------------------------------------------------------------------------
# DPClustering with a ledger


def test_ledgered_fit_is_charged_and_a_fit_over_the_cap_refused(connect, data, tmp_path, monkeypatch):
    from pyspark.ml.feature import VectorAssembler

    from dpspark.ml import DPClusteringModel

    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))
    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 1.5, 1e-5)
    df = connect.read.format("delta").load(data.table)
    model = _estimator(ledgerPath=ledger_path, ledgerInput=data.table, runId="fit1").fit(df.select("x", "y"))
    centers = np.array(model.clusterCenters())
    assert centers.shape == (3, 2) and model.summary.epsilonSpent == pytest.approx(1.0)
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(data.key).spent_epsilon == pytest.approx(1.0)
    assert [e["status"] for e in ledger.runs(data.key)] == ["started", "charged", "fit_started", "succeeded"]
    assert model.summary.ledger["remaining_epsilon"] == pytest.approx(0.5)
    assert os.path.exists(tmp_path / "operator" / "fit1" / "attempt-1.json")
    # A second fit (the README's pipeline shape: VectorAssembler with handleInvalid='skip') over the cap
    features = VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip").transform(df)
    with pytest.raises(BudgetRefused, match="already spent epsilon=1"):
        _estimator(ledgerPath=ledger_path, ledgerInput=data.table, featuresCol="features").fit(features)
    assert ledger.totals(data.key).spent_epsilon == pytest.approx(1.0)
    assert [e["status"] for e in ledger.runs(data.key)][-2:] == ["started", "refused"]
    # The model saves, overwrites (a Connect client cannot delete the folder) and loads back.
    path = str(tmp_path / "model")
    model.write().save(path)
    model.write().overwrite().save(path)
    again = DPClusteringModel.load(path)
    assert np.allclose(np.array(again.clusterCenters()), centers)


# ---------------------------------------------------------------------------------------------
# The lineage check of a Connect DataFrame (with a ledger)


def test_lineage_accepts_a_plain_read_and_plain_selections(connect, data):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    from dpspark import lineage

    df = connect.read.format("delta").load(data.table)
    accepted = [
        df,
        df.select("x", "y"),
        df.select("*"),
        df.select(F.col("x").alias("a"), df["y"], "id").select("a", "y"),
        connect.read.format("delta").load("file:" + data.table + "/"),  # another spelling of the path
        VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip").transform(df.select("x", "y")),
    ]
    for dataset in accepted:
        lineage.check_reads_only(dataset, data.table)


def test_lineage_refuses_everything_else_before_the_charge(connect, data, tmp_path):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    from dpspark import lineage
    from dpspark.ml import ParamError

    df = connect.read.format("delta").load(data.table)
    copy = str(tmp_path / "copy")  # the same table id, another folder
    shutil.copytree(data.table, copy)
    refused = {
        "where": (df.where("x > 1"), "a filter"),
        "withColumn": (df.withColumn("z", F.col("x") * 2), "a withColumn"),
        "expression in a select": (df.select((F.col("x") + 1).alias("x")), "expression"),
        "union": (df.union(df), "union"),
        "createDataFrame": (connect.createDataFrame(data.pdf), "createDataFrame"),
        "another table": (connect.read.format("delta").load(data.other), "table id"),
        "a copy of the folder": (connect.read.format("delta").load(copy), "table id"),
        "the table's files as parquet": (connect.read.parquet(data.table), "parquet read"),
        "time travel": (connect.read.format("delta").option("versionAsOf", 0).load(data.table), "options"),
        "SQL": (connect.sql(f"SELECT x, y FROM delta.`{data.table}`"), "SQL|sql"),
        "metadata column": (df.select("x", "_metadata"), "_metadata"),
        "range": (connect.range(3), "range"),
        "VectorAssembler default": (VectorAssembler(inputCols=["x", "y"], outputCol="f").transform(df),
                                    "handleInvalid='error"),
    }
    for name, (dataset, match) in refused.items():
        with pytest.raises(lineage.LineageError, match=match) as info:
            lineage.check_reads_only(dataset, data.table)
        assert "inputCols" in str(info.value), name  # says what to do instead
    # Through the fit: ParamError on ledgerInput, nothing written to the ledger.
    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 5.0, 1e-5)
    before = Ledger(connect, ledger_path).events()
    with pytest.raises(ParamError, match="a filter") as info:
        _estimator(ledgerPath=ledger_path, ledgerInput=data.table).fit(df.where("x > 1"))
    assert info.value.param == "ledgerInput"
    assert Ledger(connect, ledger_path).events() == before


# ---------------------------------------------------------------------------------------------
# The command line with a ledger


def _config(tmp_path, input_path, ledger_path, **overrides) -> str:
    cfg = {
        "input": {"path": input_path, "format": "delta", "features": ["x", "y"]},
        "domain": {"lower": LOWER, "upper": UPPER},
        "privacy": {"epsilon": 1.0, "delta": 0.0, "ledger": ledger_path},
        "algorithm": {"name": "dplloyd", "k": 3, "variant": "average_k", "iterations": 3},
        "output": {"path": str(tmp_path / "out")},
        "seed": 7,
        "unsafe_fixed_seed": True,
    }
    for key, value in overrides.items():
        section, leaf = key.split(".")
        cfg[section][leaf] = value
    path = tmp_path / f"cfg-{len(list(tmp_path.glob('cfg-*')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_cli_run_with_a_ledger_writes_every_output(connect, data, tmp_path, capsys):
    from dpspark.cli import main

    ledger_path = str(tmp_path / "ledger")
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", data.table, "--epsilon", "3",
                 "--delta", "0"], spark=connect) == 0
    capsys.readouterr()
    assert main(["run", "--config", _config(tmp_path, data.table, ledger_path), "--run-id", "c1", "--json"],
                spark=connect) == 0
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (outcome["status"], outcome["exit_code"], outcome["epsilon_spent"]) == ("succeeded", 0, 1.0)
    out = str(tmp_path / "out")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["run_id"] == "c1" and summary["accounting"] == "ledger" and len(summary["centers"]) == 3
    assert summary["input"]["key"] == data.key and summary["input"]["version"] == 0
    assert summary["ledger"]["spent_epsilon"] == pytest.approx(1.0)
    centers = connect.read.format("delta").load(out + "/centers").collect()
    assert sorted(r.cluster_id for r in centers) == [0, 1, 2] and {r.run_id for r in centers} == {"c1"}
    runs = connect.read.format("delta").load(out + "/runs").collect()
    assert [(r.run_id, r.attempt, r.status, r.charged) for r in runs] == [("c1", 1, "succeeded", True)]
    assert os.path.exists(os.path.join(out, "report.png"))
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(data.key).spent_epsilon == pytest.approx(1.0)
    assert [e["status"] for e in ledger.runs(data.key)] == ["started", "charged", "fit_started", "succeeded"]


def test_a_server_whose_workers_cannot_start_charges_nothing(connect, data, tmp_path):
    """Issue 50's blocker: docs/cluster.md's server command with a RELATIVE ``PYSPARK_PYTHON=.venv/bin/python``
    (what the docs said before): the server starts and answers SQL, but its Python workers start in a
    temporary directory where that path names nothing. A ledgered ``dpspark run`` against it (the docs'
    client line, as a process) exits 1 with nothing charged and nothing in the ledger, and says to fix
    the server's PYSPARK_PYTHON with an absolute path. Fails without the pre-charge probe of the workers
    (``dpspark.session.check_python_workers``): the run was charged epsilon 1, then failed in its fit.
    Costs a second server (about 30-40 s to start on a shared 2-core machine)."""
    scratch = tmp_path / "relative-server"
    scratch.mkdir()
    port, log_path = _free_port(), str(scratch / "server.log")
    server = _start_server(port, log_path, python="PYSPARK_PYTHON=.venv/bin/python")
    try:
        ledger_path = str(tmp_path / "ledger")
        Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)  # through the module's (working) server
        cfg = _config(tmp_path, data.table, ledger_path)
        _wait_for(server, port, log_path)
        client = documented_connect_commands()[-1]
        assert client.startswith("DPSPARK_REMOTE=sc://127.0.0.1:15002 .venv/bin/dpspark run ")
        env = {k: v for k, v in os.environ.items()
               if k not in _ENV and k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "DPSPARK_LEDGER")}
        env["DPSPARK_REMOTE"] = f"sc://127.0.0.1:{port}"
        done = subprocess.run([sys.executable, "-m", "dpspark.cli", "run", "--config", cfg, "--run-id", "relative",
                               "--json"], env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    finally:
        _stop(server)
    assert done.returncode == 1, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert (outcome["status"], outcome["exit_code"], outcome["epsilon_spent"], outcome["attempt"]) == ("failed", 1, 0.0, None)
    error = outcome["error"]
    assert "Spark Connect server" in error and "PYSPARK_PYTHON" in error and ".venv/bin/python" in error, error
    assert "absolute" in error.lower() and "Nothing was charged" in error and "PythonWorkersError" in done.stderr
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(data.key).spent_epsilon == 0.0
    assert ledger.runs() == []  # no started, charged or failed event
    assert not os.path.exists(tmp_path / "out" / "runs")  # no attempt was recorded


def test_a_table_replaced_between_the_check_and_the_fit_releases_nothing(connect, data, tmp_path, monkeypatch, capsys):
    """A Connect server resolves the input's path again at each action: a table replaced at that path
    after the charge (a new Delta table id) would be read by the fit instead of the charged one (issue
    49). The run checks the id after the fit: nothing is released, and the replacement's rows never
    reach an output. Fails without ``tables.check_still_the_input``: the run released centers of the
    other table."""
    from dpspark.cli import main
    from dpspark.dplloyd.estimator import DPLloyd

    table = str(tmp_path / "swapped")
    connect.createDataFrame(data.pdf).repartition(1).write.format("delta").save(table)
    key = tables.ledger_key_of(connect, table)
    ledger_path = str(tmp_path / "ledger")
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", table, "--epsilon", "3", "--delta", "0"],
                spark=connect) == 0
    far = data.pdf.assign(x=9.5, y=0.5)  # another table's rows: one far point, repeated
    real_fit = DPLloyd.fit

    def replaced_then_fit(self, df, **kwargs):
        shutil.rmtree(table)
        connect.createDataFrame(far).repartition(1).write.format("delta").save(table)
        assert tables.ledger_key_of(connect, table) != key
        return real_fit(self, df, **kwargs)

    monkeypatch.setattr(DPLloyd, "fit", replaced_then_fit)
    capsys.readouterr()
    code = main(["run", "--config", _config(tmp_path, table, ledger_path), "--run-id", "swap", "--json"], spark=connect)
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and outcome["status"] == "failed", outcome
    out = str(tmp_path / "out")
    assert not os.path.exists(os.path.join(out, "summary.json"))
    assert not os.path.exists(os.path.join(out, "centers")) or connect.read.format("delta").load(out + "/centers").count() == 0
    assert Ledger(connect, ledger_path).totals(key).spent_epsilon == pytest.approx(1.0)  # charged before the fit


def _s3_objects(s3, prefix: str) -> dict:
    """{key: bytes} of every object under ``prefix`` in the local S3's bucket ``lake`` (read with boto3,
    not through Spark: what any reader of the bucket sees)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    found = client.list_objects_v2(Bucket="lake", Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket="lake", Key=o["Key"])["Body"].read() for o in found}


def test_cli_run_with_every_path_on_s3a_writes_every_output_there(connect, data, s3, tmp_path, capsys, monkeypatch):
    """Issue 54, item 1: no disk shared by the client and the server. output.path, the ledger and the
    operator log on s3a://; the server writes the centers and runs tables and, through dpspark's jar
    (tables._on_server), summary.json, the per-run and per-attempt summaries, report.png, report.html
    and the operator record, each whole at its usual key. Before this, output.path on s3a was refused
    on Connect (exit 2)."""
    from dpspark.attempt import read_operator_record
    from dpspark.cli import main

    ledger_path, out = "s3a://lake/connect/ledger", "s3a://lake/connect/out"
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", "s3a://lake/connect/operator")
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", data.table, "--epsilon", "3",
                 "--delta", "0"], spark=connect) == 0
    capsys.readouterr()
    cfg = _config(tmp_path, data.table, ledger_path, **{"output.path": out})
    assert main(["run", "--config", cfg, "--run-id", "s3run", "--json"], spark=connect) == 0
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (outcome["status"], outcome["epsilon_spent"]) == ("succeeded", 1.0), outcome
    objects = _s3_objects(s3, "connect/")
    summary = json.loads(objects["connect/out/summary.json"])
    assert summary["run_id"] == "s3run" and len(summary["centers"]) == 3 and summary["accounting"] == "ledger"
    assert json.loads(objects["connect/out/summary/s3run.json"]) == summary
    assert json.loads(objects["connect/out/summary/s3run/1.json"]) == summary
    assert set(summary["outputs"].values()) >= {out + "/summary.json", out + "/report.png", out + "/report.html"}
    assert objects["connect/out/report.png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert b"<html" in objects["connect/out/report.html"][:400].lower()
    small = [k for k in objects if k.startswith(("connect/out/", "connect/operator/"))
             and not k.startswith(("connect/out/centers/", "connect/out/runs/"))]
    assert sorted(small) == ["connect/operator/s3run/attempt-1.json", "connect/out/report.html", "connect/out/report.png",
                             "connect/out/summary.json", "connect/out/summary/s3run.json",
                             "connect/out/summary/s3run/1.json"]  # nothing half-written or extra
    centers = connect.read.format("delta").load(out + "/centers").collect()
    assert sorted(r.cluster_id for r in centers) == [0, 1, 2]
    runs = connect.read.format("delta").load(out + "/runs").collect()
    assert [(r.run_id, r.status) for r in runs] == [("s3run", "succeeded")]
    record = json.loads(objects["connect/operator/s3run/attempt-1.json"])
    assert record["status"] == "succeeded" and read_operator_record(connect, "s3run", 1) == record
    assert Ledger(connect, ledger_path).totals(data.key).spent_epsilon == pytest.approx(1.0)
    # A second release of the same run id (--force): summary.json replaced in place, attempt 2 beside it.
    assert main(["run", "--config", cfg, "--run-id", "s3run", "--force", "--json"], spark=connect) == 0
    capsys.readouterr()
    objects = _s3_objects(s3, "connect/out/summary")
    assert json.loads(objects["connect/out/summary.json"])["attempt"] == 2
    assert json.loads(objects["connect/out/summary/s3run/1.json"])["attempt"] == 1


def test_a_server_without_dpsparks_jar_refuses_a_remote_output_before_the_charge(connect, data, tmp_path, capsys,
                                                                                   monkeypatch):
    """The small-file functions are looked for in the pre-flight (the output location's check): a
    server that cannot load them ends the run there (exit 1) with the flag that fixes it, nothing charged."""
    from dpspark.cli import main

    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
    monkeypatch.setitem(tables.SERVER_FILE_FUNCTIONS, "kind",
                        ("dpspark_kind_missing", "io.dpspark.io.NotOnThisServer", "string"))
    remote = _config(tmp_path, data.table, ledger_path, **{"output.path": "s3a://lake/connect/no-jar"})
    assert main(["run", "--config", remote, "--run-id", "r1"], spark=connect) == 1
    err = capsys.readouterr().err
    assert "--jars dpspark/jars/dpspark-logstore.jar" in err and "io.dpspark.io.NotOnThisServer" in err, err
    assert Ledger(connect, ledger_path).totals(data.key).spent_epsilon == 0.0
    assert Ledger(connect, ledger_path).runs() == []


def test_what_needs_a_classic_session_is_refused_before_the_charge(connect, data, tmp_path, capsys):
    from dpspark.cli import main

    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
    # A parquet input with a ledger: its ledger key is a Hadoop-qualified path.
    parquet = str(tmp_path / "points.parquet")
    connect.createDataFrame(data.pdf).write.parquet(parquet)
    assert main(["run", "--config", _config(tmp_path, parquet, ledger_path, **{"input.format": "parquet"}),
                 "--run-id", "r2"], spark=connect) == 2
    assert "input.format" in capsys.readouterr().err
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(data.key).spent_epsilon == 0.0
    assert ledger.runs() == []  # no started, charged or refused event


# ---------------------------------------------------------------------------------------------
# ldp's rounds, a killed run and racing clients (issue 54, item 5)


def test_ldp_rounds_on_connect_release_what_the_simulation_releases(connect, data, tmp_path, capsys):
    """ldp on a Connect session, both modes through the command line: a simulated run (the server's
    Python workers play the clients), then the ingest walk (``dpspark advance`` publishes each round,
    the users' reports arrive as tables, ``dpspark run`` releases) gives the same centers and weights
    for the same reports, and the ledger holds one local-guarantee charge of each release."""
    from dpspark.cli import main
    from dpspark.ldp import client
    from dpspark.ldp import spark as ldp_spark
    from dpspark.privacy.randomness import Randomness

    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 10.0, 0.0, guarantee="local")

    def config(name, **algorithm):
        cfg = {"input": {"path": data.table, "features": ["x", "y"], "privacy_unit": "id"},
               "domain": {"lower": LOWER, "upper": UPPER},
               "privacy": {"epsilon": 4.0, "delta": 0.0, "ledger": ledger_path},
               "algorithm": {"name": "ldp", "k": 3, **algorithm},
               "output": {"path": str(tmp_path / f"out-{name}"), "report": False}, "seed": 11, "unsafe_fixed_seed": True}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return str(path)

    assert main(["run", "--config", config("simulate"), "--run-id", "sim"], spark=connect) == 0
    simulated = json.loads((tmp_path / "out-simulate" / "summary.json").read_text())
    protocol_path, reports_path = str(tmp_path / "protocol"), str(tmp_path / "reports")
    ingest = config("ingest", mode="ingest", protocol_path=protocol_path, reports_path=reports_path)
    # The clients: the same users with the same secret seeds, outside Spark (numpy only).
    run_key = Randomness(11).run_key
    pdf = data.pdf
    seeds = [client.user_seed(run_key, b"\x02" + int(u).to_bytes(8, "big", signed=True)) for u in pdf["id"]]
    rounds = client.choose_round_batch(seeds, (0.5, 0.25, 0.25))
    unit = np.array([client.to_unit(p, {"lower": LOWER, "upper": UPPER}) for p in pdf[["x", "y"]].to_numpy()])
    for r in (1, 2, 3):
        capsys.readouterr()
        assert main(["advance", "--config", ingest], spark=connect) == 0  # publishes round r, charges nothing
        assert f"round {r}" in capsys.readouterr().out
        params = ldp_spark.read_round_params(connect, protocol_path, r)
        idx = np.nonzero(rounds == r)[0]
        sub, a, y = client.randomize_batch(unit[idx], params, [seeds[i] for i in idx])
        reports = pd.DataFrame({"sub": sub.astype(np.int32), "a": a, "y": y.astype(np.int32)})
        connect.createDataFrame(reports).write.format("delta").save(ldp_spark.round_path(reports_path, r))
    assert main(["run", "--config", ingest, "--run-id", "ingest"], spark=connect) == 0
    released = json.loads((tmp_path / "out-ingest" / "summary.json").read_text())
    assert np.array_equal(np.asarray(released["centers"]), np.asarray(simulated["centers"]))
    assert np.array_equal(np.asarray(released["noisy_weights"]), np.asarray(simulated["noisy_weights"]))
    assert released["guarantee"] == simulated["guarantee"] == "local"
    totals = Ledger(connect, ledger_path).totals(data.key, guarantee="local")
    assert totals.spent_epsilon == pytest.approx(8.0)


# A client whose fit is one long request on the server (a task that beats into a file every 0.2 s for
# a minute, over PUBLIC rows): the kill lands while that request runs on the server.
SLOW_FIT_CLIENT = """
import os, sys
from dpspark.dplloyd.estimator import DPLloyd

BEATS = os.environ["BEATS"]  # read here, on the client: the function runs in the server's workers

def slow(batches):
    import time
    for batch in batches:
        for _ in range(300):
            with open(BEATS, "a") as handle:
                handle.write(".")
            time.sleep(0.2)
        yield batch.iloc[:0]

def slow_fit(self, df, **kwargs):
    df.sparkSession.range(0, 1, 1, 1).mapInPandas(slow, "id LONG").collect()
    raise AssertionError("the slow request was not interrupted")

DPLloyd.fit = slow_fit
from dpspark.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigtermd_connect_run_is_recorded_killed_and_its_requests_interrupted(connect, data, tmp_path):
    """``dpspark run`` as a Connect client process, SIGTERM while its fit's request runs on the server:
    exit 143, the attempt recorded as killed in runs/ and the ledger (charged, nothing released), and
    the request ended on the server: its task stops beating within seconds instead of running on for
    its minute (the abandoned response stream is released, and ``interruptAll`` ends whatever of the
    session is still under way; the operator record counts what it found)."""
    ledger_path, operator, beats = str(tmp_path / "ledger"), str(tmp_path / "operator"), tmp_path / "beats"
    Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
    cfg = _config(tmp_path, data.table, ledger_path)
    env = {**_client_env(), "DPSPARK_OPERATOR_LOG": operator, "BEATS": str(beats)}
    err_path = tmp_path / "client.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_FIT_CLIENT, "run", "--config", cfg, "--run-id", "killed",
                                 "--json"], env=env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 240
        while not beats.exists() or beats.stat().st_size < 5:
            assert proc.poll() is None, err_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the fit's request never started on the server"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err_path.read_text()[-3000:]
    time.sleep(4.0)  # Spark's kill of a Python task: interrupt, then the worker within spark.python.task.killTimeout
    stopped_at = beats.stat().st_size
    time.sleep(3.0)
    assert beats.stat().st_size == stopped_at < 300, "the server kept running the killed run's request"
    status = json.loads(out.strip().splitlines()[-1])
    assert (status["status"], status["exit_code"], status["attempt"]) == ("killed", 143, 1)
    out_dir = str(tmp_path / "out")
    runs = connect.read.format("delta").load(out_dir + "/runs").collect()
    assert [(r.run_id, r.attempt, r.status, r.fit_started) for r in runs] == [("killed", 1, "killed", True)]
    assert not os.path.exists(out_dir + "/summary.json") and not os.path.exists(out_dir + "/centers")
    ledger = Ledger(connect, ledger_path)
    assert [e["status"] for e in ledger.runs(data.key)] == ["started", "charged", "fit_started", "killed"]
    assert ledger.totals(data.key).spent_epsilon == pytest.approx(1.0)
    record = json.loads((tmp_path / "operator" / "killed" / "attempt-1.json").read_text())
    counts = [int(m.group(1)) for m in (re.search(r"interrupted (\d+) Spark Connect operation", line)
                                        for line in record["log"]) if m]
    # interruptAll ran once; it may find nothing left: the kill broke the client out of the request's
    # response stream, and the stream's release already ended the request on the server.
    assert len(counts) == 1, record["log"][-20:]


def test_connect_clients_charging_one_ledger_at_once_spend_exactly_the_cap(connect, s3, tmp_path):
    """Four Connect client processes (no JVM of their own) each charge epsilon 1, released at once,
    against a cap of 2 on one ledger on s3a (each commit PUT held 1 s, so the charges overlap): exactly
    two are charged and two refused, and the ledger holds exactly the cap."""
    clients, cap, key, ledger_path = 4, 2.0, "connect-race-input", "s3a://lake/connect/race-ledger"
    Ledger(connect, ledger_path).set_budget(key, cap, 0.0)
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "ledger_race_driver.py"), "--endpoint", s3.endpoint,
                               "--ledgers", ledger_path, "--sync", str(sync), "--name", f"c{i}", "--key", key,
                               "--remote", SERVER["url"]], env=_client_env(), stdout=subprocess.PIPE,
                              stderr=open(sync / f"stderr-{i}", "w"), text=True)
             for i in range(clients)]
    try:
        deadline = time.monotonic() + 300
        while len(list(sync.glob("ready-0-*"))) < clients:
            assert all(p.poll() is None for p in procs), [(sync / f"stderr-{i}").read_text()[-3000:] for i in range(clients)]
            assert time.monotonic() < deadline, "clients did not get ready"
            time.sleep(0.05)
        s3.commit_delay = 1.0
        (sync / "go-0").touch()
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        s3.commit_delay = 0.0
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = sorted(json.loads(line)["result"] for out in outs for line in out.splitlines() if line.startswith("{"))
    assert results == ["charged"] * 2 + ["refused"] * 2, (results, [(sync / f"stderr-{i}").read_text()[-2000:]
                                                                     for i in range(clients)])
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(key).spent_epsilon == cap
    assert sum(1 for e in ledger.runs(key) if e["status"] == "charged") == 2


def test_cli_run_with_output_table_registers_both_names_on_connect(connect, data, tmp_path, capsys):
    """output.table on Spark Connect: each run registers {output.path}/centers and /runs as external
    catalog tables on the server (the same SQL as on a classic session), queryable by name; the second
    run finds them registered and adds its rows; the same names for another output.path are refused
    before the charge. The database (at a temporary location) is dropped at the end: no data deleted."""
    from dpspark.cli import main

    db = "dpspark_connect_out"
    connect.sql(f"CREATE DATABASE IF NOT EXISTS {db} LOCATION '{tmp_path / 'catalog'}'")
    try:
        ledger_path = str(tmp_path / "ledger")
        Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
        names = {"centers_table": f"{db}.clusters_centers", "runs_table": f"{db}.clusters_runs"}
        cfg = _config(tmp_path, data.table, ledger_path, **{"output.table": f"{db}.clusters", "output.report": False})
        for run_id in ("t1", "t2"):
            capsys.readouterr()
            assert main(["run", "--config", cfg, "--run-id", run_id, "--json"], spark=connect) == 0
            outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert {key: outcome["outputs"][key] for key in names} == names
        with open(os.path.join(str(tmp_path / "out"), "summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
        assert {key: summary["outputs"][key] for key in names} == names
        centers = connect.table(names["centers_table"]).collect()
        assert sorted((r.run_id, r.cluster_id) for r in centers) == [(i, j) for i in ("t1", "t2") for j in range(3)]
        runs = connect.table(names["runs_table"]).collect()
        assert sorted((r.run_id, r.attempt, r.status) for r in runs) == [("t1", 1, "succeeded"), ("t2", 1, "succeeded")]
        # The same names for another output.path: refused before the charge (exit 2, nothing spent).
        other = _config(tmp_path, data.table, ledger_path, **{"output.table": f"{db}.clusters", "output.report": False,
                                                               "output.path": str(tmp_path / "elsewhere")})
        capsys.readouterr()
        assert main(["run", "--config", other, "--run-id", "t3", "--json"], spark=connect) == 2
        outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert outcome["error"].startswith("config key 'output.table'") and "already a catalog table" in outcome["error"]
        assert not os.path.exists(str(tmp_path / "elsewhere"))
        assert Ledger(connect, ledger_path).totals(data.key).spent_epsilon == pytest.approx(2.0)
    finally:
        connect.sql(f"DROP DATABASE IF EXISTS {db} CASCADE")
    assert len(connect.read.format("delta").load(str(tmp_path / "out" / "centers")).collect()) == 6  # external: kept


# ---------------------------------------------------------------------------------------------
# input.where on Connect (issue 54, item 2): ANSI pinned off on the run's session, columns checked
# from the schema, the Filter analysed by the server before the charge (dpspark.rowfilter.apply_connect)

ANSI = "spark.sql.ansi.enabled"


def test_cli_run_with_a_row_filter_releases_from_the_filtered_rows(connect, data, tmp_path, capsys):
    """``input.where`` on a Spark Connect session: ANSI mode is pinned off on the run's session (read
    back and probed before the charge) and the filter's columns are checked from the table's schema;
    the run succeeds and releases from the filtered rows only: ``id < 150`` keeps the blob at (2, 2),
    150 rows of 450. Fails with the old refusal (exit 2)."""
    from dpspark.cli import main

    saved = connect.conf.get(ANSI)
    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
    capsys.readouterr()
    try:
        connect.conf.set(ANSI, "true")  # a Connect server's default in Spark 4
        cfg = _config(tmp_path, data.table, ledger_path, **{"input.where": "id < 150"})
        assert main(["run", "--config", cfg, "--run-id", "w1", "--json"], spark=connect) == 0
        assert connect.conf.get(ANSI) == "false"  # pinned for the rest of the session, never put back
    finally:
        connect.conf.set(ANSI, saved)
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (outcome["status"], outcome["epsilon_spent"]) == ("succeeded", 1.0)
    with open(os.path.join(str(tmp_path / "out"), "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["input"]["where"] == "id < 150"
    assert 100 < sum(summary["noisy_weights"]) < 200  # the 150 rows kept, not the table's 450
    heaviest = np.array(summary["centers"][int(np.argmax(summary["noisy_weights"]))])
    assert np.abs(heaviest - [2.0, 2.0]).max() < 0.5, summary  # the kept blob
    runs = connect.read.format("delta").load(str(tmp_path / "out" / "runs")).collect()
    assert [(r.run_id, r.status, r.input_where) for r in runs] == [("w1", "succeeded", "id < 150")]
    assert Ledger(connect, ledger_path).totals(data.key).spent_epsilon == pytest.approx(1.0)


def test_a_row_filter_with_implicit_casts_never_fails_a_connect_run_on_hostile_rows(connect, tmp_path, capsys):
    """The privacy reason for the pin: the filter runs on private rows after the charge, and the server
    analyses it again at every action. A filter whose implicit casts meet cells that do not parse
    ('abc', '1e400', 'NaN', a 100,000-character string, invalid UTF-8, nulls) raises on them with
    ANSI mode on (shown first, on the same Column); through ``dpspark run`` (ANSI pinned off before the
    charge) the run succeeds. Fails without the pin: the run is charged, then its fit fails (measured:
    a DateTimeException), a failure that depends on a cell's value."""
    from pyspark.sql import functions as F

    from dpspark import rowfilter
    from dpspark.cli import main

    cells = ["abc", "1e400", "NaN", "", "z" * 100_000, "\\", "2026-11-30", "7", None]
    rng = np.random.default_rng(5)
    pdf = pd.DataFrame({"id": np.arange(90), "x": 2.0 + rng.normal(0, 0.3, 90), "y": 2.0 + rng.normal(0, 0.3, 90),
                        "s": [cells[i % len(cells)] for i in range(90)],
                        "raw": [b"\xff\xfe" if i % 4 == 0 else b"ok" for i in range(90)]})
    table = str(tmp_path / "hostile")
    (connect.createDataFrame(pdf).withColumn("u", F.col("raw").cast("string")).drop("raw")
     .repartition(3).write.format("delta").save(table))
    where = ("s = 1 OR isnan(s) OR year(s) = 2026 OR hour(u) = 1 OR coalesce(s, 0) = 7 OR s BETWEEN 1 AND 5 "
             "OR u > DATE '2026-01-01' OR to_date(s) IS NULL")
    saved = connect.conf.get(ANSI)
    try:
        connect.conf.set(ANSI, "true")
        df = connect.read.format("delta").load(table)
        with pytest.raises(Exception, match="CAST_INVALID_INPUT|CANNOT_PARSE|cannot be cast"):
            df.where(rowfilter.to_column(rowfilter.parse(where), df.columns)).count()  # what the pin prevents
        key = tables.ledger_key_of(connect, table)
        ledger_path = str(tmp_path / "ledger")
        Ledger(connect, ledger_path).set_budget(key, 3.0, 0.0)
        capsys.readouterr()
        cfg = _config(tmp_path, table, ledger_path, **{"input.where": where})
        code = main(["run", "--config", cfg, "--run-id", "hostile", "--json"], spark=connect)
    finally:
        connect.conf.set(ANSI, saved)
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and outcome["status"] == "succeeded", outcome
    assert Ledger(connect, ledger_path).totals(key).spent_epsilon == pytest.approx(1.0)


def test_random_filters_from_the_grammar_never_raise_on_hostile_rows_through_connect(connect, tmp_path):
    """tests/test_where_filter.py's random filters and hostile rows, through ``rowfilter.apply`` on the
    Connect session (the server's default ANSI mode on before each): each filter is either refused
    (ConfigError, before any job) or accepted with ANSI left off; the accepted ones then run in one
    job, analysed again by the server as a run's fit is, without raising on any row."""
    import datetime as dt
    import random

    from pyspark.sql import functions as F

    from dpspark import rowfilter
    from dpspark.errors import ConfigError
    from test_where_filter import HOSTILE_SCHEMA, hostile_rows, random_filter

    # Timestamps at year 1 do not convert on the client (its time zone): sent as text, cast by the server.
    rows = [tuple(v.isoformat(sep=" ") if isinstance(v, dt.datetime) else v for v in row) for row in hostile_rows()]
    path = str(tmp_path / "hostile")
    (connect.createDataFrame(rows, HOSTILE_SCHEMA.replace("t timestamp", "t string"))
     .withColumn("t", F.col("t").cast("timestamp")).withColumn("u", F.col("b").cast("string"))
     .select(*[c.split()[0] for c in HOSTILE_SCHEMA.split(", ")], "u").repartition(3).write.parquet(path))
    saved = connect.conf.get(ANSI)
    try:
        df = connect.read.parquet(path)
        r = random.Random(2028)
        built = []
        for text in [random_filter(r) for _ in range(100)]:
            connect.conf.set(ANSI, "true")
            try:
                rowfilter.apply(connect, df, text)
            except ConfigError:
                continue
            assert connect.conf.get(ANSI) == "false"
            built.append(text)
        names = list(df.columns)
        row = df.select(*[F.sum(F.when(rowfilter.to_column(rowfilter.parse(t), names), 1).otherwise(0)).alias(f"c{i}")
                          for i, t in enumerate(built)]).first()  # raises if any filter raises on any row
    finally:
        connect.conf.set(ANSI, saved)
    assert len(built) >= 35
    assert all(0 <= row[f"c{i}"] <= 9 for i in range(len(built)))


def test_a_server_that_does_not_keep_ansi_off_refuses_the_filter_before_the_charge(connect, data, tmp_path, capsys,
                                                                                  monkeypatch):
    """``rowfilter.pin_non_ansi`` verifies the pin twice before any charge: the setting read back (a
    server that reads back anything but 'false'), and a probe on a constant row (a server that says
    'false' but still casts with ANSI mode on: here the setting is dropped on its way). Both runs exit
    2 naming input.where, with nothing charged and nothing in the ledger."""
    from pyspark.sql.connect.conf import RuntimeConf

    from dpspark.cli import main

    real_get, real_set = RuntimeConf.get, RuntimeConf.set
    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
    cfg = _config(tmp_path, data.table, ledger_path, **{"input.where": "x > 1"})
    saved = connect.conf.get(ANSI)
    capsys.readouterr()
    try:
        connect.conf.set(ANSI, "true")
        monkeypatch.setattr(RuntimeConf, "get", lambda self, key, *default: "true" if key == ANSI
                            else real_get(self, key, *default))
        assert main(["run", "--config", cfg, "--run-id", "p1"], spark=connect) == 2
        err = capsys.readouterr().err
        assert "input.where" in err and "reads back 'true'" in err, err
        real_set(connect.conf, ANSI, "true")
        monkeypatch.setattr(RuntimeConf, "set", lambda self, key, value: None if key == ANSI
                            else real_set(self, key, value))
        monkeypatch.setattr(RuntimeConf, "get", lambda self, key, *default: "false" if key == ANSI
                            else real_get(self, key, *default))
        assert main(["run", "--config", cfg, "--run-id", "p2"], spark=connect) == 2
        err = capsys.readouterr().err
        assert "input.where" in err and "still casts with ANSI mode on" in err, err
    finally:
        monkeypatch.undo()
        connect.conf.set(ANSI, saved)
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(data.key).spent_epsilon == 0.0
    assert ledger.runs() == []  # no started, charged or refused event


def test_a_filter_the_server_cannot_analyse_is_refused_before_the_charge(connect, data, tmp_path, capsys):
    """A Connect client gives a filter its child's cached schema without asking the server, so a filter
    that does not analyse on this table (not a boolean; a bigint compared with a date) would only fail
    at the fit's first action, after the charge. ``apply_connect`` has the server analyse the Filter
    itself (``semanticHash``) before the charge: exit 2 naming input.where, nothing charged. Fails with
    ``schema`` in its place (the run is charged, then fails with exit 1)."""
    from dpspark.cli import main

    ledger_path = str(tmp_path / "ledger")
    Ledger(connect, ledger_path).set_budget(data.key, 3.0, 0.0)
    saved = connect.conf.get(ANSI)
    capsys.readouterr()
    try:
        for i, where in enumerate(["x", "id = DATE '2026-11-30'", "startswith(x, y) > DATE '2026-11-30'"]):
            cfg = _config(tmp_path, data.table, ledger_path, **{"input.where": where})
            assert main(["run", "--config", cfg, "--run-id", f"a{i}"], spark=connect) == 2, where
            err = capsys.readouterr().err
            assert "input.where" in err and "not a valid predicate on this table" in err, err
    finally:
        connect.conf.set(ANSI, saved)
    ledger = Ledger(connect, ledger_path)
    assert ledger.totals(data.key).spent_epsilon == 0.0
    assert ledger.runs() == []
