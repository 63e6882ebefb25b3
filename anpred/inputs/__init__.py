"""Inputs for a run: image folders, ``.npy``/``.npz`` files, or generated samples.

An :class:`InputSpec` says where samples come from; :meth:`InputSpec.samples` yields them one at a
time (streaming: a folder of 10,000 images never sits in memory), already checked against the
model's graph inputs. The spec's :meth:`~InputSpec.describe` goes into ``run.json`` because the
input distribution changes what a tolerance means.

Text form (CLI ``--inputs`` and :meth:`InputSpec.parse`):

- ``DIR`` — a folder: every image (``.jpg .jpeg .png .bmp .tif .tiff .webp``) and every ``.npy``/
  ``.npz`` file in it, sorted by name, is one sample (or several, see below); other files are ignored.
- ``FILE.npz`` / ``FILE.npy`` / ``FILE.jpg`` — one file.
- ``random:<distribution>[:seed=S][:n=N][:shape=1x3x224x224][:dir=DIR]`` — generated samples with
  ``distribution`` one of ``uniform`` (U[0, 1)), ``normal`` (N(0, 1)) or ``images`` (real photographs,
  by default the two shipped in ``ultralytics/assets``, with a seeded random crop of 50-100 % of the
  area and a random horizontal flip, then the image preprocessing below). Default ``seed=0``, ``n=1``.

Arrays (``.npz`` keys are graph input names; a ``.npy`` feeds a model with one input): an array whose
rank is the input's rank + 1 holds several samples along its first axis. Floating arrays are cast to
the input's floating dtype and integer arrays to its integer dtype; anything else is an
:class:`~anpred.errors.InputError`.

Image preprocessing (``preprocess``), output float32 in the model's layout (NCHW, or NHWC when the last
input dimension is 3 and the second is not), channels RGB:

- ``yolo``: letterbox as in ultralytics (keep aspect ratio, scale to fit, centre, pad with 114), then
  ``x / 255``.
- ``imagenet``: resize to the input size (bilinear), ``(x / 255 - mean) / std`` with mean
  (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225) (torchvision's ImageNet constants).
- ``unit``: resize, ``x / 255``.
- ``auto`` (default): ``yolo`` when the model's name, producer or metadata mentions YOLO/ultralytics,
  else ``imagenet``.

Dynamic dimensions: the first (batch) dimension becomes 1 and other dynamic dimensions become ``size``
(default 640) unless ``shapes``/``shape=`` gives the full shape. A static batch ``B > 1`` for images
takes ``B`` consecutive images per sample (wrapping around).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from anpred.errors import InputError
from anpred.onnx_io import elem_type_name
from anpred.tensorfile import c_contiguous

__all__ = [
    "IMAGE_EXTS",
    "ARRAY_EXTS",
    "input_files",
    "DISTRIBUTIONS",
    "PREPROCESS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LETTERBOX_PAD",
    "ModelInput",
    "model_inputs",
    "default_images_dir",
    "InputSpec",
    "ArraySamples",
    "check_sample",
    "check_shapes_fit",
    "source_label",
]

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
ARRAY_EXTS = (".npy", ".npz")


def input_files(folder: Path, exts: tuple[str, ...]) -> list[Path]:
    """The files of ``folder`` with one of ``exts`` (sorted by name); where the folder holds none
    itself, those of its subfolders, sorted by (subfolder, name): the class-folder layout
    (``val/<class>/<file>``, ``--labels folders``). Empty when there are none at either level."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in exts)
    if files:
        return files
    return sorted(
        (
            p
            for d in folder.iterdir()
            if d.is_dir() and not d.name.startswith(".")
            for p in d.iterdir()
            if p.is_file() and p.suffix.lower() in exts
        ),
        key=lambda p: (p.parent.name, p.name),
    )


DISTRIBUTIONS = ("uniform", "normal", "images")
PREPROCESS = ("auto", "yolo", "imagenet", "unit")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LETTERBOX_PAD = 114

