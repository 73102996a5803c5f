"""The alpha-beta cost model of communication, and fitting it to measurements.

Sending one message of ``n`` bytes between two ranks costs

    T = alpha + n * beta

alpha: latency per message (seconds), beta: seconds per byte (1 / bandwidth).

An all-reduce of ``n`` bytes on ``N`` ranks, in the two schemes the workbook
compares (seed 002):

    ring (reduce-scatter then all-gather, chunks of n/N bytes):
        2(N-1) steps; in each step every rank sends one chunk and receives one,
        so every rank sends 2(N-1)/N * n bytes in total:
        T_ring = 2(N-1) * alpha + 2(N-1)/N * n * beta
    parameter server (workers send to rank 0, rank 0 reduces and sends back):
        the server receives (N-1) * n bytes, then sends (N-1) * n bytes, one
        message at a time through its one link:
        T_ps = 2(N-1) * alpha + 2(N-1) * n * beta

    builtin (torch.distributed.all_reduce): gloo's CPU all_reduce runs a ring
        too (reduce-scatter + all-gather, in pipelined segments), so the same
        formula as the ring; NCCL picks ring or tree by size.

The ring's bandwidth term tends to 2 * n * beta however many ranks join; the
server's grows linearly with N. Both pay 2(N-1) latencies, which is why small
messages (where alpha dominates) scale badly with either.

Byte counting is the same for every algorithm (``bytes_sent``): the bytes the
busiest rank sends, which equal the bytes it receives. The beta coefficient
(``bytes_per_rank``) is different on purpose: a ring rank sends and receives
at the same time (full-duplex link), the server first receives everything and
then sends everything, so its two directions add up.

``fit_pingpong`` fits alpha and beta ONCE, from the one-way time of plain
send/recv messages between two ranks (beta from the large messages, alpha from
the small ones); ``predict`` then predicts every algorithm from those two
numbers, with nothing fitted to the all-reduces. ``bus_bandwidth_model`` is the
bus bandwidth the ring formula predicts, to set beside published NCCL figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AlphaBeta",
    "ALGORITHMS",
    "steps",
    "bytes_per_rank",
    "predict",
    "fit",
    "fit_pingpong",
    "bytes_sent",
    "bus_bandwidth",
    "bus_bandwidth_model",
]

ALGORITHMS = ("ring", "ps", "builtin")


@dataclass(frozen=True)
class AlphaBeta:
    """Fitted (or assumed) link parameters."""

    alpha: float  # seconds per message
    beta: float  # seconds per byte

    @property
    def bandwidth(self) -> float:
        """Bytes per second (1 / beta); inf if beta is 0."""
        return float("inf") if self.beta <= 0 else 1.0 / self.beta

    def __str__(self) -> str:
        return f"alpha = {self.alpha * 1e6:.1f} us, bandwidth = {self.bandwidth / 1e9:.2f} GB/s"


def _check(algo: str, world: int) -> None:
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}: use one of {ALGORITHMS}")
    if world < 1:
        raise ValueError(f"number of ranks must be >= 1, got {world}")


def steps(algo: str, world: int) -> int:
    """Messages on the critical path (the coefficient of alpha)."""
    _check(algo, world)
    return 2 * (world - 1)


def bytes_per_rank(algo: str, n_bytes: float, world: int) -> float:
    """Bytes the busiest rank sends (ring: every rank; ps: the server).

    This is the coefficient of beta: the bytes that go one after the other
    through one rank's link.
    """
    _check(algo, world)
    if algo in ("ring", "builtin"):
        return 2 * (world - 1) / world * n_bytes  # sends overlap receives
    return 2 * (world - 1) * n_bytes  # server: receives (N-1)n, then sends (N-1)n


def bytes_sent(algo: str, n_bytes: float, world: int) -> float:
    """Bytes the busiest rank sends in one all-reduce (it receives as many).

    ring/builtin: 2(N-1) chunks of n/N; parameter server: n to each of N-1 workers.
    """
    _check(algo, world)
    if algo in ("ring", "builtin"):
        return 2 * (world - 1) / world * n_bytes
    return (world - 1) * n_bytes


def bus_bandwidth(n_bytes, world, seconds):
    """NCCL-tests' bus bandwidth of an all-reduce: 2(N-1)/N * n / t, in bytes per second.

    The same formula for every algorithm: the bytes per rank an optimal
    all-reduce must move, over the time this one took. It can be compared
    with a link's bandwidth (1/beta) whatever algorithm ran.
    """
    n, w, t = (np.asarray(v, dtype=float) for v in (n_bytes, world, seconds))
    out = 2 * (w - 1) / w * n / t
    return float(out) if out.ndim == 0 else out


def bus_bandwidth_model(algo: str, n_bytes, world, ab: AlphaBeta):
    """The bus bandwidth ``algo`` would show if its time were the model's: for the ring,
    ``n_half = N alpha / beta`` is where it reaches half of ``1/beta``, and it never
    depends on N beyond that; for the parameter server it falls as ``1/N``."""
    return bus_bandwidth(n_bytes, world, predict(algo, n_bytes, world, ab))


def fit_pingpong(
    n_bytes: Sequence[float], seconds: Sequence[float], large_from: float = 1 << 20
) -> AlphaBeta:
    """alpha and beta of one message, from one-way send/recv times ``T = alpha + n * beta``.

    Each number comes from the messages it governs. beta is the slope of a straight line
    through the large messages (``n >= large_from``; at least the two largest sizes), where
    bandwidth sets the time; alpha is then the median of ``T - n * beta`` over the small
    ones, where latency does. One least-squares line through every size would let the many
    latency-bound points tilt the slope: on a 2-core VM that put beta 11 % low at 16 MiB.
    """
    n = np.asarray(n_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n.shape != t.shape or n.ndim != 1 or len(set(n.tolist())) < 2:
        raise ValueError("need one-way times at two or more different message sizes")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive seconds")
    sizes = np.unique(n)
    cut = min(float(large_from), float(sizes[-2]))  # at least two sizes set the slope
    big, small = n >= cut, n < cut
    slope, intercept = np.polyfit(n[big], t[big], 1)
    beta = max(float(slope), 0.0)
    alpha = float(np.median(t[small] - n[small] * beta)) if small.any() else float(intercept)
    return AlphaBeta(alpha=max(alpha, 0.0), beta=beta)


def predict(algo: str, n_bytes, world, ab: AlphaBeta):
    """Model time in seconds; ``n_bytes`` and ``world`` may be arrays (broadcast)."""
    n = np.asarray(n_bytes, dtype=float)
    w = np.asarray(world)
    a = np.vectorize(lambda k: steps(algo, int(k)))(w)
    b = np.vectorize(lambda nb, k: bytes_per_rank(algo, nb, int(k)))(n, w)
    out = a * ab.alpha + b * ab.beta
    return float(out) if out.ndim == 0 else out


def fit(
    algo: str,
    n_bytes: Sequence[float],
    world: Sequence[int],
    seconds: Sequence[float],
    relative: bool = True,
) -> AlphaBeta:
    """Least-squares alpha and beta from measured all-reduce times.

    Each measurement gives one equation ``steps * alpha + bytes * beta = t``.
    relative=True divides each equation by its t, so a 1 KB message (latency
    bound, ~100 us) counts as much as a 16 MB one (bandwidth bound, ~10 ms);
    otherwise the largest messages decide everything and alpha comes out as noise.
    Negative estimates (possible with noisy data) are clipped to 0.
    """
    n = np.asarray(n_bytes, dtype=float)
    w = np.asarray(world, dtype=int)
    t = np.asarray(seconds, dtype=float)
    if not (n.shape == w.shape == t.shape) or n.ndim != 1:
        raise ValueError("n_bytes, world and seconds must be 1-D sequences of the same length")
    if len(t) < 2:
        raise ValueError("need at least two measurements to fit alpha and beta")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive seconds")
    # A: (m, 2) design matrix, columns = coefficients of alpha and beta.
    a_col = np.array([steps(algo, int(k)) for k in w], dtype=float)
    b_col = np.array([bytes_per_rank(algo, nb, int(k)) for nb, k in zip(n, w, strict=True)])
    if np.linalg.matrix_rank(np.stack([a_col, b_col], axis=1)) < 2:
        raise ValueError(
            "alpha and beta cannot be separated: measure at least two message sizes "
            "(and more than one rank)"
        )
    weight = 1.0 / t if relative else np.ones_like(t)
    design = np.stack([a_col * weight, b_col * weight], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    return AlphaBeta(alpha=max(float(alpha), 0.0), beta=max(float(beta), 0.0))
