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
from anpred.tensorfile import c_contiguous
from exporters.mapping import shape_matches

BACKEND = "torch-native"


def origin_factory(
    manifest: AnchorManifest, options: dict[str, Any], backend: str, model_path: Path | None = None
) -> tuple[str, dict[str, Any]]:
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
        raise BackendError(
            f"{backend}: no native model: manifest.model['origin'] has no factory and no "
            "'factory' option was given (module:function returning (model, example_inputs))"
        )
    return spec, dict(kwargs or {})


def _check_inputs(manifest: AnchorManifest, example: tuple) -> tuple[tuple, str]:
    """Inputs for the check run in ``prepare``: the factory's example inputs when their shapes fit the
    manifest's ONNX inputs, else seeded uniform [0, 1) float32 arrays of the ONNX shapes (when static).
    Returns ``(inputs as torch tensors, description)``."""
    import torch

    from exporters.mapping import shape_matches

    specs = manifest.model.get("inputs", [])
    ex = tuple(x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x)) for x in example)
    if not specs or all(shape_matches(tuple(x.shape), s.get("shape")) for x, s in zip(ex, specs)):
        return ex, "the factory's example inputs"
    if not all(s.get("shape") and all(isinstance(d, int) and d > 0 for d in s["shape"]) for s in specs):
        return ex, "the factory's example inputs (ONNX input shapes are dynamic)"
    rng = np.random.default_rng(0)
    arrays = tuple(
        torch.from_numpy(rng.random(s["shape"], dtype=np.float32).astype(s.get("dtype") or "float32")) for s in specs
    )
    return arrays, (
        "seeded inputs of the ONNX input shapes "
        f"({', '.join(str(s['shape']) for s in specs)}; the example inputs have other shapes)"
    )


class TorchNativeBackend(Backend):
    """Eager PyTorch on the CPU, the model rebuilt from its factory; anchors via forward hooks."""

    threads_option = True  # (the ``threads`` option)

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
            cap = AnchorCapture(
                status=e["status"],
                layout=a.layout,
                transform=e.get("transform"),
                target=e.get("target") or None,
                reason=e.get("reason", ""),
            )
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
        self._shapes = {a.name: list(a.shape or []) for a in manifest.anchors}
        # one check run: every hook must see a single tensor of the anchor's ONNX shape. It runs on
        # inputs of the ONNX input shapes (the example inputs when they have them, else seeded uniform
        # [0, 1) arrays), so a factory built for another size cannot pass unnoticed.
        check_in, note = _check_inputs(manifest, tuple(example))
        got = self._forward(check_in)
        for name, (path, call, which, leaf) in self._targets.items():
            if name not in got:
                self._info[name].status = "missing"
                self._info[name].reason = (
                    f"module {path or '<root>'!r} ({which}, call {call}) produced no single "
                    f"tensor in a check run on {note}"
                )
            elif not shape_matches(got[name].shape, self._shapes[name]):
                self._info[name].status = "missing"
                self._info[name].reason = (
                    f"shape mismatch: {self._info[name].target} gives {list(got[name].shape)} "
                    f"in {type(module).__name__}, the anchor's ONNX shape is "
                    f"{self._shapes[name]} (check run on {note})"
                )
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
            raise BackendError(
                f"{self.name}: {type(self.module).__name__} forward failed: {type(err).__name__}: {err}"
            ) from err
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
        args = tuple(torch.from_numpy(c_contiguous(inputs[n])) for n in names)
        got = self._forward(args)
        for name in list(got):  # capture-time check: never return a tensor of another shape
            if not shape_matches(got[name].shape, self._shapes.get(name)):
                cap = self._info[name]
                cap.status = "missing"
                cap.reason = (
                    f"shape mismatch at run time: {cap.target} gave {list(got[name].shape)}, the anchor's "
                    f"ONNX shape is {self._shapes.get(name)}"
                )
                del got[name]
                self._targets.pop(name, None)
        return got

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._info)

    def close(self) -> None:
        self.module = None
