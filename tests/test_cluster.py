"""Cluster mode for real (issue 8): spark-submit to a Spark standalone cluster on this machine.

A master and two workers (separate JVMs, each worker with its own working directory) are
started by the README's own commands (``scripts/cluster.py start``); dpspark is packaged and
submitted by the README's own commands too: the block under
``<!-- cluster-commands ... -->`` is parsed here and each command runs through bash as written,
with only ``CONFIG`` and ``RUN_ID`` set by the test.

The executors run a Python that holds numpy, pandas and pyarrow only (no dpspark, scipy,
scikit-learn or OpenDP): dpspark reaches them through ``--py-files`` or not at all. The config
and data paths are relative to the project root, where the driver runs; the executors run in
the workers' own directories, so they only work if the driver resolves the paths.

Checked: each family releases exactly the local-mode centers for the same config and seed, with
tasks run on both workers (dplloyd and ldp in their own submits; maxcover in the lost-worker run,
whose check is that same comparison, so it is not submitted twice); a worker (and its executor)
killed while it runs tasks of a job does not change the released centers, and the ledger holds
exactly one charge for the run (its budget set by the ledger's administrator first, as
``dpspark ledger set-budget`` does); a bad config exits 2
through spark-submit and leaves nothing behind. The configs fix ``seed: 7`` (with
``unsafe_fixed_seed: true``): reproducible, hence NOT PRIVATE runs, which is what the comparison needs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dpspark import tables
from dpspark.cli import main
from dpspark.privacy.ledger import Ledger

from conftest import ROOT, blobs
from s3mock import read_text

sys.path.insert(0, str(ROOT / "scripts"))
import cluster as cluster_script  # noqa: E402  scripts/cluster.py

README_MARK = "<!-- cluster-commands: tests/test_cluster.py runs this block as written -->"
COMMAND_KINDS = {"start": "cluster.py start", "wheel": "pip wheel", "zip": "cp dist/", "submit": "spark-submit",
                 "stop": "cluster.py stop"}
FAMILIES = {
    "maxcover": ({"name": "maxcover", "k": 3, "objective": "kmeans"}, 1e-6),
    "dplloyd": ({"name": "dplloyd", "k": 3, "variant": "allocation_nk", "iterations": 8}, 0.0),
    "ldp": ({"name": "ldp", "k": 3, "objective": "kmeans"}, 0.0),
}
TRUE_CENTERS = [(20, 20), (80, 30), (50, 80)]
# spark-submit's session has Spark's cluster defaults: 200 shuffle partitions (each pass of ldp or
# maxcover then runs 200 tasks per aggregation: ldp's submit ran about 1000 tasks, most of its time
# on two one-core executors) and 50 per Delta snapshot. A layout of this size still differs from
# the local one (tests/conftest.py: 2 shuffle partitions, 1 snapshot partition).
CLUSTER_CONF = {"spark.sql.shuffle.partitions": 6, "spark.databricks.delta.snapshotPartitions": 3}
N_PER_CLUSTER = 40_000


def readme_commands() -> list[str]:
    """The README's cluster block as logical commands (continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text()
    assert README_MARK in text, "README.md lost its cluster-commands block"
    block = text.split(README_MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        commands.append((current + line).strip())
        current = ""
    return commands


def command(kind: str) -> str:
    matches = [c for c in readme_commands() if COMMAND_KINDS[kind] in c]
    assert len(matches) == 1, f"README cluster block: expected one {kind!r} command, found {matches}"
    return matches[0]


def bash(cmd: str, env: dict, **kwargs):
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + cmd], cwd=ROOT, env=env, text=True,
                          capture_output=True, **kwargs)


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_") and k != "SPARK_HOME"}
    env.update(extra)
    return env


def rel(path) -> str:
    """``path`` relative to the project root (where spark-submit runs)."""
    return os.path.relpath(path, ROOT)


def test_readme_block_is_exactly_start_package_submit_stop():
    assert [next(k for k, key in COMMAND_KINDS.items() if key in c) for c in readme_commands()] == list(COMMAND_KINDS)


