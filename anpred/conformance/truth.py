"""Ground truth: a backend's outputs against a case's expected outputs, with the suite's tolerance.

ONNX's runner passes an output when its shape and dtype equal the expected ones and
``numpy.testing.assert_allclose(out, ref, rtol, atol)`` holds, i.e. ``|out - ref| <= atol + rtol *
|ref|`` at every element with NaN matching NaN (``numpy.isclose(..., equal_nan=True)``;
``onnx/backend/test/runner/__init__.py``). :func:`compare` applies that test to the aligned
tensors (:mod:`anpred.align`: the backend's layout brought to the ONNX shape; float64 holding the
returned values exactly) and says by how much an output misses it. The dtype test is the runner's
too, except for a float64 execution (``precision == "fp64"``: its outputs are float64 by design) and
where the returned dtype is not known.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["OutputTruth", "compare", "truth_of"]


@dataclass
class OutputTruth:
    """One output of one backend against the expected one: ``ok`` (passes the suite's test),
    ``reason`` (why not), ``mismatched``/``size`` (elements outside the tolerance / all),
    ``max_abs`` (largest ``|out - ref|`` over finite pairs), ``max_excess`` (largest ``|out - ref| /
    (atol + rtol |ref|)``: above 1 fails; inf where the non-finite values differ)."""

    ok: bool
    reason: str = ""
    mismatched: int = 0
    size: int = 0
    max_abs: float = 0.0
    max_excess: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("max_abs", "max_excess"):
            d[k] = float(f"{d[k]:.4g}") if np.isfinite(d[k]) else str(d[k])
        return d


def compare(out: np.ndarray | None, ref: np.ndarray, rtol: float, atol: float, dtype: str | None = None) -> OutputTruth:
    """``out`` (aligned, any float dtype; None: not returned or not alignable) against ``ref`` with the
    suite's test (module docstring); ``dtype``: the dtype the backend returned (None: not checked)."""
    if out is None:
        return OutputTruth(False, "no output of the expected shape (not returned or not alignable)")
    if tuple(out.shape) != tuple(ref.shape):
        if out.size == ref.size:
            out = out.reshape(ref.shape)  # same elements (a rank the aligner kept): the values decide
        else:
            return OutputTruth(
                False, f"shape {list(out.shape)} where the suite expects {list(ref.shape)}", size=int(ref.size)
            )
    if ref.dtype.kind not in "fc":
        equal = np.asarray(out).astype(ref.dtype) == ref if np.all(np.isfinite(out)) else out == ref
        bad = int(np.size(equal) - np.count_nonzero(equal))
        return OutputTruth(bad == 0, "" if bad == 0 else f"{bad} of {ref.size} values differ", bad, int(ref.size))
    if dtype is not None and ref.dtype.name != "bfloat16" and np.dtype(dtype) != ref.dtype:
        return OutputTruth(False, f"dtype {dtype} where the suite expects {ref.dtype}", size=int(ref.size))
    if ref.dtype.name == "bfloat16":
        rtol = max(rtol, 2.0**-6)  # the runner's two bfloat16 ULPs
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    close = np.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
    bad = int(close.size - np.count_nonzero(close))
    both = np.isfinite(o) & np.isfinite(r)
    diff = np.abs(o - r)
    max_abs = float(diff[both].max()) if both.any() else 0.0
    excess = np.where(both, diff / (atol + rtol * np.abs(r)), 0.0)
    max_excess = float(excess.max()) if excess.size else 0.0
    if (~both & ~close).any():
        max_excess = float("inf")
    if bad == 0:
        return OutputTruth(True, "", 0, int(r.size), max_abs, max_excess)
    nonfinite = int((~both & ~close).sum())
    why = (
        f"{bad} of {r.size} elements outside rtol {rtol:g} / atol {atol:g} (max |diff| {max_abs:.3g}, "
        f"{max_excess:.3g}x the tolerance)"
        + (f"; {nonfinite} NaN/Inf where the suite expects otherwise" if nonfinite else "")
    )
    return OutputTruth(False, why, bad, int(r.size), max_abs, max_excess)


def truth_of(
    outputs: dict[str, np.ndarray | None],
    expected: dict[str, np.ndarray],
    rtol: float,
    atol: float,
    dtypes: dict[str, str] | None = None,
) -> tuple[bool, str, dict[str, dict[str, Any]]]:
    """All outputs of one backend: ``(matches, reason of the first failing output, per output
    :meth:`OutputTruth.to_dict`)``; ``outputs``/``expected``/``dtypes`` keyed alike (anchor names)."""
    per: dict[str, dict[str, Any]] = {}
    first = ""
    for name, ref in expected.items():
        t = compare(outputs.get(name), ref, rtol, atol, (dtypes or {}).get(name))
        per[name] = t.to_dict()
        if not t.ok and not first:
            first = f"{name}: {t.reason}" if len(expected) > 1 else t.reason
    return not first, first, per
