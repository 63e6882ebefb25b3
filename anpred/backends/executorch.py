"""ExecuTorch backends (issue 37): the model exported with ``torch.export``, lowered to a ``.pte`` and
run in ExecuTorch's runtime (``executorch.runtime``), anchors read as program outputs.

fp32 voters, one family each (they share no kernels with each other beyond what the report shows):

* ``executorch`` (family ``executorch``): no delegate, ExecuTorch's own CPU kernels (portable, or the
  optimized library's where it has one: :mod:`anpred.backends.executorch_lower`);
* ``executorch-xnnpack`` (family ``xnnpack``): the XNNPACK delegate (``XnnpackPartitioner``); what it
  does not take runs as in ``executorch``. LiteRT's CPU path runs XNNPACK too: whether the two share
  errors is measured by the oracle (``report.independence``), not declared.

Origin (class attribute ``origin``): ``onnx`` (the anchored ONNX model through onnx2torch,
:class:`~anpred.backends.executorch_program.OnnxSource`) for ``executorch``/``executorch-xnnpack``;
``native`` (the factory's ``nn.Module``, anchors from the existing mapping) for ``executorch-native``/
``executorch-xnnpack-native``, in the same families as their ONNX-origin twins.

``prepare`` exports the program with the anchors as extra outputs and lowers it, and, to measure the
**observer effect**, also exports and lowers the program without them (the model's outputs only) and
runs both on the check sample (the run's first input, else seeded): ``versions()`` then holds
``executorch_partitions`` (with anchors), ``executorch_observer`` (partitions without anchors, the
largest absolute difference of the outputs, whether they are bit-identical) and what ran where
(:func:`anpred.backends.executorch_lower.summary`). Both programs are cached (kind ``executorch``, keyed
by the model file, the anchors, the origin, the flow, the check sample and the versions).

Options: ``calibration`` (the run's input files: the check sample; int8 members calibrate on them),
``factory``/``factory_kwargs`` (native origin, as ``torch-native``), ``observer`` (default True: build
the program without anchors too).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.executorch_lower import EtProgram, cached_lowering, et_versions, lower, summary
from anpred.backends.executorch_program import NativeSource, OnnxSource, TracedProgram
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest

__all__ = ["ExecutorchBackend", "ExecutorchXnnpackBackend", "ExecutorchNativeBackend",
           "ExecutorchXnnpackNativeBackend", "source_digest", "check_sample", "observer_effect"]


def source_digest() -> str:
    """sha256 of the sources that decide an ExecuTorch program (these modules), part of cache keys."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for f in sorted(here.glob("executorch*.py")) + [here / "torch_onnx.py", here / "torch_native.py"]:
        h.update(f.read_bytes())
    return h.hexdigest()


def check_sample(options: dict[str, Any]) -> tuple[dict[str, np.ndarray] | None, str]:
    """The run's first input file as arrays (``options["calibration"][0]``), with its digest; ``(None,
    "seeded")`` when the run gave none."""
    from anpred.tensorfile import read_array_file

    files = [str(f) for f in (options.get("calibration") or [])]
    if not files:
        return None, "seeded"
    return read_array_file(files[0]), hashlib.sha256(Path(files[0]).read_bytes()).hexdigest()


def observer_effect(with_anchors: list[np.ndarray], without: list[np.ndarray]) -> dict[str, Any]:
    """Outputs of the program with anchor outputs against those of the program without them (same
    sample, same output order): ``bit_identical`` and ``max_abs_diff`` (units of the outputs)."""
    diffs = [float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
             for a, b in zip(with_anchors, without)]
    same = all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(with_anchors, without))
    return {"bit_identical": same, "max_abs_diff": max(diffs) if diffs else 0.0}


