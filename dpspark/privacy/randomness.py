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
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np

from dpspark.privacy.mechanisms import NoiseSource, OpenDPNoise, SeededNoise


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
