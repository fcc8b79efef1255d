"""dpspark as a pyspark.ml stage: ``DPClustering`` (an Estimator) and ``DPClusteringModel`` (a Model).

    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    from dpspark.ml import DPClustering

    est = DPClustering(k=5, epsilon=1.0, delta=1e-6, lower=[0, 0], upper=[100, 100],
                       ledgerPath="/data/ledger", ledgerInput="/data/points")
    model = Pipeline(stages=[VectorAssembler(inputCols=["x", "y"], outputCol="features"), est]).fit(df)
    model.stages[-1].clusterCenters(), model.stages[-1].summary.epsilonSpent
    model.write().overwrite().save("/models/clusters")      # PipelineModel.load(...) reads it back

One declaration per setting. The Params are generated from ``PARAMS`` below (name, config key, type
converter, doc); their values are turned into the same raw config dict a YAML job file gives, and
``dpspark.config.validate`` checks it and fills in every default. So a Param has exactly the default
and the checks of its config key, and a fit runs the family code ``dpspark run`` runs
(``estimator_class(name).from_config(config, randomness)``). A Param left unset is left out of the
config (the config's default applies); ``getX()`` of such a Param returns None.

Privacy. ``fit`` spends ``epsilon`` (and ``delta``) of the data's budget. With ``ledgerPath`` the
charge is recorded in the privacy ledger BEFORE the data is read, against the table ``ledgerInput``
(a DataFrame has no path of its own; the fit refuses a DataFrame that reads files outside that
table), and refused (``BudgetRefused``) like ``dpspark run`` when the budget would be overspent.
Without ``ledgerPath`` nothing records the spend: keep your own account. The fitted model holds only
released values (noisy centers, noisy weights) and public parameters; ``save`` writes only those
(one JSON metadata file, no data, no timings or pass counts). With a ledger the fit is ACCOUNTED
(dpspark.progress): the dpspark log shows no data-dependent value. Timings, pass counts and the like
go to the operator log only (``$DPSPARK_OPERATOR_LOG``: ``{dir}/{runId}/attempt-1.json``, see
dpspark.runner). An error that is not dpspark's own, raised once the fit has started, reaches the
caller as ``dpspark.errors.RunFailed`` naming its type only (it may quote a record), chaining
nothing. ``transform`` labels rows with their nearest released center: the labels are computed from
the rows and are NOT differentially private.

Spark Connect. ``fit`` runs on a Spark Connect session too (``SparkSession.builder.remote(...)``, a
server started with Delta Lake). With a ledger, the DataFrame's lineage is checked on its
unresolved Connect plan instead of the analysed JVM plan (``dpspark.connect_plan``), which only
proves the simplest shape: a Delta read of ledgerInput itself, plain column selections, and
optionally VectorAssembler(handleInvalid='skip'); anything else is refused (pass the feature
columns as inputCols). ``write().overwrite()`` replaces the model's one metadata file (a Connect
client cannot delete folders; nothing else under the path is read back).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from typing import Any

import numpy as np
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import (DefaultParamsReadable, DefaultParamsReader, DefaultParamsWritable, DefaultParamsWriter,
                             MLReadable, MLReader, MLWritable, MLWriter)

from dpspark import __version__, config as config_mod
from dpspark.errors import ConfigError, DPSparkError
from dpspark.progress import log, step
from dpspark.session import PLAN_CONF, is_connect

__all__ = ["DPClustering", "DPClusteringModel", "DPClusteringSummary", "ParamError", "PARAMS"]

# The family used when ``algorithm`` is not set: the config's own default.
DEFAULT_ALGORITHM = config_mod.DEFAULT_ALGORITHM

# Placeholders for the two config keys a DataFrame fit has no use for.
_NO_INPUT_PATH = "<DataFrame given to DPClustering.fit>"
_NO_OUTPUT_PATH = "<dpspark.ml: no output path>"

_T = TypeConverters

# ---------------------------------------------------------------------------------------------
# The one table of Params: (name, config key, type converter, doc). Family options are named
# after their config key in camelCase (algorithm.candidate_count -> candidateCount); their
# defaults and checks are the family's (dpspark/<family>/params.py), applied by config.validate.

_COMMON = (
    ("k", "algorithm.k", _T.toInt, "number of clusters: how many centers are released (>= 1). Required."),
    ("epsilon", "privacy.epsilon", _T.toFloat,
     "privacy budget epsilon one fit spends (> 0, finite). ldp: each user's LOCAL epsilon."),
    ("delta", "privacy.delta", _T.toFloat,
     "privacy budget delta one fit may spend, in [0, 1): maxcover needs delta > 0 (e.g. 1e-6), dplloyd "
     "spends none (0), ldp ignores it."),
    ("algorithm", "algorithm.name", _T.toString,
     "algorithm family: " + " | ".join(sorted(config_mod.FAMILIES)) + "."),
    ("objective", "algorithm.objective", _T.toString,
     "clustering objective: " + " | ".join(config_mod.OBJECTIVES) + " (dplloyd: kmeans only)."),
    ("lower", "domain.lower", _T.toListFloat,
     "PUBLIC lower bounds of the data's box domain, one per dimension (never taken from the data; "
     "values outside are clipped). Give lower and upper, or radius, or estimateDomain."),
    ("upper", "domain.upper", _T.toListFloat, "PUBLIC upper bounds of the box domain, one per dimension."),
    ("radius", "domain.radius", _T.toFloat,
     "PUBLIC radius of an L2-ball domain around the origin (instead of lower/upper)."),
    ("dim", "domain.dim", _T.toInt,
     "number of dimensions; needed only with radius, or estimateDomain without lower/upper, and one "
     "vector/array features column."),
    ("estimateDomain", "domain.estimate", _T.toString,
     "'private': the fit releases its own box (per-feature bounds from noisy histograms, charged inside "
     "epsilon and delta) instead of needing lower/upper; lower/upper, if set, are then only a loose public "
     "outer box to search. Unset: lower/upper or radius are required."),
    ("domainEpsilonShare", "domain.epsilon_share", _T.toFloat,
     "with estimateDomain: the share of epsilon the estimate of the box spends (0 < share <= 0.5; default 0.1)."),
    ("featuresCol", "input.features", _T.toString,
     "features column: a vector (e.g. VectorAssembler's output) or an array of numbers, or one numeric "
     "column when the domain has one dimension. A row whose vector is null, or has a null, NaN or infinite "
     "value, is dropped; but VectorAssembler's default handleInvalid='error' fails the fit on a null or NaN "
     "input column before dpspark sees the row: use inputCols, or VectorAssembler(handleInvalid='skip')."),
    ("inputCols", "input.features", _T.toListString,
     "several numeric feature columns, one per dimension (instead of featuresCol)."),
    ("predictionCol", None, _T.toString, "prediction column transform() adds: the index of the nearest center."),
    ("privacyUnitCol", "input.privacy_unit", _T.toString,
     "column naming the person a row belongs to: at most one row per person is kept, so the guarantee "
     "protects people, not rows. Unset: each row is one person."),
    ("ledgerPath", "privacy.ledger", _T.toString,
     "privacy ledger (a Delta table location) that each fit is charged to before it reads the data; "
     "a fit over the budget its administrator set is refused (BudgetRefused). Needs ledgerInput."),
    ("ledgerInput", "input.path", _T.toString,
     "path of the table the fitted DataFrame reads: its budget in the ledger is the one charged "
     "(a DataFrame has no path of its own). Required with ledgerPath."),
    ("runId", None, _T.toString,
     "run id of the fit, as the ledger's events and the operator record name it (letters, digits, '.', "
     "'_', '-'). Unset: a new id per fit. With a ledger, a runId that already succeeded on ledgerInput "
     "is refused before any charge (a run id names one release), and a retry of a failed one is its "
     "next attempt."),
    ("seed", "seed", _T.toInt,
     "fixed seed of every random draw, noise included: a TESTING AID that makes the fit NOT PRIVATE; "
     "needs unsafeFixedSeed=True."),
    ("unsafeFixedSeed", "unsafe_fixed_seed", _T.toBoolean,
     "must be True for seed to be accepted: the fit is then reproducible and NOT PRIVATE."),
)

# (config key under algorithm., type converter, doc). The family that reads a key is looked up
# from the families' own key lists (``KEYS`` in dpspark/<family>/params.py).
_FAMILY_OPTIONS = (
    # maxcover
    ("candidates", _T.toString, "where the candidate centers come from: private (DP grid cells) | tree (DP "
                                "LSH-tree leaves, no delta) | grid_or_private (a noisy row count chooses; the "
                                "default in d <= 3) (all charged) | grid | random | table (public)."),
    ("candidate_table", _T.toString, "path of a PUBLIC Delta table of candidate points (candidates=table); "
                                     "its columns are named like the features. With a ledger, its administrator must "
                                     "have declared it public (`dpspark ledger set-public`)."),
    ("candidate_count", _T.toInt, "grid/random: about this many candidates; private/tree: at most this many."),
    ("candidate_scales", _T.toInt, "private candidates: number of grid scales."),
    ("coverage_approx", _T.toFloat, "a in the coverage thresholds t_i = (1+a)^(i-1) Delta^p / N, in (0, 1)."),
    ("eps_split", _T.toListFloat, "fractions of epsilon [candidates, coverage, counts] ([coverage, counts] "
                                  "for public candidates), summing to 1."),
    ("eps_candidates", _T.toFloat, "fraction of epsilon for the private candidate generator (or use epsSplit)."),
    ("eps_coverage", _T.toFloat, "fraction of epsilon for the coverage loop."),
    ("eps_counts", _T.toFloat, "fraction of epsilon for the noisy cluster counts."),
    ("delta_candidates", _T.toFloat, "private candidates: fraction of delta for the candidate generator."),
    ("n_upper", _T.toInt, "PUBLIC upper bound on the number of points, for the first threshold "
                          "(never the data's n). Unset: the number of candidates."),
    ("solver", _T.toString, "post-processing solver: kmeans weighted_kmeans; kmedian local_search | weiszfeld."),
    ("max_signatures", _T.toInt, "driver bound on one threshold's signature histogram; at most the deployment's "
                                 "ceiling $DPSPARK_MAX_SIGNATURES (unset: that ceiling, default 2000000)."),
    ("max_pairs", _T.toInt, "driver bound on the (signature, candidate) pairs of one threshold's histogram; at most "
                            "the deployment's ceiling $DPSPARK_MAX_PAIRS (unset: that ceiling, default 32000000)."),
    ("lloyd_share", _T.toFloat, "k-means: fraction of epsilon for one DP Lloyd step after the solve "
                                "(default 0.5 with tree candidates, else 0)."),
    # dplloyd
    ("variant", _T.toString, "average_k | allocation_k | average_nk | allocation_nk."),
    ("iterations", _T.toInt, "number of noisy Lloyd iterations."),
    ("merge_factor", _T.toInt, "*_nk variants: run merge_factor * k clusters, then merge into k."),
    ("schedule", _T.toString, "budget schedule over the iterations: average | allocation (set by variant)."),
    ("noise", _T.toString, "noise rule: su | paper."),
    ("merge", _T.toString, "*_nk variants: how clusters are merged: weighted_kmeans | nearest_pair."),
    ("min_count", _T.toFloat, "a cluster with a noisy count below this is re-seeded."),
    # ldp
    ("mode", _T.toString, "simulate (run the client randomizer over the DataFrame) | ingest (read reports "
                          "real clients wrote)."),
    ("protocol_path", _T.toString, "ingest: folder of the PUBLIC round-parameter tables."),
    ("reports_path", _T.toString, "ingest: folder of the clients' report tables (one per round)."),
    ("radii", _T.toInt, "number of LSH cell widths."),
    ("hashes", _T.toInt, "hash functions per radius."),
    ("buckets", _T.toInt, "hash values per hash function."),
    ("projection_dim", _T.toInt, "dimension of the random projection before the grid."),
    ("fractions", _T.toListFloat, "shares of users answering rounds 1, 2, 3 (sum to 1)."),
    ("heavy_z", _T.toFloat, "heavy bucket threshold, in standard deviations."),
    ("prune_z", _T.toFloat, "round 2 -> 3 pruning threshold, in standard deviations."),
    ("candidates_per_hash", _T.toInt, "at most this many heavy buckets per hash function."),
)


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _families_of(key: str) -> list[str]:
    import importlib

    return [name for name, module in sorted(config_mod.FAMILIES.items())
            if key in getattr(importlib.import_module(module), "KEYS", ())]


def _build_table() -> tuple:
    rows = list(_COMMON)
    for key, conv, doc in _FAMILY_OPTIONS:
        families = _families_of(key)
        tag = "/".join(families) if families else "family option"
        rows.append((_camel(key), f"algorithm.{key}", conv,
                     f"[{tag}] {doc} Unset: the family's default."))
    return tuple(rows)


# (name, config key or None, type converter, doc), one row per Param.
PARAMS: tuple = _build_table()
_KEY_OF = {name: key for name, key, _, _ in PARAMS}


def _config_defaults() -> dict:
    """Defaults of the common Params, read from the config's own validation (never restated here)."""
    probe = config_mod.validate({
        "input": {"path": _NO_INPUT_PATH, "features": ["x"]},
        "domain": {"lower": [0.0], "upper": [1.0]},
        # dplloyd accepts the config's default delta (0), so every default below is the config's
        "algorithm": {"name": "dplloyd", "k": 1},
        "output": {"path": _NO_OUTPUT_PATH},
    })
    return {
        "epsilon": probe.privacy.epsilon, "delta": probe.privacy.delta,
        "objective": probe.algorithm.objective, "unsafeFixedSeed": probe.unsafe_fixed_seed,
        "algorithm": DEFAULT_ALGORITHM, "featuresCol": "features", "predictionCol": "prediction",
    }


