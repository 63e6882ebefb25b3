"""Per-node cost and per-value layout hints for the partition.

Cost: FLOPs from inferred shapes (``2 * out_elems * C_in/groups * prod(kernel)`` for Conv,
``2 * out_elems * K`` for MatMul/Gemm, ``out_elems`` for other ops); None when the output shape is
unknown. Layout: walk back through layout-preserving ops to a Transpose, an NCHW op or a graph input
(NHWC for tf2onnx inputs).
"""

from __future__ import annotations

from passes.graph import GraphIndex
from passes.shapes import FLOAT_TYPES

__all__ = ["HEAVY_OPS", "NO_TYPE", "numel", "node_cost", "layout_hint"]

#: ops through which a tensor keeps its layout (for the layout hint): elementwise ops and
#: rank-preserving data movement (Pad, Slice, Concat along any axis ...).
_LAYOUT_KEEP = frozenset(
    {
        "Relu",
        "Sigmoid",
        "Tanh",
        "LeakyRelu",
        "Elu",
        "Selu",
        "HardSigmoid",
        "HardSwish",
        "Clip",
        "Mul",
        "Add",
        "Sub",
        "Div",
        "Pow",
        "Sqrt",
        "Exp",
        "Log",
        "Abs",
        "Neg",
        "Identity",
        "Cast",
        "Erf",
        "Softplus",
        "PRelu",
        "Gelu",
        "Mish",
        "Max",
        "Min",
        "Dropout",
        "Where",
        "Mean",
        "Sum",
        "Reciprocal",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "Softsign",
        "ThresholdedRelu",
        "Celu",
        "Sin",
        "Cos",
        "QuantizeLinear",
        "DequantizeLinear",
        # rank-preserving data movement: the axes keep their meaning
        "Pad",
        "Slice",
        "Split",
        "Concat",
        "Softmax",
        "LogSoftmax",
        "Tile",
        "Expand",
        "ReverseSequence",
    }
)
_NCHW_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "BatchNormalization",
        "InstanceNormalization",
        "LpPool",
        "DepthToSpace",
        "SpaceToDepth",
        "Upsample",
        "Resize",
    }
)
HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"})
NO_TYPE = (0, None)  # the type of a value shape inference did not reach


def numel(shape) -> int:
    """Element count of ``shape``; unknown and symbolic dims count 1, an empty/None shape is 1."""
    if not shape:
        return 1
    n = 1
    for d in shape:
        if isinstance(d, int) and d > 0:
            n *= d
    return n


def node_cost(node, ins: list[str], outs: list[str], types) -> float | None:
    """FLOPs estimate for one node (None if its output shape is unknown)."""
    out_shapes = [types.get(v, (0, None))[1] for v in outs]
    if not out_shapes or out_shapes[0] is None:
        return None
    out_elems = sum(numel(s) for s in out_shapes if s is not None)
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(ins) >= 2:
        w = types.get(node.input[1], (0, None))[1]
        if w and len(w) >= 3:
            if op == "Conv":
                return 2.0 * out_elems * numel(w[1:])
            x = types.get(node.input[0], (0, None))[1]
            return 2.0 * numel(x) * numel(w[1:])
    if op in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul") and ins:
        a = types.get(node.input[0], (0, None))[1]
        if a:
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[0] if (op == "Gemm" and trans_a) else a[-1]
            if isinstance(k, int) and k > 0:
                return 2.0 * out_elems * k
    return float(max(out_elems, 1))


def layout_hint(index: GraphIndex, value: str, types, framework: str) -> str:
    """``NCHW``/``NHWC``/``NCW``/... or ``unknown`` for a float ``value`` (``framework``: the
    partition's scope style; ``tf2onnx`` graph inputs are channels-last)."""
    et, shape = types.get(value, (0, None))
    if shape is None or et not in FLOAT_TYPES:
        return "unknown"
    rank = len(shape)
    v = value
    for _ in range(64):  # walk back through layout-preserving ops
        p = index.producer.get(v)
        if p is None:
            if v in index.graph_inputs:
                return (
                    {3: "NWC", 4: "NHWC", 5: "NDHWC"} if framework == "tf2onnx" else {3: "NCW", 4: "NCHW", 5: "NCDHW"}
                ).get(rank, "unknown")
            return "unknown"
        node = index.nodes[p]
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if perm == [0, 2, 3, 1]:
                return "NHWC"
            if perm == [0, 3, 1, 2]:
                return "NCHW"
            return "unknown"
        if node.op_type in _NCHW_OPS:
            return {3: "NCW", 4: "NCHW", 5: "NCDHW"}.get(rank, "unknown")
        if node.op_type in _LAYOUT_KEEP:
            nxt = [
                u
                for u in index.inputs[p]
                if index.is_data(u) and len(types.get(u, (0, [None] * rank))[1] or []) == rank
            ]
            if not nxt:
                return "unknown"
            v = nxt[0]
            continue
        return "unknown"
    return "unknown"
