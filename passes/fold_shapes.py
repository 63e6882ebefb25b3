"""Folding shape computations at concrete input shapes (:func:`fold_shape_computations`): a graph pass
shared by the backends that compile for concrete shapes (``tvm``) and by :mod:`passes.bind_inputs`.
Only integer/bool arithmetic that depends on tensor shapes and constants is folded; no activation."""

from __future__ import annotations

import numpy as np

from passes.protos import subgraph_reads

__all__ = ["fold_shape_computations", "fold_constant_nodes", "FOLD_MAX_ELEMENTS", "FOLD_ROUNDS"]


#: largest folded result (elements): shape arithmetic is tiny; a bigger shape-derived tensor (a
#: ``ConstantOfShape`` fill) stays in the graph for the runtime
FOLD_MAX_ELEMENTS = 4096
FOLD_ROUNDS = 8
_NOT_FOLDED = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")


def fold_shape_computations(model, shapes: dict[str, list[int]]):
    """``(model', n)``: a copy of ``model`` specialised to the concrete input ``shapes``, in which
    every computation that depends on tensor *shapes* only is replaced by its value (an initializer),
    and the number of nodes folded.

    A value is shape-derived when a ``Shape``/``Size`` node produces it from a tensor whose shape ONNX
    shape inference (``data_prop=True``, at the given input shapes) knows completely, or when a node
    computes it from shape-derived values and constants only (initializers, ``Constant`` nodes); a
    node computing integer/bool results from constants alone (index arithmetic such as
    ``Cast(Constant)`` feeding a ``Concat`` of a ``Reshape`` target, PP-OCRv4 rec) is folded too, while
    float arithmetic on constants is left to the runtime. Folded nodes (default domain, no sub-graph,
    not random, inputs and results of at most :data:`FOLD_MAX_ELEMENTS` elements, not graph outputs)
    are evaluated with
    ``onnx.reference.ReferenceEvaluator`` (numpy) at the model's opset; nothing that depends on an
    input's *values* is folded, so the runtime still computes every activation. Used where a
    runtime's importer wants static ``Reshape`` targets (TVM's Relax frontend refuses a computed
    shape tensor: "Reshape requires the input new shape to be Shape", PP-OCR rec/cls).
    Folding repeats (at most :data:`FOLD_ROUNDS` rounds) while it finds something: a folded
    ``Reshape`` target lets shape inference know the shapes after it, whose ``Shape`` then folds.
    Never raises: a model that shape inference cannot handle is returned unchanged (n = 0)."""
    total = 0
    for _ in range(FOLD_ROUNDS):
        model, n = _fold_once(model, shapes)
        total += n
        if not n:
            break
    return model, total


def _fold_once(model, shapes: dict[str, list[int]]):
    """One round of :func:`fold_shape_computations`: ``(model', nodes folded)``."""

    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    del m.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - no folding without shapes
        return model, 0
    static: dict[str, list[int]] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim):
            static[vi.name] = [d.dim_value for d in tt.shape.dim]
    inits = {t.name: t for t in m.graph.initializer}
    consts: dict = {}  # Constant node output -> the node (None once evaluated)
    known: dict[str, np.ndarray] = {}
    outputs = {o.name for o in m.graph.output}
    opsets = list(m.opset_import)
    folded: set[int] = set()
    derived: set[str] = set()

    def value(name: str):
        if name in known:
            return known[name]
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = consts.get(name)
        if node is None:
            return None
        try:  # a Constant node, evaluated when a shape computation reads it
            consts[name] = None
            known[name] = np.asarray(ReferenceEvaluator(_single(node, [], opsets)).run(None, {})[0])
            return known[name]
        except Exception:  # noqa: BLE001 - unusual Constant: not folded through
            return None

    for i, n in enumerate(m.graph.node):
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type == "Constant":
            consts[n.output[0]] = n
            continue
        if (
            any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
            or n.op_type in _NOT_FOLDED
            or any(o in outputs for o in n.output)
        ):
            continue
        ins = [x for x in n.input if x]
        if n.op_type in ("Shape", "Size"):
            if not ins or ins[0] not in static:
                continue
            res = [_shape_value(n, static[ins[0]])]
        elif not ins or any(_is_large(x, inits, static) for x in ins) or any(value(x) is None for x in ins):
            continue
        else:
            feeds = {x: value(x) for x in ins}
            try:
                res = ReferenceEvaluator(_single(n, [(x, feeds[x]) for x in ins], opsets)).run(None, feeds)
            except Exception:  # noqa: BLE001 - the runtime computes it then
                continue
            # constants only: fold index arithmetic (integer/bool results), leave float math to the runtime
            if not any(x in derived for x in ins) and not all(np.asarray(r).dtype.kind in "iub" for r in res):
                continue
        if any(np.asarray(r).size > FOLD_MAX_ELEMENTS for r in res):
            continue
        for o, r in zip(n.output, res):
            known[o] = np.asarray(r)
            derived.add(o)
        folded.add(i)
    if not folded:
        return model, 0
    keep = [n for i, n in enumerate(m.graph.node) if i not in folded]
    used = {x for n in keep for x in n.input} | subgraph_reads(keep)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    for name in sorted(derived & used):
        m.graph.initializer.append(numpy_helper.from_array(known[name], name))
    return m, len(folded)


