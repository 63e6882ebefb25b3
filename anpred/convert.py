"""Shared helpers of the converter backends (``torch`` via onnx2torch, ``tf`` via onnx2tf).

- :func:`fold_identity_initializers`: replace ``Identity(initializer)`` nodes by the initializer
  itself (TorchScript exports of YOLO put weights behind Identity nodes; onnx2torch then fails with
  a ``KeyError`` on a ``.bias``).
- :func:`onnx2torch_compat`: converters for operator versions newer than onnx2torch 1.5.15 knows
  (torch's dynamo exporter writes opset 18+: ``Split``-18 with ``num_outputs``, ``Resize``-19,
  ``Reduce*``-18 with ``axes`` as an input, ``Pad``-18/19 ...). ``onnx.version_converter`` is not a
  general fix: it has no downgrade adapter for ``Split`` 18 -> 17 (``No Adapter From Version $18 for
  Split``), so a dynamo-exported YOLOv8n cannot be taken down to opset 17 with it. Instead each newer
  version is delegated to onnx2torch's converter of the previous version after checking that the
  node uses only the older semantics (or rewriting it into the older form, e.g. a constant ``axes``
  input into the ``axes`` attribute); a node that uses a feature of the new version is refused with
  the reason.
- :func:`onnx2torch_unsupported`: the nodes of a model onnx2torch has no converter for, checked
  before converting so the error names every missing operator at once.
- :func:`onnx2tf_calibration_file`: the local calibration array onnx2tf would otherwise download.
- :func:`model_to_float64`: a float64 copy of a model (every float32/float16/bfloat16 tensor widened,
  slots the ONNX spec types ``tensor(float)`` kept by Casts), for ``onnx-reference-fp64``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from anpred.errors import BackendError

__all__ = ["ONNX2TF_CALIBRATION_NAME", "onnx2torch_missing", "fold_identity_initializers", "fold_constant_nodes", "model_opset",
           "since_version", "onnx2torch_compat", "onnx2torch_unsupported", "onnx2tf_calibration_file",
           "working_directory", "model_to_float64", "WIDENED_ELEM_TYPES", "DTYPE_ATTRIBUTES", "REFERENCE_FLOAT32_ONLY"]

ONNX2TF_CALIBRATION_NAME = "calibration_image_sample_data_20x128x128x3_float32.npy"


# ---- generic ONNX graph clean-ups ------------------------------------------------------------
def fold_identity_initializers(model) -> int:
    """Fold every ``Identity`` node whose input is an initializer into a copy of that initializer
    named after the node's output, in place. Returns the number of nodes folded.

    Graph outputs produced by such an Identity are kept (an Identity whose output is a graph output
    is left alone, so output names do not change).
    """
    import onnx

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    keep, folded = [], 0
    for node in graph.node:
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.input[0] in inits \
                and node.output[0] not in outputs:
            t = onnx.TensorProto()
            t.CopyFrom(inits[node.input[0]])
            t.name = node.output[0]
            graph.initializer.append(t)
            inits[t.name] = t
            folded += 1
        else:
            keep.append(node)
    if folded:
        del graph.node[:]
        graph.node.extend(keep)
    return folded


def fold_constant_nodes(model) -> int:
    """:func:`passes.fold_shapes.fold_constant_nodes` (a graph pass: also used by passes.bind_inputs)."""
    from passes.fold_shapes import fold_constant_nodes as fold

    return fold(model)


def model_opset(model, domain: str = "") -> int:
    """The opset version a model imports for ``domain`` ("" = default ONNX domain)."""
    for imp in model.opset_import:
        if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
            return int(imp.version)
    raise BackendError(f"the model imports no opset for domain {domain!r}")


def since_version(op_type: str, opset: int, domain: str = "") -> int | None:
    """The ``since_version`` of ``op_type``'s schema in force at ``opset`` (None: unknown op)."""
    from onnx import defs

    try:
        return defs.get_schema(op_type, max_inclusive_version=opset, domain=domain).since_version
    except Exception:  # onnx raises SchemaError (a RuntimeError subclass) for unknown ops
        return None


# ---- onnx2torch: converters for newer operator versions -------------------------------------
def _attr(node, name: str, default: Any = None) -> Any:
    return node.attributes.get(name, default)


def _const_value(graph, value_name: str) -> np.ndarray | None:
    """A constant input's value (initializer or Constant node output), else None."""

    if value_name in graph.initializers:
        return graph.initializers[value_name].to_numpy()
    try:
        node, _ = graph.value_as_node_output(value_name)
    except KeyError:
        return None
    if node.operation_type == "Constant" and "value" in node.attributes:
        v = node.attributes["value"]
        return v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v)
    return None


