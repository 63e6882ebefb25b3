"""Dtypes between an ONNX graph and its onnx2tf conversion (backend ``tf``): which samples are cast
before the converted model takes them, which anchors are cast back to the ONNX graph's dtype (and the
note that says so), and where a graph holds bfloat16.

onnx2tf declares float16 graph inputs float32 and computes float16 graphs in float32
(``onnx2tf/ops/Input.py``; ``auto_cast`` in ``utils/common_functions.py``); the functions here keep
every cast exact or refuse it with the reason.
"""

from __future__ import annotations

import numpy as np

from anpred.errors import BackendError, InputError


def bfloat16_uses(model) -> list[str]:
    """Where the main graph of ``model`` holds bfloat16: graph inputs/outputs, initializers, ``Cast``/
    ``CastLike`` nodes to bfloat16 and value_info entries (``"input 'x'"``, ``"Cast node 'c'"``...)."""
    import onnx

    bf16 = onnx.TensorProto.BFLOAT16
    g = model.graph
    found = [f"input {vi.name!r}" for vi in g.input if vi.type.tensor_type.elem_type == bf16]
    found += [f"output {vi.name!r}" for vi in g.output if vi.type.tensor_type.elem_type == bf16]
    found += [f"initializer {t.name!r}" for t in g.initializer if t.data_type == bf16]
    found += [
        f"{n.op_type} node {n.name or n.output[0]!r}"
        for n in g.node
        if any(a.name == "to" and a.i == bf16 for a in n.attribute)
    ]
    found += [f"value {vi.name!r}" for vi in g.value_info if vi.type.tensor_type.elem_type == bf16]
    return found


def signature_dtypes(fn) -> tuple[list[str], list[str]]:
    """``(input dtypes, output dtypes)`` (numpy names, in order) of the saved ``run`` endpoint's one
    concrete function (read from the SavedModel, so cached conversions of older formats work)."""
    cf = fn.concrete_functions[0]
    outs = cf.structured_outputs
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return (
        [np.dtype(spec.dtype.as_numpy_dtype).name for spec in cf.structured_input_signature[0]],
        [np.dtype(spec.dtype.as_numpy_dtype).name for spec in outs],
    )


def float_info(name: str):
    """``ml_dtypes.finfo`` of a floating dtype name (float16/32/64, bfloat16), None otherwise."""
    import ml_dtypes

    try:
        dt = np.dtype(getattr(ml_dtypes, name)) if name == "bfloat16" else np.dtype(name)
    except TypeError:
        return None
    return ml_dtypes.finfo(dt) if dt.kind == "f" or name == "bfloat16" else None


def widens(src: str, dst: str) -> bool:
    """True when every value of floating dtype ``src`` is exactly a value of floating dtype ``dst``."""
    a, b = float_info(src), float_info(dst)
    return a is not None and b is not None and b.nmant >= a.nmant and b.maxexp >= a.maxexp and b.minexp <= a.minexp


def input_dtype(name: str, declared: str, converted: str) -> str | None:
    """The dtype a sample of ONNX input ``name`` (declared ``declared``) is cast to before the
    converted model takes it (dtype ``converted``); None when no cast is needed.

    onnx2tf declares every float16 graph input float32 (``onnx2tf/ops/Input.py``: ``dtype =
    graph_input.dtype if graph_input.dtype != np.float16 else np.float32``) and computes the float16
    graph in float32 (``utils/common_functions.py``: ``auto_cast`` turns every float16 constant and
    tensor into float32); TensorFlow refuses a float16 tensor for a float32 signature (``Can not cast
    TensorSpec ... float16 to ... float32``). A floating input is cast when the cast is exact (float16
    or bfloat16 -> float32/float64, float32 -> float64); other dtypes are cast per sample with a check
    that every value survives (:func:`feed`).

    Raises:
        BackendError: the converted input is a floating type narrower than the ONNX input's (feeding
            it would round the inputs), or a floating input became a non-floating one.
    """
    if not declared or declared == converted:
        return None
    fd, fc = float_info(declared), float_info(converted)
    if fd is not None and fc is not None and not widens(declared, converted):
        raise BackendError(
            f"tf: onnx2tf made the {declared} input {name!r} {converted}: feeding it would round "
            f"every input value (onnx2tf keeps an input's dtype except float16 -> float32)"
        )
    if (fd is None) != (fc is None):
        raise BackendError(
            f"tf: onnx2tf made the {declared} input {name!r} {converted}; the sample cannot be fed "
            "without changing its values"
        )
    return converted


def feed(name: str, x: np.ndarray, dtype: str | None, backend: str = "tf") -> np.ndarray:
    """``x`` cast to ``dtype`` (None: unchanged); an integer cast that changes a value raises
    :class:`~anpred.errors.InputError` (naming ``backend``)."""
    if dtype is None or x.dtype.name == dtype:
        return x
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    y = x.astype(dtype)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16" and not np.array_equal(y.astype(x.dtype), x):
        raise InputError(
            f"backend {backend}: input {name!r}: the converted model takes {dtype}, and casting this "
            f"{x.dtype} sample to it changes values"
        )
    return y


def output_dtype_note(declared: str, returned: str) -> str:
    """How an anchor returned as ``returned`` by the converted model relates to the ONNX graph's
    ``declared`` dtype, when both are floating and differ ("" otherwise, no cast). The anchor is then
    cast to ``declared``: rounded when the converted model computed it in a wider type (onnx2tf
    computes float16 graphs in float32), widened (without the precision it lacks) when narrower."""
    if not declared or declared == returned or float_info(declared) is None or float_info(returned) is None:
        return ""
    if widens(declared, returned):
        return (
            f"onnx2tf computed this {declared} tensor in {returned} (onnx2tf turns float16 inputs and constants "
            f"into float32: ops/Input.py, utils/common_functions.py auto_cast); rounded to {declared} "
            "as the ONNX graph declares it"
        )
    return (
        f"returned as {returned} by the converted model, cast to {declared} as the ONNX graph declares it "
        f"(values keep {returned} precision)"
    )
