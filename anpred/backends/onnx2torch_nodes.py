"""What ANPRED's onnx2torch converters read from onnx2torch's node and graph objects, and the base
classes of the torch modules they build (:mod:`anpred.backends.torch_converters`,
:mod:`anpred.backends.torch_recurrent`). torch and onnx2torch are imported on first use."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["node_attributes", "const_input", "module_bases"]


def node_attributes(node) -> dict[str, Any]:
    """The attributes of an onnx2torch ``OnnxNode`` as a dict (name -> Python value)."""
    return dict(node.attributes)


def const_input(graph, name: str) -> np.ndarray | None:
    """The value of ``name`` in an onnx2torch ``OnnxGraph`` when it is an initializer or the output of
    a ``Constant`` node (``value`` attribute), else None."""
    if name in graph.initializers:
        return graph.initializers[name].to_numpy()
    try:
        node, _ = graph.value_as_node_output(name)
    except KeyError:
        return None
    v = node.attributes.get("value") if node.operation_type == "Constant" else None
    return None if v is None else (v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v))


def module_bases():
    """``(torch.nn.Module, OnnxToTorchModule)``: the bases of a module onnx2torch puts into its graph."""
    import torch
    from onnx2torch.utils.common import OnnxToTorchModule

    return torch.nn.Module, OnnxToTorchModule
