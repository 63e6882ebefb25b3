"""Faults of one reduced-precision implementation: graph rewrites of a *converted* model
(the QDQ int8 model of ``onnxruntime.quantization.quantize_static``, the float16 model of
``onnxconverter_common.float16.convert_float_to_float16``) that one backend runs while its peers run
the intact converted model. Used by :class:`passes.faults.FaultInjectionPass`, which owns the kinds'
registry (:data:`LOWP_KINDS` is merged into :data:`passes.faults.FAULT_KINDS`) and node selection.

Each rewrite is made of standard ONNX operators whose result depends on the data (no constant
sub-expression, no Cast pair, no Mul/Div pair a runtime could fold), so ONNX Runtime (any graph
optimisation level), OpenVINO and the ONNX reference evaluator all compute the fault; each variant
passes ``onnx.checker``. Kinds (``magnitude`` in brackets):

``quantize-rounding``
    One ``QuantizeLinear`` computed with another rounding than ONNX's round-half-to-even (ONNX
    operator spec, QuantizeLinear: "rounding to nearest ties to even") [0: round half away from zero,
    OpenVINO's class: it maps QuantizeLinear to a ``FakeQuantize`` that rounds half away from zero
    (microsoft/onnxruntime#25045, OpenVINO EP: QuantizeLinear results one step off at ties; tract
    had the same rounding, sonos/tract#2850); 1 (default): truncation toward zero, ONNX Runtime's
    class: its CPU float16 QuantizeLinear cast ``x / scale`` to int without rounding
    (microsoft/onnxruntime#18576, fixed by microsoft/onnxruntime#32452: 2041 of 4096 float16 inputs one step off, all
    toward zero)]. Mode 0 changes only exact ties of ``x / scale``, which continuous activations
    practically never hit (measured: no element changed at any stage of the test network nor of
    YOLOv8n, one real image);
    truncation moves about half of the nonzero elements by one step. The node is replaced by float
    operators computing ``q = saturate(rounding(x / scale) + zero_point)`` (``Div``, ``Abs``,
    ``Floor``, ``Sub``, ``Less``, ``Where``, ``Sign``, ``Mul``, ``Add``, ``Max``, ``Min``) and a
    ``Cast`` to the zero point's type, with the node's output name, so the following
    DequantizeLinear and every consumer see it. Half away from zero is ``sign(t) * (floor(|t|) +
    [|t| - floor(|t|) >= 0.5])`` (exact in binary floating point, unlike ``floor(|t| + 0.5)``, which
    rounds 0.49999997 up). Per-tensor and per-axis scales; blocked quantization (opset 21
    ``block_size``) is refused. Side effect on ONNX Runtime's optimised int8 path: the
    QuantizeLinear's producer loses its QDQ group (its output no longer feeds a QuantizeLinear), so
    that one operator is computed in float on the dequantized values, the fake-quant value (exact
    products, float32 sum), as ``ort-int8-noopt`` computes it everywhere.
``zero-point``
    One ``QuantizeLinear``'s zero point off by ``k`` steps in that node only [k, an integer != 0]: a
    private copy of the zero-point initializer (the paired DequantizeLinear keeps the original), so
    the dequantized tensor is shifted by ``k`` quantization steps (``k * scale``) except where the
    integer saturates. Class: a zero point misread or recomputed by one implementation (e.g. a
    symmetric/asymmetric mix-up, a uint8 <-> int8 conversion of activations off by one). The result
    must stay in the zero point's integer range (a uint8 zero point 0 with k = -1 is refused). The
    QuantizeLinear node itself is kept, so ONNX Runtime still fuses its QDQ group (e.g. into
    QLinearConv with the shifted output zero point).
``accumulator-saturation``
    An integer accumulation narrower than int32 [bits, default 16: an int16 intermediate]: the float
    output ``y`` of one ``Conv``/``MatMul``/``Gemm`` whose data input and weight come from
    DequantizeLinear nodes is clipped to ``+-(2**(bits-1) - 1) * s_x * s_w``, ``s_x``/``s_w`` the
    input's and the weight's DequantizeLinear scales (per-tensor input; a per-channel weight scale
    broadcast along the output channels). In the integer domain this saturates the zero-point
    corrected accumulator (bias included: quantize_static's int32 bias has scale ``s_x * s_w``) at the
    narrower type's range. The AVX2 u8s8 kernels of ONNX Runtime's MLAS (``VPMADDUBSW``) saturate
    each *pair* of products to int16 instead (see tests/emulated_cpu.py: 64 computed as 32.376), not
    the whole sum (public reports of that class: microsoft/onnxruntime#6004, an int8 BERT wrong on an
    AVX2-only CPU; microsoft/onnxruntime#16105, QLinearConv wrong on the AVX2 kernel, right on
    AVX-512); both are the same class: an intermediate narrower than the int32 accumulator the
    ONNX QLinear/QDQ semantics assume clips dot products whose magnitude exceeds its range, leaving
    every smaller one exact, so the deviation is a one-sided loss concentrated on the
    largest-magnitude outputs. Clipping the sum is the deterministic, kernel-independent member of
    the class (pair saturation depends on the data order and the kernel's blocking). Applied after
    the node, the clip keeps ONNX Runtime from fusing the node into its integer kernel (its output no
    longer feeds a QuantizeLinear): that operator is computed in float, then clipped.
``fp16-overflow``
    A float16 accumulation that overflows [m, default 14]: the output ``y`` of one ``Conv``/
    ``ConvTranspose``/``MatMul``/``Gemm`` (or, chosen by name, any node with a float16 output)
    becomes what ``float16(y * 2**m) / 2**m`` gives in IEEE float16 arithmetic: ``+-inf`` where
    ``|y| * 2**m`` rounds past 65504 (``|y| >= 65520 / 2**m``, the rounding boundary), ``y``
    unchanged elsewhere (scaling by a power of two is exact). Computed as ``Where(Less(Abs(float32(y)),
    65520 / 2**m), y, Sign(y) * inf)`` rather than with the ``Mul``/``Div`` pair itself: measured with
    ONNX Runtime 1.32 on a float16 Conv network, the CPU provider computes float16 Conv/Mul/Div in
    float32 (it inserts Casts and, fully optimised, removes the intermediate ones) and its
    ``ConvMulFusion`` folds the Mul into the Conv weights, and OpenVINO compiles float16 models in
    f32 or bf16, so a literal ``(y * 2**m) / 2**m`` overflowed on the reference evaluator only. The
    comparison is made in float32, where 65520 / 2**m is exact. A float32 output (an op the converter
    kept in float32) gets the same overflow and keeps its float32 values elsewhere (no extra float16
    rounding: one fault, not two). The default m = 14 (threshold 3.999) is where the fault is active
    on ordinary activations without making most of a stage infinite (the sweep over m on YOLOv8n:
    docs/evaluation.md, 'Measurements: fp16-overflow threshold').
    Class: float16 accumulators or outputs that overflow where float32 would not (ROCm/AMDMIGraphX#850,
    fp16 reduce/GEMM/convolution accumulation overflow; microsoft/onnxruntime#26732, a WebGPU float16
    MatMul accumulator overflowing on a real model; vllm-project/vllm#33972, Marlin's fp16
    accumulation).

Runtimes must compute the rewrite in float32 (or float16 for ``fp16-overflow``'s own tensor): on a CPU
with bf16 (AVX512_BF16/AMX), OpenVINO's default inference precision is bf16, which rounds the
rewrite's float operators (``x / scale`` to 8 significant bits) and so changes the fault itself
(docs/evaluation.md, 'Measurements: bf16 and the rewritten faults'); compile with
``INFERENCE_PRECISION_HINT`` f32 (the tests do).
"""

