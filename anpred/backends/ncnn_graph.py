"""The edits the ``ncnn`` backend (:mod:`anpred.backends.ncnn_pnnx`) makes to its scratch copy of the
ONNX graph before pnnx converts it: a batch-axis ``Gather`` pnnx cannot lower rewritten as the equal
``Squeeze``/``Identity``, integer inputs declared float32 (ncnn Mats hold float32) and cast back, and
a unit batch axis given to an input whose first dimension is not 1; and the input rule those edits
allow (:func:`input_dtype_refusal`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["INT_INPUTS", "batch_gathers_as_squeeze", "input_dtype_refusal", "float_for_int_inputs", "add_unit_batch"]


def batch_gathers_as_squeeze(model) -> int:
    """In place: every ``Gather(data, i)`` with ``axis`` 0, ``i`` an initializer equal to 0 or -1 (a
    scalar, or a list of one), and ``data`` of first dimension 1 (ONNX shape inference at the model's
    static input shapes) becomes ``Squeeze(data, axes=[0])`` (scalar ``i``) or ``Identity(data)``
    (``[i]``): the same values and shape. Returns how many."""
    import onnx
    from onnx import helper, numpy_helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no shapes: nothing rewritten
        return 0
    first = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value"):
            first[vi.name] = dims[0].dim_value
    for t in model.graph.initializer:
        if len(t.dims):
            first[t.name] = t.dims[0]
    inits = {t.name: t for t in model.graph.initializer}
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    n_done = 0
    for k, n in enumerate(model.graph.node):
        if n.op_type != "Gather" or n.domain not in ("", "ai.onnx") or n.input[1] not in inits:
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
        idx = numpy_helper.to_array(inits[n.input[1]])
        if (
            axis != 0
            or idx.ndim > 1
            or idx.size != 1
            or int(idx.reshape(-1)[0]) not in (0, -1)
            or first.get(n.input[0]) != 1
        ):
            continue
        if idx.ndim == 1:
            new = helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name or n.output[0])
        elif opset >= 13:
            ax = f"{n.output[0]}__anpred_axes0"
            if ax not in inits:
                inits[ax] = numpy_helper.from_array(np.array([0], np.int64), ax)
                model.graph.initializer.append(inits[ax])
            new = helper.make_node("Squeeze", [n.input[0], ax], [n.output[0]], name=n.name or n.output[0])
        else:
            new = helper.make_node("Squeeze", [n.input[0]], [n.output[0]], name=n.name or n.output[0], axes=[0])
        model.graph.node[k].CopyFrom(new)
        n_done += 1
    return n_done


#: integer input types fed to ncnn as float32 (its Mats hold float32): exact for |v| <= 2^24
INT_INPUTS = ("int8", "uint8", "int16", "uint16", "int32", "int64")


def input_dtype_refusal(name: str, dtype: str) -> str:
    """Why an input of element type ``dtype`` cannot be fed to ncnn ("" when it can: float32 and the
    integer types of :data:`INT_INPUTS`, fed as float32 and cast back in the graph)."""
    if dtype == "float32" or dtype in INT_INPUTS:
        return ""
    return (
        f"ncnn: input {name!r} is {dtype}; ncnn Mats hold float32 and this backend feeds float32 inputs and "
        "integer ones (cast back in the graph) only"
    )


def float_for_int_inputs(model, ints: dict[str, str]) -> None:
    """In place: each integer graph input in ``ints`` (name -> numpy dtype name) is declared float32
    (ncnn Mats hold float32); an input read only through ``Cast``s to float32 keeps its name and those
    Casts become Identities, any other is renamed ``<name>__anpred_float`` and ``Cast`` back to its
    integer type into the original name (pnnx may fail to lower that Cast: its error names it). The
    samples are fed as float32, exact for |v| <= 2^24 (checked at run time)."""
    from onnx import TensorProto, helper

    nodes = []
    for vi in model.graph.input:
        if vi.name not in ints:
            continue
        orig = vi.name
        to = vi.type.tensor_type.elem_type
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
        users = [n for n in model.graph.node if orig in n.input]
        if users and all(
            n.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT for a in n.attribute) for n in users
        ):
            # read only through Casts to float32: those become Identities of the float input (the values are
            # the same integers), since pnnx cannot lower a Cast onto an ncnn layer ("todo Tensor.to")
            for n in users:
                del n.attribute[:]
                n.op_type = "Identity"
            continue
        vi.name = f"{orig}__anpred_float"
        nodes.append(helper.make_node("Cast", [vi.name], [orig], name=f"anpred_int/{orig}", to=to))
    for n in reversed(nodes):
        model.graph.node.insert(0, n)


def add_unit_batch(model, names: list[str]) -> None:
    """In place: each graph input in ``names`` (shape S) becomes ``<name>__anpred_batched`` of shape
    ``[1, *S]``, followed by ``Squeeze(axis 0)`` into the original name, so that pnnx's batch axis is
    a unit one and the input's own dims all reach the ncnn Mat."""
    from onnx import helper, numpy_helper

    if not names:
        return
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    nodes = []
    for vi in model.graph.input:
        if vi.name not in names:
            continue
        orig = vi.name
        vi.name = f"{orig}__anpred_batched"
        shape = vi.type.tensor_type.shape
        old = [type(d)() for d in shape.dim]
        for o, d in zip(old, shape.dim):
            o.CopyFrom(d)
        del shape.dim[:]
        shape.dim.add().dim_value = 1
        for o in old:
            shape.dim.add().CopyFrom(o)
        if opset >= 13:
            axes = numpy_helper.from_array(np.array([0], np.int64), f"{orig}__anpred_axes")
            model.graph.initializer.append(axes)
            nodes.append(helper.make_node("Squeeze", [vi.name, axes.name], [orig], name=f"anpred_unbatch/{orig}"))
        else:
            nodes.append(helper.make_node("Squeeze", [vi.name], [orig], name=f"anpred_unbatch/{orig}", axes=[0]))
    for n in reversed(nodes):
        model.graph.node.insert(0, n)
