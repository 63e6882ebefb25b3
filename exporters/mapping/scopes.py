"""The ONNX side of the mapping: the anchored model, its graph index without the instrumentation,
and scope stacks (per node, the source modules enclosing it, coarse to fine).

The index is :func:`passes.graph.build_index` with the anchor Identities left out
(:func:`passes.anchor_nodes.is_anchor_node`): they are not part of the exported model.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from anpred.manifest import AnchorManifest
from exporters.mapping.report import MappingError
from passes.anchor_nodes import is_anchor_node
from passes.graph import GraphIndex, build_index

__all__ = ["load_onnx", "mapping_index", "parse_list", "fill_unscoped", "common_prefix", "prefix_len"]


def load_onnx(onnx_model, manifest: AnchorManifest):
    """``onnx_model`` as a ``ModelProto`` (a path is loaded), or the model the manifest records."""
    from anpred.onnx_io import load_model

    if onnx_model is None:
        src = manifest.model.get("path") or manifest.model.get("anchored") or manifest.model.get("source")
        if not src:
            raise MappingError("map_anchors needs the anchored ONNX model (onnx_model=) to read the exporter's scopes")
        onnx_model = src
    if isinstance(onnx_model, (str, Path)):
        return load_model(onnx_model)
    return onnx_model


def mapping_index(model) -> GraphIndex:
    """The graph index of ``model`` without the instrumentation's anchor Identities."""
    return build_index(model.graph, skip=is_anchor_node)


def parse_list(text: str) -> list[str]:
    """A JSON or Python list literal as strings ([] when it is neither)."""
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        try:
            v = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else []


def fill_unscoped(g: GraphIndex, stacks: list[list[str] | None]) -> list[list[str]]:
    """Nodes the exporter's optimizer created carry no scope: give them the longest common prefix of
    their scoped neighbours' stacks (iterative sweeps; root when nothing is known)."""
    for _ in range(4):
        changed = False
        for i, n in enumerate(g.nodes):
            if stacks[i] is not None:
                continue
            neigh = [stacks[g.producer[v]] for v in n.input if v in g.producer and stacks[g.producer[v]] is not None]
            for o in n.output:
                neigh += [stacks[c] for c in g.consumers.get(o, []) if stacks[c] is not None]
            if neigh:
                stacks[i] = common_prefix(neigh)
                changed = True
        if not changed:
            break
    return [s if s is not None else [] for s in stacks]


def common_prefix(stacks: list[list[str]]) -> list[str]:
    """The longest common prefix of ``stacks``."""
    out: list[str] = []
    for parts in zip(*stacks):
        if all(p == parts[0] for p in parts):
            out.append(parts[0])
        else:
            break
    return out


def prefix_len(a: list[str], b: list[str]) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k
