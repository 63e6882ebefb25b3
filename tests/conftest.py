"""Shared session fixtures: zoo models and their ONNX files (built once per session, exports cached
with anpred.cache across sessions). Sizes are small to keep the suite fast on 2 cores."""

from __future__ import annotations

import pytest

# YOLO sizes used by the test suite (the budget: 160-320 px).
TEST_IMGSZ = 320


@pytest.fixture(scope="session")
def zoo():
    """The ``models`` package (``zoo.get(name, imgsz=...)``)."""
    import models

    return models


@pytest.fixture(scope="session")
def yolov8n_model():
    """``ZooModel`` yolov8n at 320x320 (seeded, BN-calibrated)."""
    import models

    return models.get("yolov8n", imgsz=TEST_IMGSZ)


@pytest.fixture(scope="session")
def yolov8n_onnx(yolov8n_model):
    """Path of the cached dynamo export of yolov8n at 320 (input ``(1, 3, 320, 320)``)."""
    return yolov8n_model.onnx_path()


@pytest.fixture(scope="session")
def yolov5n_model():
    """``ZooModel`` yolov5n (anchor-based head) at 320x320."""
    import models

    return models.get("yolov5n", imgsz=TEST_IMGSZ)


@pytest.fixture(scope="session")
def yolov5n_onnx(yolov5n_model):
    """Path of the cached dynamo export of yolov5n at 320."""
    return yolov5n_model.onnx_path()


@pytest.fixture(scope="session")
def doclaynet_model():
    """``ZooModel`` yolov8n-doclaynet (trained; static 1024x1024)."""
    import models

    return models.get("yolov8n-doclaynet")


@pytest.fixture(scope="session")
def doclaynet_onnx(doclaynet_model):
    """Path of the shipped trained ONNX file (1x3x1024x1024 -> 1x15x21504)."""
    return doclaynet_model.onnx_path()


@pytest.fixture(scope="session")
def ppocr_det_onnx():
    """Path of the shipped PP-OCRv4 detection ONNX (dynamic NCHW input)."""
    import models

    return models.get("ppocr-det").onnx_path()
