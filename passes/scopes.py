"""Source scopes: per node of the graph index, the source modules (torch module paths, Keras layers)
the exporter says enclose it, coarse to fine.

How the exporter writes scopes (:func:`passes.exporter.scope_style` of the detected exporter):
``torch-dynamo``: ``pkg.torch.onnx.name_scopes`` node metadata (root first, the FX op last);
``torch-script``: node names ``/model.22/cv2.0/cv2.0.0/conv/Conv``; ``tf2onnx``: node names
``<model>/<layer>/<op>`` or ``<layer>/<op>`` (Keras 3's ``_<k>`` trace suffixes removed). Other
exporters give no scopes. The partition penalises cuts inside a module with them.
"""

from __future__ import annotations

import ast
import re

from passes.exporter import SCOPE_KEY
from passes.graph import GraphIndex

__all__ = ["node_modules"]


def _torchscript_modules(name: str) -> list[str]:
    """``/model.22/cv2.0/cv2.0.0/conv/Conv`` -> ``[model.22, model.22.cv2.0, model.22.cv2.0.0,
    model.22.cv2.0.0.conv]`` (the last component is the op; a component that extends the previous one,
    as ModuleList/Sequential children are named, replaces it)."""
    if not name.startswith("/"):
        return []
    comps = [c for c in name.split("/")[1:-1] if c]
    mods: list[str] = []
    parts: list[str] = []
    for c in comps:
        if parts and c.startswith(parts[-1] + "."):
            parts[-1] = c
        else:
            parts.append(c)
        mods.append(".".join(parts))
    return mods


def _tf2onnx_modules(name: str, model_names: set[str]) -> list[str]:
    """tf2onnx node names look like ``<model>/<layer>/<op>`` or ``<layer>/<op>``; returns the layer."""
    comps = [c for c in name.split("/") if c]
    if len(comps) < 2:
        return []
    if comps[0] in model_names and len(comps) >= 3:
        return [comps[1]]
    return [comps[0]]


_TRACE_SUFFIX = re.compile(r"_\d+$")


def _strip_keras3_suffix(mods: list[list[str]], model_names: set[str]) -> list[list[str]]:
    """Keras 3 appends ``_<k>`` to every name scope while tracing (``smallcnn_1/conv1_1/Relu``). When
    the model scope and (nearly) all layer scopes carry such a suffix, drop one to recover the layer
    names."""
    layers = [m[0] for m in mods if m]
    if not layers or not model_names or not all(_TRACE_SUFFIX.search(n) for n in model_names):
        return mods
    if sum(bool(_TRACE_SUFFIX.search(x)) for x in layers) < 0.9 * len(layers):
        return mods
    return [[_TRACE_SUFFIX.sub("", m[0])] if m else [] for m in mods]


def node_modules(model, index: GraphIndex, framework: str) -> list[list[str]]:
    """Per topological position, the source modules enclosing the node, coarse to fine ("" never)."""
    out: list[list[str]] = []
    if framework == "torch-dynamo":
        for n in index.nodes:
            mods: list[str] = []
            for p in n.metadata_props:
                if p.key == SCOPE_KEY:
                    try:
                        scopes = ast.literal_eval(p.value)
                    except (ValueError, SyntaxError):
                        scopes = []
                    # the last entry is the FX op itself, the first the root module ("")
                    mods = [s for s in scopes[:-1] if s]
                    break
            out.append(mods)
    elif framework == "torch-script":
        out = [_torchscript_modules(n.name) for n in index.nodes]
    elif framework == "tf2onnx":
        firsts: dict[str, int] = {}
        for n in index.nodes:
            c = n.name.split("/", 1)[0]
            firsts[c] = firsts.get(c, 0) + 1
        # the Keras model's own name prefixes (almost) every node when the model is functional
        model_names = {c for c, k in firsts.items() if k > max(3, len(index.nodes) // 3)}
        out = _strip_keras3_suffix([_tf2onnx_modules(n.name, model_names) for n in index.nodes], model_names)
    else:
        out = [[]] * len(index.nodes)  # one shared empty list: never appended to
    return out
