"""The real models of the instrumentation tests (tests/test_instrument.py, tests/test_instrument_files.py,
tests/test_partition.py): YOLOv8n / YOLOv5nu (dynamo and TorchScript exports), the trained PP-OCRv4 det/rec
models shipped in rapidocr_onnxruntime, a Keras CNN through tf2onnx and a synthetic >10,000-node graph.

Exports are cached with anpred.cache (kind ``test-instrument``), so only the first session pays;
``model_path`` (conftest.py, session scope) gives each once a session.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
from pathlib import Path

import numpy as np

IMGSZ = 160


# ------------------------------------------------------------------------------------------------
# model builders (cached)
# ------------------------------------------------------------------------------------------------
def yolo_onnx(cfg: str, dynamo: bool, size: int = IMGSZ) -> Path:
    """ultralytics ``cfg`` (seeded random weights, one-output export head) exported by torch."""
    from anpred.cache import cache_key, cached_dir

    key = cache_key(
        "test-instrument-yolo/1", cfg, dynamo, size, md.version("torch"), md.version("ultralytics"), md.version("onnx")
    )

    def build(tmp: Path) -> None:
        import torch

        from anpred.compat import import_ultralytics

        import_ultralytics()
        from ultralytics import YOLO

        torch.manual_seed(0)
        model = YOLO(cfg).model.eval()
        head = model.model[-1]
        head.export, head.format = True, "onnx"
        x = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        kw = {"external_data": False} if dynamo else {"dynamo": False}
        torch.onnx.export(model, (x,), str(tmp / "model.onnx"), **kw)

    return cached_dir("test-instrument", key, build) / "model.onnx"


KERAS_LAYERS = ["conv1", "bn1", "relu1", "conv2", "add1", "pool1", "conv3", "gap", "logits"]


def keras_onnx() -> Path:
    """A small functional Keras CNN (conv, BN, residual add, pooling, dense) through tf2onnx."""
    from anpred.cache import cache_key, cached_dir

    vers = []
    for p in ("tensorflow-cpu", "keras", "tf2onnx", "onnx"):
        try:
            vers.append(md.version(p))
        except md.PackageNotFoundError:
            vers.append(None)
    key = cache_key("test-instrument-keras/1", vers)

    def build(tmp: Path) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import keras
        import tensorflow as tf
        import tf2onnx

        keras.utils.set_random_seed(0)
        L = keras.layers
        inp = keras.Input((32, 32, 3), batch_size=1, name="image")
        x = L.Conv2D(8, 3, padding="same", name="conv1")(inp)
        x = L.BatchNormalization(name="bn1")(x)
        x = L.ReLU(name="relu1")(x)
        y = L.Conv2D(8, 3, padding="same", activation="relu", name="conv2")(x)
        x = L.Add(name="add1")([x, y])
        x = L.MaxPooling2D(name="pool1")(x)
        x = L.Conv2D(16, 3, padding="same", activation="relu", name="conv3")(x)
        x = L.GlobalAveragePooling2D(name="gap")(x)
        x = L.Dense(10, name="logits")(x)
        model = keras.Model(inp, x, name="smallcnn")
        spec = [tf.TensorSpec((1, 32, 32, 3), tf.float32, name="image")]
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(tmp / "model.onnx"))

    return cached_dir("test-instrument", key, build) / "model.onnx"


def ppocr_onnx(which: str) -> Path:
    """The trained PP-OCRv4 det/rec model inside the rapidocr_onnxruntime wheel (not imported)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    assert spec is not None, "rapidocr_onnxruntime is not installed"
    folder = Path(next(iter(spec.submodule_search_locations))) / "models"
    return folder / f"ch_PP-OCRv4_{which}_infer.onnx"


def synthetic_onnx(tmp: Path, nodes: int = 10_500, kind: str = "conv") -> Path:
    import onnx

    from passes.synthetic import skip_chain_model

    p = tmp / f"skip_chain_{kind}_{nodes}.onnx"
    if not p.exists():
        onnx.save(skip_chain_model(nodes, kind=kind), str(p))
    return p


MODELS = {
    "yolov8n-dynamo": lambda tmp: yolo_onnx("yolov8n.yaml", True),
    "yolov8n-torchscript": lambda tmp: yolo_onnx("yolov8n.yaml", False),
    "yolov5nu-dynamo": lambda tmp: yolo_onnx("yolov5nu.yaml", True),
    "yolov5nu-torchscript": lambda tmp: yolo_onnx("yolov5nu.yaml", False),
    "ppocrv4-det": lambda tmp: ppocr_onnx("det"),
    "ppocrv4-rec": lambda tmp: ppocr_onnx("rec"),
    "keras-cnn-tf2onnx": lambda tmp: keras_onnx(),
    "synthetic-10k": lambda tmp: synthetic_onnx(tmp),
}


def model_getter(model_dir: Path):
    """``get(name) -> Path`` of the model :data:`MODELS` names, built (or found in the cache) on the first
    call; models that are not cached across sessions are written under the folder ``model_dir``."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = MODELS[name](model_dir)
        return cache[name]

    return get


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def feeds_for(sess, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every model input; symbolic dims: batch 1, others 64 (rec height fixed 48)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else (1 if k == 0 else 64) for k, d in enumerate(i.shape)]
        out[i.name] = rng.random(shape, dtype=np.float32)
    return out
