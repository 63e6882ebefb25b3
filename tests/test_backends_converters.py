"""Converter backends ``torch`` (onnx2torch) and ``tf`` (onnx2tf) on real models, against onnxruntime.

Models: YOLOv8n (ultralytics YAML, seeded random weights) exported with torch's dynamo exporter at
192x192 and anchored with ``anpred.instrument``; the trained PP-OCRv4 detection model shipped in the
rapidocr_onnxruntime wheel (input fixed to 1x3x96x128). Exports, anchored models and onnx2tf
conversions are cached (anpred.cache), so a warm run costs a few seconds per model.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from anpred.errors import BackendError

from ort_session import ort_outputs, ort_session

YOLO_SIZE = 192
FP32_RTOL = 1e-4  # max |backend - ort| / max |ort| per anchor: fp32 noise (measured 5e-8..3e-6)
# PP-OCR only: floor of the scale. PP-OCR's sigmoid output is ~1e-8 everywhere on random inputs, where ORT's
# Sigmoid is off by ~1.1e-8 absolute (torch matches float64 within 3e-13): a plain max-relative error
# would read 0.37 there although both are within fp32 resolution of values near 1.
SCALE_FLOOR = 1e-2


def _anchor_file(src: Path, out: Path) -> None:
    import onnx

    from anpred.instrument import instrument_model

    model, manifest = instrument_model(onnx.load(str(src)), stages=6, source_path=src)
    manifest.to_model(model)
    onnx.save(model, str(out))


@pytest.fixture(scope="session")
def yolo() -> Path:
    """Anchored YOLOv8n, dynamo export (opset 20: Split-18, Resize-19, Reshape-21 allowzero)."""
    from anpred.cache import cache_key, cached_dir

    def build(d: Path) -> None:
        import torch

        from anpred.compat import import_ultralytics
        from exporters.torch_export import export_torch

        ul = import_ultralytics()
        torch.manual_seed(0)
        net = ul.YOLO("yolov8n.yaml").model.eval()
        net.model[-1].export = True  # Detect head: one (1, 84, A) output
        export_torch(net, (torch.rand(1, 3, YOLO_SIZE, YOLO_SIZE),), d / "yolov8n.onnx", dynamo=True, cache=False)
        _anchor_file(d / "yolov8n.onnx", d / "yolov8n.anchored.onnx")

    d = cached_dir("test-models", cache_key("converters-yolov8n-dynamo", YOLO_SIZE, 1), build)
    return d / "yolov8n.anchored.onnx"


@pytest.fixture(scope="session")
def ppocr() -> Path:
    """Anchored PP-OCRv4 detection model (trained weights) with a static 1x3x96x128 input."""
    from anpred.cache import cache_key, cached_dir

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr_onnxruntime is not installed")
    src = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"

    def build(d: Path) -> None:
        import onnx
        from onnx.tools.update_model_dims import update_inputs_outputs_dims

        m = onnx.load(str(src))
        m = update_inputs_outputs_dims(
            m, {m.graph.input[0].name: [1, 3, 96, 128]}, {m.graph.output[0].name: [1, 1, 96, 128]}
        )
        onnx.save(m, str(d / "det.onnx"))
        _anchor_file(d / "det.onnx", d / "det.anchored.onnx")

    d = cached_dir("test-models", cache_key("converters-ppocr-det", src, 1), build)
    return d / "det.anchored.onnx"


def _manifest(path: Path):
    import onnx

    from anpred.manifest import AnchorManifest

    return AnchorManifest.from_model(onnx.load(str(path), load_external_data=False))


def _inputs(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.random([int(d) for d in i.shape], dtype=np.float32) for i in ort_session(path).get_inputs()}


def _compare(
    backend, path: Path, tmp: Path, floor: float = 0.0, feeds: dict[str, np.ndarray] | None = None
) -> dict[str, float]:
    """Prepare/run ``backend`` on ``path``; check it captures every anchor and agrees with ORT
    (after undoing the reported transform). Returns the relative error per anchor:
    max |y - r| / max(max |r|, floor). ``feeds`` default: seeded uniform inputs of the static shapes."""
    manifest = _manifest(path)
    feeds = _inputs(path) if feeds is None else feeds
    ref = ort_outputs(path, feeds)
    backend.prepare(path, manifest, tmp)
    got = backend.run(feeds)
    info = backend.anchor_info()
    missing = {a: c.reason for a, c in info.items() if c.status == "missing"}
    assert not missing, f"{backend.name}: anchors not captured: {missing}"
    assert set(got) == set(manifest.names())
    errs = {}
    for a in manifest.anchors:
        y = got[a.name]
        perm = (info[a.name].transform or {}).get("permute")
        if perm:
            y = np.transpose(y, perm)
        r = ref[a.name] if a.name in ref else ref[a.value]  # Identity(value) -> output "<anchor name>"
        assert y.shape == r.shape, f"{backend.name} {a.name}: shape {y.shape} vs ort {r.shape}"
        errs[a.name] = float(np.max(np.abs(y.astype(np.float64) - r)) / max(float(np.max(np.abs(r))), floor, 1e-30))
    bad = {k: v for k, v in errs.items() if not v <= FP32_RTOL}
    table = ", ".join(f"{k}={v:.2e}" for k, v in errs.items())
    assert not bad, f"{backend.name} vs ort, max relative error per anchor above {FP32_RTOL}: {table}"
    print(f"\n{backend.name} {path.name}: max relative error per anchor: {table}")
    return errs


def test_torch_yolov8n_dynamo(yolo, tmp_path):
    from anpred.backends.torch_onnx import TorchOnnxBackend

    with TorchOnnxBackend() as b:
        errs = _compare(b, yolo, tmp_path)
        assert len(errs) >= 3
        info = b.anchor_info()
        assert all(c.status == "exact" and c.transform is None for c in info.values())
        assert b.versions()["torch"].startswith("2.") and b.versions()["onnx2torch"]
        assert b.effective_precision() == "fp32"


@pytest.mark.slow  # YOLOv8n through onnx2tf: ~20 s cold
def test_tf_yolov8n_dynamo_nhwc_and_cache(yolo, tmp_path):
    from anpred.backends.tf_onnx import TfOnnxBackend

    manifest = _manifest(yolo)
    with TfOnnxBackend() as b:
        _compare(b, yolo, tmp_path)
        info = b.anchor_info()
        four_d = [a for a in manifest.anchors if len(a.shape) == 4]
        assert four_d, "the anchored YOLOv8n should expose 4-D anchors"
        for a in four_d:  # onnx2tf's convention, verified by shape: NHWC, permute back to NCHW
            assert info[a.name].layout == "NHWC", (a.name, info[a.name])
            assert info[a.name].transform == {"permute": [0, 3, 1, 2]}, (a.name, info[a.name])
        assert b.versions()["onnx2tf"] and b.versions()["tensorflow"] == __import__("tensorflow").__version__
    with TfOnnxBackend() as again:  # second prepare: conversion comes from the cache
        again.prepare(yolo, manifest, tmp_path)
        assert again.cache_hit and again.cache_dir == b.cache_dir


@pytest.mark.parametrize("backend", ["torch", pytest.param("tf", marks=pytest.mark.slow)])
def test_ppocr_det(backend, ppocr, tmp_path):
    from anpred.backends import backend_class

    with backend_class(backend)() as b:
        errs = _compare(b, ppocr, tmp_path, floor=SCALE_FLOOR)
        assert len(errs) >= 3


def _unsupported_model(path: Path) -> None:
    """X (1, 4, 4) -> Relu -> CastLike(., X) -> Det: Det has no onnx2torch converter, CastLike no
    onnx2tf converter."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("CastLike", ["r", "x"], ["c"], name="castlike"),
            helper.make_node("Det", ["c"], ["y"], name="det"),
        ],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 4]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def test_unsupported_operator_is_a_clear_error(tmp_path):
    from anpred.backends.tf_onnx import TfOnnxBackend
    from anpred.backends.torch_onnx import TorchOnnxBackend
    from anpred.manifest import Anchor, AnchorManifest

    path = tmp_path / "unsupported.onnx"
    _unsupported_model(path)
    manifest = AnchorManifest(
        anchors=[
            Anchor("anchor/00/r", "r", 0, 0, "relu", "Relu", [1, 4, 4], "float32"),
            Anchor("output/y", "y", 1, 2, "det", "Det", [1], "float32", kind="output"),
        ]
    )
    with pytest.raises(BackendError, match=r"Det-11 \(node 'det'\)"):
        TorchOnnxBackend().prepare(path, manifest, tmp_path / "w")
    with pytest.raises(BackendError, match="onnx2tf failed.*CastLike"):
        TfOnnxBackend().prepare(path, manifest, tmp_path / "w")


