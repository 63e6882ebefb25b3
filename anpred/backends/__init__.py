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
    "tvm": "anpred.backends.tvm_relax:TvmBackend",
    "mnn": "anpred.backends.mnn:MnnBackend",
    "mnn-winograd": "anpred.backends.mnn:MnnWinogradBackend",
    "litert": "anpred.backends.litert:LiteRtBackend",
    "ncnn": "anpred.backends.ncnn_pnnx:NcnnBackend",
    # ExecuTorch: opt-in by name; fp32 voters of their own families, then population members
    "executorch": "anpred.backends.executorch:ExecutorchBackend",
    "executorch-xnnpack": "anpred.backends.executorch:ExecutorchXnnpackBackend",
    "executorch-native": "anpred.backends.executorch:ExecutorchNativeBackend",
    "executorch-xnnpack-native": "anpred.backends.executorch:ExecutorchXnnpackNativeBackend",
    "executorch-fp16": "anpred.backends.executorch_lowp:ExecutorchFp16Backend",
    "executorch-xnnpack-fp16": "anpred.backends.executorch_lowp:ExecutorchXnnpackFp16Backend",
    "torch-pt2e-int8": "anpred.backends.executorch_lowp:TorchPt2eInt8Backend",
    "executorch-int8": "anpred.backends.executorch_lowp:ExecutorchInt8Backend",
    "executorch-xnnpack-int8": "anpred.backends.executorch_lowp:ExecutorchXnnpackInt8Backend",
    "torch-pt2e-int8-dynamic": "anpred.backends.executorch_lowp:TorchPt2eInt8DynamicBackend",
    "executorch-xnnpack-int8-dynamic": "anpred.backends.executorch_lowp:ExecutorchXnnpackInt8DynamicBackend",
}


#: the Python packages (import names) a backend needs, by family; their distributions and versions
#: are read from the installed metadata (``tensorflow`` comes as ``tensorflow-cpu`` here)
FAMILY_PACKAGES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime",),
    "openvino": ("openvino",),
    "onnx-reference": ("onnx", "numpy"),
    "onnx-reference-fp64": ("onnx", "numpy"),
    "torch": ("torch", "onnx2torch"),
    "tensorflow": ("tensorflow", "onnx2tf"),
    "tvm": ("tvm",),
    "mnn": ("MNN",),
    "litert": ("ai_edge_litert", "onnx2tf", "tensorflow"),
    "ncnn": ("ncnn", "pnnx"),
    "executorch": ("executorch", "torch", "onnx2torch"),
    "xnnpack": ("executorch", "torch", "onnx2torch"),
}
#: the pip extra of ANPRED (pyproject.toml) that brings a family's packages (``pip install
#: "anpred[torch]"``); a family missing here needs nothing beyond the core
FAMILY_EXTRA: dict[str, str] = {
    "onnxruntime": "ort",
    "openvino": "openvino",
    "torch": "torch",
    "tensorflow": "tf",
    "tvm": "tvm",
    "mnn": "mnn",
    "litert": "litert",
    "ncnn": "ncnn",
    "executorch": "executorch",
    "xnnpack": "executorch",
}
#: extra packages of some backends beyond their family's (the float16 converter of the fp16 models)
BACKEND_PACKAGES: dict[str, tuple[str, ...]] = {
    b: ("onnxconverter_common",)
    for b in (
        "ort-fp16",
        "ort-fp16-noopt",
        "openvino-fp16",
        "onnx-reference-fp16",
        "torch-fp16",
        "executorch-fp16",
        "executorch-xnnpack-fp16",
    )
}
# the PT2E int8 members quantize with torchao's PT2E flow and ExecuTorch's XNNPACKQuantizer
BACKEND_PACKAGES.update(
    {
        b: ("executorch", "torchao")
        for b in (
            "torch-pt2e-int8",
            "executorch-int8",
            "executorch-xnnpack-int8",
            "torch-pt2e-int8-dynamic",
            "executorch-xnnpack-int8-dynamic",
        )
    }
)


def backend_table() -> list[dict]:
    """Every registered backend as ``{"name", "family", "precision", "packages": {distribution or
    import name: version or None}, "installed": bool, "reason", "extra"}`` (``extra``: the pip extra
    that brings it, :data:`FAMILY_EXTRA`, None for the core), in registry order. ``precision`` is the nominal one (what
    is asked; the run record has what was computed). Nothing heavy is imported: backend modules import
    their runtimes lazily, versions come from :mod:`importlib.metadata`."""
    from importlib import metadata

    dists = metadata.packages_distributions()  # import name -> distributions
    rows = []
    for name in REGISTRY:
        try:
            cls = backend_class(name)
            family, precision, reason = cls.family, cls.precision, ""
        except BackendError as err:
            family, precision, reason = "?", "?", str(err)
        versions: dict[str, str | None] = {}
        for pkg in dict.fromkeys(FAMILY_PACKAGES.get(family, ()) + BACKEND_PACKAGES.get(name, ())):
            dist = (dists.get(pkg) or [None])[0]
            versions[dist or pkg] = metadata.version(dist) if dist else _located_version(pkg)
        missing = [d for d, v in versions.items() if v is None]
        extra = FAMILY_EXTRA.get(family)
        if missing and not reason:
            reason = (
                "not installed: "
                + ", ".join(missing)
                + (
                    f" (the '{extra}' extra: bash scripts/setup.sh {extra}, or pip install \"anpred[{extra}]\" and its "
                    f"--no-deps companions in requirements-nodeps.txt)"
                    if extra
                    else ""
                )
            )
        rows.append(
            {
                "name": name,
                "family": family,
                "precision": precision,
                "packages": versions,
                "installed": not reason,
                "reason": reason,
                "extra": extra,
            }
        )
    return rows


def _located_version(pkg: str) -> str | None:
    """The version of import package ``pkg`` when :func:`importlib.metadata.packages_distributions` did
    not name its distribution (Python 3.10 reads only ``top_level.txt``, which numpy's and onnx's wheels
    lack): the distribution of the same name (``-`` for ``_``, lower case), else ``"installed"`` where
    the package can be located; None where it cannot (not imported either way)."""
    import importlib.util
    from importlib import metadata

    if importlib.util.find_spec(pkg) is None:
        return None
    for dist in dict.fromkeys((pkg, pkg.replace("_", "-"), pkg.lower(), pkg.lower().replace("_", "-"))):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "installed"


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
