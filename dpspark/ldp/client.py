"""The client side of the ldp family: what runs on a user's device. numpy and the standard library ONLY.

A device (or a collection service) needs three things: the public parameters of a
round (``round_from_dict`` of the JSON the server published), its own point, and
its own secret randomness (32 random bytes, or a ``numpy.random.Generator``):

    from dpspark.ldp import client
    seed = secrets.token_bytes(32)                       # kept on the device
    rnd = client.choose_round(seed, fractions)           # which round this user answers (ignores the point)
    report = client.randomize(client.to_unit(x, domain), round_params, seed)
    # send report.sub, report.a, report.y (three small ints) for round ``rnd`` only

Each user answers in exactly ONE round and sends exactly ONE report, so each
user's total privacy loss is the epsilon of that report (users are split between
rounds and sub-protocols: parallel composition).

Reports (``Report``): ``sub`` (the sub-protocol, chosen from the user's randomness
only), and the optimized-local-hashing pair ``(a, y)`` of ``dpspark.ldp.oracle``
applied to one item derived from the point:

- round 1 (``GoodCentersRound``): sub = (radius i, hash function m, coordinate j);
  item = 2 * bucket + s, where bucket is the locality-sensitive hash of the point
  at radius i (random projection, randomly shifted grid of cell width w_i, cell
  mixed into ``buckets`` values) and s in {0, 1} is the coordinate x_j stochastically
  rounded to {-1, +1} (P[s = 1] = (1 + x_j) / 2, so E[2s - 1] = x_j);
- rounds 2 and 3 (``AssignRound``): item = index of the nearest candidate center.

Randomness: with 32 bytes, the uniforms come from SHA-256(seed | tag) (four 53-bit
uniforms per digest; ``tag`` separates the round choice from the report), so the
result is a pure function of (point, public parameters, seed) and cheap enough to
simulate millions of users. With a Generator, ``gen.random(4)`` is used.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from dpspark.ldp.oracle import OracleParams, perturb

MIX_PRIME = 2**31 - 1
ROUND_TAG = b"|dpspark-ldp-round"
REPORT_TAG = b"|dpspark-ldp-report"
ROUND_NAMES = {1: "good_centers", 2: "weights", 3: "reweigh"}


# ----------------------------------------------------------------------------
# Public round parameters


@dataclass(frozen=True)
class GoodCentersRound:
    """Round 1: locality-sensitive hashing at R radii x M hash functions, one coordinate per user.

    Arrays: ``widths`` (R,), ``projections`` (R, M, d, d'), ``shifts`` (R, M, d'),
    ``mixers`` (R, M, d') integers in [1, 2^31 - 1). Sub-protocol s in [R*M*d] is
    (i, m, j) = (s // (M d), (s // d) % M, s % d).
    """

    oracle: OracleParams
    dim: int
    buckets: int
    widths: np.ndarray
    projections: np.ndarray
    shifts: np.ndarray
    mixers: np.ndarray
    round: int = 1

    @property
    def radii(self) -> int:
        return int(self.projections.shape[0])

    @property
    def hashes(self) -> int:
        return int(self.projections.shape[1])

    @property
    def subs(self) -> int:
        return self.radii * self.hashes * self.dim

    def split(self, sub):
        sub = np.asarray(sub, dtype=np.int64)
        per_radius = self.hashes * self.dim
        return sub // per_radius, (sub // self.dim) % self.hashes, sub % self.dim

    def to_dict(self) -> dict:
        return {
            "round": self.round, "kind": ROUND_NAMES[1], "oracle": self.oracle.to_dict(), "dim": self.dim,
            "buckets": self.buckets, "widths": self.widths.tolist(), "projections": self.projections.tolist(),
            "shifts": self.shifts.tolist(), "mixers": self.mixers.tolist(),
        }


@dataclass(frozen=True)
class AssignRound:
    """Rounds 2 and 3: report the index of the nearest of ``centers`` (unit space, (K, d))."""

    oracle: OracleParams
    centers: np.ndarray
    round: int = 2

    @property
    def subs(self) -> int:
        return 1

    def to_dict(self) -> dict:
        return {"round": self.round, "kind": ROUND_NAMES[self.round], "oracle": self.oracle.to_dict(),
                "centers": self.centers.tolist()}


def round_from_dict(d: dict):
    """Rebuild round parameters from their JSON form (exact: floats round-trip through repr)."""
    oracle = OracleParams.from_dict(d["oracle"])
    if d["kind"] == ROUND_NAMES[1]:
        return GoodCentersRound(
            oracle=oracle, dim=int(d["dim"]), buckets=int(d["buckets"]),
            widths=np.asarray(d["widths"], dtype=np.float64),
            projections=np.asarray(d["projections"], dtype=np.float64),
            shifts=np.asarray(d["shifts"], dtype=np.float64),
            mixers=np.asarray(d["mixers"], dtype=np.int64), round=int(d["round"]),
        )
    centers = np.asarray(d["centers"], dtype=np.float64).reshape(len(d["centers"]), -1)
    return AssignRound(oracle=oracle, centers=centers, round=int(d["round"]))


@dataclass(frozen=True)
class Report:
    round: int
    sub: int
    a: int
    y: int


# ----------------------------------------------------------------------------
# Randomness


USER_PREFIX = b"dpspark-ldp-user|"


def _key_bytes(record_key) -> bytes:
    if isinstance(record_key, bytes):
        return record_key
    if isinstance(record_key, (bytearray, memoryview)):
        return bytes(record_key)
    return str(record_key).encode()


def user_seed(run_key: str, record_key: str | bytes) -> bytes:
    """A simulated user's secret seed: SHA-256("dpspark-ldp-user|" run key "|" record key).

    Deterministic per record key and run. The record key (a string, UTF-8 encoded, or
    bytes) must be different for different people, ALSO when their records are
    identical (``dpspark.ldp.spark`` keys a record by its privacy unit, or by its
    content AND its duplicate index: ``point_record_keys``): equal keys mean equal
    seeds, hence equal, perfectly correlated reports.
    """
    return hashlib.sha256(USER_PREFIX + run_key.encode() + b"|" + _key_bytes(record_key)).digest()


def point_record_keys(points, dup) -> list[bytes]:
    """Record keys of rows keyed by their content and duplicate index (no privacy unit).

    Key of row r = the 8 d bytes of its unit-space point (IEEE 754 binary64, big-endian, one
    coordinate after the other, -0.0 written as 0.0) followed by the 8 bytes of its duplicate
    index (big-endian int64). Every key of a run has the same length 8 (d + 1), so the map
    (point, index) -> key is injective: two rows get equal keys only when their points are
    equal AND their duplicate indices are equal, which ``dpspark.ldp.spark.duplicate_keys``
    never gives two rows (no hash is involved, so not even a collision can merge two people).
    """
    x = np.asarray(points, dtype=np.float64)
    index = np.asarray(dup, dtype=np.int64).reshape(-1)
    if len(index) == 0:  # before any reshape: numpy cannot reshape an empty array to (0, -1)
        return []
    x = x.reshape(len(index), -1) + 0.0  # -0.0 + 0.0 = +0.0: equal points, equal bytes
    width = x.shape[1] + 1
    buf = np.empty((len(index), width), dtype=">i8")
    buf[:, :-1] = x.astype(">f8").view(">i8")
    buf[:, -1] = index
    raw = buf.tobytes()
    step = 8 * width
    return [raw[i : i + step] for i in range(0, len(raw), step)]


def frame_record_keys(frame, key_column: str, dup_column: str, point_columns) -> list:
    """The record keys of a batch (a pandas DataFrame, used through its methods only): the strings
    of ``key_column`` if it has one, else ``point_record_keys`` of its points and ``dup_column``."""
    if key_column in frame.columns:
        return frame[key_column].tolist()
    return point_record_keys(frame[list(point_columns)].to_numpy(dtype=np.float64),
                             frame[dup_column].to_numpy(dtype=np.int64))


def _words_to_uniforms(digests: bytes, count: int) -> np.ndarray:
    words = np.frombuffer(digests, dtype=">u8").reshape(-1, 4)[:, :count]
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def _uniforms(randomness, tag: bytes, count: int) -> np.ndarray:
    if isinstance(randomness, np.random.Generator):
        return randomness.random(count)
    if isinstance(randomness, (bytes, bytearray)) and len(randomness) == 32:
        return _words_to_uniforms(hashlib.sha256(bytes(randomness) + tag).digest(), count)[0]
    raise TypeError("randomness must be 32 bytes or a numpy.random.Generator")


def _uniforms_batch(seeds, tag: bytes, count: int) -> np.ndarray:
    if not len(seeds):
        return np.zeros((0, count))
    return _words_to_uniforms(b"".join(hashlib.sha256(s + tag).digest() for s in seeds), count)


def _round_of(u, fractions) -> np.ndarray:
    edges = np.cumsum(np.asarray(fractions, dtype=np.float64))[:-1]
    return np.searchsorted(edges, np.asarray(u), side="right").astype(np.int64) + 1


def client_seeds(run_key: str, keys) -> list[bytes]:
    """The secret seed of each simulated client (``user_seed`` of its record key: str or bytes)."""
    base = hashlib.sha256(USER_PREFIX + run_key.encode() + b"|")
    out = []
    for k in keys:
        h = base.copy()  # the prefix's state, hashed once per batch: the same digest as user_seed
        h.update(_key_bytes(k))
        out.append(h.digest())
    return out


def choose_round(randomness, fractions) -> int:
    """Which round (1, 2 or 3) this user answers in: a draw from its own randomness, NOT from its point."""
    return int(_round_of(_uniforms(randomness, ROUND_TAG, 1)[0], fractions))


def choose_round_batch(seeds, fractions) -> np.ndarray:
    return _round_of(_uniforms_batch(seeds, ROUND_TAG, 1)[:, 0], fractions)


# ----------------------------------------------------------------------------
# The randomizer


def to_unit(point, domain: dict) -> np.ndarray:
    """Clip a point in original units into the PUBLIC domain and map it to unit space.

    ``domain``: {"lower": [...], "upper": [...]} (box onto [-1, 1]^d) or {"radius": R}
    (ball onto the unit ball); the same TOTAL map as ``dpspark.privacy.domain.Domain``
    (the same float operations; this module may not import dpspark.privacy): any float
    (NaN, +-inf, 1e308) gives finite coordinates in [-1, 1]; the ball's norm is taken
    without overflow (scaled by the largest |x_j| first).
    """
    x = np.asarray(point, dtype=np.float64).reshape(-1)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if domain.get("radius") is not None:
            radius = float(domain["radius"])
            x = np.where(np.isnan(x), 0.0, np.clip(x, -_DBL_MAX, _DBL_MAX))
            m = float(np.abs(x).max()) if x.size else 0.0
            y = x / (m if m > 0.0 else 1.0)
            s = y[0] * y[0] if x.size else 0.0
            for j in range(1, x.size):
                s = s + y[j] * y[j]
            ny = float(np.sqrt(s))
            u = y / max(ny, 1.0) if m * ny > radius else x / radius
        else:
            lo = np.asarray(domain["lower"], dtype=np.float64)
            hi = np.asarray(domain["upper"], dtype=np.float64)
            u = 2.0 * (np.clip(x, lo, hi) - lo) / (hi - lo) - 1.0
    u = np.clip(u, -1.0, 1.0)
    u[np.isnan(u)] = 0.0
    return u


_DBL_MAX = float(np.finfo(np.float64).max)


def lsh_buckets(points, params: GoodCentersRound, i, m) -> np.ndarray:
    """Bucket in [B] of each point (rows) under hash function (i, m) (per row arrays)."""
    x = np.asarray(points, dtype=np.float64)
    P = params.projections[i, m]  # (n, d, d')
    z = np.zeros((x.shape[0], P.shape[2]))
    for t in range(x.shape[1]):  # explicit loop: the same bits whatever the batch size
        z = z + x[:, t : t + 1] * P[:, t, :]
    cell = np.floor((z + params.shifts[i, m]) / params.widths[i][:, None]).astype(np.int64)
    cm = np.mod(cell, MIX_PRIME)
    key = np.zeros(x.shape[0], dtype=np.int64)
    mix = params.mixers[i, m]
    for t in range(cm.shape[1]):
        key = (key + cm[:, t] * mix[:, t]) % MIX_PRIME
    return key % params.buckets


def nearest_index(points, centers) -> np.ndarray:
    """Index of the nearest center of each point: squared distances summed coordinate by coordinate
    (t = 0, 1, ...), the first of equal minima. The same bits whatever the batch size: the rows
    are done in blocks of about 2^15 distances, in place, with the same float operations per entry."""
    x = np.asarray(points, dtype=np.float64)
    c = np.asarray(centers, dtype=np.float64)
    n, k = x.shape[0], c.shape[0]
    out = np.empty(n, dtype=np.int64)
    block = max(1, (1 << 15) // max(k, 1))
    for start in range(0, n, block):
        xb = x[start : start + block]
        d2 = np.zeros((xb.shape[0], k))
        diff = np.empty_like(d2)
        for t in range(x.shape[1]):
            np.subtract(xb[:, t : t + 1], c[None, :, t], out=diff)
            np.multiply(diff, diff, out=diff)
            np.add(d2, diff, out=d2)
        out[start : start + block] = np.argmin(d2, axis=1)
    return out


def items(points, params, u_sub, u_sign) -> tuple[np.ndarray, np.ndarray]:
    """(sub, item) of each point in a batch, given two uniforms per user."""
    x = np.clip(np.asarray(points, dtype=np.float64).reshape(len(u_sub), -1), -1.0, 1.0)
    if isinstance(params, GoodCentersRound):
        if x.shape[1] != params.dim:
            raise ValueError(f"points have {x.shape[1]} coordinates, the round expects {params.dim}")
        sub = np.minimum((np.asarray(u_sub) * params.subs).astype(np.int64), params.subs - 1)
        i, m, j = params.split(sub)
        bucket = lsh_buckets(x, params, i, m)
        coord = x[np.arange(x.shape[0]), j]
        sign = (np.asarray(u_sign) < (1.0 + coord) / 2.0).astype(np.int64)
        return sub, 2 * bucket + sign
    if x.shape[1] != params.centers.shape[1]:
        raise ValueError(f"points have {x.shape[1]} coordinates, the round expects {params.centers.shape[1]}")
    return np.zeros(x.shape[0], dtype=np.int64), nearest_index(x, params.centers)


def _reports_from_uniforms(points, params, U) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sub, item = items(points, params, U[:, 0], U[:, 1])
    a, y = perturb(item, U[:, 2], U[:, 3], params.oracle)
    return sub, a, y


def randomize(point, round_params, randomness) -> Report:
    """One user's report for one round: a pure function of its point, the public round
    parameters and its own randomness (32 bytes or a numpy Generator). Reads nothing else.

    ``point`` is in unit space (``to_unit``); coordinates are clipped to [-1, 1].

    Privacy (epsilon-LDP, epsilon = ``round_params.oracle.epsilon``), proof sketch:
    the report is (sub, a, y). ``sub`` and ``a`` are functions of the uniforms u0, u2
    only, which are independent of the point. Given them, the point enters only
    through the item v (round 1: v = 2 * bucket + s, with s the stochastic rounding
    driven by u1; rounds 2, 3: v = the nearest candidate), and y is generalized
    randomized response on h_a(v) over g values: P[y = h_a(v)] = p = e^eps/(e^eps+g-1),
    P[y = t] = 1/(e^eps+g-1) for each t != h_a(v). So for any two points x, x' and any
    report r, P[r | x] / P[r | x'] <= p / (1/(e^eps+g-1)) = e^eps (mixing over u1,
    i.e. over v, preserves the bound: each conditional ratio is <= e^eps). The
    probabilities are computed in float64 from 53-bit uniforms: exact up to 2^-53.
    The user's round (``choose_round``) is likewise drawn independently of the point,
    and a user answers one round only, so its total loss is epsilon.
    """
    U = _uniforms(randomness, REPORT_TAG, 4).reshape(1, 4)
    sub, a, y = _reports_from_uniforms(np.asarray(point, dtype=np.float64).reshape(1, -1), round_params, U)
    return Report(round=int(round_params.round), sub=int(sub[0]), a=int(a[0]), y=int(y[0]))


def randomize_batch(points, round_params, seeds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``randomize`` for many users at once (seeds: 32-byte strings); returns (sub, a, y) arrays.

    Row r equals ``randomize(points[r], round_params, seeds[r])``.
    """
    U = _uniforms_batch(list(seeds), REPORT_TAG, 4)
    if len(U) == 0:  # before any reshape: numpy cannot reshape an empty array to (0, -1)
        if np.asarray(points).size:
            raise ValueError("points given without seeds")
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    pts = np.asarray(points, dtype=np.float64).reshape(len(U), -1)
    return _reports_from_uniforms(pts, round_params, U)


__all__ = [
    "GoodCentersRound", "AssignRound", "Report", "round_from_dict", "user_seed", "point_record_keys", "choose_round",
    "choose_round_batch", "to_unit", "randomize", "randomize_batch", "lsh_buckets", "nearest_index",
]
