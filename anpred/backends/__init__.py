"""Backends: one small runner class per runtime behind :class:`anpred.backends.base.Backend`.

The registry maps a backend name to ``module:Class``; modules are imported only when a backend is
used, so torch/TensorFlow/OpenVINO are never loaded by accident.
"""

from __future__ import annotations

import importlib

from anpred.errors import BackendError

# name -> "module:Class" (lazy). Families group backends that share kernels (one vote each in the
# consensus, see anpred.judge.consensus).
REGISTRY: dict[str, str] = {
    "ort": "anpred.backends.ort:OrtBackend",
    "ort-noopt": "anpred.backends.ort:OrtNoOptBackend",
    "ort-fp16": "anpred.backends.ort_lowp:OrtFp16Backend",
    "ort-int8": "anpred.backends.ort_lowp:OrtInt8Backend",
    "ort-int8-noopt": "anpred.backends.ort_lowp:OrtInt8NoOptBackend",
    "ort-fp16-noopt": "anpred.backends.ort_lowp:OrtFp16NoOptBackend",
    "openvino-int8": "anpred.backends.openvino:OpenVinoInt8Backend",
    "openvino-fp16": "anpred.backends.openvino:OpenVinoFp16Backend",
    "onnx-reference-int8": "anpred.backends.reference:ReferenceInt8Backend",
    "onnx-reference-fp16": "anpred.backends.reference:ReferenceFp16Backend",
    "torch-fp16": "anpred.backends.torch_onnx:TorchFp16Backend",
    "openvino": "anpred.backends.openvino:OpenVinoBackend",
    "openvino-bf16": "anpred.backends.openvino:OpenVinoBf16Backend",
    "onnx-reference": "anpred.backends.reference:ReferenceBackend",
    "onnx-reference-fp64": "anpred.backends.fp64:ReferenceFp64Backend",
    "torch": "anpred.backends.torch_onnx:TorchOnnxBackend",
    "tf": "anpred.backends.tf_onnx:TfOnnxBackend",
    "torch-native": "anpred.backends.torch_native:TorchNativeBackend",
    "tf-native": "anpred.backends.tf_native:TfNativeBackend",
}


def backend_class(name: str):
    """Return the backend class registered as ``name``.

    Raises:
        BackendError: unknown name (the message lists the known ones) or its module is missing.
    """
    if name not in REGISTRY:
        raise BackendError(f"unknown backend {name!r}; known backends: {', '.join(REGISTRY)}")
    mod, cls = REGISTRY[name].split(":")
    try:
        return getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as err:
        raise BackendError(f"backend {name!r} is not available: {err}") from err


def parse_backends(spec: str) -> list[str]:
    """Parse a comma-separated backend list, validating every name against the registry."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise BackendError("no backend given; known backends: " + ", ".join(REGISTRY))
    for n in names:
        if n not in REGISTRY:
            raise BackendError(f"unknown backend {n!r}; known backends: {', '.join(REGISTRY)}")
    return names
