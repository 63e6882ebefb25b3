"""Reduced-precision populations: the shared converted models and the mixin of their members.

A *population* is the set of backends that run the **same** reduced-precision model:

* int8: :func:`int8_model`, one static QDQ model per (model content, quantizer version, recipe,
  calibration data): ``onnxruntime.quantization.quantize_static`` with ``QuantFormat.QDQ``,
  activations uint8 (``QuantType.QUInt8``), weights int8 (``QuantType.QInt8``), per-tensor
  (``per_channel=False``), MinMax calibration (the quantizer's default ``CalibrationMethod.MinMax``)
  on the run's own inputs (``options["calibration"]``, at most ``max_calibration`` = 32 files).
  Anchors stay graph outputs (each the output of a DequantizeLinear, float32).
* fp16: :func:`anpred.backends.lowp_fp16.fp16_model`, one validated float16 model.

Both are cached with :mod:`anpred.cache` under kinds ``lowp-int8`` / ``lowp-fp16``, **not keyed by
backend name**, so every member of a population reads the very same file (same sha256, recorded as
``int8_model_sha256`` / ``fp16_model_sha256`` in the backend's versions). In a run the conversion is
attempted once: one that failed or hung fails every later member at once with its reason
(:mod:`anpred.backends.shared`). A model that is already quantized (:func:`quantized_ops`) has no int8
model: its int8 members are ``unsupported``, reason ``skipped: the model is already quantized (...)``.

Members mix in :class:`PopulationMember`, which gives them:

* :meth:`~PopulationMember.population_model`: the shared model (plus the fault hook below);
* ``effective_precision()``: the precision of the **model** the backend runs, read back from the file
  (:func:`model_precision`), not of its kernels (which go into ``versions()``, e.g.
  ``openvino_runtime_precisions``): an fp16 model whose kernels a runtime computes in f32 is still the
  fp16 model and belongs in the fp16 population;
* ``quantization_steps()``: per anchor the scale of the DequantizeLinear producing it
  (:func:`anchor_quant_steps`), stored by the worker as ``BackendStatus.quant_steps``;
* anchors returned in another dtype than the manifest's are cast to it (exact for float16 ->
  float32) and their capture says so.

Fault hook (evidence for the population verdict, docs/evaluation.md):
``options["fault"] = {"kind", "node", "stage", "magnitude", "seed"}``
makes this member alone run ``passes.faults.inject_fault(<converted model>, ...)``
(:func:`faulted_model`, cached separately under kind ``lowp-fault``, keyed by the converted file, the
fault and the sources of the ``passes`` package); its peers keep the clean converted model. The ground
truth is recorded in versions as ``fault``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from anpred.backends.base import AnchorCapture
from anpred.backends.lowp_fp16 import fp16_model, record_of
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest

__all__ = [
    "INT8_RECIPE",
    "QUANTIZED_OPS",
    "AlreadyQuantized",
    "quantized_ops",
    "int8_model",
    "int8_record",
    "fp16_model",
    "model_precision",
    "anchor_quant_steps",
    "faulted_model",
    "PopulationMember",
]

#: the int8 recipe (part of the cache key; today's ``ort-int8`` recipe)
INT8_RECIPE = {
    "format": "QDQ",
    "activations": "uint8",
    "weights": "int8",
    "per_channel": False,
    "calibration": "MinMax",
    "version": 1,
}


def _files_digest(files: list[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


class _CalibrationReader:
    """``CalibrationDataReader`` over input files (``.safetensors`` or ``.npz``; one sample at a time)."""

    def __init__(self, files: list[str]):
        self._it = iter(files)

    def get_next(self):
        f = next(self._it, None)
        if f is None:
            return None
        from anpred.tensorfile import read_array_file

        return read_array_file(f)


#: operators of a model that is already quantized (ONNX's and ONNX Runtime's ``com.microsoft`` domain);
#: besides these, every ``QLinear*`` and ``DynamicQuantize*`` operator
QUANTIZED_OPS = (
    "QuantizeLinear",
    "DequantizeLinear",
    "MatMulInteger",
    "ConvInteger",
    "MatMulIntegerToFloat",
    "QGemm",
    "QAttention",
    "QEmbedLayerNormalization",
    "QOrderedMatMul",
)


class AlreadyQuantized(BackendError):
    """The int8 population was asked to quantize a model that is already quantized (its message starts
    with ``skipped:``; the worker records the member as ``unsupported`` with it: ``skipped``)."""

    skipped = True


def quantized_ops(model_path: str | Path) -> dict[str, int]:
    """``{op type: count}`` of the quantized operators (:data:`QUANTIZED_OPS`, ``QLinear*``,
    ``DynamicQuantize*``) in the model at ``model_path``, subgraphs included; empty for a float model."""
    import collections

    import onnx

    from anpred.onnx_io import iter_graphs

    m = onnx.load(str(model_path), load_external_data=False)
    found = collections.Counter(
        n.op_type
        for g in iter_graphs(m.graph)
        for n in g.node
        if n.op_type in QUANTIZED_OPS or n.op_type.startswith(("QLinear", "DynamicQuantize"))
    )
    return dict(sorted(found.items()))


def int8_model(model_path: str | Path, calibration_files: list[str], max_calibration: int = 32) -> Path:
    """The static QDQ int8 model of ``model_path`` (recipe in the module docstring), cached.

    Args:
        model_path: float32 ONNX file (e.g. the anchored model of a run).
        calibration_files: ``.safetensors``/``.npz`` files, each one sample of every graph input; the
            first ``max_calibration`` are used (their content is part of the cache key).

    Returns:
        path of ``model.onnx`` in the cache (``record.json`` beside it: :func:`int8_record`).

    Raises:
        AlreadyQuantized: the model holds quantized operators (:func:`quantized_ops`): there is no
            float model to quantize; the member's status is ``unsupported``, reason ``skipped: ...``.
        BackendError: no calibration files, or the quantizer failed (its error text included), now or
            earlier in this run (:func:`anpred.backends.shared.shared_cached_dir`).
    """
    from anpred.backends.shared import shared_cached_dir
    from anpred.cache import cache_key

    found = quantized_ops(model_path)
    if found:
        ops = ", ".join(f"{k}:{v}" for k, v in found.items())
        raise AlreadyQuantized(
            f"skipped: the model is already quantized ({ops}); the int8 population quantizes "
            "a float model (quantize_static), which this is not"
        )
    files = [str(f) for f in calibration_files][: int(max_calibration)]
    if not files:
        raise BackendError(
            "the int8 model needs calibration inputs (options['calibration']: .safetensors/.npz "
            "files of the graph inputs); the runner passes the run's inputs"
        )
    import onnxruntime

    model_path = Path(model_path)
    key = cache_key("int8", model_path, onnxruntime.__version__, INT8_RECIPE, _files_digest(files), len(files))

    def build(tmp: Path) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        reader = type("Reader", (_CalibrationReader, CalibrationDataReader), {})(files)
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer warns per bias on the root logger
        try:
            quantize_static(
                str(model_path),
                str(tmp / "model.onnx"),
                reader,
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                per_channel=False,
            )
        except Exception as err:  # noqa: BLE001 - the quantizer raises many types
            raise BackendError(f"int8 quantization failed ({type(err).__name__}: {str(err)[:500]})") from err
        finally:
            root.setLevel(level)
        (tmp / "record.json").write_text(
            json.dumps(
                {
                    "int8_quantizer": f"onnxruntime.quantization.quantize_static {onnxruntime.__version__}",
                    "int8_recipe": "QDQ, activations uint8, weights int8, per-tensor, MinMax",
                    "int8_calibration_samples": str(len(files)),
                },
                indent=1,
            )
        )

    # once per run for every member (anpred.backends.shared): a quantization that failed is not started again
    return shared_cached_dir("lowp-int8", key, build, "the int8 quantization (QDQ)", "int8") / "model.onnx"


def int8_record(path: str | Path) -> dict[str, str]:
    """The conversion record of an :func:`int8_model` file, with ``int8_model_sha256``."""
    from anpred.onnx_io import sha256_file

    return {**record_of(Path(path)), "int8_model_sha256": sha256_file(path)}


def _weights(model) -> list:
    """Initializers and ``Constant`` ``value`` tensors of the main graph and every subgraph (walked
    iteratively)."""
    import onnx

    from anpred.onnx_io import iter_graphs

    tensors = []
    for g in iter_graphs(model.graph):
        tensors += list(g.initializer)
        tensors += [
            a.t
            for node in g.node
            if node.op_type == "Constant"
            for a in node.attribute
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR
        ]
    return tensors


def model_precision(path: str | Path) -> tuple[str, dict[str, str]]:
    """``(precision, details)`` of the model **file** at ``path``:

    * ``int8``: it holds QuantizeLinear and DequantizeLinear nodes whose zero points are 8-bit
      (uint8/int8 initializers);
    * ``fp16``: every floating weight of rank >= 2 (initializers and ``Constant`` values, subgraphs
      included) is float16;
    * else ``fp32``, with the reason in ``details["population_precision_reason"]``.

    Details: ``converted_weights`` (``float16:<n>,float32:<n>`` counts of rank>=2 float weights),
    ``qdq_nodes`` (``QuantizeLinear:<n>,DequantizeLinear:<n>``), ``quantized_types`` (zero point types).
    """
    import onnx

    from anpred.onnx_io import elem_type_name

    m = onnx.load(str(path), load_external_data=False)
    floats = (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT)
    kinds = [t.data_type for t in _weights(m) if len(t.dims) >= 2 and t.data_type in floats]
    n16 = sum(k == onnx.TensorProto.FLOAT16 for k in kinds)
    q = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
    dq = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    inits = {t.name: t for t in m.graph.initializer}
    types = sorted(
        {elem_type_name(inits[n.input[2]].data_type) for n in q + dq if len(n.input) > 2 and n.input[2] in inits}
    )
    details = {"converted_weights": f"float16:{n16},float32:{len(kinds) - n16}"}
    if q or dq:
        details["qdq_nodes"] = f"QuantizeLinear:{len(q)},DequantizeLinear:{len(dq)}"
        details["quantized_types"] = ",".join(types)
    if q and dq and set(types) & {"int8", "uint8"}:
        return "int8", details
    if kinds and n16 == len(kinds):
        return "fp16", details
    if not kinds:
        why = "no QuantizeLinear/DequantizeLinear with 8-bit zero points and no float weight of rank >= 2"
    else:
        why = f"{len(kinds) - n16} of {len(kinds)} float weights of rank >= 2 are float32"
    details["population_precision_reason"] = why
    return "fp32", details


def _scalar(t) -> float | None:
    from onnx import numpy_helper

    a = numpy_helper.to_array(t)
    return float(a.reshape(-1)[0]) if a.size == 1 else None


def anchor_quant_steps(path: str | Path, manifest: AnchorManifest) -> dict[str, float]:
    """Per anchor, the quantization step of its tensor in the QDQ model at ``path``: the scale of the
    DequantizeLinear that produces the graph output the anchor is read from (named ``anchor.name``,
    else ``anchor.value``), following ``Identity`` nodes back. Only per-tensor (scalar) scales held in
    initializers or ``Constant`` nodes count; anchors without one are left out.

    Returns:
        ``{anchor name: scale}`` (float, units of the anchor's tensor per integer step).
    """
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    producer = {o: n for n in m.graph.node for o in n.output}
    consts = {t.name: t for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    consts[n.output[0]] = a.t
    outs = {o.name for o in m.graph.output}
    steps: dict[str, float] = {}
    for a in manifest.anchors:
        name = a.name if a.name in outs else a.value if a.value in outs else None
        node, hops = producer.get(name) if name else None, 0
        while node is not None and node.op_type == "Identity" and hops < 64:
            node, hops = producer.get(node.input[0]), hops + 1
        if node is None or node.op_type != "DequantizeLinear" or node.input[1] not in consts:
            continue
        s = _scalar(consts[node.input[1]])
        if s is not None:
            steps[a.name] = s
    return steps


def faulted_model(path: str | Path, fault: dict[str, Any], manifest: AnchorManifest | None) -> tuple[Path, dict]:
    """The converted model at ``path`` with one fault injected by
    ``passes.faults.inject_fault(model, kind, node=, stage=, magnitude=, manifest=, seed=)``, cached
    (kind ``lowp-fault``; key: the file's content, the fault, the manifest's stages when ``stage`` is
    given, and the sources of the ``passes`` package).

    Args:
        fault: ``{"kind": str, "node": str|None, "stage": int|None, "magnitude": float|None, "seed": int}``.

    Returns:
        ``(path of the variant, FaultTruth as a dict)``.

    Raises:
        BackendError: malformed fault, or the fault cannot be injected (the FaultError's text).
    """
    from anpred.cache import cache_key, cached_dir

    if not isinstance(fault, dict) or not fault.get("kind"):
        raise BackendError(f"options['fault'] must be a dict with a 'kind', got {fault!r}")
    import passes.faults as pf

    f = {
        "kind": str(fault["kind"]),
        "node": fault.get("node"),
        "stage": fault.get("stage"),
        "magnitude": fault.get("magnitude"),
        "seed": int(fault.get("seed", 0)),
    }
    stages = manifest.to_dict().get("stages") if (manifest is not None and f["stage"] is not None) else None
    sources = sorted(Path(pf.__file__).parent.glob("*.py"))  # passes/faults.py and what it may import
    key = cache_key("fault", Path(path), f, stages, *sources)

    def build(tmp: Path) -> None:
        import onnx

        from anpred.onnx_io import save_model

        model = onnx.load(str(path))
        try:
            variant, truth = pf.inject_fault(
                model,
                f["kind"],
                node=f["node"],
                stage=f["stage"],
                magnitude=f["magnitude"],
                manifest=manifest,
                seed=f["seed"],
            )
        except Exception as err:  # noqa: BLE001 - FaultError, or a checker error on the variant
            raise BackendError(f"cannot inject fault {f} into the converted model: {err}") from err
        save_model(variant, tmp / "model.onnx")
        (tmp / "fault.json").write_text(json.dumps(truth.to_dict()))

    d = cached_dir("lowp-fault", key, build)
    return d / "model.onnx", json.loads((d / "fault.json").read_text())


class PopulationMember:
    """Mixin of a reduced-precision population member (mixed in *before* the runtime's backend class).

    Class attributes: ``population`` (``"int8"`` or ``"fp16"``); ``needs_calibration = True`` (the
    runner passes the run's input files as ``options["calibration"]``: int8 calibrates on them, fp16
    validates its conversion on the first one).

    Options: ``calibration`` (list of input files), ``max_calibration`` (int8, default 32), ``fault``
    (module docstring).
    """

    population: ClassVar[str] = ""
    needs_calibration: ClassVar[bool] = True

    def population_model(self, model_path: Path, manifest: AnchorManifest) -> Path:
        """The shared converted model of this population for ``model_path`` (faulted for this member
        alone when ``options["fault"]`` is set); sets ``converted_path``, ``clean_model_path`` and the
        record returned by ``versions()``."""
        cal = [str(f) for f in (self.options.get("calibration") or [])]
        if self.population == "int8":
            path = int8_model(model_path, cal, int(self.options.get("max_calibration", 32)))
            record = int8_record(path)
        elif self.population == "fp16":
            path, record = fp16_model(model_path, cal[0] if cal else None)
        else:
            raise BackendError(f"{type(self).__name__}: unknown population {self.population!r}")
        self.clean_model_path = path
        if self.options.get("fault"):
            path, truth = faulted_model(path, self.options["fault"], manifest)
            record["fault"] = json.dumps(truth, sort_keys=True)
        self.converted_path = path
        self._model_precision, details = model_precision(path)
        self._population_record = {**record, **details, "population": self.population}
        return path

    def effective_precision(self) -> str:
        """The precision of the model this backend runs (:func:`model_precision`); the nominal one
        before ``prepare``."""
        return getattr(self, "_model_precision", self.precision)

    def versions(self) -> dict[str, str]:
        return {**super().versions(), **{k: str(v) for k, v in getattr(self, "_population_record", {}).items()}}

    def quantization_steps(self) -> dict[str, float]:
        if self.population != "int8" or getattr(self, "converted_path", None) is None or self.manifest is None:
            return {}
        return anchor_quant_steps(self.converted_path, self.manifest)

    def note_casts(self, info: dict[str, AnchorCapture], returned: dict[str, str]) -> None:
        """Record in ``info`` (anchor -> capture) that anchors returned (``returned``: anchor -> dtype
        name as the runtime gives it) in another dtype than the manifest's are cast to it."""
        assert self.manifest is not None
        for a in self.manifest.anchors:
            got = returned.get(a.name)
            cap = info.get(a.name)
            if got and a.dtype and got != a.dtype and cap is not None and cap.status != "missing":
                note = f"returned as {got} by the converted model, cast to {a.dtype}"
                cap.reason = f"{cap.reason}; {note}" if cap.reason else note

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = super()._run_impl(inputs)
        assert self.manifest is not None
        out = {}
        for k, v in res.items():
            v = np.asarray(v)
            want = self.manifest[k].dtype
            out[k] = v.astype(want) if want and str(v.dtype) != want else v
        return out