def test_executor_modules_import_without_the_driver_only_packages():
    """What the passes' closures import on an executor: numpy (and pandas) only, never scipy,
    scikit-learn, OpenDP, matplotlib, PyYAML or pyspark (a quick check; the cluster tests run it for real)."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('scipy', 'sklearn', 'opendp', 'matplotlib', 'yaml', 'pyspark', 'threadpoolctl'):\n"
        "            raise ImportError('driver-only package imported on an executor: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import dpspark.maxcover.kernels, dpspark.steps.lloyd_kernels, dpspark.ldp.client\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    # and the block really blocks: the driver side imports scipy
    proc = subprocess.run([sys.executable, "-c", code.replace("dpspark.ldp.client", "dpspark.maxcover.core")],
                          capture_output=True, text=True, cwd="/")
    assert proc.returncode != 0 and "driver-only package imported on an executor: scipy" in proc.stderr


EXECUTOR_BLOCK = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('scipy', 'sklearn', 'opendp', 'matplotlib', 'yaml', 'threadpoolctl'):\n"
    "            raise ImportError('driver-only package imported on an executor: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n"
)


def test_shipped_functions_load_and_run_where_only_numpy_and_pandas_are():
    """What Spark really ships to the executors for ldp's simulated clients (the mapInPandas function)
    and for contribution bounding (the keyed-hash pandas UDF), cloudpickled on the driver. Unpickled
    and run in a Python that cannot import the driver-only packages (pyspark is allowed: Spark ships
    it to its workers), each must work: a function that refers to a global of a module importing
    scipy or scikit-learn makes the executor import that module, and the job fails there (the
    cluster tests find it after minutes; this finds it in seconds). Shown to catch that: the same
    check on a function that refers to ``dpspark.ldp.protocol``."""
    from pyspark import cloudpickle

    from dpspark.ldp import protocol
    from dpspark.ldp import spark as ldp_spark
    from dpspark.privacy import bounding

    def load_and_run(fn, call: str):
        code = EXECUTOR_BLOCK + (
            "import pickle, numpy as np, pandas as pd\n"
            "fn = pickle.loads(sys.stdin.buffer.read())\n"
            "rng = np.random.default_rng(0)\n"
            f"print('result', {call})\n"
        )
        return subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(fn), capture_output=True, cwd="/",
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    params = protocol.assign_round(np.array([[-0.5, -0.5], [0.5, 0.5]]), 1.0, 2)
    clients = ldp_spark.client_runner(params, "ab" * 32, (0.5, 0.25, 0.25), 2, ["_u0", "_u1"])
    batch = (f"pd.DataFrame({{{ldp_spark.KEY!r}: [str(i) for i in range(400)], "
             "'_u0': rng.uniform(-1, 1, 400), '_u1': rng.uniform(-1, 1, 400)})")
    proc = load_and_run(clients, f"sum(len(o) for o in fn(iter([{batch}])))")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    reports = int(proc.stdout.decode().split()[-1])
    assert 50 <= reports <= 150  # round 2 of fractions (0.5, 0.25, 0.25): about 100 of the 400 clients

    proc = load_and_run(bounding.row_keys("cd" * 32), "len(set(fn(pd.Series(['1', '2', '1']), pd.Series(['h'] * 3))))")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().split()[-1] == "2"  # one key per (person, content)

    def leaky(batches):  # a broken variant: its global is a module that imports scikit-learn
        return protocol.assign_round

    proc = load_and_run(leaky, "fn")
    assert proc.returncode != 0 and b"driver-only package imported on an executor: sklearn" in proc.stderr


# ----------------------------------------------------------------------------
# The cluster, the package, the data


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The README's start command (state in a temporary directory); its stop command afterwards, always."""
    state = tmp_path_factory.mktemp("cluster")
    env = clean_env(DPSPARK_CLUSTER_DIR=str(state))
    try:
        proc = bash(command("start") + '\necho "MASTER=$MASTER"\necho "EXECUTOR_PYTHON=$EXECUTOR_PYTHON"\n', env,
                    timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        assert values["MASTER"].startswith("spark://127.0.0.1:") and os.path.exists(values["EXECUTOR_PYTHON"])
        handle = cluster_script.StandaloneCluster.load(state)
        handle.submit_env = clean_env(MASTER=values["MASTER"], EXECUTOR_PYTHON=values["EXECUTOR_PYTHON"])
        yield handle
    finally:
        bash(command("stop"), env, timeout=120)
        leftovers = cluster_script.StandaloneCluster.load(state) if (state / "state.json").exists() else None
        if leftovers is not None:  # the stop command failed: stop by hand, then fail
            leftovers.stop()
            pytest.fail("scripts/cluster.py stop left the cluster running")


@pytest.fixture(scope="module")
def package():
    """The README's wheel and zip commands, from the project root."""
    for old in (ROOT / "dist").glob("dpspark-*"):
        old.unlink()
    for kind in ("wheel", "zip"):
        proc = bash(command(kind), clean_env(), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return ROOT / "dist" / "dpspark-0.1.0.zip"


@pytest.fixture(scope="module")
def points(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster-data")
    x = blobs(N_PER_CLUSTER, TRUE_CENTERS, 5.0, 11)
    pdf = pd.DataFrame({"user": np.arange(len(x)), "x": x[:, 0], "y": x[:, 1]})
    path = str(base / "points")
    spark.createDataFrame(pdf).repartition(6).write.format("delta").mode("overwrite").save(path)
    return base, path


def uri(path) -> str:
    """A local ``path`` relative to the project root; a URI (s3a://...) as it is."""
    return str(path) if "://" in str(path) else rel(path)


def write_config(base: Path, name: str, family: str, input_path: str, ledger: str | None = None,
                 output: str | None = None, **spark_conf) -> Path:
    algorithm, delta = FAMILIES[family]
    cfg = {
        "input": {"path": uri(input_path), "format": "delta", "features": ["x", "y"]},
        "domain": {"lower": [0, 0], "upper": [100, 100]},
        "privacy": {"epsilon": 1.0, "delta": delta, "ledger": uri(ledger) if ledger else None},
        "algorithm": algorithm,
        "output": {"path": output or rel(base / name / "out")},
        "seed": 7,
        "unsafe_fixed_seed": True,  # the same noise as the local run: NOT PRIVATE, a test
        "spark": {"conf": {"spark.ui.enabled": False, **CLUSTER_CONF, **spark_conf}},
    }
    path = base / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def released(spark, config_path: Path):
    cfg = yaml.safe_load(config_path.read_text())
    out = cfg["output"]["path"] if "://" in cfg["output"]["path"] else str(ROOT / cfg["output"]["path"])
    centers = spark.read.format("delta").load(out + "/centers").orderBy("cluster_id").toPandas()
    summary = json.loads(read_text(spark, out + "/summary.json"))
    return centers[["x", "y", "noisy_weight"]].to_numpy(dtype=np.float64), summary


@pytest.fixture(scope="module")
def local_release(spark, points):
    """Each family run in local mode (this test session's local[2] SparkSession) on the same config."""
    base, path = points
    results = {}
    cwd = os.getcwd()
    os.chdir(ROOT)  # the config's paths are relative to the project root
    try:
        for family in FAMILIES:
            cfg = write_config(base, f"local-{family}", family, path)
            assert main(["run", "--config", str(cfg), "--run-id", f"local-{family}"], spark=spark) == 0
            results[family] = released(spark, cfg)
    finally:
        os.chdir(cwd)
    return results


def submit(cluster, config_path: Path, run_id: str, log_dir: Path, **deployment_env):
    """Start the README's spark-submit command; stdout and stderr go to files in ``log_dir``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out, err = open(log_dir / "stdout", "w"), open(log_dir / "stderr", "w")
    env = dict(cluster.submit_env, CONFIG=rel(config_path), RUN_ID=run_id, **deployment_env)
    proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + command("submit")], cwd=ROOT, env=env,
                            stdout=out, stderr=err, text=True)
    out.close()
    err.close()
    return proc


def finish(proc, log_dir: Path, timeout=900):
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return rc, (log_dir / "stdout").read_text(), (log_dir / "stderr").read_text()


def app_id(stderr: str) -> str:
    found = re.search(r"Connected to Spark cluster with app ID (app-[0-9-]+)", stderr)
    assert found, "spark-submit did not connect to the standalone master:\n" + stderr[-3000:]
    return found.group(1)


def workers_that_ran_tasks(cluster, app: str) -> list[str]:
    """The workers whose executor for ``app`` ran at least one task (from the executors' own logs)."""
    ran = []
    for name in ("worker1", "worker2"):
        logs = list((cluster.state_dir / name / app).glob("*/stderr"))
        if any("Running task" in p.read_text(errors="replace") for p in logs):
            ran.append(name)
    return ran


# ----------------------------------------------------------------------------
# The tests


# maxcover's release on the cluster is checked by the lost-worker test below (the same comparison
# with the local release, tasks on both workers): one maxcover submit instead of two.
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "maxcover"])
def test_each_family_releases_the_local_mode_centers_on_the_cluster(spark, cluster, package, points, local_release,
                                                                    family, tmp_path):
    base, path = points
    # A ledger on the local disk: the README's command gives the driver dpspark's log store, so the
    # charge is made (without it, a local ledger's charge is refused, exit 3: not exclusive).
    ledger_path, guarantee = str(base / f"ledger-{family}"), "local" if family == "ldp" else "central"
    input_key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger_path).set_budget(input_key, 10.0, 1e-5, guarantee=guarantee)
    cfg = write_config(base, f"cluster-{family}", family, path, ledger=ledger_path)
    rc, stdout, stderr = finish(submit(cluster, cfg, f"cluster-{family}", tmp_path / "logs"), tmp_path / "logs")
    assert rc == 0, stderr[-4000:]
    totals = Ledger(spark, ledger_path).totals(input_key, guarantee=guarantee)
    assert (totals.spent_epsilon, totals.spent_delta) == (1.0, FAMILIES[family][1])
    assert "released centers" in stdout
    # both workers' executors ran tasks (their Python has no dpspark: it came from the zip)
    assert workers_that_ran_tasks(cluster, app_id(stderr)) == ["worker1", "worker2"]
    centers, summary = released(spark, cfg)
    local_centers, local_summary = local_release[family]
    assert np.array_equal(centers, local_centers), (centers, local_centers)
    assert summary["epsilon_spent"] == local_summary["epsilon_spent"] == 1.0
    assert summary["delta_spent"] == local_summary["delta_spent"] == FAMILIES[family][1]
    # a sanity check that these are real clusterings, not two equal empty answers
    for true in TRUE_CENTERS:
        assert np.min(np.linalg.norm(centers[:, :2] - np.asarray(true), axis=1)) < 10.0


def _executor_on(cluster, worker: str, app: str) -> str | None:
    dirs = [p.name for p in (cluster.state_dir / worker / app).glob("*") if p.is_dir()]
    return dirs[0] if dirs else None


def _active_tasks(ui: str, executor_id: str) -> int:
    with urllib.request.urlopen(ui + "/api/v1/applications", timeout=5) as resp:
        apps = json.load(resp)
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{apps[0]['id']}/executors", timeout=5) as resp:
        executors = json.load(resp)
    return sum(int(e["activeTasks"]) for e in executors if e["id"] == executor_id)


def test_losing_a_worker_mid_job_changes_nothing_and_charges_once(spark, cluster, package, points, local_release,
                                                                  s3, tmp_path):
    """On object storage (issue 27): the input table, the ledger and the outputs are on s3a:// (a local S3,
    the ``s3`` fixture); the deployment's spark-defaults.conf gives spark-submit the S3A connector,
    dpspark's log store and the endpoint."""
    base, local_path = points
    path = "s3a://lake/cluster/points"
    spark.read.format("delta").load(local_path).write.format("delta").mode("overwrite").save(path)
    ledger_path = "s3a://lake/cluster/ledger-worker-loss"
    input_key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger_path).set_budget(input_key, 10.0, 1e-5)  # the administrator's cap, before any run
    ui_port = cluster_script.free_port()
    cfg = write_config(base, "cluster-worker-loss", "maxcover", path, ledger=ledger_path,
                       output="s3a://lake/cluster/worker-loss/out", **{"spark.ui.enabled": True, "spark.ui.port": ui_port})
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(s3.spark_defaults())
    logs = tmp_path / "logs"
    # The deployment keeps Spark's own log in an accounted run (its driver log is the operator's here):
    # the check below reads the driver noticing the lost executor from it.
    proc = submit(cluster, cfg, "worker-loss", logs, DPSPARK_ACCOUNTED_SPARK_LOG="WARN", SPARK_CONF_DIR=str(conf_dir))
    ui = f"http://127.0.0.1:{ui_port}"
    killed_with_tasks = 0
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            stderr = (logs / "stderr").read_text()
            stdout = (logs / "stdout").read_text()
            found = re.search(r"app ID (app-[0-9-]+)", stderr)
            # wait until the fit has started (the ledger charge is done) and worker2's executor runs tasks
            if found and "maxcover: fit ..." in stdout:
                executor = _executor_on(cluster, "worker2", found.group(1))
                if executor is not None:
                    try:
                        active = _active_tasks(ui, executor)
                    except OSError:
                        active = 0
                    if active > 0:
                        cluster.kill_worker("worker2")
                        killed_with_tasks = active
                        break
            time.sleep(0.05)
        rc, stdout, stderr = finish(proc, logs)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed_with_tasks > 0, "worker2's executor never ran a task of the fit while the job ran"
    assert rc == 0, stderr[-4000:]
    assert re.search(r"Lost executor \d+", stderr), "the driver did not notice the lost executor"
    assert "released centers" in stdout
    assert workers_that_ran_tasks(cluster, app_id(stderr)) == ["worker1", "worker2"]
    centers, summary = released(spark, cfg)
    assert np.array_equal(centers, local_release["maxcover"][0])
    assert summary["delta_spent"] == local_release["maxcover"][1]["delta_spent"] == 1e-6
    for true in TRUE_CENTERS:  # a real clustering, not two equal empty answers
        assert np.min(np.linalg.norm(centers[:, :2] - np.asarray(true), axis=1)) < 10.0
    ledger = Ledger(spark, ledger_path)
    events = [(e["run_id"], e["attempt"], e["status"], e["epsilon"], e["delta"]) for e in ledger.runs()]
    assert events == [("worker-loss", 1, "started", 0.0, 0.0), ("worker-loss", 1, "charged", 1.0, 1e-6),
                      ("worker-loss", 1, "fit_started", 0.0, 0.0), ("worker-loss", 1, "succeeded", 0.0, 0.0)]
    assert {e["input_path"] for e in ledger.runs()} == {input_key}  # the s3a table's one balance
    totals = ledger.totals(input_key)
    assert (totals.spent_epsilon, totals.spent_delta) == (1.0, 1e-6)
    assert summary["epsilon_spent"] == 1.0 and summary["attempt"] == 1 and summary["private"] is False


def test_bad_config_exits_2_through_spark_submit_and_leaves_nothing(cluster, package, points, tmp_path):
    base, path = points
    cfg = write_config(base, "cluster-bad", "dplloyd", path, ledger=str(base / "ledger-bad"))
    raw = yaml.safe_load(cfg.read_text())
    raw["algorithm"]["k"] = 0
    cfg.write_text(yaml.safe_dump(raw))
    rc, stdout, stderr = finish(submit(cluster, cfg, "bad", tmp_path / "logs"), tmp_path / "logs", timeout=300)
    assert rc == 2, stderr[-3000:]
    assert "algorithm.k" in stdout  # spark-submit passes the Python driver's stderr on to its stdout
    assert not (ROOT / raw["output"]["path"]).exists()
    assert not (base / "ledger-bad").exists()
    assert "Connected to Spark cluster" not in stderr  # refused before Spark started
