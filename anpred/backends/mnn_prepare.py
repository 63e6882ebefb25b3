"""The ``mnn`` backend's pre-conversion step (:func:`prepare_for_mnn`): graph rewrites, exact in ONNX
semantics, that keep MNN 3.6.1 away from a defect of its format handling.

The defect (measured with MNN 3.6.1's wheel, CPU backend; reproduced by a one-op network in
``tests/test_converter_gaps.py``): an elementwise binary op whose *first* operand is a one-element
constant of the full rank (shape ``[1, 1, 1]`` next to a rank-3 tensor, ``[1, 1, 1, 1]`` next to a
rank-4 one) and whose second operand comes from a convolution (held in MNN's packed ``NC4HW4``
layout) returns scrambled values: ``Add([1,1,1] ones, Squeeze(Conv(x)))`` differs from ONNX Runtime by
up to 11 where its values are below 6 (``Add``, ``Sub``, ``Mul``, ``Div`` and ``Max`` alike). The
converted graph ends in MNN's ``NC4HW4 -> NCHW`` conversion of the op's output, as for the same op
with the constant second (which is right), so the runtime's ``BinaryOp`` computes the result in the
first operand's ``NCHW`` layout and the conversion then reads it as packed data. The same constant as
a scalar (shape ``[]``) or of a lower rank, or placed second, is computed right. Found on magika
(tf2onnx's ``Add(const_fold_opt [1,1,1] = 1.0, Tanh(...))`` in its tanh GELU after ``Conv_0``; what it
did there: docs/backends-converters.md, 'Measurements: defects on real models').

Rewrite: such a constant (an initializer with one element, in an op of :data:`BROADCAST_BINARY`) is
replaced by a scalar initializer of the same value and dtype when every other operand's rank is known
(ONNX shape inference) and at least the constant's: broadcasting then gives the same shape and values.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prepare_for_mnn", "BROADCAST_BINARY"]

#: ONNX ops with multidirectional (numpy) broadcasting of all their inputs, where a one-element operand
#: may be a scalar without changing the result when the other operands have at least its rank
BROADCAST_BINARY = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "Mod",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
    }
)


def prepare_for_mnn(model) -> dict[str, Any]:
    """Rewrite ``model`` (``onnx.ModelProto``, weights loaded; main graph only) in place as the module
    docstring says. Returns ``{"scalar_constants": ["<node name>: <input> [dims] -> scalar", ...]}``
    (empty: nothing changed)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    ranks: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - no ranks known: nothing is rewritten
        inferred = None
    if inferred is not None:
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                ranks[vi.name] = len(tt.shape.dim)
    for t in g.initializer:
        ranks[t.name] = len(t.dims)
    taken = {v for n in g.node for v in list(n.input) + list(n.output)} | set(inits) | {i.name for i in g.input}
    scalars: dict[str, str] = {}
    done = []
    for k, n in enumerate(g.node):
        if n.op_type not in BROADCAST_BINARY or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        for i, v in enumerate(n.input):
            t = inits.get(v)
            if t is None or len(t.dims) == 0 or int(np.prod(t.dims)) != 1:
                continue
            others = [ranks.get(o) for j, o in enumerate(n.input) if j != i and o]
            if not others or any(r is None or r < len(t.dims) for r in others):
                continue
            if v not in scalars:
                name = f"{v}/scalar"
                while name in taken:
                    name += "_"
                taken.add(name)
                arr = numpy_helper.to_array(t).reshape(())
                g.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
                scalars[v] = name
            n.input[i] = scalars[v]
            done.append(f"{n.name or f'node {k}'}: {v} {list(t.dims)} -> scalar")
    used = {v for n in g.node for v in n.input} | {o.name for o in g.output}
    gone = [t for t in g.initializer if t.name in scalars and t.name not in used]
    for t in gone:
        g.initializer.remove(t)
    return {"scalar_constants": done}
