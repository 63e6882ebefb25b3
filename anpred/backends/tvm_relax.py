"""Backend ``tvm`` (family ``tvm``): the anchored ONNX model imported by Apache TVM's Relax ONNX
frontend, compiled by TVM to native code with LLVM, and run in the Relax virtual machine.

Kernels: TVM's own generated loops. The import (``tvm.relax.frontend.onnx.from_onnx``) maps each
ONNX node to Relax operators; ``DecomposeOpsForInference`` rewrites batch/layer/group norms into
elementwise arithmetic; ``LegalizeOps`` lowers every operator to TIR through TOPI's compute
definitions (convolutions as direct nested-loop sums over (c, kh, kw), matmuls as plain reductions,
``exp``/``tanh``... as LLVM intrinsics that end in the C library's ``expf`` etc.). ``tvm.compile``
with the CPU default pipeline then fuses elementwise chains into their producers (``FuseOps``/
``FuseTIR``), plans memory, and generates machine code with LLVM. No schedule is applied (no
MetaSchedule tuning, no ``dlight`` rules): the loops are compiled as written, with no parallel loops
(the exported library has no ``TVMBackendParallelLaunch`` call: one thread) and with what vectorization
LLVM's own loop vectorizer finds. No vendor library (no BLAS, DNNL or cuDNN) is called. The
accumulation order is TOPI's: for a convolution output, the sum runs over input channels, then kernel
rows, then columns, sequentially in fp32; nothing in this shares code with ONNX Runtime, OpenVINO,
PyTorch or TensorFlow kernels, so ``tvm`` is a family of its own.

Target: ``{"kind": "llvm"}`` with no ``mcpu``: the mtriple TVM was built for (x86_64 here) and LLVM's
``generic`` CPU for it, i.e. the x86-64 baseline (SSE2; no AVX, no FMA: measured on YOLOv8n, the
library holds no ``ymm`` register and no ``vfmadd`` instruction). Every x86-64 CPU runs it, so the
cached library is shared across machines and the results do not depend on the host's instruction
set. (With ``mcpu="x86-64-v3"`` LLVM contracts a*b+c into FMA, which changes the rounding.) The
option ``mcpu`` picks another LLVM CPU name (``"native"``: the host's,
``tvm.target.codegen.llvm_get_system_cpu()``, e.g. ``znver4``); the resolved target, the host CPU name
included in that case, is part of the cache key. ``versions()`` records ``tvm_target`` (the target as
JSON), ``tvm_llvm_cpu`` and ``llvm`` (the LLVM major version TVM was built with).

Shapes: the module is compiled for concrete input shapes (``needs_input_shapes``): static ONNX dims as
they are, dynamic ones from ``options["input_shapes"]`` (the runner passes the run's shapes when all
samples share them); otherwise :class:`~anpred.errors.BackendError`. A sample of another shape is
refused (:class:`~anpred.errors.InputError`).

Cache: the compiled library (``exe.export_library``, linked by TVM's ``tvm.contrib.cc`` with the
system's C++ compiler) and ``meta.json`` are stored with :func:`anpred.cache.cached_dir` under
``tvm/<key>``, key = sha256 of the model file + TVM version + concrete input shapes + target JSON +
:data:`FORMAT`; a later prepare loads it with ``tvm.runtime.load_module`` instead of compiling again (hundreds of
times faster: docs/backends-converters.md, 'Measurements: TVM compilation').
Where the library cannot be exported (no C++ compiler), the
executable compiled in memory is used and not cached (``versions()["tvm_cache"]`` says why).

Anchors: graph outputs of the anchored model. The Relax ``main`` returns a tensor for a one-output
graph and a tuple in graph-output order otherwise (``onnx_frontend.py``, ``ONNXGraphImporter.from_onnx``:
``outputs = [self._nodes[name] for name in graph.output]``); anchors are matched by output name
(:func:`anpred.backends.ort.output_anchor_map`). Arrays come back in the ONNX layout (TVM keeps
NCHW) and in the graph's dtypes (an integer/bool result in another integer width is cast back when
every value survives: :func:`anpred.backends.native_io.as_declared`).

Shape computations: before the import, every computation that depends only on tensor shapes
(``Shape`` -> ``Cast``/``Slice``/``Concat``/``Gather``... -> a ``Reshape`` target) is evaluated at
the concrete input shapes with ``onnx.reference`` and replaced by an initializer
(:func:`anpred.backends.native_io.fold_shape_computations`; no activation is folded). The frontend
keeps shapes symbolic only through a few ops (``shape_compatible_ops`` in ``_construct_nodes``) and
otherwise turns them into tensors its ``Reshape`` refuses ("Reshape requires the input new shape to be
Shape": PP-OCR rec and cls). ``versions()["tvm_shape_nodes_folded"]`` counts the folded nodes.

Recurrent layers: the frontend has no ``LSTM``/``GRU``/``RNN`` converter; such nodes are unrolled
before the import into the per-time-step equations of the ONNX schema (MatMul, Add, Mul, the
activations; :class:`passes.recurrent.RecurrentUnrollPass`, as the ``tf`` backend does), so TVM
computes them with its own matmul and elementwise loops. A node the pass cannot unroll (a dynamic
sequence length, weights that are not initializers) raises :class:`~anpred.errors.BackendError`
with the pass's reason. ``versions()["tvm_unrolled"]`` counts the unrolled nodes.

Inputs are passed positionally in graph-input order (the frontend renames inputs whose names are not
identifiers, ``sanitize_input_names``, but keeps their order).

Coverage (:meth:`TvmBackend.unsupported_ops`): the frontend's converter table
(``onnx_frontend._get_convert_map()``, plus ``If`` that the importer handles itself). The frontend
looks operators up by ``op_type`` alone, whatever their domain, and selects a converter version by
opset with a fallback to its oldest implementation (``OnnxOpConverter.get_converter``), so its table
expresses no opset-version gaps: coverage is by op type. ``Loop`` and ``Scan`` are among the operators
it lacks (TVM 0.27); ``LSTM``/``GRU``/``RNN`` count as covered (unrolled, above).

Errors: an operator without converter raises :class:`~anpred.errors.BackendError` "TVM's Relax ONNX
frontend does not support ... : <ops>"; a converter or compilation failure names the operator when the
frontend printed it ("Error converting operator <op>").
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.native_io import as_declared, check_sample, concrete_shapes, fold_shape_computations, graph_inputs
from anpred.backends.ort import output_anchor_map
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest
from anpred.onnx_io import model_ops

# 2: shape computations folded at the concrete shapes; 3: repeated; 4: recurrent unrolled;
# 5: empty Concat inputs dropped, the exported library checked to load back
FORMAT = "anpred.tvm_relax/5"
#: ops the Relax importer handles itself, outside the converter table (``_construct_nodes``)
DIRECT_OPS = ("If",)
LIBRARY = "model.so"


def convert_table() -> set[str] | None:
    """The op types TVM's Relax ONNX frontend converts (its converter table plus :data:`DIRECT_OPS`),
    plus the recurrent ops this backend unrolls first (:data:`passes.recurrent.RECURRENT_OPS`); None
    when the installed TVM has no such table."""
    try:
        from tvm.relax.frontend.onnx import onnx_frontend
    except ImportError:
        return None
    table = getattr(onnx_frontend, "_get_convert_map", None)
    if table is None:
        return None
    from passes.recurrent import RECURRENT_OPS

    return set(table()) | set(DIRECT_OPS) | set(RECURRENT_OPS)


def resolve_target(mcpu: str | None) -> dict[str, Any]:
    """The LLVM target as TVM's JSON-dict form: ``{"kind": "llvm"}`` (LLVM's generic CPU for TVM's
    mtriple: portable) when ``mcpu`` is None/"", else with ``"mcpu"``; ``"native"``/``"host"`` resolve
    to the host's LLVM CPU name. Raises BackendError for a CPU name LLVM does not know."""
    if not mcpu:
        return {"kind": "llvm"}
    import tvm

    if mcpu in ("native", "host"):
        mcpu = tvm.target.codegen.llvm_get_system_cpu()
    target = {"kind": "llvm", "mcpu": mcpu}
    triple = (
        str(tvm.target.Target({"kind": "llvm"}).attrs.get("mtriple", "")) or tvm.target.codegen.llvm_get_system_triple()
    )
    if not tvm.target.codegen.llvm_is_valid_cpu(mcpu, triple):
        raise BackendError(f"tvm: LLVM does not know the CPU {mcpu!r} for {triple} (option mcpu)")
    return target


