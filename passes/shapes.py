"""Value types for the partition: ``value -> (elem_type, shape)`` for every tensor of a graph, from
ONNX shape inference on a weightless copy, completed by ONNX Runtime's symbolic shape inference.

Shapes list ints, simple symbolic names (``"batch"``) or None (unknown); an unknown rank gives
``shape=None``. :func:`fix_input_dims` gives the copy with static input dims the cost estimate uses.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["weightless_copy", "infer_value_types", "fix_input_dims", "COST_DIM", "FLOAT_TYPES"]

FLOAT_TYPES = frozenset({1, 10, 11, 16})  # float, float16, double, bfloat16
_SIMPLE_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]*$")  # not an expression like "floor(h/2) + 1"


def _decode_type(tp) -> tuple[int, list[Any] | None]:
    tt = tp.tensor_type  # default (elem_type 0) for sequence/map/optional types
    dims = tt.shape.dim
    if dims:
        simple = _SIMPLE_SYMBOL.match
        shape: list[Any] | None = []
        for d in dims:
            dv = d.dim_value
            if dv:
                shape.append(dv)
            else:
                dp = d.dim_param
                shape.append(dp if dp and simple(dp) and not dp.startswith("unk__") else None)
    else:
        shape = [] if tt.HasField("shape") else None
    return tt.elem_type, shape


def _collect_types(g, types) -> None:
    """Add ``name -> (elem_type, shape)`` for ``g``'s value_info, inputs, outputs and initializers.
    Types are decoded once per distinct serialised ``TypeProto`` (most tensors of a network share a
    few types), which is much faster than decoding every dim of every value (docs/instrument.md,
    'Speed')."""
    get = types.get
    decoded: dict[bytes, tuple[int, list[Any] | None]] = {}
    for vis in (g.value_info, g.input, g.output):
        for vi in vis:
            tp = vi.type
            key = tp.SerializeToString()
            new = decoded.get(key)
            if new is None:
                new = decoded[key] = _decode_type(tp)
            name = vi.name
            old = get(name)
            if old is None:
                types[name] = new  # shared between values of one type: never mutate a shape in place
            elif _known(new[1]) > _known(old[1]):
                types[name] = (new[0] or old[0], new[1])
    for t in g.initializer:
        types[t.name] = (t.data_type, list(t.dims))


def _known(shape) -> int:
    """Number of known dims (+1 for a known rank), to prefer the more complete inference."""
    if shape is None:
        return 0
    return 1 + sum(d is not None for d in shape)


_WEIGHT_BYTES = 4096  # initializers above this size are replaced by typed inputs for shape inference


def weightless_copy(model, fixed_inputs: dict[str, list[int]] | None = None):
    """A copy of ``model`` for shape inference only: initializers larger than 4 KiB (and every
    external-data initializer) become typed graph inputs (same name, dtype, dims; no data), small
    ones (shape constants that ``data_prop`` reads) stay. The copy costs about as much as the graph
    without its weights, and shape inference no longer serialises the weights twice. With
    ``fixed_inputs`` (``{input name: dims}``) those inputs' shapes are replaced."""
    import onnx

    src = model.graph
    inits = src.initializer
    big = [t for t in inits if t.data_location == 1 or t.ByteSize() > _WEIGHT_BYTES]
    m = onnx.ModelProto()
    if not big:
        m.CopyFrom(model)
    else:
        # copy everything but the graph's initializers, then add back the small ones
        saved = list(inits)
        keep = [t for t in saved if not (t.data_location == 1 or t.ByteSize() > _WEIGHT_BYTES)]
        shell = onnx.ModelProto()
        shell.ir_version = model.ir_version
        shell.opset_import.extend(model.opset_import)
        shell.functions.extend(model.functions)
        g = shell.graph
        g.node.extend(src.node)
        g.input.extend(src.input)
        g.output.extend(src.output)
        g.value_info.extend(src.value_info)
        g.sparse_initializer.extend(src.sparse_initializer)
        g.initializer.extend(keep)
        declared = {i.name for i in src.input}
        for t in big:
            if t.name not in declared:
                vi = g.input.add()
                vi.name = t.name
                tt = vi.type.tensor_type
                tt.elem_type = t.data_type
                tt.shape.SetInParent()
                for d in t.dims:
                    tt.shape.dim.add().dim_value = d
        m = shell
    if fixed_inputs:
        for i in m.graph.input:
            dims = fixed_inputs.get(i.name)
            if dims is not None:
                shp = i.type.tensor_type.shape
                del shp.dim[:]
                for d in dims:
                    shp.dim.add().dim_value = d
    return m