from __future__ import annotations

import numpy as np

from passes.fault_truth import FaultError
from passes.protos import attribute_value

__all__ = ["LOWP_KINDS", "ACCUMULATING_OPS", "QDQ_COMPUTE_OPS", "lowp_applicable", "inject_lowp"]

# kind -> (default magnitude, description)
LOWP_KINDS: dict[str, tuple[float, str]] = {
    "quantize-rounding": (
        1.0,
        "one QuantizeLinear rounding half away from zero (0) or truncating (1) instead of half to even",
    ),
    "zero-point": (1.0, "one QuantizeLinear's zero point off by k steps (its DequantizeLinear keeps it)"),
    "accumulator-saturation": (
        16.0,
        "one quantized Conv/MatMul/Gemm accumulation saturating at a signed integer of that many bits",
    ),
    "fp16-overflow": (14.0, "one accumulation overflowing float16 as if its output were scaled by 2**m"),
}

ACCUMULATING_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
QDQ_COMPUTE_OPS = ("Conv", "MatMul", "Gemm")

_FLOAT, _FLOAT16, _UINT8, _INT8, _UINT16, _INT16 = 1, 10, 2, 3, 4, 5
_INT_RANGES = {_UINT8: (0, 255), _INT8: (-128, 127), _UINT16: (0, 65535), _INT16: (-32768, 32767)}


def _value_info(inferred, value: str):
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        if vi.name == value:
            return vi
    return None


