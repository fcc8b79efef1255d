"""The Spark passes of the maxcover family: executors aggregate exactly, the driver decides.

Every pass runs ``mapInArrow`` (``kernels.arrow_out``) over the clipped unit-space points (columns
``_u0.._u{d-1}`` from ``dpspark.tables.prepare_points``), works on whole Arrow
batches with numpy (chunked so that no temporary exceeds about 4 million float64
cells, whatever the batch size), and emits exact integer partial aggregates. The
driver (or a Spark ``groupBy().sum()`` on LONG columns) adds them as integers:
exact and independent of the partitioning and of the order partitions arrive in.
No noise is drawn here.

Distances use the same elementwise rule as ``dpspark.maxcover.core``
(``_sq_dists``: explicit differences, squared and summed per entry), so whether a
point is covered and its cover signature depend only on that point and public
values (never on which other points share its batch), and the Spark passes agree
bit for bit with the numpy reference.

Passes (each one Spark job over the data):

- :meth:`SparkCoverage.histogram` (at most one per threshold): the uncovered points'
  cover-signature histogram. One pass may read a group of thresholds (each point's key is its
  signatures at each, end to end); the group's later thresholds get their histograms from it on
  the driver (``_from_group``), and once the picks cover every point the later thresholds need no
  pass at all (``_all_covered``): the same histograms either way, bit for bit. A signature is the packed bitset
  (``numpy.packbits``) of the candidates within the threshold, used as a binary
  key; each partition counts its keys in a dict, Spark sums the counts per key
  (``groupBy(sig).sum(n)``) and the result is persisted. At most
  ``max_signatures + 1`` rows are collected, so the driver never holds more
  than the bound; when a threshold has more distinct signatures than that (or its
  signatures hold more than ``max_pairs`` (signature, candidate) pairs, the size of the
  driver's incidence), its histogram STAYS on the executors and every pick of the threshold runs one
  small job over the persisted histogram (:meth:`SparkCoverage.spilled_scores`,
  ``kernels.histogram_score_aggregator``), never over the data again. So every
  threshold reads the data at most once, whatever n and d.
- :func:`snap_counts` (one, at the end): the number of points whose nearest chosen
  center is each center (ties to the lowest index).
- :func:`cell_aggregates` (private candidates, one for all scales; two from
  ``HASH_FIRST_MIN_DIM`` dimensions on: hashed cell counts first, then the cells
  whose hash repeats): per randomly shifted grid cell, the exact count and the
  exact fixed-point sums of the offsets of its points from the cell center.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from dpspark.maxcover.core import PerPickScores
from dpspark.maxcover.kernels import (
    _signature_rows,
    arrow_out,
    cell_aggregator,
    cell_hash_counter,
    histogram_score_aggregator,
    signature_aggregator,
    snap_aggregator,
    uncovered_filter,
)
from dpspark.progress import detail, step

log = logging.getLogger("dpspark")

class PassCounter:
    """Counts Spark passes over the private data (``spark_passes``) and the jobs over aggregates.

    A pass reads every record of the input; a histogram job (``histogram_jobs``) reads only a
    persisted signature histogram, at most one row per distinct signature.
    """

    def __init__(self):
        self.passes = 0
        self.histogram_jobs = 0
        self.by_kind: dict[str, int] = {}

    def add(self, kind: str) -> None:
        self.passes += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def add_histogram_job(self, kind: str) -> None:
        self.histogram_jobs += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1


# ----------------------------------------------------------------------------
# Driver side


def _keys_to_csr(keys: list[bytes], n_candidates: int, chunk: int = 65_536) -> sp.csr_matrix:
    """Incidence matrix of packed-bitset signature keys (chunked unpacking, bounded memory)."""
    n_bytes = (n_candidates + 7) // 8
    if not keys:
        return sp.csr_matrix((0, n_candidates), dtype=np.int8)
    parts = []
    for start in range(0, len(keys), chunk):
        block = np.frombuffer(b"".join(keys[start : start + chunk]), dtype=np.uint8).reshape(-1, n_bytes)
        bits = np.unpackbits(block, axis=1, count=n_candidates).astype(bool)
        parts.append(sp.csr_matrix(bits, dtype=np.int8))
    return sp.vstack(parts, format="csr")


def _valid_bits(n_candidates: int) -> np.ndarray:
    """Per-byte mask of a packed signature row: every bit of a candidate, none of the padding past |V|."""
    n_bytes = (n_candidates + 7) // 8
    mask = np.full(n_bytes, 0xFF, dtype=np.uint8)
    if n_candidates % 8:
        mask[-1] = np.uint8((0xFF << (8 - n_candidates % 8)) & 0xFF)
    return mask


def signature_pairs(rows: np.ndarray, n_candidates: int, chunk: int = 65_536) -> np.ndarray:
    """How many candidates each packed signature row holds (int64; padding bits past |V| not counted).

    Their sum is the number of (signature, candidate) pairs of the incidence: what the driver's
    matrices cost (about 10 bytes a pair: the CSR and the column view the coverage loop builds).
    """
    rows = np.asarray(rows, dtype=np.uint8)
    mask = _valid_bits(n_candidates)
    out = np.empty(rows.shape[0], dtype=np.int64)
    for start in range(0, rows.shape[0], chunk):
        out[start : start + chunk] = np.bitwise_count(rows[start : start + chunk] & mask).sum(axis=1, dtype=np.int64)
    return out


def _packed_to_csr(rows: np.ndarray, n_candidates: int, chunk: int = 65_536, lengths: np.ndarray | None = None) -> sp.csr_matrix:
    """Incidence matrix of packed-bitset signatures given as a (rows x ceil(|V|/8)) uint8 array.

    The same matrix as ``_keys_to_csr`` of the rows' bytes (bits past ``n_candidates`` ignored), built
    from the non-zero BYTES only: a signature holds a few candidates of |V|, so the bits are expanded
    for those bytes and never for the whole (rows x |V|) bit matrix. Chunked, and the index array is
    allocated once at its final size (``lengths``: ``signature_pairs`` of the rows, counted here if not
    given), so the driver holds the packed rows, the matrix and one chunk's temporaries, no more.
    """
    n_bytes = (n_candidates + 7) // 8
    rows = np.asarray(rows, dtype=np.uint8)
    if rows.ndim != 2 or rows.shape[1] != n_bytes:
        raise ValueError(f"packed signatures must be (rows x {n_bytes}) bytes, got shape {rows.shape}")
    n_rows = rows.shape[0]
    lengths = signature_pairs(rows, n_candidates, chunk) if lengths is None else np.asarray(lengths, dtype=np.int64)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    idx_dtype = np.int32 if max(nnz, n_candidates) < 2**31 - 1 else np.int64
    indices = np.empty(nnz, dtype=idx_dtype)
    mask = _valid_bits(n_candidates)
    for start in range(0, n_rows, chunk):
        block = rows[start : start + chunk] & mask
        r, b = np.nonzero(block)  # row-major: rows ascending, bytes ascending within a row
        bits = np.unpackbits(block[r, b][:, None], axis=1)  # big-endian: bit j of byte b is candidate 8 b + j
        i, j = np.nonzero(bits)
        cols = b[i].astype(np.int64) * 8 + j
        lo, hi = int(indptr[start]), int(indptr[start + block.shape[0]])
        if cols.size != hi - lo:
            raise ValueError("packed signature rows do not hold the pair counts given")
        indices[lo:hi] = cols
    return sp.csr_matrix((np.ones(nnz, dtype=np.int8), indices, indptr.astype(idx_dtype)),
                         shape=(n_rows, n_candidates))


def _collected_signatures(table, n_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows x n_bytes uint8 packed signatures, int64 counts) of a collected (sig BINARY, n LONG) Arrow table.

    Read from the Arrow buffers chunk by chunk (``kernels._signature_rows``): no Python bytes
    object per key, no pandas conversion.
    """
    sig, cnt = table.column("sig"), table.column("n")
    parts = [_signature_rows(chunk, n_bytes) for chunk in sig.chunks]
    rows = np.concatenate(parts) if parts else np.zeros((0, n_bytes), dtype=np.uint8)
    counts = np.concatenate([c.to_numpy(zero_copy_only=False) for c in cnt.chunks]) if cnt.num_chunks else np.zeros(0)
    return rows, counts.astype(np.int64)


