"""OpenVINO backends on the CPU plugin: ``openvino`` (``INFERENCE_PRECISION_HINT`` set explicitly to
f32: on CPUs with bf16/fp16 instructions OpenVINO's default is reduced precision) and
``openvino-bf16`` (hint bf16). After compiling, the precision is read back from the compiled model
(``openvino_compiled_precision_hint`` in the versions) together with the plugin's optimization
capabilities, and the precision the kernels actually execute in is read from the runtime model
(each executed node's ``runtimePrecision``, counted per layer type in
``openvino_runtime_precisions``): ``effective_precision`` is the most common runtime precision of the
convolution/matmul nodes (a plugin that keeps the bf16 hint but computes in f32 shows here).

Anchors are outputs of the anchored ONNX model; OpenVINO keeps ONNX tensor names on its outputs.
An ``If`` whose condition has rank > 1 (valid ONNX: one element of any rank) is given a scalar
condition first, in a copy in the work folder (:class:`passes.frontend_rewrites.ScalarIfConditionPass`;
OpenVINO 2026.4's frontend refuses it: "Rank of If condition input must be equal to 0 or 1"); the
pre-run coverage asks the frontend about the same rewritten model. When the CPU plugin's
low-precision transformations throw while compiling (OpenVINO 2026.4 on PP-OCR's int8 models:
``AddTransformation`` on an Add of two dequantized operands, one of them constant), the model is
compiled once more with its constants' fake quantization folded
(:func:`passes.frontend_rewrites.fold_constant_fake_quantization`; ``openvino_folded_fake_quantization``
in the versions).
Options: ``threads`` (``INFERENCE_NUM_THREADS``, default the plugin's choice).

Population members (:mod:`anpred.backends.lowp_models`; their ``precision`` is the model's, the
kernels' goes into ``openvino_kernel_precision`` and ``openvino_runtime_precisions``):

- ``openvino-int8``: the shared QDQ int8 model read by OpenVINO (its ONNX frontend turns each
  QuantizeLinear/DequantizeLinear pair into a FakeQuantize; the CPU plugin's low-precision
  transformations then run the quantized Convolution/MatMul in u8/i8 kernels), hint f32 for the parts
  left in float.
- ``openvino-fp16``: the shared float16 model; ``INFERENCE_PRECISION_HINT`` f16 where the CPU plugin
  lists ``FP16`` in ``OPTIMIZATION_CAPABILITIES`` (AVX512-FP16/AMX-FP16 x86, ARM), else f32 (kept
  explicit: on bf16 CPUs OpenVINO's default would compute the fp16 model in bf16). With f32 the
  plugin computes the float16 model in f32 on float16 weights (``openvino_fp16_hint`` says which and why).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anpred.backends.base import Backend
from anpred.backends.lowp_models import PopulationMember
from anpred.backends.ort import output_anchor_map
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest

_PRECISION_NAMES = {
    "f32": "fp32",
    "float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f16": "fp16",
    "float16": "fp16",
}


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


def _has_if(graph) -> bool:
    """Whether ``graph`` or a graph nested in it holds an ``If`` node."""
    from anpred.onnx_io import iter_graphs

    return any(n.op_type == "If" for g in iter_graphs(graph) for n in g.node)


def _frontend_model(model_path: Path, workdir: Path) -> Path:
    """``model_path``, or a copy in ``workdir`` whose ``If`` conditions of rank > 1 are reshaped to
    scalars (:class:`passes.frontend_rewrites.ScalarIfConditionPass`: OpenVINO's ONNX frontend refuses
    them, "Rank of If condition input must be equal to 0 or 1", where ONNX allows any one-element
    tensor; same values)."""
    import onnx

    from anpred.onnx_io import load_model
    from passes.frontend_rewrites import scalar_if_conditions

    head = load_model(model_path)  # without the weights: is there an If at all?
    if not _has_if(head.graph):
        return model_path
    model = load_model(model_path, load_external=True)
    if not scalar_if_conditions(model)["rewritten"]:
        return model_path
    workdir.mkdir(parents=True, exist_ok=True)
    dst = workdir / "openvino_frontend.onnx"
    onnx.save_model(
        model, str(dst), save_as_external_data=model.ByteSize() > 3 << 29, location="openvino_frontend.onnx.data"
    )
    return dst


class OpenVinoBackend(Backend):
    threads_option = True  # (the ``threads`` option: INFERENCE_NUM_THREADS)
    name = "openvino"
    family = "openvino"
    precision = "fp32"
    hint = "f32"
    coverage_basis = "OpenVINO's ONNX frontend (conversion without compilation)"

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        """The operators OpenVINO's ONNX frontend cannot convert in this model: ``FrontEnd.convert``
        (no compilation) on ``model`` (an ``onnx.ModelProto`` with its weights; a model over 2 GB is
        not checked: ``{}``); its error's summary names the operations without a conversion rule
        ("No conversion rule found for operations: d.Op, ...") and those whose translator failed on
        this model ("Conversion is failed for: Op-21", with the translator's message). Compilation
        (plugin) failures are not seen here: the run says them."""
        import io
        import re

        from openvino.frontend import FrontEndManager

        from anpred.onnx_io import op_key

        if model.ByteSize() > 2_000_000_000:
            return {}
        if _has_if(model.graph):  # what the run gives the frontend (_frontend_model)
            from passes.frontend_rewrites import scalar_if_conditions

            model = type(model).FromString(model.SerializeToString())
            scalar_if_conditions(model)
        fe = FrontEndManager().load_by_framework("onnx")
        try:
            fe.convert(fe.load(io.BytesIO(model.SerializeToString())))
            return {}
        except Exception as err:  # noqa: BLE001 - OpenVINO's OpConversionFailure / GeneralFailure
            text = str(err)
        out: dict[str, str] = {}
        m = re.search(r"No conversion rule found for operations:\s*(.+)", text)
        for item in m.group(1).split(",") if m else []:
            name = re.sub(r"-\d+$", "", item.strip())  # "Det-17": type and opset
            domain, _, op = name.rpartition(".")
            if name:
                out[op_key(domain, op)] = "no conversion rule in OpenVINO's ONNX frontend"
        m = re.search(r"Conversion is failed for:\s*(.+)", text)
        for item in m.group(1).split(",") if m else []:
            name = re.sub(r"-\d+$", "", item.strip())
            domain, _, op = name.rpartition(".")
            msg = re.search(rf"-- {re.escape(item.strip())} with a message:\n(.*?)(?:\n-- |\nSummary:)", text, re.S)
            lines = [
                ln.strip()
                for ln in (msg.group(1).splitlines() if msg else [])
                if ln.strip() and not ln.startswith(("While validating", "FrontEnd API failed"))
            ]
            if name:
                out[op_key(domain, op)] = "OpenVINO's translator failed: " + (" ".join(lines)[:300] or "no message")
        if not out:  # another failure (malformed graph ...): not a coverage question, the run says more
            return {}
        return out

    def _versions_impl(self):
        import openvino as ov

        v = {"openvino": ov.get_version().split("-")[0], "openvino_build": ov.get_version()}
        if getattr(self, "folded_fake_quantization", None):
            v["openvino_folded_fake_quantization"] = (
                f"{len(self.folded_fake_quantization)} DequantizeLinear(QuantizeLinear(constant)) pair(s) folded into "
                "their constants (the low-precision transformations threw on the model as written)"
            )
        return v

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import openvino as ov

        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": self._hint(core)}
        if "threads" in self.options:
            config["INFERENCE_NUM_THREADS"] = int(self.options["threads"])
        model_path = _frontend_model(self._model_file(model_path, manifest), workdir)
        #: DequantizeLinear nodes whose constant fake quantization was folded (see _compile)
        self.folded_fake_quantization: list[str] = []
        try:
            self.compiled = self._compile(core, model_path, workdir, config)
        except Exception as err:  # openvino raises RuntimeError/OpConversionFailure/GeneralFailure
            # OpenVINO's messages start with lines of source locations ("Exception from
            # src/.../graph_rewrite.cpp:298:"); keep the lines that say something, in their order
            lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
            said = [ln for ln in lines if not (ln.startswith("Exception from") and ln.endswith(":"))] or lines
            raise BackendError(
                f"{self.name}: OpenVINO cannot compile the model ({type(err).__name__}: {' '.join(said)[:800]})"
            ) from err
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

    def _hint(self, core) -> str:
        """The ``INFERENCE_PRECISION_HINT`` to compile with (``core``: the ``ov.Core``)."""
        return self.hint

    def _compile(self, core, model_path: Path, workdir: Path, config: dict):
        """Compile ``model_path``; when a low-precision transformation of the plugin throws
        ("...Transformation] ... CALLBACK HAS THROWN"), compile once more a copy whose
        ``DequantizeLinear(QuantizeLinear(constant))`` pairs are folded into their constants
        (:func:`passes.frontend_rewrites.fold_constant_fake_quantization`, recorded in
        :attr:`folded_fake_quantization` and the versions); the first error is raised when that does
        not help or there is nothing to fold."""
        try:
            return core.compile_model(core.read_model(str(model_path)), "CPU", config)
        except Exception as err:
            if "Transformation]" not in str(err):
                raise
            import onnx

            from anpred.backends.convert import fold_constant_nodes
            from anpred.onnx_io import load_model
            from passes.bind_inputs import fold_constant_layout
            from passes.frontend_rewrites import fold_constant_fake_quantization

            model = load_model(model_path, load_external=True)
            fold_constant_nodes(model)
            fold_constant_layout(model)
            folded = fold_constant_fake_quantization(model)
            if not folded:
                raise
            workdir.mkdir(parents=True, exist_ok=True)
            dst = workdir / "openvino_folded.onnx"
            onnx.save_model(
                model, str(dst), save_as_external_data=model.ByteSize() > 3 << 29, location="openvino_folded.onnx.data"
            )
            try:
                compiled = core.compile_model(core.read_model(str(dst)), "CPU", config)
            except Exception:
                raise err from None
            self.folded_fake_quantization = folded
            return compiled

    def _model_file(self, model_path: Path, manifest: AnchorManifest) -> Path:
        """The model file OpenVINO reads (the anchored model; population members: their shared one)."""
        return model_path

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


class _OpenVinoPopulationMember(PopulationMember):
    """OpenVINO CPU on the population's shared model (mixed in before :class:`OpenVinoBackend`)."""

    def _model_file(self, model_path: Path, manifest: AnchorManifest) -> Path:
        return self.population_model(model_path, manifest)

    def _prepare_impl(self, model_path, manifest, workdir):
        super()._prepare_impl(model_path, manifest, workdir)
        names = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}
        returned = {}
        for value, anchor in self._fetch.items():
            et = self.compiled.outputs[self._outputs[value]].get_element_type().get_type_name()
            returned[anchor] = names.get(et, et)
        self.note_casts(self._info, returned)

    def versions(self):
        v = super().versions()
        if getattr(self, "_runtime", None) is not None:
            v["openvino_kernel_precision"] = self._effective  # what its Convolution/MatMul kernels run in
        return v


class OpenVinoInt8Backend(_OpenVinoPopulationMember, OpenVinoBackend):
    """OpenVINO CPU on the shared QDQ int8 model (hint f32 for what stays in float)."""

    name = "openvino-int8"
    precision = "int8"
    population = "int8"
    hint = "f32"


class OpenVinoFp16Backend(_OpenVinoPopulationMember, OpenVinoBackend):
    """OpenVINO CPU on the shared float16 model; hint f16 where the CPU lists ``FP16`` (module docstring)."""

    name = "openvino-fp16"
    precision = "fp16"
    population = "fp16"

    def _hint(self, core) -> str:
        caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        if "FP16" in caps:
            self._fp16_hint = "f16 (FP16 in the CPU plugin's OPTIMIZATION_CAPABILITIES)"
            return "f16"
        self._fp16_hint = (
            "f32 (no FP16 in the CPU plugin's OPTIMIZATION_CAPABILITIES: the float16 model "
            "is computed in f32 on float16 weights)"
        )
        return "f32"

    def versions(self):
        v = super().versions()
        if getattr(self, "_fp16_hint", None):
            v["openvino_fp16_hint"] = self._fp16_hint
        return v
