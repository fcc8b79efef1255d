"""The one SparkSession builder: local mode by default, Delta Lake configured.

- Under ``spark-submit`` (a cluster, or ``--master local[*]``) the master and the
  JARs come from spark-submit: this builder never sets the master there, and the
  Delta package must be passed with ``--packages`` (see README).
- Anywhere else (``dpspark run``, tests, notebooks) it starts ``local[*]`` (or
  ``spark.master`` from the config, or ``$DPSPARK_MASTER``) and asks Spark to load
  the Delta JARs from Maven Central through Ivy, cached in ``$DPSPARK_IVY_DIR``
  (default: ``.cache/ivy`` in the project root, filled by ``scripts/setup.sh``).
  When they are not cached yet, a separate ``spark-submit`` fetches them first with its output
  captured: Ivy's resolution report is shown only when the fetch fails.

``get_session()`` is the same builder for Python users (notebooks, scripts): see its docstring.

Spark Connect. With ``$DPSPARK_REMOTE`` (or pyspark's own ``$SPARK_REMOTE``) set to an ``sc://`` URL,
``build_session`` returns a Spark Connect session to that server instead: the server is the
deployment's (never a job config's key), started with Delta Lake (its JARs and its SQL extension
and catalog; see docs/cluster.md), and checked for Delta's SQL extension. Only runtime settings go
to it (the job's ``spark.conf``, ``PLAN_CONF``): the master, the JARs and the JVM are the server's.
``is_connect`` tells the two kinds of session apart for the few places that differ.
"""

from __future__ import annotations

import contextlib

import logging
import os
import re
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

# delta-spark 4.4.0 pins pyspark <= 4.2.0; the JAR is built per Spark minor version.
DELTA_VERSION = "4.4.0"
SPARK_MINOR = "4.2"
DELTA_PACKAGE = f"io.delta:delta-spark_{SPARK_MINOR}_2.13:{DELTA_VERSION}"

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # dpspark's only MERGEs (the ledger) take a one-row local source: no need to materialize it.
    "spark.databricks.delta.merge.materializeSource": "none",
}

# Object storage (s3a://): Hadoop's S3A connector for Spark's own Hadoop (3.5.0 in pyspark 4.2) and
# the AWS SDK v2 modules it uses, without the SDK's 600 MB "bundle" (the S3 client and its transfer
# manager are all S3A needs). Fetched once into their own Ivy directory (``s3a_ivy_dir``) and given
# to a local session only when one of its paths is on S3 (``build_session(object_store=True)``).
HADOOP_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"  # hadoop-project 3.5.0's aws-java-sdk-v2.version
S3A_PACKAGES = (f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION},software.amazon.awssdk:s3:{AWS_SDK_VERSION},"
                f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}")
S3A_EXCLUDES = "software.amazon.awssdk:bundle"
OBJECT_STORE_SCHEMES = ("s3a", "s3", "s3n")

# The Delta LogStore whose commits are exclusive between drivers (dpspark/java/: a conditional PUT
# on s3a://, a hard link on a local disk), and the schemes dpspark's own sessions use it for. Delta's
# defaults lose one of two concurrent commits from different drivers on both (see the Java source);
# the ledger needs exclusion (``dpspark.privacy.ledger.commit_exclusion``).
LOG_STORE_JAR = str(Path(__file__).resolve().parent / "jars" / "dpspark-logstore.jar")
EXCLUSIVE_LOG_STORE = "io.dpspark.delta.ExclusiveCreateLogStore"
EXCLUSIVE_LOG_STORE_SCHEMES = ("s3a", "file")

# Every session, local or spark-submit (a config's spark.conf overrides it): the clip-to-unit
# expressions of ``tables.prepare_points`` (a CASE chain per feature and a validity filter over
# all of them) compile to one whole-stage method above HotSpot's 8000-byte JIT limit once d
# reaches about 10, and that method then runs interpreted: at 10^6 rows the first pass took
# 8.3 s at d = 10 and 37.5 s at d = 50, against 1.4 s and 4.5 s with this limit (Spark's own
# advice for HotSpot: larger subtrees fall back to per-operator code, which is JIT-compiled).
PLAN_CONF = {"spark.sql.codegen.hugeMethodLimit": "8000"}