def _rewritten(node, **changes):
    """A new onnx2torch ``OnnxNode`` like ``node`` with inputs/attributes replaced."""
    import onnx
    from onnx2torch.onnx_node import OnnxNode

    proto = onnx.NodeProto()
    proto.CopyFrom(node.proto)
    if "inputs" in changes:
        del proto.input[:]
        proto.input.extend(changes["inputs"])
    for name in changes.get("drop_attrs", ()):
        kept = [a for a in proto.attribute if a.name != name]
        del proto.attribute[:]
        proto.attribute.extend(kept)
    for name, value in changes.get("set_attrs", {}).items():
        kept = [a for a in proto.attribute if a.name != name]
        del proto.attribute[:]
        proto.attribute.extend(kept)
        proto.attribute.append(onnx.helper.make_attribute(name, value))
    return OnnxNode(proto, unique_name=node.unique_name)


def _refuse(node, version: int, why: str):
    raise NotImplementedError(
        f"onnx2torch cannot convert {node.operation_type}-{version} node {node.name!r}: {why}")


def _split18(node, graph):
    """Split-18: ``num_outputs`` splits into ceil(n/k) chunks, the last smaller (ONNX spec)."""
    import torch
    from onnx2torch.node_converters.registry import get_converter
    from onnx2torch.utils.common import OnnxToTorchModule, OperationConverterResult, onnx_mapping_from_node

    real_inputs = [v for v in node.input_values if v]
    if len(real_inputs) > 1:  # explicit split sizes: same as Split-13
        return get_converter("Split", 13)(_rewritten(node, drop_attrs=["num_outputs"]), graph)
    axis = int(_attr(node, "axis", 0))
    k = len(node.output_values)

    class OnnxSplit18(torch.nn.Module, OnnxToTorchModule):
        def __init__(self):
            super().__init__()
            self.axis, self.k = axis, k

        def forward(self, x):
            n = x.shape[self.axis]
            size = -(-n // self.k)
            return torch.split(x, size, dim=self.axis)

    return OperationConverterResult(torch_module=OnnxSplit18(), onnx_mapping=onnx_mapping_from_node(node))


def _resize19(node, graph):
    from onnx2torch.node_converters.registry import get_converter

    if int(_attr(node, "antialias", 0)) != 0:
        _refuse(node, 19, "antialias=1 is not supported")
    if _attr(node, "axes") is not None:
        _refuse(node, 19, "the axes attribute is not supported")
    policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        _refuse(node, 19, f"keep_aspect_ratio_policy={policy!r} is not supported")
    if _attr(node, "coordinate_transformation_mode", "half_pixel") == "half_pixel_symmetric":
        _refuse(node, 19, "coordinate_transformation_mode='half_pixel_symmetric' is not supported")
    return get_converter("Resize", 13)(
        _rewritten(node, drop_attrs=["antialias", "keep_aspect_ratio_policy", "axes"]), graph)


def _reduce18(node, graph):
    """Reduce*-18 takes ``axes`` as an optional input: a constant one becomes the -13 attribute."""
    from onnx2torch.node_converters.registry import get_converter

    op = node.operation_type
    inputs = list(node.input_values)
    if len(inputs) > 1 and inputs[1]:
        axes = _const_value(graph, inputs[1])
        if axes is None:
            _refuse(node, 18, "the axes input is not a constant")
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
        if not axes and int(_attr(node, "noop_with_empty_axes", 0)):
            _refuse(node, 18, "noop_with_empty_axes=1 with empty axes is not supported")
        new = _rewritten(node, inputs=inputs[:1], drop_attrs=["noop_with_empty_axes"],
                         set_attrs={"axes": axes} if axes else {})
    else:
        if int(_attr(node, "noop_with_empty_axes", 0)):
            _refuse(node, 18, "noop_with_empty_axes=1 without axes is not supported")
        new = _rewritten(node, inputs=inputs[:1], drop_attrs=["noop_with_empty_axes"])
    return get_converter(op, 13)(new, graph)


def _pad18(node, graph):
    from onnx2torch.node_converters.registry import get_converter

    inputs = list(node.input_values)
    if len(inputs) > 3 and inputs[3]:
        _refuse(node, 18, "the axes input is not supported")
    if _attr(node, "mode", "constant") == "wrap":
        _refuse(node, 19, "mode='wrap' is not supported")
    return get_converter("Pad", 13)(node, graph)


def _same_as(op: str, old: int, unsupported_attrs: dict[str, Any] | None = None) -> Callable:
    """A newer version whose float semantics equal version ``old`` (the bump only added types, or
    attributes checked here to be at their defaults)."""

    def conv(node, graph):
        from onnx2torch.node_converters.registry import get_converter

        for name, default in (unsupported_attrs or {}).items():
            if name in node.attributes and node.attributes[name] != default:
                _refuse(node, 0, f"attribute {name}={node.attributes[name]!r} is not supported")
        return get_converter(op, old)(node, graph)

    return conv


def _reshape19(node, graph):
    """allowzero=1 only matters when the target shape holds a 0: with a constant shape without
    zeros the node equals Reshape-14 with allowzero=0."""
    from onnx2torch.node_converters.registry import get_converter

    if int(_attr(node, "allowzero", 0)):
        shape = _const_value(graph, node.input_values[1])
        if shape is None:
            _refuse(node, 19, "allowzero=1 with a non-constant shape is not supported")
        if np.any(np.asarray(shape) == 0):
            _refuse(node, 19, "allowzero=1 with a 0 in the target shape is not supported")
        node = _rewritten(node, drop_attrs=["allowzero"])
    return get_converter("Reshape", 14)(node, graph)


def _avgpool19(node, graph):
    from onnx2torch.node_converters.registry import get_converter

    dil = _attr(node, "dilations")
    if dil is not None and any(int(d) != 1 for d in dil):
        _refuse(node, 19, f"dilations={list(dil)} are not supported")
    return get_converter("AveragePool", 11)(_rewritten(node, drop_attrs=["dilations"]), graph)


_REDUCES = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]

