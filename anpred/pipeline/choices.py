"""What the one-shot pipeline chooses when the user does not, and the checks of what the user chose.

- backends: :data:`ONNX_BACKENDS` for every model plus the native one of its origin framework
  (:data:`NATIVE_BACKEND`, :func:`default_backends`); a given list is validated
  (:func:`parse_backend_list`) and a native backend must fit the model (:func:`check_native_backends`);
- samples: :data:`DEFAULT_SAMPLES`; input size of dynamic dimensions: :data:`DEFAULT_IMGSZ`;
- the options of :func:`anpred.pipeline.test` are checked before any work (:func:`check_test_options`):
  a bad option raises and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from anpred.errors import AnpredError, BackendError, InputError, OutputPathError

__all__ = ["ONNX_BACKENDS", "NATIVE_BACKEND", "DEFAULT_SAMPLES", "DEFAULT_IMGSZ", "default_backends",
           "parse_backend_list", "check_native_backends", "check_test_options"]

#: Backends that run any ONNX model, in run order (fp32 voters first: eight families, independent
#: kernel libraries, docs/backends-converters.md; ``onnx-reference`` left out for its cost and
#: ``mnn-winograd`` for its larger rounding error; then the reduced-precision
#: populations: each runs ONE converted model, cached, on three families, so that each member is also
#: judged against its own population (docs/oracle.md). The fp16 population leaves out
#: ``onnx-reference-fp16`` (numpy float16: ~100x ORT's time per sample), the int8 one keeps
#: ``onnx-reference-int8`` (its third family; ~70x ORT's time per sample, measured on yolov8n 320).
ONNX_BACKENDS: tuple[str, ...] = ("ort", "openvino", "torch", "tf", "tvm", "mnn", "ncnn", "litert",
                                  "ort-fp16", "ort-fp16-noopt", "openvino-fp16", "torch-fp16",
                                  "ort-int8", "ort-int8-noopt", "openvino-int8", "onnx-reference-int8")
#: The native backend of each origin framework.
NATIVE_BACKEND = {"torch": "torch-native", "tf": "tf-native"}
#: Samples per test when ``samples`` is not given.
DEFAULT_SAMPLES = 3
#: The size given to dynamic input dimensions (neither a zoo size nor ``imgsz``).
DEFAULT_IMGSZ = 640


def default_backends(framework: str) -> list[str]:
    """The backends that apply to a model of origin ``framework`` (``onnx`` | ``torch`` | ``tf``):
    :data:`ONNX_BACKENDS` plus the native one (:data:`NATIVE_BACKEND`) inserted after the fp32
    voters."""
    out = list(ONNX_BACKENDS)
    if framework in NATIVE_BACKEND:
        out.insert(out.index("ort-fp16"), NATIVE_BACKEND[framework])
    return out


def parse_backend_list(backends: Iterable[str] | str | None) -> list[str] | None:
    """Validate a backend list (a list or a comma-separated string; None: the defaults).

    Raises:
        BackendError: an empty entry (``ort,,openvino``), an unknown or repeated name, or fewer than
            two backends (the consensus and the threshold baseline both compare backends with each
            other: one backend alone cannot be judged).
    """
    from anpred.backends import REGISTRY

    if backends is None:
        return None
    given = str(backends) if isinstance(backends, str) else ",".join(str(b) for b in backends)
    names = [b.strip() for b in given.split(",")]
    if not given.strip():
        raise BackendError("no backend given; known backends: " + ", ".join(REGISTRY))
    if any(not b for b in names):
        raise BackendError(f"empty entry in the backend list {given!r}; known backends: {', '.join(REGISTRY)}")
    for b in names:
        if b not in REGISTRY:
            raise BackendError(f"unknown backend {b!r}; known backends: {', '.join(REGISTRY)}")
    dup = sorted({b for b in names if names.count(b) > 1})
    if dup:
        raise BackendError(f"backend {', '.join(dup)} given twice in {given!r}")
    if len(names) < 2:
        raise BackendError(f"one backend ({names[0]}) cannot be judged: the oracle compares backends with each "
                           "other; give two or more (e.g. --backends ort,openvino)")
    return names


def check_native_backends(names: Iterable[str] | None, framework: str, label: str, kind: str) -> None:
    """Refuse a native backend that does not fit the model, before any export or instrumentation.

    Args:
        names: the backends asked for (None: the defaults, always fitting).
        framework: the model's origin framework (``onnx`` | ``torch`` | ``tf``).
        label: the model's name in the message; kind: ``onnx`` (a file), ``zoo`` or ``factory``.

    Raises:
        BackendError: ``torch-native`` for a model that is not of PyTorch origin, ``tf-native`` for
            one not of Keras origin; the message says what the model is and which native backend fits.
    """
    for b, fw in (("torch-native", "torch"), ("tf-native", "tf")):
        if names is None or b not in names or framework == fw:
            continue
        if framework in NATIVE_BACKEND:
            what = {"torch": "PyTorch", "tf": "Keras"}[framework]
            why = f"it is of {what} origin: its native framework is {framework} (use {NATIVE_BACKEND[framework]})"
        elif kind == "zoo":
            why = "it is a shipped ONNX model without a native factory"
        elif kind == "factory":
            why = "its factory returns neither a torch.nn.Module nor a keras.Model"
        else:
            why = "it is a .onnx without a native factory (no anpred.origin metadata naming one)"
        raise BackendError(f"backend {b} needs a model of {'PyTorch' if fw == 'torch' else 'Keras'} origin; "
                           f"{label}: {why}; nothing was written")


def check_test_options(*, oracle: str, samples: int | None, stages: int | None,
                       backends: Iterable[str] | str | None, inputs: str | None,
                       config: str | Path | None, history: str | Path | None) -> list[str] | None:
    """Check the options of :func:`anpred.pipeline.test` before any work; returns the backend list
    (:func:`parse_backend_list`).

    Raises:
        AnpredError: an unknown oracle, ``stages`` < 1, a bad config file; InputError: ``samples`` < 1,
        ``inputs`` that do not exist; BackendError: see :func:`parse_backend_list`; OutputPathError:
        a ``history`` database whose folder does not exist.
    """
    from anpred.judge import ORACLES

    if oracle not in ORACLES:
        raise AnpredError(f"unknown oracle {oracle!r}; known: {', '.join(ORACLES)}")
    if samples is not None and samples < 1:
        raise InputError(f"samples must be at least 1 (got {samples})")
    if stages is not None and stages < 1:
        raise AnpredError(f"stages must be at least 1 (got {stages})")
    names = parse_backend_list(backends)
    if inputs is not None and not str(inputs).startswith("random:") and not Path(inputs).exists():
        raise InputError(f"inputs {inputs}: no such file or folder")
    if config is not None:
        from anpred.defaults import load_config

        load_config(config)  # a bad config is bad input: fail before any work
    if history is not None and not Path(history).absolute().parent.is_dir():
        raise OutputPathError(f"{history}: folder {Path(history).absolute().parent} does not exist")
    return names