# Sensible defaults for one machine; a config's spark.conf overrides them.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "8",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": os.environ.get("DPSPARK_DRIVER_MEMORY", "4g"),
    "spark.ui.showConsoleProgress": "false",
}


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def ivy_dir() -> str:
    return os.environ.get("DPSPARK_IVY_DIR") or str(project_root() / ".cache" / "ivy")


def _artifact(jar_name: str, ivy: bool = False) -> str:
    """The artifact of a JAR file name: ``hadoop-client-api`` of Spark's ``hadoop-client-api-3.5.0.jar``
    and of Ivy's ``org.apache.hadoop_hadoop-client-api-3.4.2.jar`` (``<organisation>_<artifact>-<revision>``;
    with ``ivy``, everything up to the first ``_`` is the organisation)."""
    name = jar_name[:-4] if jar_name.endswith(".jar") else jar_name
    if ivy:
        name = name.split("_", 1)[-1]
    match = re.match(r"^(.*?)-\d", name)
    return match.group(1) if match else name


def _spark_artifacts() -> set[str]:
    """The artifacts Spark itself ships (``$SPARK_HOME/jars``, pyspark's ``jars/``)."""
    try:
        from pyspark.find_spark_home import _find_spark_home

        home = Path(_find_spark_home())
    except Exception:
        return set()
    return {_artifact(p.name) for p in (home / "jars").glob("*.jar")}


def cached_delta_jars() -> list[str]:
    """The Delta JARs (and their dependencies) already fetched into the Ivy cache, if any.

    Without the artifacts Spark already ships in another version (Hadoop client, Parquet, Jackson,
    log4j, slf4j, snappy, zstd, ...: about 70 of the 86 MB Ivy fetches for delta-spark). Spark's
    class loader looks in its own JARs first, so those copies were never used; but every JAR given
    to ``spark.jars`` is copied to the executors and opened at the first task of a session."""
    jars = Path(ivy_dir()) / "jars"
    if not any(jars.glob(f"io.delta_delta-spark_{SPARK_MINOR}_2.13-{DELTA_VERSION}.jar")):
        return []
    shipped = _spark_artifacts()
    return sorted(str(p) for p in jars.glob("*.jar") if p.name.startswith("io.delta_") or _artifact(p.name, ivy=True) not in shipped)


def s3a_ivy_dir() -> str:
    return os.path.join(ivy_dir(), "s3a")


def uses_object_store(*paths) -> bool:
    """True if any of ``paths`` (None ignored) is on S3 (``s3a://``, ``s3://``, ``s3n://``)."""
    return any(isinstance(p, str) and p.split("://", 1)[0].lower() in OBJECT_STORE_SCHEMES and "://" in p
               for p in paths)


def cached_s3a_jars(fetch: bool = False) -> list[str]:
    """The S3A connector's JARs in ``s3a_ivy_dir`` (fetched first with ``fetch``, once, quietly)."""
    jars = Path(s3a_ivy_dir()) / "jars"
    if fetch and not any(jars.glob(f"org.apache.hadoop_hadoop-aws-{HADOOP_VERSION}.jar")):
        fetch_packages(S3A_PACKAGES, s3a_ivy_dir(), excludes=S3A_EXCLUDES)
    if not any(jars.glob(f"org.apache.hadoop_hadoop-aws-{HADOOP_VERSION}.jar")):
        return []
    return sorted(str(p) for p in jars.glob("*.jar"))