def _elem(inferred, value: str) -> int:
    vi = _value_info(inferred, value)
    if vi is not None:
        return vi.type.tensor_type.elem_type
    for t in inferred.graph.initializer:
        if t.name == value:
            return t.data_type
    return 0


def _rank(inferred, value: str) -> int | None:
    vi = _value_info(inferred, value)
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    return len(vi.type.tensor_type.shape.dim)


def _init(model, name: str):
    return next((t for t in model.graph.initializer if t.name == name), None)


def _init_array(model, name: str, what: str, node) -> np.ndarray:
    from onnx import numpy_helper

    t = _init(model, name)
    if t is None:
        raise FaultError(
            f"{what} {name!r} of {node.op_type} {node.name!r} is not an initializer; "
            "only constant initializers are supported"
        )
    return numpy_helper.to_array(t)


def _producer(model, value: str):
    return next((n for n in model.graph.node if value in n.output), None)


def _is_data_quantize(model, node, constant: set[str]) -> bool:
    return node.op_type == "QuantizeLinear" and node.input[0] not in constant


def _dq_scale(model, value: str, node, what: str) -> tuple[np.ndarray, int]:
    """Scale array and axis of the DequantizeLinear producing ``value`` (input ``what`` of ``node``)."""
    dq = _producer(model, value)
    if dq is None or dq.op_type != "DequantizeLinear":
        raise FaultError(
            f"accumulator-saturation: the {what} of {node.op_type} {node.name!r} does not come from a "
            "DequantizeLinear node"
        )
    if attribute_value(dq, "block_size", 0):
        raise FaultError(f"accumulator-saturation: DequantizeLinear {dq.name!r} is blocked (block_size); not supported")
    return _init_array(model, dq.input[1], "scale", dq).astype(np.float64), int(attribute_value(dq, "axis", 1))


def lowp_applicable(model, node, kind: str, constant: set[str], explicit: bool = False) -> bool:
    """Whether ``kind`` (a key of :data:`LOWP_KINDS`) can be injected at ``node`` of ``model`` (shape
    inferred). ``constant``: the values computed from initializers only (never faulted: a
    QuantizeLinear of a weight is folded by every runtime). ``explicit``: the node was named by the
    caller (``fp16-overflow`` then accepts any node with a float16/float32 output, not only the
    accumulating ops)."""
    out = node.output[0] if node.output else ""
    if kind in ("quantize-rounding", "zero-point"):
        if not _is_data_quantize(model, node, constant) or attribute_value(node, "block_size", 0):
            return False
        zp = node.input[2] if len(node.input) > 2 else ""
        if zp and _init(model, zp) is None:
            return False
        t = _init(model, zp).data_type if zp else int(attribute_value(node, "output_dtype", 0) or _UINT8)
        return t in _INT_RANGES
    if kind == "accumulator-saturation":
        if node.op_type not in QDQ_COMPUTE_OPS or len(node.input) < 2 or not out:
            return False
        srcs = [_producer(model, v) for v in node.input[:2]]
        return (
            all(
                p is not None and p.op_type == "DequantizeLinear" and _init(model, p.input[1]) is not None for p in srcs
            )
            and node.input[0] not in constant
        )
    if kind == "fp16-overflow":
        if not out or out in constant or _elem(model, out) not in (_FLOAT, _FLOAT16):
            return False
        return node.op_type in ACCUMULATING_OPS or (explicit and _elem(model, out) == _FLOAT16)
    raise FaultError(f"unknown reduced-precision fault kind {kind!r}; known: {', '.join(LOWP_KINDS)}")


class _Builder:
    """Appends constants and nodes for one injection (names derived from the faulted value)."""

    def __init__(self, model, prefix: str):
        self.model, self.prefix, self.nodes, self.k = model, prefix, [], 0

    def const(self, tag: str, value, dtype) -> str:
        from onnx import numpy_helper

        name = f"{self.prefix}_{tag}"
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        import onnx.helper as h

        out = out or f"{self.prefix}_{op_type.lower()}{self.k}"
        self.nodes.append(h.make_node(op_type, inputs, [out], name=f"{self.prefix}_n{self.k}", **attrs))
        self.k += 1
        return out


def _broadcast(arr: np.ndarray, axis: int, rank: int | None, node, what: str) -> np.ndarray:
    """``arr`` (a scalar or a 1-D per-axis vector) shaped to broadcast along ``axis`` of a rank-``rank``
    tensor."""
    if arr.size == 1:
        return arr.reshape(())
    if rank is None:
        raise FaultError(
            f"{node.op_type} {node.name!r}: per-axis {what} needs the input's rank (shape inference failed)"
        )
    axis = axis % rank
    shape = [1] * rank
    shape[axis] = arr.size
    return arr.reshape(shape)


