"""Anchor-level alignment: map every backend's anchor tensor onto the canonical representation.

The canonical representation of an anchor is the ONNX graph's: its shape (``anchor.shape``, symbolic
dims resolved per sample), its layout, compared in ``float64``. Backends hand back their own
representation (TensorFlow NHWC, a batch squeezed, a flattened view, float16/bfloat16, quantized int8)
and :class:`Aligner` reconciles them *before* the oracle, without ever hiding a real difference.

A decision is taken once per ``(anchor, backend)`` and reused for later samples, from, in order:

1. ``manifest`` -- a rule pinned in ``anchor.alignment[backend]`` (manual override);
2. ``capture`` -- ``statuses[backend].captures[anchor]["transform"]`` reported by the backend;
3. ``native`` -- ``anchor.native[backend]["transform"]`` recorded by the native mapping;
4. ``layout`` -- the capture's ``layout`` against ``anchor.layout`` (``NHWC`` -> ``NCHW`` ...);
5. ``shape`` -- shape inference as the fallback: the layout permutations (identity, channels-last to
   channels-first and back, with a batch of 1 added or squeezed), else any permutation of the non-1
   dims, else an order-preserving reshape (flatten) with the same element count;
6. ``data`` -- when several candidates of step 5 fit the shape (``C == H == W``), the candidate
   closest to the consensus of the other backends, if it is close (``error <= close_tol``) *and*
   decisively closer than the runner-up (``runner_up >= min_margin * error``); otherwise the anchor is
   *unaligned* for that backend on that sample (retried on the next one), never forced.

A manifest pin is the user's explicit instruction: if it does not fit the tensor, the anchor is
*unaligned* for that backend with the reason (never replaced by another rule); pins are validated
when the :class:`Aligner` is made, and pins naming an unknown backend are reported as warnings.

After the layout is fixed, a backend that runs a *native graph of its own* (``torch-native``,
``tf-native``, or an unregistered backend whose capture status is not ``exact``) and whose tensor is
far from the reference consensus is searched for a *segment permutation* (channels or concatenated
heads in another order) along the anchor's channel axis only. Backends that execute the ONNX graph
(``ort*``, ``openvino*``, ``onnx-reference``, ``torch`` via onnx2torch, ``tf`` via onnx2tf) compute the
same tensor by construction: a reordering there is a defect, so they are never searched, and neither
is an anchor under a manifest pin. A permutation is accepted only if every moved slice matches exactly
one consensus slice closely and decisively (same two thresholds, per slice), it consists of at most
``SEGMENT_MAX_BLOCKS`` contiguous blocks of substantial size, and the whole permuted tensor is close;
a wrong tensor matches nothing and stays as it is (different), so the oracle sees the real error. An
accepted segment order is recorded with ``source="data"`` and listed by
:attr:`AlignmentReport.segments_by_data` (``anpred check`` adds a note per anchor and backend).

Distance used everywhere (dimensionless, formula chosen here): the *normalised error*
``e(x, m) = ||x - m||_2 / ||m - mean(m)||_2`` over positions where both are finite (the denominator
falls back to ``||m||_2``, then 1, when zero). An independent tensor with the same value distribution
gives ``e ~ sqrt(2)``, the constant ``mean(m)`` gives 1, fp32 noise ``~1e-7``.

Rule language (a JSON dict, also used by pins and transforms; steps applied in this order):

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
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.errors import AnpredError
from anpred.manifest import Anchor, AnchorManifest

SCHEMA = "anpred.alignment/1"

#: families whose backends execute the ONNX graph itself: their tensors are canonical by definition.
ONNX_FAMILIES = frozenset({"onnxruntime", "openvino", "onnx-reference"})

#: backends that execute the anchored ONNX graph itself, directly or through a converter of that graph
#: (onnx2tf for ``tf``, onnx2torch for ``torch``): they compute the same tensor by construction, so a
#: channel/segment reordering there is a defect and is never searched for.
ONNX_GRAPH_BACKENDS = frozenset({"ort", "ort-noopt", "ort-fp16", "ort-int8", "openvino", "openvino-bf16",
                                 "onnx-reference", "torch", "tf"})
#: backends that run a separate native graph (a port may concatenate heads/channels in another order).
NATIVE_BACKENDS = frozenset({"torch-native", "tf-native"})
#: segment search limits: at most this many contiguous blocks ...
SEGMENT_MAX_BLOCKS = 8
#: ... each at least ``max(2, ceil(n * SEGMENT_MIN_BLOCK_FRACTION))`` slices long (n: the axis length).
SEGMENT_MIN_BLOCK_FRACTION = 1 / 32

#: channels-first layout -> channels-last layout (used to infer permutations from layout hints).
LAYOUT_PAIRS = {"NCW": "NWC", "NCHW": "NHWC", "NCDHW": "NDHWC"}

_RULE_KEYS = ("cast", "dequantize", "view", "permute", "reshape", "segments", "exclude")


class AlignmentError(AnpredError):
    """A pinned or reported alignment rule is malformed (unknown key, wrong permutation)."""


class _Unaligned(Exception):
    """Internal: this (anchor, backend) cannot be aligned; the message is the reason (with shapes)."""


# ---------------------------------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------------------------------
def validate_rule(rule: dict[str, Any], where: str) -> dict[str, Any]:
    """Check a rule dict (see the module docstring); return a normalised copy.

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
    unknown = sorted(set(rule) - set(_RULE_KEYS))
    if unknown:
        raise AlignmentError(f"{where}: unknown alignment rule key(s) {unknown}; known: {', '.join(_RULE_KEYS)}")
    out = dict(rule)
    if "exclude" in out and not (isinstance(out["exclude"], str) and out["exclude"].strip()):
        raise AlignmentError(f"{where}: 'exclude' must be a non-empty reason string, got {out['exclude']!r}")
    if "cast" in out and out["cast"] not in _CASTS:
        raise AlignmentError(f"{where}: 'cast' must be one of {', '.join(_CASTS)}, got {out['cast']!r}")
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