def log_store_conf(conf: dict) -> dict:
    """``spark.delta.logStore.<scheme>.impl`` = ``EXCLUSIVE_LOG_STORE`` for s3a and file, unless ``conf``
    or the deployment's spark-defaults.conf chooses a store itself (a scheme's own key, or
    ``spark.delta.logStore.class``): then theirs (the ledger still checks what it gets)."""
    chosen = set(conf) | _defaults_keys()
    if "spark.delta.logStore.class" in chosen:
        return {}
    return {f"spark.delta.logStore.{scheme}.impl": EXCLUSIVE_LOG_STORE for scheme in EXCLUSIVE_LOG_STORE_SCHEMES
            if f"spark.delta.logStore.{scheme}.impl" not in chosen}


# A small job's JVM spends most of its life warming up: loading classes and compiling the code paths
# of a few Delta reads, writes and one UPDATE, each run once or twice. On a machine with few cores,
# C2 (the optimizing JIT) then competes with the job itself for the cores; stopping at C1 made the
# demo's whole process about a third faster on 2 cores (scripts/bench_demo.py). C1 code is slower
# in long hot loops, so this is only for jobs that have none: the `dpspark ledger` commands and
# runs whose input is a small local table (``small_input``), never under spark-submit, and never
# over a user's own ``spark.driver.extraJavaOptions``. Such a job starts no web UI either (a
# config's ``spark.conf`` can switch it on). $DPSPARK_SMALL_JOB=0 switches all this off, 1 on.
SMALL_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
SMALL_INPUT_BYTES = 32 * 1024 * 1024


def small_input(path: str | None, limit: int = SMALL_INPUT_BYTES, max_entries: int = 2000) -> bool:
    """True if ``path`` is a LOCAL table directory (or file) of at most ``limit`` bytes, counted with a
    bounded walk (any error, a remote URI, more than ``max_entries`` entries: False). A Delta table's
    removed files still count (an overestimate: then the default JIT). Only chooses JVM options (the
    speed of the process); nothing of it reaches an output."""
    from dpspark.localdelta import local_path

    local = local_path(path) if path else None
    if local is None:
        return False
    total, seen, stack = 0, 0, [local]
    try:
        while stack:
            top = stack.pop()
            if os.path.isfile(top):
                total += os.path.getsize(top)
                seen += 1
            else:
                with os.scandir(top) as entries:
                    for entry in entries:
                        seen += 1
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
            if total > limit or seen > max_entries:
                return False
    except OSError:
        return False
    return True


def _small_job_options(small_job: bool, conf: dict) -> str | None:
    forced = os.environ.get("DPSPARK_SMALL_JOB")
    if forced is not None:
        small_job = forced.strip() not in ("", "0", "false", "no")
    if not small_job or "spark.driver.extraJavaOptions" in conf or _defaults_set_java_options():
        return None
    return SMALL_JOB_JAVA_OPTIONS


# Spark's own log in a local session: warnings and errors, without its start-up chatter (see the file).
SPARK_LOG_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark-log4j2.properties")


def _driver_java_options(small_job: bool, conf: dict) -> str | None:
    """The JVM options of a new local driver: dpspark's log4j2 configuration, and the small-job JIT
    option; none when the config or spark-defaults.conf sets the driver's options (theirs win)."""
    if "spark.driver.extraJavaOptions" in conf or _defaults_set_java_options():
        return None
    options = [f"-Dlog4j2.configurationFile={SPARK_LOG_CONFIG}"] if os.path.isfile(SPARK_LOG_CONFIG) else []
    small = _small_job_options(small_job, conf)
    if small:
        options.append(small)
    return " ".join(options) or None


def _defaults_keys() -> set[str]:
    """The keys spark-defaults.conf ($SPARK_CONF_DIR, or $SPARK_HOME/conf) sets (none if it is absent)."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        try:
            from pyspark.find_spark_home import _find_spark_home

            conf_dir = os.path.join(_find_spark_home(), "conf")
        except Exception:
            return set()
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as handle:
            # Java properties syntax, as Spark reads it: "key value", "key=value" or "key:value"
            return {re.split(r"[\s=:]", line.strip(), maxsplit=1)[0] for line in handle
                    if line.strip() and not line.lstrip().startswith(("#", "!"))}
    except OSError:
        return set()


def _defaults_set_java_options() -> bool:
    """Does spark-defaults.conf set the driver's JVM options?"""
    return "spark.driver.extraJavaOptions" in _defaults_keys()