#: ONNX element types a graph input may have (float32, uint8, int8, uint16, int16, int32, int64, bool,
#: float16, float64, uint32, uint64); their numpy names come from :func:`anpred.onnx_io.elem_type_name`.
_INPUT_ELEM_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13})


@dataclass
class ModelInput:
    """One graph input: ``name``, numpy ``dtype`` name, ONNX ``shape`` (ints, or str/None when
    dynamic)."""

    name: str
    dtype: str
    shape: list[Any]

    def concrete_shape(self, size: int, override: list[int] | None = None) -> list[int]:
        if override is not None:
            return [int(d) for d in override]
        return [d if isinstance(d, int) and d > 0 else (1 if i == 0 else size) for i, d in enumerate(self.shape)]

    @property
    def layout(self) -> str:
        s = self.shape
        if len(s) == 4 and s[3] == 3 and s[1] != 3:
            return "NHWC"
        return "NCHW" if len(s) == 4 else "unknown"


def model_inputs(model) -> list[ModelInput]:
    """Graph inputs of an ONNX ``ModelProto`` that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = elem_type_name(tt.elem_type) if tt.elem_type in _INPUT_ELEM_TYPES else None
        if dtype is None:
            raise InputError(f"graph input {vi.name!r} has an unsupported element type {tt.elem_type}")
        shape: list[Any] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
            else:
                shape.append(d.dim_param or None)
        out.append(ModelInput(vi.name, dtype, shape))
    return out


def default_images_dir() -> Path:
    """The folder of the two photographs shipped in the ultralytics wheel (bus.jpg, zidane.jpg),
    located without importing ultralytics."""
    import importlib.util

    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("random:images needs dir=FOLDER (ultralytics, whose photos are the default, is not installed)")
    return Path(list(spec.submodule_search_locations)[0]) / "assets"


@dataclass
class InputSpec:
    """Where a run's samples come from (see the module docstring for the text form).

    Attributes:
        kind: ``files`` (``path`` is a folder or a file) or ``random``.
        path: folder or file for ``files``; image folder for ``random`` + ``images`` (None: the
            ultralytics photos).
        distribution: ``uniform`` | ``normal`` | ``images`` (``random`` only).
        seed: seed of ``numpy.random.default_rng`` (``random`` only).
        n: number of samples generated (``random`` only).
        preprocess: ``auto`` | ``yolo`` | ``imagenet`` | ``unit`` (images only).
        size: the side used for dynamic dimensions other than the batch.
        shapes: full concrete shape per input name, overriding the model's dynamic dimensions.
    """

    kind: str = "random"
    path: str | None = None
    distribution: str = "uniform"
    seed: int = 0
    n: int = 1
    preprocess: str = "auto"
    size: int = 640
    shapes: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in ("files", "random"):
            raise InputError(f"unknown input kind {self.kind!r} (files | random)")
        if self.kind == "random" and self.distribution not in DISTRIBUTIONS:
            raise InputError(f"unknown input distribution {self.distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
        if self.preprocess not in PREPROCESS:
            raise InputError(f"unknown preprocessing {self.preprocess!r}; known: {', '.join(PREPROCESS)}")
        if self.kind == "random" and self.n < 1:
            raise InputError(f"n must be at least 1 (got {self.n})")
        if self.kind == "files" and not self.path:
            raise InputError("an input folder or file is required")

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: "str | Path | InputSpec", **overrides) -> "InputSpec":
        """Parse the text form (a path or ``random:...``); an InputSpec passes through (with
        ``overrides`` applied). Raises InputError on a malformed spec."""
        if isinstance(text, InputSpec):
            return InputSpec(**{**asdict(text), **{k: v for k, v in overrides.items() if v is not None}})
        text = str(text)
        if not text.startswith("random:"):
            return cls(kind="files", path=text, **{k: v for k, v in overrides.items() if v is not None})
        parts = text.split(":")
        kw: dict[str, Any] = {"kind": "random", "distribution": parts[1] if len(parts) > 1 and parts[1] else "uniform"}
        shape = None
        for p in parts[2:]:
            if "=" not in p:
                raise InputError(
                    f"malformed input spec {text!r}: {p!r} is not key=value "
                    "(expected random:uniform|normal|images[:seed=S][:n=N][:shape=AxBxC][:dir=DIR])"
                )
            k, v = p.split("=", 1)
            try:
                if k in ("seed", "n", "size"):
                    kw[k] = int(v)
                elif k == "shape":
                    shape = [int(d) for d in v.lower().split("x")]
                elif k == "dir":
                    kw["path"] = v
                elif k == "preprocess":
                    kw["preprocess"] = v
                else:
                    raise InputError(
                        f"malformed input spec {text!r}: unknown key {k!r} (seed, n, shape, size, dir, preprocess)"
                    )
            except ValueError as err:
                raise InputError(f"malformed input spec {text!r}: {k}={v!r} is not an integer") from err
        kw.update({k: v for k, v in overrides.items() if v is not None})
        spec = cls(**kw)
        if shape is not None:
            spec.shapes = {"*": shape}
        return spec

    def describe(self, hint: str = "") -> dict[str, Any]:
        """JSON-ready description stored in ``run.json`` (``inputs``). ``preprocess`` is the method
        actually used (:meth:`resolve_preprocess` of ``hint``: ``yolo``/``imagenet``/``unit``), with
        ``preprocess_requested`` the option given (e.g. ``auto``); both are left out when no image
        feeds the run."""
        d = asdict(self)
        if self.kind == "files":
            d["path"] = str(Path(self.path).resolve())
            for k in ("distribution", "seed", "n"):
                d.pop(k)
            d["distribution"] = "files"
        elif self.distribution == "images" and self.path is None:
            d["path"] = str(default_images_dir())
        d.pop("preprocess")
        try:
            images = self.uses_images()
        except OSError:
            images = False
        if images:
            d["preprocess"] = self.resolve_preprocess(hint)
            d["preprocess_requested"] = self.preprocess
        return d

    def resolve_preprocess(self, hint: str = "") -> str:
        """The image preprocessing actually used: ``self.preprocess``, or for ``auto`` ``yolo`` when
        ``hint`` (model file name, producer, metadata) mentions YOLO/ultralytics, else ``imagenet``."""
        if self.preprocess != "auto":
            return self.preprocess
        return "yolo" if re.search(r"yolo|ultralytics", hint, re.I) else "imagenet"

    def uses_images(self) -> bool:
        """Whether samples may come from images (so that the preprocessing matters)."""
        if self.kind == "random":
            return self.distribution == "images"
        p = Path(self.path)
        if p.is_dir():
            return any(f.suffix.lower() in IMAGE_EXTS for f in input_files(p, IMAGE_EXTS + ARRAY_EXTS))
        return p.suffix.lower() in IMAGE_EXTS

    # ---- samples -------------------------------------------------------------------------------
    def samples(self, inputs: list[ModelInput], hint: str = "") -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Yield ``(source, {input name: array})`` per sample, each checked with :func:`check_sample`.

        ``hint``: text used by ``preprocess="auto"`` (model file name, producer, metadata).
        Raises InputError: missing/unreadable files, no usable file, arrays that do not fit.
        """
        if not inputs:
            raise InputError("the model has no graph inputs to feed")
        prep = self.resolve_preprocess(hint)
        shapes = {i.name: i.concrete_shape(self.size, self.shapes.get(i.name, self.shapes.get("*"))) for i in inputs}
        if self.kind == "random":
            yield from self._random(inputs, shapes, prep)
            return
        path = Path(self.path)
        if not path.exists():
            raise InputError(f"inputs {path}: no such file or folder")
        if path.is_dir():
            files = input_files(path, IMAGE_EXTS + ARRAY_EXTS)
            if not files:
                raise InputError(
                    f"inputs {path}: no image ({', '.join(IMAGE_EXTS)}) or .npy/.npz file in the folder "
                    f"or in its subfolders (a class-folder layout)"
                )
        elif path.suffix.lower() in IMAGE_EXTS + ARRAY_EXTS:
            files = [path]
        else:
            raise InputError(f"inputs {path}: not an image, .npy or .npz file")
        images = [f for f in files if f.suffix.lower() in IMAGE_EXTS]
        for f in files:
            if f.suffix.lower() in ARRAY_EXTS:
                for src, arrays in _array_samples(f, inputs):
                    yield src, check_sample(arrays, inputs, shapes, src)
        if images:
            img_input = _image_input(inputs)
            batch = shapes[img_input.name][0] if img_input.layout in ("NCHW", "NHWC") else 1
            for start in range(0, len(images), batch):
                group = [images[(start + k) % len(images)] for k in range(batch)]
                arr = np.concatenate(
                    [_preprocess(_read_image(g), img_input, shapes[img_input.name], prep) for g in group]
                )
                src = ",".join(str(g) for g in group)
                yield src, check_sample({img_input.name: arr}, inputs, shapes, src)

    def _random(self, inputs, shapes, prep):
        rng = np.random.default_rng(self.seed)
        if self.distribution == "images":
            img_input = _image_input(inputs)
            folder = Path(self.path) if self.path else default_images_dir()
            if not folder.is_dir():
                raise InputError(f"random:images: {folder} is not a folder")
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS)
            if not files:
                raise InputError(f"random:images: no image in {folder}")
            photos = [_read_image(f) for f in files]
        for i in range(self.n):
            arrays = {}
            for inp in inputs:
                shape = shapes[inp.name]
                dt = np.dtype(inp.dtype)
                if self.distribution == "images" and inp is img_input:
                    parts = []
                    for _ in range(shape[0] if inp.layout != "unknown" else 1):
                        k = int(rng.integers(len(photos)))
                        parts.append(_preprocess(_random_crop(photos[k], rng), inp, shape, prep))
                    arrays[inp.name] = np.concatenate(parts)
                elif dt.kind == "f":
                    x = rng.random(shape) if self.distribution != "normal" else rng.standard_normal(shape)
                    arrays[inp.name] = x.astype(dt)
                elif dt.kind == "b":
                    arrays[inp.name] = rng.integers(0, 2, shape).astype(bool)
                else:
                    arrays[inp.name] = rng.integers(0, 10, shape).astype(dt)
            yield f"random:{self.distribution}:seed={self.seed}#{i}", check_sample(arrays, inputs, shapes)