def _quantize_parts(model, inferred, node):
    """(scale array shaped for broadcasting, zero point array (same shape), zero point type)."""
    scale = _init_array(model, node.input[1], "scale", node)
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name:
        zp_t = _init(model, zp_name)
        zp = _init_array(model, zp_name, "zero point", node)
        ztype = zp_t.data_type
    else:
        ztype = int(attribute_value(node, "output_dtype", 0) or _UINT8)
        zp = np.zeros(scale.shape, np.int64)
    if ztype not in _INT_RANGES:
        raise FaultError(f"QuantizeLinear {node.name!r}: zero point type {ztype} is not an 8/16-bit integer")
    rank = _rank(inferred, node.input[0])
    axis = int(attribute_value(node, "axis", 1))
    return (
        _broadcast(scale, axis, rank, node, "scale"),
        _broadcast(zp.astype(np.int64), axis, rank, node, "zero point"),
        ztype,
    )


def _inject_quantize_rounding(model, inferred, node, idx, magnitude: float):
    import onnx

    mode = int(magnitude)
    if magnitude != mode or mode not in (0, 1):
        raise FaultError(
            f"quantize-rounding: magnitude must be 0 (half away from zero) or 1 (truncation), got {magnitude:g}"
        )
    scale, zp, ztype = _quantize_parts(model, inferred, node)
    fdt = onnx.helper.tensor_dtype_to_np_dtype(_init(model, node.input[1]).data_type)
    lo, hi = _INT_RANGES[ztype]
    x, out = node.input[0], node.output[0]
    b = _Builder(model, f"{out}__anpred_fault")
    t = b.op("Div", [x, b.const("scale", scale, fdt)])
    a = b.op("Abs", [t])
    fl = b.op("Floor", [a])
    if mode == 0:  # sign(t) * (floor|t| + [|t| - floor|t| >= 0.5]); the subtraction is exact
        frac = b.op("Sub", [a, fl])
        below = b.op("Less", [frac, b.const("half", 0.5, fdt)])
        up = b.op("Add", [fl, b.const("one", 1.0, fdt)])
        mag = b.op("Where", [below, fl, up])
    else:  # truncation toward zero: sign(t) * floor|t|
        mag = fl
    r = b.op("Mul", [mag, b.op("Sign", [t])])
    q = b.op("Add", [r, b.const("zp", zp.astype(fdt), fdt)])
    q = b.op("Max", [q, b.const("qmin", lo, fdt)])
    q = b.op("Min", [q, b.const("qmax", hi, fdt)])
    b.op("Cast", [q], out, to=ztype)
    name = node.name
    del model.graph.node[idx]
    for k, n in enumerate(b.nodes):
        model.graph.node.insert(idx + k, n)
    how = "half away from zero" if mode == 0 else "truncation toward zero"
    return out, f"QuantizeLinear {name} rounds by {how} instead of half to even"


def _inject_zero_point(model, inferred, node, idx, magnitude: float):
    from onnx import helper, numpy_helper

    k = int(magnitude)
    if magnitude != k or k == 0:
        raise FaultError(f"zero-point: magnitude must be a nonzero integer number of steps, got {magnitude:g}")
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name:
        t = _init(model, zp_name)
        zp, ztype = numpy_helper.to_array(t), t.data_type
    else:
        ztype = int(attribute_value(node, "output_dtype", 0) or _UINT8)
        scale = _init_array(model, node.input[1], "scale", node)
        zp = np.zeros(scale.shape, helper.tensor_dtype_to_np_dtype(ztype))
    lo, hi = _INT_RANGES[ztype]
    new = zp.astype(np.int64) + k
    if new.min() < lo or new.max() > hi:
        raise FaultError(
            f"zero-point: zero point {zp.ravel().tolist()[:4]} {'+' if k > 0 else '-'} {abs(k)} of "
            f"QuantizeLinear {node.name!r} leaves the range {lo}..{hi} of its type"
        )
    new_name = f"{node.output[0]}__anpred_fault_zp"
    model.graph.initializer.append(numpy_helper.from_array(new.astype(zp.dtype), new_name))
    while len(node.input) < 3:
        node.input.append("")
    node.input[2] = new_name
    return node.output[0], f"zero point of QuantizeLinear {node.name} {zp.ravel().tolist()[:4]} {k:+d}"


def _reroute(node) -> tuple[str, str]:
    orig = node.output[0]
    raw = f"{orig}__anpred_fault_raw"
    node.output[0] = raw
    return raw, orig