_DEFAULTS = _config_defaults()


class ParamError(ConfigError, ValueError):
    """A Param value the config's validation refuses (or a missing required Param). Names the Param."""

    def __init__(self, param: str, message: str):
        self.param = param
        self.key = param
        DPSparkError.__init__(self, f"DPClustering Param '{param}': {message}")


class _DPClusteringParams(Params):
    """Params of ``DPClustering`` and ``DPClusteringModel`` (generated from ``PARAMS``)."""

    def __init__(self):
        super().__init__()
        self._setDefault(**_DEFAULTS)

    def _features(self) -> tuple[str, ...]:
        if self.isDefined(self.inputCols) and self.getOrDefault(self.inputCols):
            return tuple(self.getOrDefault(self.inputCols))
        return (self.getOrDefault(self.featuresCol),)


def _install_params(cls) -> None:
    """Declare every Param of ``PARAMS`` on ``cls`` once, with a getter and a setter each."""
    for name, key, conv, doc in PARAMS:
        setattr(cls, name, Param(Params._dummy(), name, doc, typeConverter=conv))
        cap = name[:1].upper() + name[1:]

        def getter(self, _name=name):
            param = self.getParam(_name)
            return self.getOrDefault(param) if self.isDefined(param) else None

        def setter(self, value, _name=name):
            return self._set(**{_name: value})

        getter.__name__, setter.__name__ = f"get{cap}", f"set{cap}"
        getter.__doc__ = f"Gets the value of `{name}` or its default value (None when neither is set)."
        setter.__doc__ = f"Sets the value of :py:attr:`{name}`: {doc}"
        setattr(cls, f"get{cap}", getter)
        setattr(cls, f"set{cap}", setter)


