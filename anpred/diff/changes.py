"""What differs between two graphs beyond the matching: the changes of each matched node pair
(:func:`node_changes`), of the graph inputs and outputs (:func:`io_changes`) and of the opset imports
(:func:`opset_changes`), each a list of :class:`~anpred.diff.struct.Change`.

Constants are compared by value when their data is in memory (max |a - b| in float64 on equal
shapes), attributes after dropping schema defaults (:func:`anpred.diff.graphs.normalized_attrs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anpred.diff.graphs import DiffGraph
from anpred.diff.matcher import Matcher
from anpred.diff.struct import Change

__all__ = ["node_changes", "io_changes", "opset_changes"]


def _jsonable(v: Any) -> Any:
    """An attribute value for JSON: small arrays as lists, larger ones described, numpy scalars as numbers."""
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 16 else f"<{v.dtype} tensor {list(v.shape)}>"
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def _max_abs(x: np.ndarray, y: np.ndarray) -> float | None:
    """max |x - y| in float64 for numeric arrays of equal shape (nan when every difference is nan), else None."""
    if x.shape != y.shape or x.dtype.kind not in "fiub" or y.dtype.kind not in "fiub":
        return None
    if x.size == 0:
        return 0.0
    d = np.abs(x.astype(np.float64) - y.astype(np.float64))
    return float(np.nanmax(d)) if not np.all(np.isnan(d)) else float("nan")


def node_changes(M: Matcher, a: int, b: int) -> list[Change]:
    """The differences of the matched pair (node ``a`` of ``M.A``, node ``b`` of ``M.B``): name, op type,
    domain, normalized attributes, input/output arity, output dtypes and shapes, constant inputs
    (with their max difference), and inputs rewired to another matched producer (looking through
    inserted transparent nodes)."""
    A, B = M.A, M.B
    na, nb = A.nodes[a], B.nodes[b]
    ch: list[Change] = []
    if na.name != nb.name:
        ch.append(Change("renamed", "", na.name, nb.name))
    if na.op_type != nb.op_type:
        ch.append(Change("op_type", "", na.op_type, nb.op_type))
    if (na.domain or "ai.onnx") != (nb.domain or "ai.onnx"):
        ch.append(Change("domain", "", na.domain, nb.domain))
    aa, ab = M.attrs[0][a], M.attrs[1][b]
    for k in sorted(set(aa) | set(ab)):
        va, vb = aa.get(k), ab.get(k)
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            if (
                isinstance(va, np.ndarray)
                and isinstance(vb, np.ndarray)
                and va.shape == vb.shape
                and va.dtype == vb.dtype
                and np.array_equal(va, vb, equal_nan=True)
            ):
                continue
            mad = _max_abs(va, vb) if isinstance(va, np.ndarray) and isinstance(vb, np.ndarray) else None
            ch.append(Change("attribute", k, _jsonable(va), _jsonable(vb), mad))
        elif va != vb:
            ch.append(Change("attribute", k, va, vb))
    ia, ib = [v for v in na.input if v], [v for v in nb.input if v]
    if len(ia) != len(ib):
        ch.append(Change("input_arity", "", len(ia), len(ib)))
    oa, ob = [v for v in na.output if v], [v for v in nb.output if v]
    if len(oa) != len(ob):
        ch.append(Change("output_arity", "", len(oa), len(ob)))
    for j, (va, vb) in enumerate(zip(na.output, nb.output)):
        ta, tb = A.value_type(va), B.value_type(vb)
        if ta[0] and tb[0] and ta[0] != tb[0]:
            ch.append(Change("dtype", f"output[{j}]", ta[0], tb[0]))
        if ta[1] is not None and tb[1] is not None and ta[1] != tb[1]:
            ch.append(Change("shape", f"output[{j}]", ta[1], tb[1]))
    for i, (va, vb) in enumerate(zip(na.input, nb.input)):
        if va in A.init and vb in B.init:
            xa, xb = A.array(va), B.array(vb)
            ta, tb = A.value_type(va), B.value_type(vb)
            if ta != tb:
                mad = _max_abs(xa, xb) if xa is not None and xb is not None else None
                ch.append(Change("initializer", f"input[{i}]", f"{ta[0]}{ta[1]}", f"{tb[0]}{tb[1]}", mad))
            elif xa is not None and xb is not None and not np.array_equal(xa, xb, equal_nan=True):
                ch.append(Change("initializer", f"input[{i}]", f"{ta[0]}{ta[1]}", f"{tb[0]}{tb[1]}", _max_abs(xa, xb)))
        elif (va in A.init) != (vb in B.init) and va and vb:
            pa, pb = A.producer.get(va), B.producer.get(vb)
            # a constant that became computed (or the reverse) other than through inserted casts
            if not (pb and M.through(B, pb[0], M.b2a, True) == [None] and va in A.init):
                ch.append(
                    Change(
                        "rewired",
                        f"input[{i}]",
                        "constant" if va in A.init else "computed",
                        "constant" if vb in B.init else "computed",
                    )
                )
        else:
            pa, pb = A.producer.get(va), B.producer.get(vb)
            if pa and pb:
                xa = M.through(A, pa[0], M.a2b, True)
                xb = M.through(B, pb[0], M.b2a, True)
                if len(xa) == 1 and len(xb) == 1 and xa[0] in M.a2b and xb[0] in M.b2a and M.a2b[xa[0]] != xb[0]:
                    ch.append(Change("rewired", f"input[{i}]", A.ids[xa[0]], B.ids[xb[0]]))
    return ch


def io_changes(A: DiffGraph, B: DiffGraph) -> list[Change]:
    """Differences of the graph inputs and outputs. Each list is paired by name first; only the
    inputs/outputs left unpaired on both sides are then paired by position among themselves (a
    ``renamed`` change); what is still left is reported as ``graph_input``/``graph_output`` only in
    A (``b`` None) or only in B (``a`` None). Paired values are compared by dtype and shape."""
    ch = []
    anchors = {a.name for G in (A, B) if G.manifest is not None for a in G.manifest.anchors}
    for kind, la, lb in (("input", A.inputs, B.inputs), ("output", A.outputs, B.outputs)):
        sb = set(lb)
        pairs = [(va, va) for va in la if va in sb]
        ra, rb = [v for v in la if v not in sb], [v for v in lb if v not in set(la)]
        # leftovers by position among themselves while the types agree; outputs exposing anchors
        # (named like an anchor of either manifest) are never paired by position: a different
        # anchor set is not a rename
        pa = [v for v in ra if v not in anchors]
        pb = [v for v in rb if v not in anchors]
        k = 0
        while k < min(len(pa), len(pb)) and A.value_type(pa[k]) == B.value_type(pb[k]):
            k += 1
        for va, vb in zip(pa[:k], pb[:k]):
            ch.append(Change("renamed", f"{kind}[{la.index(va)}]", va, vb))
            pairs.append((va, vb))
        paired_a, paired_b = set(pa[:k]), set(pb[:k])
        for va in ra:
            if va not in paired_a:
                ch.append(Change(f"graph_{kind}", f"{kind}[{la.index(va)}]", va, None))
        for vb in rb:
            if vb not in paired_b:
                ch.append(Change(f"graph_{kind}", f"{kind}[{lb.index(vb)}]", None, vb))
        for va, vb in pairs:
            ta, tb = A.value_type(va), B.value_type(vb)
            if ta[0] != tb[0]:
                ch.append(Change("dtype", f"{kind} {va}", ta[0], tb[0]))
            if ta[1] != tb[1]:
                ch.append(Change("shape", f"{kind} {va}", ta[1], tb[1]))
    return ch


def opset_changes(A: DiffGraph, B: DiffGraph) -> list[Change]:
    """``opset`` changes: per domain (``ai.onnx`` for the default one), the imported version in A
    and B (None where a graph does not import the domain)."""
    oa = {(o.domain or "ai.onnx"): o.version for o in A.model.opset_import}
    ob = {(o.domain or "ai.onnx"): o.version for o in B.model.opset_import}
    return [Change("opset", d, oa.get(d), ob.get(d)) for d in sorted(set(oa) | set(ob)) if oa.get(d) != ob.get(d)]
