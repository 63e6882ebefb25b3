"""The PyTorch program an ExecuTorch backend exports, from either origin, with or without anchor outputs.

ExecuTorch runs what ``torch.export.export`` captures; an anchor is read from the program as an extra
**output** (the delegate then has to produce it: :mod:`anpred.backends.executorch_lower` measures what
that changes, the observer effect). Two origins:

* **ONNX** (:class:`OnnxSource`): the anchored ONNX model converted by onnx2torch exactly as the ``torch``
  backend converts it (:class:`anpred.backends.torch_onnx.TorchOnnxBackend`), the GraphModule's
  outputs rewired to the anchors' values (an anchor is the output of the onnx2torch submodule whose
  ``onnx_mapping`` names its ONNX value). onnx2torch's modules read shapes, axes and scales out of
  tensors (``Reshape``: ``torch.any(shape == 0)``, ``Resize``: ``scales.tolist()``) that ``torch.export``
  sees as symbolic: every initializer a submodule takes as an input is bound to the call as a
  constant, and the module is traced to ATen by ``make_fx`` on the real sample with constant
  propagation over any tensor size (torch's proxy tracer propagates only one-element constants by
  default, ``CONSTANT_NUMEL_LIMIT``), so shape arithmetic on constants and on the (static) input
  shape folds while any read of an input-derived value still raises (data-dependent: ``unsupported``).
  The traced module is then exported.
* **native** (:class:`NativeSource`): the ``nn.Module`` rebuilt from its factory as ``torch-native``
  rebuilds it, anchors where :mod:`exporters.mapping` put them (a module's output or single input, a
  leaf of the root output), returned by a wrapper whose forward hooks collect them during the
  exported call.

Both give a :class:`TracedProgram`: the ``ExportedProgram``, the graph input names (ONNX order) and,
per output position, the anchor it carries. Anchors that are graph inputs or initializers are not
outputs (an ExecuTorch program returns computed tensors); the backend returns them as they are.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture
from anpred.backends.torch_native import TorchNativeBackend
from anpred.backends.torch_onnx import TorchOnnxBackend
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest

__all__ = ["NativeSource", "OnnxSource", "TracedProgram", "example_inputs", "export_module", "first_line"]


@dataclass
class TracedProgram:
    """An exported program and what its outputs are.

    ``program``: ``torch.export.ExportedProgram``; ``inputs``: graph input names in call order;
    ``outputs``: anchor name per output position; ``example``: the tuple of tensors it was traced with;
    ``module``: the traced ``nn.Module`` (eager execution of the same program, before export)."""

    program: Any
    inputs: list[str]
    outputs: list[str]
    example: tuple
    module: Any = None
    notes: list[str] = field(default_factory=list)


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's text, ``Type: line`` (torch.export's errors run to
    dozens of lines of advice)."""
    text = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {text[:300]}"


def export_module(module, example: tuple, what: str):
    """``torch.export.export(module, example)`` (non-strict). Raises :class:`BackendError` whose text
    says ``unsupported`` and carries the export error's first line when the module cannot be captured
    (the worker then records the backend as ``unsupported``)."""
    import torch

    try:
        with torch.no_grad():
            return torch.export.export(module, example, strict=False)
    except Exception as err:
        raise BackendError(f"torch.export cannot capture {what} (unsupported): {first_line(err)}") from err


class _Bound:
    """A call of an onnx2torch submodule with its initializer inputs bound as constants: ``fn(*args,
    **kwargs)`` where ``("dyn", i)`` slots take the i-th traced argument and ``("const", i)`` slots the
    i-th constant, created inside the trace by ``aten.lift_fresh_copy`` so the proxy tracer tracks it
    as a constant (and ``.tolist()`` on it gives values, not a data-dependent error)."""

    def __init__(self, fn, args, kwargs, consts: list):
        self.fn, self.args, self.kwargs, self.consts = fn, args, kwargs, consts
        self.__name__ = f"bound_{type(fn).__name__}"

    @staticmethod
    def _slot(v) -> bool:
        return isinstance(v, tuple) and len(v) == 2 and v[0] in ("dyn", "const")

    def __call__(self, *dyn):
        import torch
        import torch.utils._pytree as pytree

        consts = [torch.ops.aten.lift_fresh_copy.default(c) for c in self.consts]

        def fill(v):
            return (dyn[v[1]] if v[0] == "dyn" else consts[v[1]]) if self._slot(v) else v

        return self.fn(
            *pytree.tree_map(fill, self.args, is_leaf=self._slot),
            **pytree.tree_map(fill, self.kwargs, is_leaf=self._slot),
        )