def infer_value_types(
    model, produced: list[str] | None = None, *, data_prop: bool = True, weightless: bool = False
) -> dict[str, tuple[int, list[Any] | None]]:
    """``value -> (elem_type, shape)`` for inputs, outputs, initializers and every intermediate.

    ONNX shape inference first (``strict_mode=False, data_prop=True``, on :func:`weightless_copy`;
    ``data_prop=False`` where no shape is computed from tensor values, i.e. no ``Shape``/``Size``
    node, since data propagation costs time there for nothing: docs/instrument.md, 'Speed');
    if it leaves dims unknown (typically Slice/Reshape targets computed from ``Shape`` in TorchScript
    exports), ONNX Runtime's symbolic shape inference (``onnxruntime.tools.symbolic_shape_infer``)
    fills them, when the inputs are static (with symbolic inputs it only yields sympy expressions,
    slowly). Shapes list ints, symbolic names (``"batch"``) or None (unknown); unknown rank gives
    ``shape=None``. ``produced`` (every node output name; computed when None) saves a pass over the
    graph."""
    import onnx

    light = model if weightless else weightless_copy(model)
    types: dict[str, tuple[int, list[Any] | None]] = {}
    try:
        _collect_types(onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=data_prop).graph, types)
    except Exception:  # noqa: BLE001 - best effort; fall back to declared types
        _collect_types(model.graph, types)
    if produced is None:
        produced = [v for n in model.graph.node for v in n.output if v]
    incomplete = False
    if fix_input_dims(model, copy=False) is None:
        get = types.get
        for v in produced:
            t = get(v)
            if t is None or t[1] is None or None in t[1]:
                incomplete = True
                break
    if incomplete:
        try:
            import os
            import tempfile

            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            # on incomplete inference it saves "sym_shape_infer_temp.onnx" into the working
            # directory: run it in a scratch one so the user's folder is left alone
            # (os.chdir, not contextlib.chdir: Python 3.10 has none)
            with tempfile.TemporaryDirectory() as scratch:
                old = os.getcwd()
                os.chdir(scratch)
                try:
                    sym = SymbolicShapeInference.infer_shapes(light, auto_merge=True)
                finally:
                    os.chdir(old)
            if sym is not None:
                _collect_types(sym.graph, types)
        except Exception:  # noqa: BLE001 - unsupported op or missing weights: keep what we have
            pass
    for t in model.graph.initializer:  # the weightless copy declared some as inputs: same types
        types[t.name] = (t.data_type, list(t.dims))
    return types


COST_DIM = 256  # stands for a symbolic non-batch input dim in the cost estimate


def fix_input_dims(model, copy: bool = True):
    """A weightless copy (:func:`weightless_copy`) of ``model`` whose symbolic/unknown input dims are
    fixed (first dim 1, others :data:`COST_DIM`) for the cost estimate only, or None if all input
    dims are static (with ``copy=False``: True instead of the copy)."""
    inits = {t.name for t in model.graph.initializer}
    dyn = [
        i
        for i in model.graph.input
        if i.name not in inits
        and i.type.HasField("tensor_type")
        and any(not d.HasField("dim_value") or d.dim_value <= 0 for d in i.type.tensor_type.shape.dim)
    ]
    if not dyn:
        return None
    if not copy:
        return True
    fixed = {
        i.name: [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if k == 0 else COST_DIM)
            for k, d in enumerate(i.type.tensor_type.shape.dim)
        ]
        for i in dyn
    }
    return weightless_copy(model, fixed)
