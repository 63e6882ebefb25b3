"""Exact rewrites of a few ONNX constructs into equivalent ones a runtime's frontend accepts.

Each rewrite keeps the values the ONNX spec defines up to the rounding of the operations it is
written with (same outputs, same names; ``Erf`` is Eigen's float32 approximation, its error in
docs/backends-converters.md, 'Measurements: Erf decomposition') and is used by a backend only where
its own library refuses or lacks the original (see the backends' docstrings):

- :class:`ScalarIfConditionPass`: an ``If`` whose condition has rank > 1 (or an unknown rank) gets
  ``Reshape(cond, [])`` (a scalar) in front. ONNX (If-1..21) asks for a one-element condition of any
  rank; OpenVINO 2026.4's ONNX frontend refuses rank > 1 ("Rank of If condition input must be equal
  to 0 or 1"), e.g. ``Greater(ReduceMean(x, keepdims=1), 0)`` of a 2-D ``x``. Sub-graphs included.
- :class:`DecomposePass`: operators replaced by the elementary ops their ONNX definition is written
  in (``Erf``: by an approximation accurate to float32, below), for a runtime that has no kernel for them
  (:data:`DECOMPOSITIONS`). ``GlobalLpPool(x, p)`` (ONNX GlobalLpPool-2: "the Lp norm of the values over the spatial
  axes") becomes
  ``Pow(ReduceSum(Pow(Abs(x), p), spatial axes, keepdims=1), 1/p)`` (``p = 1`` and ``p = 2`` as
  ``ReduceL1`` / ``ReduceL2``, the norms themselves); it needs the input's rank (shape inference),
  else the node is kept with the reason. ``GlobalMaxPool`` / ``GlobalAveragePool`` become
  ``ReduceMax`` / ``ReduceMean`` over the spatial axes (keepdims=1), for a runtime whose kernel is
  known wrong at the input's rank. ``Erf`` becomes Eigen's float32 rational approximation (the one
  TensorFlow's CPU kernel is built on), for a runtime without an Erf kernel (LiteRT: no builtin).

- :func:`fold_constant_fake_quantization`: ``DequantizeLinear(QuantizeLinear(constant))`` folded into
  the constant it computes, for OpenVINO's low-precision transformations that throw on it.

``info``: ``{"rewritten": [node names], "kept": {node name: reason}}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from passes.base import GraphPass, PassResult

__all__ = [
    "ScalarIfConditionPass",
    "DecomposePass",
    "DECOMPOSITIONS",
    "scalar_if_conditions",
    "decompose_ops",
    "fold_constant_fake_quantization",
]


def _fresh(taken: set[str], base: str) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _ranks(model) -> dict[str, int]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - ranks unknown: the callers keep what needs one
        inferred = model
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = len(t.shape.dim)
    for t in model.graph.initializer:
        out[t.name] = len(t.dims)
    return out


def _elem_dtypes(model) -> dict:
    """value name -> numpy dtype of its element type, where shape inference or the graph tells."""
    import onnx
    from onnx import helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001
        inferred = model
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        et = vi.type.tensor_type.elem_type
        if et:
            out[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(et))
    for t in model.graph.initializer:
        out[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    return out


def _opset(model) -> int:
    return max((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


class ScalarIfConditionPass(GraphPass):
    """Reshape every ``If`` condition of rank > 1 (or of unknown rank) to a scalar, in place (module
    docstring). Sub-graphs (branches, loop bodies) are walked too; their conditions' ranks are unknown
    to shape inference of the main graph, so every one of them is reshaped (a scalar stays a scalar)."""

    in_place = True

    def call(self, model) -> PassResult:
        from onnx import helper, numpy_helper

        ranks = _ranks(model)
        taken = _all_names(model.graph)
        shape_name = _fresh(taken, "if_condition_scalar_shape")
        info: dict[str, Any] = {"rewritten": [], "kept": {}}

        def walk(graph, main: bool) -> None:
            new = []
            for n in graph.node:
                for a in n.attribute:
                    for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                        walk(g, False)
                if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.input:
                    r = ranks.get(n.input[0]) if main else None
                    if r is None or r > 1:
                        out = _fresh(taken, f"{n.input[0]}_scalar")
                        new.append(
                            helper.make_node(
                                "Reshape",
                                [n.input[0], shape_name],
                                [out],
                                name=_fresh(taken, f"{n.name or 'if'}/condition_scalar"),
                            )
                        )
                        n.input[0] = out
                        info["rewritten"].append(n.name or n.output[0])
                new.append(n)
            del graph.node[:]
            graph.node.extend(new)

        walk(model.graph, True)
        if info["rewritten"]:
            model.graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.int64), shape_name))
        return PassResult(model, bool(info["rewritten"]), info)


def _all_names(graph) -> set[str]:
    names = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {o.name for o in graph.output}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
        names.add(n.name)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _all_names(g)
    return names


def _reduce(op: str, src: str, dst: str, axes: list[int], opset: int, base: str, taken: set[str], consts: list):
    """``op`` (a Reduce* operator) over ``axes`` with keepdims=1: axes as an input from opset 18 on
    (ReduceSum: 13), as an attribute before."""
    from onnx import helper, numpy_helper

    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        an = _fresh(taken, f"{base}/axes")
        consts.append(numpy_helper.from_array(np.asarray(axes, np.int64), an))
        return helper.make_node(op, [src, an], [dst], name=_fresh(taken, f"{base}/{op}"), keepdims=1)
    return helper.make_node(op, [src], [dst], name=_fresh(taken, f"{base}/{op}"), axes=axes, keepdims=1)


def _global_pool(op: str):
    """``GlobalMaxPool`` / ``GlobalAveragePool`` as ``ReduceMax`` / ``ReduceMean`` over every spatial
    axis with keepdims=1 (the ONNX definitions: "equal to pooling with kernel size equal to the spatial
    dimension of the input tensor")."""

    def build(node, rank, opset, taken, consts, dtype=None):
        if rank is None or rank < 3:
            raise ValueError("the input's rank is not known (shape inference)")
        return [
            _reduce(
                op,
                node.input[0],
                node.output[0],
                list(range(2, rank)),
                opset,
                node.name or node.output[0],
                taken,
                consts,
            )
        ]

    return build


def _global_lp_pool(node, rank: int | None, opset: int, taken: set[str], consts: list, dtype=None):
    """Nodes computing ``GlobalLpPool`` (module docstring); raises ValueError without a rank."""
    from onnx import helper, numpy_helper

    if rank is None or rank < 3:
        raise ValueError("the input's rank is not known (shape inference)")
    p = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "p"), 2)
    axes = list(range(2, rank))
    base = node.name or node.output[0]
    x, y = node.input[0], node.output[0]

    if p in (1, 2):
        return [_reduce("ReduceL1" if p == 1 else "ReduceL2", x, y, axes, opset, base, taken, consts)]
    cdt = np.dtype(dtype) if dtype is not None and np.dtype(dtype).kind == "f" else np.dtype(np.float32)
    pn, ipn = _fresh(taken, f"{base}/p"), _fresh(taken, f"{base}/inv_p")
    consts.append(numpy_helper.from_array(np.asarray(float(p), cdt), pn))  # the input's type: Pow-7..11 asks one type
    consts.append(numpy_helper.from_array(np.asarray(1.0 / float(p), cdt), ipn))
    a, ap, s = (_fresh(taken, f"{base}/{k}") for k in ("abs", "pow", "sum"))
    return [
        helper.make_node("Abs", [x], [a], name=_fresh(taken, f"{base}/Abs")),
        helper.make_node("Pow", [a, pn], [ap], name=_fresh(taken, f"{base}/Pow")),
        _reduce("ReduceSum", ap, s, axes, opset, base, taken, consts),
        helper.make_node("Pow", [s, ipn], [y], name=_fresh(taken, f"{base}/root")),
    ]


