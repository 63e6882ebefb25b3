"""The one distance of the alignment step: the normalised error between two tensors.

``e(x, m) = ||x - m||_2 / ||m - mean(m)||_2`` over positions where both are finite (dimensionless,
formula chosen here; the denominator falls back to ``||m||_2``, then 1, when zero). An independent tensor
with the same value distribution gives ``e ~ sqrt(2)``, the constant ``mean(m)`` gives 1, fp32 noise
``~1e-7``. The aligner's data decisions and the segment search compare candidates with it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["normalized_error"]


def normalized_error(x: np.ndarray, m: np.ndarray) -> float:
    """``||x - m|| / ||m - mean(m)||`` over positions finite in both (module docstring).

    Returns ``inf`` when the finite masks disagree on more than 1 % of positions or shapes differ."""
    if x.shape != m.shape:
        return math.inf
    fx, fm = np.isfinite(x), np.isfinite(m)
    both = fx & fm
    if x.size and np.count_nonzero(fx != fm) > 0.01 * x.size:
        return math.inf
    if not both.any():
        return 0.0 if np.array_equal(x, m, equal_nan=True) else math.inf
    xv, mv = x[both], m[both]
    num = _norm(xv - mv)
    den = _norm(mv - mv.mean()) or _norm(mv) or 1.0
    return num / den


def _norm(v: np.ndarray) -> float:
    """Euclidean norm without BLAS (``np.linalg.norm`` goes through BLAS ``dot``, which stalls when
    another runtime's thread pool in the process holds the cores)."""
    return math.sqrt(float(np.sum(np.square(v))))
