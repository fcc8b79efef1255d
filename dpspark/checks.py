"""Checks of public values shared by the config layer and the families' parameter validation
(below both: a family validates its own keys without importing the config or the command line)."""

from __future__ import annotations

import math

from dpspark.errors import ConfigError


def check_number(key: str, v, *, low=None, high=None, low_open=False, high_open=False) -> float:
    if isinstance(v, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(key, f"must be a number, got {v!r}")
    v = float(v)
    if math.isnan(v):
        raise ConfigError(key, "must be a number, got NaN")
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(key, f"must be {'>' if low_open else '>='} {low:g}, got {v:g}")
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(key, f"must be {'<' if high_open else '<='} {high:g}, got {v:g}")
    if math.isinf(v) and not (high is None and not high_open):
        raise ConfigError(key, f"must be finite, got {v}")
    return v