# (op_type, new since_version) -> converter delegating to an older onnx2torch converter.
_COMPAT: dict[tuple[str, int], Callable] = {
    ("Split", 18): _split18,
    ("Resize", 18): _resize19,
    ("Resize", 19): _resize19,
    ("Pad", 18): _pad18,
    ("Pad", 19): _pad18,
    ("Pad", 21): _pad18,
    **{(op, 18): _reduce18 for op in _REDUCES},
    ("Cast", 19): _same_as("Cast", 13),
    ("Cast", 21): _same_as("Cast", 13),
    ("Reshape", 19): _reshape19,
    ("Reshape", 21): _reshape19,
    ("Shape", 19): _same_as("Shape", 15),
    ("Shape", 21): _same_as("Shape", 15),
    ("Constant", 19): _same_as("Constant", 13),
    ("Constant", 21): _same_as("Constant", 13),
    ("Identity", 19): _same_as("Identity", 16),
    ("Identity", 21): _same_as("Identity", 16),
    ("Equal", 19): _same_as("Equal", 13),
    ("Unsqueeze", 21): _same_as("Unsqueeze", 13),
    ("Flatten", 21): _same_as("Flatten", 13),
    ("Transpose", 21): _same_as("Transpose", 13),
    ("AveragePool", 19): _avgpool19,
}


def onnx2torch_compat() -> list[tuple[str, int]]:
    """Register the converters of :data:`_COMPAT` in onnx2torch's registry (once per process;
    entries onnx2torch already has are left alone). Returns the (op, version) pairs added."""
    from anpred.compat import import_onnx2torch

    import_onnx2torch()
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription

    added = []
    for (op, ver), conv in _COMPAT.items():
        key = OperationDescription(domain="", operation_type=op, version=ver)
        if key not in _CONVERTER_REGISTRY:
            _CONVERTER_REGISTRY[key] = conv
            added.append((op, ver))
    return added


def onnx2torch_unsupported(model) -> list[str]:
    """``"Op-version (node name)"`` for every node onnx2torch has no converter for (after
    :func:`onnx2torch_compat`), in graph order; empty when all are covered."""
    from onnx2torch.node_converters.registry import get_converter

    opsets = {imp.domain or "": int(imp.version) for imp in model.opset_import}
    missing = []
    for node in model.graph.node:
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        ver = opsets.get(dom, opsets.get("", 1))
        try:
            get_converter(node.op_type, ver, domain=dom)
        except NotImplementedError:
            sv = since_version(node.op_type, ver, dom)
            missing.append(f"{(dom + '.') if dom else ''}{node.op_type}-{sv or ver} (node {node.name or node.output[0]!r})")
    return missing


