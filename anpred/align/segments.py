"""Segment-order search by data: is a backend tensor the reference cut into a few blocks put in another order?

A backend that runs a native graph of its own (a port) may concatenate channels or detection heads in
another order than the ONNX graph. :func:`find_segment_permutation` looks, along the given axes only, for
a permutation of whole contiguous blocks (at most :data:`SEGMENT_MAX_BLOCKS`, each of substantial size)
that maps every slice decisively onto one reference slice and makes the whole tensor close; a wrong
tensor matches nothing, so a real error is never explained away. :func:`channel_axis` names the one axis
the aligner lets it search. The result is a ``segments`` rule (:mod:`anpred.align.rules`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anpred.align.distance import normalized_error

__all__ = ["SEGMENT_MAX_BLOCKS", "SEGMENT_MIN_BLOCK_FRACTION", "channel_axis", "find_segment_permutation"]

#: segment search limits: at most this many contiguous blocks ...
SEGMENT_MAX_BLOCKS = 8
#: ... each at least ``max(2, ceil(n * SEGMENT_MIN_BLOCK_FRACTION))`` slices long (n: the axis length).
SEGMENT_MIN_BLOCK_FRACTION = 1 / 32


def channel_axis(layout: str | None, rank: int) -> int | None:
    """The axis segment search may reorder: ``C`` of a known layout of that rank (``NCHW`` -> 1,
    ``NHWC`` -> 3), else axis 1 (the ONNX channel/feature axis), axis 0 for rank 1, None for scalars."""
    lay = str(layout or "").upper()
    if len(lay) == rank and lay.count("C") == 1:
        return lay.index("C")
    if rank >= 2:
        return 1
    return 0 if rank == 1 else None


def find_segment_permutation(
    x: np.ndarray,
    m: np.ndarray,
    close_tol: float = 0.5,
    min_margin: float = 4.0,
    max_axis: int = 16384,
    *,
    axes: list[int] | None = None,
    max_blocks: int = SEGMENT_MAX_BLOCKS,
    min_block_fraction: float = SEGMENT_MIN_BLOCK_FRACTION,
) -> tuple[dict[str, Any], float] | None:
    """Find an axis along which ``x`` is ``m`` cut into a few contiguous blocks put in another order.

    Each slice ``x[i]`` goes to the one ``m[j]`` it matches decisively (error <= ``close_tol``, every
    other slice at least ``min_margin`` times farther); when no match is decisive (duplicate slices) it
    keeps its place if ``m[i]`` is among the tied best; otherwise there is no permutation. The map must
    be a bijection, move at least one slice, consist of at most ``max_blocks`` contiguous runs, each at
    least ``max(2, ceil(n * min_block_fraction))`` slices long (``n``: the axis length; so a flip, a
    scatter of single slices never qualifies; a shift by one slice neither), and the permuted tensor must
    have normalised error <= ``close_tol`` and be ``min_margin`` times closer than ``x``. Slice errors
    use ``||x_i - m_j|| / ||m_j - mean(m)||`` (denominator floored at 1e-6 of the mean slice energy).

    Args:
        x, m: same shape, finite (float64 after conversion).
        axes: the axes to search (default: all).

    Returns:
        ``({"axis": a, "order": [[start, length], ...]}, error_after)`` or None (no decisive fit).
    """
    x = np.asarray(x, np.float64)
    m = np.asarray(m, np.float64)
    if x.shape != m.shape or not np.all(np.isfinite(x)) or not np.all(np.isfinite(m)):
        return None
    e0 = normalized_error(x, m)
    best = None
    gm = float(m.mean()) if m.size else 0.0
    for axis in range(x.ndim) if axes is None else axes:
        if not 0 <= axis < x.ndim:
            continue
        n = x.shape[axis]
        min_block = max(2, math.ceil(n * min_block_fraction))
        if n < 2 * min_block or n > max_axis:
            continue
        A = np.moveaxis(x, axis, 0).reshape(n, -1)
        M = np.moveaxis(m, axis, 0).reshape(n, -1)
        den = np.sum((M - gm) ** 2, axis=1)
        den = np.maximum(den, 1e-6 * float(den.mean()) + 1e-300)
        a2 = np.sum(A * A, axis=1)
        m2 = np.sum(M * M, axis=1)
        target = np.empty(n, dtype=np.int64)
        ok = True
        chunk = max(1, min(n, (1 << 22) // max(n, 1)))  # <= 32 MB of float64 per block
        for s in range(0, n, chunk):
            d2 = a2[s : s + chunk, None] + m2[None, :] - 2.0 * (A[s : s + chunk] @ M.T)
            r = np.sqrt(np.maximum(d2, 0.0) / den[None, :])
            for k in range(r.shape[0]):
                i = s + k
                row = r[k]
                j = int(np.argmin(row))
                bj = float(row[j])
                row2 = row.copy()
                row2[j] = np.inf
                sj = float(row2.min()) if n > 1 else np.inf
                if bj <= close_tol and sj >= min_margin * bj and sj > 0:
                    target[i] = j  # one decisive match
                elif row[i] <= close_tol and (row[i] == bj or row[i] < min_margin * bj):
                    target[i] = i  # its own place is among the (tied) best: keep it
                else:
                    ok = False
                    break
            if not ok:
                break
        if not ok or len(set(target.tolist())) != n or np.all(target == np.arange(n)):
            continue
        idx = np.empty(n, dtype=np.int64)
        idx[target] = np.arange(n)  # canonical slice j comes from backend slice idx[j]
        runs = _runs(idx)
        if len(runs) > max_blocks or min(length for _, length in runs) < min_block:
            continue  # not a reordering of a few substantial blocks (a flip, a shift, a scatter)
        y = np.take(x, idx, axis=axis)
        e1 = normalized_error(y, m)
        if e1 <= close_tol and e0 >= min_margin * e1 and (best is None or e1 < best[1]):
            best = ({"axis": axis, "order": runs}, e1)
    return best


def _runs(idx: np.ndarray) -> list[list[int]]:
    out: list[list[int]] = []
    for v in idx.tolist():
        if out and out[-1][0] + out[-1][1] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out