@pytest.fixture(scope="session")
def ppocr_dynamic() -> Path:
    """Anchored PP-OCRv4 detection model as shipped (dynamic batch/height/width)."""
    from anpred.cache import cache_key, cached_dir

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr_onnxruntime is not installed")
    src = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"
    d = cached_dir(
        "test-models",
        cache_key("converters-ppocr-det-dynamic", src, 1),
        lambda d: _anchor_file(src, d / "det.anchored.onnx"),
    )
    return d / "det.anchored.onnx"


@pytest.mark.slow
def test_tf_ppocr_det_192x256(ppocr_dynamic, tmp_path):
    """Regression: onnx2tf failed here ("Output tensors of a Functional model ... Found: 3.0") on the
    hard-swish ``Add(x, Constant 3.0)`` until Constant nodes were made initializers."""
    from anpred.backends.tf_onnx import TfOnnxBackend

    shape = [1, 3, 192, 256]
    feeds = {"x": np.random.default_rng(0).random(shape, dtype=np.float32)}
    with TfOnnxBackend({"input_shapes": {"x": shape}}) as b:
        errs = _compare(b, ppocr_dynamic, tmp_path, floor=SCALE_FLOOR, feeds=feeds)
        assert len(errs) >= 3 and b.fixed_shapes == {"x": shape}