_install_params(_DPClusteringParams)
_PARAM_NAMES = tuple(name for name, _, _, _ in PARAMS)


# ---------------------------------------------------------------------------------------------
# Params -> config


def _param_for_key(key: str, features_param: str) -> str:
    """The Param a config key (as a ConfigError names it) belongs to."""
    base = re.sub(r"\[\d+\]$", "", key)
    if base == "input.features":
        return features_param
    if base == "domain":
        return "lower/upper/radius/estimateDomain"
    if base == "domain.lower/upper":
        return "lower/upper"
    if base.startswith("algorithm.eps_split"):
        return "epsSplit"
    for name, k, _, _ in PARAMS:
        if k == base and name not in ("featuresCol", "inputCols"):
            return name
    return key


def _params_in_text(text: str, features_param: str) -> str:
    """Config keys named in an error message, in Param names."""
    keys = sorted({k for _, k, _, _ in PARAMS if k}, key=len, reverse=True)
    for k in keys:
        text = re.sub(r"(?<![\w.])" + re.escape(k) + r"(?![\w])", _param_for_key(k, features_param), text)
    return text


def _to_config(params: _DPClusteringParams):
    """Validate the Params through ``dpspark.config.validate``: the frozen ``Config`` a YAML file would give."""
    raw: dict = {"input": {}, "domain": {}, "privacy": {}, "algorithm": {}, "output": {"path": _NO_OUTPUT_PATH}}
    for name, key, _, _ in PARAMS:
        if key is None or key == "input.features" or not params.isSet(params.getParam(name)):
            continue
        value = params.getOrDefault(params.getParam(name))
        section, _, leaf = key.rpartition(".")
        (raw[section] if section else raw)[leaf] = value
    raw["algorithm"]["name"] = params.getOrDefault(params.algorithm)
    raw["input"]["features"] = list(params._features())
    raw["input"].setdefault("path", _NO_INPUT_PATH)
    features_param = "inputCols" if params.isSet(params.inputCols) else "featuresCol"
    try:
        config = config_mod.validate(raw)
    except ConfigError as exc:
        message = str(exc)
        prefix = f"config key '{exc.key}': "
        if message.startswith(prefix):
            message = message[len(prefix):]
        raise ParamError(_param_for_key(exc.key, features_param), _params_in_text(message, features_param)) from None
    # The ledger is ledgerPath, or the deployment's $DPSPARK_LEDGER, which a job cannot switch off.
    if config.privacy.ledger is not None and config.input.path == _NO_INPUT_PATH:
        where = "ledgerPath" if params.isSet(params.ledgerPath) else f"the deployment's ${config_mod.LEDGER_ENV}"
        raise ParamError("ledgerInput", f"is required with a privacy ledger ({where}): the path of the table the "
                                        "DataFrame reads, whose budget the fit is charged to")
    if config.input.path != _NO_INPUT_PATH and config.privacy.ledger is None:
        raise ParamError("ledgerPath", "ledgerInput is set but no ledger is: nothing would be charged")
    return config


