"""Element-wise voting of family tensors: the median of a few arrays and non-finite values voted on
(``docs/oracle.md``, "Non-finite values are voted on"). Used by :class:`anpred.judge.consensus.Oracle`."""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["median_of", "vote"]


def vote(
    arrays: list[np.ndarray], abstain: list[np.ndarray | None] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Element-wise consensus of family votes with non-finite values voted on (``docs/oracle.md``).

    Each element's votes fall in four classes: finite, NaN, +Inf, -Inf. The class most votes fall in
    wins: finite -> the median of the finite votes (:func:`median_of`), NaN/+Inf/-Inf -> that value. A
    tie between the largest classes (e.g. one NaN, one Inf, one finite; two NaN, two finite) is
    *undecided*: NaN in the result and True in the returned mask, judged for no one.

    Args:
        arrays: the family votes, equally shaped float64 arrays (at least one).
        abstain: per vote, a boolean mask of the elements where it abstains (a family whose own
            members tied there), or None; abstaining votes are not counted.

    Returns:
        ``(c, undecided)``: float64 array of the votes' shape; boolean mask or None when no element
        is undecided. Without any non-finite vote this is exactly :func:`median_of`.
    """
    if all(np.isfinite(a).all() for a in arrays) and not any(m is not None for m in (abstain or [])):
        return median_of(arrays), None
    stack = np.stack(arrays)
    present = np.ones(stack.shape, bool)
    for i, m in enumerate(abstain or []):
        if m is not None:
            present[i] = ~m
    isnan = np.isnan(stack) & present
    pinf, ninf = (stack == np.inf) & present, (stack == -np.inf) & present
    fin = np.isfinite(stack) & present
    counts = np.stack([fin.sum(0), isnan.sum(0), pinf.sum(0), ninf.sum(0)])
    top = counts.max(0)
    undecided = ((counts == top).sum(0) > 1) | (top == 0)
    cls = counts.argmax(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(np.where(fin, stack, np.nan), axis=0)
    c = np.select([cls == 0, cls == 1, cls == 2], [med, np.nan, np.inf], -np.inf).astype(np.float64)
    c[undecided] = np.nan
    return c, (undecided if undecided.any() else None)


def median_of(arrays: list[np.ndarray]) -> np.ndarray:
    """Element-wise median of a few equally shaped float64 arrays (``np.nanmedian(stack, axis=0)``).

    Without NaN and with at most 9 arrays it runs a compare-exchange sorting network of
    ``np.minimum``/``np.maximum`` (contiguous passes; identical results, faster than ``np.median``:
    docs/oracle.md, 'Measurements: statistics kernels'); otherwise ``np.nanmedian``."""
    n = len(arrays)
    if n == 1:
        return arrays[0]
    if n > 9 or any(np.isnan(a).any() for a in arrays):
        return np.nanmedian(np.stack(arrays), axis=0)
    if n == 2:
        return 0.5 * (arrays[0] + arrays[1])
    v = list(arrays)
    # bubble network: after pass i the largest i+1 values sit at the end; half the passes suffice
    need = n // 2 + 1
    for i in range(need):
        for j in range(n - 1 - i):
            lo, hi = np.minimum(v[j], v[j + 1]), np.maximum(v[j], v[j + 1])
            v[j], v[j + 1] = lo, hi
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
