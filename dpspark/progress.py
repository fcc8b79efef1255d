"""One log line per Spark pass and per driver step, with its duration."""

from __future__ import annotations

import contextlib
import logging
import time

log = logging.getLogger("dpspark")


def configure_logging(level: int = logging.INFO) -> None:
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[dpspark] %(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


@contextlib.contextmanager
def step(name: str, timings: dict | None = None):
    """Log ``name`` and its duration; record the duration in ``timings`` if given."""
    start = time.perf_counter()
    log.info("%s ...", name)
    try:
        yield
    finally:
        seconds = time.perf_counter() - start
        log.info("%s done in %.2fs", name, seconds)
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + seconds
