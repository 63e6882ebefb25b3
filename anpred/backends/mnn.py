"""Backends ``mnn`` and ``mnn-winograd`` (family ``mnn``): the anchored ONNX model converted by Alibaba
MNN's converter (``MNNConvert``) and run on MNN's CPU backend through its Python Module API.

Conversion (cached with :func:`anpred.cache.cached_dir` under ``mnn/<key>``, key = sha256 of the model
file + MNN version + the converter arguments + :data:`FORMAT`): the wheel's ``mnnconvert`` is the C++
converter behind ``_tools.mnnconvert(argv)``; it is run in a child process
(``python -c "import _tools; _tools.mnnconvert(...)"``) whose output is kept as ``convert.log``. The
wheel's ``mnnconvert`` *script* is not used: after converting it imports ``MNN.tools.utils.log``, which
runs ``pip install aliyun-log-python-sdk`` when that package is missing and uploads usage logs.
Before converting, :func:`anpred.backends.mnn_prepare.prepare_for_mnn` makes one-element constants of
elementwise binary ops scalars (exact; it avoids an MNN 3.6.1 defect described there: such a constant
as first operand next to a convolution's output gave scrambled values); what it rewrote is kept in the
cache folder's ``prepared.json``. Arguments: ``-f ONNX --modelFile M.onnx --MNNModel model.mnn --bizCode anpred`` plus
``--useGeluApproximation 0`` (the converter otherwise rewrites the erf form of GELU into its tanh
approximation: ``FuseTemplateOp.cpp``, default ``useGeluApproximation = true`` in ``config.hpp``) and
``--alignDenormalizedValue 0`` (it otherwise flushes denormal weights to zero). Inputs keep their
ONNX layout (``--keepInputFormat``, true by default). The converter signals failure by printing
"Converted Failed!" without a file (its return value stays true); unsupported operators are printed as
"These Op Not Support: ONNX::<op>" and become a :class:`~anpred.errors.BackendError` naming them.

Running: ``MNN.nn.create_runtime_manager`` with ``{"backend": "CPU", "precision": 1, "numThread": n}``
(1 = ``BackendConfig::Precision_High``; passed as an integer so the binding prints nothing), then
``MNN.nn.load_module_from_file(path, input names, output names, runtime_manager=...)``; inputs are
``MNN.expr.const`` variables in ``NCHW`` (ONNX) format.

Kernels (MNN 3.6.1, ``source/backend/cpu``): on x86-64 MNN picks its kernels by cpuid at load
(``x86_x64/FunctionDispatcher.cpp``: libyuv's CPU flags): with AVX2 it creates an ``AVX2Backend``
whose core functions pack 8 floats (AVX2, FMA where present) or 16 (any AVX-512 BW/VL/VNNI/VBMI
flag: ``AVX2Functions.cpp``), else SSE kernels; ``versions()["mnn_cpu_kernels"]`` records which, as
derived from this process's cpuid (numpy's dispatcher table). All arithmetic is fp32 on x86: fp16
arithmetic exists only in MNN's ARMv8.2 backend and bf16 only in builds with ``MNN_SUPPORT_BF16`` under
``Precision_Low_BF16``; the ``AVX2Backend`` labels itself ``Precision_Low`` whatever is asked
(``AVX2Backend.cpp``), which on x86 only selects ``MNNSigmoidLowp``/``MNNSiLuLowp``, the same code
as the normal variants outside NEON builds. Convolutions: 1x1 through ``Convolution1x1Strassen`` (a
packed GEMM, with Strassen recursion only where MNN's cost model finds it cheaper), others through
``DenseConvolutionTiledExecutor`` (im2col + packed GEMM) or Winograd:

- ``mnn``: Winograd off (``RuntimeManager.set_hint(WINOGRAD_MEMORY_LEVEL=3, 0)``; with 0,
  ``ConvolutionFloatFactory.cpp`` never creates a Winograd executor): every anchor then agrees with
  ONNX Runtime as closely as TVM's do (docs/backends-converters.md, 'Measurements: MNN Winograd');
- ``mnn-winograd``: MNN's default (level 3): 3x3 stride-1 convolutions run as Winograd F(n, 3) with
  the unit MNN's cost model picks (it depends on the thread count and shapes;
  ``ConvolutionPackFreeWinograd`` with AVX-512, ``ConvolutionPackWinograd`` otherwise). Its fp32
  rounding error is a multiple of the direct convolution's (same section): a variant, one vote with
  ``mnn``.

``versions()`` records ``mnn``, ``mnn_precision`` (``Precision_High`` asked), ``mnn_winograd``,
``mnn_threads``, ``mnn_cpu_kernels`` and ``mnn_device`` (the line MNN prints about the CPU at import,
which is kept out of stdout: :func:`import_mnn`). MNN is its own code base (no ONNX Runtime, OpenVINO,
PyTorch or TensorFlow kernels): family ``mnn``.

Options: ``threads`` (MNN's ``numThread``; default 1: the Winograd unit and the GEMM tiling depend on
it, and measured on YOLOv8n the results with 2 or 4 threads differ from 1 thread's even with Winograd
off, so a fixed 1 keeps the results independent of the machine's core count).

Anchors: graph outputs of the anchored model, passed to ``load_module_from_file`` as output names
(matched like ONNX Runtime's, :func:`anpred.backends.ort.output_anchor_map`). MNN keeps 4-D
activations in its packed ``NC4HW4`` layout internally; an output variable whose ``data_format`` is
not ``NCHW`` is converted with ``MNN.expr.convert(v, NCHW)`` before ``read()``, so every array comes
back in the ONNX layout (``anchor_info`` reports the format MNN returned). Dtypes: MNN computes
int64 tensors as int32 and bools as int32; results are cast back to the graph's dtype where every
value survives (:func:`anpred.backends.native_io.as_declared`). Integer inputs are fed as int32
(``MNN.expr.int``) after a range check, uint8 as uint8, floating ones as float32.

Coverage (:meth:`MnnBackend.unsupported_ops`): the converter's own list of ONNX operators
(``mnnconvert -f ONNX --OP``), matched by op type (the ONNX front end looks converters up by type).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.native_io import as_declared, check_sample, graph_inputs
from anpred.backends.ort import output_anchor_map
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest
from anpred.onnx_io import model_ops
from anpred.tensorfile import c_contiguous

# 2: one-element constants of binary ops made scalars (anpred.backends.mnn_prepare); 3: unsupported recurrent variants
# unrolled
FORMAT = "anpred.mnn/3"
CONVERTER_ARGS = ("--useGeluApproximation", "0", "--alignDenormalizedValue", "0")
PRECISION_HIGH = 1  # MNN::BackendConfig::Precision_High (MNNForwardType.h: Normal 0, High 1, Low 2, Low_BF16 3)
WINOGRAD_MEMORY_LEVEL = 3  # MNN::Interpreter::HintMode (Interpreter.hpp)
_CONVERT = "import sys, _tools; _tools.mnnconvert(sys.argv[1:])"
_DEVICE_LINE = ""


@contextlib.contextmanager
def _stdout_fd_to(path: Path):
    """Send file descriptor 1 (C ``printf`` included) to ``path`` for the duration; the C library's
    buffers are flushed before it is restored."""
    import ctypes

    sys.stdout.flush()
    saved = os.dup(1)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 1)
    try:
        yield
    finally:
        try:
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
        os.dup2(saved, 1)
        os.close(saved)


def import_mnn():
    """``import MNN`` with the line its engine prints at load ("The device supports: i8sdot:0, ...")
    kept out of stdout (stdout of a CLI command may be JSON); the line is returned by
    :func:`device_line`. Returns the ``MNN`` module."""
    global _DEVICE_LINE
    if "MNN" in sys.modules:
        return sys.modules["MNN"]
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "mnn-import.log"
        with _stdout_fd_to(log):
            import MNN
        _DEVICE_LINE = " | ".join(ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip())
    return MNN


def device_line() -> str:
    """What MNN printed about the CPU when :func:`import_mnn` loaded it ("" if imported elsewhere)."""
    return _DEVICE_LINE


@lru_cache(maxsize=1)
def converter_ops() -> frozenset[str] | None:
    """The ONNX op types MNN's converter supports, from ``mnnconvert -f ONNX --OP`` (run in a child
    process); None when the list cannot be read."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", _CONVERT, "mnnconvert", "-f", "ONNX", "--OP"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    if "Dump ONNX support Ops" not in lines:
        return None
    ops = lines[lines.index("Dump ONNX support Ops") + 1 :]
    return frozenset(ln for ln in ops if ln and not ln.startswith("Total:"))


