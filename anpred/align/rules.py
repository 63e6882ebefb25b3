"""The alignment rule language: validate, describe and apply one rule to a backend tensor.

A rule is a JSON dict (used by manifest pins, backend-reported transforms, native-mapping transforms and
the decisions of :class:`anpred.align.aligner.Aligner`); its steps are applied in this order:

* ``"cast": "bfloat16"`` -- reinterpret 2-byte void data as ``ml_dtypes.bfloat16`` (npz round trip),
  ``"float16"`` is informational (widening to float64 always happens);
* ``"dequantize": {"scale": s, "zero_point": z, "axis": k}`` -- ``(q - z) * s`` (ONNX
  ``DequantizeLinear`` semantics; per-tensor when ``axis`` is absent, per-axis lists otherwise);
* ``"view": [d0, d1, ...]`` -- reshape the backend tensor first (C order);
* ``"permute": [p0, p1, ...]`` -- ``numpy.transpose(x, p)`` (NHWC -> NCHW is ``[0, 3, 1, 2]``);
* ``"reshape": true`` -- reshape (C order) to the canonical shape (flatten, size-1 dims);
* ``"segments": {"axis": a, "order": [[start, length], ...]}`` -- canonical tensor is the
  concatenation along ``a`` of the backend slices ``[start, start + length)`` in that order;
* ``"exclude": "reason"`` -- (pins only) never align this anchor for this backend.

Contract: :func:`validate_rule` checks the form of a rule (raising :class:`AlignmentError`, one message
naming where the rule came from); :func:`apply_rule` applies a valid rule and raises ``ValueError`` when it
does not fit the tensor; :func:`describe_rule` is the one human wording of a rule (reports and notes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anpred.errors import AnpredError

__all__ = [
    "AlignmentError",
    "RULE_KEYS",
    "CASTS",
    "LAYOUT_PAIRS",
    "validate_rule",
    "is_identity",
    "describe_rule",
    "apply_rule",
    "layout_permutation",
]

#: channels-first layout -> channels-last layout (used to infer permutations from layout hints).
LAYOUT_PAIRS = {"NCW": "NWC", "NCHW": "NHWC", "NCDHW": "NDHWC"}

#: the keys a rule may have (module docstring).
RULE_KEYS = ("cast", "dequantize", "view", "permute", "reshape", "segments", "exclude")
#: the dtypes ``cast`` may name.
CASTS = ("float16", "bfloat16", "float32", "float64")


class AlignmentError(AnpredError):
    """A pinned or reported alignment rule is malformed (unknown key, wrong permutation)."""


def validate_rule(rule: dict[str, Any], where: str) -> dict[str, Any]:
    """Check a rule dict (the rule language: module docstring); return a normalised copy.

    Checked: only known keys; ``permute`` a list of ints that is a permutation of ``0..n-1``; ``view`` a
    list of non-negative ints; ``reshape`` a bool; ``cast`` one of ``float16``/``bfloat16``/``float32``/
    ``float64``; ``dequantize`` a dict with a finite non-zero ``scale`` (number or list), optional
    ``zero_point`` (number or list of the same length) and ``axis`` (int >= 0, required with per-axis
    lists); ``segments`` an ``axis`` >= 0 and an ``order`` of ``[start, length]`` pairs (length >= 1)
    that tile ``0..N-1`` exactly once (a bijection: no slice repeated, none dropped); ``exclude`` a
    non-empty reason string. Whether the rule fits a tensor's shape is checked when it is applied.

    Raises:
        AlignmentError: one message naming ``where`` and what is wrong.
    """
    if not isinstance(rule, dict):
        raise AlignmentError(f"{where}: alignment rule must be a dict, got {type(rule).__name__} {rule!r}")
    unknown = sorted(set(rule) - set(RULE_KEYS))
    if unknown:
        raise AlignmentError(f"{where}: unknown alignment rule key(s) {unknown}; known: {', '.join(RULE_KEYS)}")
    out = dict(rule)
    if "exclude" in out and not (isinstance(out["exclude"], str) and out["exclude"].strip()):
        raise AlignmentError(f"{where}: 'exclude' must be a non-empty reason string, got {out['exclude']!r}")
    if "cast" in out and out["cast"] not in CASTS:
        raise AlignmentError(f"{where}: 'cast' must be one of {', '.join(CASTS)}, got {out['cast']!r}")
    if "reshape" in out and not isinstance(out["reshape"], bool):
        raise AlignmentError(f"{where}: 'reshape' must be true or false, got {out['reshape']!r}")
    if "permute" in out:
        p = _int_list(out["permute"], "permute", where, minimum=0)
        if sorted(p) != list(range(len(p))):
            raise AlignmentError(f"{where}: 'permute' {out['permute']} is not a permutation of 0..{len(p) - 1}")
        out["permute"] = p
    if "view" in out:
        out["view"] = _int_list(out["view"], "view", where, minimum=0)
    if "segments" in out:
        out["segments"] = _validate_segments(out["segments"], where)
    if "dequantize" in out:
        out["dequantize"] = _validate_dequantize(out["dequantize"], where)
    return out


def _int_value(v: Any, what: str, where: str, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise AlignmentError(f"{where}: {what} must be an integer, got {v!r}")
    if minimum is not None and int(v) < minimum:
        raise AlignmentError(f"{where}: {what} must be >= {minimum}, got {v}")
    return int(v)


def _int_list(v: Any, what: str, where: str, minimum: int | None = None) -> list[int]:
    if not isinstance(v, (list, tuple)) or not v:
        raise AlignmentError(f"{where}: '{what}' must be a non-empty list of integers, got {v!r}")
    return [_int_value(i, f"'{what}' entry", where, minimum) for i in v]


def _validate_segments(seg: Any, where: str) -> dict[str, Any]:
    form = "{'axis': a, 'order': [[start, length], ...]}"
    if (
        not isinstance(seg, dict)
        or set(seg) != {"axis", "order"}
        or not isinstance(seg["order"], (list, tuple))
        or not seg["order"]
    ):
        raise AlignmentError(f"{where}: 'segments' must be {form}, got {seg!r}")
    axis = _int_value(seg["axis"], "segments 'axis'", where, minimum=0)
    order = []
    for pair in seg["order"]:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise AlignmentError(f"{where}: 'segments' order entries must be [start, length], got {pair!r}")
        order.append([_int_value(pair[0], "segment start", where, 0), _int_value(pair[1], "segment length", where, 1)])
    nxt = 0
    for st, n in sorted(order):
        if st != nxt:
            what = "overlap (a slice used twice)" if st < nxt else f"gap (slices {nxt}..{st - 1} dropped)"
            raise AlignmentError(
                f"{where}: 'segments' order {order} is not a bijection of "
                f"0..{sum(n for _, n in order) - 1}: "
                f"{what} at {st}; every slice must appear exactly once"
            )
        nxt = st + n
    return {"axis": axis, "order": order}


def _validate_dequantize(q: Any, where: str) -> dict[str, Any]:
    form = "{'scale': s, 'zero_point': z, 'axis': k} (scale required; lists with axis for per-axis)"
    if not isinstance(q, dict) or "scale" not in q or set(q) - {"scale", "zero_point", "axis"}:
        raise AlignmentError(f"{where}: 'dequantize' must be {form}, got {q!r}")

    def numbers(v, what, nonzero):
        vals = v if isinstance(v, (list, tuple)) else [v]
        if not vals or any(
            isinstance(x, bool)
            or not isinstance(x, (int, float, np.integer, np.floating))
            or not math.isfinite(float(x))
            or (nonzero and float(x) == 0.0)
            for x in vals
        ):
            raise AlignmentError(
                f"{where}: dequantize '{what}' must be a finite{' non-zero' if nonzero else ''} "
                f"number or a non-empty list of them, got {v!r}"
            )
        return (
            [float(x) if what == "scale" else x for x in vals]
            if isinstance(v, (list, tuple))
            else (float(v) if what == "scale" else v)
        )

    out: dict[str, Any] = {"scale": numbers(q["scale"], "scale", True)}
    if "zero_point" in q:
        out["zero_point"] = numbers(q["zero_point"], "zero_point", False)
    if q.get("axis") is not None:
        out["axis"] = _int_value(q["axis"], "dequantize 'axis'", where, minimum=0)
    lists = [k for k in ("scale", "zero_point") if isinstance(out.get(k), list)]
    if lists and "axis" not in out:
        raise AlignmentError(f"{where}: dequantize with per-axis {' and '.join(lists)} lists needs 'axis'")
    if (
        isinstance(out["scale"], list)
        and isinstance(out.get("zero_point"), list)
        and len(out["scale"]) != len(out["zero_point"])
    ):
        raise AlignmentError(
            f"{where}: dequantize 'scale' ({len(out['scale'])}) and 'zero_point' "
            f"({len(out['zero_point'])}) lists differ in length"
        )
    return out


def is_identity(rule: dict[str, Any]) -> bool:
    """True when ``rule`` changes neither values nor layout (a float16/float32 widening counts as a
    change only for ``cast``)."""
    return not any(k in rule for k in ("cast", "dequantize", "view", "permute", "reshape", "segments", "exclude"))


def describe_rule(rule: dict[str, Any]) -> str:
    """A short human description, e.g. ``permute [0, 3, 1, 2] + reshape``."""
    if not rule:
        return "identity"
    parts = []
    if "exclude" in rule:
        return f"excluded ({rule['exclude']})"
    if "cast" in rule:
        parts.append(f"widen {rule['cast']}")
    if "dequantize" in rule:
        q = rule["dequantize"]
        ax = f", axis {q['axis']}" if q.get("axis") is not None else ""
        parts.append(f"dequantize (scale {_short(q.get('scale'))}, zero point {_short(q.get('zero_point', 0))}{ax})")
    if "view" in rule:
        parts.append(f"view {rule['view']}")
    if "permute" in rule:
        parts.append(f"permute {rule['permute']}")
    if rule.get("reshape"):
        parts.append("reshape")
    if "segments" in rule:
        s = rule["segments"]
        order = s["order"]
        shown = ", ".join(f"{a}:{a + n}" for a, n in order[:8]) + (" ..." if len(order) > 8 else "")
        parts.append(f"segments axis {s['axis']} [{shown}]")
    return " + ".join(parts)


def _short(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return f"[{len(v)} values]" if len(v) > 3 else str([_short(x) for x in v])
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def apply_rule(rule: dict[str, Any], x: np.ndarray, canonical_shape: tuple[int, ...] | None) -> np.ndarray:
    """Apply ``rule`` to the backend tensor ``x``; return a float64 array.

    Args:
        rule: see the module docstring.
        x: the backend's array (any dtype; 2-byte void data is read as bfloat16 when ``cast`` says so).
        canonical_shape: the concrete canonical shape (needed by ``reshape``).

    Raises:
        ValueError: the rule does not fit the array (wrong rank, element count, segment bounds).
    """
    a = np.asarray(x)
    if rule.get("cast") == "bfloat16" and a.dtype.type is np.void and a.dtype.itemsize == 2:
        import ml_dtypes

        a = a.view(ml_dtypes.bfloat16)
    if "dequantize" in rule:
        q = rule["dequantize"]
        scale = np.asarray(q["scale"], dtype=np.float64)
        zp = np.asarray(q.get("zero_point", 0), dtype=np.float64)
        axis = q.get("axis")
        if axis is not None and not 0 <= int(axis) < a.ndim:
            raise ValueError(f"dequantize axis {axis} out of range for shape {list(a.shape)}")
        if axis is not None and scale.ndim == 1:
            shp = [1] * a.ndim
            shp[int(axis)] = -1
            scale = scale.reshape(shp)
            zp = zp.reshape(shp) if zp.ndim == 1 else zp
        a = (a.astype(np.float64) - zp) * scale
    elif a.dtype.type is np.void:
        raise ValueError(f"raw {a.dtype} data: say how to read it ('cast': 'bfloat16')")
    a = a.astype(np.float64, copy=False)
    if "view" in rule:
        a = a.reshape(rule["view"])
    if "permute" in rule:
        if len(rule["permute"]) != a.ndim:
            raise ValueError(
                f"permute {rule['permute']} needs rank {len(rule['permute'])}, tensor has shape {list(a.shape)}"
            )
        a = np.transpose(a, rule["permute"])
    if rule.get("reshape"):
        if canonical_shape is None:
            raise ValueError("reshape needs the canonical shape")
        if a.size != math.prod(canonical_shape):
            raise ValueError(f"cannot reshape {list(a.shape)} ({a.size} elements) to {list(canonical_shape)}")
        a = a.reshape(canonical_shape)
    if "segments" in rule:
        s = rule["segments"]
        ax = s["axis"]
        if ax >= a.ndim or sum(n for _, n in s["order"]) != a.shape[ax]:
            raise ValueError(f"segments {s} do not cover axis {ax} of shape {list(a.shape)}")
        idx = np.concatenate([np.arange(st, st + n) for st, n in s["order"]])
        a = np.take(a, idx, axis=ax)
    # (np.ascontiguousarray makes a 0-d array 1-d: a scalar output, e.g. a loss, then never fitted)
    return np.asarray(a, dtype=np.float64, order="C")


def layout_permutation(src: str, dst: str) -> list[int] | None:
    """``numpy.transpose`` axes turning a ``src``-layout tensor into ``dst`` layout (e.g. ``NHWC`` to
    ``NCHW`` gives ``[0, 3, 1, 2]``); None when the layouts are not permutations of each other."""
    if not src or not dst or len(src) != len(dst) or sorted(src) != sorted(dst) or len(set(src)) != len(src):
        return None
    return [src.index(ch) for ch in dst]
