"""Shared session fixtures: zoo models and their ONNX files (built once per session, exports cached
with anpred.cache across sessions), and the cases that the modules of one split test file share (built
by the helper modules beside them: align_cases, task_digits, check_runs, diff_cases, instrument_models,
run_models), each once a session. Sizes are small to keep the suite fast on 2 cores."""

from __future__ import annotations

import os

import pytest


def pytest_xdist_auto_num_workers(config):
    """The count ``-n auto`` (pyproject's addopts) starts (tests/xdist_workers.py: usable CPUs, one worker
    per 3 GiB of available memory, cgroup v2 limits, at least 1); ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    (pytest-xdist's own override) wins; ``-n 0`` runs in one process."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    from xdist_workers import this_machines_count

    return this_machines_count()


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


@pytest.fixture(scope="session")
def keras_case(tmp_path_factory):
    """The alignment tests' Keras case (tests/align_cases.py): the model natively in TensorFlow and via
    tf2onnx in onnxruntime, 2 samples, plus a wrong model; shared by test_align_keras.py and
    test_align_onnx2tf.py."""
    from align_cases import build_keras_case

    return build_keras_case(tmp_path_factory.mktemp("keras"))


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """The task tests' digits case (tests/task_digits.py): ``(model.onnx, inputs folder, labels.txt, eager
    top-1 on the test digits, root)``; shared by test_task_metrics.py and test_task_stream.py."""
    from task_digits import build_digits

    return build_digits(tmp_path_factory.mktemp("digits"))


# the ``anpred check`` tests' runs (tests/check_runs.py), shared by test_check_*.py: each run once a session
@pytest.fixture(scope="session")
def softplus_run(tmp_path_factory):
    """``(run folder, manifest)``: the Softplus CNN (OpenVINO's defect below -10) on six backends."""
    import check_runs

    return check_runs.softplus_run(tmp_path_factory.mktemp("softplus"))


@pytest.fixture(scope="session")
def avgpool_run(tmp_path_factory):
    """``(run folder, manifest)``: the AveragePool CNN (OpenVINO's ceil_mode defect) on six backends."""
    import check_runs

    return check_runs.avgpool_run(tmp_path_factory.mktemp("avgpool"))


@pytest.fixture(scope="session")
def clean_run(tmp_path_factory):
    """``(run folder, manifest)``: the plain CNN on the five clean fp32 backends."""
    import check_runs

    return check_runs.clean_run(tmp_path_factory.mktemp("clean"))


# the ``anpred diff`` tests' YOLOv8n (tests/diff_cases.py), shared by test_diff_graphs.py and test_diff_runs.py
@pytest.fixture(scope="session")
def yolo_path():
    """Path of the cached YOLOv8n export at 160 px (``anpred diff``'s tests)."""
    import diff_cases

    return diff_cases.yolo_path()


@pytest.fixture(scope="session")
def yolo_ort_path(yolo_path, tmp_path_factory):
    """Path of ``yolo_path`` after ONNX Runtime's extended offline optimisation."""
    import diff_cases

    return diff_cases.yolo_ort_path(yolo_path, tmp_path_factory.mktemp("ortopt") / "yolo_ext.onnx")


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """``get(name) -> Path`` of the instrumentation tests' real models (tests/instrument_models.py:
    ``MODELS``), each built once a session; shared by test_instrument.py and test_instrument_files.py."""
    from instrument_models import model_getter

    return model_getter(tmp_path_factory.mktemp("instrument-models"))


@pytest.fixture(scope="session")
def yolo():
    """Path of the run driver tests' anchored YOLOv8n at 224 px (tests/run_models.py, cached across
    sessions); shared by test_run_isolation.py and test_run_driver.py."""
    import run_models

    return run_models.anchored_yolo()
