"""Dropping the empty inputs of ``Concat`` (:func:`drop_empty_concat_inputs`): a graph pass for the
backends that compile the model into a library or a weight file of their own (``tvm``, ``ncnn``).

An input of a ``Concat`` that has 0 elements along the concatenation axis contributes nothing to the
result, so removing it leaves the result bit-identical (ONNX ``Concat``: the output's axis is the sum
of the inputs'). Some converters cannot carry such a tensor (measured on a model ending with
``Concat(x, empty[1, 4, 0], ones)``: TVM 0.22 compiles and runs it in memory, but its exported library
does not load back, ``Check failed: (read_ret) is false: Invalid DLTensor file format`` in
``Tensor::Load``, the zero-size constant; pnnx writes the empty initializer as a ``MemoryData`` layer
whose weights ncnn cannot load, ``layer load_model 2 empty failed``)."""

from __future__ import annotations

__all__ = ["drop_empty_concat_inputs"]


def _known_shapes(model) -> dict[str, list[int | None]]:
    """Static shapes of the main graph's tensors: initializers, ``Constant`` values, and what ONNX
    shape inference finds (nothing from it when it fails)."""
    import onnx

    shapes: dict[str, list[int | None]] = {t.name: list(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    shapes[n.output[0]] = list(a.t.dims)
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model shape inference cannot type keeps what is known
        return shapes
    for vi in list(typed.graph.value_info) + list(typed.graph.input) + list(typed.graph.output):
        tt = vi.type.tensor_type
        if vi.name not in shapes and tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return shapes


def drop_empty_concat_inputs(model) -> int:
    """Remove, in place, every input of a main-graph ``Concat`` whose static size along the axis is 0,
    where at least one other input remains, and the empty initializers no node uses any more. Returns
    the number of inputs removed. Never raises."""
    concats = [n for n in model.graph.node if n.op_type == "Concat" and n.domain in ("", "ai.onnx")]
    if not concats:
        return 0
    shapes = _known_shapes(model)
    dropped, gone = 0, set()
    for n in concats:
        axis = next((a.i for a in n.attribute if a.name == "axis"), None)
        if axis is None:
            continue
        keep = []
        for x in n.input:
            s = shapes.get(x)
            ax = axis + len(s) if s is not None and axis < 0 else axis
            empty = s is not None and 0 <= ax < len(s) and s[ax] == 0
            if not empty:
                keep.append(x)
        if keep and len(keep) < len(n.input):
            gone.update(set(n.input) - set(keep))
            dropped += len(n.input) - len(keep)
            del n.input[:]
            n.input.extend(keep)
    used = {x for nd in model.graph.node for x in nd.input} | {o.name for o in model.graph.output}
    unused = [t for t in model.graph.initializer if t.name in gone and t.name not in used]
    for t in unused:  # the empty initializers themselves (a converter may still write an unused one)
        model.graph.initializer.remove(t)
    return dropped
