"""Error statistics of one backend's tensor against a reference (the consensus), in float64.

:func:`error_stats` is the one place these statistics are defined; the oracle, the graph/run diff and
the reports all call it. Every statistic is computed on the positions where *both* the backend value
and the consensus are finite; non-finite values of the backend are counted (``nan``, ``inf``) and never
enter a statistic, so a NaN is reported, not propagated.

Formulas (``d = x - c`` over the finite positions, ``n`` of them; ``||.||`` is the Euclidean norm):

* ``max_abs = max |d|``, ``mean_abs = mean |d|``, ``mean_signed = mean d`` (bias; same unit as ``x``).
* ``nrmse = ||d|| / ||c||`` (normalised root-mean-square error; the oracle's primary statistic).
  0 when ``d == 0``; ``inf`` when ``||c|| == 0`` and ``d != 0``.
* ``snr_db = 10 log10(||c||^2 / ||d||^2)`` (signal-to-noise / SQNR in dB; ``inf`` when ``d == 0``).
  Equals ``-20 log10(nrmse)``.
* ``cosine = <x, c> / (||x|| ||c||)`` (1 when both are zero, 0 when only one is).
* ``wasserstein = W1(P_x, P_c) / std(c)``: the Wasserstein-1 (earth mover's) distance between the
  empirical value distributions of ``x`` and ``c`` (``scipy.stats.wasserstein_distance``), divided by
  the consensus' spread (standard deviation; ``max |c|`` when that is 0, and 1 when both are 0). It is
  blind to *where* values are and sees distribution shifts (a clipped tail, a biased mode).
* ``max_ulp = max |d| / ulp_dtype(c)``: the largest error in units in the last place of the backend's
  dtype at the consensus value (``numpy.spacing`` of ``|c|`` cast to that dtype; bfloat16 spacing is the
  float32 spacing times 2**16). Integer dtypes use an ULP of 1. ULPs near 0 are subnormal spacings, so
  ``max_ulp`` is huge wherever the consensus is 0 and the backend is not; read it with ``max_abs``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

# Accepted dtype spellings -> canonical name.
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "f32": "float32",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "f64": "float64", "double": "float64",
    "int8": "int8", "uint8": "uint8", "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool",
}


def canonical_dtype(dtype: str) -> str:
    """Canonical dtype name for ``dtype`` (``fp16`` -> ``float16``). Raises ValueError listing the known
    spellings when unknown."""
    key = str(dtype).lower()
    if key not in DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_ALIASES))}")
    return DTYPE_ALIASES[key]


@dataclass
class ErrorStats:
    """Statistics of a tensor ``x`` against a reference ``c`` (see the module docstring for formulas).

    Attributes:
        n: number of positions where both ``x`` and ``c`` are finite (the positions used).
        max_abs, mean_abs, mean_signed: absolute error statistics, in the tensor's unit.
        nrmse: ``||x-c||/||c||`` (dimensionless).
        snr_db: ``10 log10(||c||^2/||x-c||^2)`` in dB.
        cosine: cosine similarity of ``x`` and ``c`` (dimensionless, in [-1, 1]).
        wasserstein: W1 distance of the value distributions divided by ``std(c)``.
        max_ulp: max error in ULP of ``dtype`` at the reference value.
        nan, inf: counts of NaN / +-Inf in ``x`` (excluded from every statistic).
        nan_ref, inf_ref: counts of NaN / +-Inf in ``c`` (those positions are excluded too).
    """

    n: int
    max_abs: float
    mean_abs: float
    mean_signed: float
    nrmse: float
    snr_db: float
    cosine: float
    wasserstein: float
    max_ulp: float
    nan: int = 0
    inf: int = 0
    nan_ref: int = 0
    inf_ref: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ErrorStats":
        names = {f.name for f in fields(cls)}
        return cls(**{k: (_from_json_float(v) if k not in ("n", "nan", "inf", "nan_ref", "inf_ref") else int(v))
                       for k, v in d.items() if k in names})


def _json_float(v):
    """JSON has no inf/nan: encode them as strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _from_json_float(v):
    return float(v) if isinstance(v, str) else v


