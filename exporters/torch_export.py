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
from pathlib import Path
from typing import Any

from anpred.errors import OutputPathError
from exporters import ExportError, ExportResult, export_folder, framework_of, make_origin, write_with_origin

__all__ = ["export_torch", "describe_export_error"]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "onnx", "onnxscript"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _code_digest(cls) -> bytes:
    """What a module class computes, for the export cache: the text of the file that defines it (its
    ``forward`` and the helpers it calls there), else its ``forward``'s bytecode and constants."""
    import inspect

    try:
        return Path(inspect.getsourcefile(cls) or "").read_bytes()
    except (OSError, TypeError):
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        return (code.co_code + repr(code.co_consts).encode()) if code is not None else b""


def _module_digest(module) -> str:
    """sha256 over the architecture (class names, repr), the code of the user's module classes (a
    ``forward`` edited between two runs is another model; torch's own classes are known by its version)
    and all parameter/buffer bytes."""
    import torch

    h = hashlib.sha256()
    classes = {}
    for name, sub in module.named_modules():
        h.update(f"{name}:{type(sub).__module__}.{type(sub).__qualname__}\n".encode())
        if not type(sub).__module__.startswith("torch."):
            classes.setdefault(f"{type(sub).__module__}.{type(sub).__qualname__}", type(sub))
    for key in sorted(classes):
        h.update(hashlib.sha256(_code_digest(classes[key])).digest())
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


