"""Backend ``torch``: the anchored ONNX model converted with onnx2torch and run in eager PyTorch.

Conversion (:meth:`TorchOnnxBackend._prepare_impl`):
1. the model is loaded with its weights; ``Constant`` nodes become initializers and
   ``Identity(initializer)`` nodes are folded (:func:`anpred.backends.convert.fold_constant_nodes`,
   :func:`anpred.backends.convert.fold_identity_initializers`; onnx2torch reads Conv weights from
   initializers only);
   ``If``/``Loop`` nodes are inlined (:class:`passes.control_flow.ControlFlowInlinePass`: constant
   conditions, both branches + ``Where``, constant trip counts unrolled), which onnx2torch lacks;
2. ANPRED's converters are in onnx2torch's registry (:mod:`anpred.backends.torch_converters`: LSTM/GRU/RNN,
   GlobalMaxPool, LpPool, SAME_* pooling ...) and converters for operator versions newer than onnx2torch
   knows are registered
   (:func:`anpred.backends.onnx2torch_compat.onnx2torch_compat`; dynamo exports use opset 18+);
3. every node is checked for a converter first, so a missing operator gives one
   :class:`~anpred.errors.BackendError` that names all of them (``Op-version (node ...)``);
4. ``onnx2torch.convert(model, attach_onnx_mapping=True)`` builds a ``torch.fx.GraphModule`` whose
   submodules are named after ONNX nodes and carry their ONNX input/output value names.

Capture by name: the GraphModule is executed node by node with a ``torch.fx.Interpreter``; the output
of each converted submodule is recorded under the ONNX value names of its ``onnx_mapping``, **by
structure** (:func:`map_outputs`): a module returning a tuple of as many tensors as the node has
outputs gives one per output (Split); a module returning one tensor for a multi-output node gives the
node's first output only (onnx2torch's LayerNormalization returns ``Y`` alone, never ``Mean`` and
``InvStdDev``; a tensor is never split along its first axis into "outputs"); any other structure maps
nothing. ``prepare`` runs the converted graph once on ones (:func:`anpred.backends.lowp_fp16.validation_inputs`)
when an anchor is a later output of a multi-output module, so that the capture status says what the
structure allows: ``exact`` for a mapping checked by structure, ``missing`` with the reason for an
output the module does not return, ``unverified`` when that run fails (mapped by position, unchecked). Anchors are taken
from that table by their
``Anchor.value``, never from the GraphModule's outputs (onnx2torch returns one tuple per
multi-output node and deduplicates graph outputs by producer, so output positions do not map back to
ONNX output names reliably). Returned arrays are numpy arrays in ONNX layout (NCHW), in the dtype
the converted graph computes them in (float16 for a float16 graph, which torch computes with its
float16 CPU kernels; bfloat16 inputs and outputs pass through their bits, :func:`to_torch`,
:func:`to_numpy`).

Conversion takes well under a second (docs/backends-converters.md, 'Measurements: onnx2torch
conversion'), so it is not cached.
Effective precision: fp32 (eager CPU kernels; no autocast).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.lowp_models import PopulationMember
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest
from anpred.tensorfile import c_contiguous


def to_torch(x: np.ndarray):
    """A numpy sample as a torch tensor of the same dtype; bfloat16 (``ml_dtypes``, or 2-byte void as
    stored by npz) goes through its uint16 bits, which ``torch.from_numpy`` cannot take directly."""
    import torch

    a = c_contiguous(x)
    if a.dtype.name == "bfloat16" or (a.dtype.kind == "V" and a.dtype.itemsize == 2):
        return torch.from_numpy(a.view(np.uint16).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t) -> np.ndarray:
    """A torch tensor as a numpy array of the same dtype (a copy); bfloat16 as ``ml_dtypes.bfloat16``
    (``Tensor.numpy()`` refuses bfloat16)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