# ---------------------------------------------------------------------------------------------
# The session around a fit


def _fit_partitions(spark) -> str:
    """Shuffle partitions for a fit: a few per core (the families shuffle small aggregates)."""
    try:
        cores = int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect: no SparkContext
        cores = 4
    return str(min(200, max(8, 2 * cores)))


@contextlib.contextmanager
def _fit_conf(spark):
    """Run a fit with sensible shuffle partitions and ``session.PLAN_CONF``, and put the caller's settings back.

    Spark's default of 200 made a fit in a user's own session 6x slower than the same fit under
    ``dpspark run`` (issue 16: 175.7 s against 28.6 s for 50,000 rows); PLAN_CONF: see there.
    """
    settings = {"spark.sql.shuffle.partitions": _fit_partitions(spark), **PLAN_CONF}
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
        log.info("fit runs with %s=%s (the session's %s is put back after)", key, value, saved[key] or "default")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


_MISSING = re.compile(r"No module named '([^']+)'")
_EXECUTOR_MODULES = ("numpy", "pandas", "pyarrow", "dpspark")


def _executor_error(module: str, executable: str | None = None) -> DPSparkError:
    import os

    where = f"run {executable}" if executable else "run an interpreter"
    return DPSparkError(
        f"Spark's Python workers {where} (PYSPARK_PYTHON={os.environ.get('PYSPARK_PYTHON', 'unset')}), which "
        f"cannot import {module!r}; dpspark needs numpy, pandas, pyarrow and dpspark itself there. Start the "
        f"session with dpspark.session.get_session() (in local mode it runs the workers on this interpreter, "
        f"{sys.executable}), or set PYSPARK_PYTHON (or spark.pyspark.python) to an interpreter that has them "
        f"before the session starts; on a cluster, install dpspark on the executors or ship it (--py-files)."
    )