class ArraySamples:
    """Samples already in memory, given to :func:`anpred.run.run_model` in place of an
    :class:`InputSpec` (a streamed dataset's chunk, read and preprocessed by its reader thread: no file
    written and read back in between).

    Args:
        items: ``(source, {input name: array})`` per sample.
        description: what the run records as its inputs (``run.json`` ``inputs``).
        prewritten: per sample, ``(sha256, file)``: its :func:`anpred.run.store.sample_sha256` and a
            ``.safetensors`` file of its arrays written beforehand (by the reader thread, while the
            previous chunk ran), moved into the run instead of written there (:meth:`prewritten_for`);
            None: the run hashes and writes them.
    """

    def __init__(
        self,
        items: list[tuple[str, dict[str, np.ndarray]]],
        description: dict[str, Any] | None = None,
        prewritten: list[tuple[str, Path] | None] | None = None,
    ):
        self.items = list(items)
        self.description = dict(description or {"kind": "arrays", "distribution": "arrays"})
        self.prewritten = list(prewritten) if prewritten is not None else [None] * len(self.items)

    def prewritten_for(self, i: int, arrays: dict[str, np.ndarray]) -> tuple[str, Path] | None:
        """Sample ``i``'s ``(sha256, file)`` when ``arrays`` (as :meth:`samples` yielded them) are the
        very arrays it was computed from; None where :func:`check_sample` cast or copied one."""
        src = self.items[i][1]
        if self.prewritten[i] is None or set(arrays) != set(src) or any(arrays[k] is not src[k] for k in src):
            return None
        return self.prewritten[i]

    def samples(self, inputs: list["ModelInput"], hint: str = "") -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """As :meth:`InputSpec.samples`. Raises InputError: an array that does not fit the inputs."""
        if not inputs:
            raise InputError("the model has no graph inputs to feed")
        for src, arrays in self.items:
            yield src, check_sample(arrays, inputs, source=src)

    def describe(self, hint: str = "") -> dict[str, Any]:
        return {**self.description, "samples": len(self.items)}


