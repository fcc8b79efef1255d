"""Where a run's randomness comes from. Passed in explicitly; never global.

Three kinds, all derived from one ``Randomness`` object per run:

- ``noise``: the source of DP noise (``OpenDPNoise``, cryptographically secure,
  unless a seed is given, then ``SeededNoise``: a testing aid, NOT private);
- ``public_rng(name)``: numpy generators for data-independent public choices
  (initial centroids, grid shifts, solver restarts). These need no secrecy for
  privacy, only independence from the data; they are seeded from the OS unless a
  seed is given;
- ``run_key``: a secret per-run key for randomness that runs on executors and
  must be deterministic per record (contribution bounding, simulated clients),
  so that a retried task makes the same choice.

The run key is never used directly: each use derives its own sub-key with a
distinct label, so that the uses are independent of one another
(``derive_key``, ``Randomness.subkey``; labels in ``SUBKEY_LABELS``). The ldp
client seeds are the exception in form only: ``dpspark.ldp.client.user_seed``
(numpy and the standard library only, it cannot import this module) is
SHA-256("dpspark-ldp-user|" run key "|" record key), a labelled derivation of its
own. Keys never enter a Spark query plan as literals (a plan is shown by
``explain()``, the Spark UI and the event logs): keyed hashing runs inside
Python UDF / ``mapInPandas`` closures, which the plan shows by name only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import numpy as np

from dpspark.privacy.mechanisms import NoiseSource, OpenDPNoise, SeededNoise


# One label per use of the run key. A new use gets a new label, never an existing one.
SUBKEY_LABELS = {
    "contribution-bounding": "which row of a person is kept (dpspark.privacy.bounding)",
}


def derive_key(run_key: str, label: str) -> str:
    """The sub-key of ``run_key`` for one use: HMAC-SHA256(run key, "dpspark-subkey|" label), hex.

    HMAC-SHA256 is a pseudo-random function of its message under a secret key, so
    sub-keys for different labels are independent-looking secrets, and knowing one
    of them reveals nothing about the run key or the others.
    """
    if label not in SUBKEY_LABELS:
        raise ValueError(f"unknown sub-key label {label!r}; known: {sorted(SUBKEY_LABELS)}")
    return hmac.new(run_key.encode(), b"dpspark-subkey|" + label.encode(), hashlib.sha256).hexdigest()


class Randomness:
    def __init__(self, seed: int | None = None, noise: NoiseSource | None = None):
        self.seed = seed
        if seed is None:
            self._entropy = secrets.randbits(128)
            self.noise = noise if noise is not None else OpenDPNoise()
            self.run_key = secrets.token_hex(32)
        else:
            self._entropy = int(seed)
            self.noise = noise if noise is not None else SeededNoise(np.random.SeedSequence([int(seed), 0x6E6F697365]))
            self.run_key = hashlib.sha256(f"dpspark-run-key:{int(seed)}".encode()).hexdigest()

    @property
    def private(self) -> bool:
        """False when a seed (or a test-only noise source) makes the run reproducible, hence not private."""
        return self.seed is None and self.noise.secure

    def subkey(self, label: str) -> str:
        """The secret sub-key of this run for one use (``derive_key``)."""
        return derive_key(self.run_key, label)

    def public_rng(self, name: str) -> np.random.Generator:
        """A generator for data-independent public choices, one stream per ``name``."""
        tag = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self._entropy, tag])))

    def describe(self) -> dict:
        return {
            "noise": self.noise.description,
            "seed": self.seed,
            "seed_note": None if self.seed is None else "fixed seed: a testing aid, NOT private",
            "private": self.private,
        }