def is_connect(spark) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``): no py4j gateway, no SparkContext,
    no JVM objects on the client; everything goes through DataFrames, SQL and the server's Delta."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


REMOTE_ENV = ("DPSPARK_REMOTE", "SPARK_REMOTE")


def remote_url() -> str | None:
    """The Spark Connect server of this deployment: ``$DPSPARK_REMOTE``, else pyspark's ``$SPARK_REMOTE``,
    else None (a classic session). An environment setting, never a job config's key: which server
    runs the job (and so which ledger and tables it can reach) is the operator's choice."""
    for name in REMOTE_ENV:
        value = (os.environ.get(name) or "").strip()
        if value:
            return value
    return None


DELTA_EXTENSION = DELTA_CONF["spark.sql.extensions"]


def check_connect_server(spark) -> None:
    """A Spark Connect server must have been started with Delta Lake: its SQL extension (the
    ``delta.`path``` tables, DESCRIBE DETAIL/HISTORY, MERGE, UPDATE and DELETE of the ledger and the
    outputs) is a static setting a client cannot add. ``DPSparkError`` naming what is missing."""
    from dpspark.errors import DPSparkError

    extensions = str(spark.conf.get("spark.sql.extensions", "") or "")
    if DELTA_EXTENSION not in [e.strip() for e in extensions.split(",")]:
        raise DPSparkError(
            f"the Spark Connect server at {remote_url() or 'the given URL'} runs without Delta Lake's SQL extension "
            f"(its spark.sql.extensions is {extensions or 'unset'!r}); dpspark needs it: start the server with "
            f"--packages {DELTA_PACKAGE} (or its JARs) and --conf spark.sql.extensions={DELTA_EXTENSION} "
            f"--conf spark.sql.catalog.spark_catalog={DELTA_CONF['spark.sql.catalog.spark_catalog']}")


# What dpspark's passes import in a Spark Python worker (docs/cluster.md, "What the executors need").
WORKER_MODULES = ("numpy", "pandas", "pyarrow", "dpspark", "dpspark.maxcover.kernels", "dpspark.steps.lloyd_kernels",
                  "dpspark.ldp.client", "dpspark.estimated_domain")  # the last: the bounds estimate's pass
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]*)"(?:[^:\n]*: error=\d+, ([^\n)]*))?')
_NO_MODULE = re.compile(r"No module named '([^']+)'")
_VERSION_MISMATCH = re.compile(r"(Python in worker has different version[^\n]*)")
WORKERS_CHECKED = "_dpspark_python_workers_checked"