def source_label(source: str) -> str:
    """The short name of a sample's source for an error message: each file's name (``a.npz``,
    ``batch.npz[3]``, ``x.jpg,y.jpg``), other sources (``random:...``) as they are."""
    return ",".join(Path(part).name or part for part in str(source).split(",")) if source else ""


def check_sample(
    arrays: dict[str, np.ndarray],
    inputs: list[ModelInput],
    shapes: dict[str, list[int]] | None = None,
    source: str = "",
) -> dict[str, np.ndarray]:
    """Check one sample against the graph inputs and return it cast to the inputs' dtypes.

    Every graph input must be present, no other key; ranks and static dimensions must match (and the
    concrete ``shapes`` when given for dynamic ones is *not* enforced: files may carry any size).
    ``source``: where the sample came from (a file, ``file.npz[j]``), named in the errors
    (:func:`source_label`).
    Raises InputError naming the input, the sample's source, the expected and the given shape or dtype.
    """
    where = f" ({source_label(source)})" if source else ""
    names = {i.name for i in inputs}
    extra = sorted(set(arrays) - names)
    missing = sorted(names - set(arrays))
    if missing or extra:
        raise InputError(
            f"inputs{where} do not fit the model: missing {missing or 'none'}, unexpected "
            f"{extra or 'none'} (graph inputs: {', '.join(sorted(names))})"
        )
    out = {}
    for inp in inputs:
        a = np.asarray(arrays[inp.name])
        want = np.dtype(inp.dtype)
        shape_txt = "x".join(str(d) if d is not None else "?" for d in inp.shape)
        if a.ndim != len(inp.shape) or any(isinstance(d, int) and d != s for d, s in zip(inp.shape, a.shape)):
            raise InputError(f"input {inp.name!r}{where}: shape {tuple(a.shape)} does not fit the model's {shape_txt}")
        if a.dtype != want:
            if a.dtype.kind == want.kind or (a.dtype.kind in "iu" and want.kind in "iu"):
                a = a.astype(want)
            else:
                raise InputError(f"input {inp.name!r}{where}: dtype {a.dtype} cannot feed the model's {want}")
        out[inp.name] = c_contiguous(a)
    return out


