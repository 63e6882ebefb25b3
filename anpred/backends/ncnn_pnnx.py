"""Backend ``ncnn`` (family ``ncnn``): the anchored ONNX model converted by pnnx and run by Tencent
ncnn's own CPU kernels (Python package ``ncnn``).

Conversion (``pnnx model.onnx inputshape=[...]f32 fp16=0``; cached in :mod:`anpred.cache` under
``pnnx/<key>``, key = sha256 of the model file + pnnx version + concrete input shapes +
:data:`FORMAT`): pnnx first simplifies the ONNX graph (``inline_containers``, ``eliminate_noop``,
``fold_constants`` and ``shape_inference``, which evaluate the constant sub-graphs with the
onnxruntime build pnnx embeds: values computed from constants only come from onnxruntime kernels,
everything input-dependent does not), then imports it into its own PyTorch-like IR (``pass_level1
onnx``: ``Conv`` -> ``nn.Conv2d``, ``Relu`` -> ``F.relu``, ``ReduceMean`` -> ``torch.mean``,
``Gemm`` -> ``nn.Linear`` ...; an op it cannot map stays an "onnx native op" and is logged
``todo <op>``), optimises it there (``pass_level2``..``5``) and lowers that IR onto ncnn layers
(``pass_ncnn``: ``Convolution``, ``InnerProduct``, ``BinaryOp``, ``Swish``, ``Interp``, ``Reduction``
...). ``fp16=0`` keeps the weights float32 in ``model.ncnn.bin`` (pnnx's default ``fp16=1`` would
round them to float16). pnnx's ONNX import has no ``LSTM``/``GRU``/``RNN`` (``todo LSTM``): such nodes
are unrolled first in the scratch copy into the schema's per-time-step equations
(:class:`passes.recurrent.RecurrentUnrollPass`, as for ``tf`` and ``tvm``), which ncnn then computes
with its own ``InnerProduct``/``MatMul``, ``BinaryOp`` and activation layers. pnnx cannot select
along the batch axis ("unbind along batch axis 0 is not supported", left as a ``torch.unbind`` layer
ncnn lacks): a ``Gather`` of the index 0 (or -1) on axis 0 of a tensor whose first dimension is 1
(the unrolled time step of a one-step sequence) is rewritten as the equal ``Squeeze(axis 0)`` (a
scalar index) or ``Identity`` (a one-element index list)
(:func:`anpred.backends.ncnn_graph.batch_gathers_as_squeeze`). pnnx's onnxruntime accepts
ONNX IR versions up to 13, so a newer
``ir_version`` is lowered to 13 in the scratch copy (IR 14 adds no operator semantics).

Blob names: pnnx's ``canonicalize`` (``tools/pnnx/src/pass_onnx/canonicalize.cpp``) renames the
graph's non-initializer inputs ``in0..`` and its outputs ``out0..`` by their position in
``graph.input`` / ``graph.output``; every graph output becomes a ``pnnx.Output``. So the anchor
exposed as graph output ``k`` (named after the anchor, or an original output named after its value,
as :func:`anpred.backends.ort.output_anchor_map` finds them) is ncnn blob ``out<k>``. The mapping is
checked at ``prepare``: the blob must be produced in ``model.ncnn.param``, and its shape recorded by
pnnx (``model.pnnx.param``, ``pnnx.Output out<k> ... #n=(shape)f32``) must equal the ONNX shape at
the converted input shapes; otherwise the anchor is ``missing`` with the reason.

Kernels and precision: ncnn's x86 kernels (SSE2/AVX/FMA/AVX-512, chosen at run time by CPU), fp32
everywhere: ``opt.use_fp16_packed``, ``use_fp16_storage``, ``use_fp16_arithmetic``,
``use_bf16_packed``, ``use_bf16_storage`` and the int8 flags are False, Vulkan is off. Kept at ncnn's
defaults (part of its fp32 path, changeable with the ``ncnn`` option): ``use_packing_layout=True``
(channels packed by 4/8/16 floats for SIMD), Winograd (F(6,3)/F(4,3)/F(2,3)) and sgemm convolution
on; Winograd's transforms add fp32 rounding of their own (how much: docs/backends-converters.md,
'Measurements: ncnn Winograd'). Family: ``ncnn`` (own kernels; shares nothing with onnxruntime at run
time).

Layout: ncnn blobs have no batch axis (``Mat`` c, h, w / d): an ONNX input of shape ``[1, ...]`` is
fed as its ``[0]`` slice, and each anchor comes back with the batch axis restored, in the ONNX
layout (NCHW) and the ONNX shape (``exact``, no transform). An input whose first dimension is not 1
(a recurrent state ``(2, 1, 128)``: no batch axis of its own) is given one in the converted copy: the
graph input becomes ``[1, *shape]`` followed by ``Squeeze(axis 0)`` under the original name, and the
whole array is fed as the Mat (ranks 1..4). Inputs of rank < 2 (unbatched: < 1) or > 5 (unbatched: > 4)
are refused (:class:`~anpred.errors.BackendError`), as are non-float32 inputs (ncnn Mats hold
float32). Returned arrays: float32 (cast to the anchor's ONNX dtype where the graph declares another,
noted in the capture's reason).

Options: ``input_shapes`` (concrete shapes, needed for dynamic inputs; the runner passes them),
``threads`` (``opt.num_threads``; default ncnn's, the physical big-core count), ``ncnn`` (dict of
extra ``ncnn.Option`` attributes, e.g. ``{"use_winograd_convolution": False}``; fp16/bf16/int8 ones
are refused: this backend is fp32).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.native_io import decisive_line, native_stderr
from anpred.backends.ncnn_graph import (
    INT_INPUTS,
    add_unit_batch,
    batch_gathers_as_squeeze,
    float_for_int_inputs,
    input_dtype_refusal,
)
from anpred.backends.ncnn_param import param_layers, unknown_layers
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest

# 2: integer inputs fed as float32 and cast back in the graph; 3: empty Concat inputs dropped
FORMAT = "anpred.ncnn_pnnx/3"
PNNX_MAX_IR = 13  # the IR version of the onnxruntime pnnx embeds (1.30)
_LOWP_FLAGS = (
    "use_fp16_packed",
    "use_fp16_storage",
    "use_fp16_arithmetic",
    "use_bf16_packed",
    "use_bf16_storage",
    "use_int8_inference",
    "use_int8_packed",
    "use_int8_storage",
    "use_int8_arithmetic",
)
_SHAPE = re.compile(r"#(\S+?)=\(([^)]*)\)(\w+)")


class NcnnBackend(Backend):
    """pnnx (ONNX -> pnnx IR -> ncnn param/bin) + ncnn CPU kernels, fp32."""

    threads_option = True  # (the ``threads`` option)

    name = "ncnn"
    family = "ncnn"
    precision = "fp32"
    coverage_basis = ""  # pnnx has no ONNX op table: an op it cannot lower is found at conversion
    needs_input_shapes = True

    node_basis = (
        "ANPRED's ncnn input rule (ncnn Mats hold float32); pnnx on a one-node model of each node "
        "with float32 inputs (cached by content)"
    )

    @classmethod
    def refused_nodes(cls, model) -> dict[str, str]:
        """The inputs this backend's input rule refuses (:func:`input_dtype_refusal`: a bool or
        floating input other than float32) and the nodes pnnx refuses alone
        (:func:`anpred.backends.ncnn_probe.pnnx_probe`: an op it leaves as ``todo``, a layer ncnn does not
        know, a crash of pnnx that comes back with a consumer)."""
        from anpred.onnx_io import elem_type_name

        inits = {t.name for t in model.graph.initializer}
        out = {}
        for vi in model.graph.input:
            if vi.name not in inits:
                why = input_dtype_refusal(vi.name, elem_type_name(vi.type.tensor_type.elem_type))
                if why:
                    out[f"input {vi.name}"] = why
        # the graph pnnx is given: recurrent nodes unrolled, batch Gathers as Squeeze (as _convert does)
        import onnx

        from passes.recurrent import RECURRENT_OPS, unroll_recurrent

        m = onnx.ModelProto()
        m.CopyFrom(model)
        if any(n.op_type in RECURRENT_OPS for n in m.graph.node):
            unroll_recurrent(m)
        batch_gathers_as_squeeze(m)
        from anpred.backends.ncnn_probe import converts_whole, pnnx_probe

        found = pnnx_probe().refusals(m)
        crashed = [k for k, why in found.items() if "crashed on this node alone" in why]
        if crashed and converts_whole(m):
            # a node that crashes pnnx alone may vanish in its model (pnnx fuses an attention block,
            # Mod included, into one MultiHeadAttention layer): the whole model converts, no refusal
            found = {k: why for k, why in found.items() if k not in crashed}
        out.update(found)
        return out

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self.net = None
        self.cache_dir: Path | None = None
        self.cache_hit = False
        self.shapes: dict[str, list[int]] = {}
        self._inputs: list[str] = []
        self._blob: dict[str, str] = {}  # anchor -> ncnn blob
        self._shape: dict[str, list[int]] = {}  # anchor -> ONNX shape
        self._info: dict[str, AnchorCapture] = {}
        self._cast: dict[str, str] = {}

    def _versions_impl(self) -> dict[str, str]:
        import importlib.metadata as md

        return {"ncnn": md.version("ncnn"), "pnnx": md.version("pnnx")}

    # ---- conversion ------------------------------------------------------------------------
    def _concrete_inputs(self, model) -> dict[str, list[int]]:
        """Graph input name -> concrete shape (``options["input_shapes"]`` fills dynamic dims).
        Inputs whose first dimension is not 1 are listed in ``self.unbatched`` (given a unit batch axis at
        conversion). Raises BackendError: a dim stays unknown, a rank outside 2..5 (1..4 without a unit
        first dimension), non-float32 input."""
        from anpred.onnx_io import elem_type_name

        given = self.options.get("input_shapes") or {}
        inits = {t.name for t in model.graph.initializer}
        shapes = {}
        self.unbatched = []
        self.int_inputs: dict[str, str] = {}
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            dt = elem_type_name(vi.type.tensor_type.elem_type)
            if dt in INT_INPUTS:  # fed as float32 (exact below 2^24), cast back inside the graph
                self.int_inputs[vi.name] = dt
            elif why := input_dtype_refusal(vi.name, dt):
                raise BackendError(why)
            dims = [
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in vi.type.tensor_type.shape.dim
            ]
            shape = [int(s) for s in given[vi.name]] if vi.name in given else dims
            if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
                raise BackendError(f"ncnn: input_shapes[{vi.name!r}] = {shape} does not fit the model's {dims}")
            if any(s is None for s in shape):
                raise BackendError(
                    f"ncnn: input {vi.name!r} has dynamic dims {dims}; pnnx converts at concrete "
                    "shapes (give the option input_shapes)"
                )
            if shape and shape[0] != 1:  # no batch axis of its own: one is added at conversion
                if not 1 <= len(shape) <= 4:
                    raise BackendError(
                        f"ncnn: input {vi.name!r} has shape {shape}; without a unit first dimension "
                        "it becomes a Mat of all its dims, and ncnn Mats hold 1..4 dims"
                    )
                self.unbatched.append(vi.name)
            elif not 2 <= len(shape) <= 5:
                raise BackendError(
                    f"ncnn: input {vi.name!r} has rank {len(shape)}; ncnn Mats hold 1..4 dims after "
                    "the batch axis (ranks 2..5)"
                )
            shapes[vi.name] = shape
        return shapes

    def _convert(self, model_path: Path, out: Path, shapes: dict[str, list[int]]) -> None:
        import onnx
        import pnnx

        from anpred.onnx_io import load_model

        model = load_model(model_path, load_external=True)
        for t in model.graph.initializer:  # weights inline: pnnx reads external data only from <model>.data
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
        for vi in model.graph.input:
            if vi.name in shapes:
                for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                    d.Clear()
                    d.dim_value = int(v)
        model.ir_version = min(model.ir_version, PNNX_MAX_IR)
        from passes.recurrent import RECURRENT_OPS, unroll_recurrent

        if any(n.op_type in RECURRENT_OPS for n in model.graph.node):
            unroll_recurrent(model)  # pnnx has no ONNX recurrent import; a node it cannot unroll stays (todo)
        unbatched = [n for n in getattr(self, "unbatched", []) if n in shapes]
        float_for_int_inputs(model, getattr(self, "int_inputs", {}))
        add_unit_batch(model, unbatched)
        batch_gathers_as_squeeze(model)
        from passes.empty_inputs import drop_empty_concat_inputs

        drop_empty_concat_inputs(model)  # ncnn cannot load a zero-size MemoryData (exact: they add nothing)
        onnx.save(model, str(out / "model.onnx"))
        arg = ",".join(
            "[" + ",".join(str(s) for s in ([1] if n in unbatched else []) + list(shapes[n])) + "]f32" for n in shapes
        )
        proc = subprocess.run(
            [pnnx.EXEC_PATH, "model.onnx", f"inputshape={arg}", "fp16=0", "device=cpu"],
            cwd=str(out),
            capture_output=True,
            text=True,
            errors="replace",
        )
        log = proc.stdout + proc.stderr
        (out / "pnnx.log").write_text(log)
        todo = sorted({m.group(1) for m in re.finditer(r"^todo (\S+)", log, re.M)})
        if proc.returncode != 0 or not (out / "model.ncnn.param").is_file():
            raise BackendError(
                f"ncnn: pnnx failed on {model_path.name} (exit status {proc.returncode})"
                + (f", ops it could not convert: {', '.join(todo)}" if todo else "")
                + f": {_log_errors(log)}"
            )
        unknown = unknown_layers(out / "model.ncnn.param")
        if unknown or todo:
            raise BackendError(
                "ncnn: pnnx could not lower ONNX op(s) "
                + ", ".join(sorted(set(todo) | set(unknown)))
                + " onto ncnn layers (pnnx log 'todo <op>'"
                + (f"; layer types ncnn does not know: {', '.join(unknown)}" if unknown else "")
                + ")"
            )
        names = [o.name for o in model.graph.output]
        (out / "meta.json").write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "outputs": names,
                    "inputs": list(shapes),
                    "unbatched": unbatched,
                    "onnx_shapes": _inferred_output_shapes(model),
                },
                indent=1,
            )
        )
        for f in (
            "model.onnx",
            "model.pnnx.onnx",
            "model.pnnxsim.onnx",
            "model.pnnx.bin",
            "model_pnnx.py",
            "model_ncnn.py",
        ):
            (out / f).unlink(missing_ok=True)

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import importlib.metadata as md

        import ncnn

        from anpred.backends.ort import output_anchor_map
        from anpred.cache import cache_key, cache_root, cached_dir
        from anpred.onnx_io import load_model

        extra = dict(self.options.get("ncnn") or {})
        bad = [k for k in extra if k in _LOWP_FLAGS or k == "use_vulkan_compute" or not hasattr(ncnn.Option(), k)]
        if bad:
            raise BackendError(f"ncnn: option ncnn may not set {', '.join(bad)} (unknown, or not fp32 on the CPU)")
        model = load_model(model_path)
        self.shapes = self._concrete_inputs(model)
        key = cache_key(Path(model_path), "pnnx", md.version("pnnx"), self.shapes, FORMAT)
        self.cache_hit = (cache_root() / "pnnx" / key).is_dir()
        self.cache_dir = cached_dir("pnnx", key, lambda tmp: self._convert(Path(model_path), tmp, self.shapes))
        meta = json.loads((self.cache_dir / "meta.json").read_text())
        self._inputs = meta["inputs"]
        self._unbatched = set(meta.get("unbatched", []))
        produced = _produced_blobs(self.cache_dir / "model.ncnn.param")
        pnnx_shapes = _pnnx_output_shapes(self.cache_dir / "model.pnnx.param")
        fetch, info = output_anchor_map(meta["outputs"], manifest)
        by_anchor = {a: o for o, a in fetch.items()}
        self._info, self._blob, self._shape, self._cast = {}, {}, {}, {}
        for a in manifest.anchors:
            cap = info[a.name]
            if cap.status == "missing":
                self._info[a.name] = cap
                continue
            k = meta["outputs"].index(by_anchor[a.name])
            blob, onnx_shape = f"out{k}", meta["onnx_shapes"].get(by_anchor[a.name])
            ps = pnnx_shapes.get(blob)
            reason = ""
            if blob not in produced:
                reason = (
                    f"graph output {k} ({by_anchor[a.name]!r}) -> blob {blob!r}, "
                    "which model.ncnn.param does not produce"
                )
            elif onnx_shape is None or any(d is None for d in onnx_shape):
                reason = f"ONNX shape of {by_anchor[a.name]!r} unknown at the converted input shapes"
            elif ps is not None and ps != onnx_shape:
                reason = f"pnnx records {blob} as {ps}, the ONNX output {by_anchor[a.name]!r} is {onnx_shape}"
            if reason:
                self._info[a.name] = AnchorCapture("missing", None, None, blob, reason)
                continue
            self._blob[a.name], self._shape[a.name] = blob, onnx_shape
            note = (
                f"ncnn blob {blob} (graph output {k}, pnnx names outputs by position), batch axis restored "
                "to the ONNX shape"
            )
            if a.dtype and a.dtype != "float32":
                self._cast[a.name] = a.dtype
                note += f"; computed in float32 by ncnn, cast to {a.dtype} as the ONNX graph declares it"
            self._info[a.name] = AnchorCapture("exact", a.layout if a.layout != "unknown" else None, None, blob, note)
        net = ncnn.Net()
        opt = net.opt
        opt.use_vulkan_compute = False
        for flag in _LOWP_FLAGS:
            if hasattr(opt, flag):  # an older ncnn (a version bisection) lacks the bf16 flags: no such path
                setattr(opt, flag, False)
        # OpenMP threads sleep at once instead of spinning 20 ms (ncnn's default) after each layer, so
        # that they do not take the core of the runner's tensor-writer thread (options["ncnn"] may set
        # it back); timing in docs/backends-converters.md
        if hasattr(opt, "openmp_blocktime"):
            opt.openmp_blocktime = 0
        for k, v in extra.items():
            setattr(opt, k, v)
        if self.options.get("threads"):
            opt.num_threads = int(self.options["threads"])
        with native_stderr() as said:  # ncnn names the layer it could not load on stderr only
            loaded = (
                net.load_param(str(self.cache_dir / "model.ncnn.param")) == 0
                and net.load_model(str(self.cache_dir / "model.ncnn.bin")) == 0
            )
        if not loaded:
            why = decisive_line(said) or "no message from ncnn"
            raise BackendError(
                f"ncnn: cannot load the converted model: {why} (ncnn {ncnn.__version__}; the "
                f"converted model.ncnn.param/.bin are in {self.cache_dir}: remove it to convert again)"
            )
        self.net = net

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._info)

    def effective_precision(self) -> str:
        opt = self.net.opt if self.net is not None else None
        if opt is not None and (getattr(opt, "use_bf16_storage", False) or getattr(opt, "use_bf16_packed", False)):
            return "bf16"
        if opt is not None and (opt.use_fp16_storage or opt.use_fp16_arithmetic or opt.use_fp16_packed):
            return "fp16"
        return "fp32"

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import ncnn

        ex = self.net.create_extractor()
        mats = []  # the input Mats stay referenced until every blob is extracted
        for i, name in enumerate(self._inputs):
            if name not in inputs:
                raise InputError(f"backend ncnn: missing input {name!r}")
            x = np.asarray(inputs[name])
            if list(x.shape) != self.shapes[name]:
                raise InputError(
                    f"backend ncnn: input {name!r} has shape {list(x.shape)}, the model was converted at "
                    f"{self.shapes[name]} (ncnn: batch 1, shapes fixed at conversion)"
                )
            if name in self.int_inputs and x.dtype.kind in "iu":
                if x.size and float(np.abs(x).max()) > 2**24:
                    raise InputError(
                        f"backend ncnn: integer input {name!r} holds values beyond 2^24, which float32 "
                        "(ncnn's Mat type) cannot carry exactly"
                    )
            elif x.dtype != np.float32:
                raise InputError(f"backend ncnn: input {name!r} is {x.dtype}, float32 expected")
            # a plain ndarray the Mat borrows (the batch slice, or the whole array of an input given a unit batch) ...
            a = np.array(x if name in self._unbatched else x[0], dtype=np.float32, order="C")
            mats.append(ncnn.Mat(a).clone())  # ... and copies into memory ncnn owns (refcounted)
            ex.input(f"in{i}", mats[-1])
        out = {}
        for a, blob in self._blob.items():
            ret, mat = ex.extract(blob)
            if ret != 0:
                raise BackendError(f"ncnn: extracting blob {blob} (anchor {a!r}) failed with status {ret}")
            y = np.array(mat, dtype=np.float32)
            if y.size != int(np.prod(self._shape[a])):
                # another number of values than the ONNX shape holds: returned as ncnn gave it, a wrong
                # shape the oracle flags as this backend's deviation, the others' results kept
                out[a] = y
                continue
            y = y.reshape(self._shape[a])
            out[a] = y.astype(self._cast[a]) if a in self._cast else y
        return out

    def close(self) -> None:
        self.net = None


def _log_errors(log: str, n: int = 6) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.rstrip().endswith("ms")]
    errs = [ln for ln in lines if re.search(r"error|fail|not supported|unsupported|todo", ln, re.I)]
    return " | ".join((errs or lines)[-n:])[-800:] or "no message"


def _produced_blobs(path: Path) -> set[str]:
    """Every blob some layer of an ncnn ``.param`` writes (``type name n_in n_out ins... outs...``)."""
    out = set()
    for f in param_layers(path):
        nin, nout = int(f[2]), int(f[3])
        out.update(f[4 + nin : 4 + nin + nout])
    return out


def _pnnx_output_shapes(path: Path) -> dict[str, list[int]]:
    """``out<k>`` -> the shape pnnx recorded for it (``pnnx.Output out<k> 1 0 n #n=(1,84,2100)f32``)."""
    shapes = {}
    if not path.is_file():
        return shapes
    for f in param_layers(path):
        if f[0] == "pnnx.Output":
            m = _SHAPE.search(" ".join(f[4:]))
            if m:
                shapes[f[1]] = [int(s) for s in m.group(2).split(",") if s.strip()]
    return shapes


def _inferred_output_shapes(model) -> dict[str, list[int | None]]:
    """Graph output name -> shape by ONNX shape inference (data propagation) on ``model`` (inputs
    already concrete); outputs whose shape is unknown map to None entries."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - then the anchors are reported missing with the reason
        return {}
    return {
        o.name: [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in o.type.tensor_type.shape.dim
        ]
        for o in m.graph.output
    }