# ---- onnx2tf ---------------------------------------------------------------------------------
def onnx2tf_calibration_file(folder: Path) -> Path:
    """Write (if absent) the array onnx2tf downloads for 4-D 3-channel inputs with batch <= 20:
    ``calibration_image_sample_data_20x128x128x3_float32.npy``, shape (20, 128, 128, 3), float32,
    uniform [0, 1) from ``numpy.random.default_rng(0)`` (deterministic, so cached conversions stay
    valid). onnx2tf only uses it as test data while converting."""
    path = Path(folder) / ONNX2TF_CALIBRATION_NAME
    if not path.is_file():
        data = np.random.default_rng(0).random((20, 128, 128, 3), dtype=np.float32)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, data)
        os.replace(tmp, path)
    return path


@contextlib.contextmanager
def working_directory(path: Path):
    """Temporarily change the working directory (onnx2tf reads its calibration file from it)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def onnx2torch_missing(model) -> list[str]:
    """The nodes of ``model`` onnx2torch has no converter for, after the compatibility converters
    (:func:`anpred.convert.onnx2torch_compat`) and on a copy with Constant nodes folded, as the torch
    backend converts it: the ``torch`` converter check of the mapping
    (:func:`exporters.mapping.converters.converter_entries`). Raises ImportError without onnx2torch."""
    import onnx

    from anpred.compat import import_onnx2torch

    import_onnx2torch()
    onnx2torch_compat()
    clean = onnx.ModelProto()
    clean.CopyFrom(model)
    fold_constant_nodes(clean)
    return onnx2torch_unsupported(clean)


# ---- float64 copy of a model ---------------------------------------------------------------------
#: the floating element types a float64 copy widens (float8 types are quantized data: left alone).
WIDENED_ELEM_TYPES = frozenset({1, 10, 16})  # TensorProto.FLOAT, FLOAT16, BFLOAT16
#: attributes that name the element type of a node's output (Cast ``to``, EyeLike/Random* ``dtype``,
#: DequantizeLinear-21 ``output_dtype``): a floating value (or default) becomes DOUBLE.
DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")
#: operators whose onnx.reference implementation returns float32 whatever its inputs' type
#: (``onnx/reference/ops/op_affine_grid.py``: ``grid.astype(np.float32)``).
REFERENCE_FLOAT32_ONLY = frozenset({"AffineGrid"})


def _widen_type(tp) -> bool:
    """Widen a ``TypeProto``'s floating element types to DOUBLE in place (tensor, sequence, optional,
    map values); True when something changed."""
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, which)
        if tt.elem_type in WIDENED_ELEM_TYPES:
            tt.elem_type = 11  # DOUBLE
            return True
        return False
    if which == "sequence_type":
        return _widen_type(tp.sequence_type.elem_type)
    if which == "optional_type":
        return _widen_type(tp.optional_type.elem_type)
    if which == "map_type":
        return _widen_type(tp.map_type.value_type)
    return False


def _type_str(tp) -> str:
    """The ONNX schema spelling of a ``TypeProto`` (``tensor(float)``, ``seq(tensor(double))``); ""
    when unknown."""
    from onnx import TensorProto

    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        elem = getattr(tp, which).elem_type
        kind = "tensor" if which == "tensor_type" else "sparse_tensor"
        return f"{kind}({TensorProto.DataType.Name(elem).lower()})" if elem else ""
    if which in ("sequence_type", "optional_type"):
        inner = _type_str(getattr(tp, which).elem_type)
        return f"{'seq' if which == 'sequence_type' else 'optional'}({inner})" if inner else ""
    return ""


_FLOAT_SPELLINGS = ("(float)", "(float16)", "(bfloat16)")


def _widen_tensor(t) -> bool:
    """Replace a floating ``TensorProto``'s data by float64 (same name, dims), in place."""
    from onnx import numpy_helper

    if t.data_type not in WIDENED_ELEM_TYPES:
        return False
    arr = numpy_helper.to_array(t).astype(np.float64)
    new = numpy_helper.from_array(arr, t.name)
    if t.doc_string:
        new.doc_string = t.doc_string
    t.CopyFrom(new)
    return True


def _value_types(model) -> dict[str, Any]:
    """Value name -> ``TypeProto`` for every typed value of the model and its subgraphs (graph
    inputs/outputs, value_info after ``onnx.shape_inference``, initializers, Constant outputs)."""
    import onnx
    from onnx import helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - an un-inferable model keeps its own value_info
        inferred = model
    from anpred.onnx_io import iter_graphs

    types: dict[str, Any] = {}
    for g in iter_graphs(inferred.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.WhichOneof("value"):
                types.setdefault(vi.name, vi.type)
        for t in g.initializer:
            types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, None))
    return types