#: Eigen's float32 erf (``generic_fast_erf_float``, Eigen 3.4 ``SpecialFunctionsImpl.h``, also XLA's):
#: ``erf(x) = x * P(x^2) / Q(x^2)`` on ``x`` clamped to [-4, 4]; coefficients from the highest power
ERF_P = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
ERF_Q = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


def _erf(node, rank, opset, taken, consts, dtype=None):
    """``Erf`` as Eigen's rational approximation (:data:`ERF_P`, :data:`ERF_Q`), written with Min, Max,
    Mul, Add and Div in float32 (a float16 input is cast to float32 and back: in float16 the smallest
    coefficients underflow; float64 is refused, the approximation being float32's: ValueError, the node
    is kept). Its error against ``math.erf``, with ONNX Runtime's and TensorFlow's beside it:
    docs/backends-converters.md, 'Measurements: Erf decomposition'."""
    from onnx import TensorProto, helper, numpy_helper

    dtype = np.dtype(dtype or np.float32)
    if dtype.kind != "f" or dtype.itemsize > 4:
        raise ValueError(f"input of type {dtype} (float16/float32 only: the approximation is float32's)")
    base = node.name or node.output[0]

    def const(tag: str, v: float) -> str:
        name = _fresh(taken, f"{base}/{tag}")
        consts.append(numpy_helper.from_array(np.asarray(v, np.float32), name))
        return name

    def op(kind: str, ins: list[str], out: str | None = None, **attrs) -> str:
        out = out or _fresh(taken, f"{base}/{kind.lower()}")
        nodes.append(helper.make_node(kind, ins, [out], name=_fresh(taken, f"{base}/{kind}"), **attrs))
        return out

    nodes: list = []
    src = node.input[0]
    if dtype != np.float32:
        src = op("Cast", [src], to=TensorProto.FLOAT)
    # Clip's bounds are inputs from opset 11 only
    x = op("Max", [op("Min", [src, const("hi", 4.0)]), const("lo", -4.0)])
    x2 = op("Mul", [x, x])

    def horner(coeffs, tag):
        acc = const(f"{tag}0", coeffs[0])
        for k, c in enumerate(coeffs[1:], 1):
            acc = op("Add", [op("Mul", [acc, x2]), const(f"{tag}{k}", c)])
        return acc

    p = op("Mul", [x, horner(ERF_P, "p")])
    if dtype == np.float32:
        op("Div", [p, horner(ERF_Q, "q")], node.output[0])
    else:
        op("Cast", [op("Div", [p, horner(ERF_Q, "q")])], node.output[0], to=helper.np_dtype_to_tensor_dtype(dtype))
    return nodes


