"""One log line per Spark pass and per driver step, with its duration."""

from __future__ import annotations

import contextlib
import logging
import sys
import time

log = logging.getLogger("dpspark")


def configure_logging(level: int = logging.INFO, stream=None) -> None:
    """Show dpspark's log lines ("[dpspark] 12:00:01 maxcover: fit done in 3.20s") on ``stream``.

    The command line and ``dpspark.session.get_session()`` call it. From Python with a session of
    your own, call it once to see the step lines (the ``dpspark`` logger has no handler until then,
    so only warnings reach stderr):

        from dpspark.progress import configure_logging
        configure_logging()                  # INFO lines on stderr; configure_logging(logging.WARNING) for fewer

    ``stream``: where the lines go (default ``sys.stderr``). Calling it again changes the level and,
    when given, the stream of dpspark's handler; a handler you added to the ``dpspark`` logger
    yourself is left alone (and then no second one is added).
    """
    ours = [h for h in log.handlers if getattr(h, "_dpspark", False)]
    if ours and stream is not None:
        ours[0].use(stream)
    elif not log.handlers:
        handler = _Handler(stream)
        handler.setFormatter(logging.Formatter("[dpspark] %(asctime)s %(message)s", "%H:%M:%S"))
        handler._dpspark = True
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


class _Handler(logging.StreamHandler):
    """Writes to the given stream, or else to the CURRENT ``sys.stderr`` (not the one at set-up time,
    which a test runner or a notebook may have replaced and closed since)."""

    def __init__(self, stream=None):
        super().__init__(stream)
        self.fixed = stream

    def use(self, stream) -> None:
        self.fixed = stream
        self.stream = stream if stream is not None else sys.stderr  # no flush of a stream that may be closed

    def emit(self, record):
        if self.fixed is None:
            self.stream = sys.stderr
        super().emit(record)


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
