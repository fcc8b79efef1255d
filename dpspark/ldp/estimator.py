"""``LocalDP``: the estimator of the ldp family (k-means / k-median in the LOCAL model).

    model = LocalDP(k=5, epsilon=2.0, domain=Domain(dim=2, lower=(0, 0), upper=(100, 100)),
                    features=("x", "y"), objective="kmeans").fit(df)

Modes:

- ``simulate`` (default): the executors run the numpy client (``dpspark.ldp.client``)
  for every record, with per-record randomness derived from the run's secret key
  and the record key, and Spark aggregates the reports into exact counts. Three
  Spark passes, one per round: round 1's reads every record, draws each client's
  round from its own randomness (never from its point) and keeps, persisted, round
  1's reports and the keyed points of the clients of rounds 2 and 3
  (``spark.first_pass``); the passes of rounds 2 and 3 read only their own clients.
- ``ingest``: the job never reads the private rows. It walks the rounds: a round
  whose parameters are not yet in ``protocol_path`` gets them computed (from the
  previous rounds' reports) and published; a round whose reports are not yet in
  ``reports_path`` stops the run with ``AwaitingReports`` (exit code 1, the run is
  recorded as failed, nothing is released). When all three rounds' reports are
  there, the job releases the k centers. ``advance`` does the same walk without
  releasing anything (for the intermediate rounds, outside the ledger).

Privacy: each user sends one epsilon-LDP report in exactly one round; the
accountant records (epsilon, 0) once, labelled as a LOCAL guarantee.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from dpspark.errors import DPSparkError
from dpspark.ldp import protocol
from dpspark.ldp.params import MODES, LDPParams
from dpspark.model import ClusteringModel
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.randomness import Randomness
from dpspark.progress import detail, step

LOCAL_LABEL = ("local randomizers: every user sends ONE epsilon-LDP report in ONE round "
               "(LOCAL guarantee: each user's total epsilon)")
LOCAL_RULE = "local DP (optimized local hashing); users split between rounds and sub-protocols: parallel composition"


class AwaitingReports(DPSparkError):
    """Ingest mode: the next round's reports are not there yet (its parameters are published)."""

    exit_code = 1


