"""Small read helpers on ONNX protos (``NodeProto``, ``GraphProto``), public and shared by the passes,
the drill-down and the converter fixes (one place instead of a private copy in each module).

Sub-graphs (``If``/``Loop``/``Scan`` bodies) are walked iteratively: a deep nesting never reaches
Python's recursion limit.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["attribute_proto", "attribute_value", "subgraph_reads"]


def attribute_proto(node, name: str):
    """The ``AttributeProto`` named ``name`` of ``node`` (an ``onnx.NodeProto``), or None."""
    for a in node.attribute:
        if a.name == name:
            return a
    return None


def attribute_value(node, name: str, default: Any = None) -> Any:
    """The Python value of ``node``'s attribute ``name`` (``onnx.helper.get_attribute_value``: ints,
    floats, bytes for strings, a ``TensorProto``/``GraphProto`` ...), or ``default`` when absent."""
    import onnx

    a = attribute_proto(node, name)
    return default if a is None else onnx.helper.get_attribute_value(a)


def subgraph_reads(nodes: Iterable) -> set[str]:
    """Every value name read inside the sub-graphs of ``nodes`` at any depth, outer-scope references
    included (names a sub-graph defines itself count too when read there)."""
    import onnx

    names: set[str] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        for a in n.attribute:
            graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in graphs:
                for sub in g.node:
                    names.update(x for x in sub.input if x)
                stack.extend(g.node)
    return names
