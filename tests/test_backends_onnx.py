"""Backends on real models: YOLOv8n (the zoo's dynamo export at 320, anchored, two real photographs)
on every ONNX-capable backend and both converters, PP-OCRv4 detection from the rapidocr wheel at its
dynamic input shape (tf and torch included); inputs (letterbox, npz, seeds)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_models  # noqa: E402

from anpred.errors import InputError  # noqa: E402
from anpred.inputs import InputSpec, ModelInput, check_sample  # noqa: E402
from anpred.machine import kernel_isa  # noqa: E402
from anpred.run import run_model  # noqa: E402

from isa_reasons import FP32_BOUND

ONNX_BACKENDS = ["ort", "ort-noopt", "openvino", "openvino-bf16", "onnx-reference", "ort-fp16", "ort-int8"]
FP32 = ["ort-noopt", "openvino", "onnx-reference", "torch", "tf"]
CONVERTERS = ["torch", "tf"]


@pytest.fixture(scope="session")
def yolo_model():
    return run_models.anchored_zoo_yolo(320)


@pytest.fixture(scope="session")
def yolo_run(yolo_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "yolo"
    return run_model(
        yolo_model, ONNX_BACKENDS + CONVERTERS, str(run_models.ultralytics_assets()), out, timeout_s=300, progress=False
    )


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))


@pytest.mark.slow  # YOLOv8n on every backend: ~50 s cold (the default run's budget, issue 18)
def test_yolo_every_backend_captures_every_anchor(yolo_run):
    man = yolo_run.manifest
    assert len(man.anchors) >= 8
    st = yolo_run.statuses()
    assert list(st) == ONNX_BACKENDS + CONVERTERS
    for name, s in st.items():
        assert s.status == "ok", (name, s.reason)
        assert s.samples == 2
        assert s.anchors_captured == len(man.anchors), (
            name,
            {k: v for k, v in s.captures.items() if v["status"] != "exact"},
        )
        assert s.versions["python"]
        assert s.seconds_run > 0
    assert st["ort"].versions["onnxruntime"] == __import__("onnxruntime").__version__
    # precisions read back from the runtimes / converted models, not the class constants
    ov, ov16 = st["openvino"].versions, st["openvino-bf16"].versions
    assert st["openvino"].precision == "fp32" and ov["openvino_compiled_precision_hint"] == "fp32"
    assert "Convolution/fp32" in ov["openvino_runtime_precisions"]
    assert "Convolution/bf16" not in ov["openvino_runtime_precisions"]
    conv16 = dict(kv.split(":") for kv in ov16["openvino_runtime_precisions"].split(","))
    flags = yolo_run.meta["machine"]["cpu_flags"]
    # what the CPU can compute decides what OpenVINO compiles a bf16 hint to (anpred.machine.kernel_isa,
    # from cpuid): bf16 where AVX512_BF16/AMX-BF16 exist, fp32 elsewhere; the run record says both
    assert st["openvino-bf16"].precision_requested == "bf16" and st["openvino"].precision_requested == "fp32"
    if kernel_isa(flags)["bf16"] == "native":  # bf16 instructions: the convolutions really run in bf16
        assert ov16["openvino_compiled_precision_hint"] == "bf16"
        assert st["openvino-bf16"].precision == "bf16" and int(conv16.get("Convolution/bf16", 0)) > 0, conv16
        assert not st["openvino-bf16"].precision_differs
    else:
        assert ov16["openvino_compiled_precision_hint"] == "fp32"
        assert st["openvino-bf16"].precision == "fp32" and "Convolution/bf16" not in conv16, conv16
        assert st["openvino-bf16"].precision_differs
    assert (
        st["openvino-bf16"].precision
        == max((k for k in conv16 if k.startswith("Convolution/")), key=lambda k: int(conv16[k])).split("/")[1]
    )
    assert st["ort-int8"].versions["mlas_u8s8_kernel"] == kernel_isa(flags)["int8_u8s8"]
    assert st["ort-fp16"].precision == "fp16"
    n16, n32 = (int(x.split(":")[1]) for x in st["ort-fp16"].versions["converted_weights"].split(","))
    assert n16 >= 60 and n32 == 0  # YOLOv8n: 64 conv weights, all float16
    assert st["ort-int8"].precision == "int8"
    q = dict(kv.split(":") for kv in st["ort-int8"].versions["qdq_nodes"].split(","))
    assert int(q["QuantizeLinear"]) > 50 and int(q["DequantizeLinear"]) > 50
    assert "int8" in st["ort-int8"].versions["quantized_types"].split(",")
    assert yolo_run.meta["inputs"]["preprocess"] == "yolo" and yolo_run.meta["inputs"]["preprocess_requested"] == "auto"
    assert "avx2" in flags or yolo_run.meta["machine"]["machine"] != "x86_64"
    assert [Path(s["source"]).name for s in yolo_run.meta["samples"]] == ["bus.jpg", "zidane.jpg"]


@pytest.mark.kernels  # ort-int8 and ort-fp16 errors bounded: int8/fp16 kernels' arithmetic
@pytest.mark.slow  # shares the ~50 s YOLOv8n-on-every-backend run (the default run's budget, issue 18)
def test_yolo_tensors_dtype_shape_and_agreement(yolo_run):
    man = yolo_run.manifest
    for sid in yolo_run.sample_ids:
        ref = yolo_run.read_anchors("ort", sid)
        assert set(ref) == set(man.names())
        for a in man.anchors:
            assert str(ref[a.name].dtype) == a.dtype
            assert list(ref[a.name].shape) == a.shape
        for b in ONNX_BACKENDS[1:] + CONVERTERS:
            got = yolo_run.read_anchors(b, sid)
            info = yolo_run.statuses()[b].captures
            for a in man.anchors:
                y = got[a.name]
                perm = (info[a.name].get("transform") or {}).get("permute")
                if perm:  # tf returns 4-D anchors NHWC
                    y = np.transpose(y, perm)
                assert y.dtype == ref[a.name].dtype, (b, a.name)  # stored dtype kept (fp16/int8 too)
                assert y.shape == ref[a.name].shape, (b, a.name, y.shape)
                assert np.isfinite(y).all()
        out = "output/cat_18"
        for b in FP32:
            assert _rel(yolo_run.read_anchors(b, sid)[out], ref[out]) < 1e-4, b
        # reduced precision really differs, but stays in range of the fp32 output
        e16 = _rel(yolo_run.read_anchors("ort-fp16", sid)[out], ref[out])
        e8 = _rel(yolo_run.read_anchors("ort-int8", sid)[out], ref[out])
        assert 0 < e16 < 5e-2 and 0 < e8 < 0.5, (e16, e8)
        assert e8 > e16
    # the letterboxed photo reached every backend identically
    x = yolo_run.read_inputs("s0000")["x"]
    assert x.shape == (1, 3, 320, 320) and x.dtype == np.float32
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


@pytest.mark.slow  # ~13 s (PP-OCR's detector on seven ONNX-runtime backends)
@pytest.mark.isa_independent(FP32_BOUND)
def test_ppocr_det_from_rapidocr_wheel(tmp_path):
    model = run_models.anchored_ppocr_det()
    spec = InputSpec(kind="random", distribution="images", seed=3, n=1, size=256)
    # every ONNX-runtime backend of issue 3 (tf and torch run it in the dynamic-shape test below)
    store = run_model(
        model,
        ["ort", "ort-noopt", "openvino", "openvino-bf16", "onnx-reference", "ort-fp16", "ort-int8"],
        spec,
        tmp_path / "ocr",
        timeout_s=300,
        progress=False,
    )
    n = len(store.manifest.anchors)
    assert n >= 8
    for name, s in store.statuses().items():
        assert s.status == "ok" and s.anchors_captured == n, (name, s.reason)
    x = store.read_inputs("s0000")["x"]
    assert x.shape == (1, 3, 256, 256) and abs(float(x.mean())) < 3  # imagenet-normalised photo crop
    assert store.meta["inputs"]["preprocess"] == "imagenet" and store.meta["inputs"]["distribution"] == "images"
    assert store.meta["inputs"]["preprocess_requested"] == "auto"
    ref = store.read_anchors("ort", "s0000")
    prob = ref["output/sigmoid_0.tmp_0"]
    assert prob.shape == (1, 1, 256, 256) and 0 <= prob.min() and prob.max() <= 1
    assert store.statuses()["ort-int8"].precision == "int8" and store.statuses()["ort-fp16"].precision == "fp16"
    noopt = store.read_anchors("ort-noopt", "s0000")
    assert max(_rel(noopt[k], ref[k]) for k in ref if k != "output/sigmoid_0.tmp_0") < 1e-4
    ov, rf = store.read_anchors("openvino", "s0000"), store.read_anchors("onnx-reference", "s0000")
    for k in ref:  # probabilities (mostly ~0 here) compared absolutely, feature maps relatively
        err = np.abs(ov[k] - ref[k]).max() if k == "output/sigmoid_0.tmp_0" else _rel(ov[k], ref[k])
        assert err < 1e-4, (k, err)
        # onnx-reference 1.23.2 deviates from both by 2-5 % (relative to max) from the first anchor on
        # for this model (seen, not judged here: that is the oracle's job); it must still deliver
        assert rf[k].shape == ref[k].shape and np.isfinite(rf[k]).all()


@pytest.mark.isa_independent(FP32_BOUND)
@pytest.mark.slow
def test_ppocr_det_dynamic_shape_on_converters(tmp_path):
    """The shipped PP-OCRv4 det keeps its dynamic input [N, 3, H, W]; tf (onnx2tf, input fixed to the
    run's shape, NHWC) and torch capture every anchor and agree with ort."""
    model = run_models.anchored_ppocr_det()
    import onnx

    dims = onnx.load(str(model), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [0, 3, 0, 0]  # dynamic N, H, W in the model run
    store = run_model(
        model,
        ["ort", "tf", "torch"],
        "random:images:seed=1:n=2:shape=1x3x96x128",
        tmp_path / "dyn",
        timeout_s=300,
        progress=False,
    )
    st = store.statuses()
    n = len(store.manifest.anchors)
    for name, s in st.items():
        assert s.status == "ok" and s.anchors_captured == n and s.samples == 2, (name, s.reason)
    assert st["tf"].versions["tensorflow"] == __import__("tensorflow").__version__
    nhwc = [a for a, c in st["tf"].captures.items() if c["transform"] == {"permute": [0, 3, 1, 2]}]
    assert nhwc  # some anchors come back channels-last, decided per anchor from the concrete shapes
    for sid in store.sample_ids:
        ref = store.read_anchors("ort", sid)
        for b in ("tf", "torch"):
            got = store.read_anchors(b, sid)
            for a in store.manifest.anchors:
                y = got[a.name]
                perm = (st[b].captures[a.name]["transform"] or {}).get("permute")
                y = np.transpose(y, perm) if perm else y
                assert y.shape == ref[a.name].shape, (b, a.name)
                err = np.abs(y.astype(np.float64) - ref[a.name]).max() / max(np.abs(ref[a.name]).max(), 1e-2)
                assert err < 1e-4, (b, a.name, err)


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
    with pytest.raises(
        InputError, match=r"^input 'x' \(b.npy\): shape \(1, 3, 9, 8\) does not fit the model's 1x3x8x8"
    ):
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
    (tmp_path / "corrupt.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match="not a valid .npz"):
        list(InputSpec.parse(tmp_path / "corrupt.npz").samples(inp))


def test_input_shapes_checked_against_dynamic_model():
    import onnx

    from anpred.inputs import check_shapes_fit

    m = onnx.load(str(run_models.anchored_ppocr_det()), load_external_data=False)
    check_shapes_fit(m, {"x": (1, 3, 96, 128)})  # multiples of 32 fit
    with pytest.raises(InputError, match=r"x=1x3x250x250 does not fit the model: Add node"):
        check_shapes_fit(m, {"x": (1, 3, 250, 250)})


def test_ort_thread_pools_sleep_instead_of_spinning_beside_a_judge(monkeypatch):
    """ONNX Runtime's thread pool spin-waits between operators by default, burning the core that a
    streamed run's judge needs (docs/task.md): where the process shares the cores with it
    (``ANPRED_THREAD_SPINNING=0``, set for a stream's workers) every ONNX Runtime backend (ort, its
    int8/fp16 variants) turns it off; elsewhere ONNX Runtime's default (spin, faster alone) is kept;
    the ``spinning`` option overrides both."""
    from onnx import TensorProto, helper

    from anpred.backends import backend_class
    from anpred.run.driver import _worker_env

    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )

    def entry(name, options=None):
        so = backend_class(name)(options)._session(m.SerializeToString()).get_session_options()
        try:
            return so.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError as err:  # not set: ONNX Runtime's default (spin)
            assert "does not have configuration" in str(err)
            return None

    monkeypatch.delenv("ANPRED_THREAD_SPINNING", raising=False)
    assert _worker_env(direct_io=False)["ANPRED_THREAD_SPINNING"] == "0"
    assert "ANPRED_THREAD_SPINNING" not in _worker_env()
    assert entry("ort") is None and entry("ort", {"spinning": False}) == "0"
    monkeypatch.setenv("ANPRED_THREAD_SPINNING", "0")
    for name in ("ort", "ort-noopt", "ort-int8", "ort-fp16"):
        assert entry(name) == "0", name
    assert entry("ort", {"spinning": True}) is None
