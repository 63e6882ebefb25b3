"""Import shims: packages that declare torchvision (which must not be installed here: no
torchvision build works beside CPU torch 2.13, docs/run.md "Install"), and the TOML reader of
Python 3.10 (:func:`toml_reader`, :func:`own_process_group`).

- onnx2torch imports torchvision at import time only for its NMS/RoiAlign converters: a stub module is
  placed in ``sys.modules`` while importing it and removed afterwards.
- ultralytics asks ``importlib.metadata.version("torchvision")`` at import: that one call is answered.
  ``YOLO_AUTOINSTALL=false`` and a writable ``YOLO_CONFIG_DIR`` keep it offline.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import tempfile
import types


@contextlib.contextmanager
def _torchvision_stub():
    if "torchvision" in sys.modules:
        yield
        return
    stub = types.ModuleType("torchvision")
    stub.__version__ = "0.0.0+anpred-stub"
    ops = types.ModuleType("torchvision.ops")

    def _missing(*a, **k):
        raise RuntimeError("torchvision is not installed (ANPRED runs without it); NMS/RoIAlign unavailable")

    ops.nms = ops.roi_align = ops.batched_nms = _missing
    stub.ops = ops
    sys.modules["torchvision"] = stub
    sys.modules["torchvision.ops"] = ops
    try:
        yield
    finally:
        sys.modules.pop("torchvision", None)
        sys.modules.pop("torchvision.ops", None)


def import_onnx2torch_bare():
    """Import and return the ``onnx2torch`` module without torchvision, its registry as onnx2torch
    ships it (:func:`anpred.backends.torch_converters.import_onnx2torch` adds ANPRED's converters)."""
    if "onnx2torch" not in sys.modules:
        with _torchvision_stub():
            importlib.import_module("onnx2torch")
    return sys.modules["onnx2torch"]


_real_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "torchvision":
        return "0.28.0"  # the release paired with torch 2.13; only the version is asked
    return _real_version(name)


def import_ultralytics():
    """Import and return ``ultralytics`` offline and without torchvision."""
    if "ultralytics" in sys.modules:
        return sys.modules["ultralytics"]
    os.environ.setdefault("YOLO_AUTOINSTALL", "false")
    os.environ.setdefault("YOLO_OFFLINE", "true")
    if "YOLO_CONFIG_DIR" not in os.environ:
        d = os.path.join(tempfile.gettempdir(), "anpred-yolo-config")
        os.makedirs(d, exist_ok=True)
        os.environ["YOLO_CONFIG_DIR"] = d
    importlib.metadata.version = _version
    try:
        with _torchvision_stub():
            return importlib.import_module("ultralytics")
    finally:
        importlib.metadata.version = _real_version


def toml_reader():
    """The TOML reader module: the standard library's ``tomllib`` (Python 3.11+), else ``tomli``, its
    backport (a core dependency on Python 3.10); both have ``loads`` and ``TOMLDecodeError``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib


def own_process_group() -> dict:
    """The ``subprocess.Popen`` keyword that puts the child in a process group of its own inside this
    session: ``process_group=0`` (Python 3.11+), else ``preexec_fn=os.setpgrp`` (Python 3.10)."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}
