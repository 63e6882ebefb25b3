"""Keras side of the mapping (backend ``tf-native``): a target is a top-level layer name; its output
is captured by a multi-output ``keras.Model``. tf2onnx node names read ``<model>[_k]/<layer>[_k]/<op>``;
a 4-D channels-last layer output maps to the NCHW ONNX value with ``{"permute": [0, 3, 1, 2]}``.
"""

from __future__ import annotations

import re
from typing import Any

from exporters.mapping.report import MappingError, make_entry
from passes.graph import GraphIndex

__all__ = ["map_keras"]


def _keras_layer_resolver(model, g: GraphIndex):
    names = {layer.name for layer in model.layers}
    first = {n.name.split("/")[0] for n in g.nodes if "/" in n.name}
    suffix = ""
    for f in first:
        m = re.fullmatch(re.escape(model.name) + r"(_\d+)?", f)
        if m:
            suffix = m.group(1) or ""
            break

    def resolve(node_name: str) -> str | None:
        parts = node_name.split("/")
        if len(parts) < 3:
            return None
        seg = parts[1]
        if suffix and seg.endswith(suffix) and seg[: -len(suffix)] in names:
            return seg[: -len(suffix)]
        if seg in names:
            return seg
        m = re.fullmatch(r"(.*)_\d+", seg)
        if m and m.group(1) in names:
            return m.group(1)
        return None

    return resolve


def map_keras(manifest, model, g: GraphIndex) -> dict[str, dict[str, Any]]:
    """Per anchor of ``manifest``, its ``tf-native`` entry on the ``keras.Model`` ``model``.

    Raises:
        MappingError: keras missing or ``model`` not a ``keras.Model``."""
    try:
        import keras
    except ImportError as err:  # pragma: no cover
        raise MappingError("framework 'tf' needs keras") from err
    if not isinstance(model, keras.Model):
        raise MappingError(f"framework 'tf' needs a keras.Model, got {type(model).__name__}")
    resolve = _keras_layer_resolver(model, g)
    layers = [resolve(n.name) for n in g.nodes]
    orig_outputs = [o["name"] for o in manifest.model.get("outputs", [])] or None
    out: dict[str, dict[str, Any]] = {}
    for a in manifest.anchors:
        v = a.value
        if v not in g.producer:
            out[a.name] = make_entry("", "unmapped", f"value {v!r} has no producer node (graph input or constant)")
            continue
        pi = g.producer[v]
        node = g.nodes[pi]
        L = layers[pi]
        if node.op_type == "Transpose" and node.input[0] in g.graph_inputs:
            inp = node.input[0]
            perm = next((list(at.ints) for at in node.attribute if at.name == "perm"), None)
            in_layers = {layer.name for layer in model.layers if type(layer).__name__ == "InputLayer"}
            tgt = inp if inp in in_layers else inp.split(":")[0]
            if tgt in in_layers and perm:
                out[a.name] = make_entry(
                    tgt,
                    "exact",
                    f"the model input {tgt!r} (Keras layout), transposed by tf2onnx with perm {perm}",
                    {"permute": perm},
                )
            else:
                out[a.name] = make_entry(
                    "",
                    "unmapped",
                    f"value {v!r} transposes graph input {inp!r}, which is no Keras InputLayer of {model.name!r}",
                )
            continue
        if L is None:
            seg = node.name.split("/")
            hint = (
                f"layer path {'/'.join(seg[1:-1])!r} is not a top-level layer of {model.name!r} (nested model?)"
                if len(seg) > 3
                else f"node {node.name!r} carries no Keras layer name"
            )
            out[a.name] = make_entry("", "unmapped", f"value {v!r} ({node.op_type}): {hint}")
            continue
        leaves = (v in orig_outputs) if orig_outputs else a.kind == "output"
        leaves = leaves or any(layers[c] != L for c in g.consumers.get(v, []))
        if not leaves:
            out[a.name] = make_entry(
                "",
                "unmapped",
                f"value {v!r} ({node.op_type}) is internal to Keras layer {L!r} "
                "(not its output): a layer exposes only its output",
            )
            continue
        layer = model.get_layer(L)
        try:
            nshape = list(layer.output.shape)
        except (AttributeError, ValueError):
            out[a.name] = make_entry(L, "unmapped", f"Keras layer {L!r} has no single symbolic output")
            continue
        ashape = list(a.shape or [])
        transform = None
        fmt = getattr(layer, "data_format", None) or keras.config.image_data_format()
        if len(nshape) == 4 and len(ashape) == 4 and fmt == "channels_last":
            transform = {"permute": [0, 3, 1, 2]}
            cmp = [nshape[i] for i in (0, 3, 1, 2)]
        else:
            cmp = nshape
        ok = len(cmp) == len(ashape) and all(
            x is None or y is None or isinstance(y, str) or int(x) == int(y) for x, y in zip(cmp, ashape)
        )
        if not ok:
            out[a.name] = make_entry(
                L,
                "unmapped",
                f"Keras layer {L!r} output shape {nshape} does not match the ONNX value {v!r} shape {ashape}",
            )
            continue
        why = f"output of Keras layer {L!r} ({type(layer).__name__})"
        if transform:
            why += ", NHWC in Keras"
        out[a.name] = make_entry(L, "exact", why, transform)
    return out