# ---- helpers -----------------------------------------------------------------------------------
def _image_input(inputs: list[ModelInput]) -> ModelInput:
    cands = [i for i in inputs if len(i.shape) == 4 and np.dtype(i.dtype).kind == "f"]
    if len(inputs) != 1 or not cands:
        raise InputError(
            "images can feed only a model with one 4-D floating input "
            f"(this one has: {', '.join(f'{i.name} {i.shape}' for i in inputs)}); use .npz files"
        )
    return cands[0]


def _read_image(path: Path) -> np.ndarray:
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise InputError(f"inputs: cannot read image {path} (unreadable or not an image)")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _random_crop(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    frac = float(rng.uniform(0.5, 1.0))
    ch, cw = max(8, int(round(h * np.sqrt(frac)))), max(8, int(round(w * np.sqrt(frac))))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = img[y : y + ch, x : x + cw]
    return crop[:, ::-1].copy() if rng.random() < 0.5 else crop


def _preprocess(img: np.ndarray, inp: ModelInput, shape: list[int], prep: str) -> np.ndarray:
    """HxWx3 uint8 RGB -> (1, 3, H, W) or (1, H, W, 3) float32 following ``prep``."""
    import cv2

    h, w = (shape[2], shape[3]) if inp.layout == "NCHW" else (shape[1], shape[2])
    if prep == "yolo":
        r = min(h / img.shape[0], w / img.shape[1])
        nh, nw = int(round(img.shape[0] * r)), int(round(img.shape[1] * r))
        resized = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
        top, left = (h - nh) // 2, (w - nw) // 2
        x = cv2.copyMakeBorder(
            resized, top, h - nh - top, left, w - nw - left, cv2.BORDER_CONSTANT, value=(LETTERBOX_PAD,) * 3
        )
        x = x.astype(np.float32) / 255.0
    else:
        x = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255.0
        if prep == "imagenet":
            x = (x - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)
    x = x[None]
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if inp.layout == "NCHW" else x).astype(np.dtype(inp.dtype))


