"""ExecuTorch backends: the model exported with ``torch.export``, lowered to a ``.pte`` and
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
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.executorch_etdump import EtdumpProgram
from anpred.backends.executorch_lower import (
    EtProgram,
    Lowered,
    cached_lowering,
    et_versions,
    kernel_library_of,
    lower,
    summary,
)
from anpred.backends.executorch_program import NativeSource, OnnxSource, TracedProgram, first_line
from anpred.errors import InputError
from anpred.manifest import AnchorManifest

__all__ = [
    "ExecutorchBackend",
    "ExecutorchNativeBackend",
    "ExecutorchXnnpackBackend",
    "ExecutorchXnnpackNativeBackend",
    "check_sample",
    "etdump_writers",
    "observer_effect",
    "source_digest",
]


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
    diffs = [
        float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        for a, b in zip(with_anchors, without)
    ]
    same = all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(with_anchors, without))
    return {"bit_identical": same, "max_abs_diff": max(diffs) if diffs else 0.0}


def etdump_writers(anchored: dict[str, Any], bare: dict[str, Any], outputs: list[str]) -> dict[str, list] | str:
    """Anchor name -> ``[instruction, element]`` of the program without anchor outputs that writes it,
    from the lowering reports of the program with them (``anchored``, outputs ``outputs``) and without
    (``bare``); the reason as a string where the ETDump capture cannot be used."""
    if anchored.get("instructions") != bare.get("instructions"):
        return (
            "the programs with and without anchor outputs execute different operators: ETDump instruction "
            "indices do not carry over"
        )
    if anchored.get("partitions") or bare.get("partitions"):
        return "a delegate's partitions log no tensor inside them in ETDump"
    writers = {}
    for name, w in zip(outputs, anchored.get("output_writers", [])):
        if w is None:
            return f"anchor {name} is not written by a kernel call (an input, a constant or a moved value)"
        writers[name] = w
    return writers


class ExecutorchBackend(Backend):
    """``executorch``: the anchored ONNX model (onnx2torch, ``torch.export``) on ExecuTorch's CPU kernels,
    no delegate (module docstring)."""

    name = "executorch"
    family = "executorch"
    precision = "fp32"
    origin: ClassVar[str] = "onnx"
    flow: ClassVar[str] = "portable"
    #: how anchors are read: ``etdump`` (ExecuTorch's intermediate-output capture, no extra outputs; the
    #: programs without a delegate) or ``outputs`` (extra program outputs; XNNPACK logs no tensor inside
    #: its partitions)
    capture: ClassVar[str] = "etdump"
    #: the runner passes the run's input files as ``options["calibration"]``: the first is the check
    #: sample (tracing, the observer effect), the int8 members calibrate on them
    needs_calibration: ClassVar[bool] = True

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

        origin = {k: self.options.get(k) for k in ("factory", "factory_kwargs")} if self.origin == "native" else {}
        anchors = [(a.name, a.value, a.kind) for a in manifest.anchors]
        return cache_key(
            "executorch",
            Path(model_path),
            anchors,
            self.origin,
            origin,
            self.flow,
            sample_id,
            et_versions(),
            source_digest(),
            bool(self.options.get("observer", True)),
            extra,
        )

    def _traced(self, with_anchors: bool, sample) -> TracedProgram:
        """The exported program this backend lowers (int8 members quantize it first)."""
        assert self.source is not None
        return self.source.traced(with_anchors, sample)

    def _build(self, sample) -> Lowered:
        """Export and lower the program with anchor outputs and, for the observer effect and the ETDump
        capture, the program without them; run both on the check sample. Returns the program this
        backend runs (the one without anchor outputs where ETDump captures the anchors) with the
        lowering report, ``outputs``, ``capture`` and ``observer`` entries."""
        traced = self._traced(True, sample)
        what = f"{self.name} program"
        low = lower(traced.program, self.flow, what)
        reason = (
            "extra program outputs: an XNNPACK partition logs only its own outputs in ETDump"
            if self.capture != "etdump"
            else "extra program outputs"
        )
        low.report.update(outputs=traced.outputs, notes=traced.notes, capture={"kind": "outputs", "reason": reason})
        if not self.options.get("observer", True) and self.capture != "etdump":
            return low
        bare = self._traced(False, sample)
        low0 = lower(bare.program, self.flow, what + " without anchor outputs")
        args = [x.numpy() for x in traced.example]
        with tempfile.TemporaryDirectory() as tmp:
            p1, p0 = Path(tmp) / "a.pte", Path(tmp) / "b.pte"
            p1.write_bytes(low.pte)
            p0.write_bytes(low0.pte)
            got1 = dict(zip(traced.outputs, EtProgram(p1).run(args)))
            got0 = EtProgram(p0).run(args)
            writers = etdump_writers(low.report, low0.report, traced.outputs) if self.capture == "etdump" else None
            if isinstance(writers, dict):
                try:
                    got_e = EtdumpProgram(p0, writers, bare.outputs, low0.report["debug_buffer_bytes"]).run(args)
                except Exception as err:  # noqa: BLE001 - measured: ETDump 1.5.1 logs no float16 tensor
                    writers = f"ETDump failed on the check sample: {first_line(err)}"
        observer = {
            "partitions_without_anchors": low0.report["partitions"],
            "partitions_with_anchors": low.report["partitions"],
            "outputs_compared": bare.outputs,
            **observer_effect([got1[n] for n in bare.outputs], got0),
        }
        if not isinstance(writers, dict):
            if writers is not None:
                low.report["capture"]["reason"] = writers
            low.report["observer"] = observer
            return low
        # the ETDump capture: anchors read from the debug buffer of the program without anchor outputs,
        # compared with the extra outputs of the anchored program on the same sample
        low0.report.update(
            outputs=traced.outputs,
            notes=traced.notes,
            observer=observer,
            capture={
                "kind": "etdump",
                "writers": writers,
                "program_outputs": bare.outputs,
                "vs_extra_outputs": observer_effect(
                    [got1[n] for n in traced.outputs], [got_e[n] for n in traced.outputs]
                ),
            },
        )
        return Lowered(low0.pte, low0.report)

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        self.source = self._source(model_path, manifest, workdir)
        sample, sample_id = check_sample(self.options)
        key = self._cache_key(self._program_path(model_path, manifest), manifest, sample_id, self._key_extra())
        pte, self.report = cached_lowering(key, lambda: self._build(sample))
        capture = self.report.get("capture", {})
        if capture.get("kind") == "etdump":
            self.program = EtdumpProgram(
                pte, capture["writers"], capture["program_outputs"], self.report["debug_buffer_bytes"]
            )
        else:
            self.program = EtProgram(pte)
        self._outputs = list(self.report["outputs"])
        self._info = self.source.captures()
        ops = self.report.get("instructions", [])
        for a in manifest.anchors:
            cap = self._info.get(a.name)
            if cap is None or cap.status == "missing":
                continue
            src = cap.target or cap.reason
            if a.name in capture.get("writers", {}) and a.name not in capture.get("program_outputs", []):
                instr = capture["writers"][a.name][0]
                cap.reason = (
                    f"ETDump: written by instruction {instr} ({ops[instr] if instr < len(ops) else '?'}) "
                    f"of the program without anchor outputs, read from its debug buffer (source: {src})"
                )
            elif a.name in self._outputs:
                i = self._outputs.index(a.name)
                cap.reason = (
                    f"output {i} of the ExecuTorch program"
                    + (" (an extra output" if capture.get("kind") != "etdump" else " (a model output")
                    + f"; {self._written_by(i)}; source: {src})"
                )
            elif not (self.origin == "onnx" and cap.reason in ("graph input", "initializer")):
                cap.status, cap.reason = "missing", "not an output of the exported program"

    def _written_by(self, position: int) -> str:
        """Who computes program output ``position``: the delegate, or the kernel (and its library) that
        runs outside it (a partial delegation, per anchor)."""
        writers, ops = self.report.get("output_writers", []), self.report.get("instructions", [])
        w = writers[position] if position < len(writers) else None
        if w is None:
            return "computed in an XNNPACK partition" if self.report.get("partitions") else "not a kernel's output"
        op = ops[w[0]] if w[0] < len(ops) else "?"
        outside = ", outside the delegate" if self.flow != "portable" else ""
        return f"computed by {op} ({kernel_library_of(op)} kernel{outside})"

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
        arrays = [inputs[n] for n in names]
        if isinstance(self.program, EtdumpProgram):
            res = self.program.run(arrays)
        else:
            res = dict(zip(self._outputs, self.program.run(arrays)))
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
    capture = "outputs"


class ExecutorchNativeBackend(ExecutorchBackend):
    """``executorch-native``: the factory's ``nn.Module`` exported directly, no delegate."""

    name = "executorch-native"
    origin = "native"


class ExecutorchXnnpackNativeBackend(ExecutorchXnnpackBackend):
    """``executorch-xnnpack-native``: the factory's ``nn.Module`` on the XNNPACK delegate."""

    name = "executorch-xnnpack-native"
    origin = "native"