_CASTS = ("float16", "bfloat16", "float32", "float64")


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
    if not isinstance(seg, dict) or set(seg) != {"axis", "order"} or not isinstance(seg["order"], (list, tuple)) \
            or not seg["order"]:
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
            raise AlignmentError(f"{where}: 'segments' order {order} is not a bijection of 0..{sum(n for _, n in order) - 1}: "
                                 f"{what} at {st}; every slice must appear exactly once")
        nxt = st + n
    return {"axis": axis, "order": order}


def _validate_dequantize(q: Any, where: str) -> dict[str, Any]:
    form = "{'scale': s, 'zero_point': z, 'axis': k} (scale required; lists with axis for per-axis)"
    if not isinstance(q, dict) or "scale" not in q or set(q) - {"scale", "zero_point", "axis"}:
        raise AlignmentError(f"{where}: 'dequantize' must be {form}, got {q!r}")

    def numbers(v, what, nonzero):
        vals = v if isinstance(v, (list, tuple)) else [v]
        if not vals or any(isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating))
                           or not math.isfinite(float(x)) or (nonzero and float(x) == 0.0) for x in vals):
            raise AlignmentError(f"{where}: dequantize '{what}' must be a finite{' non-zero' if nonzero else ''} "
                                 f"number or a non-empty list of them, got {v!r}")
        return [float(x) if what == "scale" else x for x in vals] if isinstance(v, (list, tuple)) else \
            (float(v) if what == "scale" else v)

    out: dict[str, Any] = {"scale": numbers(q["scale"], "scale", True)}
    if "zero_point" in q:
        out["zero_point"] = numbers(q["zero_point"], "zero_point", False)
    if q.get("axis") is not None:
        out["axis"] = _int_value(q["axis"], "dequantize 'axis'", where, minimum=0)
    lists = [k for k in ("scale", "zero_point") if isinstance(out.get(k), list)]
    if lists and "axis" not in out:
        raise AlignmentError(f"{where}: dequantize with per-axis {' and '.join(lists)} lists needs 'axis'")
    if isinstance(out["scale"], list) and isinstance(out.get("zero_point"), list) and \
            len(out["scale"]) != len(out["zero_point"]):
        raise AlignmentError(f"{where}: dequantize 'scale' ({len(out['scale'])}) and 'zero_point' "
                             f"({len(out['zero_point'])}) lists differ in length")
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
            raise ValueError(f"permute {rule['permute']} needs rank {len(rule['permute'])}, tensor has shape {list(a.shape)}")
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
    return np.ascontiguousarray(a, dtype=np.float64)


def layout_permutation(src: str, dst: str) -> list[int] | None:
    """``numpy.transpose`` axes turning a ``src``-layout tensor into ``dst`` layout (e.g. ``NHWC`` to
    ``NCHW`` gives ``[0, 3, 1, 2]``); None when the layouts are not permutations of each other."""
    if not src or not dst or len(src) != len(dst) or sorted(src) != sorted(dst) or len(set(src)) != len(src):
        return None
    return [src.index(ch) for ch in dst]


