"""Which exporter wrote an ONNX model: the one detector used by the partition and the native mapping.

Evidence, first match wins:

1. ``origin``: the ``anpred.origin`` record our exporters store (``exporters.read_origin``), when
   the caller passes it: its ``exporter`` entry (``"unknown"`` if it has none);
2. the producer name (case-insensitive): containing ``tf2onnx`` -> ``tf2onnx``, ``paddle`` ->
   ``paddle``;
3. a node carrying :data:`SCOPE_KEY` metadata (only torch's dynamo exporter writes it) ->
   ``torch.onnx.dynamo``;
4. a producer name containing ``torch`` (torch writes ``pytorch``) -> ``torch.onnx.torchscript``;
5. otherwise ``unknown``.

What each exporter leaves in the graph (and the partition and mapping read): dynamo exports carry
:data:`SCOPE_KEY` / :data:`CLASS_KEY` on every node, TorchScript exports ``/a/b/Op`` node names,
tf2onnx node names ``<model>[_k]/<layer>[_k]/<op>``. The partition records its own short names for
the same answer in the manifest (:data:`SCOPE_STYLE`: ``torch-dynamo``, ``torch-script``,
``tf2onnx``, ``paddle``, ``onnx``).
"""

from __future__ import annotations

__all__ = ["SCOPE_KEY", "CLASS_KEY", "EXPORTERS", "SCOPE_STYLE", "detect_exporter", "scope_style"]

SCOPE_KEY = "pkg.torch.onnx.name_scopes"  # node metadata: module path stack (dynamo exporter)
CLASS_KEY = "pkg.torch.onnx.class_hierarchy"  # node metadata: module class stack (dynamo exporter)

#: the answers of :func:`detect_exporter`
EXPORTERS = ("torch.onnx.dynamo", "torch.onnx.torchscript", "tf2onnx", "paddle", "unknown")

#: exporter -> the partition's name for how node scopes are written (``manifest.partition["framework"]``)
SCOPE_STYLE = {
    "torch.onnx.dynamo": "torch-dynamo",
    "torch.onnx.torchscript": "torch-script",
    "tf2onnx": "tf2onnx",
    "paddle": "paddle",
}


def _has_scopes(nodes) -> bool:
    for n in nodes:
        props = n.metadata_props
        if props and any(p.key == SCOPE_KEY for p in props):
            return True
    return False


def detect_exporter(model, index=None, origin: dict | None = None) -> str:
    """The exporter that wrote ``model`` (an ``onnx.ModelProto``), one of :data:`EXPORTERS` (or the
    ``exporter`` an ``origin`` record names); see the module docstring for the evidence.

    Args:
        model: the ONNX model.
        index: its :class:`~passes.graph.GraphIndex` when built (its nodes are scanned instead of the
            graph's).
        origin: the ``anpred.origin`` record of the model (``exporters.read_origin(model)``), if any.
    """
    if origin is not None:
        return origin.get("exporter", "unknown")
    prod = (model.producer_name or "").lower()
    if "tf2onnx" in prod:
        return "tf2onnx"
    if "paddle" in prod:
        return "paddle"
    if _has_scopes(index.nodes if index is not None else model.graph.node):
        return "torch.onnx.dynamo"
    if "torch" in prod:
        return "torch.onnx.torchscript"
    return "unknown"


def scope_style(exporter: str) -> str:
    """The partition's name for ``exporter`` (:data:`SCOPE_STYLE`; ``onnx`` for any other)."""
    return SCOPE_STYLE.get(exporter, "onnx")
