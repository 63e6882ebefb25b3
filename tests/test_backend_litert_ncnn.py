"""Backends ``litert`` (onnx2tf's conversion -> TFLite float32 -> LiteRT + XNNPACK) and ``ncnn``
(pnnx -> ncnn) against ONNX Runtime, run through :func:`anpred.run.run_model` (one process each).

Models: a small CNN built here (torch -> ONNX with the TorchScript exporter, anchored with
``anpred.instrument``): Conv+BatchNorm, SiLU, ReLU, MaxPool, AveragePool, nearest Resize, Concat,
Sigmoid, Mul, GlobalAveragePool, Gemm, Softmax; the zoo's YOLOv8n at 320 px (slow: it pays the
onnx2tf conversion, ~50 s, when the ``tf`` backend has not cached it yet); a Relu -> Det graph that
neither can run. Conversions are cached by content (anpred.cache).

Tolerances (max |backend - ort| / max |ort| per anchor), measured here: litert 2.5e-6 (small CNN),
3.2e-5 (YOLOv8n output); ncnn 4.5e-6 (small CNN), 1.0e-4 (YOLOv8n output, ncnn's fp32 Winograd
convolutions). Bars: LITERT_RTOL, NCNN_RTOL.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_models  # noqa: E402

from anpred.errors import BackendError  # noqa: E402
from anpred.run import run_model  # noqa: E402

LITERT_RTOL = 1e-4
NCNN_RTOL = 5e-4
SIZE = 32


def _cnn_onnx(path: Path) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(
                torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.SiLU()
            )
            self.down = torch.nn.Sequential(
                torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)
            )
            self.side = torch.nn.Sequential(torch.nn.AvgPool2d(2), torch.nn.Conv2d(16, 8, 1))
            self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")
            self.mix = torch.nn.Conv2d(40, 24, 3, padding=1)
            self.head = torch.nn.Linear(24, 10)

        def forward(self, x):
            s = self.stem(x)  # 16 x 32 x 32
            d = self.up(self.down(s))  # 32 x 16 x 16
            m = self.mix(torch.cat([d, self.side(s)], 1))
            m = m * torch.sigmoid(m)
            return torch.softmax(self.head(m.mean((2, 3))), -1)

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        net.stem[1].running_mean.uniform_(-0.5, 0.5)
        net.stem[1].running_var.uniform_(0.5, 2.0)
    torch.onnx.export(
        net,
        (torch.rand(1, 3, SIZE, SIZE),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        output_names=["probs"],
    )


@pytest.fixture(scope="session")
def cnn() -> Path:
    import onnx

    import anpred.instrument
    from anpred.cache import cache_key, cached_dir
    from anpred.instrument import instrument_model

    def build(d: Path) -> None:
        _cnn_onnx(d / "cnn.onnx")
        model, manifest = instrument_model(onnx.load(str(d / "cnn.onnx")), stages=4, source_path=d / "cnn.onnx")
        manifest.to_model(model)
        onnx.save(model, str(d / "cnn.anchored.onnx"))

    d = cached_dir("test-models", cache_key("litert-ncnn-cnn", SIZE, Path(anpred.instrument.__file__), 1), build)
    return d / "cnn.anchored.onnx"


def _rel_errors(store, backend: str) -> dict[str, float]:
    """Per anchor, max over samples of max |y - ort| / max |ort| (after the capture's transform)."""
    caps = store.statuses()[backend].captures
    errs: dict[str, float] = {}
    for sid in store.sample_ids:
        ref, got = store.read_anchors("ort", sid), store.read_anchors(backend, sid)
        for a in store.manifest.anchors:
            y = got[a.name]
            perm = (caps[a.name].get("transform") or {}).get("permute")
            y = np.transpose(y, perm) if perm else y
            r = ref[a.name]
            assert y.shape == r.shape and y.dtype == r.dtype, (backend, a.name, y.shape, r.shape, y.dtype)
            e = float(np.abs(y.astype(np.float64) - r).max() / max(float(np.abs(r).max()), 1e-30))
            errs[a.name] = max(errs.get(a.name, 0.0), e)
    return errs


def _check_run(store, n_samples: int) -> dict[str, dict[str, float]]:
    st = store.statuses()
    n = len(store.manifest.anchors)
    for b in ("ort", "litert", "ncnn"):
        assert st[b].status == "ok", (b, st[b].reason)
        assert st[b].samples == n_samples and st[b].anchors_captured == n, (b, st[b].captures)
        assert st[b].precision == "fp32"
    assert st["litert"].family == "litert" and st["ncnn"].family == "ncnn"
    assert st["litert"].versions["ai-edge-litert"] == "2.3.0" and st["litert"].versions["onnx2tf"]
    assert st["ncnn"].versions["ncnn"] and st["ncnn"].versions["pnnx"]
    # litert: 4-D anchors channels-last with the recorded transform; ncnn: ONNX layout restored
    four_d = [a.name for a in store.manifest.anchors if len(a.shape) == 4]
    assert four_d
    for a in four_d:
        assert st["litert"].captures[a]["transform"] == {"permute": [0, 3, 1, 2]}, a
        assert st["ncnn"].captures[a]["transform"] is None and st["ncnn"].captures[a]["target"].startswith("out")
    errs = {b: _rel_errors(store, b) for b in ("litert", "ncnn")}
    print("\nmax relative error per anchor:", {b: {k: f"{v:.1e}" for k, v in e.items()} for b, e in errs.items()})
    assert max(errs["litert"].values()) < LITERT_RTOL, errs["litert"]
    assert max(errs["ncnn"].values()) < NCNN_RTOL, errs["ncnn"]
    return errs


@pytest.mark.kernels
# an onnx2tf conversion and a pnnx one (~32 s cold); litert: the Slice net of test_converter_gaps, ncnn: its
# integer-input test run by default
@pytest.mark.slow
def test_small_cnn_every_anchor_on_litert_and_ncnn(cnn, tmp_path):
    store = run_model(
        cnn,
        ["ort", "litert", "ncnn"],
        f"random:uniform:seed=3:n=2:shape=1x3x{SIZE}x{SIZE}",
        tmp_path / "run",
        timeout_s=300,
        progress=False,
    )
    assert len(store.manifest.anchors) >= 4
    errs = _check_run(store, 2)
    # the values differ from ORT's (independent kernels), they are not a copy
    assert max(errs["litert"].values()) > 0 and max(errs["ncnn"].values()) > 0
    # ncnn's blobs are graph outputs by position: out<k> for graph output k
    import onnx

    outs = [o.name for o in onnx.load(str(cnn), load_external_data=False).graph.output]
    caps = store.statuses()["ncnn"].captures
    for a in store.manifest.anchors:
        k = outs.index(a.name if a.name in outs else a.value)
        assert caps[a.name]["target"] == f"out{k}"


@pytest.mark.kernels
@pytest.mark.slow
def test_zoo_yolov8n_320_on_litert_and_ncnn(tmp_path):
    store = run_model(
        run_models.anchored_zoo_yolo(320),
        ["ort", "litert", "ncnn"],
        str(run_models.ultralytics_assets()),
        tmp_path / "yolo",
        timeout_s=600,
        progress=False,
    )
    assert len(store.manifest.anchors) >= 8
    _check_run(store, 2)  # asserts every anchor against ORT
    st = store.statuses()
    print(
        {
            b: (round(st[b].seconds_prepare, 1), round(1000 * st[b].seconds_run / st[b].samples, 1))
            for b in ("ort", "litert", "ncnn")
        }
    )


def _det_model(path: Path):
    """x (1, 4, 4) -> Relu -> Det -> y (1,), the Relu output an anchor."""
    import onnx
    from onnx import TensorProto, helper

    from anpred.manifest import Anchor, AnchorManifest

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Det", ["r"], ["y"], name="det")],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 4]),
        ],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return AnchorManifest(
        anchors=[
            Anchor("anchor/00/r", "r", 0, 0, "relu", "Relu", [1, 4, 4], "float32"),
            Anchor("output/y", "y", 1, 1, "det", "Det", [1], "float32", kind="output"),
        ]
    )