def cpu_kernels() -> str:
    """The x86 kernel set MNN 3.6.1 dispatches to on this CPU (``FunctionDispatcher.cpp``,
    ``AVX2Functions.cpp``), from cpuid as numpy probed it: ``avx512 (pack 16)``, ``avx2+fma (pack 8)``,
    ``avx2 (pack 8)``, ``sse``; ``non-x86`` elsewhere."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "non-x86"
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:
        return "unknown"
    if not feats.get("AVX2"):
        return "sse"
    avx512 = ("AVX512VNNI", "AVX512VL", "AVX512BW", "AVX512VBMI", "AVX512BITALG", "AVX512VPOPCNTDQ", "AVX512VBMI2")
    if any(feats.get(f) for f in avx512):
        return "avx512 (pack 16)"
    return "avx2+fma (pack 8)" if feats.get("FMA3") else "avx2 (pack 8)"


class MnnBackend(Backend):
    """MNN 3.x CPU backend, fp32 (``Precision_High``), Winograd off (module docstring).

    Options:
        threads (int): MNN ``numThread`` (default 1).
    """

    name = "mnn"
    family = "mnn"
    precision = "fp32"
    coverage_basis = "MNN converter's ONNX op list (mnnconvert -f ONNX --OP)"
    winograd = False

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        ops = converter_ops()
        if ops is None:
            return {}
        from importlib import metadata

        version = metadata.version("mnn")
        return {
            key: f"not in MNN {version}'s ONNX converter op list (mnnconvert --OP)"
            for key, (_d, op_type, _v) in model_ops(model).items()
            if op_type not in ops
        }

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self._module = None
        self._rt = None
        self._captures: dict[str, AnchorCapture] = {}
        self._formats: dict[str, str] = {}
        self._casts: dict[str, str] = {}
        self.cache_dir: Path | None = None
        self.cache_hit = False
        self.seconds_convert = 0.0
        self.threads = int(self.options.get("threads") or 1)

    def _versions_impl(self) -> dict[str, str]:
        MNN = import_mnn()
        return {
            "mnn": MNN.version(),
            "mnn_precision": "Precision_High",
            "mnn_winograd": (
                "on (WINOGRAD_MEMORY_LEVEL 3, MNN's default)" if self.winograd else "off (WINOGRAD_MEMORY_LEVEL 0)"
            ),
            "mnn_threads": str(self.threads),
            "mnn_cpu_kernels": cpu_kernels(),
            "mnn_device": device_line(),
        }

    # ---- conversion ------------------------------------------------------------------------
    def _convert(self, model_path: Path, out: Path) -> None:
        dst = out / "model.mnn"
        src_name = Path(model_path).name
        model_path = _prepared_copy(model_path, out)
        cmd = [
            sys.executable,
            "-c",
            _CONVERT,
            "mnnconvert",
            "-f",
            "ONNX",
            "--modelFile",
            str(model_path),
            "--MNNModel",
            str(dst),
            "--bizCode",
            "anpred",
            *CONVERTER_ARGS,
        ]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(
                cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL, cwd=str(out)
            )
        except subprocess.TimeoutExpired as err:
            raise BackendError(f"mnn: mnnconvert did not finish within {err.timeout:g} s") from err
        log = (r.stdout or "") + (r.stderr or "")
        (out / "convert.log").write_text(log)
        failed = not dst.is_file() or "Converted Failed" in log or r.returncode != 0
        missing = _unsupported(log) if failed else []
        if failed and missing and set(missing) <= RECURRENT and not (out / "unrolled.json").exists():
            # MNN's converter lacks this recurrent variant (peepholes, clip, activations ...): run it as the
            # elementary ops it is made of (passes.recurrent), once, and say so in unrolled.json
            unrolled = _unrolled_copy(model_path, out)
            if unrolled is not None:
                return self._convert(unrolled, out)
        if failed:
            raise BackendError(f"mnn: mnnconvert failed on {src_name}: {_converter_error(log, r.returncode)}")
        for f in ("prepared.onnx", "prepared.onnx.data", "unrolled.onnx", "unrolled.onnx.data"):  # not needed now
            (out / f).unlink(missing_ok=True)
        (out / "seconds_convert").write_text(f"{time.perf_counter() - t0:.3f}")

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        from importlib import metadata

        from anpred.cache import cache_key, cache_root, cached_dir
        from anpred.onnx_io import load_model

        model = load_model(model_path)
        self._graph = graph_inputs(model)
        outputs = [o.name for o in model.graph.output]
        key = cache_key(Path(model_path), "mnn", metadata.version("mnn"), list(CONVERTER_ARGS), FORMAT)
        self.cache_hit = (cache_root() / "mnn" / key / "model.mnn").is_file()
        t0 = time.perf_counter()
        self.cache_dir = cached_dir("mnn", key, lambda tmp: self._convert(Path(model_path).resolve(), tmp))
        self.seconds_convert = 0.0 if self.cache_hit else time.perf_counter() - t0

        import_mnn()
        import MNN.expr as F
        import MNN.nn as nn

        fetch, self._captures = output_anchor_map(outputs, manifest)
        self._fetch = fetch
        self._outputs = list(fetch)  # the anchored outputs, in graph order
        self._dtypes = {a.name: a.dtype for a in manifest.anchors}
        with tempfile.TemporaryDirectory() as d, _stdout_fd_to(Path(d) / "load.log"):
            self._rt = nn.create_runtime_manager(
                ({"backend": "CPU", "precision": PRECISION_HIGH, "numThread": self.threads},)
            )
            self._rt.set_hint(WINOGRAD_MEMORY_LEVEL, 3 if self.winograd else 0)
            try:
                self._module = nn.load_module_from_file(
                    str(self.cache_dir / "model.mnn"),
                    [g.name for g in self._graph],
                    self._outputs,
                    runtime_manager=self._rt,
                )
            except Exception as err:  # noqa: BLE001 - the binding raises plain Exception
                raise BackendError(f"mnn: MNN cannot load the converted model ({type(err).__name__}: {err})") from err
        if self._module is None:
            raise BackendError("mnn: MNN returned no module for the converted model")
        self._F = F
        for a in manifest.anchors:
            cap = self._captures[a.name]
            if cap.status != "missing":
                cap.reason = "MNN Module output"

    def _feed(self, gi, x: np.ndarray):
        F = self._F
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            return F.const(c_contiguous(x, np.float32), list(x.shape), F.NCHW, F.float)
        if x.dtype == np.uint8:
            return F.const(x, list(x.shape), F.NCHW, F.uint8)
        if x.dtype.kind in "iub":
            y = x.astype(np.int32)
            if not np.array_equal(y, x):
                raise InputError(
                    f"backend mnn: input {gi.name!r}: values outside int32, which MNN computes {x.dtype} tensors in"
                )
            return F.const(c_contiguous(y), list(x.shape), F.NCHW, F.int)
        raise InputError(f"backend mnn: input {gi.name!r} of dtype {x.dtype} cannot be fed to MNN")

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        F = self._F
        arrays = check_sample(self.name, inputs, self._graph, None)
        args = [self._feed(gi, x) for gi, x in zip(self._graph, arrays)]
        outs = self._module.forward(args)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        if len(outs) != len(self._outputs):
            # which value is which output is unknown: none is returned, and each asked output is a missing
            # output the oracle flags as this backend's deviation where the others agree
            for src in self._outputs:
                self._captures[
                    self._fetch[src]
                ].reason = f"MNN returned {len(outs)} outputs for the {len(self._outputs)} asked"
            return {}
        result = {}
        for src, v in zip(self._outputs, outs):
            anchor = self._fetch[src]
            fmt = str(v.data_format).rsplit(".", 1)[-1]
            if v.data_format != F.NCHW:
                v = F.convert(v, F.NCHW)
            y, note = as_declared(np.array(v.read(), copy=True), self._dtypes.get(anchor, ""))
            if anchor not in self._formats:
                self._formats[anchor] = fmt
                cap = self._captures[anchor]
                cap.reason = (
                    f"MNN Module output, returned in {fmt}"
                    + (", converted to NCHW (MNN.expr.convert)" if fmt != "NCHW" else "")
                    + (f"; {note}" if note else "")
                )
            result[anchor] = y
        return result

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._captures)

    def close(self) -> None:
        self._module = None
        self._rt = None


class MnnWinogradBackend(MnnBackend):
    """MNN with its default convolution choice: Winograd for 3x3 stride-1 convolutions where its cost
    model picks it (``WINOGRAD_MEMORY_LEVEL`` 3); fp32. A variant of ``mnn`` (same family, one vote)."""

    name = "mnn-winograd"
    winograd = True


def _prepared_copy(model_path: Path, out: Path) -> Path:
    """``model_path`` after :func:`anpred.backends.mnn_prepare.prepare_for_mnn`: the path itself when the
    step changes nothing, else a rewritten copy ``out/prepared.onnx`` (weights inline, or beside it in
    ``prepared.onnx.data`` above 1.5 GiB); what was rewritten goes to ``out/prepared.json``."""
    import json

    import onnx

    from anpred.backends.mnn_prepare import prepare_for_mnn
    from anpred.onnx_io import load_model

    model = load_model(model_path, load_external=True)
    done = prepare_for_mnn(model)
    if not done["scalar_constants"]:
        return model_path
    dst = out / "prepared.onnx"
    big = model.ByteSize() > 3 << 29
    onnx.save_model(model, str(dst), save_as_external_data=big, location="prepared.onnx.data")
    (out / "prepared.json").write_text(json.dumps(done, indent=1))
    return dst


_NOT_SUPPORTED = re.compile(r"These Op Not Support:\s*(.+)")
RECURRENT = {"LSTM", "GRU", "RNN"}


def _unsupported(log: str) -> list[str]:
    """The op types of mnnconvert's "These Op Not Support: ONNX::LSTM ..." line ([] without one)."""
    m = _NOT_SUPPORTED.search(log)
    return [o.split("::")[-1] for o in re.split(r"[\s|,]+", m.group(1)) if o.strip()] if m else []


