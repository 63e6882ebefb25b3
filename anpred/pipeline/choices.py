"""What the one-shot pipeline chooses when the user does not, and the checks of what the user chose.

- backends: :data:`QUICK_FP32` (the quick fp32 set) for every model plus the native one of its origin
  framework (:data:`NATIVE_BACKEND`, :func:`default_backends`); the full set and the precision
  populations on request (:data:`ALL_FP32`, :data:`POPULATIONS`); a given list is validated
  (:func:`parse_backend_list`) and a native backend must fit the model (:func:`check_native_backends`);
- samples: :data:`DEFAULT_SAMPLES`; input size of dynamic dimensions: :data:`DEFAULT_IMGSZ`;
- the options of :func:`anpred.pipeline.test` are checked before any work (:func:`check_test_options`):
  a bad option raises and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from anpred.errors import AnpredError, BackendError, InputError, OutputPathError

__all__ = [
    "ONNX_BACKENDS",
    "QUICK_FP32",
    "ALL_FP32",
    "ARBITER_BACKEND",
    "POPULATIONS",
    "FULL_BACKENDS",
    "NATIVE_BACKEND",
    "DEFAULT_SAMPLES",
    "DEFAULT_IMGSZ",
    "default_backends",
    "parse_backend_list",
    "check_native_backends",
    "check_test_options",
]

#: The fp32 voters ``anpred test`` runs by default: the five cheapest independent kernel libraries
#: (docs/run.md, "The default set is chosen by measured cost"; ``benchmarks/bench_demo.py``); ``tvm``
#: (TVM's compilation) and ``tf`` (onnx2tf, which ``litert`` shares) cost several times more. The others
#: are one flag away (``--all``) or witnesses.
QUICK_FP32: tuple[str, ...] = ("ort", "openvino", "torch", "mnn", "ncnn")
#: Every independent fp32 family that runs any ONNX model (``--all``; ``onnx-reference`` left out for
#: its cost and ``mnn-winograd`` for its larger rounding error; both can be named).
ALL_FP32: tuple[str, ...] = ("ort", "openvino", "torch", "tf", "tvm", "mnn", "ncnn", "litert")
#: The reduced-precision populations (``--precision fp16,int8``): each runs ONE converted model, cached,
#: on three families, so that each member is also judged against its own population (docs/oracle.md).
#: The fp16 population leaves out ``onnx-reference-fp16`` (numpy float16: the slowest member), the int8
#: one keeps ``onnx-reference-int8`` (its third family, though numpy too; docs/run.md, 'Measurements:
#: numpy reference members').
POPULATIONS: dict[str, tuple[str, ...]] = {
    "fp16": ("ort-fp16", "ort-fp16-noopt", "openvino-fp16", "torch-fp16"),
    "int8": ("ort-int8", "ort-int8-noopt", "openvino-int8", "onnx-reference-int8"),
}
#: Backends that run any ONNX model by default, in run order (the quick fp32 set).
ONNX_BACKENDS: tuple[str, ...] = QUICK_FP32
#: The float64 execution (the arbiter of split votes, docs/oracle.md): part of the full set (``--all``)
#: so that a vote split between families is decided by the truth, not left a tie.
ARBITER_BACKEND = "onnx-reference-fp64"
#: The full set (``--all``): every fp32 family, the float64 execution, then both populations.
FULL_BACKENDS: tuple[str, ...] = ALL_FP32 + (ARBITER_BACKEND,) + POPULATIONS["fp16"] + POPULATIONS["int8"]
#: The native backend of each origin framework.
NATIVE_BACKEND = {"torch": "torch-native", "tf": "tf-native"}
#: Samples per test when ``samples`` is not given.
DEFAULT_SAMPLES = 3
#: The size given to dynamic input dimensions (neither a zoo size nor ``imgsz``).
DEFAULT_IMGSZ = 640


def default_backends(framework: str, precision: Iterable[str] = (), all_backends: bool = False) -> list[str]:
    """The backends that apply to a model of origin ``framework`` (``onnx`` | ``torch`` | ``tf``):
    :data:`QUICK_FP32` (:data:`ALL_FP32` and :data:`ARBITER_BACKEND` with ``all_backends``), the native one
    (:data:`NATIVE_BACKEND`) after the fp32 voters, then the populations of ``precision`` (both with
    ``all_backends``; :data:`POPULATIONS`).

    Raises:
        AnpredError: an unknown precision."""
    out = list(ALL_FP32) + [ARBITER_BACKEND] if all_backends else list(QUICK_FP32)
    if framework in NATIVE_BACKEND:
        out.append(NATIVE_BACKEND[framework])
    for p in tuple(POPULATIONS) if all_backends else tuple(precision):
        if p not in POPULATIONS:
            raise AnpredError(f"unknown precision {p!r}; known: {', '.join(POPULATIONS)}")
        out.extend(b for b in POPULATIONS[p] if b not in out)
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
        raise BackendError(
            f"one backend ({names[0]}) cannot be judged: the oracle compares backends with each "
            "other; give two or more (e.g. --backends ort,openvino)"
        )
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
        raise BackendError(
            f"backend {b} needs a model of {'PyTorch' if fw == 'torch' else 'Keras'} origin; "
            f"{label}: {why}; nothing was written"
        )


def check_test_options(opts) -> list[str] | None:
    """Check the options of :func:`anpred.pipeline.test` (a :class:`anpred.options.TestOptions`)
    before any work; returns the backend list (:func:`parse_backend_list`; None: the defaults).

    Raises:
        AnpredError: a bad judge or run option (:meth:`anpred.options.JudgeOptions.validate`,
        :meth:`anpred.options.RunOptions.validate`), ``stages`` < 1; InputError: ``samples`` < 1,
        ``inputs`` that do not exist, malformed ``input_shapes``; BackendError: see
        :func:`parse_backend_list`; OutputPathError: a ``history`` database whose folder does not exist.
    """
    opts.judge.validate()
    opts.run.validate()
    samples, stages, inputs = opts.feed.samples, opts.build.stages, opts.feed.inputs
    if samples is not None and samples < 1:
        raise InputError(f"samples must be at least 1 (got {samples})")
    if stages is not None and stages < 1:
        raise AnpredError(f"stages must be at least 1 (got {stages})")
    names = parse_backend_list(opts.run.backends)
    if inputs is not None and not str(inputs).startswith("random:") and not Path(inputs).exists():
        raise InputError(f"inputs {inputs}: no such file or folder")
    if opts.feed.input_shapes is not None:
        from anpred.options import parse_input_shapes

        opts.feed.input_shapes = parse_input_shapes(opts.feed.input_shapes)
    history = opts.output.history
    if history is not None and not Path(history).absolute().parent.is_dir():
        raise OutputPathError(f"{history}: folder {Path(history).absolute().parent} does not exist")
    return names