def test_ncnn_refuses_what_pnnx_cannot_lower_and_other_batches(tmp_path):
    from anpred.backends.ncnn_pnnx import NcnnBackend

    path = tmp_path / "det.onnx"
    manifest = _det_model(path)
    with pytest.raises(BackendError, match=r"pnnx could not lower ONNX op\(s\) Det"):
        NcnnBackend().prepare(path, manifest, tmp_path / "w")
    assert NcnnBackend.coverage_basis == "" and NcnnBackend.unsupported_ops(None) == {}
    import onnx

    m = onnx.load(str(path))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(m, str(tmp_path / "dyn.onnx"))
    with pytest.raises(BackendError, match="dynamic dims.*input_shapes"):
        NcnnBackend().prepare(tmp_path / "dyn.onnx", manifest, tmp_path / "w")
    # a first dimension other than 1 is no batch: the input gets a unit batch axis and converts (up to Det)
    with pytest.raises(BackendError, match=r"pnnx could not lower ONNX op\(s\) Det"):
        NcnnBackend({"input_shapes": {"x": [2, 4, 4]}}).prepare(tmp_path / "dyn.onnx", manifest, tmp_path / "w")
    with pytest.raises(BackendError, match="use_fp16_storage"):
        NcnnBackend({"ncnn": {"use_fp16_storage": True}}).prepare(tmp_path / "dyn.onnx", manifest, tmp_path / "w")


@pytest.mark.slow  # an onnx2tf conversion (~14 s cold)
def test_litert_refuses_tf_ops_without_tflite_builtin(tmp_path):
    """onnx2tf converts Det (tf.linalg.det, which the ``tf`` backend runs), but MatrixDeterminant
    has no TFLite builtin: litert names it."""
    from anpred.backends.litert import LiteRtBackend

    path = tmp_path / "det.onnx"
    manifest = _det_model(path)
    with pytest.raises(BackendError, match="LiteRT cannot run TF op.*MatrixDeterminant"):
        LiteRtBackend().prepare(path, manifest, tmp_path / "w")