def _slots(params, names: list[str]) -> list[tuple[str, Any]]:
    """Pair a node's input (or output) names with the schema's formal parameters (a variadic last
    parameter takes the rest); empty names (omitted optional inputs) are skipped."""
    out = []
    for i, n in enumerate(names):
        if not n:
            continue
        if i < len(params):
            out.append((n, params[i]))
        elif params and params[-1].option.name == "Variadic":
            out.append((n, params[-1]))
    return out


def model_to_float64(model) -> tuple[Any, dict[str, Any]]:
    """A float64 copy of ``model`` (an ``onnx.ModelProto`` with its weights loaded; not modified) for
    a float64 execution (:class:`anpred.backends.fp64.ReferenceFp64Backend`).

    Every float32/float16/bfloat16 tensor becomes float64: initializers (and sparse ones), tensor
    attributes (``Constant`` ``value``, ``ConstantOfShape`` ``value``; a ConstantOfShape without
    ``value`` gets a float64 zero, ``Constant`` ``value_float(s)`` becomes a float64 ``value``), the
    element types of graph inputs/outputs and value_info (subgraphs included), and the dtype
    attributes of :data:`DTYPE_ATTRIBUTES` (``Cast`` ``to``, ``EyeLike``/``RandomNormal``... ``dtype``,
    explicit or by the schema's default) that name a floating type. Integer, bool, string and float8
    tensors are left alone.

    The ONNX schema decides each node's slots (``onnx.defs.get_schema`` at the model's opset): a
    floating value at a slot whose type parameter allows ``tensor(double)`` is widened; a slot the
    spec types ``tensor(float)`` itself (``Resize`` ``scales``, ``QuantizeLinear`` ``y_scale``,
    ``NonMaxSuppression`` ``boxes``) gets a ``Cast`` back to its original type in front of it (inputs)
    or a ``Cast`` to DOUBLE after it (outputs), named ``<value>/fp64.cast``.

    The copy is checked with ``onnx.shape_inference.infer_shapes(strict_mode=True, check_type=True)``
    when the original passes that check.

    Returns:
        ``(copy, report)``; report: ``{"widened_tensors": n, "widened_values": n, "dtype_attributes": n,
        "casts_inserted": [...]}`` (the casts as ``"op node: slot"``).

    Raises:
        BackendError: a node whose operator does not accept double where the model has a floating
            tensor (``"QuantizeLinear-13 (node 'q'): input 'x' is tensor(float), the spec's T1 allows
            tensor(float), tensor(int32)"``), all such nodes named at once; an operator without an ONNX
            schema (custom domains, model-local functions); an operator onnx.reference computes in
            float32 only (:data:`REFERENCE_FLOAT32_ONLY`); a copy that fails ONNX type inference
            where the original passes (the message names the node).
    """
    import onnx
    from onnx import defs, helper, numpy_helper

    original = model
    model = onnx.ModelProto()
    model.CopyFrom(original)

    opsets = {imp.domain or "": int(imp.version) for imp in model.opset_import}
    types = _value_types(model)
    problems: list[str] = []
    casts: list[str] = []
    counts = {"widened_tensors": 0, "widened_values": 0, "dtype_attributes": 0}

    def is_float(name: str) -> bool:
        tp = types.get(name)
        return tp is not None and any(f in _type_str(tp) for f in _FLOAT_SPELLINGS)

    def fix_graph(g) -> None:
        new_nodes = []
        back: set[str] = set()
        for node in g.node:
            dom = "" if node.domain in ("", "ai.onnx") else node.domain
            where = f"(node {node.name or node.output[0]!r})"
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    fix_graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        fix_graph(sg)
            floats_in = [n for n in node.input if n and is_float(n)]
            floats_out = [n for n in node.output if n and is_float(n)]
            if node.op_type in REFERENCE_FLOAT32_ONLY and dom == "":
                problems.append(f"{node.op_type} {where}: onnx.reference computes it in float32 only")
            try:
                schema = defs.get_schema(node.op_type, max_inclusive_version=opsets.get(dom, opsets.get("", 1)),
                                         domain=dom)
            except Exception:  # noqa: BLE001 - SchemaError: custom domain or model-local function
                if floats_in or floats_out or dom:
                    problems.append(f"{node.op_type} {where}: no ONNX schema for domain {dom or 'ai.onnx'!r}; "
                                    "cannot tell whether it accepts double")
                new_nodes.append(node)
                continue
            label = f"{node.op_type}-{schema.since_version} {where}"
            params = {t.type_param_str: list(t.allowed_type_strs) for t in schema.type_constraints}
            pre, post = [], []
            for kind, names, formal in (("input", list(node.input), schema.inputs),
                                        ("output", list(node.output), schema.outputs)):
                for v, fp in _slots(formal, names):
                    if not is_float(v):
                        continue
                    have = _type_str(types[v])
                    want = have
                    for f in _FLOAT_SPELLINGS:
                        want = want.replace(f, "(double)")
                    if fp.type_str in params:
                        if want not in params[fp.type_str]:
                            problems.append(f"{label}: {kind} {fp.name!r} is {have}, the spec's {fp.type_str} allows "
                                            f"{', '.join(params[fp.type_str])}")
                        continue
                    # a slot typed tensor(float) by the spec itself: keep that type at the slot
                    elem = types[v].tensor_type.elem_type if types[v].HasField("tensor_type") else 1
                    if kind == "input":
                        cast_name = f"{v}/fp64.cast"
                        if cast_name not in back:  # one Cast per value and graph, before its first use
                            back.add(cast_name)
                            pre.append(helper.make_node("Cast", [v], [cast_name], to=elem, name=cast_name))
                        for i, n in enumerate(node.input):
                            if n == v:
                                node.input[i] = cast_name
                    else:
                        raw = f"{v}/fp64.raw"
                        i = list(node.output).index(v)
                        node.output[i] = raw
                        post.append(helper.make_node("Cast", [raw], [v], to=11, name=f"{v}/fp64.cast"))
                    casts.append(f"{label}: {kind} {fp.name!r}")
            # dtype attributes naming a floating type (explicit or by default) -> DOUBLE
            if floats_out:
                present = {a.name: a for a in node.attribute}
                for an in DTYPE_ATTRIBUTES:
                    if an in present:
                        if present[an].i in WIDENED_ELEM_TYPES:
                            present[an].i = 11
                            counts["dtype_attributes"] += 1
                    elif an in schema.attributes:
                        d = schema.attributes[an].default_value
                        if d.type == onnx.AttributeProto.INT and d.i in WIDENED_ELEM_TYPES:
                            node.attribute.append(helper.make_attribute(an, 11))
                            counts["dtype_attributes"] += 1
            for a in list(node.attribute):
                if a.type == onnx.AttributeProto.TENSOR:
                    counts["widened_tensors"] += _widen_tensor(a.t)
                elif a.type == onnx.AttributeProto.TENSORS:
                    counts["widened_tensors"] += sum(_widen_tensor(t) for t in a.tensors)
                elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
                    counts["widened_tensors"] += _widen_tensor(a.sparse_tensor.values)
                elif node.op_type == "Constant" and dom == "" and a.name in ("value_float", "value_floats"):
                    arr = np.asarray(helper.get_attribute_value(a), dtype=np.float64)
                    node.attribute.remove(a)
                    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(arr)))
                    counts["widened_tensors"] += 1
            if node.op_type == "ConstantOfShape" and dom == "" and floats_out \
                    and not any(a.name == "value" for a in node.attribute):
                node.attribute.append(helper.make_attribute("value", helper.make_tensor("value", 11, [1], [0.0])))
                counts["widened_tensors"] += 1
            new_nodes += pre + [node] + post
        del g.node[:]
        g.node.extend(new_nodes)
        for t in g.initializer:
            counts["widened_tensors"] += _widen_tensor(t)
        for st in g.sparse_initializer:
            counts["widened_tensors"] += _widen_tensor(st.values)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            counts["widened_values"] += _widen_type(vi.type)

    for fn in model.functions:
        problems.append(f"model-local function {fn.domain}.{fn.name}: not converted to float64")
    fix_graph(model.graph)
    if problems:
        raise BackendError(f"no float64 copy: {len(problems)} node(s) do not take double: " + "; ".join(problems[:10])
                           + (" ..." if len(problems) > 10 else ""))
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as err:  # noqa: BLE001 - InferenceError/ValidationError
        try:
            onnx.shape_inference.infer_shapes(original, check_type=True, strict_mode=True)
        except Exception:  # noqa: BLE001 - the original fails the same check: nothing to learn
            pass
        else:
            raise BackendError(f"the float64 copy fails ONNX type inference: {str(err).strip()[:500]}") from err
    return model, {**counts, "casts_inserted": casts}