# Re-persist the uncovered points once at most this fraction of the persisted set is uncovered.
SHRINK_FRACTION = 0.5

# Default bound on the (signature, candidate) pairs of one collected histogram (``max_pairs``): the
# driver's incidence costs about 10 bytes a pair (CSR and column view), so about 320 MB here.
MAX_PAIRS = 32_000_000

# Thresholds one pass may read at most (a group; see SparkCoverage), and how many the first pass reads.
GROUP_MAX = 8
FIRST_GROUP = 2


def _has_candidate(v: int):
    """Spark column: whether candidate v is in the packed signature ``sig`` (the bit ``kernels._has_bit`` tests)."""
    from pyspark.sql import functions as F

    byte = F.conv(F.hex(F.substring(F.col("sig"), v // 8 + 1, 1)), 16, 10).cast("int")
    return byte.bitwiseAND(F.lit(0x80 >> (v % 8))) != 0


class SparkCoverage:
    """The coverage loop's data access on Spark: a signature provider for ``core.run_coverage``.

    ``df`` holds the unit-space points (persist it: one pass per threshold reads it),
    ``candidates`` the public candidates in unit space, ``thresholds`` on the cost
    scale d^p. Calling it for threshold i runs ONE Spark pass over the data and returns
    the signature histogram as (CSR incidence, int64 counts). If the histogram has more
    than ``max_signatures`` distinct signatures, or more than ``max_pairs`` (signature, candidate)
    pairs (public bounds on what the driver holds, whatever the data), it stays persisted on the executors and
    a ``PerPickScores`` is returned: each pick then runs one job over that histogram
    (same picks, same draws).

    The set a pass reads shrinks as the picks cover points: once the last pass saw at most
    ``SHRINK_FRACTION`` of the persisted points still uncovered, the next pass reads the
    persisted set through a filter dropping the points the earlier picks cover and persists
    what remains, so later thresholds read only uncovered points. Same rule, same points, same
    histograms: only the work changes (how much is NON-PRIVATE operational data). Call
    :meth:`close` when the loop is done.
    """

    def __init__(self, df, columns: list[str], candidates, thresholds, p: int, max_signatures: int,
                 counter: PassCounter | None = None, timings: dict | None = None, max_pairs: int | None = None):
        self.df = df
        self.columns = list(columns)
        self.candidates = np.ascontiguousarray(candidates, dtype=np.float64)
        self.thresholds = np.asarray(thresholds, dtype=np.float64).reshape(-1)
        self.p = int(p)
        self.max_signatures = int(max_signatures)
        self.max_pairs = MAX_PAIRS if max_pairs is None else int(max_pairs)
        self.counter = counter or PassCounter()
        self.timings = timings
        self.fallback_thresholds: list[int] = []  # thresholds whose histogram stayed on the executors
        self.histogram_sizes: list[int] = []
        self.histogram_pairs: list[int] = []  # (signature, candidate) pairs of each collected histogram (-1: spilled)
        self.pair_spills: list[int] = []  # thresholds that stayed on the executors for their pairs (max_pairs)
        self.shrinks: list[int] = []  # thresholds whose pass read a re-persisted, smaller set
        self.skipped: list[int] = []  # thresholds with no pass: every point was covered already
        self.grouped: list[int] = []  # thresholds with no pass: their histogram came from a group's pass
        self.regrouped: list[int] = []  # thresholds whose group was too large for the driver (see histogram)
        self._group = FIRST_GROUP  # thresholds the next pass reads (operational, from the last pass's size)
        self._spilled = None  # the persisted histogram of the current threshold, if it stayed distributed
        self._last_scores = None  # (threshold, picks, exact scores) of the last histogram job
        self._reset()

    def _reset(self) -> None:
        self._current = self.df  # the points not covered by self._applied
        self._owned: list = []  # DataFrames this provider persisted (the current set, then the one to retire)
        self._applied: tuple = ()
        self._current_rows = None  # |current|, once a pass over it with no pending picks counted it
        self._uncovered = None  # uncovered points the last pass saw (before that threshold's picks)
        self._counts_current = False  # whether the running pass reads current with no pending picks
        # (threshold, picks before it, incidence, counts, empty-signature count) of the last pass: the
        # matrix the loop holds anyway, let go before the next pass
        self._last_hist = None
        # (first threshold, thresholds, picks before it, joint rows, counts) of the last group's pass
        self._joint = None

    def _picks(self, covered_picks):
        ids = [int(c) for c, _ in covered_picks]
        ts = [float(self.thresholds[int(j)]) for _, j in covered_picks]
        return self.candidates[np.array(ids, dtype=np.int64)].reshape(-1, self.candidates.shape[1]), np.array(ts, dtype=np.float64)

    def _release_spilled(self) -> None:
        if self._spilled is not None:
            self._spilled.unpersist()
            self._spilled = None
        self._last_scores = None

    def close(self) -> None:
        """Unpersist everything this provider persisted (idempotent)."""
        self._release_spilled()
        for frame in self._owned:
            frame.unpersist()
        self._reset()

    def _pending(self, covered_picks) -> tuple:
        """The picks not yet applied to the persisted set; re-persists a smaller set when that pays."""
        from pyspark import StorageLevel

        covered = tuple(covered_picks)
        if covered[: len(self._applied)] != self._applied:  # not a continuation of the loop: start over
            self.close()
        pending = covered[len(self._applied):]
        if (pending and self._uncovered is not None and self._current_rows
                and self._uncovered <= SHRINK_FRACTION * self._current_rows):
            pick_pts, pick_t = self._picks(pending)
            smaller = (self._current.mapInArrow(arrow_out(uncovered_filter(pick_pts, pick_t, self.p, self.columns, dim=self.candidates.shape[1])),
                                                 self._current.schema)
                       .persist(StorageLevel.MEMORY_AND_DISK))
            self._owned.append(smaller)
            self._current, self._applied, self._current_rows = smaller, covered, None
            self.shrinks.append(len(self.histogram_sizes))
            pending = ()
        self._counts_current = not pending
        return pending

    def _retire(self) -> None:
        """After a pass materialized the current set: unpersist the sets it was filtered from."""
        while len(self._owned) > 1:
            self._owned.pop(0).unpersist()

    def _saw_uncovered(self, total: int) -> None:
        self._uncovered = int(total)
        if self._counts_current:
            self._current_rows = int(total)

    def _pass_name(self, i: int) -> str:
        return f"maxcover pass: signature histogram, threshold {i + 1}/{self.thresholds.size}"

    def histogram(self, i: int, covered_picks, group: int = 1):
        """One pass over thresholds i .. i + group - 1 (one key per point: its signatures at each, end to end).

        Returns (persisted histogram, None) when threshold i has more than ``max_signatures``
        non-empty signatures or more than ``max_pairs`` (signature, candidate) pairs (it stays on the
        executors); else (None, threshold i's (packed rows, counts, empty-signature count, pairs per
        row)), and a group's joint rows are kept for its later thresholds whose part of the keys holds
        at most ``max_pairs`` pairs (``_from_group``). A group with more than ``max_signatures // group`` keys (the bytes of one
        full histogram) is not collected: one job over its persisted histogram keeps the first
        threshold's part of each key and adds the counts per part (threshold i's histogram, read
        from the group's, not from the data), and the group's other thresholds get their own passes.
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        group = max(1, min(int(group), self.thresholds.size - i))
        if np.any(np.diff(self.thresholds[i : i + group]) < 0):  # a group's key needs ascending thresholds
            group = 1
        pick_pts, pick_t = self._picks(self._pending(covered_picks))
        fn = signature_aggregator(self.candidates, pick_pts, pick_t, self.thresholds[i : i + group], self.p, self.columns)
        hist = (
            self._current.mapInArrow(arrow_out(fn), "sig BINARY, n LONG")
            .groupBy("sig").agg(F.sum("n").alias("n"))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        limit = self.max_signatures if group == 1 else max(1, self.max_signatures // group)
        table = hist.limit(limit + 2).toArrow()  # + 1 for the empty signature
        self.counter.add("signature histogram")
        self._retire()
        n_cand = self.candidates.shape[0]
        n_bytes = (n_cand + 7) // 8
        rows, counts = _collected_signatures(table, group * n_bytes)
        del table
        nonempty = int(rows.any(axis=1).sum())
        if nonempty > limit and group > 1:
            detail("maxcover: thresholds %d-%d read together have more than %d distinct keys; threshold %d's "
                   "histogram is taken from theirs", i + 1, i + group, limit, i + 1)
            self.regrouped.append(i)
            hist, table = self._first_threshold_of(hist, n_bytes, collect=self.max_signatures + 2)
            group, limit = 1, self.max_signatures
            rows, counts = _collected_signatures(table, n_bytes)
            del table
            nonempty = int(rows.any(axis=1).sum())
        if nonempty > limit:
            return hist, None
        first = _group_histogram(rows, counts, n_bytes, 0, i, ())
        lengths = signature_pairs(first[0], n_cand)
        pairs = int(lengths.sum())
        if pairs > self.max_pairs:
            # Too many (signature, candidate) pairs for the driver's incidence: the histogram stays on the
            # executors, as one with too many signatures does (same picks: exact scores per pick).
            detail("maxcover: threshold %d's histogram has more than max_pairs=%d (signature, candidate) pairs; "
                   "it stays on the executors", i + 1, self.max_pairs)
            self.pair_spills.append(i)
            return (self._first_threshold_of(hist, n_bytes)[0] if group > 1 else hist), None
        hist.unpersist()
        self._saw_uncovered(int(counts.sum()))
        # the next pass's group, from this one's size (how many keys the data has: operational only)
        per = max(1, nonempty)
        self._group = int(max(1, min(GROUP_MAX, math.isqrt(max(1, self.max_signatures // (2 * per))))))
        if self.regrouped and self.regrouped[-1] == i:  # the group did not fit: the next pass reads one
            self._group = 1
        # The group's later thresholds whose part of the joint keys holds at most max_pairs pairs (their
        # histograms hold no more: ascending thresholds, so the fitting ones are a prefix).
        fits = 1
        while fits < group and int(signature_pairs(rows[:, fits * n_bytes : (fits + 1) * n_bytes], n_cand).sum()) <= self.max_pairs:
            fits += 1
        if fits > 1:
            self._joint = (i, fits, tuple(covered_picks), rows, counts)
        del rows
        return None, first + (lengths,)

    def _first_threshold_of(self, hist, n_bytes: int, collect: int | None = None):
        """One job over a group's persisted histogram: the first threshold's part of each key, counts added
        per part (that threshold's histogram, read from the group's, not from the data), persisted; with
        ``collect``, that job also collects its first ``collect`` rows (an Arrow table, else None)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        single = (hist.select(F.substring(F.col("sig"), 1, n_bytes).alias("sig"), F.col("n"))
                  .groupBy("sig").agg(F.sum("n").alias("n"))
                  .persist(StorageLevel.MEMORY_AND_DISK))
        table = None
        if collect is None:
            single.count()  # materialized before the group's histogram goes
        else:
            table = single.limit(collect).toArrow()
        self.counter.add_histogram_job("group histogram, first threshold")
        hist.unpersist()
        return single, table

    def _group_size(self) -> int:
        """Thresholds the next pass reads: at most ``max_signatures`` // the points the last histogram saw
        uncovered (a group has at most one key per point it reads, and it reads no more than those, so
        it fits on the driver), and what the last pass's size suggests; ``FIRST_GROUP`` at first.
        Operational (it changes which passes run, never a histogram)."""
        if self._uncovered is None:
            return self._group
        return int(max(1, min(self._group, self.max_signatures // max(1, self._uncovered))))

    def _from_group(self, i: int, covered_picks):
        """Threshold i's histogram from the last group's pass, with no pass, or None.

        The group's pass saw every point the picks before its first threshold s left uncovered,
        with its signatures at s .. s + g - 1. A pick (c, j) of those thresholds covers exactly the
        points whose signature at j holds c (the same rule decides both), so threshold i's
        histogram is the signatures at i of the points holding none of the picks made since s:
        the histogram a pass at i would collect, bit for bit (same signatures, same counts).
        """
        joint = self._joint
        if joint is None:
            return None
        start, group, before, rows, counts = joint
        if not start < i < start + group:
            return None
        covered = tuple(covered_picks)
        if covered[: len(before)] != before:
            return None
        new = covered[len(before):]
        if any(not start <= int(j) < i for _, j in new):
            return None
        hist = _group_histogram(rows, counts, (self.candidates.shape[0] + 7) // 8, i - start, start, new)
        self._uncovered = int(hist[1].sum()) + hist[2]  # what a pass at i would have seen uncovered
        return hist

    def _all_covered(self, i: int, covered_picks) -> bool:
        """Whether the picks so far cover every point, known from the last histogram without a pass.

        The last histogram (threshold i - 1, from a pass or a group's pass) held every point the picks before it left uncovered, with its
        signature at threshold i - 1. A pick (c, i - 1) covers exactly the points whose signature
        holds c (the same rule, ``cost_within``, decides both), so the points still uncovered are
        those with an empty signature and those whose signature holds none of threshold i - 1's
        picks. When there are none, every later histogram is empty and needs no pass: the same
        histograms, picks and draws, fewer passes (how many is NON-PRIVATE operational data, as the
        shrinking is). Conservative: False unless ``covered_picks`` continues the last pass's picks
        with picks of threshold i - 1 only.
        """
        last = self._last_hist
        if last is None or last[0] != i - 1:
            return False
        _, before, incidence, counts, empty = last
        covered = tuple(covered_picks)
        if empty or covered[: len(before)] != before:
            return False
        new = covered[len(before):]
        if any(int(j) != i - 1 for _, j in new):
            return False
        picked = np.array(sorted({int(c) for c, _ in new}), dtype=np.int64)
        hit = np.asarray(incidence[:, picked].sum(axis=1)).reshape(-1) > 0 if picked.size else np.zeros(counts.size, dtype=bool)
        return not int(counts[~hit].sum())

    def spilled_scores(self, i: int, threshold_picks: Sequence[int]) -> np.ndarray:
        """One job over threshold i's persisted histogram: exact scores given this threshold's picks so far.

        The first pick scores every candidate over the whole histogram; each later pick subtracts
        what the previous pick newly covered (rows containing it and none of the picks before it):
        exactly the recomputed scores, reading the histogram rather than the data.
        """
        if self._spilled is None:
            raise RuntimeError("no persisted histogram for this threshold")
        picks = tuple(int(v) for v in threshold_picks)
        last = self._last_scores
        update = last is not None and last[0] == i and bool(picks) and last[1] == picks[:-1]
        n_cand = self.candidates.shape[0]
        if update:
            fn = histogram_score_aggregator(n_cand, exclude=picks[:-1], require=picks[-1])
            label, kind = "points newly covered by the pick", "spilled histogram (update)"
        else:
            fn = histogram_score_aggregator(n_cand, exclude=picks)
            label, kind = "exact pick scores", "spilled histogram (scores)"
        rows = self._spilled
        # In the JVM, an update keeps the rows holding the newest pick and none of the earlier ones:
        # Python receives just the rows it sums. The newest pick is tested first: Spark's AND stops
        # at the first false test, so the earlier picks are tested only on the few rows holding it
        # (tested first, with 13 earlier picks on 2.5 million rows: 0.57 s against 1.46 s).
        test = _has_candidate(picks[-1]) if update else None
        for v in (picks[:-1] if update else picks):
            test = ~_has_candidate(v) if test is None else test & ~_has_candidate(v)
        if test is not None:
            rows = rows.where(test)
        # Runs only for a threshold whose histogram stayed on the executors (data-dependent): in an
        # accounted run its lines are on the operator's log only.
        with step(f"maxcover histogram job: {label}, threshold {i + 1}, pick {len(picks) + 1}", self.timings,
                  data_dependent=True, repeated=True):
            parts = rows.mapInArrow(fn, "cand INT, n LONG").toPandas()
            self.counter.add_histogram_job(kind)
        ids = parts["cand"].to_numpy(dtype=np.int64)
        n = parts["n"].to_numpy(dtype=np.int64)
        exact = np.zeros(n_cand, dtype=np.int64)
        np.add.at(exact, ids[ids >= 0], n[ids >= 0])
        if not picks:
            self._saw_uncovered(int(n[ids < 0].sum()))
        scores = last[2] - exact if update else exact
        self._last_scores = (i, picks, scores)
        return scores.copy()

    def __call__(self, i: int, covered_picks):
        self._release_spilled()  # the previous threshold's histogram, if it stayed on the executors
        # One step per threshold whatever happens inside (a pass, a group's pass, none): the analyst's
        # log is the same for every dataset; what happened is NON-PRIVATE (operator's log and record).
        with step(self._pass_name(i), self.timings, repeated=True):
            return self._threshold(i, covered_picks)

    def _threshold(self, i: int, covered_picks):
        n_cand = self.candidates.shape[0]
        all_covered = self._all_covered(i, covered_picks)
        self._last_hist = None
        if all_covered:
            # No point left uncovered: threshold i's histogram is empty and no pass reads the data.
            detail("maxcover: threshold %d: the picks so far cover every point; no pass", i + 1)
            self._joint = None
            hist = (np.zeros((0, (n_cand + 7) // 8), dtype=np.uint8), np.zeros(0, dtype=np.int64), 0)
            self.skipped.append(i)
        else:
            hist = self._from_group(i, covered_picks)
            if hist is not None:
                detail("maxcover: threshold %d: histogram from the pass of threshold %d", i + 1, self._joint[0] + 1)
                self.grouped.append(i)
            else:
                self._joint = None
                spilled, hist = self.histogram(i, covered_picks, self._group_size())
                if hist is None:
                    if not (self.pair_spills and self.pair_spills[-1] == i):
                        detail(  # how many signatures the data has: NON-PRIVATE, the operator's log in an accounted run
                            "maxcover: threshold %d has more than max_signatures=%d distinct cover signatures; its "
                            "histogram stays on the executors and each pick runs one job over it", i + 1, self.max_signatures,
                        )
                    self._spilled = spilled
                    self._group = 1
                    self.fallback_thresholds.append(i)
                    self.histogram_sizes.append(-1)
                    self.histogram_pairs.append(-1)
                    return PerPickScores(lambda threshold_picks: self.spilled_scores(i, threshold_picks))
        rows, counts, empty = hist[:3]
        lengths = hist[3] if len(hist) > 3 else signature_pairs(rows, n_cand)
        self.histogram_sizes.append(int(rows.shape[0]))
        self.histogram_pairs.append(int(lengths.sum()))
        incidence = _packed_to_csr(rows, n_cand, lengths=lengths)
        del hist, rows
        self._last_hist = (i, tuple(covered_picks), incidence, counts, empty)
        return incidence, counts


def _group_histogram(rows: np.ndarray, counts: np.ndarray, n_bytes: int, q: int, start: int, new_picks):
    """(packed signatures at the group's q-th threshold, their counts, the empty-signature count) of
    the joint rows (``signature_aggregator`` keys of thresholds start, start + 1, ...) that hold none
    of ``new_picks`` ((candidate, threshold) pairs of the group's earlier thresholds). Equal
    signatures are merged, so each appears once, as in a pass's histogram."""
    alive = np.ones(rows.shape[0], dtype=bool)
    for c, j in new_picks:
        c = int(c)
        alive &= (rows[:, (int(j) - start) * n_bytes + c // 8] & np.uint8(0x80 >> (c % 8))) == 0
    part = rows[:, q * n_bytes : (q + 1) * n_bytes]
    nonempty = part.any(axis=1)
    empty = int(counts[alive & ~nonempty].sum())
    sel = alive & nonempty
    part, cnt = np.ascontiguousarray(part[sel]), counts[sel]
    if rows.shape[1] == n_bytes and not new_picks:  # a single threshold's keys, already distinct
        return part, cnt.astype(np.int64), empty
    if not part.shape[0]:
        return part.reshape(0, n_bytes), np.zeros(0, dtype=np.int64), empty
    keys, inverse = np.unique(part.view(np.dtype((np.void, n_bytes))).reshape(-1), return_inverse=True)
    merged = np.zeros(keys.shape[0], dtype=np.int64)
    np.add.at(merged, inverse.reshape(-1), cnt.astype(np.int64))
    return keys.view(np.uint8).reshape(-1, n_bytes), merged, empty


def snap_counts(df, columns: list[str], centers, counter: PassCounter | None = None, timings: dict | None = None) -> np.ndarray:
    """One pass: exact int64 number of points whose nearest center (unit space) is each center."""
    centers = np.ascontiguousarray(centers, dtype=np.float64)
    k = centers.shape[0]
    fn = snap_aggregator(centers, columns)
    with step("maxcover pass: snap points to the chosen centers", timings):
        parts = df.mapInArrow(arrow_out(fn), "center INT, n LONG").toPandas()
        if counter is not None:
            counter.add("snap")
    counts = np.zeros(k, dtype=np.int64)
    if len(parts):
        np.add.at(counts, parts["center"].to_numpy(dtype=np.int64), parts["n"].to_numpy(dtype=np.int64))
    return counts


HASH_FIRST_MIN_DIM = 4  # from this dimension on, cell_aggregates carries full cell keys only for repeated hashes


def cell_aggregates(df, columns: list[str], sides: Sequence[float], shifts: Sequence[np.ndarray], min_count: int = 1,
                    counter: PassCounter | None = None, timings: dict | None = None,
                    method: str = "auto", hash_bits: int = 64) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per scale (cell coordinates int64 (c, d), exact counts (c,), exact fixed-point sums (c, d)).

    Only cells with an exact count >= ``min_count`` (public) appear; the filter runs on the
    executors, so the driver only receives those. Rows are sorted by cell coordinates, so the order
    (and with a seeded noise source the draws) does not depend on the partitioning.

    ``method`` (public; ``auto``: ``hash`` from ``HASH_FIRST_MIN_DIM`` dimensions on, else ``direct``):

    - ``direct``: one pass; every non-empty cell's (level, d coordinates, count, d sums) row goes
      through the shuffle. In 2-3 dimensions the rows are short and most cells are repeated.
    - ``hash``: in d dimensions nearly every point is alone in its cell at the fine scales, and those
      rows (12 d + 12 bytes and more) made the shuffle. First a pass that shuffles only
      (level, 64-bit cell hash, count) (:func:`~dpspark.maxcover.kernels.cell_hash_counter`) and
      collects the hashes whose count is >= ``min_count``; then, if any, a pass that aggregates only
      the cells with those hashes, by their full coordinates, exactly as ``direct`` does. A cell
      with count >= ``min_count`` has a hash count >= ``min_count``, so it is kept; a cell that
      shares its hash with another is aggregated by its own coordinates and filtered by its own
      count. So the result is ``direct``'s, bit for bit (a test holds it to that, with hostile rows
      and collisions forced by ``hash_bits`` < 64). Two passes over the persisted points instead
      of one; at 10^6 points, local[2]: 18.4 s instead of 96.5 s at d = 50, 9.1 s instead of
      12.1 s at d = 10 (``scripts/bench_cell_pass.py``, bench/results/maxcover/cell_pass.md).
    """
    dim = np.asarray(shifts[0]).shape[0] if len(shifts) else len(columns)
    if method == "auto":
        method = "hash" if dim >= HASH_FIRST_MIN_DIM else "direct"
    if method not in ("direct", "hash"):
        raise ValueError(f"method={method!r} should be 'auto', 'direct' or 'hash'")
    only_hashes = None
    if method == "hash":
        only_hashes = _repeated_cell_hashes(df, columns, sides, shifts, min_count, hash_bits, counter, timings)
        if not any(h.size for h in only_hashes):
            empty = (np.zeros((0, dim), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.int64))
            return [empty for _ in sides]
    return _cell_rows(df, columns, sides, shifts, min_count, only_hashes, hash_bits, counter, timings)


def _repeated_cell_hashes(df, columns, sides, shifts, min_count, hash_bits, counter, timings) -> list[np.ndarray]:
    """Per scale, the sorted int64 cell hashes with an exact count >= ``min_count`` (NOT released: they
    only choose which cells the next pass aggregates)."""
    from pyspark.sql import functions as F

    fn = cell_hash_counter(sides, shifts, columns, hash_bits)
    with step(f"maxcover pass: grid cell hash counts at {len(sides)} scales", timings):
        pdf = (
            df.mapInArrow(arrow_out(fn), "level INT, h LONG, n LONG")
            .groupBy("level", "h")
            .agg(F.sum("n").alias("n"))
            .where(F.col("n") >= F.lit(int(min_count)))
            .select("level", "h")
            .toPandas()
        )
        if counter is not None:
            counter.add("candidate cell hashes")
    levels = pdf["level"].to_numpy(dtype=np.int64) if len(pdf) else np.zeros(0, dtype=np.int64)
    hashes = pdf["h"].to_numpy(dtype=np.int64) if len(pdf) else np.zeros(0, dtype=np.int64)
    return [np.sort(hashes[levels == level]) for level in range(len(sides))]


def _cell_rows(df, columns, sides, shifts, min_count, only_hashes, hash_bits, counter, timings):
    from pyspark.sql import functions as F

    dim = np.asarray(shifts[0]).shape[0] if len(shifts) else len(columns)
    fn = cell_aggregator(sides, shifts, columns, 1 << 16, only_hashes=only_hashes, hash_bits=hash_bits)
    gcols = [f"g{j}" for j in range(dim)]
    scols = [f"s{j}" for j in range(dim)]
    schema = "level INT, " + ", ".join(f"{c} INT" for c in gcols) + ", n LONG, " + ", ".join(f"{c} LONG" for c in scols)
    with step(f"maxcover pass: grid cell counts at {len(sides)} scales", timings):
        pdf = (
            df.mapInArrow(arrow_out(fn), schema)
            .groupBy("level", *gcols)
            .agg(F.sum("n").alias("n"), *[F.sum(c).alias(c) for c in scols])
            .where(F.col("n") >= F.lit(int(min_count)))
            .toPandas()
        )
        if counter is not None:
            counter.add("candidate cells")
    return cells_by_level(pdf, len(sides), dim)


def cells_by_level(pdf, n_levels: int, dim: int, min_count: int = 1) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Rows (level, g0.., n, s0..) with one row per (level, cell) -> per level (cells, counts, sums), sorted by cell.

    Keeps the rows with n >= ``min_count`` (Spark filters before collecting; numpy references here).
    """
    gcols = [f"g{j}" for j in range(dim)]
    scols = [f"s{j}" for j in range(dim)]
    out = []
    if len(pdf):
        pdf = pdf[pdf["n"].to_numpy(dtype=np.int64) >= int(min_count)]
    levels = pdf["level"].to_numpy(dtype=np.int64) if len(pdf) else np.zeros(0, dtype=np.int64)
    for level in range(n_levels):
        sel = np.flatnonzero(levels == level)
        if not sel.size:
            out.append((np.zeros((0, dim), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.int64)))
            continue
        g = pdf[gcols].to_numpy(dtype=np.int64)[sel]
        n = pdf["n"].to_numpy(dtype=np.int64)[sel]
        s = pdf[scols].to_numpy(dtype=np.int64)[sel]
        order = np.lexsort(g.T[::-1])
        out.append((g[order], n[order], s[order]))
    return out
