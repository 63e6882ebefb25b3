"""The model zoo: registry, builds, ONNX exports, preprocessing and detection on real inputs."""

from __future__ import annotations

import numpy as np
import pytest

from anpred.errors import AnpredError


def _ort(path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_registry_metadata_and_unknown_name(zoo):
    assert {"yolov8n", "yolov8s", "yolov5n", "yolov5s", "yolov8n-doclaynet", "ppocr-det", "ppocr-rec",
            "mobilenetv2-keras"} <= set(zoo.REGISTRY)
    with pytest.raises(AnpredError, match="known: .*yolov8n"):
        zoo.get("yolov9x")
    m = zoo.get("yolov8n", imgsz=(256, 320))
    assert m.input_shape == (1, 3, 256, 320) and m.origin == "torch" and not m.trained
    assert zoo.get("yolov8n-doclaynet").trained and zoo.get("ppocr-det").origin == "onnx"
    with pytest.raises(AnpredError, match="1024x1024"):
        zoo.get("yolov8n-doclaynet", imgsz=640)
    with pytest.raises(AnpredError, match="multiple of 32"):
        zoo.get("yolov8n", imgsz=300)


def test_yolov8n_native_matches_its_export(yolov8n_model, yolov8n_onnx):
    import torch

    x = yolov8n_model.example_inputs()[0]
    assert x.shape == (1, 3, 320, 320) and x.dtype == np.float32
    with torch.no_grad():
        eager = yolov8n_model.native()(torch.from_numpy(x)).numpy()
    sess = _ort(yolov8n_onnx)
    out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert out.shape == eager.shape == (1, 84, 2100)
    scale = np.abs(eager).max()
    assert np.abs(out - eager).max() <= 1e-5 * scale


def test_ppocr_det_finds_text_on_rendered_page(ppocr_det_onnx):
    import models

    m = models.get("ppocr-det", imgsz=(640, 512))
    x = m.real_inputs(1)[0]
    assert x.shape == (1, 3, 640, 512) and -1.0 <= x.min() and x.max() <= 1.0
    prob = _ort(ppocr_det_onnx).run(None, {"x": x})[0]
    assert prob.shape == (1, 1, 640, 512)
    # the text probability map is high on the drawn text lines and low on the white margins
    from models.documents import render_page

    page = render_page(0)
    sy, sx = 640 / page.image.height, 512 / page.image.width
    on = [prob[0, 0, int((b[1] + b[3]) / 2 * sy), int((b[0] + b[2]) / 2 * sx)] for b, _ in page.lines[:20]]
    assert np.median(on) > 0.5
    assert prob[0, 0, :, :int(0.05 * 512)].max() < 0.3