def normalized_error(x: np.ndarray, m: np.ndarray) -> float:
    """``||x - m|| / ||m - mean(m)||`` over positions finite in both (see the module docstring).

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


# ---------------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------------
@dataclass
class AlignmentDecision:
    """How one backend's anchor is aligned (taken once, reused for later samples).

    Attributes:
        anchor, backend: what it is for.
        rule: the rule applied (module docstring); ``{}`` is the identity.
        source: ``manifest`` | ``capture`` | ``native`` | ``layout`` | ``shape`` | ``data``.
        detail: one line saying why.
        backend_shape, canonical_shape, backend_dtype: as seen when decided.
        error: normalised error of the chosen candidate against the consensus when data decided.
        runner_up: normalised error of the best other candidate (data decisions).
        margin: ``runner_up / error`` (None when ``error`` is 0: an exact match).
        candidates: for data decisions, ``[{"rule": ..., "error": ...}]``.
        samples: samples aligned with this decision.
    """

    anchor: str
    backend: str
    rule: dict[str, Any]
    source: str
    detail: str = ""
    backend_shape: list[int] = field(default_factory=list)
    canonical_shape: list[int] = field(default_factory=list)
    backend_dtype: str = ""
    error: float | None = None
    runner_up: float | None = None
    margin: float | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0

    @property
    def identity(self) -> bool:
        return is_identity(self.rule)


@dataclass
class UnalignedEntry:
    """An anchor that could not be aligned for a backend (excluded from the verdict for that sample).

    ``reason`` carries the shapes; ``samples`` counts the samples it was unaligned on and
    ``first_sample`` names the first."""

    anchor: str
    backend: str
    reason: str
    backend_shape: list[int] = field(default_factory=list)
    canonical_shape: list[Any] = field(default_factory=list)
    backend_dtype: str = ""
    samples: int = 0
    first_sample: str = ""


@dataclass
class AlignmentReport:
    """Every non-identity (or data-decided) alignment and every unaligned anchor of a run.

    ``identity``: backend -> number of anchors aligned as they are. ``settings``: the thresholds.
    ``warnings``: things the user should fix (e.g. a manifest pin naming an unknown backend)."""

    alignments: list[AlignmentDecision] = field(default_factory=list)
    unaligned: list[UnalignedEntry] = field(default_factory=list)
    identity: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AlignmentReport":
        if d.get("schema") != SCHEMA:
            raise AnpredError(f"unsupported alignment report schema {d.get('schema')!r} (expected {SCHEMA!r})")
        try:
            return cls(alignments=[AlignmentDecision(**a) for a in d.get("alignments", [])],
                       unaligned=[UnalignedEntry(**u) for u in d.get("unaligned", [])],
                       identity=dict(d.get("identity", {})), samples=int(d.get("samples", 0)),
                       settings=dict(d.get("settings", {})), warnings=list(d.get("warnings", [])),
                       schema=d["schema"])
        except TypeError as err:
            raise AnpredError(f"malformed alignment report: {err}") from err

    def by_source(self) -> dict[str, int]:
        return dict(Counter(a.source for a in self.alignments))

    @property
    def segments_by_data(self) -> list[AlignmentDecision]:
        """Alignments whose segment (channel/head) order was found from the data, not from a known
        rule: a port's concatenation order, or a real channel-order defect the data cannot tell apart."""
        return [a for a in self.alignments if a.source == "data" and "segments" in a.rule]

    def format_text(self, max_anchors: int | None = None) -> str:
        """A plain-text report: warnings, alignments grouped by (backend, rule, source), then unaligned
        anchors. Every anchor is listed unless ``max_anchors`` caps each group."""
        lines = [f"alignment over {self.samples} sample(s)"]
        lines.extend(f"warning: {w}" for w in self.warnings)
        nseg = len(self.segments_by_data)
        if nseg:
            lines.append(f"segment order found by the data (check these: a port's order or a real defect): {nseg}")
        for b, n in sorted(self.identity.items()):
            lines.append(f"  {b}: {n} anchor(s) as they are")
        groups: dict[tuple[str, str, str], list[AlignmentDecision]] = {}
        for a in self.alignments:
            groups.setdefault((a.backend, describe_rule(a.rule), a.source), []).append(a)
        if groups:
            lines.append("alignments applied (backend: rule [how decided] anchors):")
        cap = max_anchors if max_anchors is not None else None
        for (b, desc, src), items in groups.items():
            names = ", ".join(i.anchor for i in items[:cap]) + (" ..." if cap is not None and len(items) > cap else "")
            how = src
            if src == "data":
                how = "data: " + "; ".join(
                    f"{i.anchor} error {i.error:.3g} vs runner-up {_fmt(i.runner_up)} (margin {_fmt(i.margin, 'exact')})"
                    for i in items[:cap])
            lines.append(f"  {b}: {desc} [{how}] ({len(items)}) {names}")
            for i in items[:cap]:
                if i.detail and src not in ("capture", "layout"):
                    lines.append(f"      {i.anchor}: {i.detail}")
        if self.unaligned:
            lines.append(f"unaligned (excluded from the verdict) ({len(self.unaligned)}):")
            for u in self.unaligned:
                lines.append(f"  {u.backend}: {u.anchor}: {u.reason} [{u.samples} sample(s), first {u.first_sample}]")
        else:
            lines.append("unaligned: none")
        return "\n".join(lines)


def _fmt(v: float | None, none: str = "-") -> str:
    return none if v is None else f"{v:.3g}"