def _array_samples(path: Path, inputs: list[ModelInput]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    try:
        if path.suffix.lower() == ".npy":
            if len(inputs) != 1:
                raise InputError(
                    f"{path}: a .npy file feeds only a one-input model; this one has "
                    f"{', '.join(i.name for i in inputs)}: use .npz with these keys"
                )
            data = {inputs[0].name: np.load(path, allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
    except InputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        kind = "not a valid .npz (zip) archive" if isinstance(err, zipfile.BadZipFile) else str(err)
        raise InputError(f"inputs: cannot read {path}: {kind}") from err
    ranks = {i.name: len(i.shape) for i in inputs}
    batched = [k for k, a in data.items() if k in ranks and a.ndim == ranks[k] + 1]
    if batched and len(batched) == len(data):
        counts = {data[k].shape[0] for k in batched}
        if len(counts) != 1:
            raise InputError(f"{path}: stacked arrays disagree on the number of samples: {sorted(counts)}")
        for j in range(counts.pop()):
            yield f"{path}[{j}]", {k: data[k][j] for k in data}
    else:
        yield str(path), data


_SHAPE_ERR = re.compile(r"\(op_type:(\w+)(?:, node name: ([^)]*))?\): \[ShapeInferenceError\] ([^\n]*)")


def check_shapes_fit(model, shapes: dict[str, tuple[int, ...]]) -> None:
    """Check that concrete input ``shapes`` (graph input name -> shape) fit a model whose inputs have
    dynamic dimensions, before any backend runs: ONNX shape inference (``strict_mode``, with data
    propagation) on a copy of the graph whose inputs are fixed to ``shapes``. Catches sizes the
    architecture cannot take (e.g. a spatial size that is not a multiple of a detector's total
    stride: an ``Add``/``Concat`` of two branches with incompatible dimensions).

    Only shape errors are reported: a model that shape inference cannot handle for other reasons
    (unknown custom-domain operators, missing schemas) passes. Raises InputError (one line) naming
    the input shapes and the first node whose shapes do not fit.
    """
    import onnx

    dyn = [
        vi
        for vi in model.graph.input
        if vi.name in shapes
        and any(not (d.HasField("dim_value") and d.dim_value > 0) for d in vi.type.tensor_type.shape.dim)
    ]
    if not dyn:
        return
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes and len(shapes[vi.name]) == len(vi.type.tensor_type.shape.dim):
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    del m.graph.value_info[:]
    try:
        onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception as err:  # noqa: BLE001 - onnx raises InferenceError/ValidationError/RuntimeError
        hit = _SHAPE_ERR.search(str(err))
        if hit and "Incompatible" in hit.group(3):
            txt = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
            node = hit.group(2) or "(unnamed)"
            raise InputError(
                f"input shape {txt} does not fit the model: {hit.group(1)} node {node!r}: "
                f"{hit.group(3).strip()} (ONNX shape inference; e.g. a spatial size the "
                "network's strides do not divide)"
            ) from err
