"""Reduced-precision ONNX Runtime backends, members of the int8 and fp16 populations
(:mod:`anpred.backends.lowp_models`): every member of a population runs the same cached converted
model; they differ in the implementation that computes it.

- ``ort-fp16``: the validated float16 model (:func:`anpred.backends.lowp_fp16.fp16_model`: weights and
  activations float16, graph inputs and outputs float32 through Cast nodes at the boundary, so the
  anchors, being graph outputs, are computed in float16 and returned as float32) on ONNX Runtime with
  its default graph optimizations. ONNX Runtime's CPU provider computes the nodes it has float16
  kernels for in float16 and puts Casts around the others (its ``InsertCastTransformer``).
- ``ort-fp16-noopt``: the same model with ``ORT_DISABLE_ALL`` (no fusions, no constant folding).
- ``ort-int8``: the static QDQ model (:func:`anpred.backends.lowp_models.int8_model`) with default graph
  optimizations: ONNX Runtime fuses DequantizeLinear -> Conv/MatMul -> QuantizeLinear into integer
  kernels (QLinearConv, MatMulInteger... on MLAS's u8s8 kernels, ``mlas_u8s8_kernel`` in the
  versions: without VNNI/AMX, int16 intermediates can saturate).
- ``ort-int8-noopt``: the same QDQ model with ``ORT_DISABLE_ALL``: every QuantizeLinear/DequantizeLinear
  runs as written and Conv/MatMul compute in float on dequantized values (fake quantization, the
  reference of the int8 population).

Reduced precision is real (converted graphs), never emulated with Cast pairs (some runtimes fold lossy
Cast pairs away). An anchor whose dtype differs from the manifest's is cast back and the capture says so.
"""

from __future__ import annotations

from pathlib import Path

from anpred.backends.lowp_models import PopulationMember
from anpred.backends.ort import OrtBackend, OrtNoOptBackend
from anpred.manifest import AnchorManifest

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(bool)": "bool",
    "tensor(bfloat16)": "bfloat16",
}


def ort_kernel_report(path: Path, opt_level: str, workdir: Path) -> dict[str, str]:
    """What ONNX Runtime's CPU provider really runs for the model at ``path`` at graph optimization
    level ``opt_level`` (``ORT_ENABLE_ALL`` / ``ORT_DISABLE_ALL``), read from the graph it saves after
    its transformations (``SessionOptions.optimized_model_filepath``, written under ``workdir``):

    * ``ort_optimized_ops``: ``<op>[@domain]:<count>`` of that graph at ``opt_level`` (e.g.
      ``QLinearConv`` where the QDQ fusions ran, ``Conv@com.microsoft.nchwc``);
    * ``ort_kernel_precisions`` (only when the model has float16 tensors): ``<op>/<fp16|fp32>:<count>``
      of the nodes (Cast/Identity left out) by the element type of their first input, from the graph
      saved at ``ORT_DISABLE_ALL`` (no fusions, standard ops only, so ONNX shape inference types it).
      ONNX Runtime computes an op it has no float16 CPU kernel for in float32 between Casts it inserts
      (``InsertedPrecisionFreeCast_*``), so ``Conv/fp32`` here means a float32 kernel on float16 data.

    Empty when ONNX Runtime cannot save the graph."""
    import collections

    import onnx
    import onnxruntime as ort

    def saved(level: str):
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.log_severity_level = 3
        out = Path(workdir) / f"ort-optimized-{level}.onnx"
        so.optimized_model_filepath = str(out)
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return onnx.load(str(out))

    try:
        m = saved(opt_level)
    except Exception:  # noqa: BLE001 - a report, never a reason to fail
        return {}
    ops = collections.Counter(n.op_type + (f"@{n.domain}" if n.domain else "") for n in m.graph.node)
    report = {"ort_optimized_ops": ",".join(f"{k}:{v}" for k, v in sorted(ops.items()))}
    src = onnx.load(str(path), load_external_data=False)
    if not any(t.data_type == onnx.TensorProto.FLOAT16 for t in src.graph.initializer):
        return report
    try:
        plain = m if opt_level == "ORT_DISABLE_ALL" else saved("ORT_DISABLE_ALL")
        typed = onnx.shape_inference.infer_shapes(plain)
    except Exception:  # noqa: BLE001
        return report
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in list(typed.graph.value_info) + list(typed.graph.input) + list(typed.graph.output)
    }
    types.update({t.name: t.data_type for t in typed.graph.initializer})
    names = {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.FLOAT: "fp32"}
    prec = collections.Counter(
        f"{n.op_type}/{names[types[n.input[0]]]}"
        for n in typed.graph.node
        if n.op_type not in ("Cast", "Identity") and n.input and types.get(n.input[0]) in names
    )
    report["ort_kernel_precisions"] = ",".join(f"{k}:{v}" for k, v in sorted(prec.items()))
    return report


class _OrtPopulationMember(PopulationMember):
    """ONNX Runtime on the population's shared model (mixed in before an :class:`OrtBackend`)."""

    def _model_for_session(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> str:
        return str(self.population_model(model_path, manifest))

    def _prepare_impl(self, model_path, manifest, workdir):
        super()._prepare_impl(model_path, manifest, workdir)
        returned = {
            self._fetch[o.name]: _ORT_TYPES.get(o.type, o.type)
            for o in self.sess.get_outputs()
            if o.name in self._fetch
        }
        self.note_casts(self._info, returned)
        self._kernels = ort_kernel_report(self.converted_path, self.opt_level, workdir)

    def versions(self):
        return {**super().versions(), **getattr(self, "_kernels", {})}


class OrtFp16Backend(_OrtPopulationMember, OrtBackend):
    name = "ort-fp16"
    family = "onnxruntime"
    precision = "fp16"
    population = "fp16"


class OrtFp16NoOptBackend(_OrtPopulationMember, OrtNoOptBackend):
    name = "ort-fp16-noopt"
    family = "onnxruntime"
    precision = "fp16"
    population = "fp16"


class OrtInt8Backend(_OrtPopulationMember, OrtBackend):
    name = "ort-int8"
    family = "onnxruntime"
    precision = "int8"
    population = "int8"

    def versions(self):
        v = super().versions()
        if getattr(self, "converted_path", None) is not None:
            from anpred.machine import kernel_isa, machine_info

            # the kernel family MLAS dispatches u8s8 convolutions/GEMMs to on this CPU (not asked for:
            # it follows from cpuid; without VNNI/AMX, int16 intermediates can saturate)
            v["mlas_u8s8_kernel"] = kernel_isa(machine_info()["cpu_flags"])["int8_u8s8"]
        return v


class OrtInt8NoOptBackend(OrtInt8Backend):
    """The QDQ model with ``ORT_DISABLE_ALL``: QuantizeLinear/DequantizeLinear as written, Conv/MatMul
    in float (fake quantization)."""

    name = "ort-int8-noopt"
    opt_level = "ORT_DISABLE_ALL"

    def versions(self):
        v = super().versions()
        v.pop("mlas_u8s8_kernel", None)  # no integer kernels without the QDQ fusions
        return v