def _bind_initializers(gm) -> int:
    """Replace every ``call_module`` of ``gm`` that takes ``get_attr`` inputs (ONNX initializers) by a
    :class:`_Bound` call with those tensors as constants. Returns how many calls were bound."""
    import torch.fx

    bound = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_module" or not any(a.op == "get_attr" for a in n.all_input_nodes):
            continue
        dyn, consts = [], []

        def sub(a, dyn=dyn, consts=consts):
            if a.op != "get_attr":
                dyn.append(a)
                return ("dyn", len(dyn) - 1)
            t = gm
            for part in a.target.split("."):
                t = getattr(t, part)
            consts.append(t.detach().clone())
            return ("const", len(consts) - 1)

        args, kwargs = torch.fx.node.map_arg(n.args, sub), torch.fx.node.map_arg(n.kwargs, sub)
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(_Bound(gm.get_submodule(n.target), args, kwargs, consts), tuple(dyn))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        bound += 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return bound


def trace_to_aten(gm, example: tuple, what: str):
    """``make_fx`` of ``gm`` on the real ``example`` (pre-dispatch ATen, as ``torch.export`` sees it),
    constants propagated through tensors of any size (module docstring). Raises :class:`BackendError`
    (``unsupported``, first line of the error) when the module reads a value that depends on the
    input's data."""
    import torch
    from torch.fx.experimental import proxy_tensor

    old = proxy_tensor.CONSTANT_NUMEL_LIMIT
    # a shape or an axis list read back with .tolist() must stay a constant; any size is fine here,
    # since constants are only ever computed from initializers and the static input shape
    proxy_tensor.CONSTANT_NUMEL_LIMIT = 1 << 24
    try:
        with torch.no_grad():
            traced = proxy_tensor.make_fx(gm, tracing_mode="real", pre_dispatch=True)(*example)
    except Exception as err:  # tracing raises many types
        raise BackendError(f"torch.export cannot capture {what} (unsupported): {first_line(err)}") from err
    finally:
        proxy_tensor.CONSTANT_NUMEL_LIMIT = old
    _materialize_constants(traced)
    return traced


def _materialize_constants(module) -> int:
    """Give every tensor constant of a traced module its own contiguous storage. A propagated constant
    can be a view with zero strides (an ``expand`` of an initializer, measured on YOLOv8n-DocLayNet's
    head), which ExecuTorch refuses to serialize (``0 in strides is not supported for ExecuTorch``).
    Returns how many were copied."""
    import torch

    def fresh(t):  # row-major strides, even for size-1 dimensions (a view's may be 0 there)
        return torch.empty(t.shape, dtype=t.dtype).copy_(t)

    def strided(t) -> bool:
        return not t.is_contiguous() or 0 in t.stride()

    copied = 0
    for name, value in list(vars(module).items()):
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and strided(value):
            setattr(module, name, fresh(value))
            copied += 1
    for name, buf in list(module.named_buffers(recurse=False)):
        if strided(buf):
            module.register_buffer(name, fresh(buf))
            copied += 1
    return copied


def example_inputs(manifest: AnchorManifest, names: list[str], sample: dict[str, np.ndarray] | None) -> tuple:
    """The tensors to trace with: ``sample``'s arrays when given, else seeded uniform [0, 1) arrays of
    the manifest's (static) input shapes and dtypes."""
    import torch

    specs = {s["name"]: s for s in manifest.model.get("inputs", [])}
    rng = np.random.default_rng(0)
    out = []
    for n in names:
        if sample is not None and n in sample:
            out.append(torch.from_numpy(np.ascontiguousarray(sample[n])))
            continue
        s = specs.get(n) or {}
        shape = s.get("shape")
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise BackendError(
                f"input {n!r} has no static shape in the manifest ({shape}); ExecuTorch programs "
                "are exported for one shape: give the run's inputs"
            )
        out.append(torch.from_numpy(rng.random(shape).astype(s.get("dtype") or "float32")))
    return tuple(out)


