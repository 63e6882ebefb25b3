"""``torch-native``: the original ``nn.Module`` in eager PyTorch, anchors captured by forward hooks.

The module is rebuilt in this process from the factory recorded at export
(``manifest.model["origin"]["factory"]``, ``"module:function"`` returning ``(model, example_inputs)``,
called with ``origin["kwargs"]``) or from ``options["factory"]`` / ``options["factory_kwargs"]``. Each
anchor is captured where :mod:`exporters.mapping` put it (``anchor.native["torch-native"]``, computed
here when absent): a module's forward output, the single tensor a module receives, or a tensor leaf of
the root output. Tensors are returned as float32/float64 numpy arrays in the module's own layout
(NCHW for ``nn.Conv2d`` models: the same as ONNX). Unmapped anchors are ``missing`` with the
mapping's reason.

Options: ``factory``, ``factory_kwargs``, ``threads`` (``torch.set_num_threads``; default unchanged).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest

BACKEND = "torch-native"


def origin_factory(manifest: AnchorManifest, options: dict[str, Any], backend: str,
                   model_path: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The factory spec and kwargs to rebuild the native model: ``options`` first, then
    ``manifest.model["origin"]``, then the ``anpred.origin`` metadata of the ONNX file at ``model_path``.

    Raises:
        BackendError: none gives a factory.
    """
    origin = manifest.model.get("origin") or {}
    if not origin.get("factory") and model_path is not None and not options.get("factory"):
        from anpred.onnx_io import load_model
        from exporters import read_origin

        origin = read_origin(load_model(model_path)) or {}
    spec = options.get("factory") or origin.get("factory")
    kwargs = options.get("factory_kwargs") if options.get("factory") else origin.get("kwargs")
    if not spec:
        raise BackendError(f"{backend}: no native model: manifest.model['origin'] has no factory and no "
                           "'factory' option was given (module:function returning (model, example_inputs))")
    return spec, dict(kwargs or {})


class TorchNativeBackend(Backend):
    """Eager PyTorch on the CPU, the model rebuilt from its factory; anchors via forward hooks."""

    name = "torch-native"
    family = "torch"
    precision = "fp32"

    def _versions_impl(self):
        import torch

        return {"torch": torch.__version__}

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import torch

        from exporters import ExportError, load_factory
        from exporters.mapping import MappingError, map_anchors, parse_torch_target

        if "threads" in self.options:
            torch.set_num_threads(int(self.options["threads"]))
        spec, kwargs = origin_factory(manifest, self.options, self.name, model_path)
        try:
            module, example = load_factory(spec, kwargs)
        except ExportError as err:
            raise BackendError(f"{self.name}: {err}") from err
        if not isinstance(module, torch.nn.Module):
            raise BackendError(f"{self.name}: factory {spec!r} returned {type(module).__name__}, not a torch.nn.Module")
        self.module = module.eval()
        if any(BACKEND not in a.native for a in manifest.anchors):
            try:
                map_anchors(manifest, module, "torch", onnx_model=model_path, example_inputs=example)
            except MappingError as err:
                raise BackendError(f"{self.name}: {err}") from err
        self._info: dict[str, AnchorCapture] = {}
        self._targets: dict[str, tuple[str, int, str, int | None]] = {}
        modules = dict(module.named_modules())
        for a in manifest.anchors:
            e = a.native[BACKEND]
            cap = AnchorCapture(status=e["status"], layout=a.layout, transform=e.get("transform"),
                                target=e.get("target") or None, reason=e.get("reason", ""))
            if e["status"] == "unmapped":
                cap.status = "missing"
            else:
                path, call, which, leaf = parse_torch_target(e["target"])
                if path and path not in modules:
                    cap.status, cap.reason = "missing", f"module {path!r} does not exist in {type(module).__name__}"
                else:
                    self._targets[a.name] = (path, call, which, leaf)
            self._info[a.name] = cap
        self._inputs = [i["name"] for i in manifest.model.get("inputs", [])]
        # one check run on the example inputs: every hook must see a single tensor
        got = self._forward(tuple(example))
        for name, (path, call, which, leaf) in self._targets.items():
            if name not in got:
                self._info[name].status = "missing"
                self._info[name].reason = (f"module {path or '<root>'!r} ({which}, call {call}) produced no single "
                                           "tensor in a check run on the example inputs")
        self._targets = {k: v for k, v in self._targets.items() if self._info[k].status != "missing"}

    def _forward(self, args: tuple) -> dict[str, np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        wanted: dict[str, list[tuple[str, int, str]]] = {}
        for name, (path, call, which, leaf) in self._targets.items():
            if path:
                wanted.setdefault(path, []).append((name, call, which))
        got: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        pre_counts: dict[str, int] = {}
        handles = []
        modules = dict(self.module.named_modules())

        def to_np(t) -> np.ndarray:
            return t.detach().cpu().numpy().copy()

        for path, uses in wanted.items():
            mod = modules[path]
            if any(w == "output" for _, _, w in uses):
                def post(m, a, k, out, _p=path, _u=uses):
                    c = counts.get(_p, 0)
                    counts[_p] = c + 1
                    for name, call, which in _u:
                        if which == "output" and call == c and isinstance(out, torch.Tensor):
                            got[name] = to_np(out)
                handles.append(mod.register_forward_hook(post, with_kwargs=True))
            if any(w == "input" for _, _, w in uses):
                def pre(m, a, k, _p=path, _u=uses):
                    c = pre_counts.get(_p, 0)
                    pre_counts[_p] = c + 1
                    leaves = [x for x in tree_leaves((a, k)) if isinstance(x, torch.Tensor)]
                    for name, call, which in _u:
                        if which == "input" and call == c and len(leaves) == 1:
                            got[name] = to_np(leaves[0])
                handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        try:
            with torch.no_grad():
                out = self.module(*args)
        except Exception as err:
            raise BackendError(f"{self.name}: {type(self.module).__name__} forward failed: "
                               f"{type(err).__name__}: {err}") from err
        finally:
            for h in handles:
                h.remove()
        leaves = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        for name, (path, call, which, leaf) in self._targets.items():
            if not path and leaf is not None and leaf < len(leaves):
                got[name] = to_np(leaves[leaf])
        return got

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        names = self._inputs or list(inputs)
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"{self.name}: missing input(s) {', '.join(missing)}; model inputs: {', '.join(names)}")
        args = tuple(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names)
        return self._forward(args)

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._info)

    def close(self) -> None:
        self.module = None
