"""Export a Keras model to ONNX with tf2onnx (``tf2onnx.convert.from_keras``).

What the export keeps (and :mod:`exporters.mapping` relies on): node names are
``<model>[_k]/<layer>[_k]/<op>`` (Keras 3 appends ``_k`` to name scopes while tracing); BatchNorm is
fused into the preceding convolution and the fused node is named after the BatchNorm layer; a 4-D NHWC
input becomes NCHW behind one Transpose at the start, so ONNX values are NCHW while the Keras tensors
are NHWC (transform ``{"permute": [0, 3, 1, 2]}``); graph outputs are renamed after the Keras outputs.

Exports are cached (:mod:`anpred.cache`, kind ``export-keras``) under a key made of the architecture
(``model.to_json()``), all weight bytes, the input signature, the opset and tensorflow/keras/tf2onnx/onnx
versions.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from anpred.errors import OutputPathError
from exporters import ExportError, ExportResult, export_folder, make_origin, write_with_origin

__all__ = ["export_keras", "input_signature", "unsupported_nodes"]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("tensorflow-cpu", "tensorflow", "keras", "tf2onnx", "onnx"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _model_digest(model) -> str:
    h = hashlib.sha256()
    try:
        h.update(model.to_json().encode())
    except Exception:  # subclassed models have no JSON config
        h.update(f"{type(model).__module__}.{type(model).__qualname__}".encode())
        for layer in model.layers:
            h.update(f"{layer.name}:{type(layer).__name__}".encode())
    for w in model.weights:
        a = w.numpy()
        h.update(f"{w.path if hasattr(w, 'path') else w.name}{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def input_signature(model, batch_size: int | None = 1):
    """``tf.TensorSpec`` per Keras input (named after it; the batch dimension set to ``batch_size``).

    Raises:
        ExportError: the model has no defined inputs (an unbuilt subclassed model).
    """
    import tensorflow as tf

    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError) as err:
        raise ExportError(f"Keras model {model.name!r} has no defined inputs (build or call it first)") from err
    if not inputs:
        raise ExportError(f"Keras model {model.name!r} has no defined inputs (build or call it first)")
    specs = []
    for i in inputs:
        shape = list(i.shape)
        if shape and shape[0] is None:
            shape[0] = batch_size
        name = getattr(i, "name", None) or f"input_{len(specs)}"
        specs.append(tf.TensorSpec(shape, i.dtype, name=name.split(":")[0]))
    return tuple(specs)


def unsupported_nodes(proto) -> list:
    """Nodes of the ``onnx.ModelProto`` (all graphs, subgraphs included) whose ``(op_type, domain)`` has
    no schema in the ONNX registry at the model's opset for that domain (``onnx.defs.has``,
    ``onnx.defs.get_schema(op, max_inclusive_version, domain)``). tf2onnx leaves a TensorFlow op it
    cannot convert (``Svd``, ``FFT2D`` ...) in the graph unchanged, in the default domain, and only logs
    "not supported". Custom domains other than ONNX's own are unsupported too."""
    import onnx

    opsets = {(o.domain or ""): int(o.version) for o in proto.opset_import}
    from anpred.onnx_io import iter_graphs

    bad = []
    for g in iter_graphs(proto.graph):
        for n in g.node:
            domain = "" if n.domain in ("", "ai.onnx") else n.domain
            ok = domain in ("", "ai.onnx.ml") and onnx.defs.has(n.op_type, domain)
            if ok:
                try:
                    onnx.defs.get_schema(n.op_type, opsets.get(domain, onnx.defs.onnx_opset_version()), domain)
                except onnx.defs.SchemaError:
                    ok = False
            if not ok:
                bad.append(n)
    return bad


def _layer_of(node_name: str, model) -> str:
    """The Keras layer a tf2onnx node name ``<model>[_k]/<layer>[_k]/<op>`` belongs to (the path when
    it names no top-level layer)."""
    import re

    parts = node_name.split("/")
    if len(parts) < 2:
        return node_name
    names = {layer.name for layer in model.layers}
    seg = parts[1]
    if seg in names:
        return seg
    m = re.fullmatch(r"(.*)_\d+", seg)
    if m and m.group(1) in names:
        return m.group(1)
    return "/".join(parts[1:-1]) or seg


def export_keras(
    model,
    path,
    *,
    opset: int | None = None,
    batch_size: int | None = 1,
    factory: str | None = None,
    factory_kwargs: dict[str, Any] | None = None,
    cache: bool = True,
) -> ExportResult:
    """Export the Keras ``model`` to ONNX at ``path`` with tf2onnx.

    Args:
        model: a built ``keras.Model`` (functional or Sequential; inputs NHWC for images).
        path: destination ``.onnx`` (written atomically, weights inside the file).
        opset: ONNX opset (default 17).
        batch_size: static batch dimension given to unknown batch dims (None keeps it dynamic).
        factory, factory_kwargs: ``module:function`` that rebuilds ``(model, example_inputs)`` in a
            fresh process; recorded in ``origin`` for ``tf-native``.
        cache: reuse a cached export with the same key.

    Raises:
        ExportError: not a Keras model, no inputs, or tf2onnx failed (unsupported op/layer: the message
            names the layer and op). OutputPathError: ``path``'s folder is not writable.
    """
    import keras

    from anpred.cache import cache_key

    if not isinstance(model, keras.Model):
        raise ExportError(f"export_keras needs a keras.Model, got {type(model).__name__}")
    path = Path(path)
    if not path.parent.is_dir():
        raise OutputPathError(f"{path}: folder {path.parent} does not exist")
    opset = int(opset if opset is not None else 17)
    versions = _versions()
    spec = input_signature(model, batch_size)

    def build(tmp: Path) -> None:
        import tf2onnx

        try:
            proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ExportError(
                f"cannot export Keras model {model.name!r} with tf2onnx (opset {opset}): {type(err).__name__}: {first}"
            ) from err
        unsupported = unsupported_nodes(proto)
        if unsupported:
            names = ", ".join(
                f"layer {_layer_of(n.name, model)!r} -> {n.domain or 'ai.onnx'}:{n.op_type} (node {n.name!r})"
                for n in unsupported[:5]
            )
            more = f" and {len(unsupported) - 5} more" if len(unsupported) > 5 else ""
            raise ExportError(
                f"cannot export Keras model {model.name!r}: tf2onnx does not support {names}{more}: "
                "no ONNX operator schema of that name and domain at the model's opset "
                "(tf2onnx copied the TensorFlow op unchanged)"
            )
        (tmp / "model.onnx").write_bytes(proto.SerializeToString())

    key = cache_key(
        "export-keras/1", _model_digest(model), [[s.name, s.dtype.name, list(s.shape)] for s in spec], opset, versions
    )
    with export_folder("export-keras", key, build, cache) as (folder, hit, seconds):
        origin = make_origin("tf", "tf2onnx", opset, factory, factory_kwargs)
        write_with_origin(folder / "model.onnx", path, origin)
    return ExportResult(
        path=path,
        framework="tf",
        exporter="tf2onnx",
        versions=versions,
        opset=opset,
        origin=origin,
        seconds=seconds,
        cached=hit,
    )