def _check_executors(spark) -> None:
    """Before any charge: the Python workers start and import what the family passes need
    (``dpspark.session.check_python_workers``, shared with ``dpspark run``: one tiny job, once per
    session; ``PythonWorkersError`` naming PYSPARK_PYTHON and the missing module)."""
    from dpspark.session import check_python_workers

    check_python_workers(spark)


def _check_reads_only(dataset, ledger_input: str) -> None:
    """The DataFrame must be a scan of ``ledgerInput`` alone, then transformations (``dpspark.lineage``
    walks its analysed plan): the charge goes to that table's budget. Rows from the driver
    (createDataFrame, toPandas), an RDD (checkpoint, localCheckpoint), spark.range, another table or a
    subquery are refused before the charge. On Spark Connect the check is stricter (its unresolved plan
    proves less: ``dpspark.connect_plan``)."""
    from dpspark import lineage

    try:
        lineage.check_reads_only(dataset, ledger_input)
    except lineage.LineageError as exc:
        raise ParamError("ledgerInput", str(exc)) from None


# ---------------------------------------------------------------------------------------------
# Estimator


class DPClustering(Estimator, _DPClusteringParams, DefaultParamsReadable, DefaultParamsWritable):
    """Differentially private k-means / k-median as a pyspark.ml Estimator; ``fit`` returns a
    :py:class:`DPClusteringModel`. Keyword arguments are the Params (``explainParams()``).

    >>> est = DPClustering(k=5, epsilon=1.0, delta=1e-6, lower=[0, 0], upper=[100, 100])
    >>> model = Pipeline(stages=[VectorAssembler(inputCols=["x", "y"], outputCol="features"), est]).fit(df)
    """

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.setParams(**kwargs)

    def setParams(self, **kwargs: Any) -> "DPClustering":
        """Sets Params by name (the names of ``explainParams()``)."""
        unknown = sorted(set(kwargs) - set(_PARAM_NAMES))
        if unknown:
            raise TypeError(f"DPClustering has no Param {unknown[0]!r}; Params: {', '.join(_PARAM_NAMES)}")
        return self._set(**kwargs)

    def toConfig(self):
        """The validated dpspark ``Config`` these Params amount to (what ``dpspark run`` would use).

        Raises ``ParamError`` (a ``ValueError``) naming the Param when a value is refused.
        """
        return _to_config(self)

    def _fit(self, dataset) -> "DPClusteringModel":
        from dpspark import tables
        from dpspark.attempt import Attempt, Awaiting, checked_plan
        from dpspark.families import build_estimator
        from dpspark.privacy.ledger import Ledger
        from dpspark.privacy.randomness import Randomness
        from dpspark.runner import collapse_of, estimate_note, new_run_id

        config = self.toConfig()  # before any Spark job: a bad Param costs nothing
        chosen_id = self.getOrDefault(self.runId) if self.isSet(self.runId) else None
        if chosen_id is not None and not tables.RUN_ID_PATTERN.match(chosen_id):
            raise ParamError("runId", f"{chosen_id!r} is not a run id: 1 to 128 letters, digits, '.', '_' or '-', "
                                      "starting with a letter or digit")
        spark = dataset.sparkSession
        name = config.algorithm.name
        randomness = Randomness(config.seed)
        family = build_estimator(config, randomness)
        plan = checked_plan(family, config)
        if not randomness.private:
            log.warning("seed=%s: a testing aid; this fit is NOT PRIVATE", randomness.seed)
        ledgered = config.privacy.ledger is not None

        def fit(a: Attempt):
            """dpspark.ml's face of the attempt (the lifecycle is dpspark.attempt's)."""
            a.declare(plan, getattr(family, "guarantee", "central"), randomness.private)
            a.record.update(algorithm=name, input_path=config.input.path if ledgered else None)
            earlier = []
            with step("pre-flight checks", a.timings):  # nothing charged yet, no private value read
                _check_executors(spark)
                tables.check_schema(dataset, config.input.features, config.input.privacy_unit, config.domain.dim)
                if not ledgered:
                    _warn_about_raising_assemblers(dataset)
                else:
                    _check_reads_only(dataset, config.input.path)
                    ledger_path = tables.qualify(config.privacy.ledger)
                    tables.check_output_location(spark, ledger_path, "ledgerPath", delta_only=True)
                    a.ledger = Ledger(spark, ledger_path)
                    a.ledger.require_existing("ledgerPath")  # a fit never creates a ledger
                    input_key = tables.ledger_key_of(spark, config.input.path)
                    if chosen_id is not None:
                        earlier = _earlier_attempts(a.ledger, input_key, a.run_id)
            a.begin(earlier)
            if a.ledger is not None:
                a.open_input(input_key)
            preflight = getattr(family, "preflight", None)
            if preflight is not None:
                with step("check the public inputs", a.timings):
                    preflight(spark, a.input_key, a.ledger)
            ready = getattr(family, "check_ready", None)
            if ready is not None:
                try:
                    with step("check that every input is in", a.timings):
                        ready(spark)
                except DPSparkError as exc:
                    raise Awaiting(exc) from None
            if a.ledger is not None:
                a.charge(name, tables.qualify(config.input.path))
            a.start_fit()
            try:
                with step(f"{name}: fit", a.timings, hide_inside=True):
                    result = family.fit(dataset, timings=a.timings, operational=a.operational)
            except Exception as exc:
                # Only a module dpspark's executors need is named (the text of an error raised
                # during the fit is not the analyst's: it could quote a value).
                found = _MISSING.search(str(exc))
                if found and found.group(1).split(".")[0] in _EXECUTOR_MODULES:
                    raise _executor_error(found.group(1).split(".")[0]) from None
                raise
            if a.ledger is not None:  # Connect re-resolves the path at each action: still the charged table?
                tables.check_still_the_input(spark, tables.qualify(config.input.path), input_key)
            a.fitted(result.epsilon_spent, result.delta_spent)
            a.succeed(note=estimate_note(result))
            return result

        attempt = Attempt(spark, chosen_id or new_run_id())
        with _fit_conf(spark):
            result = attempt.execute(fit, ledgered=ledgered, what="fit")
        run_id, guarantee, private = attempt.run_id, attempt.guarantee, attempt.private
        ledger_totals = attempt.totals
        state = {
            "algorithm": result.algorithm, "objective": result.objective, "k": int(result.centers.shape[0]),
            "centers": np.asarray(result.centers, dtype=np.float64).tolist(),
            "noisyWeights": np.asarray(result.noisy_weights, dtype=np.float64).tolist(),
            "epsilonSpent": float(result.epsilon_spent), "deltaSpent": float(result.delta_spent),
            "charges": [dict(c) for c in result.charges], "guarantee": guarantee, "private": private,
            "privacyNote": None if private else "NOT PRIVATE: fixed seed (testing aid)",
            "featureNames": list(result.feature_names), "features": list(result.features),
            "domain": {"dim": result.domain.dim,
                       "lower": None if result.domain.lower is None else list(result.domain.lower),
                       "upper": None if result.domain.upper is None else list(result.domain.upper),
                       "radius": result.domain.radius},
            "parameters": _jsonable(result.parameters), "runId": run_id, "dpsparkVersion": __version__,
            "degenerate": _jsonable(collapse_of(config, result)),
        }
        model = DPClusteringModel(_state=state)
        model._ledger = None if ledger_totals is None else ledger_totals.as_dict()
        self._copyValues(model)
        return model