class TorchOnnxBackend(Backend):
    """onnx2torch + eager PyTorch.

    Options:
        threads (int): ``torch.set_num_threads`` (default: leave torch's default).
    """

    threads_option = True  # (the ``threads`` option)
    constant_weights = True  # (its converter reads parameters as initializers: passes.bind_inputs.weight_inputs)

    name = "torch"
    family = "torch"
    precision = "fp32"
    coverage_basis = "onnx2torch converter registry (with ANPRED's converters, anpred.backends.torch_converters)"

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        """The operators of ``model`` (sub-graphs included) without a converter in onnx2torch's registry
        at the model's opset, after ANPRED's additions (:func:`anpred.backends.torch_converters.import_onnx2torch`,
        :func:`anpred.backends.onnx2torch_compat.onnx2torch_compat`). Registry keys are
        ``(domain, op_type, since_version)``;
        the version asked is the schema's ``since_version`` at the model's import of the op's domain.
        An op that has converters for other versions only is keyed ``op@opset``. Attribute-dependent
        refusals (e.g. ``Resize`` antialias) are found only when converting."""
        from anpred.backends.torch_converters import import_onnx2torch
        from anpred.backends.convert import since_version
        from anpred.backends.onnx2torch_compat import onnx2torch_compat
        from anpred.onnx_io import model_ops

        import_onnx2torch()  # first: onnx2torch imports torchvision, stubbed there
        onnx2torch_compat()
        from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription

        by_op: dict[tuple[str, str], list[int]] = {}
        for k in _CONVERTER_REGISTRY:
            by_op.setdefault((k.domain, k.operation_type), []).append(k.version)
        if any(n.op_type in ("If", "Loop") for n in model.graph.node):  # inlined before converting
            import onnx

            from passes.control_flow import inline_control_flow

            model = onnx.ModelProto.FromString(model.SerializeToString())
            inline_control_flow(model)
        out = {}
        for key, (dom, op, opset) in model_ops(model).items():
            ver = since_version(op, opset, dom) or opset
            if OperationDescription(domain=dom, operation_type=op, version=ver) in _CONVERTER_REGISTRY:
                continue
            have = sorted(by_op.get((dom, op), []))
            if have:
                out[f"{key}@{opset}"] = (
                    f"onnx2torch has converters for {op} versions {have}, not for {op}-{ver} (opset {opset})"
                )
            else:
                out[key] = f"onnx2torch has no converter for {op} (any version)"
        return out

    node_basis = "onnx2torch's converters called on each node (the NotImplementedError they raise)"

    @classmethod
    def refused_nodes(cls, model) -> dict[str, str]:
        """The nodes whose onnx2torch converter refuses their attributes or inputs
        (:func:`anpred.backends.converter_probe.onnx2torch_refusals`: e.g. Reshape ``allowzero=1``, Clip
        with computed min/max)."""
        from anpred.backends.converter_probe import onnx2torch_refusals

        return onnx2torch_refusals(model)

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self._gm = None
        self._input_names: list[str] = []
        self._targets: dict[str, str] = {}  # anchor value -> producing submodule / "input" / "initializer"
        self._constants: dict[str, np.ndarray] = {}
        self._captures: dict[str, AnchorCapture] = {}
        self.seconds_convert = 0.0
        #: what :class:`passes.control_flow.ControlFlowInlinePass` did in ``prepare``: {"inlined", "kept"}
        self.inlined: dict[str, Any] = {"inlined": [], "kept": {}}

    def _versions_impl(self) -> dict[str, str]:
        import importlib.metadata as md

        import torch

        return {"torch": torch.__version__, "onnx2torch": md.version("onnx2torch"), "onnx": md.version("onnx")}

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import torch
        from onnx import numpy_helper

        from anpred.backends.torch_converters import import_onnx2torch
        from anpred.backends.convert import fold_constant_nodes, fold_identity_initializers
        from anpred.backends.onnx2torch_compat import onnx2torch_compat, onnx2torch_unsupported
        from anpred.onnx_io import load_model

        if "threads" in self.options:
            torch.set_num_threads(int(self.options["threads"]))
        from passes.control_flow import inline_control_flow

        model = load_model(model_path, load_external=True)
        fold_constant_nodes(model)
        fold_identity_initializers(model)
        self.inlined = inline_control_flow(model)  # onnx2torch has no If/Loop converter
        from anpred.backends.torch_converters import explicit_same_pads

        self.same_pads = explicit_same_pads(model)  # onnx2torch's Conv refuses auto_pad SAME_*
        o2t = import_onnx2torch()
        onnx2torch_compat()
        missing = onnx2torch_unsupported(model)
        if missing:
            kept = "; ".join(f"{k}: {v}" for k, v in self.inlined["kept"].items())
            raise BackendError(
                f"onnx2torch has no converter for {len(missing)} node(s): {'; '.join(missing[:10])}"
                + (" ..." if len(missing) > 10 else "")
                + (f" (control flow not inlined: {kept})" if kept else "")
            )
        t0 = time.perf_counter()
        try:
            gm = o2t.convert(model, attach_onnx_mapping=True)
        except NotImplementedError as err:
            raise BackendError(f"onnx2torch cannot convert {model_path.name}: {err}") from err
        except Exception as err:  # converter bugs surface as KeyError/ValueError/RuntimeError
            raise BackendError(f"onnx2torch failed on {model_path.name}: {type(err).__name__}: {err}") from err
        self.seconds_convert = time.perf_counter() - t0
        gm.eval()
        self._gm = gm

        inits = {t.name for t in model.graph.initializer}
        self._input_names = [i.name for i in model.graph.input if i.name not in inits]
        produced: dict[str, str] = {}
        for name, mod in gm.named_modules():
            mapping = getattr(mod, "onnx_mapping", None)
            if mapping is not None:
                for v in mapping.outputs:
                    produced[v] = name
        init_by_name = {t.name: t for t in model.graph.initializer}
        for a in manifest.anchors:
            if a.value in produced:
                self._targets[a.value] = produced[a.value]
                self._captures[a.name] = AnchorCapture(
                    "exact",
                    a.layout,
                    None,
                    produced[a.value],
                    "output of the onnx2torch submodule named after the ONNX node",
                )
            elif a.value in self._input_names:
                self._targets[a.value] = "input"
                self._captures[a.name] = AnchorCapture("exact", a.layout, None, a.value, "graph input")
            elif a.value in init_by_name:
                self._constants[a.value] = numpy_helper.to_array(init_by_name[a.value])
                self._captures[a.name] = AnchorCapture("exact", a.layout, None, a.value, "initializer")
            else:
                self._captures[a.name] = AnchorCapture(
                    "missing", a.layout, None, None, f"no onnx2torch submodule produces ONNX value {a.value!r}"
                )

        self._check_structure(model, manifest)

    def _check_structure(self, model, manifest: AnchorManifest) -> None:
        """Capture statuses by the structure of the multi-output modules' results (module docstring):
        one run on ones where an anchor is a later output of a multi-output module."""
        later = {}  # anchor value -> (module name, output index) for outputs after the first
        for name, mod in self._gm.named_modules():
            mapping = getattr(mod, "onnx_mapping", None)
            if mapping is not None and len(mapping.outputs) > 1:
                for k, v in enumerate(mapping.outputs[1:], 1):
                    later[v] = (name, k, len(mapping.outputs), type(mod).__name__)
        todo = [a for a in manifest.anchors if a.value in later and self._captures[a.name].status == "exact"]
        if not todo:
            return
        from anpred.backends.lowp_fp16 import validation_inputs

        shapes: dict[str, Any] = {}
        try:
            feeds = validation_inputs(model)
            _capture_run(self._gm, [to_torch(feeds[n]) for n in self._input_names], set(), {}, shapes)
        except Exception as err:  # noqa: BLE001 - any failure of the probe leaves the mapping unchecked
            why = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
            for a in todo:
                self._captures[a.name].status = "unverified"
                self._captures[a.name].reason = (
                    "mapped by the output's position; the onnx2torch module's result "
                    f"structure could not be checked (run on ones failed: {why})"
                )
            return
        for a in todo:
            name, k, n, cls = later[a.value]
            got = shapes.get(name)
            if got != n:
                what = "one tensor" if got == 1 else f"{got} values" if got is not None else "nothing"
                self._captures[a.name] = AnchorCapture(
                    "missing",
                    a.layout,
                    None,
                    name,
                    f"onnx2torch's {cls} returns {what} for the {n} outputs of the ONNX node: output {k} "
                    f"({a.value!r}) has no counterpart",
                )

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._captures)

    @property
    def graph_module(self):
        """The converted ``torch.fx.GraphModule`` (after ``prepare``; None after ``close``), submodules
        named after the ONNX nodes."""
        return self._gm

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        missing = [n for n in self._input_names if n not in inputs]
        if missing:
            raise InputError(
                f"backend torch: missing input(s) {', '.join(missing)}; expected {', '.join(self._input_names)}"
            )
        wanted = {v for v, t in self._targets.items() if t not in ("input",)}
        seen: dict[str, Any] = {}
        _capture_run(self._gm, [to_torch(inputs[n]) for n in self._input_names], wanted, seen)
        result: dict[str, np.ndarray] = {}
        assert self.manifest is not None
        for a in self.manifest.anchors:
            if self._captures[a.name].status == "missing":
                continue
            if a.value in seen:
                t = seen[a.value]
                result[a.name] = to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
            elif a.value in self._constants:
                result[a.name] = self._constants[a.value].copy()
            elif a.value in inputs:
                result[a.name] = np.array(inputs[a.value], copy=True)
        return result

    def close(self) -> None:
        self._gm = None