def _is_large(name: str, inits: dict, static: dict) -> bool:
    """True for an initializer (or a value of inferred static shape) of more than
    :data:`FOLD_MAX_ELEMENTS` elements: weights, which no shape computation reads whole."""
    t = inits.get(name)
    dims = list(t.dims) if t is not None else static.get(name)
    return dims is not None and int(np.prod(dims, dtype=np.int64)) > FOLD_MAX_ELEMENTS


def _shape_value(node, shape: list[int]) -> np.ndarray:
    """What ``Shape`` (with its opset-15 ``start``/``end``, negative counted from the rank and clamped
    to [0, rank]) or ``Size`` returns for a tensor of static ``shape``: int64."""
    if node.op_type == "Size":
        return np.asarray(int(np.prod(shape, dtype=np.int64)), np.int64)
    r = len(shape)
    att = {a.name: a.i for a in node.attribute}
    start, end = att.get("start", 0), att.get("end", r)
    start, end = (min(max(v + r if v < 0 else v, 0), r) for v in (start, end))
    return np.asarray(shape[start:end], np.int64)


def _single(node, feeds: list[tuple[str, np.ndarray]], opsets):
    """A one-node model running ``node`` on inputs of the given arrays' dtypes/shapes."""
    from onnx import helper

    ins = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), list(np.shape(a)))
        for name, a in feeds
    ]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    return helper.make_model(helper.make_graph([node], "fold", ins, outs), opset_imports=opsets)


def fold_constant_nodes(model) -> int:
    """Turn every ``Constant`` node of the main graph whose output is not a graph output into an
    initializer of the same name, in place. Returns the number folded. onnx2torch's Conv and
    ConvTranspose converters read weights from initializers only (paddle2onnx models such as
    PP-OCR hold them in Constant nodes: ``KeyError: 'conv2d_0.w_0'``)."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    outputs = {o.name for o in graph.output}
    keep, folded = [], 0
    for node in graph.node:
        if (
            node.op_type == "Constant"
            and node.domain in ("", "ai.onnx")
            and node.output[0] not in outputs
            and len(node.attribute) == 1
            and node.attribute[0].name in ("value", "value_float", "value_floats", "value_int", "value_ints")
        ):
            attr = node.attribute[0]
            if attr.name == "value":
                t = onnx.TensorProto()
                t.CopyFrom(attr.t)
            else:
                v = helper.get_attribute_value(attr)
                dtype = np.float32 if attr.name.startswith("value_float") else np.int64
                t = numpy_helper.from_array(np.asarray(v, dtype=dtype))
            t.name = node.output[0]
            graph.initializer.append(t)
            folded += 1
        else:
            keep.append(node)
    if folded:
        del graph.node[:]
        graph.node.extend(keep)
    return folded