@pytest.mark.kernels
@pytest.mark.slow  # two onnx2tf conversions (~40 s cold)
def test_litert_runs_erf_decomposed(tmp_path):
    """GELU (x * 0.5 * (1 + Erf(x / sqrt 2))) after a MatMul: TFLite has no builtin for TF's Erf, so the
    first conversion fails; litert converts again with Erf decomposed (Eigen's rational approximation,
    passes.frontend_rewrites) and runs: every anchor within 64 eps32 of ONNX Runtime (relative to max |ort|),
    ``decomposed_operators`` says so; ``tf`` keeps TensorFlow's own Erf."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from anpred.backends.litert import LiteRtBackend
    from anpred.manifest import Anchor, AnchorManifest

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (16, 32)).astype(np.float32), "w")
    consts = [
        numpy_helper.from_array(np.asarray(v, np.float32), n)
        for n, v in (("rs2", 1 / np.sqrt(2)), ("one", 1.0), ("half", 0.5))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Mul", ["h", "rs2"], ["hs"], name="scale"),
        helper.make_node("Erf", ["hs"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
        helper.make_node("Mul", ["h", "e1"], ["he"], name="mul"),
        helper.make_node("Mul", ["he", "half"], ["y"], name="gelu"),
    ]
    g = helper.make_graph(
        nodes,
        "gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32]),
            helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 8, 32]),
        ],
        [w] + consts,
    )
    path = tmp_path / "gelu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    manifest = AnchorManifest(
        anchors=[
            Anchor("anchor/00/e", "e", 0, 0, "erf", "Erf", [1, 8, 32], "float32"),
            Anchor("output/y", "y", 1, 1, "gelu", "Mul", [1, 8, 32], "float32", kind="output"),
        ]
    )
    import onnxruntime as ort

    x = rng.normal(0, 1, (1, 8, 16)).astype(np.float32)
    ref = dict(zip(["y", "e"], ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})))
    with LiteRtBackend() as b:
        b.prepare(path, manifest, tmp_path / "w")
        assert b.versions()["decomposed_operators"] == "Erf"
        got = b.run({"x": x})
    for a, v in (("anchor/00/e", "e"), ("output/y", "y")):
        err = float(np.abs(got[a].astype(np.float64) - ref[v]).max())
        assert err <= 64 * np.finfo(np.float32).eps * max(1.0, float(np.abs(ref[v]).max())), (a, err)


def test_litert_unsupported_ops_from_onnx2tf_modules():
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("CastLike", ["r", "x"], ["c"]),
            helper.make_node("Frobnicate", ["c"], ["y"], domain="com.example"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    from anpred.backends import backend_class

    cls = backend_class("litert")
    missing = cls.unsupported_ops(m)
    assert set(missing) == {"CastLike", "com.example::Frobnicate"}, missing
    assert "onnx2tf/ops/CastLike.py" in missing["CastLike"]
    assert "onnx2tf" in cls.coverage_basis


@pytest.mark.kernels
def test_ncnn_takes_integer_inputs_as_float32_cast_back_in_the_graph(tmp_path):
    """A uint8 image -> Cast -> Conv: ncnn Mats hold float32, so the backend declares the input float32
    and the Cast to float becomes an Identity (pnnx cannot lower a Cast: "todo Tensor.to"); exact for
    integers below 2^24, values equal ORT's to fp32 rounding; values beyond 2^24 are refused."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    from anpred.errors import InputError
    from anpred.instrument import instrument_model

    rng = np.random.default_rng(0)
    w = nh.from_array(rng.normal(0, 0.05, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        h.make_node("Cast", ["img"], ["f"], to=T.FLOAT),
        h.make_node("Conv", ["f", "w"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["y"]),
    ]
    g = h.make_graph(
        nodes,
        "u8",
        [h.make_tensor_value_info("img", T.UINT8, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])],
        [w],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    am, man = instrument_model(m)
    man.to_model(am)
    onnx.save(am, str(tmp_path / "a.onnx"))
    np.savez(tmp_path / "x.npz", img=rng.integers(0, 256, (2, 1, 3, 8, 8)).astype(np.uint8))
    store = run_model(
        tmp_path / "a.onnx", ["ort", "ncnn"], tmp_path / "x.npz", tmp_path / "run", progress=False, timeout_s=300
    )
    st = store.statuses()["ncnn"]
    assert st.status == "ok", st.reason
    for sid in store.sample_ids:
        a, b = store.read_anchors("ort", sid), store.read_anchors("ncnn", sid)
        for k in a:
            assert np.abs(b[k] - a[k]).max() <= 64 * np.finfo(np.float32).eps * max(1.0, np.abs(a[k]).max())
    from anpred.backends.ncnn_pnnx import NcnnBackend

    with NcnnBackend({"input_shapes": {"img": [1, 3, 8, 8]}}) as be:
        be.prepare(tmp_path / "a.onnx", man, tmp_path / "w")
        big = np.full((1, 3, 8, 8), 2**25, np.int64)
        with pytest.raises(InputError, match="beyond 2\\^24"):
            be.run({"img": big})
