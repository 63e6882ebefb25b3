"""ExecuTorch's reduced-precision flows as population members.

**int8, the PT2E scheme.** One quantized program per (model, anchors, origin, calibration samples,
scheme, versions), cached (kind ``executorch-pt2e``, ``torch.export.save`` of the converted program):
the exported program (anchors as outputs, :mod:`anpred.backends.executorch_program`) quantized with
``XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True[,
is_dynamic=True]))`` through ``torchao.quantization.pt2e.quantize_pt2e.prepare_pt2e``, calibrated on
the run's inputs (``options["calibration"]``, at most ``max_calibration`` = 32 files), ``convert_pt2e``,
exported again. Its implementations, one population (``precision`` int8):

* ``torch-pt2e-int8`` (family ``torch``): the converted program in eager PyTorch: quantize/dequantize
  ops around float kernels (fake quantization, the scheme as written);
* ``executorch-int8`` (family ``executorch``): the same program on ExecuTorch's kernels, no delegate:
  quantize/dequantize on ``libexecutorch_kernels_quantized``, the float operators between on the
  portable/optimized kernels;
* ``executorch-xnnpack-int8`` (family ``xnnpack``): the same program lowered to XNNPACK, which fuses
  dequantize -> operator -> quantize into its integer kernels (QS8/QC8W).

``*-int8-dynamic`` (``executorch-xnnpack-int8-dynamic``, ``torch-pt2e-int8-dynamic``): the dynamic
per-channel scheme (activations quantized per call), a **different** program: beside the static
members (or the ONNX QDQ ones) it forms a population of its own, told apart by ``pt2e_program_sha256``
(:mod:`anpred.judge.populations`). Where XNNPACK cannot
lower it (measured: a Linear after a Conv in one program, ``Weight and Input should both be
quantized``) the member fails with the operator named.

**fp16.** ``executorch-fp16`` and ``executorch-xnnpack-fp16`` run the fp16 population's shared float16
ONNX model (:func:`anpred.backends.lowp_fp16.fp16_model`, the model ``ort-fp16`` and ``torch-fp16``
run) exported through onnx2torch like the fp32 model: the population's definition (one reduced model,
many implementations) holds, and ``torch-fp16`` is its eager PyTorch member.

Each member's ``effective_precision()`` is its population's; ``versions()`` adds the program's sha256
(``pt2e_program_sha256``), the recipe and the lowering report.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from anpred.backends.executorch import ExecutorchBackend, ExecutorchXnnpackBackend, check_sample, source_digest
from anpred.backends.executorch_lower import et_versions
from anpred.backends.executorch_program import TracedProgram, example_inputs
from anpred.backends.lowp_models import PopulationMember
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest

__all__ = [
    "PT2E_SCHEMES",
    "ExecutorchFp16Backend",
    "ExecutorchInt8Backend",
    "ExecutorchXnnpackFp16Backend",
    "ExecutorchXnnpackInt8Backend",
    "ExecutorchXnnpackInt8DynamicBackend",
    "TorchPt2eInt8Backend",
    "TorchPt2eInt8DynamicBackend",
    "load_quantized_ops",
    "output_steps",
    "pt2e_program",
    "quantize_pt2e",
]

#: PT2E schemes: arguments of ``get_symmetric_quantization_config`` (ExecuTorch's test flows
#: ``xnnpack_static_int8_per_channel`` and ``xnnpack_dynamic_int8_per_channel`` use the same)
PT2E_SCHEMES: dict[str, dict[str, bool]] = {
    "static": {"is_per_channel": True},
    "dynamic": {"is_per_channel": True, "is_dynamic": True},
}


def load_quantized_ops() -> None:
    """Register the ``quantized_decomposed`` operators (torchao's PT2E library) and their ExecuTorch out
    variants, which ``torch.export.load`` of a converted program needs."""
    import executorch.kernels.quantized  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401


def _calibration(files: list[str], names: list[str]) -> list[tuple]:
    """Each calibration file as a tuple of tensors in the program's input order."""
    import torch

    from anpred.tensorfile import read_array_file

    out = []
    for f in files:
        arrays = read_array_file(f)
        missing = [n for n in names if n not in arrays]
        if missing:
            raise BackendError(f"calibration file {f} lacks input(s) {', '.join(missing)}")
        out.append(tuple(torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in names))
    return out


def output_steps(program, outputs: list[str]) -> dict[str, float]:
    """Per anchor, the quantization step of its output in a converted PT2E program: the ``scale``
    argument of the ``dequantize_per_tensor`` producing output position i (anchor ``outputs[i]``);
    outputs without one are left out."""
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    steps = {}
    for name, arg in zip(outputs, out_node.args[0]):
        if getattr(arg, "op", "") == "call_function" and "dequantize_per_tensor" in str(arg.target):
            scale = arg.args[1]
            if isinstance(scale, (int, float)):
                steps[name] = float(scale)
    return steps


def quantize_pt2e(traced: TracedProgram, calib: list[tuple], scheme: str):
    """PT2E: prepare, calibrate, convert and export ``traced``'s program (module docstring)."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from anpred.backends.executorch_program import export_module, first_line

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(**PT2E_SCHEMES[scheme]))
    try:
        prepared = prepare_pt2e(traced.program.module(), quantizer)
        with torch.no_grad():
            for args in calib or [traced.example]:
                prepared(*args)
        converted = convert_pt2e(prepared)
    except Exception as err:
        raise BackendError(f"PT2E {scheme} quantization failed: {first_line(err)}") from err
    return export_module(converted, traced.example, f"the PT2E {scheme} int8 program")


def pt2e_program(
    backend: ExecutorchBackend, model_path: Path, manifest: AnchorManifest, with_anchors: bool, scheme: str
) -> tuple[Path, dict[str, Any]]:
    """The cached converted PT2E program of ``backend``'s source (its ``source`` prepared): ``(path of
    program.pt2, record)`` where the record holds ``outputs`` (anchor per output), ``steps`` (anchor ->
    quantization step), ``recipe``, ``calibration_samples`` and ``pt2e_program_sha256``."""
    from anpred.cache import cache_key, cached_dir

    files = [str(f) for f in (backend.options.get("calibration") or [])][
        : int(backend.options.get("max_calibration", 32))
    ]
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in files)).hexdigest()
    origin = {k: backend.options.get(k) for k in ("factory", "factory_kwargs")} if backend.origin == "native" else {}
    key = cache_key(
        "pt2e",
        Path(model_path),
        [(a.name, a.value, a.kind) for a in manifest.anchors],
        backend.origin,
        origin,
        with_anchors,
        scheme,
        PT2E_SCHEMES[scheme],
        digest,
        len(files),
        et_versions(),
        source_digest(),
    )

    def build(tmp: Path) -> None:
        import torch

        sample, _ = check_sample(backend.options)
        traced = backend.source.traced(with_anchors, sample)
        ep = quantize_pt2e(traced, _calibration(files, traced.inputs), scheme)
        torch.export.save(ep, str(tmp / "program.pt2"))
        record = {
            "outputs": traced.outputs,
            "inputs": traced.inputs,
            "steps": output_steps(ep.graph_module, traced.outputs),
            "recipe": f"PT2E XNNPACKQuantizer get_symmetric_quantization_config({PT2E_SCHEMES[scheme]})",
            "calibration_samples": len(files) or 1,
        }
        (tmp / "record.json").write_text(json.dumps(record, indent=1))

    d = cached_dir("executorch-pt2e", key, build)
    record = json.loads((d / "record.json").read_text())
    record["pt2e_program_sha256"] = hashlib.sha256((d / "program.pt2").read_bytes()).hexdigest()
    return d / "program.pt2", record


class _Pt2eMember:
    """Mixin of the PT2E int8 members (before an :class:`ExecutorchBackend` class): the program they
    lower is the cached converted PT2E program (:func:`pt2e_program`) of scheme ``scheme``."""

    scheme: ClassVar[str] = "static"
    population: ClassVar[str] = "int8"
    needs_calibration: ClassVar[bool] = True
    precision = "int8"

    def _traced(self, with_anchors: bool, sample) -> TracedProgram:
        load_quantized_ops()
        import torch

        path, record = pt2e_program(self, self._model_path, self.manifest, with_anchors, self.scheme)
        if with_anchors:
            self._record = record
        ep = torch.export.load(str(path))
        example = example_inputs(self.manifest, record["inputs"], sample)
        return TracedProgram(ep, record["inputs"], record["outputs"], example, None, [record["recipe"]])

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        self._model_path = model_path
        self.manifest = manifest
        super()._prepare_impl(model_path, manifest, workdir)
        # the shared program's record (also when the lowering came from the cache)
        _, self._record = pt2e_program(self, model_path, manifest, True, self.scheme)

    def _key_extra(self) -> Any:
        return {
            "pt2e": self.scheme,
            "calibration": [
                hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in (self.options.get("calibration") or [])
            ][:32],
        }

    def effective_precision(self) -> str:
        return "int8"

    def quantization_steps(self) -> dict[str, float]:
        return dict(getattr(self, "_record", {}).get("steps", {}))

    def versions(self) -> dict[str, str]:
        rec = getattr(self, "_record", {})
        extra = {
            "population": "int8",
            "pt2e_recipe": rec.get("recipe", ""),
            "pt2e_program_sha256": rec.get("pt2e_program_sha256", ""),
            "pt2e_calibration_samples": str(rec.get("calibration_samples", "")),
        }
        return {**super().versions(), **extra}


class ExecutorchInt8Backend(_Pt2eMember, ExecutorchBackend):
    """``executorch-int8``: the PT2E static int8 program on ExecuTorch's kernels (no delegate)."""

    name = "executorch-int8"


class ExecutorchXnnpackInt8Backend(_Pt2eMember, ExecutorchXnnpackBackend):
    """``executorch-xnnpack-int8``: the PT2E static int8 program on the XNNPACK delegate."""

    name = "executorch-xnnpack-int8"


class ExecutorchXnnpackInt8DynamicBackend(_Pt2eMember, ExecutorchXnnpackBackend):
    """``executorch-xnnpack-int8-dynamic``: the PT2E dynamic per-channel program on XNNPACK."""

    name = "executorch-xnnpack-int8-dynamic"
    scheme = "dynamic"


class TorchPt2eInt8Backend(_Pt2eMember, ExecutorchBackend):
    """``torch-pt2e-int8``: the converted PT2E program in eager PyTorch (fake quantization)."""

    name = "torch-pt2e-int8"
    family = "torch"
    flow = "eager"

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import torch

        self._model_path = model_path
        self.manifest = manifest
        self.source = self._source(model_path, manifest, workdir)
        path, self._record = pt2e_program(self, model_path, manifest, True, self.scheme)
        load_quantized_ops()
        self._module = torch.export.load(str(path)).module()
        self._outputs = list(self._record["outputs"])
        self._info = self.source.captures()
        for a in manifest.anchors:
            cap = self._info.get(a.name)
            if cap is not None and cap.status != "missing" and a.name in self._outputs:
                cap.reason = f"output {self._outputs.index(a.name)} of the converted PT2E program, run eagerly"
            elif cap is not None and cap.status != "missing" and cap.reason not in ("graph input", "initializer"):
                cap.status, cap.reason = "missing", "not an output of the exported program"

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        assert self.source is not None
        names = self.source.input_names
        with torch.no_grad():
            outs = self._module(*[torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names])
        res = {k: v.detach().numpy().copy() for k, v in zip(self._outputs, outs)}
        res.update({k: v for k, v in self.source.constants(inputs).items() if k not in res})
        return res

    def versions(self) -> dict[str, str]:
        v = super().versions()
        v["executorch_flow"] = "eager PyTorch (no ExecuTorch runtime)"
        return v


class TorchPt2eInt8DynamicBackend(TorchPt2eInt8Backend):
    """``torch-pt2e-int8-dynamic``: the dynamic per-channel PT2E program in eager PyTorch."""

    name = "torch-pt2e-int8-dynamic"
    scheme = "dynamic"


class _Fp16Member(PopulationMember):
    """The fp16 population's shared float16 ONNX model, exported and lowered like the fp32 model."""

    population = "fp16"
    precision = "fp16"

    def _source(self, model_path: Path, manifest: AnchorManifest, workdir: Path):
        return super()._source(self.population_model(model_path, manifest), manifest, workdir)

    def _program_path(self, model_path: Path, manifest: AnchorManifest) -> Path:
        return self.converted_path


class ExecutorchFp16Backend(_Fp16Member, ExecutorchBackend):
    """``executorch-fp16``: the float16 model on ExecuTorch's kernels (no delegate)."""

    name = "executorch-fp16"


class ExecutorchXnnpackFp16Backend(_Fp16Member, ExecutorchXnnpackBackend):
    """``executorch-xnnpack-fp16``: the float16 model on the XNNPACK delegate."""

    name = "executorch-xnnpack-fp16"