def _unrolled_copy(model_path: Path, out: Path) -> Path | None:
    """``out/unrolled.onnx``: ``model_path`` with its recurrent layers unrolled into elementary ops
    (:func:`passes.recurrent.unroll_recurrent`, static sequence lengths only); the unrolled nodes go to
    ``out/unrolled.json``. None when nothing could be unrolled."""
    import json

    import onnx

    from anpred.onnx_io import load_model
    from passes.recurrent import unroll_recurrent

    model = load_model(model_path, load_external=True)
    done = unroll_recurrent(model)["unrolled"]
    (out / "unrolled.json").write_text(json.dumps(done))
    if not done:
        return None
    dst = out / "unrolled.onnx"
    onnx.save_model(model, str(dst), save_as_external_data=model.ByteSize() > 3 << 29, location="unrolled.onnx.data")
    return dst


def _converter_error(log: str, rc: int) -> str:
    """The reason from mnnconvert's log: its "These Op Not Support: ONNX::Mish ..." line as "operators
    not supported: Mish", else its error lines, else the log's last lines."""
    ops = _unsupported(log)
    if ops:
        return f"operators not supported by MNN's ONNX converter: {', '.join(ops)}"
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith("The device supports")]
    errs = [ln for ln in lines if re.search(r"error|fail|not support|abort", ln, re.I)]
    return " | ".join((errs or lines)[-6:])[:800] or f"no message (exit status {rc})"
