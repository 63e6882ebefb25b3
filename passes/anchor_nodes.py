"""The marks instrumentation leaves in a graph: which nodes are anchor Identities, and their removal.

:class:`~passes.anchors.AnchorInsertionPass` exposes each anchor as ``Identity(value) -> <anchor
name>``, node name ``anpred/<anchor name>`` (:data:`ANCHOR_NODE_PREFIX`), plus a graph output of that
name, and stores the manifest in ``metadata_props["anpred.manifest"]``. Everything that reads an
anchored graph as the *model* (the partition, the native mapping, the graph index with
``skip=is_anchor_node``) leaves these nodes out; :func:`strip_anchor_nodes` removes all three marks.
"""

from __future__ import annotations

import operator

__all__ = ["ANCHOR_NODE_PREFIX", "is_anchor_node", "has_anchor_nodes", "strip_anchor_nodes"]

ANCHOR_NODE_PREFIX = "anpred/"  # name prefix of the Identity nodes AnchorInsertionPass adds


def is_anchor_node(node) -> bool:
    """True for an Identity node the instrumentation added (name ``anpred/<anchor name>``)."""
    return node.op_type == "Identity" and node.name.startswith(ANCHOR_NODE_PREFIX)


def has_anchor_nodes(graph) -> bool:
    """True if ``graph`` holds at least one anchor Identity (:func:`is_anchor_node`)."""
    starts = operator.methodcaller("startswith", ANCHOR_NODE_PREFIX)
    names = [n.name for n in graph.node]
    if not any(map(starts, names)):  # the common case, at C speed
        return False
    return any(starts(nm) and n.op_type == "Identity" for nm, n in zip(names, graph.node))


def strip_anchor_nodes(model) -> bool:
    """Remove what :class:`~passes.anchors.AnchorInsertionPass` added (its Identity nodes and their
    graph outputs) and the stored manifest, in place. Returns True if anything was removed."""
    from anpred.manifest import METADATA_KEY

    g = model.graph
    added: set[str] = set()
    if has_anchor_nodes(g):
        prefix = ANCHOR_NODE_PREFIX
        marks = [n.name.startswith(prefix) and n.op_type == "Identity" for n in g.node]
        added = {n.output[0] for n, m in zip(g.node, marks) if m}
    changed = False
    if added:
        keep_nodes = [n for n, m in zip(g.node, marks) if not m]
        keep_out = [o for o in g.output if o.name not in added]
        del g.node[:]
        g.node.extend(keep_nodes)
        del g.output[:]
        g.output.extend(keep_out)
        changed = True
    if any(p.key == METADATA_KEY for p in model.metadata_props):
        props = [p for p in model.metadata_props if p.key != METADATA_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(props)
        changed = True
    return changed