def _warn_about_raising_assemblers(dataset) -> None:
    """Before a fit without a ledger (with one, dpspark.lineage refuses the DataFrame): say that a
    VectorAssembler in 'error' mode fails the whole fit on one null or NaN input value."""
    from dpspark.lineage import assemblers_that_raise

    if assemblers_that_raise(dataset):
        log.warning("the features come from a VectorAssembler with handleInvalid='error' (its default): a row with "
                    "a null or NaN input column fails the fit after it started; use inputCols=[...] (dpspark drops "
                    "such rows) or VectorAssembler(..., handleInvalid='skip')")


def _earlier_attempts(ledger, input_key: str, run_id: str) -> list[dict]:
    """The ledger's events of a chosen ``runId`` on this input (its earlier attempts); ``ParamError``
    if one succeeded (a run id names one release: refused before any charge)."""
    events = [e for e in ledger.runs(input_key) if e["run_id"] == run_id]
    done = [e for e in events if e["status"] == "succeeded"]
    if done:
        raise ParamError("runId", f"{run_id!r} already succeeded on this input (attempt {done[-1].get('attempt')}): "
                                  "a run id names one release; give a new runId for a new release")
    return events


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------------------------
# Model


class DPClusteringSummary:
    """What one fit released and spent: released values and public parameters only.

    ``ledger`` (the input's totals right after this fit's charge) is known only on the model
    ``fit`` returned; it is not saved.
    """

    def __init__(self, state: dict, ledger: dict | None = None):
        self._state = state
        self.ledger = ledger

    algorithm = property(lambda self: self._state["algorithm"], doc="the family that ran")
    objective = property(lambda self: self._state["objective"], doc="kmeans or kmedian")
    k = property(lambda self: self._state["k"], doc="number of released centers")
    epsilonSpent = property(lambda self: self._state["epsilonSpent"], doc="epsilon this fit spent")
    deltaSpent = property(lambda self: self._state["deltaSpent"], doc="delta this fit spent")
    charges = property(lambda self: [dict(c) for c in self._state["charges"]],
                       doc="the privacy charges, one per step (step, epsilon, delta, rule)")
    noisyWeights = property(lambda self: np.array(self._state["noisyWeights"]),
                            doc="released (noisy) number of points per center")
    guarantee = property(lambda self: self._state["guarantee"], doc="central, or local (ldp)")
    private = property(lambda self: self._state["private"], doc="False for a fixed-seed (testing) fit")
    privacyNote = property(lambda self: self._state["privacyNote"], doc="NOT PRIVATE note of a seeded fit")
    runId = property(lambda self: self._state["runId"], doc="run id of the fit (the ledger's events carry it)")
    clusterSizes = property(lambda self: [int(max(0.0, round(w))) for w in self._state["noisyWeights"]],
                            doc="released size of each cluster: its noisy weight rounded, negatives as 0 "
                                "(post-processing; noisyWeights has the values as released)")
    degenerate = property(lambda self: self._state.get("degenerate"),
                          doc="None, or what collapsed in the release (fewer than k distinct centers, or "
                              "almost all weight on one) and its likely cause; as summary.json's degenerate")
    parameters = property(lambda self: dict(self._state["parameters"]),
                          doc="every public parameter of the family, defaults filled in")

    def asDict(self) -> dict:
        out = {k: v for k, v in self._state.items() if k not in ("domain", "features", "featureNames", "dpsparkVersion")}
        out["clusterSizes"] = self.clusterSizes
        out["degenerate"] = self.degenerate
        out["ledger"] = self.ledger
        return out

    def __repr__(self) -> str:
        return (f"DPClusteringSummary(algorithm={self.algorithm!r}, k={self.k}, epsilonSpent={self.epsilonSpent:g}, "
                f"deltaSpent={self.deltaSpent:g}, guarantee={self.guarantee!r}, private={self.private})")


