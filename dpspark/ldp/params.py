"""Config keys of the ldp family (``algorithm.*``), validated before Spark starts.

=======================  ==========================================================  ==============
key                      meaning                                                     default
=======================  ==========================================================  ==============
``mode``                 ``simulate``: the job runs the client randomizer over the   ``simulate``
                         private table; ``ingest``: it reads reports real clients
                         wrote (``reports_path``) and publishes each round's
                         parameters (``protocol_path``)
``protocol_path``        ingest: folder of the Delta tables ``round=1..3`` of PUBLIC  (required for
                         round parameters                                            ingest)
``reports_path``         ingest: folder of the Delta tables ``round=1..3`` of         (required for
                         reports (columns sub, a, y)                                 ingest)
``radii``                GoodCenters: number of LSH cell widths w_i = w_0 / 2^i,      6
                         w_0 = half the unit-space diameter
``hashes``               GoodCenters: independent hash functions per radius          2
``buckets``              GoodCenters: hash values per hash function (B)               1024
``projection_dim``       GoodCenters: dimension of the random projection before the   4
                         grid (min(d, this))
``fractions``            share of users answering rounds 1, 2, 3 (sums to 1)          [0.5, 0.25, 0.25]
``heavy_z``              heavy bucket threshold, in standard deviations of the        4.0
                         oracle's estimate of an empty bucket
``prune_z``              round 2 -> 3: candidates kept when their weight is at least  2.0
                         this many standard deviations (at least k are kept)
``candidates_per_hash``  at most this many heavy buckets per hash function            4 k
=======================  ==========================================================  ==============

The guarantee is LOCAL: every user sends one epsilon-LDP report (privacy.epsilon);
privacy.delta may be 0 (nothing of it is spent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpspark.errors import ConfigError

MODES = ("simulate", "ingest")
KEYS = ("mode", "protocol_path", "reports_path", "radii", "hashes", "buckets", "projection_dim",
        "fractions", "heavy_z", "prune_z", "candidates_per_hash")


@dataclass(frozen=True)
class LDPParams:
    mode: str = "simulate"
    protocol_path: str | None = None
    reports_path: str | None = None
    radii: int = 6
    hashes: int = 2
    buckets: int = 1024
    projection_dim: int = 4
    fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)
    heavy_z: float = 4.0
    prune_z: float = 2.0
    candidates_per_hash: int | None = None


def check_fractions(key: str, fractions) -> tuple[float, float, float]:
    if len(fractions) != 3:
        raise ConfigError(key, f"must list 3 fractions (rounds 1, 2, 3), got {list(fractions)}")
    if any(not (f > 0) for f in fractions):
        raise ConfigError(key, f"every fraction must be > 0, got {list(fractions)}")
    if abs(math.fsum(fractions) - 1.0) > 1e-9:
        raise ConfigError(key, f"must sum to 1, got {list(fractions)} (sum {math.fsum(fractions):g})")
    return tuple(float(f) for f in fractions)


def validate_params(section, *, objective: str, k: int, dim: int, privacy) -> LDPParams:
    for key in section.data:
        if key not in KEYS:
            raise ConfigError(f"algorithm.{key}", f"unknown key for algorithm.name=ldp; allowed keys: {['name', 'objective', 'k', *KEYS]}")
    if objective not in ("kmeans", "kmedian"):
        raise ConfigError("algorithm.objective", f"{objective!r} is not supported by ldp; allowed: ['kmeans', 'kmedian']")
    mode = section.string("mode", LDPParams.mode, choices=MODES)
    protocol_path = section.string("protocol_path")
    reports_path = section.string("reports_path")
    if mode == "ingest":
        if protocol_path is None:
            raise ConfigError("algorithm.protocol_path", "is required with mode: ingest (where the public round parameters are written)")
        if reports_path is None:
            raise ConfigError("algorithm.reports_path", "is required with mode: ingest (where clients' reports are read, one Delta table per round)")
    fractions = section.numbers("fractions")
    return LDPParams(
        mode=mode,
        protocol_path=protocol_path,
        reports_path=reports_path,
        radii=section.integer("radii", LDPParams.radii, low=1, high=30),
        hashes=section.integer("hashes", LDPParams.hashes, low=1, high=64),
        buckets=section.integer("buckets", LDPParams.buckets, low=2, high=4096),
        projection_dim=section.integer("projection_dim", LDPParams.projection_dim, low=1, high=64),
        fractions=check_fractions("algorithm.fractions", fractions) if fractions is not None else LDPParams.fractions,
        heavy_z=section.number("heavy_z", LDPParams.heavy_z, low=0.0, high=100.0),
        prune_z=section.number("prune_z", LDPParams.prune_z, low=0.0, high=100.0),
        candidates_per_hash=section.integer("candidates_per_hash", None, low=1, high=10_000),
    )