#: op type -> builder ``(node, input rank or None, opset, taken names, initializers out, input dtype)
#: -> nodes``
DECOMPOSITIONS = {
    "GlobalLpPool": _global_lp_pool,
    "GlobalMaxPool": _global_pool("ReduceMax"),
    "GlobalAveragePool": _global_pool("ReduceMean"),
    "Erf": _erf,
}


class DecomposePass(GraphPass):
    """Replace the main graph's nodes of the given operator types (keys of :data:`DECOMPOSITIONS`) by
    their elementary ops, in place (constants in the input's float type)."""

    in_place = True

    def __init__(self, ops, only=None):
        self.ops = set(ops) & set(DECOMPOSITIONS)
        self.only = set(only) if only is not None else None  # node names (None: every node of ``ops``)

    def call(self, model) -> PassResult:
        info: dict[str, Any] = {"rewritten": [], "kept": {}}
        targets = [
            n
            for n in model.graph.node
            if n.op_type in self.ops
            and n.domain in ("", "ai.onnx")
            and (self.only is None or (n.name or n.output[0]) in self.only)
        ]
        if not targets:
            return PassResult(model, False, info)
        ranks, opset, taken, consts = _ranks(model), _opset(model), _all_names(model.graph), []
        dtypes = _elem_dtypes(model)
        new = []
        for n in model.graph.node:
            if n not in targets:
                new.append(n)
                continue
            try:
                new.extend(
                    DECOMPOSITIONS[n.op_type](n, ranks.get(n.input[0]), opset, taken, consts, dtypes.get(n.input[0]))
                )
                info["rewritten"].append(n.name or n.output[0])
            except ValueError as err:
                info["kept"][n.name or n.output[0]] = f"{n.op_type}: {err}"
                new.append(n)
        del model.graph.node[:]
        model.graph.node.extend(new)
        model.graph.initializer.extend(consts)
        return PassResult(model, bool(info["rewritten"]), info)


