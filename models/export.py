"""Exports of the zoo's native models to ONNX, and what identifies an export in the cache.

:func:`export_native` exports a torch or Keras model (through :mod:`exporters` where installed);
:func:`exporter_id` and :func:`export_versions` are part of every cache key of an exported zoo model
(with :data:`RECIPE_VERSION`), so a stale export is never reused.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

from anpred.errors import AnpredError

# Bump when a model's recipe (architecture, seeding, calibration, export options) changes: it is part
# of every cache key of exported zoo models, so stale exports are never reused.
RECIPE_VERSION = 3


def package_version(pkg: str) -> str:
    """The installed version of distribution ``pkg``, or ``"absent"``."""
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def export_native(
    framework: str,
    model,
    example_inputs,
    path: Path,
    *,
    dynamo: bool = True,
    opset: int | None = None,
    factory: str | None = None,
    factory_kwargs: dict | None = None,
) -> str:
    """Export a native model to ONNX at ``path`` (one file, weights inside) with
    ``exporters.torch_export.export_torch`` / ``exporters.tf_export.export_keras`` (which record the
    factory in the model's ``anpred.origin`` metadata); without the ``exporters`` package, with
    ``torch.onnx.export(..., external_data=False)`` / ``tf2onnx.convert.from_keras`` directly.

    Args:
        example_inputs: torch tensors (torch) or arrays (Keras, unused: the model's inputs are static).
    Returns:
        the exporter's identifier (part of the cache key).
    """
    if framework not in ("torch", "tf"):
        raise AnpredError(f"cannot export a {framework!r} model; known: torch, tf")
    if exporter_id(framework) != "direct":
        if framework == "torch":
            from exporters.torch_export import export_torch

            export_torch(
                model,
                tuple(example_inputs),
                path,
                dynamo=dynamo,
                opset=opset,
                factory=factory,
                factory_kwargs=factory_kwargs,
            )
            return "exporters.torch_export"
        from exporters.tf_export import export_keras

        export_keras(model, path, opset=opset, factory=factory, factory_kwargs=factory_kwargs)
        return "exporters.tf_export"
    if framework == "torch":
        import torch

        kw = {"dynamo": dynamo, "external_data": False}
        if opset is not None:
            kw["opset_version"] = opset
        with torch.no_grad():
            torch.onnx.export(model, tuple(example_inputs), str(path), **kw)
        return "torch.onnx.export"
    import tensorflow as tf
    import tf2onnx

    from anpred.onnx_io import save_model

    spec = tuple(tf.TensorSpec([1, *i.shape[1:]], i.dtype, name=i.name.split(":")[0]) for i in model.inputs)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset or 17)
    save_model(proto, path)
    return "tf2onnx.convert.from_keras"


def exporter_id(framework: str) -> str:
    mod = {"torch": "exporters.torch_export", "tf": "exporters.tf_export"}[framework]
    try:
        if os.environ.get("ANPRED_ZOO_DIRECT_EXPORT") == "1" or importlib.util.find_spec(mod) is None:
            return "direct"
        return mod
    except (ImportError, ValueError):
        return "direct"


def export_versions(framework: str) -> dict:
    pkgs = (
        ("torch", "onnxscript", "onnx", "ultralytics")
        if framework == "torch"
        else ("tensorflow", "keras", "tf2onnx", "onnx")
    )
    return {p: package_version(p) for p in pkgs}