def _inject_accumulator_saturation(model, inferred, node, idx, magnitude: float):
    bits = int(magnitude)
    if magnitude != bits or not 2 <= bits <= 31:
        raise FaultError(f"accumulator-saturation: accumulator bits must be an integer in 2..31, got {magnitude:g}")
    s_x, _ = _dq_scale(model, node.input[0], node, "input")
    s_w, w_axis = _dq_scale(model, node.input[1], node, "weight")
    if s_x.size != 1:
        raise FaultError(
            f"accumulator-saturation: the input of {node.op_type} {node.name!r} is quantized per axis; "
            "only a per-tensor input scale is supported"
        )
    rank = _rank(inferred, node.output[0])
    if s_w.size > 1:  # per output channel: Conv weight axis 0 -> output axis 1; MatMul/Gemm -> last axis
        w_rank = _rank(inferred, node.input[1]) or 2
        want = (
            0
            if node.op_type == "Conv"
            else (0 if node.op_type == "Gemm" and attribute_value(node, "transB", 0) else w_rank - 1)
        )
        if w_axis % w_rank != want:
            raise FaultError(
                f"accumulator-saturation: the weight of {node.op_type} {node.name!r} is quantized along "
                f"axis {w_axis}, not along its output channels"
            )
        out_axis = 1 if node.op_type == "Conv" else -1
        s_w = _broadcast(s_w.ravel(), out_axis, rank, node, "weight scale")
    else:
        s_w = s_w.reshape(())
    alpha = abs(float(attribute_value(node, "alpha", 1.0))) if node.op_type == "Gemm" else 1.0
    bound = (2.0 ** (bits - 1) - 1) * float(s_x.ravel()[0]) * s_w * alpha
    import onnx

    fdt = onnx.helper.tensor_dtype_to_np_dtype(_elem(inferred, node.output[0]) or _FLOAT)
    raw, orig = _reroute(node)
    b = _Builder(model, f"{orig}__anpred_fault")
    lo = b.op("Max", [raw, b.const("lo", -bound, fdt)])
    b.op("Min", [lo, b.const("hi", bound, fdt)], orig)
    for k, n in enumerate(b.nodes):
        model.graph.node.insert(idx + 1 + k, n)
    first = float(np.asarray(bound).ravel()[0])
    return orig, (
        f"{node.op_type} {node.name} accumulates in int{bits}: output clipped to +-{first:.6g}"
        + (" (per channel)" if np.asarray(bound).size > 1 else "")
    )


def _inject_fp16_overflow(model, inferred, node, idx, magnitude: float):
    m = int(magnitude)
    if magnitude != m or not 0 <= m <= 100:
        raise FaultError(f"fp16-overflow: the scale exponent m must be an integer in 0..100, got {magnitude:g}")
    elem = _elem(inferred, node.output[0])
    fdt = np.float16 if elem == _FLOAT16 else np.float32
    threshold = 65520.0 / 2.0**m  # float16(v) is +-inf iff |v| >= 65520 (round to nearest, 65504 = max)
    raw, orig = _reroute(node)
    b = _Builder(model, f"{orig}__anpred_fault")
    a32 = b.op("Abs", [b.op("Cast", [raw], to=_FLOAT) if elem == _FLOAT16 else raw])
    fin = b.op("Less", [a32, b.const("thr", threshold, np.float32)])
    inf = b.op("Mul", [b.op("Sign", [raw]), b.const("inf", np.inf, fdt)])
    b.op("Where", [fin, raw, inf], orig)
    for k, n in enumerate(b.nodes):
        model.graph.node.insert(idx + 1 + k, n)
    return orig, (
        f"{node.op_type} {node.name} overflows float16 as if scaled by 2**{m}: +-inf where |y| >= {threshold:.6g}"
    )


_INJECT = {
    "quantize-rounding": _inject_quantize_rounding,
    "zero-point": _inject_zero_point,
    "accumulator-saturation": _inject_accumulator_saturation,
    "fp16-overflow": _inject_fp16_overflow,
}


def inject_lowp(model, inferred, node, idx: int, kind: str, magnitude: float) -> tuple[str, str]:
    """Inject ``kind`` at ``node`` (file position ``idx`` in ``model``, edited in place; ``inferred``:
    the shape-inferred copy). Returns ``(value, description)``: the tensor whose values change first
    and a one-line account.

    Raises:
        FaultError: a magnitude out of range, a zero point leaving its type's range, an unsupported
            quantization (blocked, per-axis input scale, weight quantized along another axis).
    """
    return _INJECT[kind](model, inferred, node, idx, float(magnitude))