def _constant_reshape_model(path: Path) -> np.ndarray:
    """y = x + Reshape(grid, [1, 32]) with grid a (4, 4, 2) initializer (cell centres, like YOLOv8's
    anchor grid); returns grid."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    grid = np.stack(np.meshgrid(np.arange(4) + 0.5, np.arange(4) + 0.5), -1).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Reshape", ["grid", "shape"], ["flat"], name="reshape_grid"),
            helper.make_node("Add", ["x", "flat"], ["y"], name="add"),
        ],
        "constant_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(grid, "grid"), numpy_helper.from_array(np.array([1, 32], np.int64), "shape")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return grid


@pytest.mark.kernels
@pytest.mark.slow
def test_tf_constant_reshape_needs_onnxsim_venv_not_on_path(tmp_path, monkeypatch):
    """Regression (YOLOv8n at 640 px): with the venv not on PATH, onnx2tf could not run its onnxsim
    command, silently converted the unsimplified graph and failed on a Reshape of a rank-3 constant.
    The backend now finds onnxsim in the interpreter's scripts folder; without simplification (option
    not_use_onnxsim) the onnx2tf defect shows, with the node named in one line."""
    import os

    from anpred.backends.tf_onnx import TfOnnxBackend
    from anpred.manifest import Anchor, AnchorManifest

    monkeypatch.setenv("PATH", os.defpath)  # as when .venv/bin/python runs without activating the venv
    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))  # convert every time (tiny: ~5 s)
    path = tmp_path / "constant_reshape.onnx"
    grid = _constant_reshape_model(path)
    manifest = AnchorManifest(anchors=[Anchor("output/y", "y", 0, 0, "add", "Add", [1, 32], "float32", kind="output")])
    x = np.random.default_rng(0).random((1, 32), dtype=np.float32)
    with TfOnnxBackend() as b:
        b.prepare(path, manifest, tmp_path / "w")
        np.testing.assert_allclose(b.run({"x": x})["output/y"], x + grid.reshape(1, 32), rtol=0, atol=1e-6)
    assert os.environ["PATH"] == os.defpath  # restored
    with pytest.raises(BackendError, match=r"at ONNX node reshape_grid: ValueError: Output tensors of a Functional"):
        TfOnnxBackend({"onnx2tf": {"not_use_onnxsim": True}}).prepare(path, manifest, tmp_path / "w2")


def test_tf_missing_onnxsim_is_a_clear_error(tmp_path, monkeypatch):
    import sysconfig

    from anpred.backends.tf_onnx import TfOnnxBackend
    from anpred.manifest import Anchor, AnchorManifest

    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))  # no cached conversion to hide the check
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(empty))
    path = tmp_path / "constant_reshape.onnx"
    _constant_reshape_model(path)
    manifest = AnchorManifest(anchors=[Anchor("output/y", "y", 0, 0, "add", "Add", [1, 32], "float32", kind="output")])
    with pytest.raises(BackendError, match="onnxsim command .* not in"):
        TfOnnxBackend().prepare(path, manifest, tmp_path / "w")
    assert not any((tmp_path / "cache").rglob("meta.json"))  # nothing half-written