def map_outputs(names: list[str] | tuple[str, ...], out) -> dict[str, Any]:
    """The ONNX output names of a node -> the module's result values, by structure: a tuple/list of
    ``len(names)`` values one per name; a single value (a tensor) for the first name only; any other
    structure nothing (module docstring)."""
    if isinstance(out, (tuple, list)):
        return dict(zip(names, out)) if len(out) == len(names) else {}
    return {names[0]: out} if names else {}


def _capture_run(
    gm, args: list, wanted: set[str], seen: dict[str, Any], structure: dict[str, int] | None = None
) -> None:
    """Run ``gm`` (an onnx2torch GraphModule) on ``args`` node by node, recording the values of the ONNX
    names in ``wanted`` into ``seen`` (:func:`map_outputs`); with ``structure``, per multi-output
    module, the number of values its result holds (1 for a lone tensor)."""
    import torch
    import torch.fx

    class _Capture(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_module":
                mapping = getattr(gm.get_submodule(n.target), "onnx_mapping", None)
                if mapping is not None:
                    names = tuple(mapping.outputs)
                    if structure is not None and len(names) > 1:
                        structure[n.target] = len(out) if isinstance(out, (tuple, list)) else 1
                    for v, o in map_outputs(names, out).items():
                        if v in wanted:
                            seen[v] = o
            return out

    with torch.inference_mode():
        _Capture(gm).run(*args)


class TorchFp16Backend(PopulationMember, TorchOnnxBackend):
    """``torch-fp16``: the fp16 population's shared float16 model
    (:func:`anpred.backends.lowp_fp16.fp16_model`) converted with onnx2torch exactly as ``torch`` converts
    the anchored model, run in eager PyTorch on float16 tensors (CPU Half kernels).

    ``prepare`` runs one validation sample (the run's first input, else ones) so that an operator
    without a CPU Half kernel in this torch build fails there: :class:`~anpred.errors.BackendError`
    naming the ONNX node and its op (``onnx2torch module <node> (<OnnxOp>) has no float16 kernel in
    torch <version> on CPU: ...``); the same error is raised if it happens in ``run``. Anchors computed
    in float16 are returned as float32 (exact) and their capture says so. Precision: the model's
    (:class:`~anpred.backends.lowp_models.PopulationMember`).
    """

    name = "torch-fp16"
    family = "torch"
    precision = "fp16"
    population = "fp16"

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import onnx

        from anpred.backends.lowp_fp16 import validation_inputs

        path = self.population_model(model_path, manifest)
        super()._prepare_impl(path, manifest, workdir)
        m = onnx.load(str(path), load_external_data=False)
        f16 = {
            v.name
            for v in list(m.graph.value_info) + list(m.graph.output)
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
        }
        self.note_casts(self._captures, {a.name: "float16" for a in manifest.anchors if a.value in f16})
        cal = [str(f) for f in (self.options.get("calibration") or [])]
        self._run_impl(validation_inputs(m, cal[0] if cal else None))

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return super()._run_impl(inputs)
        except RuntimeError as err:
            raise self._located(inputs, err) from err

    def _located(self, inputs: dict[str, np.ndarray], err: RuntimeError) -> Exception:
        """``err`` as a BackendError naming the onnx2torch module (ONNX node) that raises it on
        ``inputs`` (found by running the graph node by node); ``err`` itself when no module is to blame."""
        import torch
        import torch.fx

        gm, where = self._gm, {}

        class _Find(torch.fx.Interpreter):
            def run_node(self, n):
                try:
                    return super().run_node(n)
                except Exception:
                    if n.op == "call_module" and "node" not in where:
                        where["node"], where["op"] = n.target, type(gm.get_submodule(n.target)).__name__
                    raise

        args = [torch.from_numpy(c_contiguous(inputs[n])) for n in self._input_names]
        try:
            with torch.inference_mode():
                _Find(gm).run(*args)
        except Exception:  # noqa: BLE001 - the failure being located
            pass
        if not where:
            return err
        text = " ".join(str(err).split())
        what = (
            f"has no float16 kernel in torch {torch.__version__} on CPU"
            if "Half" in text or "float16" in text
            else "fails"
        )
        return BackendError(f"torch-fp16: onnx2torch module {where['node']} ({where['op']}) {what}: {text[:300]}")
