"""The alignment decided without the data (steps 1 to 5 of :mod:`anpred.align.aligner`): a manifest pin,
the backend's capture, the ONNX graph's layout for a backend that executes it, the native mapping, the
layouts, and the shape candidates (several fitting candidates are left to the data).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anpred.align.backend_info import anchor_capture, anchor_dtype, returns_onnx_layout
from anpred.align.rules import describe_rule, layout_permutation, validate_rule
from anpred.align.shapes import fit_rule, shape_candidates
from anpred.align.struct import AlignmentDecision
from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.manifest import Anchor

__all__ = ["Unaligned", "decide_known", "no_fit_reason"]


class Unaligned(Exception):
    """This (anchor, backend) cannot be aligned; the message is the reason (with shapes)."""


def decide_known(
    anchor: Anchor, b: str, x: np.ndarray, cs: tuple[int, ...], st: BackendStatus | None, pin: dict[str, Any] | None
):
    """Return ``(decision, None, "")`` when known rules or the shape decide, ``(None, candidates, note)``
    when the data must decide (``note``: the known rules that did not fit, for the data decision's detail),
    ``(None, None, "")`` when nothing fits. ``x``: backend ``b``'s tensor at ``anchor``; ``cs``: the
    canonical shape; ``st``: ``b``'s status (None: unknown); ``pin``: the manifest pin of (anchor, b).

    Raises:
        Unaligned: a wrong shape from a backend executing the ONNX graph, or a manifest pin that cannot
            be applied or does not fit.
        AlignmentError: a malformed rule reported by the backend or the native mapping.
    """
    cap = anchor_capture((st.captures or {}).get(anchor.name) if st else None)
    dt = anchor_dtype(x, st, anchor.name)
    base: dict[str, Any] = {}
    notes = []
    if dt == "bfloat16" or (x.dtype.type is np.void and x.dtype.itemsize == 2):
        base["cast"] = "bfloat16"
    elif x.dtype.kind == "f" and x.dtype.itemsize < 4:
        base["cast"] = str(x.dtype)

    def make(rule, source, detail):
        return AlignmentDecision(
            anchor=anchor.name,
            backend=b,
            rule=rule,
            source=source,
            detail=detail,
            backend_shape=list(x.shape),
            canonical_shape=list(cs),
            backend_dtype=dt,
        )

    known: list[tuple[dict[str, Any], str, str]] = []
    if pin is not None:
        known.append((pin, "manifest", "pinned in the manifest"))
    if cap.transform:
        known.append(
            (
                validate_rule(cap.transform, f"capture {anchor.name}/{b}"),
                "capture",
                f"reported by the backend ({cap.layout or 'layout not given'})",
            )
        )
    needs_dq = x.dtype.kind in "iu" and _is_float_dtype(anchor.dtype)
    if pin is None and not cap.transform and not needs_dq and returns_onnx_layout(b, st):
        rule, detail = onnx_graph_rule(anchor, b, x, cs, base)
        return make(rule, "onnx-graph", detail), None, ""
    known.extend(mapped_rules(anchor, b, cap))
    # quantized data needs a scale; an integer anchor of the ONNX graph is compared as it is (needs_dq)
    for rule, source, detail in known:
        if "exclude" in rule:
            return make(rule, source, detail), None, ""
        rule = {**base, **rule} if "cast" not in rule else dict(rule)
        if needs_dq and "dequantize" not in rule:
            if source == "manifest":
                raise Unaligned(
                    f"manifest pin '{describe_rule(rule)}' cannot be applied: "
                    f"{x.dtype} tensor of shape "
                    f"{list(x.shape)} for a {anchor.dtype} anchor and no 'dequantize' in the pin"
                )
            notes.append(f"{source} rule ignored: integer tensor without scale/zero point")
            continue
        fitted = fit_rule(rule, x.shape, cs)
        if fitted is not None:
            r, how = fitted
            return make(r, source, detail + (f"; {how}" if how else "")), None, ""
        if source == "manifest":  # the user's explicit instruction: never replaced by another rule
            raise Unaligned(
                f"manifest pin '{describe_rule(rule)}' does not fit backend shape {list(x.shape)} -> "
                f"canonical {list(cs)}; fix or remove anchors[].alignment[{b!r}] in manifest.json"
            )
        notes.append(f"{source} rule '{describe_rule(rule)}' does not fit backend shape {list(x.shape)} -> {list(cs)}")
    if needs_dq:
        # maybe a dequantize without layout info was given: use it as a base for shape inference
        dq = next((r["dequantize"] for r, _, _ in known if "dequantize" in r), None)
        if dq is None:
            return None, None, ""
        base["dequantize"] = dq
    cands = shape_candidates(x.shape, cs, cap.layout, anchor.layout)
    cands = [{**base, **c} for c in cands]
    note = ("; ".join(notes) + "; ") if notes else ""
    if not cands:
        return None, None, ""
    if len(cands) == 1:
        return (
            make(cands[0], "shape", note + f"only candidate fitting backend shape {list(x.shape)} -> {list(cs)}"),
            None,
            "",
        )
    return None, cands, note


def onnx_graph_rule(
    anchor: Anchor, b: str, x: np.ndarray, cs: tuple[int, ...], base: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``(rule, detail)`` of backend ``b`` that executes the ONNX graph in its layout (its tensor ``x``
    at ``anchor``, canonical shape ``cs``; ``base``: the element cast).

    Raises:
        Unaligned: a wrong shape (another shape than the ONNX one, beyond unit axes at an inner anchor).
    """
    # the ONNX shape exactly at the model's outputs: a batch of 1 added or dropped is another output
    # than the graph's. At an inner anchor (a tensor exposed by the instrumentation, not an output
    # of the user's model) unit axes added or dropped keep the elements in their order (MNN returns
    # a Gemm's [N, C] as the [N, C, 1, 1] of the convolution it runs): reshaped, said so
    if tuple(x.shape) != tuple(cs) and getattr(anchor, "kind", "output") != "output" and _unit_axes_only(x.shape, cs):
        return {**base, "reshape": True}, (
            f"executes the ONNX graph; its tensor at this inner anchor has unit axes added or "
            f"dropped ({list(x.shape)} for {list(cs)}, the same elements in the same order)"
        )
    if tuple(x.shape) != tuple(cs):
        raise Unaligned(
            f"wrong shape: {b} executes the ONNX graph in its layout and returned shape "
            f"{list(x.shape)} ({x.size} elements) for the ONNX shape {list(cs)} "
            f"({math.prod(cs)} elements)"
        )
    return dict(base), "executes the ONNX graph: the ONNX layout by definition"


def mapped_rules(anchor: Anchor, b: str, cap: AnchorCapture) -> list[tuple[dict[str, Any], str, str]]:
    """The ``(rule, source, detail)`` of backend ``b`` at ``anchor`` from the native mapping
    (``anchor.native[b]["transform"]``) and from the capture's layout against the anchor's (``cap``: its capture
    record), in that order.

    Raises:
        AlignmentError: a malformed native transform.
    """
    known: list[tuple[dict[str, Any], str, str]] = []
    nat = (anchor.native or {}).get(b) or {}
    if nat.get("transform"):
        known.append(
            (
                validate_rule(nat["transform"], f"native mapping {anchor.name}/{b}"),
                "native",
                f"native mapping to {nat.get('target', '?')}",
            )
        )
    lay_b = (cap.layout or "").upper()
    lay_c = (anchor.layout or "").upper()
    if lay_b and lay_b != "UNKNOWN" and lay_c and lay_c != "UNKNOWN":
        p = layout_permutation(lay_b, lay_c)
        if p is not None:
            r = {} if p == list(range(len(p))) else {"permute": p}
            known.append((r, "layout", f"backend layout {lay_b}, canonical {lay_c}"))
    return known


def no_fit_reason(anchor: Anchor, x, cs) -> str:
    """Why no rule aligns backend tensor ``x`` at ``anchor`` onto the canonical shape ``cs``."""
    x = np.asarray(x)
    if x.dtype.kind in "iu" and _is_float_dtype(anchor.dtype):
        return (
            f"{x.dtype} tensor of shape {list(x.shape)} for a {anchor.dtype} anchor and no scale/zero point "
            f"to dequantize it (report them in the capture's transform)"
        )
    return (
        f"no alignment fits: backend shape {list(x.shape)} ({x.size} elements) vs canonical {list(cs)} "
        f"({math.prod(cs)} elements)"
    )


def _is_float_dtype(name: str) -> bool:
    return str(name).startswith(("float", "bfloat")) or not name


def _unit_axes_only(shape, canonical) -> bool:
    """Whether ``shape`` and ``canonical`` differ only by axes of size 1 (the same sizes > 1 in the same
    order, hence the same elements in the same row-major order)."""
    return [d for d in shape if d != 1] == [d for d in canonical if d != 1]