class TvmBackend(Backend):
    """Apache TVM: Relax ONNX frontend + LLVM codegen (module docstring).

    Options:
        input_shapes (dict): concrete shapes for inputs with dynamic dims (the runner passes them).
        mcpu (str): LLVM CPU name for the target (default none: LLVM's portable generic CPU; "native":
            the host's; part of the cache key).
    """

    name = "tvm"
    family = "tvm"
    precision = "fp32"
    coverage_basis = "TVM Relax ONNX frontend converter table (onnx_frontend._get_convert_map)"
    needs_input_shapes = True

    @classmethod
    def unsupported_ops(cls, original) -> dict[str, str]:
        """The operators TVM's Relax ONNX frontend has no converter for, after the control flow the
        backend inlines before importing (:func:`passes.control_flow.inline_control_flow`: ``If`` and
        ``Loop`` with a constant trip count; the frontend has no ``Loop``). ``model`` is not modified."""
        table = convert_table()
        model = original
        if table is None:
            return {}
        import tvm

        if any(n.op_type in ("If", "Loop") for n in model.graph.node):
            from passes.control_flow import inline_control_flow

            model = type(model)()
            model.CopyFrom(original)
            inline_control_flow(model)
        return {
            key: f"no converter for {op_type} in TVM {tvm.__version__}'s Relax ONNX frontend"
            for key, (_d, op_type, _v) in model_ops(model).items()
            if op_type not in table
        }

    node_basis = "TVM's Relax ONNX frontend on a one-node model of each node (cached by content)"

    @classmethod
    def refused_nodes(cls, model) -> dict[str, str]:
        """The nodes TVM's Relax ONNX frontend refuses alone (:func:`anpred.backends.tvm_probe.tvm_probe`),
        on the graph the backend imports: control flow inlined, recurrent nodes unrolled where their
        shapes are static (as :meth:`_compile` does; the frontend has neither)."""
        import onnx

        from anpred.backends.tvm_probe import tvm_probe
        from passes.recurrent import RECURRENT_OPS, unroll_recurrent

        m = onnx.ModelProto()
        m.CopyFrom(model)
        if any(n.op_type in ("If", "Loop") for n in m.graph.node):
            from passes.control_flow import inline_control_flow

            inline_control_flow(m)
        if any(n.op_type in RECURRENT_OPS for n in m.graph.node):
            try:
                unroll_recurrent(m)  # what stays recurrent is named by the run (no converter)
            except Exception:  # noqa: BLE001 - not unrollable here: the run names it
                pass
        return tvm_probe().refusals(m)

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self._vm = None
        self._lib = None
        self._meta: dict[str, Any] = {}
        self._captures: dict[str, AnchorCapture] = {}
        self._casts: dict[str, str] = {}
        self.cache_dir: Path | None = None
        self.cache_hit = False
        self.cache_note = ""
        self.seconds_compile = 0.0
        self.shape_nodes_folded = 0
        self.unrolled = 0
        self.empty_inputs_dropped = 0

    def _versions_impl(self) -> dict[str, str]:
        import tvm

        v = {"tvm": tvm.__version__, "llvm": str(tvm.target.codegen.llvm_version_major())}
        if self._meta:
            v["tvm_target"] = json.dumps(self._meta["target"], sort_keys=True)
            v["tvm_llvm_cpu"] = self._meta["target"].get("mcpu", "generic")
            v["tvm_cache"] = self.cache_note or ("hit" if self.cache_hit else "compiled")
            v["tvm_shape_nodes_folded"] = str(self._meta.get("shape_nodes_folded", 0))
            v["tvm_unrolled"] = str(self._meta.get("unrolled", 0))
            v["tvm_empty_inputs_dropped"] = str(self._meta.get("empty_inputs_dropped", 0))
        return v

    # ---- compilation ------------------------------------------------------------------------
    def _compile(self, model, shapes: dict[str, list[int]], target: dict[str, Any]):
        """Import, legalize and compile; returns the Relax executable. Raises BackendError."""
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx

        from passes.recurrent import RECURRENT_OPS, unroll_recurrent

        if any(n.op_type in ("If", "Loop") for n in model.graph.node):
            from passes.control_flow import inline_control_flow

            self.inlined = inline_control_flow(model)  # the frontend has no Loop; If branches reading outer values
        missing = self.unsupported_ops(model)
        if missing:
            raise BackendError(
                f"tvm: TVM {tvm.__version__}'s Relax ONNX frontend does not support these operators "
                f"(not supported: no converter): {', '.join(sorted(missing))}"
            )
        if any(n.op_type in RECURRENT_OPS for n in model.graph.node):
            for vi in model.graph.input:  # the concrete shapes make the sequence length static
                if vi.name in shapes:
                    for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                        d.Clear()
                        d.dim_value = int(v)
            info = unroll_recurrent(model)  # the frontend has no LSTM/GRU/RNN converter
            if info["kept"]:
                raise BackendError(
                    "tvm: the Relax ONNX frontend has no recurrent converter and these nodes cannot be "
                    "unrolled: " + "; ".join(f"{k}: {v}" for k, v in info["kept"].items())
                )
            self.unrolled = len(info["unrolled"])
        model, self.shape_nodes_folded = fold_shape_computations(model, shapes)
        from passes.empty_inputs import drop_empty_concat_inputs

        # its exported library cannot hold a zero-size constant (it does not load back); they add nothing
        self.empty_inputs_dropped = drop_empty_concat_inputs(model)
        log = io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(log):
                warnings.simplefilter("ignore")  # onnx.checker findings, input renames
                mod = from_onnx(model, shape_dict=shapes)
        except Exception as err:
            m = re.search(r"Error converting operator (\S+?),", log.getvalue())
            where = f" at operator {m.group(1)}" if m else ""
            raise BackendError(
                f"tvm: the Relax ONNX frontend failed{where}: {type(err).__name__}: {_first_line(str(err))}"
            ) from err
        try:
            mod = relax.transform.DecomposeOpsForInference()(mod)
            mod = relax.transform.LegalizeOps()(mod)
            return tvm.compile(mod, target=tvm.target.Target(target))
        except Exception as err:
            raise BackendError(
                f"tvm: compiling the Relax module failed: {type(err).__name__}: {_first_line(str(err))}"
            ) from err

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import tvm
        from tvm import relax

        from anpred.cache import cache_key, cache_root, cached_dir
        from anpred.onnx_io import load_model

        model = load_model(model_path, load_external=True)
        self._graph = graph_inputs(model)
        shapes = concrete_shapes(self.name, self._graph, self.options.get("input_shapes"))
        self._shapes = shapes
        target = resolve_target(self.options.get("mcpu"))
        key = cache_key(Path(model_path), "tvm", tvm.__version__, shapes, target, FORMAT)
        outputs = [o.name for o in model.graph.output]
        meta = {"format": FORMAT, "target": target, "input_shapes": shapes, "outputs": outputs}
        final = cache_root() / "tvm" / key
        self.cache_hit = (final / LIBRARY).is_file()
        exe = None
        if not self.cache_hit:
            t0 = time.perf_counter()
            exe = self._compile(model, shapes, target)
            self.seconds_compile = time.perf_counter() - t0
            meta["seconds_compile"] = round(self.seconds_compile, 3)
            meta["shape_nodes_folded"] = self.shape_nodes_folded
            meta["unrolled"] = self.unrolled
            meta["empty_inputs_dropped"] = self.empty_inputs_dropped

            def build(tmp: Path) -> None:
                exe.export_library(str(tmp / LIBRARY))
                try:  # cache only a library that loads back (one that does not would fail every later run)
                    tvm.runtime.load_module(str(tmp / LIBRARY))
                except Exception as err:  # noqa: BLE001 - TVM raises its own error types
                    raise BackendError(_reload_failure(err)) from err
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

            try:
                self.cache_dir = cached_dir("tvm", key, build)
            except BackendError as err:
                self.cache_note = f"not cached: {err}; run from the executable compiled in memory"
            except Exception as err:  # noqa: BLE001 - no C++ compiler/linker: run uncached
                self.cache_note = f"not cached: export_library failed ({type(err).__name__}: {_first_line(str(err))})"
        else:
            self.cache_dir = final
        self._lib = exe
        if self.cache_dir is not None:
            meta = json.loads((self.cache_dir / "meta.json").read_text())
            try:
                self._lib = tvm.runtime.load_module(str(self.cache_dir / LIBRARY))
            except Exception as err:  # noqa: BLE001 - a cached library that does not load: compiled anew, in memory
                self.cache_note = (
                    f"the cached library in {self.cache_dir} does not load: {_reload_failure(err)}; "
                    "compiled again in memory (remove that folder to cache it anew)"
                )
                self.cache_dir, self.cache_hit = None, False
                self._lib = self._compile(model, shapes, target)
        self._meta = meta
        self._vm = relax.VirtualMachine(self._lib, tvm.cpu())
        fetch, self._captures = output_anchor_map(meta["outputs"], manifest)
        self._index = {src: meta["outputs"].index(src) for src in fetch}
        self._fetch = fetch  # output name -> anchor name
        self._dtypes = {a.name: a.dtype for a in manifest.anchors}
        for a in manifest.anchors:
            cap = self._captures[a.name]
            if cap.status != "missing":
                cap.target = f"output[{self._index[cap.target]}]:{cap.target}"
                cap.reason = "Relax VM output (ONNX layout)"

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tvm

        args = [tvm.runtime.tensor(x) for x in check_sample(self.name, inputs, self._graph, self._shapes)]
        out = self._vm["main"](*args)
        outs = [out] if len(self._meta["outputs"]) == 1 else list(out)
        result = {}
        for src, anchor in self._fetch.items():
            y, note = as_declared(_to_numpy(outs[self._index[src]]), self._dtypes.get(anchor, ""))
            if note and anchor not in self._casts:
                self._casts[anchor] = note
                self._captures[anchor].reason += f"; {note}"
            result[anchor] = y
        return result

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._captures)

    def close(self) -> None:
        self._vm = None
        self._lib = None


def _to_numpy(v) -> np.ndarray:
    """A VM result as a numpy array: a ``tvm.runtime.Tensor`` (``.numpy()``, copied), or a shape tuple
    (an ONNX ``Shape`` result the frontend keeps as a Relax shape) as int64."""
    if hasattr(v, "numpy"):
        return np.array(v.numpy(), copy=True)
    return np.asarray([int(d) for d in v], dtype=np.int64)


def _reload_failure(err: BaseException) -> str:
    """Why an exported Relax library does not load back, in words: TVM's ``Tensor::Load`` fails
    (``Invalid DLTensor file format``) on a constant it wrote itself when it cannot read it back; the
    zero-size constant of an empty tensor does that (:mod:`passes.empty_inputs`)."""
    text = _first_line(str(err))
    if "Invalid DLTensor file format" in str(err):
        return (
            "the exported library does not load back (TVM's Tensor::Load: 'Invalid DLTensor file format', "
            "a constant TVM wrote but cannot read back, e.g. a zero-size tensor)"
        )
    return f"the exported library does not load back ({type(err).__name__}: {text})"


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + " ..."
