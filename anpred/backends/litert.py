"""Backend ``litert`` (family ``litert``): the ``tf`` backend's onnx2tf conversion, turned into a
float32 TFLite flatbuffer and run by LiteRT (``ai-edge-litert``) with its XNNPACK delegate.

Kernels: LiteRT's interpreter with the default op resolver (``OpResolverType.AUTO``), which applies
the XNNPACK delegate to every op XNNPACK supports (Conv2D, depthwise, fully connected, elementwise,
pooling, resize, softmax, concatenation ...); the rest run on TFLite's builtin kernels
(``tensorflow/lite/kernels``). XNNPACK is LiteRT's own kernel library, independent of the Eigen
kernels TensorFlow runs the ``tf`` backend on. Precision: fp32 everywhere. The flatbuffer holds
float32 weights and tensors only (``TFLiteConverter`` with ``supported_ops = [TFLITE_BUILTINS]`` and
no ``optimizations``: no quantization, no float16 weights, no ``reduced_precision_support``
metadata), the delegate is XNNPACK's default one (``TfLiteXNNPackDelegateOptionsDefault``: no
``FORCE_FP16`` flag, ``experimental_default_delegate_latest_features=False``), so XNNPACK runs its
f32 microkernels; the number of delegated partitions is read back after ``prepare``
(:attr:`LiteRtBackend.delegate_partitions`, 0 = XNNPACK took no op and builtin kernels run
everything).

Family: ``litert``. Kernels are independent of ``tensorflow``'s, but the *conversion* is shared:
the same cached onnx2tf SavedModel (:class:`anpred.backends.tf_onnx.TfOnnxBackend`, cache folder
``onnx2tf/<key>``) is the source of the flatbuffer, so a defect of onnx2tf (a wrong lowering) shows
in both ``tf`` and ``litert`` alike: the two share their converter but not their kernels (the partial
sharing the oracle's independence measurement has to find, :mod:`anpred.judge.independence`).

Conversion (cached under ``litert/<key>``, key = the onnx2tf conversion key + TensorFlow version +
:data:`FORMAT`): the SavedModel's ``run`` endpoint (``tf_keras.export.ExportArchive``, a list of
outputs in ``meta.json`` order) goes through ``tf.lite.TFLiteConverter.from_saved_model(...,
signature_keys=["run"])`` (a few seconds; onnx2tf does not run again). A TF op with no TFLite
builtin (it would need the Flex / TF Select delegate, which LiteRT does not ship) makes the
conversion fail (:class:`FlexOpsError` names those ops from the converter's message). Where the ONNX
op has a decomposition accurate to float32 (``Erf``: Eigen's rational approximation, the one
TensorFlow's own CPU kernel is built on; :data:`DECOMPOSED_OPERATORS`), litert
converts again with it (its own onnx2tf conversion then, no longer shared with ``tf``;
``decomposed_operators`` in the versions). onnx2tf's own pseudo operators are not used: its pseudo
Erf (Abramowitz-Stegun 7.1.26) cancels near 0 in float32, its pseudo Asin/Acos divide by |x| (NaN at
0); both approximations' errors: docs/backends-converters.md, 'Runtime gaps and defects taken by exact
rewrites'.

Anchors: the flatbuffer keeps the ``run`` signature; its outputs are named ``output_<i>`` by the
position ``i`` in the endpoint's output list, i.e. ``meta.json``'s output order (the interpreter's
plain ``get_output_details()`` order is not that order, so it is never used). Inputs are
``xs_<i>``. Both are checked at ``prepare`` (every index present once, TFLite shapes equal to the
SavedModel's). Layouts, per-anchor transforms and dtype handling are the ``tf`` backend's (shared
code, see :mod:`anpred.backends.tf_onnx`): channels-last anchors are ``exact`` with layout ``NHWC``
and transform ``{"permute": [0, 3, 1, 2]}``.

Options: ``threads`` (interpreter threads, default ``os.cpu_count()``), ``onnx2tf`` (passed to the
shared conversion, part of both cache keys), ``input_shapes`` (as ``tf``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from anpred.backends.tf_onnx import ONNX2TF_COVERAGE_BASIS, TfOnnxBackend, onnx2tf_unsupported_ops
from anpred.errors import BackendError

FORMAT = "anpred.litert/1"

#: TF op (as the TFLite converter names it among the ops it has no builtin for) -> the ONNX operator
#: producing it, decomposed into elementary ops before onnx2tf (:mod:`passes.frontend_rewrites`:
#: ``Erf`` as Eigen's float32 rational approximation). Not onnx2tf's own pseudo Erf (Abramowitz &
#: Stegun 7.1.26): ``1 - poly * exp(-x^2)`` cancels in float32 for small |x|, which flagged litert on
#: a GELU model (both errors: docs/backends-converters.md, 'Runtime gaps and defects taken by exact
#: rewrites')
DECOMPOSED_OPERATORS = {"Erf": "Erf"}


class FlexOpsError(BackendError):
    """The TFLite conversion needs TF ops without a TFLite builtin (``ops``: their TF names)."""

    def __init__(self, message: str, ops: list[str]):
        super().__init__(message)
        self.ops = list(ops)


class LiteRtBackend(TfOnnxBackend):
    """onnx2tf (shared with ``tf``) -> TFLite float32 flatbuffer -> LiteRT interpreter + XNNPACK."""

    name = "litert"
    family = "litert"
    precision = "fp32"
    coverage_basis = (
        ONNX2TF_COVERAGE_BASIS + "; TF ops without a TFLite builtin are found only when the "
        "SavedModel is converted to TFLite"
    )

    def __init__(self, options=None):
        super().__init__(options)
        self._runner = None
        self._interpreter = None
        self._in_keys: list[str] = []
        self._out_keys: list[str] = []
        self.tflite_path: Path | None = None
        #: XNNPACK partitions in the interpreter's execution plan after prepare (-1: unknown)
        self.delegate_partitions = -1

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        return onnx2tf_unsupported_ops(model)

    def _versions_impl(self) -> dict[str, str]:
        import importlib.metadata as md

        v = {**super()._versions_impl(), "ai-edge-litert": md.version("ai-edge-litert")}
        if getattr(self, "decomposed_operators", None):  # decomposed in the graph before onnx2tf
            v["decomposed_operators"] = ",".join(self.decomposed_operators)
        return v

    def _before_conversion(self) -> None:
        pass  # threads go to the interpreter; TensorFlow only converts here

    def _prepare_impl(self, model_path, manifest, workdir) -> None:
        """As ``tf``'s; when the TFLite conversion needs TF ops without a builtin whose ONNX operator
        has a decomposition (:data:`DECOMPOSED_OPERATORS`), onnx2tf converts again (a conversion of
        litert's own, cached under its own key: the ``decompose`` option) with those operators
        decomposed first; ``decomposed_operators`` in the versions says which. Any other missing
        builtin raises the :class:`FlexOpsError`. The failed first attempt costs one TFLite conversion
        per prepare."""
        try:
            super()._prepare_impl(model_path, manifest, workdir)
            return
        except FlexOpsError as err:
            have = set(self.options.get("decompose") or [])
            if any(op not in DECOMPOSED_OPERATORS for op in err.ops):
                raise
            want = {DECOMPOSED_OPERATORS[op] for op in err.ops}
            if want <= have:
                raise
            self.options = {**self.options, "decompose": sorted(have | want)}
            self.decomposed_operators = sorted(want)
        super()._prepare_impl(model_path, manifest, workdir)

    def _load_converted(self, cache_dir: Path) -> tuple[list[str], list[str]]:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        from anpred.cache import cache_key, cached_dir

        # TensorFlow's version from its metadata: importing it (seconds) is needed only to convert
        key = cache_key(self.conversion_key, "tflite", _dist_version("tensorflow"), FORMAT)
        tdir = cached_dir(
            "litert", key, lambda tmp: saved_model_to_tflite(cache_dir / "saved_model", tmp / "model.tflite")
        )
        self.tflite_path = tdir / "model.tflite"
        threads = int(self.options.get("threads") or os.cpu_count() or 1)
        try:
            self._interpreter = Interpreter(
                model_path=str(self.tflite_path), num_threads=threads, experimental_op_resolver_type=OpResolverType.AUTO
            )
            self.delegate_partitions = _delegate_partitions(self._interpreter)  # before the runner holds tensors
            self._runner = self._interpreter.get_signature_runner("run")
        except (ValueError, RuntimeError) as err:
            raise BackendError(f"litert: LiteRT cannot load the converted model: {err}") from err
        ins, outs = self._runner.get_input_details(), self._runner.get_output_details()
        self._in_keys = _indexed_keys(ins, "xs", len(self._meta["inputs"]), "inputs")
        self._out_keys = _indexed_keys(outs, "output", len(self._meta["outputs"]), "outputs")
        for k, o in zip(self._out_keys, self._meta["outputs"]):
            shape = [int(d) for d in outs[k]["shape"]]
            if len(shape) != len(o["tf_shape"]) or any(t is not None and t != s for t, s in zip(o["tf_shape"], shape)):
                raise BackendError(
                    f"litert: signature output {k!r} has shape {shape}, the SavedModel's output for "
                    f"{o['value']!r} {o['tf_shape']}: the signature does not map back to anchors"
                )
        return (
            [np.dtype(ins[k]["dtype"]).name for k in self._in_keys],
            [np.dtype(outs[k]["dtype"]).name for k in self._out_keys],
        )

    def _invoke(self, args: list[np.ndarray]) -> list:
        res = self._runner(**dict(zip(self._in_keys, args)))
        return [res[k] for k in self._out_keys]

    def close(self) -> None:
        self._runner = None
        self._interpreter = None
        super().close()


def _dist_version(import_name: str) -> str:
    """The installed version of the distribution that provides ``import_name`` (``tensorflow`` comes
    as ``tensorflow-cpu`` here), "" when none does."""
    from importlib import metadata

    dists = metadata.packages_distributions().get(import_name) or []
    return metadata.version(dists[0]) if dists else ""


def _indexed_keys(details: dict, prefix: str, n: int, what: str) -> list[str]:
    """The signature keys ``<prefix>_0 .. <prefix>_<n-1>`` of ``details`` in index order; raises
    BackendError when the signature has other keys, a missing index or another count."""
    idx = {}
    for k in details:
        m = re.fullmatch(rf"{prefix}_(\d+)", k)
        if m is None:
            raise BackendError(f"litert: unexpected signature {what} key {k!r} (expected {prefix}_<i>)")
        idx[int(m.group(1))] = k
    if sorted(idx) != list(range(n)):
        raise BackendError(
            f"litert: the TFLite signature has {what} {sorted(details)}, expected {prefix}_0 .. "
            f"{prefix}_{n - 1} for the {n} {what} of the SavedModel"
        )
    return [idx[i] for i in range(n)]


def _delegate_partitions(interpreter) -> int:
    """How many delegate kernels the interpreter's graph holds after delegation (XNNPACK's
    partitions; nodes named ``DELEGATE``); -1 when the wrapper does not tell."""
    try:
        interpreter.allocate_tensors()
        w = interpreter._interpreter  # noqa: SLF001 - LiteRT exposes node names only on its wrapper
        return sum(1 for i in range(w.NumNodes()) if w.NodeName(i) == "DELEGATE")
    except Exception:  # noqa: BLE001 - an informational count only
        return -1


_LOC = re.compile(r'fused\["(\w+):", "model/([^"]+?)/\1@')
_FLEX = re.compile(r"(?:TF Select ops|Flex ops):\s*([^\n]+)")


def saved_model_to_tflite(saved_model: Path, out: Path) -> None:
    """Convert the ``run`` signature of ``saved_model`` into a float32 TFLite flatbuffer at ``out``
    (builtin ops only, no optimizations).

    Raises:
        BackendError: the converter failed; where it lists TF ops with no TFLite builtin (the
            "TF Select ops: ..." line of its message), the message names them.
    """
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=["run"])
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    conv.optimizations = []
    try:
        data = conv.convert()
    except Exception as err:  # tf.lite raises ConverterError and others
        text = str(err)
        flex = sorted({op.strip() for line in _FLEX.findall(text) for op in line.split(",") if op.strip()})
        if flex:
            # the converter's locations name the op as model/<onnx2tf layer>/<TF op>; onnx2tf names its
            # layers after the ONNX node's output
            where = sorted({f"{op} at {name!r}" for op, name in _LOC.findall(text) if op in flex})
            raise FlexOpsError(
                f"litert: LiteRT cannot run TF op(s) {', '.join(flex)} that onnx2tf lowered the model "
                "to (no TFLite builtin; they would need the Flex / TF Select delegate)"
                + (f": {'; '.join(where)}" if where else ""),
                flex,
            ) from err
        first = next((ln.strip() for ln in text.splitlines() if "error" in ln.lower()), text.strip()[:300])
        raise BackendError(f"litert: TFLite conversion failed: {type(err).__name__}: {first[:400]}") from err
    out.write_bytes(data)