class LocalDP:
    name = "ldp"
    guarantee = "local"  # replace-one local DP: its own currency in the ledger, never added to central charges

    def __init__(self, k: int, epsilon: float, domain: Domain, features=("x", "y"), objective: str = "kmeans",
                 mode: str = LDPParams.mode, protocol_path: str | None = None, reports_path: str | None = None,
                 radii: int = LDPParams.radii, hashes: int = LDPParams.hashes, buckets: int = LDPParams.buckets,
                 projection_dim: int = LDPParams.projection_dim, fractions=LDPParams.fractions,
                 heavy_z: float = LDPParams.heavy_z, prune_z: float = LDPParams.prune_z,
                 candidates_per_hash: int | None = LDPParams.candidates_per_hash, privacy_unit: str | None = None,
                 seed: int | None = None, randomness: Randomness | None = None):
        self.k = k
        self.epsilon = epsilon
        self.domain = domain
        self.features = tuple(features)
        self.objective = objective
        self.mode = mode
        self.protocol_path = protocol_path
        self.reports_path = reports_path
        self.radii = radii
        self.hashes = hashes
        self.buckets = buckets
        self.projection_dim = projection_dim
        self.fractions = tuple(fractions)
        self.heavy_z = heavy_z
        self.prune_z = prune_z
        self.candidates_per_hash = candidates_per_hash
        self.privacy_unit = privacy_unit
        self.seed = seed
        self.randomness = randomness

    @classmethod
    def from_config(cls, config, randomness: Randomness | None = None) -> "LocalDP":
        p: LDPParams = config.algorithm.params
        return cls(k=config.algorithm.k, epsilon=config.privacy.epsilon, domain=Domain.from_config(config.domain),
                   features=config.input.features, objective=config.algorithm.objective, mode=p.mode,
                   protocol_path=p.protocol_path, reports_path=p.reports_path, radii=p.radii, hashes=p.hashes,
                   buckets=p.buckets, projection_dim=p.projection_dim, fractions=p.fractions, heavy_z=p.heavy_z,
                   prune_z=p.prune_z, candidates_per_hash=p.candidates_per_hash,
                   privacy_unit=config.input.privacy_unit, seed=config.seed, randomness=randomness)

    def _validated_params(self) -> LDPParams:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k={self.k!r} should be an integer >= 1")
        if not isinstance(self.epsilon, (int, float)) or not (self.epsilon > 0) or math.isinf(self.epsilon):
            raise ValueError(f"epsilon={self.epsilon!r} should be a finite number > 0")
        if self.objective not in ("kmeans", "kmedian"):
            raise ValueError(f"objective={self.objective!r} should be 'kmeans' or 'kmedian'")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} should be one of {list(MODES)}")
        if self.mode == "ingest" and (not self.protocol_path or not self.reports_path):
            raise ValueError("mode='ingest' needs protocol_path and reports_path")
        if len(self.fractions) != 3 or any(not (f > 0) for f in self.fractions) or abs(math.fsum(self.fractions) - 1) > 1e-9:
            raise ValueError(f"fractions={self.fractions!r} should be 3 positive numbers summing to 1")
        for name in ("radii", "hashes", "projection_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} should be an integer >= 1")
        if isinstance(self.buckets, bool) or not isinstance(self.buckets, int) or not (2 <= self.buckets <= 4096):
            raise ValueError(f"buckets={self.buckets!r} should be an integer in [2, 4096]")
        if len(self.features) not in (1, self.domain.dim):
            raise ValueError(f"features={list(self.features)} should name {self.domain.dim} columns or one array column")
        return LDPParams(mode=self.mode, protocol_path=self.protocol_path, reports_path=self.reports_path,
                         radii=self.radii, hashes=self.hashes, buckets=self.buckets,
                         projection_dim=self.projection_dim, fractions=tuple(float(f) for f in self.fractions),
                         heavy_z=float(self.heavy_z), prune_z=float(self.prune_z),
                         candidates_per_hash=self.candidates_per_hash)

    def privacy_plan(self) -> tuple[float, float]:
        """(epsilon, delta): each user's total epsilon (one report), no delta. Public."""
        self._validated_params()
        return float(self.epsilon), 0.0

    def _settings(self, params: LDPParams) -> protocol.Settings:
        return protocol.Settings(radii=params.radii, hashes=params.hashes, buckets=params.buckets,
                                 projection_dim=params.projection_dim, fractions=params.fractions,
                                 heavy_z=params.heavy_z, prune_z=params.prune_z,
                                 candidates_per_hash=params.candidates_per_hash)

    def _driver(self, params: LDPParams, randomness: Randomness) -> protocol.Driver:
        return protocol.Driver(dim=self.domain.dim, k=self.k, objective=self.objective, epsilon=float(self.epsilon),
                               settings=self._settings(params), unit_diameter=self.domain.unit_diameter,
                               lsh_rng=randomness.public_rng("ldp-lsh"), fallback_rng=randomness.public_rng("ldp-fallback"),
                               clip_unit=self.domain.clip_unit, sample_unit=self.domain.sample_unit)

    # -- the two ways of getting reports ------------------------------------------

    def _simulate(self, df, params, driver, randomness, timings):
        from dpspark.ldp import spark as ldp_spark

        points, names = ldp_spark.keyed_points(df, self.features, self.privacy_unit, self.domain, randomness.run_key)
        run_key, dim = randomness.run_key, self.domain.dim
        # Round 1's pass also sorts the records into their rounds (a draw from each client's own
        # randomness); the persisted split holds round 1's reports and the keyed points of rounds
        # 2 and 3, whose passes then read only their own clients (a quarter of the records each).
        round_params = driver.params(1)
        split = ldp_spark.first_pass(points, round_params, run_key, params.fractions, dim).persist()
        try:
            with step("ldp round 1: simulated clients report", timings):
                hist = ldp_spark.round_histogram(split, 1)
            with step("ldp round 1: server estimates", timings):
                driver.absorb(1, round_params, hist)
            for r in (2, 3):
                round_params = driver.params(r)
                with step(f"ldp round {r}: simulated clients report", timings):
                    hist = ldp_spark.simulate_round(ldp_spark.round_points(split, r, dim), round_params, run_key,
                                                    params.fractions, r, dim)
                with step(f"ldp round {r}: server estimates", timings):
                    driver.absorb(r, round_params, hist)
        finally:
            split.unpersist()
        return names

    def _ingest(self, spark, params, driver, timings, release: bool):
        from dpspark.ldp import spark as ldp_spark

        for r in (1, 2, 3):
            round_params = ldp_spark.read_round_params(spark, params.protocol_path, r)
            if round_params is None:
                round_params = driver.params(r)
                ldp_spark.write_round_params(spark, params.protocol_path, round_params)
            with step(f"ldp round {r}: read reports", timings):
                hist = ldp_spark.read_reports(spark, params.reports_path, round_params)
            if hist is None:
                where = ldp_spark.round_path(params.reports_path, r)
                message = (f"ldp ingest: round {r} parameters are published at "
                           f"{ldp_spark.round_path(params.protocol_path, r)}; waiting for clients' reports at {where}. "
                           f"Run the job again once they are there.")
                if release:
                    raise AwaitingReports(message)
                return {"status": "awaiting", "round": r, "message": message}
            with step(f"ldp round {r}: server estimates", timings):
                driver.absorb(r, round_params, hist)
        return {"status": "complete", "round": 3}

    def advance(self, spark, timings: dict | None = None) -> dict:
        """Ingest mode without releasing: publish every round whose inputs are there; report the status."""
        params = self._validated_params()
        if params.mode != "ingest":
            raise ValueError("advance() is for mode='ingest'")
        randomness = self.randomness or Randomness(self.seed)
        return self._ingest(spark, params, self._driver(params, randomness), {} if timings is None else timings, release=False)

    def check_ready(self, spark, timings: dict | None = None) -> None:
        """Ingest mode: publish every round whose inputs are in; raise AwaitingReports if one is missing.

        The runner calls this BEFORE the ledger charge, so a run made too early charges nothing.
        Publishing a round's parameters is post-processing of reports that are already
        epsilon-LDP (each user charged themselves when they randomized). Simulate mode: no-op.
        """
        params = self._validated_params()
        if params.mode != "ingest":
            return
        status = self.advance(spark, timings)
        if status["status"] != "complete":
            raise AwaitingReports(status["message"])

    def fit(self, df, timings: dict | None = None, operational: dict | None = None) -> ClusteringModel:
        params = self._validated_params()
        epsilon, delta = self.privacy_plan()
        randomness = self.randomness or Randomness(self.seed)
        accountant = Accountant(epsilon, delta, randomness.noise)
        timings = {} if timings is None else timings
        driver = self._driver(params, randomness)
        # The charge comes before any report is produced or read: every user's report is
        # epsilon-LDP and each user reports once (parallel composition over disjoint groups).
        accountant.charge(LOCAL_LABEL, epsilon, 0.0, LOCAL_RULE)
        if params.mode == "simulate":
            names = self._simulate(df, params, driver, randomness, timings)
        else:
            from dpspark import tables

            names = tables.check_schema(df, self.features, None, self.domain.dim)
            self._ingest(df.sparkSession, params, driver, timings, release=True)
        with step("ldp: weighted solver on the server (post-processing)", timings):
            centers_unit, weights, info = driver.result(randomness.public_rng("ldp-solver"))
        accountant.finish()
        # Report counts per round are exact (NON-PRIVATE operational metadata): the caller's dict and a
        # detail line (the operator's log only in an accounted run).
        detail("ldp: %d candidates, %d kept, reports per round %s", info["candidates"], info["kept"], info["reports_per_round"])
        # Exact report counts (per round, per hash in good_centers) and thresholds made from them:
        # NON-PRIVATE operational metadata, never on the model.
        if operational is not None:
            operational["reports_per_round"] = info.get("reports_per_round")
            operational["good_centers"] = info.get("good_centers")
        public_info = {k: v for k, v in info.items() if k not in ("reports_per_round", "good_centers")}
        return ClusteringModel(
            algorithm=self.name, objective=self.objective, centers=self.domain.from_unit(centers_unit),
            noisy_weights=weights, epsilon_spent=accountant.spent_epsilon, delta_spent=accountant.spent_delta,
            charges=accountant.summary(), domain=self.domain, features=self.features, feature_names=names,
            parameters={"k": self.k, "objective": self.objective, **asdict(params), "guarantee": "local"},
            info={**public_info, "randomness": randomness.describe()},
        )


__all__ = ["LocalDP", "AwaitingReports"]
