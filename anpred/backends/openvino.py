"""OpenVINO backends on the CPU plugin: ``openvino`` (``INFERENCE_PRECISION_HINT`` set explicitly to
f32: on CPUs with bf16/fp16 instructions OpenVINO's default is reduced precision) and
``openvino-bf16`` (hint bf16). After compiling, the precision is read back from the compiled model
(``openvino_compiled_precision_hint`` in the versions) together with the plugin's optimization
capabilities, and the precision the kernels actually execute in is read from the runtime model
(each executed node's ``runtimePrecision``, counted per layer type in
``openvino_runtime_precisions``): ``effective_precision`` is the most common runtime precision of the
convolution/matmul nodes (a plugin that keeps the bf16 hint but computes in f32 shows here).

Anchors are outputs of the anchored ONNX model; OpenVINO keeps ONNX tensor names on its outputs.
Options: ``threads`` (``INFERENCE_NUM_THREADS``, default the plugin's choice).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anpred.backends.base import Backend
from anpred.backends.ort import output_anchor_map
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest

_PRECISION_NAMES = {"f32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "f16": "fp16",
                    "float16": "fp16"}


_COMPUTE_OPS = ("Convolution", "GroupConvolution", "MatMul", "FullyConnected", "Deconvolution")


def _runtime_precisions(compiled) -> dict[str, int]:
    """``{"<layerType>/<precision>": count}`` from the compiled model's runtime (execution) graph:
    each executed node's ``runtimePrecision`` rt_info (the precision its kernel runs in), e.g.
    ``Convolution/bf16``. Empty when the plugin does not expose it."""
    counts: dict[str, int] = {}
    try:
        ops = compiled.get_runtime_model().get_ordered_ops()
    except Exception:  # noqa: BLE001 - not every plugin/version exposes the runtime model
        return counts
    for op in ops:
        rt = op.get_rt_info()
        try:
            kind = str(rt["layerType"].astype(str)) if "layerType" in rt else op.get_type_name()
            prec = str(rt["runtimePrecision"].astype(str)) if "runtimePrecision" in rt else ""
        except Exception:  # noqa: BLE001
            continue
        if prec:
            p = _PRECISION_NAMES.get(prec.lower(), prec.lower())
            counts[f"{kind}/{p}"] = counts.get(f"{kind}/{p}", 0) + 1
    return counts


class OpenVinoBackend(Backend):
    name = "openvino"
    family = "openvino"
    precision = "fp32"
    hint = "f32"

    def _versions_impl(self):
        import openvino as ov

        return {"openvino": ov.get_version().split("-")[0], "openvino_build": ov.get_version()}

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import openvino as ov

        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": self.hint}
        if "threads" in self.options:
            config["INFERENCE_NUM_THREADS"] = int(self.options["threads"])
        try:
            model = core.read_model(str(model_path))
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as err:  # openvino raises RuntimeError/OpConversionFailure/GeneralFailure
            msg = str(err).strip().splitlines()
            raise BackendError(f"{self.name}: OpenVINO cannot compile the model ({type(err).__name__}: "
                               f"{' '.join(msg[:3])[:500]})") from err
        self._request = self.compiled.create_infer_request()
        self._outputs = {}
        for i, out in enumerate(self.compiled.outputs):
            for n in out.get_names():
                self._outputs[n] = i
        self._fetch, self._info = output_anchor_map(list(self._outputs), manifest)
        self._capabilities = ",".join(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        got = (hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)).lower()
        self._compiled_hint = _PRECISION_NAMES.get(got, got)
        self._runtime = _runtime_precisions(self.compiled)
        compute = {k: v for k, v in self._runtime.items() if k.split("/")[0] in _COMPUTE_OPS}
        if compute:  # what the plugin's convolution/matmul kernels execute in
            self._effective = max(compute, key=compute.get).split("/")[1]
        else:
            self._effective = self._compiled_hint

    def versions(self):
        v = super().versions()
        if getattr(self, "_capabilities", None):
            v["openvino_cpu_capabilities"] = self._capabilities
        if getattr(self, "_compiled_hint", None):
            v["openvino_compiled_precision_hint"] = self._compiled_hint
            v["openvino_runtime_precisions"] = ",".join(f"{k}:{n}" for k, n in sorted(self._runtime.items()))
        return v

    def _run_impl(self, inputs):
        res = self._request.infer(inputs)
        return {anchor: np.array(res[self._outputs[value]], copy=True) for value, anchor in self._fetch.items()}

    def anchor_info(self):
        return dict(self._info)

    def effective_precision(self) -> str:
        return getattr(self, "_effective", self.precision)

    def close(self):
        self._request = None
        self.compiled = None


class OpenVinoBf16Backend(OpenVinoBackend):
    """OpenVINO CPU with ``INFERENCE_PRECISION_HINT=bf16`` (reduced precision: judged, does not vote)."""

    name = "openvino-bf16"
    precision = "bf16"
    hint = "bf16"
