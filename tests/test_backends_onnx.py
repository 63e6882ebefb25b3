"""Backends on real models: YOLOv8n (anchored, two real photographs) on every ONNX-capable backend,
PP-OCRv4 detection from the rapidocr wheel; inputs (letterbox, npz, seeds)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_models  # noqa: E402

from anpred.errors import InputError  # noqa: E402
from anpred.inputs import InputSpec, ModelInput, check_sample  # noqa: E402
from anpred.runner import run_model  # noqa: E402

ONNX_BACKENDS = ["ort", "ort-noopt", "openvino", "openvino-bf16", "onnx-reference", "ort-fp16", "ort-int8"]
FP32 = ["ort-noopt", "openvino", "onnx-reference"]
# converter backends join when their modules exist (written by other helpers)
CONVERTERS = [n for n, m in (("torch", "anpred.backends.torch_onnx"), ("tf", "anpred.backends.tf_onnx"))
              if importlib.util.find_spec(m) is not None]


@pytest.fixture(scope="session")
def yolo_model():
    return run_models.anchored_yolo()


@pytest.fixture(scope="session")
def yolo_run(yolo_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "yolo"
    return run_model(yolo_model, ONNX_BACKENDS + CONVERTERS, str(run_models.ultralytics_assets()), out,
                     timeout_s=300, progress=False)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))


def test_yolo_every_backend_captures_every_anchor(yolo_run):
    man = yolo_run.manifest
    assert len(man.anchors) >= 8
    st = yolo_run.statuses()
    assert list(st) == ONNX_BACKENDS + CONVERTERS
    for name in CONVERTERS:  # converter backends capture every anchor or say why not
        s = st.pop(name)
        assert s.status == "ok" or (s.status in ("failed", "unsupported") and s.reason), (name, s.status, s.reason)
        if s.status == "ok":
            assert s.anchors_captured == len(man.anchors), (name, s.captures)
    for name, s in st.items():
        assert s.status == "ok", (name, s.reason)
        assert s.samples == 2
        assert s.anchors_captured == len(man.anchors), (name, {k: v for k, v in s.captures.items() if v["status"] != "exact"})
        assert s.versions["python"]
        assert s.seconds_run > 0
    assert st["ort"].versions["onnxruntime"] == __import__("onnxruntime").__version__
    assert st["openvino"].precision == "fp32"
    assert st["openvino-bf16"].precision == "bf16"  # the hint read back from the compiled model
    assert st["ort-fp16"].precision == "fp16" and st["ort-int8"].precision == "int8"
    assert "avx2" in yolo_run.meta["machine"]["cpu_flags"] or yolo_run.meta["machine"]["machine"] != "x86_64"
    assert [Path(s["source"]).name for s in yolo_run.meta["samples"]] == ["bus.jpg", "zidane.jpg"]


def test_yolo_tensors_dtype_shape_and_agreement(yolo_run):
    man = yolo_run.manifest
    for sid in yolo_run.sample_ids:
        ref = yolo_run.read_anchors("ort", sid)
        assert set(ref) == set(man.names())
        for a in man.anchors:
            assert str(ref[a.name].dtype) == a.dtype
            assert list(ref[a.name].shape) == a.shape
        for b in ONNX_BACKENDS[1:]:
            got = yolo_run.read_anchors(b, sid)
            for a in man.anchors:
                assert got[a.name].dtype == ref[a.name].dtype, (b, a.name)  # stored dtype kept (fp16/int8 too)
                assert got[a.name].shape == ref[a.name].shape
                assert np.isfinite(got[a.name]).all()
        out = "output/output0"
        for b in FP32:
            assert _rel(yolo_run.read_anchors(b, sid)[out], ref[out]) < 1e-4, b
        # reduced precision really differs, but stays in range of the fp32 output
        e16 = _rel(yolo_run.read_anchors("ort-fp16", sid)[out], ref[out])
        e8 = _rel(yolo_run.read_anchors("ort-int8", sid)[out], ref[out])
        assert 0 < e16 < 5e-2 and 0 < e8 < 0.5, (e16, e8)
        assert e8 > e16
    # the letterboxed photo reached every backend identically
    x = yolo_run.read_inputs("s0000")["images"]
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    assert np.allclose(x[0, :, :, 0], 114 / 255)  # bus.jpg is portrait: padded left and right


def test_reduced_precision_models_are_real_conversions(yolo_model, tmp_path):
    """ort-fp16 runs a float16 graph (not Cast pairs) and ort-int8 a QDQ graph; anchors stay outputs."""
    import onnx

    from anpred.backends.ort_lowp import OrtFp16Backend, OrtInt8Backend
    from anpred.manifest import AnchorManifest

    man = AnchorManifest.from_model(onnx.load(str(yolo_model), load_external_data=False))
    spec = InputSpec.parse("random:images:seed=0:n=2")
    from anpred.inputs import model_inputs

    cal = []
    for i, (_, arr) in enumerate(spec.samples(model_inputs(onnx.load(str(yolo_model))), "yolo")):
        np.savez(tmp_path / f"{i}.npz", **arr)
        cal.append(str(tmp_path / f"{i}.npz"))
    fp16 = OrtFp16Backend()
    fp16.prepare(yolo_model, man, tmp_path / "w16")
    m16 = onnx.load(str(fp16.converted_path))
    init_types = {t.data_type for t in m16.graph.initializer if len(t.dims) == 4}
    assert init_types == {onnx.TensorProto.FLOAT16}
    assert {o.name for o in m16.graph.output} >= {a.name for a in man.anchors if a.kind != "output"}
    int8 = OrtInt8Backend({"calibration": cal})
    int8.prepare(yolo_model, man, tmp_path / "w8")
    m8 = onnx.load(str(int8.converted_path))
    ops = {n.op_type for n in m8.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    with np.load(cal[0]) as z:
        res = int8.run({k: z[k] for k in z.files})
    assert set(res) == set(man.names()) and all(v.dtype == np.float32 for v in res.values())


def test_ppocr_det_from_rapidocr_wheel(tmp_path):
    model = run_models.anchored_ppocr_det()
    spec = InputSpec(kind="random", distribution="images", seed=3, n=1, size=256)
    store = run_model(model, ["ort", "openvino", "onnx-reference", "ort-fp16"], spec, tmp_path / "ocr",
                      timeout_s=300, progress=False)
    n = len(store.manifest.anchors)
    assert n >= 8
    for name, s in store.statuses().items():
        assert s.status == "ok" and s.anchors_captured == n, (name, s.reason)
    x = store.read_inputs("s0000")["x"]
    assert x.shape == (1, 3, 256, 256) and abs(float(x.mean())) < 3  # imagenet-normalised photo crop
    assert store.meta["inputs"]["preprocess"] == "auto" and store.meta["inputs"]["distribution"] == "images"
    ref = store.read_anchors("ort", "s0000")
    prob = ref["output/sigmoid_0.tmp_0"]
    assert prob.shape == (1, 1, 256, 256) and 0 <= prob.min() and prob.max() <= 1
    ov, rf = store.read_anchors("openvino", "s0000"), store.read_anchors("onnx-reference", "s0000")
    for k in ref:  # probabilities (mostly ~0 here) compared absolutely, feature maps relatively
        err = np.abs(ov[k] - ref[k]).max() if k == "output/sigmoid_0.tmp_0" else _rel(ov[k], ref[k])
        assert err < 1e-4, (k, err)
        # onnx-reference 1.23.2 deviates from both by 2-5 % (relative to max) from the first anchor on
        # for this model (seen, not judged here: that is the oracle's job); it must still deliver
        assert rf[k].shape == ref[k].shape and np.isfinite(rf[k]).all()


# ---- inputs --------------------------------------------------------------------------------------
def test_random_inputs_are_seeded_and_follow_the_distribution():
    inp = [ModelInput("x", "float32", ["batch", 3, 64, 64]), ModelInput("ids", "int64", [1, 5])]
    a = list(InputSpec.parse("random:normal:seed=7:n=3").samples(inp))
    b = list(InputSpec.parse("random:normal:seed=7:n=3").samples(inp))
    c = list(InputSpec.parse("random:normal:seed=8:n=3").samples(inp))
    assert len(a) == 3 and a[0][1]["x"].shape == (1, 3, 64, 64) and a[0][1]["ids"].dtype == np.int64
    assert all(np.array_equal(x[1]["x"], y[1]["x"]) for x, y in zip(a, b))
    assert not np.array_equal(a[0][1]["x"], c[0][1]["x"])
    allx = np.concatenate([s[1]["x"].ravel() for s in a])
    assert abs(allx.mean()) < 0.02 and abs(allx.std() - 1) < 0.02
    u = np.concatenate([s[1]["x"].ravel() for s in InputSpec.parse("random:uniform:n=2").samples(inp)])
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_npz_inputs_stacked_and_bad_ones(tmp_path):
    inp = [ModelInput("x", "float32", [1, 3, 8, 8])]
    np.savez(tmp_path / "a.npz", x=np.ones((4, 1, 3, 8, 8)))  # float64, 4 samples stacked
    got = list(InputSpec.parse(tmp_path / "a.npz").samples(inp))
    assert len(got) == 4 and got[2][1]["x"].dtype == np.float32 and got[2][0].endswith("a.npz[2]")
    np.save(tmp_path / "b.npy", np.zeros((1, 3, 9, 8), np.float32))
    with pytest.raises(InputError, match=r"shape \(1, 3, 9, 8\) does not fit the model's 1x3x8x8"):
        list(InputSpec.parse(tmp_path / "b.npy").samples(inp))
    with pytest.raises(InputError, match="missing"):
        check_sample({"y": np.zeros((1, 3, 8, 8), np.float32)}, inp)
    with pytest.raises(InputError, match="dtype"):
        check_sample({"x": np.zeros((1, 3, 8, 8), bool)}, inp)
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(InputError, match="cannot read image"):
        list(InputSpec.parse(tmp_path / "bad.jpg").samples(inp))
    with pytest.raises(InputError, match="malformed"):
        InputSpec.parse("random:uniform:seed")
