"""MODEL resolved into a :class:`Subject`: the ONNX file to instrument and, when there is one, the
native model it came from.

The three forms of MODEL (:func:`resolve_model`):

- an ``.onnx`` file: its ``anpred.origin`` metadata (written by ANPRED's exporters,
  :func:`exporters.read_origin`) names a native factory when there is one;
- a zoo name (:func:`models.get`): shipped or cached ONNX file, native factory, real inputs and
  preprocessing;
- a factory ``module:function`` returning ``(torch.nn.Module | keras.Model, example_inputs)``
  (:func:`import_factory`), its framework told by :func:`exporters.framework_of`, exported with
  :func:`exporters.torch_export.export_torch` (dynamo) or :func:`exporters.tf_export.export_keras`
  (tf2onnx), cached, into ``workdir/exported.onnx``.

:func:`check_model` is the quick look taken before the output folder is touched; :func:`native_model`
builds the native model again for the mapping; :class:`PythonPath` makes a factory importable in the
backend processes and :class:`QuietLogger` silences the INFO logs of native model building.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from anpred.errors import AnpredError
from anpred.pipeline.choices import NATIVE_BACKEND, check_native_backends
from anpred.pipeline.progress import log

__all__ = [
    "Subject",
    "resolve_model",
    "check_model",
    "is_factory_spec",
    "module_root",
    "import_factory",
    "native_model",
    "PythonPath",
    "QuietLogger",
]


@dataclass
class Subject:
    """A resolved model.

    Attributes:
        label: short name used in reports and history (zoo name, file stem or factory function).
        kind: ``onnx`` (a file), ``zoo`` or ``factory``.
        onnx_path: the ONNX file to instrument (shipped, cached export, or the user's file).
        framework: origin framework: ``onnx`` (no native model), ``torch`` or ``tf``.
        origin: ``manifest.model["origin"]`` (``framework``, ``factory``, ``kwargs`` ...) or None.
        zoo: the :class:`models.zoo.ZooModel` for zoo names.
        native: ``(native model, example inputs)`` when already built (factories), else None.
        export: the :class:`exporters.ExportResult` as a dict (factories).
        sys_path: folder to put on ``PYTHONPATH`` so backend processes can import the factory.
    """

    label: str
    kind: str
    onnx_path: Path
    framework: str = "onnx"
    origin: dict[str, Any] | None = None
    zoo: Any = None
    native: tuple[Any, tuple] | None = None
    export: dict[str, Any] | None = None
    sys_path: str | None = None

    @property
    def factory(self) -> str | None:
        return (self.origin or {}).get("factory")

    def to_dict(self) -> dict[str, Any]:
        """What ``test.json`` records as ``details.subject``: label, kind, ONNX file, framework,
        origin and export."""
        return {
            "label": self.label,
            "kind": self.kind,
            "onnx": str(self.onnx_path),
            "framework": self.framework,
            "origin": self.origin,
            "export": self.export,
        }


def is_factory_spec(text: str) -> bool:
    """Whether ``text`` reads as a factory ``module:function`` (dotted identifiers, one colon, no
    path separator, not an ``.onnx`` name)."""
    if text.count(":") != 1 or "/" in text or "\\" in text or text.endswith(".onnx"):
        return False
    mod, fn = text.split(":")
    return bool(mod) and bool(fn) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()


def module_root(module_name: str) -> str | None:
    """The folder that must be on ``sys.path`` to import ``module_name`` (None for installed ones)."""
    mod = sys.modules.get(module_name)
    f = getattr(mod, "__file__", None)
    if not f:
        return None
    p = Path(f).resolve()
    root = p.parent
    for _ in range(module_name.count(".") + (1 if p.name == "__init__.py" else 0)):
        root = root.parent
    if "site-packages" in root.parts:
        return None
    return str(root)


def import_factory(spec: str, kwargs: dict[str, Any]):
    """:func:`exporters.load_factory`, trying the current folder too (a console script's
    ``sys.path`` does not hold it). Returns ``(model, example inputs, module root)``
    (:func:`module_root`).

    Raises:
        ExportError: the factory cannot be imported or called, or it raised (the cause chained)."""
    import importlib

    from exporters import ExportError, load_factory

    mod_name = spec.split(":")[0]
    try:
        importlib.import_module(mod_name)
    except ImportError:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    try:
        model, example = load_factory(spec, kwargs)
    except ExportError:
        raise
    except AnpredError:
        raise
    except Exception as err:  # the user's factory raised: say which, keep the cause
        raise ExportError(f"factory {spec!r} raised {type(err).__name__}: {err}") from err
    return model, example, module_root(mod_name)


def check_model(model: str | os.PathLike, backends: Iterable[str] | None) -> str:
    """A quick look at MODEL before the output folder is touched: an unknown zoo name, an unreadable
    ``.onnx`` or a native backend that does not fit raise (nothing is written then). Returns the
    label to name the default output folder by.

    Raises:
        AnpredError: not an ``.onnx`` file, a zoo model or a factory; ModelLoadError: an unreadable
        ``.onnx``; BackendError: :func:`anpred.pipeline.choices.check_native_backends`.
    """
    text = str(model)
    if not (is_factory_spec(text) or text.lower().endswith(".onnx") or Path(text).exists() or os.sep in text):
        import models

        if text not in models.REGISTRY:
            raise AnpredError(
                f"unknown model {text!r}: not an .onnx file, a zoo model or a module:function "
                f"factory; zoo models: {', '.join(models.REGISTRY)}"
            )
        check_native_backends(backends, models.REGISTRY[text].native_framework or "onnx", text, "zoo")
    elif not is_factory_spec(text):
        from anpred.onnx_io import load_model
        from exporters import read_origin

        origin = read_origin(load_model(text, load_external=False)) or {}
        check_native_backends(
            backends, origin.get("framework", "onnx") if origin.get("factory") else "onnx", Path(text).stem, "onnx"
        )
    return text.split(":")[-1] if is_factory_spec(text) else Path(text).stem


def resolve_model(
    model: str | os.PathLike,
    *,
    imgsz: int | tuple[int, int] | None = None,
    seed: int = 0,
    factory_kwargs: dict[str, Any] | None = None,
    workdir: Path | None = None,
    quiet: bool = True,
    backends: Iterable[str] | None = None,
) -> Subject:
    """Turn MODEL into a :class:`Subject` (see the module docstring for the three forms).

    Args:
        model: an ``.onnx`` path, a zoo name (``anpred zoo``) or ``module:function``.
        imgsz: input size for resizable zoo models and dynamic ONNX inputs (int or (H, W)).
        seed: zoo weight seed (seeded models only) and the first seed of a zoo model's rendered pages
            or text lines (:meth:`models.zoo.ZooModel.real_images`; the photographs are fixed files).
        factory_kwargs: keyword arguments for a factory.
        workdir: where a factory's export is written (``exported.onnx``); required for factories.
        backends: when given, a native backend that does not fit the model is refused
            (:func:`check_native_backends`) before anything is exported.

    Raises:
        ModelLoadError: an ``.onnx`` path that is missing or unreadable.
        AnpredError: an unknown zoo name (the message lists the known ones), an unusable factory
            (:class:`exporters.ExportError`), a size the model cannot take.
    """
    text = str(model)
    path = Path(text)
    if text.lower().endswith(".onnx") or path.is_file() or os.sep in text:
        from anpred.onnx_io import load_model
        from exporters import read_origin

        proto = load_model(path, load_external=False)  # ModelLoadError: missing / not ONNX
        origin = read_origin(proto)
        fw = (origin or {}).get("framework", "onnx") if (origin or {}).get("factory") else "onnx"
        check_native_backends(backends, fw, path.stem, "onnx")
        return Subject(
            label=path.stem,
            kind="onnx",
            onnx_path=path.resolve(),
            framework=fw,
            origin=origin if fw != "onnx" else None,
        )
    if is_factory_spec(text) and text.split(":")[0] not in ("random",):
        return _resolve_factory(text, dict(factory_kwargs or {}), workdir, quiet, backends)
    import models

    if text not in models.REGISTRY:
        raise AnpredError(
            f"{text!r} is not an .onnx file, a zoo model or a module:function factory; "
            f"zoo models: {', '.join(models.REGISTRY)}"
        )
    check_native_backends(backends, models.REGISTRY[text].native_framework or "onnx", text, "zoo")
    zm = models.get(text, imgsz=imgsz, seed=seed)
    log(f"zoo model {zm.name}: {'trained' if zm.trained else 'seeded'} weights, input {zm.inputs_text()}", quiet)
    onnx_path = zm.onnx_path()
    fw = zm.native_framework or "onnx"
    return Subject(
        label=zm.name,
        kind="zoo",
        onnx_path=Path(onnx_path),
        framework=fw,
        origin=zm.manifest_origin() if fw != "onnx" else None,
        zoo=zm,
    )


def _resolve_factory(
    text: str, kwargs: dict[str, Any], workdir: Path | None, quiet: bool, backends: Iterable[str] | None
) -> Subject:
    """A factory ``module:function``: import and call it, export the model to ``workdir/exported.onnx``."""
    from exporters import framework_of

    native, example, root = import_factory(text, kwargs)
    fw = framework_of(native)
    check_native_backends(backends, fw if fw in NATIVE_BACKEND else "onnx", text, "factory")
    if workdir is None:
        raise AnpredError("resolve_model: a factory needs workdir= for its export")
    dst = Path(workdir) / "exported.onnx"
    log(f"exporting {text} ({fw})", quiet)
    if fw == "torch":
        from exporters.torch_export import export_torch

        res = export_torch(native, tuple(example), dst, factory=text, factory_kwargs=kwargs)
    elif fw == "tf":
        from exporters.tf_export import export_keras

        res = export_keras(native, dst, factory=text, factory_kwargs=kwargs)
    else:
        from exporters import ExportError

        raise ExportError(
            f"factory {text!r} returned a {type(native).__module__}.{type(native).__name__}; "
            "expected a torch.nn.Module or a keras.Model"
        )
    return Subject(
        label=text.split(":")[1],
        kind="factory",
        onnx_path=Path(res.path),
        framework=fw,
        origin=dict(res.origin),
        native=(native, tuple(example)),
        export=res.to_dict(),
        sys_path=root,
    )


def native_model(subject: Subject):
    """``(native model, example inputs)`` of the subject (built now for zoo/ONNX origins)."""
    if subject.native is not None:
        return subject.native
    if subject.zoo is not None:
        return subject.zoo.build_native()
    native, example, _ = import_factory(subject.origin["factory"], dict(subject.origin.get("kwargs") or {}))
    return native, example


class PythonPath:
    """Put a folder on ``PYTHONPATH`` (inherited by backend processes) for the duration."""

    def __init__(self, folder: str | None):
        self.folder, self.old = folder, None

    def __enter__(self):
        if self.folder:
            self.old = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = self.folder + (os.pathsep + self.old if self.old else "")
        return self

    def __exit__(self, *exc):
        if self.folder:
            if self.old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = self.old


class QuietLogger:
    """No INFO log records for the duration (ultralytics logs model building on stdout);
    ``logging.disable`` holds even when the library configures its logger while importing."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        import logging

        self.prev = logging.root.manager.disable
        logging.disable(max(self.prev, logging.INFO))
        return self

    def __exit__(self, *exc):
        import logging

        logging.disable(self.prev)