def check_python_workers(spark, tasks: int = 1) -> bool:
    """Before any charge: Spark's Python workers start and import ``WORKER_MODULES``.

    One job of ``tasks`` rows and tasks over ``spark.range`` (public rows only: no data value can
    reach its answer or its error), whose plain Python UDF imports each module in the worker and
    returns what failed with the worker's ``sys.executable``. Any failure raises
    ``dpspark.errors.PythonWorkersError`` (exit 1) naming ``PYSPARK_PYTHON`` and the workers' Python,
    the missing module, and on Spark Connect that the SERVER's environment is the one to fix: a run
    whose workers cannot start fails here, not after its charge (issue 50). ``tasks`` > 1 starts that
    many workers at once (the runner's local warm-up, ``spark.python.worker.reuse``: they stay for
    the fit). A Python that cannot be run fails the job at its first task (Spark's local mode tries a
    task once; a cluster retries it ``spark.task.maxFailures`` times, each failing at once).

    Passed once per session and worker Python (classic: ``SparkContext.pythonExec``): later calls
    return at once. Returns whether this call ran the job."""
    from pyspark.sql import functions as F

    from dpspark.errors import PythonWorkersError

    connect = is_connect(spark)
    holder = spark if connect else spark.sparkContext
    executable = None if connect else getattr(holder, "pythonExec", None)
    key = "connect" if connect else str(executable)
    if getattr(holder, WORKERS_CHECKED, None) == key:
        return False
    modules = WORKER_MODULES

    def probe(_):  # nested: pickled by value, so it runs even where dpspark cannot be imported
        import importlib
        import json
        import sys as _sys

        missing = []
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # an ImportError, or a module that fails while importing
                lacking = getattr(exc, "name", None) or name
                if lacking not in missing:
                    missing.append(lacking if isinstance(exc, ImportError) else f"{name} ({type(exc).__name__})")
        return json.dumps({"missing": missing, "python": _sys.executable})

    tasks = max(1, int(tasks))
    try:
        # useArrow=False: a pickled-rows UDF runs even without pyarrow, so the answer lists every missing module
        probe_udf = F.udf(probe, "string", useArrow=False)
        answers = [row[0] for row in spark.range(0, tasks, 1, tasks).select(probe_udf("id")).collect()]
    except Exception as exc:
        text = str(exc)
        cannot_run, no_module, mismatch = _CANNOT_RUN.search(text), _NO_MODULE.search(text), _VERSION_MISMATCH.search(text)
        if cannot_run:
            executable = cannot_run.group(1)
            problem = f"cannot be run ({(cannot_run.group(2) or 'the operating system refused to start it').strip()})"
        elif no_module:
            problem = f"cannot import {no_module.group(1)!r}"
        elif mismatch:
            problem = f"is not the driver's Python version ({mismatch.group(1).strip()[:300]})"
        else:
            problem = f"failed a test job over spark.range ({_error_line(exc)})"
        raise PythonWorkersError(_workers_message(connect, executable, problem), executable,
                                 no_module.group(1) if no_module else None) from None
    import json

    for answer in answers:
        found = json.loads(answer)
        if found["missing"]:
            names = found["missing"]
            raise PythonWorkersError(_workers_message(connect, found["python"], f"cannot import {', '.join(names)}"),
                                     found["python"], names[0].split(" ")[0])
    setattr(holder, WORKERS_CHECKED, key)
    return True


_ERROR_LINE = re.compile(r"^\(?[A-Za-z_$][\w.$]*(?:Exception|Error)\)?[: ]")


def _error_line(exc: BaseException) -> str:
    """The first line of ``exc``'s text that names an exception (Py4J's first line names only the call)."""
    text = str(exc)
    for line in text.splitlines():
        line = line.strip().lstrip(":").strip()
        if _ERROR_LINE.match(line) and "An error occurred while calling" not in line:
            return line[:300]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


def _workers_message(connect: bool, executable: str | None, problem: str) -> str:
    """What ``check_python_workers`` tells the analyst (and the administrator): the workers' Python,
    what is wrong with it, that nothing was charged, and what to fix where."""
    needs = "numpy, pandas, pyarrow and dpspark"
    if connect:
        python = executable or "the server's PYSPARK_PYTHON"
        return (f"the Spark Connect server's Python workers cannot run dpspark: their Python "
                f"({python}) {problem}. Nothing was charged. The SERVER's "
                f"environment is the one to fix, not this client's: restart the server with PYSPARK_PYTHON set to "
                f"the ABSOLUTE path of a Python with {needs} (a relative path is resolved in each worker's own "
                f"working directory, a temporary directory of the server), as docs/cluster.md starts it; the "
                f"details are in the server's log")
    configured = os.environ.get("PYSPARK_PYTHON")
    return (f"Spark's Python workers cannot run dpspark: the executors' Python {executable or 'unknown'} "
            f"(PYSPARK_PYTHON={configured if configured is not None else 'unset'}) {problem}. Nothing was charged. "
            f"dpspark's executors need a Python with {needs}: set PYSPARK_PYTHON (or spark.pyspark.python) to the "
            f"absolute path of one before the session starts (in local mode dpspark.session.get_session() runs "
            f"the workers on this interpreter, {sys.executable}, when PYSPARK_PYTHON is unset); on a cluster, "
            f"install them on the executors or ship dpspark (--py-files)")