# The keys a saved model holds beside its Params: released values and public parameters only.
STATE_KEYS = ("algorithm", "objective", "k", "centers", "noisyWeights", "epsilonSpent", "deltaSpent", "charges",
              "guarantee", "private", "privacyNote", "featureNames", "features", "domain", "parameters", "runId",
              "dpsparkVersion", "degenerate")
# A model saved by an older dpspark lacks these: loaded as None.
OPTIONAL_STATE_KEYS = ("degenerate",)


class DPClusteringModel(Model, _DPClusteringParams, MLReadable, MLWritable):
    """A fitted :py:class:`DPClustering`: the released centers, their noisy weights and the privacy spent.

    ``transform(df)`` adds ``predictionCol`` (nearest released center; NOT differentially private:
    computed from the rows). Save and load like MLlib models, alone or inside a ``PipelineModel``.
    """

    def __init__(self, _state: dict | None = None):
        super().__init__()
        self._state = _state
        self._ledger = None

    def setParams(self, **kwargs: Any) -> "DPClusteringModel":
        return self._set(**kwargs)

    def clusterCenters(self) -> list[np.ndarray]:
        """The released centers, one numpy array each (original units)."""
        return [np.array(c, dtype=np.float64) for c in self._state["centers"]]

    @property
    def hasSummary(self) -> bool:
        return self._state is not None

    @property
    def summary(self) -> DPClusteringSummary:
        """Privacy spent, charges, noisy weights, algorithm (available after ``load`` too)."""
        return DPClusteringSummary(self._state, self._ledger)

    def _clustering_model(self):
        from dpspark.model import ClusteringModel
        from dpspark.privacy.domain import Domain

        s = self._state
        d = s["domain"]
        domain = Domain(dim=int(d["dim"]), lower=None if d["lower"] is None else tuple(d["lower"]),
                        upper=None if d["upper"] is None else tuple(d["upper"]), radius=d["radius"])
        return ClusteringModel(
            algorithm=s["algorithm"], objective=s["objective"], centers=np.array(s["centers"], dtype=np.float64),
            noisy_weights=np.array(s["noisyWeights"], dtype=np.float64), epsilon_spent=s["epsilonSpent"],
            delta_spent=s["deltaSpent"], charges=s["charges"], domain=domain, features=self._features(),
            feature_names=list(s["featureNames"]), parameters=dict(s["parameters"]))

    def _transform(self, dataset):
        return self._clustering_model().transform(dataset, self.getOrDefault(self.predictionCol))

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)


