"""OpenVINO backends on the CPU plugin: ``openvino`` (``INFERENCE_PRECISION_HINT`` set explicitly to
f32: on CPUs with bf16/fp16 instructions OpenVINO's default is reduced precision) and
``openvino-bf16`` (hint bf16). After compiling, the precision is read back from the compiled model
(``effective_precision``) together with the plugin's optimization capabilities; on a CPU without
bf16 instructions the plugin may still report bf16 while computing in f32 (see the CPU flags recorded
in ``run.json``).

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
        self._effective = _PRECISION_NAMES.get(got, got)

    def versions(self):
        v = super().versions()
        if getattr(self, "_capabilities", None):
            v["openvino_cpu_capabilities"] = self._capabilities
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
