"""Exporters: native models (PyTorch ``nn.Module``, Keras) to ONNX, and the mapping of ONNX anchors
back onto the native graphs (:mod:`exporters.mapping`).

Heavy frameworks (torch, tensorflow) are imported only inside functions. Exports are cached with
:mod:`anpred.cache` (content-addressed: weights, architecture, input spec, exporter and versions).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = [
    "ExportError",
    "ExportResult",
    "export_folder",
    "framework_of",
    "load_factory",
    "make_origin",
    "read_origin",
    "write_with_origin",
    "ORIGIN_KEY",
]


class ExportError(AnpredError):
    """A native model cannot be exported (the message names the module/layer and the exporter's
    own first error line), or a factory ``module:function`` cannot be imported/called."""


@dataclass
class ExportResult:
    """What an export produced.

    Attributes:
        path: the written ``.onnx`` file (weights inside it, no external data for small models).
        framework: ``"torch"`` or ``"tf"``.
        exporter: ``"torch.onnx.dynamo"``, ``"torch.onnx.torchscript"`` or ``"tf2onnx"``.
        versions: library versions the export depends on (``torch``, ``onnx``, ``tf2onnx`` ...).
        opset: default-domain opset of the written model.
        origin: the dict to store as ``manifest.model["origin"]`` (``framework``, ``exporter``,
            ``opset``, and ``factory``/``kwargs`` when a factory was given).
        seconds: wall time of the export (0 on a cache hit) and ``cached``: whether it was one.
    """

    path: Path
    framework: str
    exporter: str
    versions: dict[str, str]
    opset: int
    origin: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def make_origin(
    framework: str, exporter: str, opset: int, factory: str | None, kwargs: dict[str, Any] | None
) -> dict[str, Any]:
    """The ``manifest.model["origin"]`` dict (see docs/DESIGN.md)."""
    origin: dict[str, Any] = {"framework": framework, "exporter": exporter, "opset": int(opset)}
    if factory:
        origin["factory"] = factory
        origin["kwargs"] = dict(kwargs or {})
    return origin


ORIGIN_KEY = "anpred.origin"


def write_with_origin(src: Path, dst: Path, origin: dict[str, Any]) -> None:
    """Copy the ONNX file ``src`` to ``dst`` atomically, storing ``origin`` as JSON in the model's
    ``metadata_props`` under ``anpred.origin`` (kept by instrumentation, read by ``anpred map``)."""
    import json

    import onnx

    from anpred.onnx_io import atomic_write_bytes

    model = onnx.load(str(src), load_external_data=False)
    props = [p for p in model.metadata_props if p.key != ORIGIN_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    e = model.metadata_props.add()
    e.key, e.value = ORIGIN_KEY, json.dumps(origin, sort_keys=True)
    atomic_write_bytes(Path(dst), model.SerializeToString())


def read_origin(model) -> dict[str, Any] | None:
    """The ``anpred.origin`` dict stored in an ONNX ``ModelProto`` by the exporters, or None."""
    import json

    for p in model.metadata_props:
        if p.key == ORIGIN_KEY:
            try:
                return json.loads(p.value)
            except json.JSONDecodeError:
                return None
    return None


def framework_of(model) -> str:
    """The framework of a native model object, read from its class hierarchy (no framework is
    imported): ``"torch"`` for a ``torch.nn.Module``, ``"tf"`` for a Keras object (a ``keras`` /
    ``tf_keras`` class, e.g. a ``keras.Model``), ``"unknown"`` otherwise."""
    mods = type(model).__mro__
    names = {f"{c.__module__}.{c.__qualname__}" for c in mods}
    if "torch.nn.modules.module.Module" in names:
        return "torch"
    if any(n.startswith(("keras.", "tf_keras.", "keras.src.")) and n.endswith("Model") for n in names) or any(
        c.__module__.startswith(("keras", "tf_keras")) for c in mods
    ):
        return "tf"
    return "unknown"


def load_factory(spec: str, kwargs: dict[str, Any] | None = None):
    """Import ``module:function`` and call it with ``kwargs``; it must return ``(model, example_inputs)``
    (``example_inputs``: a tuple of tensors/arrays, NCHW for torch, NHWC for Keras).

    Raises:
        ExportError: malformed spec, import failure, missing function, the factory itself raised (the
            message names the factory and the error; the cause is chained), or a wrong return value.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ExportError(f"factory {spec!r} is not of the form 'module:function'")
    mod_name, fn_name = spec.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as err:
        raise ExportError(f"factory {spec!r}: cannot import module {mod_name!r}: {err}") from err
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ExportError(f"factory {spec!r}: module {mod_name!r} has no callable {fn_name!r}")
    try:
        out = fn(**dict(kwargs or {}))
    except Exception as err:  # any error of user code: one line naming the factory, the cause chained
        first = (str(err).strip().splitlines() or [""])[0]
        raise ExportError(
            f"factory {spec!r} raised {type(err).__name__} when called with {dict(kwargs or {})}: {first}"
        ) from err
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ExportError(f"factory {spec!r} must return (model, example_inputs), got {type(out).__name__}")
    model, example = out
    if not isinstance(example, (tuple, list)):
        example = (example,)
    return model, tuple(example)


@contextlib.contextmanager
def export_folder(kind: str, key: str, build, cache: bool = True):
    """Run ``build(folder)`` (an export writing ``folder/model.onnx``) through the content-addressed
    cache (``anpred.cache``, ``kind``/``key``) or, with ``cache=False``, into a temporary folder removed
    on exit. Yields ``(folder, hit, seconds)``: ``hit`` when the cache held it, ``seconds`` the export
    time (0 on a hit). A failed build leaves nothing behind."""
    import shutil
    import tempfile
    import time

    from anpred.cache import cache_root, cached_dir

    t0 = time.perf_counter()
    if cache:
        hit = (cache_root() / kind / key).is_dir()
        folder = cached_dir(kind, key, build)
    else:
        hit = False
        folder = Path(tempfile.mkdtemp(prefix="anpred-export-"))
        try:
            build(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    try:
        yield folder, hit, 0.0 if hit else time.perf_counter() - t0
    finally:
        if not cache:
            shutil.rmtree(folder, ignore_errors=True)