def ulp(values: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """Spacing (unit in the last place) of ``dtype`` at each of ``|values|`` (float64 array, same shape).

    float16/float32/float64 use ``numpy.spacing`` of the value cast to that dtype; bfloat16 (8-bit
    significand) uses the float32 spacing times 2**16; integer dtypes return 1.
    Raises ValueError for an unknown dtype.
    """
    dt = canonical_dtype(dtype)
    a = np.abs(np.asarray(values, dtype=np.float64))
    if dt in ("float16", "float32", "float64"):
        npdt = np.dtype(dt)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.minimum(a, np.finfo(npdt).max).astype(npdt)
        return np.spacing(cast).astype(np.float64)
    if dt == "bfloat16":
        cast = np.minimum(a, np.finfo(np.float32).max).astype(np.float32)
        return np.spacing(cast).astype(np.float64) * 65536.0
    return np.ones_like(a)


def error_stats(x: np.ndarray, c: np.ndarray, dtype: str = "float32") -> ErrorStats:
    """Statistics of ``x`` (a backend's aligned tensor) against ``c`` (the consensus or a reference).

    Args:
        x: any shape, any real dtype; converted to float64.
        c: same shape as ``x`` (or broadcastable to it); converted to float64.
        dtype: the backend's dtype for ``max_ulp`` (``float32``/``fp32``, ``float16``, ``bfloat16``,
            ``int8`` ...).

    Returns:
        :class:`ErrorStats`. With no finite position in common all float statistics are NaN and
        ``n == 0``.

    Raises:
        ValueError: shapes that cannot be broadcast together, or an unknown ``dtype``.
    """
    from scipy.stats import wasserstein_distance

    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    if x.shape != c.shape:
        try:
            x, c = np.broadcast_arrays(x, c)
        except ValueError as err:
            raise ValueError(f"error_stats: shapes {x.shape} and {c.shape} do not match") from err
    canonical_dtype(dtype)
    x = x.ravel()
    c = c.ravel()
    xnan, xinf = np.isnan(x), np.isinf(x)
    cnan, cinf = np.isnan(c), np.isinf(c)
    ok = ~(xnan | xinf | cnan | cinf)
    counts = dict(nan=int(xnan.sum()), inf=int(xinf.sum()), nan_ref=int(cnan.sum()), inf_ref=int(cinf.sum()))
    if not ok.all():
        x, c = x[ok], c[ok]
    n = int(x.size)
    if n == 0:
        nan = float("nan")
        return ErrorStats(0, nan, nan, nan, nan, nan, nan, nan, nan, **counts)
    d = x - c
    ad = np.abs(d)
    dd = float(d @ d)
    cc = float(c @ c)
    xx = float(x @ x)
    if dd == 0.0:
        nrmse, snr = 0.0, float("inf")
    elif cc == 0.0:
        nrmse, snr = float("inf"), float("-inf")
    else:
        nrmse = math.sqrt(dd / cc)
        snr = 10.0 * math.log10(cc / dd)
    if xx == 0.0 and cc == 0.0:
        cosine = 1.0
    elif xx == 0.0 or cc == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.clip(float(x @ c) / math.sqrt(xx * cc), -1.0, 1.0))
    spread = float(np.std(c))
    if spread == 0.0:
        spread = float(np.max(np.abs(c))) or 1.0
    if dd == 0.0:
        w = 0.0
    elif x.size == c.size:
        # equal-size, equal-weight samples: W1 = mean |x_(i) - c_(i)| over the sorted values (the
        # quantile-function form of W1; exact, and ~10x faster than scipy's CDF merge)
        w = float(np.mean(np.abs(np.sort(x) - np.sort(c)))) / spread
    else:
        w = float(wasserstein_distance(x, c)) / spread
    max_abs = float(ad.max())
    max_ulp = float(np.max(ad / ulp(c, dtype))) if max_abs > 0 else 0.0
    return ErrorStats(n=n, max_abs=max_abs, mean_abs=float(ad.mean()), mean_signed=float(d.mean()),
                      nrmse=nrmse, snr_db=snr, cosine=cosine, wasserstein=w, max_ulp=max_ulp, **counts)