class ExecutorchBackend(Backend):
    """``executorch``: the anchored ONNX model (onnx2torch, ``torch.export``) on ExecuTorch's CPU kernels,
    no delegate (module docstring)."""

    name = "executorch"
    family = "executorch"
    precision = "fp32"
    origin: ClassVar[str] = "onnx"
    flow: ClassVar[str] = "portable"

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self.source: OnnxSource | NativeSource | None = None
        self.program: EtProgram | None = None
        self.report: dict[str, Any] = {}
        self._outputs: list[str] = []
        self._info: dict[str, AnchorCapture] = {}

    def _versions_impl(self) -> dict[str, str]:
        v = dict(et_versions())
        v["executorch_flow"] = self.flow
        v["executorch_origin"] = self.origin
        if self.report:
            v.update(summary(self.report))
        return v

    # ---- the program ------------------------------------------------------------------------
    def _source(self, model_path: Path, manifest: AnchorManifest, workdir: Path):
        """The prepared program source of this backend's origin."""
        keep = {k: v for k, v in self.options.items() if k in ("factory", "factory_kwargs")}
        src = NativeSource(keep) if self.origin == "native" else OnnxSource({})
        src.prepare(model_path, manifest, workdir / "source")
        return src

    def _cache_key(self, model_path: Path, manifest: AnchorManifest, sample_id: str, extra: Any = None) -> str:
        from anpred.cache import cache_key

        origin = ({k: self.options.get(k) for k in ("factory", "factory_kwargs")} if self.origin == "native" else {})
        anchors = [(a.name, a.value, a.kind) for a in manifest.anchors]
        return cache_key("executorch", Path(model_path), anchors, self.origin, origin, self.flow, sample_id,
                         et_versions(), source_digest(), bool(self.options.get("observer", True)), extra)

    def _traced(self, with_anchors: bool, sample) -> TracedProgram:
        """The exported program this backend lowers (int8 members quantize it first)."""
        assert self.source is not None
        return self.source.traced(with_anchors, sample)

    def _build(self, sample) -> "Any":
        """Export, lower (with anchors; and without, for the observer effect), return the anchored
        :class:`~anpred.backends.executorch_lower.Lowered` with the observer entries in its report."""
        import tempfile

        traced = self._traced(True, sample)
        what = f"{self.name} program"
        low = lower(traced.program, self.flow, what)
        low.report["outputs"] = traced.outputs
        low.report["notes"] = traced.notes
        if not self.options.get("observer", True):
            return low
        bare = self._traced(False, sample)
        low0 = lower(bare.program, self.flow, what + " without anchor outputs")
        with tempfile.TemporaryDirectory() as tmp:
            p1, p0 = Path(tmp) / "a.pte", Path(tmp) / "b.pte"
            p1.write_bytes(low.pte)
            p0.write_bytes(low0.pte)
            args = [x.numpy() for x in traced.example]
            got1 = dict(zip(traced.outputs, EtProgram(p1).run(args)))
            got0 = EtProgram(p0).run(args)
        effect = observer_effect([got1[n] for n in bare.outputs], got0)
        low.report["observer"] = {"partitions_without_anchors": low0.report["partitions"],
                                  "partitions_with_anchors": low.report["partitions"],
                                  "outputs_compared": bare.outputs, **effect}
        return low

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        self.source = self._source(model_path, manifest, workdir)
        sample, sample_id = check_sample(self.options)
        key = self._cache_key(self._program_path(model_path, manifest), manifest, sample_id, self._key_extra())
        pte, self.report = cached_lowering(key, lambda: self._build(sample))
        self.program = EtProgram(pte)
        self._outputs = list(self.report["outputs"])
        self._info = self.source.captures()
        for a in manifest.anchors:
            cap = self._info.get(a.name)
            if cap is None or cap.status == "missing":
                continue
            if a.name in self._outputs:
                cap.reason = (f"output {self._outputs.index(a.name)} of the ExecuTorch program (an extra output; "
                              f"source: {cap.target or cap.reason})")
            elif not (self.origin == "onnx" and cap.reason in ("graph input", "initializer")):
                cap.status, cap.reason = "missing", "not an output of the exported program"

    def _program_path(self, model_path: Path, manifest: AnchorManifest) -> Path:
        """The model file the program is exported from (the population's converted model for fp16)."""
        return model_path

    def _key_extra(self) -> Any:
        return None

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._info)

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self.source is not None and self.program is not None
        names = self.source.input_names
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"{self.name}: missing input(s) {', '.join(missing)}; model inputs: {', '.join(names)}")
        outs = self.program.run([inputs[n] for n in names])
        res = dict(zip(self._outputs, outs))
        res.update({k: v for k, v in self.source.constants(inputs).items() if k not in res})
        return res

    def close(self) -> None:
        self.program = None
        self.source = None


class ExecutorchXnnpackBackend(ExecutorchBackend):
    """``executorch-xnnpack``: as ``executorch``, with the XNNPACK delegate."""

    name = "executorch-xnnpack"
    family = "xnnpack"
    flow = "xnnpack"


class ExecutorchNativeBackend(ExecutorchBackend):
    """``executorch-native``: the factory's ``nn.Module`` exported directly, no delegate."""

    name = "executorch-native"
    origin = "native"


class ExecutorchXnnpackNativeBackend(ExecutorchXnnpackBackend):
    """``executorch-xnnpack-native``: the factory's ``nn.Module`` on the XNNPACK delegate."""

    name = "executorch-xnnpack-native"
    origin = "native"


def json_digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
