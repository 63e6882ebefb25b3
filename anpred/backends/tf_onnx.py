"""Backend ``tf``: the anchored ONNX model converted with onnx2tf and run in TensorFlow.

Conversion (cached in :mod:`anpred.cache` under ``onnx2tf/<key>``, key = sha256 of the model file +
onnx2tf version + options + this module's format version):
1. the model (weights included) is copied into a scratch folder: onnx2tf rewrites its input file
   with the onnxsim result, and reads its calibration array from the working directory, where
   :func:`anpred.backends.convert.onnx2tf_calibration_file` puts a deterministic local one (it would
   otherwise download it for 4-D 3-channel inputs with batch <= 20). In the copy, ``Constant``
   nodes become initializers (:func:`anpred.backends.convert.fold_constant_nodes`; onnx2tf failed on them: PP-OCRv4 det
   at 256x256), control flow is inlined, recurrent layers are unrolled and graph outputs renamed
   (:func:`prepare_for_onnx2tf`; what it did is in ``meta.json`` and :attr:`TfOnnxBackend.conversion`), and during the
   conversion the interpreter's scripts folder is put first on ``PATH`` so that onnx2tf's ``onnxsim`` subprocess runs
   (:func:`~anpred.backends.onnx2tf_call.onnxsim_on_path`; without it onnx2tf silently skips simplification and
   failed on YOLOv8n at 640 px); a missing ``onnxsim`` is a :class:`~anpred.errors.BackendError`;
2. ``onnx2tf.convert(..., disable_model_save=True)`` returns the tf_keras model; ``sys.exit`` calls
   are turned into :class:`~anpred.errors.BackendError` with onnx2tf's own error lines as reason,
   exceptions into one with the failing ONNX node (onnx2tf's ``onnx_op_name``) and the message's first
   line;
3. the keras model's outputs are in the order of the (simplified) ONNX graph outputs; that order,
   onnx2tf's per-output layout flag (``model.onnx_output_layouts``: True = channels-last) and the
   TF shapes are written to ``meta.json``, and the model is saved as a TF SavedModel (``tf_keras.export.ExportArchive``)
   whose ``run`` function returns the outputs as a list in that order.

Dynamic input dimensions: onnx2tf's conversion of a graph with dynamic spatial dimensions bakes the
sizes of its own dummy inference into some ops (PP-OCRv4 det, dynamic, run at 256x256: ``Incompatible
shapes: [1,8,16,96] vs. [1,16,16,96]`` at an FPN ``Add`` after a ``Resize``), and its
``overwrite_input_shape`` option did not change that here. So when the option ``input_shapes`` gives
the concrete shapes (the runner passes the run's shapes when all samples share them), the dynamic
input dimensions of the scratch copy are fixed to them before converting (the shapes are part of the
cache key); a sample of another shape is refused with the reason.

Input layout, decided as onnx2tf decides it (``onnx2tf/ops/Input.py``): every 3-D/4-D/5-D input is
made channels-last unless named in its ``keep_ncw_or_nchw_or_ncdhw_input_names`` or
``keep_shape_absolutely_input_names`` options; where the ONNX channel dimension is static the TF
input shape must agree (channels last) or :class:`~anpred.errors.BackendError` is raised. (Shapes
alone cannot decide: ``[None, 3, None, None]`` vs ``[None, None, None, 3]`` fits both layouts.)

Running: the SavedModel's ``run`` is called with the inputs transposed to that layout.
Anchors are the anchored model's graph outputs and are found by name in ``meta.json``: the output
named after the anchor (``anpred.instrument`` adds ``Identity(value) -> <anchor name>``), else the
output named after the anchor's ONNX value (original outputs). Each anchor's layout is reported per anchor
(:meth:`TfOnnxBackend.anchor_info`): channels-last anchors (onnx2tf's flag, checked against the anchor's concrete ONNX
shape: the manifest's when static, else ONNX shape inference at the converted input shapes) are
``exact`` (a layout change is the same tensor, as in :mod:`exporters.mapping`) with layout ``NHWC``
(``NWC``/``NDHWC`` for 3-D/5-D) and transform ``{"permute": [0, r-1, 1, ..., r-2]}`` (e.g.
``[0, 3, 1, 2]`` NHWC -> NCHW); the others ``exact`` without transform.

Dtypes: onnx2tf turns float16 graph inputs into float32 and computes float16 graphs in float32
(``onnx2tf/ops/Input.py``; ``auto_cast`` in ``utils/common_functions.py``). Each sample is cast to the
dtype of the SavedModel's input signature when that cast is exact (float16/bfloat16 -> float32);
a narrowing floating cast is refused at ``prepare`` (:func:`~anpred.backends.tf_dtypes.input_dtype`). Each anchor is
returned in the dtype the ONNX graph declares for it (manifest ``dtype``): where the converted model returns
another floating type the value is cast and the capture's reason says so
(:func:`~anpred.backends.tf_dtypes.output_dtype_note`).

Returned arrays are numpy arrays in the converted model's layout (never aligned here), in the
anchors' ONNX dtypes.
Effective precision: fp32 (TF CPU kernels, no mixed precision policy; a float16 graph included).
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.onnx2tf_call import converted_io, export_saved_model, fix_input_dims, run_onnx2tf, scratch_model
from anpred.backends.tf_dtypes import bfloat16_uses, feed, input_dtype, output_dtype_note, signature_dtypes
from anpred.backends.tf_probe import ONNX2TF_NODE_BASIS
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest
from anpred.onnx_io import elem_type_name
from anpred.tensorfile import c_contiguous

FORMAT = "anpred.tf_onnx/6"  # 2: onnxsim found (scripts folder on PATH); 3: Constant nodes -> initializers;
# 4: control flow inlined, recurrent layers unrolled, outputs renamed (prepare_for_onnx2tf); 5: multi-axis Slices split;
# 6: node names TF-safe
_CHANNELS_LAST = {3: "NWC", 4: "NHWC", 5: "NDHWC"}


def _to_channels_first(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]


def _to_channels_last(rank: int) -> list[int]:
    return [0, *range(2, rank), 1]


def _static(shape) -> list[int] | None:
    if shape is None or any(not isinstance(d, int) or d <= 0 for d in shape):
        return None
    return list(shape)


#: how :func:`onnx2tf_unsupported_ops` knows
ONNX2TF_COVERAGE_BASIS = "onnx2tf operator modules (onnx2tf/ops/<OpType>.py, looked up by op_type alone)"


def onnx2tf_unsupported_ops(model) -> dict[str, str]:
    """The operators of ``model`` (``onnx.ModelProto``, sub-graphs included) for which onnx2tf has no
    ``ops/<OpType>.py`` module, as ``{op key: reason}``. onnx2tf converts node by node with
    ``importlib.import_module(f"onnx2tf.ops.{op_type}")`` (``onnx2tf/onnx2tf.py``; domain and opset
    not looked at) and stops with "<op> OP is not yet implemented" when that module is missing.
    Reads the installed package's folder: neither onnx2tf nor TensorFlow is imported. Ops that
    onnxsim or :func:`prepare_for_onnx2tf` remove before onnx2tf sees them may be listed although they
    would vanish; version- and attribute-dependent failures are found only when converting."""
    import importlib.util

    from anpred.onnx_io import model_ops

    spec = importlib.util.find_spec("onnx2tf")
    if spec is None or not spec.submodule_search_locations:
        return {}
    have = {p.stem for p in (Path(list(spec.submodule_search_locations)[0]) / "ops").glob("*.py")}
    return {
        key: f"onnx2tf has no converter for {op} (no module onnx2tf/ops/{op}.py)"
        for key, (_, op, _) in model_ops(model).items()
        if op not in have
    }


class TfOnnxBackend(Backend):
    """onnx2tf + TensorFlow (SavedModel, eager call).

    Options:
        onnx2tf (dict): extra keyword arguments for ``onnx2tf.convert`` (part of the cache key).
        threads (int): TF intra-op threads (default: TF's default).
    """

    threads_option = True  # (the ``threads`` option)
    constant_weights = True  # (its converter reads parameters as initializers: passes.bind_inputs.weight_inputs)

    name = "tf"
    family = "tensorflow"
    precision = "fp32"
    coverage_basis = ONNX2TF_COVERAGE_BASIS

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        return onnx2tf_unsupported_ops(model)

    node_basis = ONNX2TF_NODE_BASIS

    @classmethod
    def refused_nodes(cls, model) -> dict[str, str]:
        from anpred.backends.tf_probe import onnx2tf_refusals  # (shared with litert)

        return onnx2tf_refusals(model)

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self._fn = None
        self._meta: dict[str, Any] = {}
        self._index: dict[str, int] = {}
        self._captures: dict[str, AnchorCapture] = {}
        self.seconds_convert = 0.0
        self.cache_hit = False
        self.cache_dir: Path | None = None
        #: cache key of the onnx2tf conversion (folder ``onnx2tf/<key>``), set by ``prepare``
        self.conversion_key = ""
        self.fixed_shapes: dict[str, list[int]] | None = None
        self._concrete: dict[str, list] = {}

    # the runner passes the run's concrete input shapes in options["input_shapes"]
    needs_input_shapes = True

    def _versions_impl(self) -> dict[str, str]:
        import onnx
        import onnx2tf
        import tensorflow as tf
        import tf_keras

        # from the modules, not the distribution names (tensorflow, tensorflow-cpu, tf-nightly ...)
        return {
            "tensorflow": tf.__version__,
            "onnx2tf": onnx2tf.__version__,
            "tf_keras": tf_keras.__version__,
            "onnx": onnx.__version__,
        }

    # ---- conversion ------------------------------------------------------------------------
    def _convert(self, model_path: Path, out: Path, fixed: dict[str, list[int]] | None = None) -> None:
        """Convert ``model_path`` with onnx2tf into ``out`` (``saved_model/``, ``meta.json``, ``onnx2tf.log``;
        steps 1 to 3 of the module docstring, :mod:`anpred.backends.onnx2tf_call`); ``fixed``: input name ->
        concrete shape for the dynamic input dimensions.

        Raises:
            BackendError: onnx2tf failed, returned no model, or outputs that cannot be mapped to anchors.
        """
        import onnx

        scratch = out / "scratch"
        scratch.mkdir()
        src, prep = scratch_model(model_path, scratch, fixed, self.options.get("decompose"))
        log = io.StringIO()
        t0 = time.perf_counter()
        km = run_onnx2tf(src, dict(self.options.get("onnx2tf", {})), log, model_path.name, prep["node_names"])
        seconds = time.perf_counter() - t0
        simplified = onnx.load(str(src), load_external_data=False)  # onnx2tf wrote its onnxsim result here
        meta = {
            "format": FORMAT,
            "seconds_convert": seconds,
            "constant_outputs": prep["constant"],
            "unrolled": prep["unrolled"],
            "inlined": prep["inlined"],
            "slices_split": prep["slices_split"],
            **converted_io(km, simplified, prep["outputs"]),
        }
        export_saved_model(km, out / "saved_model", log)
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        (out / "onnx2tf.log").write_text(log.getvalue())
        shutil.rmtree(scratch, ignore_errors=True)

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import importlib.metadata as md

        from anpred.backends.shared import shared_cached_dir
        from anpred.cache import cache_key, cache_root

        from anpred.onnx_io import load_model

        model = load_model(model_path)
        self._before_conversion()
        inits = {t.name for t in model.graph.initializer}
        graph_inputs = [i for i in model.graph.input if i.name not in inits]
        no_bf16 = bfloat16_uses(model)
        if no_bf16:
            raise BackendError(
                f"{self.name}: onnx2tf has no bfloat16 (its ONNX->TF dtype table, "
                "onnx2tf/utils/enums.py ONNX_DTYPES_TO_TF_DTYPES, lacks BFLOAT16, and it declares a "
                "bfloat16 graph input as "
                "TensorFlow quint16: onnx_graphsurgeon gives the bare element type 16, "
                f"which tf.as_dtype reads as DT_QUINT16); bfloat16 here: {'; '.join(no_bf16[:5])}"
                + (" ..." if len(no_bf16) > 5 else "")
            )
        fixed = self._fixed_shapes(graph_inputs)
        self.fixed_shapes = fixed
        parts = [Path(model_path), "onnx2tf", md.version("onnx2tf"), self.options.get("onnx2tf", {}), FORMAT]
        if self.options.get("decompose"):  # operators decomposed before onnx2tf (litert's retry)
            parts.append({"decompose": sorted(self.options["decompose"])})
        key = cache_key(*parts, {"fixed_input_shapes": fixed}) if fixed else cache_key(*parts)
        self.conversion_key = key
        t0 = time.perf_counter()
        self.cache_hit = (cache_root() / "onnx2tf" / key).is_dir()
        # one onnx2tf conversion for tf and litert, attempted once per run (a failure or a hang is not paid twice)
        self.cache_dir = shared_cached_dir(
            "onnx2tf", key, lambda tmp: self._convert(model_path, tmp, fixed), "the onnx2tf conversion", "tf and litert"
        )
        self._meta = json.loads((self.cache_dir / "meta.json").read_text())
        self.seconds_convert = 0.0 if self.cache_hit else time.perf_counter() - t0

        in_dtypes, out_dtypes = self._load_converted(self.cache_dir)
        self._index = {o["value"]: i for i, o in enumerate(self._meta["outputs"])}
        self._input_perm = {inp["name"]: self._input_layout(inp) for inp in self._meta["inputs"]}
        self._concrete = _concrete_output_shapes(model, fixed) if fixed else {}
        declared = {vi.name: elem_type_name(vi.type.tensor_type.elem_type) for vi in graph_inputs}
        self._input_dtype = {
            inp["name"]: input_dtype(inp["name"], declared.get(inp["name"], ""), want)
            for inp, want in zip(self._meta["inputs"], in_dtypes)
        }
        self._out_cast = {}
        for a in manifest.anchors:
            cap = self._describe(a)
            i = self._index.get(a.name if a.name in self._index else a.value)
            if cap.status != "missing" and i is not None and i < len(out_dtypes):
                note = output_dtype_note(a.dtype, out_dtypes[i])
                if note:
                    self._out_cast[a.name] = a.dtype
                    cap.reason = f"{cap.reason}; {note}"
            self._captures[a.name] = cap

    # ---- hooks of the runtime that runs the conversion (LiteRT overrides them) ------------------
    def _before_conversion(self) -> None:
        """Runtime settings that must precede the conversion: TF's intra-op threads (TF refuses thread
        settings once its context exists, and onnx2tf initialises it)."""
        if "threads" in self.options:
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(int(self.options["threads"]))

    def _load_converted(self, cache_dir: Path) -> tuple[list[str], list[str]]:
        """Load the cached conversion in ``cache_dir`` for running; returns ``(input dtypes, output
        dtypes)`` as numpy names in ``meta.json`` order (inputs and outputs)."""
        import tensorflow as tf

        loaded = tf.saved_model.load(str(cache_dir / "saved_model"))
        self._loaded = loaded
        self._fn = loaded.run
        return signature_dtypes(self._fn)

    def _invoke(self, args: list[np.ndarray]) -> list:
        """Run the loaded model on ``args`` (in ``meta.json`` input order, converted layout and dtype);
        returns the outputs in ``meta.json`` output order (anything ``np.asarray`` takes)."""
        import tensorflow as tf

        return list(self._fn(*[tf.constant(x) for x in args]))

    def _fixed_shapes(self, graph_inputs) -> dict[str, list[int]] | None:
        """``options["input_shapes"]`` restricted to the inputs with dynamic dimensions (None when all
        are static or no shapes were given). Raises BackendError when a given shape contradicts a
        static dimension or rank."""
        given = self.options.get("input_shapes") or {}
        fixed = {}
        for vi in graph_inputs:
            dims = [
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in vi.type.tensor_type.shape.dim
            ]
            if all(d is not None for d in dims) or vi.name not in given:
                continue
            shape = [int(d) for d in given[vi.name]]
            if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
                raise BackendError(f"{self.name}: input_shapes[{vi.name!r}] = {shape} does not fit the model's {dims}")
            fixed[vi.name] = shape
        return fixed or None

    def _input_layout(self, inp: dict) -> list[int] | None:
        """The permutation from the ONNX input to the converted model's input (None: same layout),
        following onnx2tf's rule (see the module docstring), checked against the static channel dim."""
        on, tn, name = inp["onnx_shape"], inp["tf_shape"], inp["name"]
        r = len(on)
        o2t = dict(self.options.get("onnx2tf", {}))
        keep = set(o2t.get("keep_ncw_or_nchw_or_ncdhw_input_names") or ()) | set(
            o2t.get("keep_shape_absolutely_input_names") or ()
        )
        channels_last = r in _CHANNELS_LAST and name not in keep
        if r == 0 and len(tn) == 1 and tn[0] in (1, None):
            return None  # onnx2tf makes a 0-d (scalar) input a one-element rank-1 one: fed reshaped (_run_impl)
        if len(tn) != r:
            raise BackendError(f"{self.name}: converted input {name!r} has rank {len(tn)}, the ONNX input {r}")
        c = on[1] if r > 1 else None
        if channels_last and c is not None and tn[-1] is not None and tn[-1] != c:
            raise BackendError(
                f"{self.name}: input {name!r}: onnx2tf should have made it channels-last, "
                f"but its TF shape {tn} does not end with the ONNX channel count {c} (ONNX {on})"
            )
        if not channels_last and c is not None and tn[1] is not None and tn[1] != c:
            raise BackendError(f"{self.name}: input {name!r} kept channels-first, but TF shape {tn} vs ONNX {on}")
        return _to_channels_last(r) if channels_last else None

    def _describe(self, a) -> AnchorCapture:
        # anpred.instrument exposes a boundary anchor as Identity(value) -> graph output named after
        # the anchor; an original output keeps its ONNX name (the anchor's value).
        key = a.name if a.name in self._index else a.value
        i = self._index.get(key)
        if i is None and (
            a.name in self._meta.get("constant_outputs", ()) or a.value in self._meta.get("constant_outputs", ())
        ):
            return AnchorCapture(
                "missing",
                None,
                None,
                None,
                f"ONNX value {a.value!r} is a constant (it depends on no graph input): "
                "onnxsim folds it and onnx2tf returns no tensor for a constant output",
            )
        if i is None:
            return AnchorCapture(
                "missing",
                None,
                None,
                None,
                f"ONNX value {a.value!r} is not an output of the onnx2tf model (outputs: {', '.join(self._index)})",
            )
        o = self._meta["outputs"][i]
        tshape, r = o["tf_shape"], len(o["tf_shape"])
        target = f"output[{i}]:{key}"
        flag = o["channels_last"] and r in _CHANNELS_LAST
        ms = _static(a.shape) or _static(self._concrete.get(key))
        if ms is not None and len(ms) != r:
            return AnchorCapture("missing", None, None, target, f"rank {r} in TF vs {len(ms)} in the manifest")
        if ms is not None and r in _CHANNELS_LAST:
            cl = [ms[p] for p in _to_channels_last(r)]
            as_cf, as_cl = _match(tshape, ms), _match(tshape, cl)
            if as_cl and not as_cf:
                flag = True
            elif as_cf and not as_cl:
                flag = False
            elif not as_cf and not as_cl:
                return AnchorCapture(
                    "missing",
                    None,
                    None,
                    target,
                    f"TF shape {tshape} fits neither {ms} nor its channels-last form {cl}",
                )
            # both fit (symmetric shape): onnx2tf's own layout flag decides
        elif ms is not None and not _match(tshape, ms):
            return AnchorCapture("missing", None, None, target, f"TF shape {tshape} differs from {ms}")
        if flag:
            return AnchorCapture(
                "exact",
                _CHANNELS_LAST[r],
                {"permute": _to_channels_first(r)},
                target,
                "onnx2tf output in channels-last layout (same tensor, transform recorded)",
            )
        return AnchorCapture(
            "exact", a.layout if a.layout != "unknown" else None, None, target, "onnx2tf output in the ONNX layout"
        )

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._captures)

    @property
    def conversion(self) -> dict[str, Any]:
        """What the pre-conversion step did (after ``prepare``; read from the cached ``meta.json``):
        ``{"unrolled": [recurrent node names], "inlined": [If/Loop node names], "slices_split": [Slice node
        names], "constant_outputs": [graph outputs left out as constants]}`` (empty lists for conversions
        cached by older formats)."""
        return {k: list(self._meta.get(k, [])) for k in ("unrolled", "inlined", "slices_split", "constant_outputs")}

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = []
        for inp in self._meta["inputs"]:
            if inp["name"] not in inputs:
                raise InputError(f"backend {self.name}: missing input {inp['name']!r}")
            x = np.asarray(inputs[inp["name"]])
            want = (self.fixed_shapes or {}).get(inp["name"])
            if want is not None and list(x.shape) != want:
                raise InputError(
                    f"backend {self.name}: input {inp['name']!r} has shape {list(x.shape)}, but the model "
                    f"was converted at {want} (onnx2tf needs fixed input shapes; "
                    "run samples of one shape)"
                )
            perm = self._input_perm[inp["name"]]
            if perm is not None:
                x = np.transpose(x, perm)
            if x.ndim == 0 and len(inp["tf_shape"]) == 1:
                x = x.reshape(1)  # a scalar input onnx2tf converted to one element of rank 1 (_input_layout)
            args.append(feed(inp["name"], c_contiguous(x), self._input_dtype.get(inp["name"]), self.name))
        outs = self._invoke(args)
        result = {}
        assert self.manifest is not None
        for a in self.manifest.anchors:
            if self._captures[a.name].status != "missing":
                y = np.asarray(outs[self._index[a.name if a.name in self._index else a.value]])
                result[a.name] = y.astype(self._out_cast[a.name]) if a.name in self._out_cast else y
        return result

    def close(self) -> None:
        self._fn = None
        self._loaded = None


def _concrete_output_shapes(model, shapes: dict[str, list[int]]) -> dict[str, list[int | None]]:
    """Graph output name -> shape by ONNX shape inference (data propagation) with the inputs fixed
    to ``shapes``; empty when inference fails."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    fix_input_dims(m, shapes)
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - inference problems only lose the extra check
        return {}
    return {
        o.name: [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in o.type.tensor_type.shape.dim
        ]
        for o in m.graph.output
    }


def _match(shape, ref) -> bool:
    return len(shape) == len(ref) and all(s is None or r is None or s == r for s, r in zip(shape, ref))