def fold_constant_fake_quantization(model) -> list[str]:
    """In place: every main-graph ``DequantizeLinear(QuantizeLinear(c))`` whose ``c`` is an initializer
    and whose scales and zero points are per-tensor initializers becomes the initializer the pair
    computes (ONNX QuantizeLinear-13: ``q = saturate(round_half_even(c / scale) + zero_point)``,
    DequantizeLinear-13: ``(q - zero_point) * scale``, both in float32; ``Constant`` nodes must be
    folded to initializers first). The QuantizeLinear stays when something else reads it. Returns the
    names of the DequantizeLinear nodes folded. ``onnxruntime.quantization.quantize_static`` writes
    such pairs for constant operands quantized as activations (PP-OCR's ``Add(conv, Reshape(bias))``);
    OpenVINO 2026.4's low-precision ``AddTransformation`` throws on an Add of two dequantized operands
    when one is constant ("Check 'index < m_inputs.size()' failed"), and compiles the folded model.
    Exact in value up to the runtime's own rounding of the same two operations."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for v in n.input:
            readers[v] = readers.get(v, 0) + 1
    outputs = {o.name for o in g.output}
    for n in g.node:  # values read inside sub-graphs: their producers stay
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                outputs |= _all_names(sub)

    def scalar(name: str):
        t = inits.get(name)
        if t is None or int(np.prod(t.dims or [1])) != 1:
            return None
        return numpy_helper.to_array(t).reshape(())

    folded, drop, new = [], set(), []
    for n in g.node:
        if n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        q = producer.get(n.input[0])
        if q is None or q.op_type != "QuantizeLinear" or q.input[0] not in inits or len(q.input) < 3:
            continue
        if list(q.input[1:3]) != list(n.input[1:3]):  # one scale/zero point for the pair
            continue
        scale, zp = scalar(q.input[1]), scalar(q.input[2])
        if scale is None or zp is None or scale.dtype != np.float32 or zp.dtype.kind not in "iu":
            continue
        c = numpy_helper.to_array(inits[q.input[0]])
        if c.dtype != np.float32:
            continue
        info = np.iinfo(zp.dtype)
        qv = np.clip(np.rint(c / scale).astype(np.float64) + int(zp), info.min, info.max)
        value = ((qv - int(zp)).astype(np.float32) * scale).astype(np.float32)
        new.append(numpy_helper.from_array(value, n.output[0]))
        drop.add(id(n))
        folded.append(n.name or n.output[0])
        readers[q.output[0]] -= 1
        if readers[q.output[0]] == 0 and q.output[0] not in outputs:
            drop.add(id(q))
    if folded:
        keep = [n for n in g.node if id(n) not in drop]
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(new)
    return folded


def scalar_if_conditions(model) -> dict[str, Any]:
    """Run :class:`ScalarIfConditionPass` on ``model`` in place; returns its ``info``."""
    return ScalarIfConditionPass()(model).info


def decompose_ops(model, ops, only=None) -> dict[str, Any]:
    """Run :class:`DecomposePass` for ``ops`` (only the nodes named in ``only``, when given) on
    ``model`` in place; returns its ``info``."""
    return DecomposePass(ops, only)(model).info
