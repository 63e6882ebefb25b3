"""The real models of the ``anpred diff`` tests (tests/test_diff_graphs.py, tests/test_diff_runs.py):
YOLOv8n (ultralytics YAML, seeded, dynamo export at 160 px), the same after ONNX Runtime's offline
optimisation, its fp16 conversion (onnxconverter-common), and a Keras CNN exported by tf2onnx beside the
same network written in PyTorch. Exports are cached with anpred.cache (TF/torch are only imported on a
cold cache); ``yolo_path`` and ``yolo_ort_path`` (conftest.py, session scope) give them once.
"""

from __future__ import annotations

import copy
import importlib.metadata as md
import warnings
from pathlib import Path

import onnx

from anpred.cache import cache_key, cached_dir

VERSIONS = {p: md.version(p) for p in ("torch", "onnx", "tensorflow-cpu", "tf2onnx", "ultralytics")}


# ------------------------------------------------------------------------------------------------
# real models (cached)
# ------------------------------------------------------------------------------------------------
def build_yolo(d: Path) -> None:
    import torch

    from anpred.compat import import_ultralytics

    ul = import_ultralytics()
    torch.manual_seed(0)
    m = ul.YOLO("yolov8n.yaml").model.eval()
    for mod in m.modules():
        if hasattr(mod, "export"):
            mod.export = True
            mod.format = "onnx"
    torch.onnx.export(m, (torch.zeros(1, 3, 160, 160),), str(d / "model.onnx"), dynamo=True, external_data=False)


def build_cnn_pair(d: Path) -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf2onnx

    k = tf.keras
    tf.random.set_seed(0)
    inp = k.Input((32, 32, 3), batch_size=1, name="image")
    x = k.layers.Conv2D(8, 3, padding="same", name="stem_conv")(inp)
    x = k.layers.BatchNormalization(name="stem_bn")(x)
    x = k.layers.ReLU(name="stem_relu")(x)
    x = k.layers.MaxPooling2D(2, name="pool1")(x)
    x = k.layers.Conv2D(16, 3, padding="same", activation="relu", name="block_conv")(x)
    x = k.layers.GlobalAveragePooling2D(name="gap")(x)
    out = k.layers.Dense(10, name="classifier")(x)
    km = k.Model(inp, out)
    spec = [tf.TensorSpec((1, 32, 32, 3), tf.float32, name="image")]
    mp, _ = tf2onnx.convert.from_keras(km, input_signature=spec, opset=18)
    onnx.save(mp, str(d / "keras.onnx"))

    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            x = torch.relu(self.bn(self.c1(x)))
            x = torch.nn.functional.max_pool2d(x, 2)
            x = torch.relu(self.c2(x))
            return self.fc(x.mean((2, 3)))

    torch.manual_seed(0)
    torch.onnx.export(
        Net().eval(), (torch.zeros(1, 3, 32, 32),), str(d / "torch.onnx"), dynamo=True, external_data=False
    )


def yolo_path() -> Path:
    """The cached YOLOv8n export (160 px, opset of torch's dynamo exporter), built on a cold cache."""
    return cached_dir("test-diff-yolov8n160", cache_key("v1", VERSIONS), build_yolo) / "model.onnx"


def yolo_ort_path(yolo_path: Path, out: Path) -> Path:
    """``yolo_path`` after ONNX Runtime's extended offline optimisation, written to ``out``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(yolo_path), so, providers=["CPUExecutionProvider"])
    return out


def fp16_copy(model, **kw):
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(copy.deepcopy(model), keep_io_types=True, **kw)


# ------------------------------------------------------------------------------------------------
# regressions from the review of issue 8
# ------------------------------------------------------------------------------------------------
def ort_optimised(src: Path, dst: Path, level: str) -> Path:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return dst