class OnnxSource(TorchOnnxBackend):
    """The anchored ONNX model through onnx2torch (as ``torch`` converts it), traced for export.

    ``prepare`` converts; :meth:`traced` builds the program with or without anchor outputs."""

    name = "executorch-onnx-source"

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        super()._prepare_impl(model_path, manifest, workdir)
        self.model_path = model_path
        self._bound = _bind_initializers(self._gm)

    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    def constants(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Anchors that are graph inputs or initializers, as arrays (not program outputs)."""
        assert self.manifest is not None
        out = {}
        for a in self.manifest.anchors:
            if self._targets.get(a.value) == "input" and a.value in inputs:
                out[a.name] = np.array(inputs[a.value], copy=True)
            elif a.value in self._constants:
                out[a.name] = self._constants[a.value].copy()
        return out

    def captures(self) -> dict[str, AnchorCapture]:
        return dict(self._captures)

    def _producers(self) -> dict[str, Any]:
        """ONNX value name -> the fx node (or ``(node, index)`` of a multi-output node) producing it."""
        prod: dict[str, Any] = {}
        for n in self._gm.graph.nodes:
            fn = self._gm.get_submodule(n.target) if n.op == "call_module" else getattr(n.target, "fn", None)
            mapping = getattr(fn, "onnx_mapping", None)
            if mapping is None:
                continue
            outs = list(mapping.outputs)
            for i, v in enumerate(outs):
                prod[v] = n if len(outs) == 1 else (n, i)
        return prod

    def traced(self, with_anchors: bool, sample: dict[str, np.ndarray] | None = None) -> TracedProgram:
        """The exported program whose outputs are every computed anchor (``with_anchors``) or only the
        model's outputs (``kind == "output"`` anchors). Raises :class:`BackendError` (``unsupported``)
        when tracing or export fails."""
        assert self.manifest is not None
        gm = self._gm
        prod = self._producers()
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        saved = out_node.args
        wanted = [a for a in self.manifest.anchors if (with_anchors or a.kind == "output") and a.value in prod]
        vals = []
        with gm.graph.inserting_before(out_node):
            for a in wanted:
                p = prod[a.value]
                vals.append(gm.graph.call_function(operator.getitem, p) if isinstance(p, tuple) else p)
        out_node.args = (tuple(vals),)
        gm.recompile()
        what = f"the onnx2torch module of {self.model_path.name}"
        try:
            example = example_inputs(self.manifest, self._input_names, sample)
            traced = trace_to_aten(gm, example, what)
        finally:
            out_node.args = saved
            gm.graph.eliminate_dead_code()
            gm.recompile()
        ep = export_module(traced, example, what)
        notes = [f"onnx2torch submodules with initializer inputs bound as constants: {self._bound}"]
        return TracedProgram(ep, list(self._input_names), [a.name for a in wanted], example, traced, notes)

    def _run_impl(self, inputs):  # never used: the program runs on ExecuTorch
        raise RuntimeError("OnnxSource is a program source, not a backend to run")


class _Hooked:
    """Forward hooks on a native module that keep the anchors' tensors of the current call:
    ``targets`` anchor name -> ``(module path, call index, "output"|"input", leaf)``."""

    def __init__(self, root, targets: dict[str, tuple[str, int, str, int | None]]):
        self.got: dict[str, Any] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.handles = []
        modules = dict(root.named_modules())
        by_path: dict[str, list] = {}
        for name, (path, call, which, _leaf) in targets.items():
            if path:
                by_path.setdefault(path, []).append((name, call, which))
        for path, uses in by_path.items():
            self.handles.append(modules[path].register_forward_hook(self._post(path, uses), with_kwargs=True))
            self.handles.append(modules[path].register_forward_pre_hook(self._pre(path, uses), with_kwargs=True))

    def _tick(self, path: str, which: str) -> int:
        c = self.counts.get((path, which), 0)
        self.counts[(path, which)] = c + 1
        return c

    def _post(self, path, uses):
        def hook(mod, args, kwargs, out):
            c = self._tick(path, "output")
            for name, call, which in uses:
                if which == "output" and call == c:
                    self.got[name] = out

        return hook

    def _pre(self, path, uses):
        from torch.utils._pytree import tree_leaves

        def hook(mod, args, kwargs):
            import torch

            c = self._tick(path, "input")
            leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            for name, call, which in uses:
                if which == "input" and call == c and len(leaves) == 1:
                    self.got[name] = leaves[0]

        return hook


def _anchored_native(module, targets: dict, names: list[str]):
    """A wrapper ``nn.Module`` whose forward calls ``module`` and returns the tensors of ``names``
    (anchors; ``targets`` as :class:`_Hooked`), collected by forward hooks during that call."""
    import torch
    from torch.utils._pytree import tree_leaves

    class AnchoredNative(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = module

        def forward(self, *args):
            hooked = _Hooked(self.model, {n: targets[n] for n in names if targets[n][0]})
            try:
                out = self.model(*args)
            finally:
                for h in hooked.handles:
                    h.remove()
            leaves = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
            res = []
            for n in names:
                path, _call, _which, leaf = targets[n]
                res.append(hooked.got[n] if path else leaves[leaf if leaf is not None else 0])
            return tuple(res)

    return AnchoredNative().eval()


class NativeSource(TorchNativeBackend):
    """The native ``nn.Module`` rebuilt from its factory with ``torch-native``'s anchor targets (its
    ``prepare`` maps and checks them), exported with the anchors as outputs."""

    name = "executorch-native-source"

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    def constants(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}

    def captures(self) -> dict[str, AnchorCapture]:
        return dict(self._info)

    def traced(self, with_anchors: bool, sample: dict[str, np.ndarray] | None = None) -> TracedProgram:
        """As :meth:`OnnxSource.traced`; ``with_anchors=False`` returns the output anchors only."""
        assert self.manifest is not None
        names = [
            a.name for a in self.manifest.anchors if a.name in self._targets and (with_anchors or a.kind == "output")
        ]
        if not names:  # an output that is not mapped: the root module's outputs stand for the model's
            names = [a.name for a in self.manifest.anchors if a.name in self._targets][:1]
        wrapper = _anchored_native(self.module, self._targets, names)
        example = example_inputs(self.manifest, self._inputs, sample)
        ep = export_module(
            wrapper, example, f"{type(self.module).__name__} (factory {self.options.get('factory') or ''})"
        )
        return TracedProgram(ep, list(self._inputs), names, example, wrapper, [])

    def _run_impl(self, inputs):
        raise RuntimeError("NativeSource is a program source, not a backend to run")