def _json_safe(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return f if math.isfinite(f) else (None if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    return o


@dataclass
class AlignedSample:
    """One sample after alignment.

    ``tensors``: ``{anchor: {backend: float64 array in the canonical ONNX shape}}`` (only aligned
    ones); ``unaligned``: ``{anchor: {backend: reason with shapes}}``; ``decisions``: the decision used
    per ``(anchor, backend)``."""

    sample_id: str
    tensors: dict[str, dict[str, np.ndarray]]
    unaligned: dict[str, dict[str, str]]
    decisions: dict[tuple[str, str], AlignmentDecision] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# the aligner
# ---------------------------------------------------------------------------------------------------
class Aligner:
    """Align backends' anchors onto the canonical ONNX representation (see the module docstring).

    Args:
        manifest: the anchor manifest of the run (canonical shapes, layouts, pins, native transforms).
        statuses: ``{backend: BackendStatus}`` (captures: per-anchor :class:`AnchorCapture` dicts with
            ``layout``/``transform``; ``precision``; ``family``; ``dtypes``).
        close_tol: a data-decided candidate (or segment) must have normalised error <= this (0.5);
            in ``(0, 1)``: at 1 the constant ``mean(m)`` would already "match".
        min_margin: ... and the runner-up must be at least this many times farther (4.0; finite, > 1).
        segment_search: look for channel/segment permutations (True); only ever in backends running a
            native graph of their own (``NATIVE_BACKENDS``, or an unregistered backend whose capture
            status is not ``exact``), never under a manifest pin, only along the anchor's channel axis
            (``C`` of its layout, else axis 1), with at most ``SEGMENT_MAX_BLOCKS`` blocks.
        max_segment_axis: longest axis searched for segment permutations (16384).

    Raises:
        AnpredError: thresholds out of range.
        AlignmentError: a manifest pin is malformed (at construction); a rule reported by a backend or
            the native mapping is malformed (when first used).
    """

    def __init__(self, manifest: AnchorManifest, statuses: dict[str, BackendStatus], *,
                 close_tol: float = 0.5, min_margin: float = 4.0, segment_search: bool = True,
                 max_segment_axis: int = 16384):
        if not (0 < close_tol < 1) or not (1 < min_margin < math.inf):
            raise AnpredError(f"alignment needs 0 < close_tol < 1 and a finite min_margin > 1 "
                              f"(got close_tol={close_tol}, min_margin={min_margin})")
        self.manifest = manifest
        self.statuses = dict(statuses)
        self.close_tol = float(close_tol)
        self.min_margin = float(min_margin)
        self.segment_search = bool(segment_search)
        self.max_segment_axis = int(max_segment_axis)
        self._anchors = {a.name: a for a in manifest.anchors}
        self._decisions: dict[tuple[str, str], AlignmentDecision] = {}
        self._unaligned: dict[tuple[str, str], UnalignedEntry] = {}
        self._samples = 0
        self._pins, self.warnings = self._read_pins()
        self._notes: dict[tuple[str, str], str] = {}  # known rules that did not fit, for data decisions

    # ---- public --------------------------------------------------------------------------------
    def align(self, sample_id: str, tensors: dict[str, dict[str, np.ndarray]]) -> AlignedSample:
        """Align one sample.

        Args:
            sample_id: the sample's id (recorded with unaligned entries).
            tensors: ``{backend: {anchor: array as the backend returned it}}``.

        Returns:
            :class:`AlignedSample` (float64 arrays in the canonical shape; unaligned reasons).
        """
        self._samples += 1
        out_t: dict[str, dict[str, np.ndarray]] = {}
        out_u: dict[str, dict[str, str]] = {}
        used: dict[tuple[str, str], AlignmentDecision] = {}
        by_anchor: dict[str, dict[str, np.ndarray]] = {}
        for b, anchors in tensors.items():
            for name, arr in anchors.items():
                by_anchor.setdefault(name, {})[b] = arr
        for name in self._anchor_order(by_anchor):
            anchor = self._anchors.get(name)
            raw = by_anchor.get(name, {})
            if anchor is None:
                for b, x in raw.items():
                    self._mark(out_u, name, b, sample_id, "anchor not in the manifest", x, None)
                continue
            aligned, unal = self._align_anchor(anchor, raw, sample_id, used)
            if aligned:
                out_t[name] = aligned
            for b, (reason, x, cs) in unal.items():
                self._mark(out_u, name, b, sample_id, reason, x, cs)
        # anchors a backend reported missing
        for b, st in self.statuses.items():
            if b not in tensors:
                continue
            for name, cap in (st.captures or {}).items():
                c = _capture(cap)
                if c.status == "missing" and name not in tensors[b]:
                    self._mark(out_u, name, b, sample_id, f"not captured: {c.reason or 'missing'}", None, None)
        return AlignedSample(sample_id, out_t, out_u, used)

    def _read_pins(self) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
        """Validate every manifest pin now (before any work); warn about pins for unknown backends."""
        from anpred.backends import REGISTRY

        pins: dict[tuple[str, str], dict[str, Any]] = {}
        warnings: list[str] = []
        for a in self.manifest.anchors:
            al = a.alignment or {}
            if not isinstance(al, dict):
                raise AlignmentError(f"manifest pin {a.name}: 'alignment' must be {{backend: rule}}, got {al!r}")
            for b, rule in al.items():
                pins[(a.name, b)] = validate_rule(rule, f"manifest pin {a.name}/{b}")
                if b not in self.statuses and b not in REGISTRY:
                    warnings.append(f"manifest pin for unknown backend {b!r} at {a.name} is ignored "
                                    f"(backends in this run: {', '.join(self.statuses) or 'none'}; "
                                    f"known: {', '.join(REGISTRY)})")
        return pins, warnings

    def report(self) -> AlignmentReport:
        """The alignment report so far (decisions taken, unaligned anchors)."""
        alignments = [d for d in self._decisions.values() if not d.identity or d.source == "data"]
        identity = Counter(d.backend for d in self._decisions.values() if d.identity and d.source != "data")
        order = {n: i for i, n in enumerate(self._anchors)}
        alignments.sort(key=lambda d: (d.backend, order.get(d.anchor, 1 << 30)))
        unaligned = sorted(self._unaligned.values(), key=lambda u: (u.backend, order.get(u.anchor, 1 << 30)))
        return AlignmentReport(alignments=alignments, unaligned=unaligned, identity=dict(sorted(identity.items())),
                               samples=self._samples, warnings=list(self.warnings),
                               settings={"close_tol": self.close_tol, "min_margin": self.min_margin,
                                         "segment_search": self.segment_search,
                                         "segment_max_blocks": SEGMENT_MAX_BLOCKS})

    @property
    def decisions(self) -> dict[tuple[str, str], AlignmentDecision]:
        return dict(self._decisions)

    # ---- per anchor ----------------------------------------------------------------------------
    def _anchor_order(self, by_anchor):
        known = [a.name for a in self.manifest.anchors if a.name in by_anchor]
        return known + sorted(n for n in by_anchor if n not in self._anchors)

    def _align_anchor(self, anchor: Anchor, raw: dict[str, np.ndarray], sample_id: str, used):
        cs = self._canonical_shape(anchor, raw)
        aligned: dict[str, np.ndarray] = {}
        unal: dict[str, tuple[str, np.ndarray | None, Any]] = {}
        if cs is None:
            for b, x in raw.items():
                unal[b] = (f"canonical shape {anchor.shape} cannot be resolved from the backends' shapes", x, anchor.shape)
            return aligned, unal
        pending: dict[str, list[dict[str, Any]]] = {}  # backend -> candidate rules (data needed)
        fresh: dict[str, AlignmentDecision] = {}  # decided on this sample (segment check pending)
        for b, x in raw.items():
            dec = self._decisions.get((anchor.name, b))
            if dec is None:
                try:
                    dec, cands = self._decide_known(anchor, b, np.asarray(x), cs)
                except _Unaligned as why:
                    unal[b] = (str(why), x, cs)
                    continue
                if dec is None and cands is None:
                    unal[b] = (self._no_fit_reason(anchor, x, cs), x, cs)
                    continue
                if dec is None:
                    pending[b] = cands
                    continue
                if "exclude" in dec.rule:
                    unal[b] = (f"excluded by manifest pin: {dec.rule['exclude']}", x, cs)
                    continue
                fresh[b] = dec
            elif "exclude" in dec.rule:
                unal[b] = (f"excluded by manifest pin: {dec.rule['exclude']}", x, cs)
                continue
            try:
                aligned[b] = self._apply_checked(dec.rule, x, cs)
            except ValueError as err:
                unal[b] = (f"rule '{describe_rule(dec.rule)}' ({dec.source}) does not fit: {err}; "
                           f"backend shape {list(np.shape(x))}, canonical {list(cs)}", x, cs)
                fresh.pop(b, None)
                continue
            if b not in fresh:
                dec.samples += 1
                used[(anchor.name, b)] = dec
        # segment search for freshly decided native-graph backends, then commit them
        for b, dec in fresh.items():
            if b in aligned and self._segment_search_allowed(anchor, b, dec):
                cons = self._consensus(aligned, exclude=b, references_only=True)
                if cons is not None:
                    self._segment_check(anchor, dec, aligned, b, cons)
            self._decisions[(anchor.name, b)] = dec
            if b in aligned:
                dec.samples += 1
                used[(anchor.name, b)] = dec
        # data-driven choices
        for b, cands in pending.items():
            x = np.asarray(raw[b])
            cons = self._consensus(aligned, exclude=b, references_only=False)
            if cons is None:
                unal[b] = (f"layout ambiguous ({len(cands)} candidates fit backend shape {list(x.shape)} -> canonical "
                           f"{list(cs)}: {'; '.join(describe_rule(c) for c in cands)}) and no other backend to decide by",
                           x, cs)
                continue
            res = self._choose(anchor, b, x, cs, cands, cons)
            if isinstance(res, str):
                unal[b] = (res, x, cs)
                continue
            dec, arr, commit = res
            aligned[b] = arr
            if commit:
                self._decisions[(anchor.name, b)] = dec
            dec.samples += 1
            used[(anchor.name, b)] = dec
        return aligned, unal

    def _mark(self, out_u, name, b, sample_id, reason, x, cs):
        out_u.setdefault(name, {})[b] = reason
        key = (name, b)
        e = self._unaligned.get(key)
        if e is None:
            e = self._unaligned[key] = UnalignedEntry(
                anchor=name, backend=b, reason=reason,
                backend_shape=list(np.shape(x)) if x is not None else [],
                canonical_shape=list(cs) if cs is not None else [],
                backend_dtype=str(np.asarray(x).dtype) if x is not None else "", first_sample=sample_id)
        e.reason = reason
        e.samples += 1

    # ---- canonical shape ------------------------------------------------------------------------
    def _canonical_shape(self, anchor: Anchor, raw: dict[str, np.ndarray]) -> tuple[int, ...] | None:
        pat = list(anchor.shape or [])
        if pat and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in pat):
            return tuple(pat)
        if not pat and not anchor.shape:
            # unknown rank: take the shape of reference-like backends
            shapes = [tuple(np.shape(x)) for b, x in raw.items() if self._reference_like(anchor, b)]
            return Counter(shapes).most_common(1)[0][0] if shapes else None

        def fits(shape):
            return len(shape) == len(pat) and all(not isinstance(p, int) or p == s for p, s in zip(pat, shape))

        for prefer in (True, False):
            shapes = [tuple(np.shape(x)) for b, x in raw.items()
                      if fits(np.shape(x)) and (not prefer or self._reference_like(anchor, b))]
            if shapes:
                return Counter(shapes).most_common(1)[0][0]
        unknown = [i for i, p in enumerate(pat) if not isinstance(p, int)]
        if len(unknown) == 1:
            known = math.prod(p for p in pat if isinstance(p, int))
            sizes = Counter(int(np.size(x)) for x in raw.values())
            for size, _ in sizes.most_common():
                if known and size % known == 0:
                    out = list(pat)
                    out[unknown[0]] = size // known
                    return tuple(out)
        return None

    def _reference_like(self, anchor: Anchor, b: str) -> bool:
        st = self.statuses.get(b)
        if st is None:
            return False
        cap = _capture((st.captures or {}).get(anchor.name))
        return st.family in ONNX_FAMILIES or (cap.status == "exact" and not cap.transform)

    def runs_onnx_graph(self, b: str) -> bool:
        """True when backend ``b`` executes the anchored ONNX graph (directly or converted from it):
        registered ONNX-graph backends, and unregistered ones of an ONNX family or named ``ort-*`` /
        ``openvino-*``."""
        if b in ONNX_GRAPH_BACKENDS:
            return True
        if b in NATIVE_BACKENDS:
            return False
        st = self.statuses.get(b)
        return (st is not None and st.family in ONNX_FAMILIES) or b.startswith(("ort-", "openvino-"))

    def _segment_search_allowed(self, anchor: Anchor, b: str, dec: AlignmentDecision) -> bool:
        if not self.segment_search or dec.source == "manifest" or self.runs_onnx_graph(b):
            return False
        if b in NATIVE_BACKENDS:
            return True
        st = self.statuses.get(b)
        cap = _capture((st.captures or {}).get(anchor.name) if st else None)
        return cap.status != "exact"  # a backend claiming the same tensor is taken at its word

    def _consensus(self, aligned: dict[str, np.ndarray], exclude: str, references_only: bool) -> np.ndarray | None:
        """Element-wise median of the other backends' aligned tensors (fp32 references preferred)."""
        others = {b: a for b, a in aligned.items() if b != exclude}
        if not others:
            return None
        fp32 = {b: a for b, a in others.items()
                if self.statuses.get(b) is not None and (self.statuses[b].precision or "fp32") == "fp32"}
        ref = {b: a for b, a in fp32.items() if self._reference_status(b)}
        pool = ref or (None if references_only else (fp32 or others))
        if not pool:
            return None
        arrs = list(pool.values())
        if len(arrs) == 1:
            return arrs[0]
        return np.median(np.stack(arrs), axis=0)

    def _reference_status(self, b: str) -> bool:
        st = self.statuses.get(b)
        return st is not None and st.family in ONNX_FAMILIES and (st.precision or "fp32") == "fp32"

    # ---- decisions ------------------------------------------------------------------------------
    def _decide_known(self, anchor: Anchor, b: str, x: np.ndarray, cs: tuple[int, ...]):
        """Return ``(decision, None)`` when known rules or the shape decide, ``(None, candidates)`` when
        the data must decide, ``(None, None)`` when nothing fits."""
        st = self.statuses.get(b)
        cap = _capture((st.captures or {}).get(anchor.name) if st else None)
        dt = _dtype_name(x, st, anchor.name)
        base: dict[str, Any] = {}
        notes = []
        if dt == "bfloat16" or (x.dtype.type is np.void and x.dtype.itemsize == 2):
            base["cast"] = "bfloat16"
        elif x.dtype.kind == "f" and x.dtype.itemsize < 4:
            base["cast"] = str(x.dtype)

        def make(rule, source, detail):
            return AlignmentDecision(anchor=anchor.name, backend=b, rule=rule, source=source, detail=detail,
                                     backend_shape=list(x.shape), canonical_shape=list(cs), backend_dtype=dt)

        known: list[tuple[dict[str, Any], str, str]] = []
        pin = self._pins.get((anchor.name, b))
        if pin is not None:
            known.append((pin, "manifest", "pinned in the manifest"))
        if cap.transform:
            known.append((validate_rule(cap.transform, f"capture {anchor.name}/{b}"), "capture",
                          f"reported by the backend ({cap.layout or 'layout not given'})"))
        nat = (anchor.native or {}).get(b) or {}
        if nat.get("transform"):
            known.append((validate_rule(nat["transform"], f"native mapping {anchor.name}/{b}"), "native",
                          f"native mapping to {nat.get('target', '?')}"))
        lay_b = (cap.layout or "").upper()
        lay_c = (anchor.layout or "").upper()
        if lay_b and lay_b != "UNKNOWN" and lay_c and lay_c != "UNKNOWN":
            p = layout_permutation(lay_b, lay_c)
            if p is not None:
                r = {} if p == list(range(len(p))) else {"permute": p}
                known.append((r, "layout", f"backend layout {lay_b}, canonical {lay_c}"))
        # quantized data needs a scale; an integer anchor of the ONNX graph is compared as it is
        needs_dq = x.dtype.kind in "iu" and _is_float_dtype(anchor.dtype)
        for rule, source, detail in known:
            if "exclude" in rule:
                return make(rule, source, detail), None
            rule = {**base, **rule} if "cast" not in rule else dict(rule)
            if needs_dq and "dequantize" not in rule:
                if source == "manifest":
                    raise _Unaligned(f"manifest pin '{describe_rule(rule)}' cannot be applied: {x.dtype} tensor of shape "
                                     f"{list(x.shape)} for a {anchor.dtype} anchor and no 'dequantize' in the pin")
                notes.append(f"{source} rule ignored: integer tensor without scale/zero point")
                continue
            fitted = self._fit(rule, x, cs)
            if fitted is not None:
                r, how = fitted
                return make(r, source, detail + (f"; {how}" if how else "")), None
            if source == "manifest":  # the user's explicit instruction: never replaced by another rule
                raise _Unaligned(f"manifest pin '{describe_rule(rule)}' does not fit backend shape {list(x.shape)} -> "
                                 f"canonical {list(cs)}; fix or remove anchors[].alignment[{b!r}] in manifest.json")
            notes.append(f"{source} rule '{describe_rule(rule)}' does not fit backend shape {list(x.shape)} -> {list(cs)}")
        if needs_dq:
            # maybe a dequantize without layout info was given: use it as a base for shape inference
            dq = next((r["dequantize"] for r, _, _ in known if "dequantize" in r), None)
            if dq is None:
                return None, None
            base["dequantize"] = dq
        cands = self._shape_candidates(x.shape, cs, cap.layout, anchor.layout)
        cands = [{**base, **c} for c in cands]
        note = ("; ".join(notes) + "; ") if notes else ""
        if not cands:
            return None, None
        if len(cands) == 1:
            return make(cands[0], "shape", note + f"only candidate fitting backend shape {list(x.shape)} -> {list(cs)}"), None
        self._notes[(anchor.name, b)] = note
        return None, cands

    def _fit(self, rule: dict[str, Any], x: np.ndarray, cs: tuple[int, ...]):
        """Check ``rule`` on the shape of ``x`` (adding a batch of 1 / squeezing it, or a final reshape
        over size-1 dims when needed). Returns ``(rule, note)`` or None."""
        shape = tuple(x.shape)
        variants = [(rule, "")]
        p = rule.get("permute")
        if p is not None and "view" not in rule:
            if len(p) == len(shape) + 1:
                variants.append(({**rule, "view": [1, *shape]}, "batch of 1 added"))
            elif len(p) == len(shape) - 1 and shape and shape[0] == 1:
                variants.append(({**rule, "view": list(shape[1:])}, "batch of 1 squeezed"))
        for r, note in variants:
            out = _result_shape(r, shape, cs)
            if out is None:
                continue
            if out == cs:
                return r, note
            if _squeeze(out) == _squeeze(cs) and not r.get("reshape"):
                return {**r, "reshape": True}, (note + "; " if note else "") + f"reshape {list(out)} -> {list(cs)}"
        return None

    def _shape_candidates(self, bshape, cs, lay_b, lay_c) -> list[dict[str, Any]]:
        """Candidate rules mapping ``bshape`` to ``cs``, most plausible first (distinct effects)."""
        bshape, cs = tuple(bshape), tuple(cs)
        n = len(cs)
        cands: list[dict[str, Any]] = []
        seen: set = set()

        def add(rule):
            key = _effect_key(rule, bshape, cs)
            if key is None or key in seen:
                return
            seen.add(key)
            cands.append(rule)

        # 1. layout permutations over the same rank (batch of 1 added/squeezed)
        perms: list[list[int]] = []
        hint = None
        if lay_b and lay_c:
            hint = layout_permutation(str(lay_b).upper(), str(lay_c).upper())
        if hint:
            perms.append(hint)
        perms.append(list(range(n)))
        if n >= 3:
            perms.append([0, n - 1, *range(1, n - 1)])  # channels-last -> channels-first
            perms.append([0, *range(2, n), 1])  # channels-first -> channels-last
        views: list[list[int] | None] = [None]
        if len(bshape) == n - 1:
            views = [[1, *bshape]]
        elif len(bshape) == n + 1 and bshape[0] == 1:
            views = [list(bshape[1:])]
        elif len(bshape) != n:
            views = []
        for v in views:
            for p in perms:
                r: dict[str, Any] = {}
                if v is not None:
                    r["view"] = v
                if p != list(range(n)):
                    r["permute"] = p
                fitted = self._fit(r, _Shape(bshape), cs)
                if fitted is not None:
                    add(fitted[0])
        if cands:
            return cands
        # 2. any permutation of the non-1 dims, then reshape
        bn = [d for d in bshape if d != 1]
        cn = [d for d in cs if d != 1]
        if sorted(bn) == sorted(cn) and len(bn) <= 5:
            for p in itertools.permutations(range(len(bn))):
                if [bn[i] for i in p] == cn:
                    r = {}
                    if list(p) != list(range(len(bn))):
                        if list(bshape) != bn:
                            r["view"] = bn
                        r["permute"] = list(p)
                    r["reshape"] = True
                    add(r)
            if cands:
                return cands
        # 3. flatten (same element count, C order), or a channels-last view then permute
        if math.prod(bshape) == math.prod(cs):
            add({"reshape": True})
            if n >= 3:
                cl = [cs[0], *cs[2:], cs[1]]
                add({"view": cl, "permute": [0, n - 1, *range(1, n - 1)]})
        return cands

    def _no_fit_reason(self, anchor: Anchor, x, cs) -> str:
        x = np.asarray(x)
        if x.dtype.kind in "iu" and _is_float_dtype(anchor.dtype):
            return (f"{x.dtype} tensor of shape {list(x.shape)} for a {anchor.dtype} anchor and no scale/zero point "
                    f"to dequantize it (report them in the capture's transform)")
        return (f"no alignment fits: backend shape {list(x.shape)} ({x.size} elements) vs canonical {list(cs)} "
                f"({math.prod(cs)} elements)")

    def _apply_checked(self, rule, x, cs) -> np.ndarray:
        a = apply_rule(rule, x, cs)
        if a.shape != tuple(cs):
            raise ValueError(f"result has shape {list(a.shape)}")
        return a

    def _choose(self, anchor, b, x, cs, cands, cons):
        """Data-driven choice among candidate rules. Returns ``(decision, array, commit)`` or a reason."""
        outs, errs = [], []
        for c in cands:
            try:
                a = self._apply_checked(c, x, cs)
            except ValueError:
                a = None
            outs.append(a)
            errs.append(normalized_error(a, cons) if a is not None else math.inf)
        order = sorted(range(len(cands)), key=lambda i: errs[i])
        bi, si = order[0], order[1]
        best, second = errs[bi], errs[si]
        desc = "; ".join(f"{describe_rule(cands[i])}: {errs[i]:.3g}" for i in order)
        valid = [o for o in outs if o is not None]
        dt = _dtype_name(x, self.statuses.get(b), anchor.name)
        dec = AlignmentDecision(anchor=anchor.name, backend=b, rule=cands[bi], source="data",
                                backend_shape=list(x.shape), canonical_shape=list(cs), backend_dtype=dt,
                                error=best, runner_up=second, margin=(second / best) if best > 0 else None,
                                candidates=[{"rule": cands[i], "error": errs[i]} for i in order])
        if len(valid) == len(outs) and all(np.array_equal(valid[0], o, equal_nan=True) for o in valid[1:]):
            dec.detail = f"all {len(cands)} candidates give the same tensor on this sample; decision deferred"
            return dec, outs[bi], False
        if not best <= self.close_tol:
            return (f"layout ambiguous and no candidate matches the consensus (normalised errors: {desc}; "
                    f"need <= {self.close_tol}): a real deviation or an unknown representation; "
                    f"backend shape {list(x.shape)}, canonical {list(cs)}")
        if not (second >= self.min_margin * best and second > 0):
            return (f"layout ambiguous: candidates not separated by the data (normalised errors: {desc}; "
                    f"need runner-up >= {self.min_margin} x best); backend shape {list(x.shape)}, canonical {list(cs)}")
        dec.detail = self._notes.get((anchor.name, b), "") + (
            f"{len(cands)} candidates fit backend shape {list(x.shape)} -> {list(cs)}; closest to the "
            f"consensus of the other backends ({desc})")
        return dec, outs[bi], True

    # ---- segment permutations --------------------------------------------------------------------
    def _segment_check(self, anchor: Anchor, dec: AlignmentDecision, aligned: dict[str, np.ndarray], b: str,
                       cons: np.ndarray) -> None:
        x = aligned[b]
        e0 = normalized_error(x, cons)
        if not e0 > self.close_tol:
            return
        axis = channel_axis(anchor.layout, x.ndim)
        if axis is None:
            return
        found = find_segment_permutation(x, cons, self.close_tol, self.min_margin, self.max_segment_axis, axes=[axis])
        if found is None:
            return
        seg, e1 = found
        dec.rule = {**dec.rule, "segments": seg}
        dec.detail = (f"{dec.detail}; then a segment order along the channel axis {seg['axis']} found by the data "
                      f"({len(seg['order'])} blocks): normalised error {e0:.3g} -> {e1:.3g} (a port's concatenation "
                      f"order, or a real channel-order defect: pin the rule or 'exclude' to decide)")
        dec.source = "data"
        dec.error, dec.runner_up = e1, e0
        dec.margin = (e0 / e1) if e1 > 0 else None
        aligned[b] = apply_rule({"segments": seg}, x, x.shape)


def channel_axis(layout: str | None, rank: int) -> int | None:
    """The axis segment search may reorder: ``C`` of a known layout of that rank (``NCHW`` -> 1,
    ``NHWC`` -> 3), else axis 1 (the ONNX channel/feature axis), axis 0 for rank 1, None for scalars."""
    lay = str(layout or "").upper()
    if len(lay) == rank and lay.count("C") == 1:
        return lay.index("C")
    if rank >= 2:
        return 1
    return 0 if rank == 1 else None


def find_segment_permutation(x: np.ndarray, m: np.ndarray, close_tol: float = 0.5, min_margin: float = 4.0,
                             max_axis: int = 16384, *, axes: list[int] | None = None,
                             max_blocks: int = SEGMENT_MAX_BLOCKS,
                             min_block_fraction: float = SEGMENT_MIN_BLOCK_FRACTION) -> tuple[dict[str, Any], float] | None:
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
    for axis in (range(x.ndim) if axes is None else axes):
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
            d2 = a2[s:s + chunk, None] + m2[None, :] - 2.0 * (A[s:s + chunk] @ M.T)
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


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------
class _Shape:
    """Stand-in carrying only a shape, for shape-level rule checks."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def _capture(c: Any) -> AnchorCapture:
    if c is None:
        return AnchorCapture(status="", layout=None)
    if isinstance(c, AnchorCapture):
        return c
    try:
        return AnchorCapture(**c)
    except TypeError as err:
        raise AlignmentError(f"malformed anchor capture {c!r}: {err}") from err


def _dtype_name(x: np.ndarray, st: BackendStatus | None, anchor: str) -> str:
    if st is not None and (st.dtypes or {}).get(anchor):
        return str(st.dtypes[anchor])
    return str(x.dtype)


def _is_float_dtype(name: str) -> bool:
    return str(name).startswith(("float", "bfloat")) or not name


def _squeeze(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _result_shape(rule: dict[str, Any], shape: tuple[int, ...], cs: tuple[int, ...]) -> tuple[int, ...] | None:
    s = tuple(shape)
    if "view" in rule:
        if math.prod(rule["view"]) != math.prod(s):
            return None
        s = tuple(rule["view"])
    if "permute" in rule:
        p = rule["permute"]
        if len(p) != len(s):
            return None
        s = tuple(s[i] for i in p)
    if rule.get("reshape"):
        if math.prod(s) != math.prod(cs):
            return None
        s = tuple(cs)
    if "segments" in rule:
        seg = rule["segments"]
        if seg["axis"] >= len(s) or sum(n for _, n in seg["order"]) != s[seg["axis"]]:
            return None
    return s


def _effect_key(rule: dict[str, Any], bshape: tuple[int, ...], cs: tuple[int, ...]):
    """Where each canonical element comes from, as a hashable key (distinguishes candidate effects)."""
    size = math.prod(bshape)
    if size > 1 << 22:
        # large tensors: compare on a small probe of the same structure is not possible; use the rule
        return json.dumps(rule, sort_keys=True)
    try:
        a = apply_rule(rule, np.arange(size, dtype=np.float64).reshape(bshape), cs)
    except ValueError:
        return None
    if a.shape != tuple(cs):
        return None
    return a.tobytes()
