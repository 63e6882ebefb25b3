"""onnx2torch converters for operator versions newer than onnx2torch 1.5.15 knows, and the check
of which nodes onnx2torch cannot convert.

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
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from anpred.backends.convert import fold_constant_nodes, since_version

__all__ = ["onnx2torch_compat", "onnx2torch_unsupported", "onnx2torch_missing"]


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
    raise NotImplementedError(f"onnx2torch cannot convert {node.operation_type}-{version} node {node.name!r}: {why}")


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
        _rewritten(node, drop_attrs=["antialias", "keep_aspect_ratio_policy", "axes"]), graph
    )


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
        new = _rewritten(
            node, inputs=inputs[:1], drop_attrs=["noop_with_empty_axes"], set_attrs={"axes": axes} if axes else {}
        )
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


_REDUCES = [
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]

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
    from anpred.backends.torch_converters import import_onnx2torch

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
            where = node.name or node.output[0]
            missing.append(f"{(dom + '.') if dom else ''}{node.op_type}-{sv or ver} (node {where!r})")
    return missing


def onnx2torch_missing(model) -> list[str]:
    """The nodes of ``model`` onnx2torch has no converter for, after the compatibility converters
    (:func:`onnx2torch_compat`) and on a copy with Constant nodes folded, as the torch
    backend converts it: the ``torch`` converter check of the mapping
    (:func:`exporters.mapping.converters.converter_entries`). Raises ImportError without onnx2torch."""
    import onnx

    from anpred.backends.torch_converters import import_onnx2torch

    import_onnx2torch()
    onnx2torch_compat()
    clean = onnx.ModelProto()
    clean.CopyFrom(model)
    fold_constant_nodes(clean)
    return onnx2torch_unsupported(clean)
