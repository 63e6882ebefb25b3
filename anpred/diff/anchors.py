"""Anchor correspondence: where an anchor of one graph's manifest is in the other graph, and what
transform (dtype, permutation, quantization) lies between the two values.
"""

from __future__ import annotations

from typing import Any

from anpred.diff.graphs import TRANSPARENT_OPS, DiffGraph
from anpred.diff.matcher import Matcher
from anpred.diff.struct import AnchorMatch

__all__ = ["walk_transforms", "describe_transform", "anchor_map"]


def walk_transforms(G: DiffGraph, v: str, matched: dict[int, int]) -> tuple[str, dict[str, Any]]:
    """From value ``v`` walk up through transparent producers that the other graph lacks (unmatched
    Cast/Transpose/Q/DQ ...; Identity nodes are passed whether matched or not, they change nothing)
    and return the source value and the transform between the source and ``v``:
    ``{"dtype": d}`` when a Cast converts a value computed in dtype ``d`` (e.g. ``float16`` cast back to
    ``float32`` by an fp16 conversion with float32 I/O), ``{"permute": p}`` for Transposes (``p`` maps
    ``v`` back onto the source layout), ``{"quantized": True}`` for Q/DQ."""
    tf: dict[str, Any] = {}
    perm = None
    while v in G.producer:
        i, _ = G.producer[v]
        nd = G.nodes[i]
        if nd.op_type not in TRANSPARENT_OPS or not nd.input or (i in matched and nd.op_type != "Identity"):
            break
        if nd.op_type == "Transpose":
            p = [a.ints for a in nd.attribute if a.name == "perm"]
            p = list(p[0]) if p else None
            if p is not None:
                perm = p if perm is None else [p[k] for k in perm]
        elif nd.op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"):
            tf["quantized"] = True
        elif nd.op_type in ("Cast", "CastLike"):
            src = G.value_type(nd.input[0])[0]
            if src and src != G.value_type(v)[0]:
                tf["dtype"] = src  # the deepest cast wins: the dtype the value was computed in
        v = nd.input[0]
    if perm is not None:
        inv = [0] * len(perm)
        for k, p in enumerate(perm):
            inv[p] = k
        tf["permute"] = inv
    return v, tf


def describe_transform(tf: dict[str, Any]) -> str:
    """A transform of :func:`walk_transforms` in words (``a Cast from float16, a Transpose ...``)."""
    parts = []
    if "dtype" in tf:
        parts.append(f"a Cast from {tf['dtype']}")
    if "permute" in tf:
        parts.append(f"a Transpose (permute {tf['permute']} to undo)")
    if tf.get("quantized"):
        parts.append("QuantizeLinear/DequantizeLinear")
    return ", ".join(parts)


def anchor_map(M: Matcher) -> list[AnchorMatch]:
    """Where each anchor of A's manifest (else B's; none: ``[]``) is in the other graph (see
    :class:`~anpred.diff.struct.AnchorMatch`), tried in order: the graph output of the same name or
    position, an output exposed under the anchor's name, the same anchor name in the other manifest,
    the output of the matched producer, the input of a matched consumer, the same value name."""
    A, B = M.A, M.B
    if A.manifest is not None:
        X, Y, x2y, flip = A, B, M.a2b, False
    elif B.manifest is not None:
        X, Y, x2y, flip = B, A, M.b2a, True
    else:
        return []
    ynames = {a.name: a for a in Y.manifest.anchors} if Y.manifest is not None else {}
    y_matched = M.a2b if flip else M.b2a
    out = []
    for anc in X.manifest.anchors:
        v = anc.value
        yv = None
        tf: dict[str, Any] = {}
        reason = ""
        if anc.kind == "output" and v in X.outputs and v in Y.outputs:
            yv = v
            _src, tf = walk_transforms(Y, yv, y_matched)
            reason = "graph output of the same name"
        elif (
            anc.kind == "output"
            and v in X.outputs
            and X.outputs.index(v) < len(Y.outputs)
            and Y.outputs[X.outputs.index(v)] not in X.outputs
        ):
            yv = Y.outputs[X.outputs.index(v)]
            _src, tf = walk_transforms(Y, yv, y_matched)
            reason = "graph output at the same position"
        elif anc.name in Y.outputs:
            # exposed by the instrumentation as a graph output named like the anchor: what a backend
            # captures is that output, whatever was inserted in front of it
            yv = anc.name
            _src, tf = walk_transforms(Y, yv, y_matched)
            reason = "exposed as graph output " + ("through " + describe_transform(tf) if tf else "unchanged")
        elif anc.name in ynames:
            yv, reason = ynames[anc.name].value, "same anchor name in both manifests"
        elif v in X.producer and X.producer[v][0] in x2y:
            i, j = X.producer[v]
            y_node = Y.nodes[x2y[i]]
            if j < len(y_node.output):
                yv, reason = y_node.output[j], "output of the matched producer"
        if yv is None:
            # consumed by a matched node: its counterpart's input is the same value (maybe converted)
            for c, k in X.consumers.get(v, ()):
                if c in x2y and k < len(Y.nodes[x2y[c]].input):
                    cand = Y.nodes[x2y[c]].input[k]
                    _src, tf = walk_transforms(Y, cand, y_matched)
                    yv, reason = cand, f"input {k} of the matched consumer {Y.ids[x2y[c]]}"
                    break
        if yv is None and v in Y.producer:
            yv, reason = v, "same value name"
        if yv is None:
            p = X.producer.get(v)
            why = f"producer {X.ids[p[0]]} ({X.op[p[0]]}) has no counterpart" if p else "no producer"
            out.append(
                AnchorMatch(anc.name, anc.stage, None if flip else v, v if flip else None, "unmapped", None, why)
            )
            continue
        tx, ty = X.value_type(v), Y.value_type(yv)
        if tx[0] and ty[0] and tx[0] != ty[0]:
            tf.setdefault("dtype", ty[0])
        if tf.get("dtype") == tx[0]:  # cast there and back: nothing lost
            del tf["dtype"]
        status = "equivalent" if tf else "exact"
        a_v, b_v = (yv, v) if flip else (v, yv)
        out.append(AnchorMatch(anc.name, anc.stage, a_v, b_v, status, tf or None, reason))
    return out