def _clean(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _module_at(module, filename: str, lineno: int) -> str | None:
    """The deepest submodule path (``''`` for the root) whose class's ``forward`` source spans
    ``filename:lineno``, or None."""
    import inspect

    best = None
    for name, sub in module.named_modules():
        fwd = getattr(type(sub), "forward", None)
        try:
            src = inspect.getsourcefile(fwd)
            lines, first = inspect.getsourcelines(fwd)
        except (TypeError, OSError):
            continue
        if src and Path(src).resolve() == Path(filename).resolve() and first <= lineno < first + len(lines):
            if best is None or name.count(".") + bool(name) > best.count(".") + bool(best):
                best = name
    return best


def _label(module, path: str) -> str:
    sub = module.get_submodule(path) if path else module
    return f"{'submodule ' + repr(path) if path else 'the root module'} ({type(sub).__name__})"


def describe_export_error(err: BaseException, module) -> str:
    """One line for an exporter failure: the submodule that failed (from the innermost traceback frame
    whose ``self`` is a submodule of ``module``, else from the "File ..., line N" the exporter quotes,
    matched against the submodules' ``forward`` sources), the user code line, and the root cause's
    type and first line (torch's own wrapper lines such as "Failed to export the model with
    torch.export. This is step 1/3" are skipped)."""
    names = {id(sub): name for name, sub in module.named_modules()}
    chain, seen, todo = [], set(), [err]
    while todo:  # the exception and its causes/contexts, iteratively
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        chain.append(e)
        todo.extend([e.__context__, e.__cause__])
    where = None
    code = None
    for e in chain:
        tb = e.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if id(owner) in names and tb.tb_frame.f_code.co_name == "forward":
                where = names[id(owner)]
                code = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
            tb = tb.tb_next
        if where is not None:
            break
    text = _clean(str(err))
    if where is None:
        for fname, line in re.findall(r'File "([^"]+)", line (\d+), in forward', text):
            hit = _module_at(module, fname, int(line))
            if hit is not None:
                where, code = hit, (fname, int(line))
    root = chain[-1] if chain else err
    for e in chain:  # the innermost non-wrapper error
        if not type(e).__module__.startswith("torch.onnx"):
            root = e
            break
    first = next((ln.strip() for ln in _clean(str(root)).splitlines() if ln.strip()), type(root).__name__)
    msg = f"{type(root).__name__}: {first}"
    if code is not None:
        import linecache

        src = linecache.getline(code[0], code[1]).strip()
        msg = f"at {code[0]}:{code[1]} ({src!r}): {msg}" if src else f"at {code[0]}:{code[1]}: {msg}"
    if where is not None:
        msg = f"{_label(module, where)} failed {msg}"
    return msg


def _check_trace(path: Path, module, cls: str, example_inputs: tuple, tracer_warnings: list) -> None:
    """TorchScript export sanity: the graph has inputs, every output depends on one, and tracing raised
    no ``TracerWarning`` (a tensor turned into a NumPy array / Python value is frozen into the trace
    as a constant: the model would return the example's result for every input).

    Raises:
        ExportError: naming the submodule (from the warning's source line) and the warning.
    """
    import onnx
    import torch

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = {i.name for i in g.input if i.name not in inits}
    reach = set(inputs)
    for n in g.node:  # nodes are in topological order
        if any(v in reach for v in n.input):
            reach.update(n.output)
    problems = []
    n_tensors = sum(isinstance(x, torch.Tensor) for x in example_inputs)
    if n_tensors and not inputs:
        problems.append("the exported graph has no inputs")
    const_out = [o.name for o in g.output if o.name not in reach]
    if inputs and const_out:
        problems.append(f"output(s) {', '.join(const_out)} do not depend on any input")
    if not problems and not tracer_warnings:
        return
    detail = ""
    if tracer_warnings:
        w = tracer_warnings[0]
        where = _module_at(module, w.filename, w.lineno)
        who = f"{_label(module, where)} " if where is not None else ""
        detail = f"; {who}at {w.filename}:{w.lineno}: TracerWarning: {str(w.message).strip().splitlines()[0]}"
        if len(tracer_warnings) > 1:
            detail += f" (+{len(tracer_warnings) - 1} more TracerWarning(s))"
    what = "; ".join(problems) or "tracing is input-specific"
    raise ExportError(
        f"cannot export module {cls} with torch.onnx.torchscript: {what}{detail}. The trace froze "
        "values computed outside torch (NumPy, Python numbers) into constants, so the ONNX model "
        "would not compute the module; use torch ops in forward, or the dynamo exporter"
    )


def export_torch(
    module,
    example_inputs: tuple,
    path,
    *,
    dynamo: bool = True,
    opset: int | None = None,
    factory: str | None = None,
    factory_kwargs: dict[str, Any] | None = None,
    cache: bool = True,
) -> ExportResult:
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
        ExportError: not a module; the exporter failed (the message names the root class, the failing
            submodule with its source line, and the underlying error's type and first line); a
            TorchScript trace that froze NumPy/Python values (no graph input, outputs independent of the
            inputs, or any ``TracerWarning``). OutputPathError: ``path``'s folder is not writable.
    """
    import torch

    from anpred.cache import cache_key

    if framework_of(module) != "torch":
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
        import contextlib
        import io
        import warnings

        out = tmp / "model.onnx"
        try:
            with (
                torch.no_grad(),
                warnings.catch_warnings(record=True) as caught,
                contextlib.redirect_stdout(io.StringIO()),
            ):
                warnings.simplefilter("always", torch.jit.TracerWarning)
                if dynamo:
                    prog = torch.onnx.export(
                        module, example_inputs, dynamo=True, opset_version=opset, external_data=False, verbose=False
                    )
                    prog.save(str(out), external_data=False)
                else:
                    torch.onnx.export(
                        module, example_inputs, str(out), dynamo=False, opset_version=opset, do_constant_folding=True
                    )
        except Exception as err:  # the exporters raise many types; name the submodule and the real error
            raise ExportError(
                f"cannot export module {cls} with {exporter} (opset {opset}): {describe_export_error(err, module)}"
            ) from err
        if not out.is_file():
            raise ExportError(f"{exporter} wrote no file for module {cls}")
        if not dynamo:
            tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
            _check_trace(out, module, cls, example_inputs, tracer)

    key = cache_key("export-torch/1", _module_digest(module), _inputs_spec(example_inputs), exporter, opset, versions)
    import onnx

    with export_folder("export-torch", key, build, cache) as (folder, hit, seconds):
        real_opset = next(
            (
                o.version
                for o in onnx.load(str(folder / "model.onnx"), load_external_data=False).opset_import
                if o.domain in ("", "ai.onnx")
            ),
            opset,
        )
        origin = make_origin("torch", exporter, real_opset, factory, factory_kwargs)
        write_with_origin(folder / "model.onnx", path, origin)
    return ExportResult(
        path=path,
        framework="torch",
        exporter=exporter,
        versions=versions,
        opset=int(real_opset),
        origin=origin,
        seconds=seconds,
        cached=hit,
    )