class _ModelWriter(MLWriter):
    """Params and the released state as one JSON metadata file (DefaultParamsWriter's format)."""

    def __init__(self, instance: DPClusteringModel):
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """As ``MLWriter.save``; on Spark Connect, ``overwrite()`` replaces the metadata file (pyspark's
        overwrite deletes the folder through the JVM, which a Connect client does not have)."""
        if self.shouldOverwrite and is_connect(self.sparkSession):
            self._write_metadata(path, mode="overwrite")
            return
        super().save(path)

    def saveImpl(self, path: str) -> None:
        state = {k: self.instance._state.get(k) for k in STATE_KEYS}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extraMetadata={"dpspark": state})

    def _write_metadata(self, path: str, mode: str) -> None:
        """``DefaultParamsWriter.saveMetadata`` with a write ``mode``."""
        import os

        spark = self.sparkSession
        state = {k: self.instance._state.get(k) for k in STATE_KEYS}
        text = DefaultParamsWriter._get_metadata_to_save(self.instance, spark, extraMetadata={"dpspark": state})
        (spark.createDataFrame([(text,)], schema=["value"]).coalesce(1).write.mode(mode)
         .text(os.path.join(path, "metadata")))


class _ModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> DPClusteringModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        state = metadata.get("dpspark")
        if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS if k not in OPTIONAL_STATE_KEYS):
            raise DPSparkError(f"{path!r} does not hold a saved DPClusteringModel")
        model = self.cls(_state={k: state.get(k) for k in STATE_KEYS})
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model


def _keyword_signature(cls, method: str) -> None:
    """help(DPClustering) shows every Param as a keyword argument."""
    fn = getattr(cls, method)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_DEFAULTS.get(name))
               for name in _PARAM_NAMES]
    fn.__signature__ = inspect.Signature(params)


_keyword_signature(DPClustering, "__init__")
_keyword_signature(DPClustering, "setParams")
DPClustering.__doc__ += "\n    Params:\n\n" + "\n".join(f"    - ``{n}``: {doc}" for n, _, _, doc in PARAMS) + "\n"
