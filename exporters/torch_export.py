"""Export a PyTorch ``nn.Module`` to ONNX, keeping what maps ONNX values back to modules.

- Dynamo exporter (``dynamo=True``, torch's default, opset >= 18, 20 by default): ONNX value names equal
  the FX node names of the exported program, and every node's ``metadata_props`` carries
  ``pkg.torch.onnx.name_scopes`` (module paths from the root, last entry the FX op) and
  ``pkg.torch.onnx.class_hierarchy``. The ONNX optimizer folds BatchNorm into the preceding Conv; the
  fused Conv keeps the BatchNorm's scope, so its output *is* the BatchNorm module's output.
- TorchScript exporter (``dynamo=False``, deprecated fallback, opset 17 by default): node names carry
  the module path (``/model.4/cv1/conv/Conv``); BatchNorm is folded into the Conv under the *Conv's*
  name, so that value equals the BatchNorm module's output (see :mod:`exporters.mapping`).

Exports are cached (:mod:`anpred.cache`, kind ``export-torch``) under a key made of the weights
(bytes of every parameter and buffer), the architecture (module classes and ``repr``), the example
input shapes/dtypes, the exporter options and the torch/onnx/onnxscript versions.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from pathlib import Path
from typing import Any

from anpred.errors import OutputPathError
from exporters import ExportError, ExportResult, make_origin, write_with_origin


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "onnx", "onnxscript"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _module_digest(module) -> str:
    """sha256 over the architecture (class names, repr) and all parameter/buffer bytes."""
    import torch

    h = hashlib.sha256()
    for name, sub in module.named_modules():
        h.update(f"{name}:{type(sub).__module__}.{type(sub).__qualname__}\n".encode())
    h.update(repr(module).encode())
    for name, t in list(module.state_dict(keep_vars=False).items()):
        h.update(name.encode())
        if isinstance(t, torch.Tensor):
            t = t.detach().contiguous().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _inputs_spec(example_inputs: tuple) -> list[Any]:
    import torch

    spec = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            spec.append(["tensor", str(x.dtype), list(x.shape)])
        else:
            spec.append(["value", repr(x)])
    return spec


def export_torch(module, example_inputs: tuple, path, *, dynamo: bool = True, opset: int | None = None,
                 factory: str | None = None, factory_kwargs: dict[str, Any] | None = None,
                 cache: bool = True) -> ExportResult:
    """Export ``module`` (put in ``eval()`` mode) called on ``example_inputs`` to ONNX at ``path``.

    Args:
        module: a ``torch.nn.Module``.
        example_inputs: tuple of positional inputs (tensors, NCHW float32 for image models); their
            shapes become the model's static input shapes.
        path: destination ``.onnx`` (written atomically; weights inside the file, no ``.onnx.data``).
        dynamo: torch's dynamo exporter (default) or the TorchScript one (``False``).
        opset: ONNX opset; default 20 (dynamo, at least 18) or 17 (TorchScript).
        factory, factory_kwargs: ``module:function`` that rebuilds ``(module, example_inputs)`` in a
            fresh process; recorded in ``origin`` for the native backends.
        cache: reuse a cached export with the same key.

    Returns:
        :class:`exporters.ExportResult` (``origin`` goes to ``manifest.model["origin"]``).

    Raises:
        ExportError: not a module, or the exporter failed (the message names the module class and
            the exporter's first error line). OutputPathError: ``path``'s folder is not writable.
    """
    import torch

    from anpred.cache import cache_key, cached_dir

    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"export_torch needs a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if dynamo and opset is not None and opset < 18:
        raise ExportError(f"the dynamo exporter needs opset >= 18 (asked {opset}); use dynamo=False for older opsets")
    path = Path(path)
    if not path.parent.is_dir():
        raise OutputPathError(f"{path}: folder {path.parent} does not exist")
    exporter = "torch.onnx.dynamo" if dynamo else "torch.onnx.torchscript"
    opset = int(opset if opset is not None else (20 if dynamo else 17))
    versions = _versions()
    module.eval()
    cls = f"{type(module).__module__}.{type(module).__qualname__}"

    def build(tmp: Path) -> None:
        out = tmp / "model.onnx"
        try:
            with torch.no_grad():
                if dynamo:
                    prog = torch.onnx.export(module, example_inputs, dynamo=True, opset_version=opset,
                                             external_data=False, verbose=False)
                    prog.save(str(out), external_data=False)
                else:
                    torch.onnx.export(module, example_inputs, str(out), dynamo=False, opset_version=opset,
                                      do_constant_folding=True)
        except Exception as err:  # the exporters raise many types; report the first line, chain it
            first = (re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines() or [type(err).__name__])[0]
            raise ExportError(f"cannot export module {cls} with {exporter} (opset {opset}): "
                              f"{type(err).__name__}: {first}") from err
        if not out.is_file():
            raise ExportError(f"{exporter} wrote no file for module {cls}")

    key = cache_key("export-torch/1", _module_digest(module), _inputs_spec(example_inputs), exporter, opset,
                    versions)
    t0 = time.perf_counter()
    if cache:
        from anpred.cache import cache_root

        hit = (cache_root() / "export-torch" / key).is_dir()
        folder = cached_dir("export-torch", key, build)
    else:
        import tempfile

        hit = False
        folder = Path(tempfile.mkdtemp(prefix="anpred-export-"))
        try:
            build(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    seconds = 0.0 if hit else time.perf_counter() - t0
    import onnx

    real_opset = next((o.version for o in onnx.load(str(folder / "model.onnx"), load_external_data=False).opset_import
                       if o.domain in ("", "ai.onnx")), opset)
    origin = make_origin("torch", exporter, real_opset, factory, factory_kwargs)
    write_with_origin(folder / "model.onnx", path, origin)
    if not cache:
        shutil.rmtree(folder, ignore_errors=True)
    return ExportResult(path=path, framework="torch", exporter=exporter, versions=versions, opset=int(real_opset),
                        origin=origin, seconds=seconds, cached=hit)
