#!/usr/bin/env python
"""A Spark standalone cluster on this machine: one master and two workers, for cluster-mode runs.

    eval "$(.venv/bin/python scripts/cluster.py start)"   # prints MASTER=... and EXECUTOR_PYTHON=...
    .venv/bin/python scripts/cluster.py status            # the master's view: workers and applications
    .venv/bin/python scripts/cluster.py stop              # stops the master, the workers and their executors

The master and each worker are separate JVMs started with the ``spark-class`` that the pyspark
package ships (``org.apache.spark.deploy.master.Master``, ``...worker.Worker``), bound to 127.0.0.1.
Each worker has its own working directory (where its executors run) under the state directory
(default ``.cache/cluster``, or ``$DPSPARK_CLUSTER_DIR``, or ``--state-dir``), with the logs and a ``state.json`` that ``stop`` reads.

The executors run ``EXECUTOR_PYTHON``: a separate Python environment that holds ONLY what the
README says executors need (numpy, pandas, pyarrow and their dependencies; pyspark itself comes
from Spark). dpspark is NOT in it: the job must ship dpspark to the executors (``--py-files``
with the wheel), exactly as on a real cluster where the executors are other machines.

Tests use :class:`StandaloneCluster` directly (``tests/test_cluster.py``); the processes are started
in their own process groups so that :meth:`StandaloneCluster.kill_worker` can take one worker and
its executors away (a lost machine), and :meth:`StandaloneCluster.stop` stops everything, whatever
happened before.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = Path(os.environ.get("DPSPARK_CLUSTER_DIR") or ROOT / ".cache" / "cluster")

# What executors import besides pyspark (which Spark puts on their PYTHONPATH itself): the
# mapInPandas passes need numpy, pandas and pyarrow. The rest are their own dependencies.
EXECUTOR_PACKAGES = ("numpy", "numpy.libs", "pandas", "pyarrow", "dateutil", "pytz", "tzdata", "six.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> str:
    """The pyspark package directory: a full SPARK_HOME (jars/, bin/spark-class, python/lib/pyspark.zip)."""
    import pyspark

    return str(Path(pyspark.__file__).parent)


def spark_class() -> str:
    return str(Path(spark_home()) / "bin" / "spark-class")


def make_executor_python(state_dir: Path) -> str:
    """A venv whose site-packages sees only EXECUTOR_PACKAGES (symlinks into this .venv's site-packages)."""
    venv = state_dir / "executor-python"
    python = venv / "bin" / "python"
    site_packages = Path(sysconfig.get_paths()["purelib"])
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    allowed = venv / "allowed-packages"
    shutil.rmtree(allowed, ignore_errors=True)
    allowed.mkdir(parents=True)
    for name in EXECUTOR_PACKAGES:
        for source in [site_packages / name, *site_packages.glob(f"{name.split('.')[0]}-*.dist-info")]:
            if source.exists() and not (allowed / source.name).exists():
                (allowed / source.name).symlink_to(source)
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    (target / "dpspark-executor-packages.pth").write_text(str(allowed) + "\n")
    return str(python)


def _die_with_parent():  # pragma: no cover - runs in the child before exec
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class StandaloneCluster:
    """A master and ``workers`` workers on 127.0.0.1 (each ``cores`` cores, ``memory`` of memory)."""

    def __init__(self, state_dir: str | os.PathLike = DEFAULT_STATE_DIR, workers: int = 2, cores: int = 1,
                 memory: str = "3g", die_with_parent: bool = True):
        self.state_dir = Path(state_dir)
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.die_with_parent = die_with_parent
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: dict[str, int] = {}
        self.master_url = ""
        self.master_ui = ""
        self.worker_uis: dict[str, str] = {}
        self.executor_python = ""

    # -- processes

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.state_dir / f"{name}.log", "ab")
        env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="localhost",
                   SPARK_NO_DAEMONIZE="1", SPARK_LOG_DIR=str(self.state_dir),
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        env.pop("PYSPARK_GATEWAY_PORT", None)
        proc = subprocess.Popen([spark_class(), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=self.state_dir,
                                preexec_fn=_die_with_parent if self.die_with_parent else None,
                                start_new_session=not self.die_with_parent)
        log.close()
        self.procs[name] = proc
        self.pids[name] = proc.pid

    def start(self, timeout: float = 120.0) -> "StandaloneCluster":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.executor_python = make_executor_python(self.state_dir)
        port, ui = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.master_ui = f"http://127.0.0.1:{ui}"
        try:
            self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(ui)])
            for i in range(1, self.n_workers + 1):
                name = f"worker{i}"
                work = self.state_dir / name
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                wui = free_port()
                self.worker_uis[name] = f"http://127.0.0.1:{wui}"
                self._spawn(name, ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                   "--cores", str(self.cores), "--memory", self.memory,
                                   "--work-dir", str(work), "--webui-port", str(wui), self.master_url])
            self.wait_for_workers(self.n_workers, timeout)
        except BaseException:
            self.stop()
            raise
        self._save()
        return self

    def wait_for_workers(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"cluster: {name} exited with code {proc.returncode}; see "
                                       f"{self.state_dir / (name + '.log')}")
            try:
                alive = [w for w in self.master_state()["workers"] if w["state"] == "ALIVE"]
                if len(alive) >= count:
                    return
            except (OSError, ValueError, KeyError):  # not up yet; a UI still starting can answer an empty body
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster: {count} workers not ALIVE after {timeout:.0f} s; see {self.state_dir}")
            time.sleep(0.5)

    def master_state(self) -> dict:
        with urllib.request.urlopen(self.master_ui + "/json/", timeout=5) as resp:
            return json.load(resp)

    def kill_worker(self, name: str) -> None:
        """SIGKILL the worker's whole process group: the worker JVM and the executors it launched."""
        _kill_group(self.pids[name], signal.SIGKILL)
        proc = self.procs.get(name)
        if proc is not None:
            proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _group_alive(self.pids[name]) and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every process of the cluster (workers first); never raises for a process already gone."""
        names = sorted(self.pids, key=lambda n: n == "master")
        for name in names:
            _kill_group(self.pids[name], signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name in names:
            while _group_alive(self.pids[name]) and time.monotonic() < deadline:
                time.sleep(0.2)
            _kill_group(self.pids[name], signal.SIGKILL)
            proc = self.procs.get(name)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.pids.clear()
        self.procs.clear()
        (self.state_dir / "state.json").unlink(missing_ok=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- state file, for the command line

    def _save(self) -> None:
        state = {"master_url": self.master_url, "master_ui": self.master_ui, "worker_uis": self.worker_uis,
                 "executor_python": self.executor_python, "pids": self.pids}
        (self.state_dir / "state.json").write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, state_dir: str | os.PathLike = DEFAULT_STATE_DIR) -> "StandaloneCluster":
        path = Path(state_dir) / "state.json"
        if not path.exists():
            raise SystemExit(f"cluster: no cluster is running from {state_dir} ({path} not found)")
        state = json.loads(path.read_text())
        cluster = cls(state_dir)
        cluster.master_url, cluster.master_ui = state["master_url"], state["master_ui"]
        cluster.worker_uis, cluster.executor_python = state["worker_uis"], state["executor_python"]
        cluster.pids = {k: int(v) for k, v in state["pids"].items()}
        return cluster


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` is running (zombies, left by a parent that
    exited and a PID 1 that does not reap them, do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="3g", help="memory per worker")
    args = parser.parse_args(argv)
    if args.command == "start":
        if (Path(args.state_dir) / "state.json").exists():
            print(f"cluster: one is already running from {args.state_dir}; stop it first", file=sys.stderr)
            return 1
        cluster = StandaloneCluster(args.state_dir, args.workers, args.cores, args.memory, die_with_parent=False)
        cluster.start()
        print(f"MASTER={cluster.master_url}")
        print(f"EXECUTOR_PYTHON={cluster.executor_python}")
        print(f"cluster: master UI {cluster.master_ui}, logs in {args.state_dir}", file=sys.stderr)
        return 0
    cluster = StandaloneCluster.load(args.state_dir)
    if args.command == "stop":
        cluster.stop()
        print("cluster: stopped", file=sys.stderr)
        return 0
    state = cluster.master_state()
    workers = [f"{w['host']}:{w['port']} {w['state']} cores {w['coresused']}/{w['cores']}" for w in state["workers"]]
    print(json.dumps({"master": cluster.master_url, "workers": workers,
                      "applications": [a["name"] for a in state.get("activeapps", [])]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