def _build_remote_session(url: str, app_name: str, conf: dict):
    """A Spark Connect session to ``url`` (see the module docstring). Only runtime settings are sent:
    ``PLAN_CONF`` and the job's ``spark.conf``; a key the server does not let a client change (a
    static or JVM setting) is left out with a warning naming it."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from dpspark.errors import DPSparkError

    if not url.startswith("sc://"):
        raise DPSparkError(f"${'/$'.join(REMOTE_ENV)}={url!r}: dpspark connects to a running Spark Connect server, "
                           f"given as sc://host:port (the deployment's server, started with Delta Lake)")
    # As pyspark's own builder does for a Connect process: pyspark.ml and pyspark.sql functions
    # then dispatch to their Connect implementations.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    spark = ConnectSession.builder.remote(url).appName(app_name).getOrCreate()
    check_connect_server(spark)
    log = logging.getLogger("dpspark")
    for key, value in {**PLAN_CONF, **dict(conf)}.items():
        try:
            modifiable = spark.conf.isModifiable(key)
        except Exception:
            modifiable = False
        if modifiable:
            spark.conf.set(key, str(value))
        elif key not in PLAN_CONF:
            log.warning("spark.conf.%s is not set: a Spark Connect server's static and JVM settings are its own", key)
    return spark


def launched_by_spark_submit() -> bool:
    """True inside a Python driver started by spark-submit (or the pyspark shell)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, app_name: str = "dpspark", conf: dict | tuple = (), testing: bool = False,
                  small_job: bool = False, object_store: bool = False):
    """Get or create the SparkSession, with Delta Lake configured. ``small_job``: a new local JVM starts
    with ``SMALL_JOB_JAVA_OPTIONS`` (see there). ``object_store``: a new local JVM also gets the S3A
    connector (``S3A_PACKAGES``, fetched once). Every new local JVM commits to s3a:// and local Delta
    tables with ``EXCLUSIVE_LOG_STORE`` unless ``conf`` chooses another. With ``$DPSPARK_REMOTE`` or
    ``$SPARK_REMOTE``: a Spark Connect session to that server (``master``, ``testing``, ``small_job``
    and ``object_store`` do not apply: the server has its own JARs and settings)."""
    from pyspark.sql import SparkSession

    url = remote_url()
    if url is not None:
        if master:
            logging.getLogger("dpspark").warning("spark.master=%s is not used: this job runs on the Spark Connect "
                                                 "server %s", master, url)
        return _build_remote_session(url, app_name, dict(conf))
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**DELTA_CONF, **PLAN_CONF}.items():
        builder = builder.config(key, value)
    if not launched_by_spark_submit():
        # Local Python workers run the driver's interpreter (the project's .venv).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(master or os.environ.get("DPSPARK_MASTER") or "local[*]")
        jars = cached_delta_jars()
        if not jars:  # first start on this machine: fetch them once, quietly
            fetch_packages(DELTA_PACKAGE, ivy_dir())
            jars = cached_delta_jars()
        if object_store:
            jars = jars + cached_s3a_jars(fetch=True)
        if os.path.isfile(LOG_STORE_JAR):
            jars = jars + [LOG_STORE_JAR]
            for key, value in log_store_conf(dict(conf)).items():
                builder = builder.config(key, value)
        if any("delta-spark" in j for j in jars):  # fetched before (scripts/setup.sh): no resolution at start-up
            builder = builder.config("spark.jars", ",".join(jars))
        else:
            builder = builder.config("spark.jars.packages", DELTA_PACKAGE).config("spark.jars.ivy", ivy_dir())
            if jars:
                builder = builder.config("spark.jars", ",".join(jars))
        for key, value in LOCAL_DEFAULTS.items():
            builder = builder.config(key, value)
        if testing:
            builder = builder.config("spark.ui.enabled", "false")
        java_options = _driver_java_options(small_job, dict(conf))
        if java_options:
            builder = builder.config("spark.driver.extraJavaOptions", java_options)
        if _small_job_options(small_job, dict(conf)):
            builder = builder.config("spark.ui.enabled", "false")  # no web UI to start for a job of seconds
    for key, value in dict(conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DPSPARK_SPARK_LOG_LEVEL", "WARN"))
    return spark


def fetch_packages(packages: str, ivy: str, timeout: float = 1800.0, excludes: str | None = None) -> None:
    """Resolve Maven ``packages`` into the Ivy directory ``ivy`` with Spark's own launcher, quietly.

    ``spark.jars.packages`` makes the launcher print Ivy's resolution report (a screenful of
    "found ... in central" lines) on every first start; there is no Spark setting to silence it. So
    the resolution runs here in a ``spark-submit`` of an empty Python file whose output is captured,
    and is shown only when the resolution fails (``DPSparkError`` with the launcher's output). The
    session then loads the fetched JARs with ``spark.jars``.
    """
    from pyspark.find_spark_home import _find_spark_home

    from dpspark.errors import DPSparkError

    spark_home = _find_spark_home()
    submit = os.path.join(spark_home, "bin", "spark-submit")
    log = logging.getLogger("dpspark")
    log.info("fetching %s into %s (once; Ivy's report is shown only if it fails)", packages, ivy)
    env = dict(os.environ, SPARK_HOME=spark_home, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    env.pop("PYSPARK_GATEWAY_PORT", None)
    with tempfile.TemporaryDirectory(prefix="dpspark-fetch-") as tmp:
        noop = os.path.join(tmp, "noop.py")
        with open(noop, "w", encoding="utf-8") as handle:
            handle.write("# dpspark: only the launcher's package resolution is wanted\n")
        command = [submit, "--master", "local[1]", "--packages", packages, "--conf", f"spark.jars.ivy={ivy}",
                   "--conf", "spark.ui.enabled=false", noop]
        if excludes:
            command[-1:-1] = ["--exclude-packages", excludes]
        try:
            done = subprocess.run(command, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=timeout)
            output, code = done.stdout.decode("utf-8", "replace"), done.returncode
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode("utf-8", "replace")
            code = f"timeout after {timeout:g}s"
        except OSError as exc:
            output, code = str(exc), "not started"
    if code != 0:
        raise DPSparkError(f"could not fetch {packages} into {ivy} (spark-submit exit {code}); its output:\n{output}")


def get_session(app_name: str = "dpspark", master: str | None = None, conf: dict | None = None,
                log_level: int = logging.INFO, object_store: bool = False):
    """A SparkSession ready for dpspark, from Python (a notebook, a script): the builder ``dpspark run`` uses.

        from dpspark.session import get_session
        spark = get_session()                       # local[*], Delta Lake configured

    - Delta Lake configured; its JARs fetched once into ``$DPSPARK_IVY_DIR`` (Ivy's report shown
      only if the fetch fails);
    - outside ``spark-submit``: ``master`` (default ``$DPSPARK_MASTER`` or ``local[*]``), the
      executors' Python is this interpreter unless ``PYSPARK_PYTHON`` is set, and sensible settings
      for one machine (8 shuffle partitions instead of 200, ...); ``conf`` overrides them;
    - dpspark's log lines (one per step and per Spark pass) go to stderr at ``log_level``
      (``dpspark.progress.configure_logging``).

    A session that is already running (the ``pyspark`` shell, ``spark-submit``, an earlier call) is
    returned as it is, with only ``conf`` applied to it: dpspark's defaults never override a
    session's own settings. The estimators do not depend on its shuffle partitions anyway
    (``DPClustering.fit`` runs with its own and puts the session's back).
    """
    from pyspark.sql import SparkSession

    from dpspark.progress import configure_logging

    configure_logging(log_level)
    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in dict(conf or {}).items():
            active.conf.set(key, value)
        return active
    return build_session(master=master, app_name=app_name, conf=dict(conf or {}), object_store=object_store)


def reset_py4j_connection(spark=None) -> None:
    """Close this thread's py4j connection after a signal (``spark``: its session; None: the
    running gateway, as the signal handler has no session at hand).

    ``RunKilled`` raised inside a py4j call (the main thread waits there most of the time) leaves
    that call's answer unread on the connection, and in pinned-thread mode every later call of
    the thread would read the answer of the one before: a ``finally`` that unpersists during the
    unwinding, or the runner recording the killed attempt (seen as ``KeyError: 'm'`` or "... does
    not exist in the JVM"). The next call opens a fresh connection; with no call under way the
    reset costs only that. A Spark Connect session has no py4j connection: nothing to do (its gRPC
    calls are separate requests; an interrupted one leaves nothing unread)."""
    if spark is not None and is_connect(spark):
        return
    try:
        if spark is not None:
            gateway = spark.sparkContext._gateway
        else:
            from pyspark import SparkContext

            gateway = SparkContext._gateway
        client = None if gateway is None else gateway._gateway_client
        connection = client.get_thread_connection() if hasattr(client, "get_thread_connection") else None
        if connection is not None:
            connection.close()
    except Exception:
        logging.getLogger("dpspark").error("could not reset the py4j connection of a killed run:\n%s",
                                           traceback.format_exc())


ACCOUNTED_SPARK_LOG_ENV = "DPSPARK_ACCOUNTED_SPARK_LOG"


@contextlib.contextmanager
def quiet_spark_logs(spark, on: bool = True):
    """Spark's own log lines OFF in the driver's JVM while ``on`` (an accounted run or fit), then back.

    Spark logs a failed task's exception on the driver (``WARN TaskSetManager: Lost task ...``,
    ``ERROR Executor``), and such a message can quote a record's value; in local mode the executors
    share the driver's JVM and stderr. dpspark's own expressions cannot raise on a value (see
    docs/privacy.md, "Threat model"), so this is defence in depth: in an accounted run the analyst's
    stderr carries no Spark log line; the error's details go to the operator log through the runner.
    Restored on exit. A no-op on a Spark Connect session: the server's log (its driver and
    executors) is the deployment's, not the analyst's, and the client receives only a failed
    request's error, which the runner and ``DPClustering.fit`` reduce to its type once the fit has
    started (``dpspark.errors.for_the_analyst``), as on a classic session.
    A deployment whose driver log the analyst cannot read may keep Spark's lines with
    ``$DPSPARK_ACCOUNTED_SPARK_LOG`` (a log4j level, e.g. WARN, or KEEP for the session's level).

    Yields a state whose ``restore`` the caller may set False: a killed attempt's process is ending
    while its cancelled tasks still fail one by one (``ERROR TaskContextImpl ...`` after the status
    line), so the level stays OFF to the exit.
    """
    state = types.SimpleNamespace(restore=True)
    manager = None
    level = os.environ.get(ACCOUNTED_SPARK_LOG_ENV, "OFF")  # the deployment's, never a config's
    if on and level.upper() != "KEEP" and not is_connect(spark):
        try:
            manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
            before = str(manager.getRootLogger().getLevel().toString())
            spark.sparkContext.setLogLevel(level)
        except Exception:
            manager = None
    try:
        yield state
    finally:
        if manager is not None and state.restore:
            try:
                spark.sparkContext.setLogLevel(before)
            except Exception:
                pass

