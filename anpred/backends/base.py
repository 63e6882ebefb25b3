r"""The backend interface, after Polygraphy's runners: a context manager whose public methods
validate and then call an ``_impl`` that subclasses override (one place for checks).

A backend is constructed with options, ``prepare``\ d once for an anchored model (loading, converting,
compiling: timed separately), then ``run`` per sample. ``run`` returns the anchor tensors in the
backend's *own* representation (e.g. NHWC for TensorFlow, float16 for a fp16 model); alignment to the
ONNX canonical form happens later (``anpred.align``), driven by :meth:`anchor_info`.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from anpred.manifest import AnchorManifest


@dataclass
class AnchorCapture:
    """How a backend represents (or fails to capture) one anchor.

    status: ``exact`` (same tensor), ``equivalent`` (same values after ``transform``), ``missing``,
        ``unverified`` (mapped, but the mapping could not be checked: e.g. a converted module whose result
        structure a probe run could not see).
    layout: the layout the backend returns 4-D/3-D/5-D tensors in (``NCHW``/``NHWC``/...), when known.
    transform: a known rule for alignment, e.g. ``{"permute": [0, 3, 1, 2]}``; None when identity.
    reason: why it is missing (or how it was matched).
    """

    status: str = "exact"
    layout: str | None = None
    transform: dict[str, Any] | None = None
    target: str | None = None  # native tensor/module/layer name
    reason: str = ""


@dataclass
class BackendStatus:
    """What happened to one backend in a run (stored in ``run.json``)."""

    name: str
    family: str
    status: str = "pending"  # ok | failed | unsupported | crashed | timeout | pending
    reason: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    precision: str = "fp32"  # effective inference precision read back from the runtime
    precision_requested: str = ""  # the backend's nominal precision (what was asked); "" in older runs
    samples: int = 0
    anchors_captured: int = 0
    captures: dict[str, dict[str, Any]] = field(default_factory=dict)  # anchor -> AnchorCapture dict
    dtypes: dict[str, str] = field(default_factory=dict)  # anchor -> dtype as returned
    seconds_prepare: float = 0.0
    seconds_run: float = 0.0
    # anchor -> quantization step (per-tensor scale of the DequantizeLinear producing it in the QDQ
    # model an int8 population member ran; Backend.quantization_steps); {} otherwise and in older runs
    quant_steps: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BackendStatus":
        return cls(**d)

    @property
    def precision_differs(self) -> bool:
        """True when the backend computed in another precision than it was asked for (e.g. a bf16
        hint compiled to fp32 on a CPU without bf16 instructions)."""
        return bool(self.precision_requested) and self.precision_requested != self.precision


class Backend:
    """Base class of all backends.

    Class attributes:
        name: registry name (``ort``, ``openvino``, ``tf`` ...).
        family: kernel family for consensus voting (``onnxruntime``, ``openvino``, ``torch``,
            ``tensorflow``, ``onnx-reference``); backends of one family share one vote.
        precision: nominal precision (``fp32``, ``fp16``, ``bf16``, ``int8``).
    """

    name: ClassVar[str] = "base"
    family: ClassVar[str] = "base"
    precision: ClassVar[str] = "fp32"
    #: how :meth:`unsupported_ops` knows (e.g. "onnx2torch converter registry"); "" = no static table,
    #: the backend's support is known only once it has converted/compiled the model
    coverage_basis: ClassVar[str] = ""
    #: GPUs one run of this backend needs (a campaign asks Ray for them, :mod:`anpred.campaign`);
    #: 0 for every CPU backend
    gpus: ClassVar[float] = 0.0
    #: whether the backend takes a ``threads`` option and its ``prepare`` applies it as the library's
    #: intra-op thread count: backends run side by side divide the cores among those that do
    #: (:func:`anpred.run.spec.split_threads`). Left False where a fixed default is deliberate (MNN: 1,
    #: its results depend on the thread count) or nothing sets the threads (numpy, TVM, tf-native)
    threads_option: ClassVar[bool] = False
    #: whether the backend's converter needs operator parameters (weights, biases, scales, shapes) as
    #: initializers: graph inputs that feed operators as parameters
    #: (:func:`passes.bind_inputs.weight_inputs`) are then bound to the fed values for it
    #: (:mod:`anpred.conformance`; onnx2torch fails with ``KeyError: 'W'``, onnx2tf with ``IndexError``)
    constant_weights: ClassVar[bool] = False

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        """Pre-run coverage (``anpred test`` asks before running; ``anpred backends`` and
        ``benchmarks/coverage.py`` too): the operators of ``model`` (an ``onnx.ModelProto``, sub-graphs
        included) this backend is known not to run, as ``{op key: reason}`` where the op key is
        ``op_type`` for the default domain and ``domain::op_type`` otherwise (with ``@opset`` when only
        some opset versions are missing). ``{}`` means none is known to be missing: every op found in
        the backend's table, or no table (:attr:`coverage_basis` is then ""). Cheap: no conversion, no
        model compilation; imports the backend's library. Never raises for a well-formed model."""
        return {}

    #: how :meth:`refused_nodes` knows (e.g. "onnx2torch's converters called on each node"); "" = it
    #: is not asked below the operator name
    node_basis: ClassVar[str] = ""

    @classmethod
    def refused_nodes(cls, model) -> dict[str, str]:
        """Pre-run coverage below the operator name: the nodes and inputs of ``model`` (an
        ``onnx.ModelProto`` with its weights) this backend's converter or input rule refuses for their
        attributes, dtypes or shapes, as ``{key: reason}`` (key: the op key as in
        :meth:`unsupported_ops`, or ``input <name>``; the reason names the converter and the nodes).
        Asked of the converter itself where it can be (:mod:`anpred.backends.converter_probe`), never a
        hand-kept table. ``{}``: none known (:attr:`node_basis` "" means not asked). Never raises for a
        well-formed model."""
        return {}

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = dict(options or {})
        self.manifest: AnchorManifest | None = None
        self._prepared = False

    # ---- public API (validate, then _impl) ---------------------------------------------------
    def versions(self) -> dict[str, str]:
        """Library versions this backend's results depend on, e.g. ``{"onnxruntime": "1.32.0"}``. A
        library imported from outside this Python's prefix (a runtime version put first on
        ``PYTHONPATH``, :mod:`anpred.campaign.envs`) adds ``"<name> from": <its folder>``."""
        import sys

        out = {"python": platform.python_version(), **self._versions_impl()}
        for name in list(out):
            mod = sys.modules.get(name.replace("-", "_"))
            where = str(Path(getattr(mod, "__file__", None) or "").parent) if mod is not None else ""
            if where not in ("", ".") and not Path(where).resolve().is_relative_to(Path(sys.prefix).resolve()):
                out[f"{name} from"] = where
        return out

    def prepare(self, model_path: str | Path, manifest: AnchorManifest, workdir: str | Path) -> None:
        """Load/convert/compile the anchored model at ``model_path`` (``workdir``: scratch space and
        conversion cache). Raises :class:`anpred.errors.BackendError` with a reason on failure."""
        self.manifest = manifest
        Path(workdir).mkdir(parents=True, exist_ok=True)
        self._prepare_impl(Path(model_path), manifest, Path(workdir))
        self._prepared = True

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one sample. ``inputs``: graph input name -> array (ONNX layout and dtype). Returns
        anchor name -> array for every anchor captured (missing ones are described by
        :meth:`anchor_info`)."""
        if not self._prepared:
            raise RuntimeError(f"backend {self.name}: run() before prepare()")
        return self._run_impl(inputs)

    def anchor_info(self) -> dict[str, AnchorCapture]:
        """Per anchor, how this backend captures it (after ``prepare``)."""
        assert self.manifest is not None
        return {a.name: AnchorCapture(status="exact", layout=a.layout) for a in self.manifest.anchors}

    def effective_precision(self) -> str:
        """The inference precision read back from the runtime after ``prepare`` (default nominal)."""
        return self.precision

    def quantization_steps(self) -> dict[str, float]:
        """Per anchor, the quantization step (scale) of its tensor in the quantized model this backend
        runs (after ``prepare``): ``{anchor name: scale}``; empty for backends that run no quantized
        model (see :func:`anpred.backends.lowp_models.anchor_quant_steps`)."""
        return {}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- to override ------------------------------------------------------------------------
    def _versions_impl(self) -> dict[str, str]:
        return {}

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        raise NotImplementedError

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError
