"""Backends ``tvm`` (Apache TVM Relax + LLVM) and ``mnn`` (Alibaba MNN CPU) on networks built here and
on the zoo's YOLOv8n at 320 px, against ONNX Runtime; their pre-run coverage (an operator each lacks
gives a BackendError naming it and is listed by ``unsupported_ops``).

Tolerances are in units of float32's machine epsilon (2**-23) times the anchor's largest |value| in
ONNX Runtime: fp32 kernels that differ only in summation order and in their exp/erf/sigmoid code.
Measured (this machine, AVX-512): the small networks within 6.5 eps (bound 32 eps); YOLOv8n at 320 on
the two ultralytics photographs within 92 eps = 1.1e-5 relative at every anchor (bound 1024 eps:
rounding grows over 60 layers); MNN's Winograd variant 9.7e-4 relative (bound 1e-2).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
import run_models  # noqa: E402

from anpred.backends import backend_table  # noqa: E402
from anpred.backends.mnn import MnnBackend  # noqa: E402
from anpred.backends.tvm_relax import TvmBackend  # noqa: E402
from anpred.errors import BackendError  # noqa: E402
from anpred.instrument import instrument_file  # noqa: E402
from anpred.run import run_model  # noqa: E402
from ort_session import ort_outputs
from isa_reasons import EXACT_OPS

EPS32 = float(np.finfo(np.float32).eps)
NATIVE = ["tvm", "mnn"]


def _eps_units(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| in units of eps32 * max |ref|."""
    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / (EPS32 * max(np.abs(ref).max(), 1e-30)))


def _ops_net():
    """A network covering conv/BN/SiLU, max and average pooling (``ceil_mode``, ``count_include_pad``),
    a strided conv, ConvTranspose, nearest Resize, Concat, global mean/max, an int64-indexed Embedding
    (Gather), LayerNorm, exact (erf) GELU, Gemm/MatMul, a Reshape whose target is computed from
    ``Shape`` and Softmax; two outputs."""
    import torch
    import torch.nn as nn

    class OpsNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.SiLU())
            self.pool = nn.MaxPool2d(2)
            self.c2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
            self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.avg = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=True)
            self.emb = nn.Embedding(50, 24)
            self.ln = nn.LayerNorm(24)
            self.fc = nn.Linear(24, 24)
            self.gelu = nn.GELU()
            self.head = nn.Linear(16 * 4 + 24, 10)

        def forward(self, x, ids):
            a = self.pool(self.c1(x))
            b = self.c2(a)
            u = nn.functional.interpolate(self.up(b), scale_factor=0.5, mode="nearest")
            p = self.avg(a)  # ceil_mode: one more row/column than floor, averaged over 9 with padding
            g = torch.cat([u.mean((2, 3)), u.amax((2, 3)), p.mean((2, 3)), p.amax((2, 3))], 1)
            t = self.gelu(self.fc(self.ln(self.emb(ids))))
            t = t.reshape(t.shape[0], t.shape[1] * 3, 8).mean(1).repeat(1, 3)  # target computed from Shape
            return torch.softmax(self.head(torch.cat([g, t], 1)), -1), b

    torch.manual_seed(0)
    net = OpsNet().eval()
    with torch.no_grad():
        net.c1[1].running_mean.uniform_(-0.5, 0.5)
        net.c1[1].running_var.uniform_(0.5, 2.0)
        net.c1[1].weight.uniform_(0.5, 1.5)
    return net


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory):
    """OpsNet exported with the TorchScript exporter (opset 17, height/width and the id count dynamic), anchored, run on
    ort/tvm/mnn with two samples of one shape (the runner passes tvm the concrete shapes)."""
    import torch

    d = tmp_path_factory.mktemp("ops")
    x, ids = torch.rand(1, 3, 32, 32), torch.randint(0, 50, (1, 7))
    torch.onnx.export(
        _ops_net(),
        (x, ids),
        str(d / "ops.onnx"),
        dynamo=False,
        opset_version=17,
        input_names=["x", "ids"],
        output_names=["probs", "feat"],
        dynamic_axes={"x": {2: "h", 3: "w"}, "ids": {1: "n"}},
    )
    man = instrument_file(str(d / "ops.onnx"), str(d / "ops.anchored.onnx"))
    rs = np.random.RandomState(0)
    samples = d / "in"
    samples.mkdir()
    for i in range(2):
        np.savez(
            samples / f"s{i}.npz",
            x=rs.rand(1, 3, 40, 40).astype(np.float32) * 2 - 0.5,
            ids=rs.randint(0, 50, (1, 7)).astype(np.int64),
        )
    run = run_model(d / "ops.anchored.onnx", ["ort", *NATIVE], str(samples), d / "run", timeout_s=300, progress=False)
    return run, man, d / "ops.anchored.onnx"


@pytest.mark.kernels  # TVM and MNN within 32 float32 epsilons of ONNX Runtime: their kernels' arithmetic
def test_ops_network_every_anchor_agrees_with_ort(ops_run):
    run, man, _ = ops_run
    st = run.statuses()
    assert len(man.anchors) >= 6
    for b in ["ort", *NATIVE]:
        assert st[b].status == "ok", (b, st[b].reason)
        assert st[b].samples == 2 and st[b].anchors_captured == len(man.anchors), (b, st[b].captures)
        assert st[b].precision == "fp32"
    worst = {}
    for sid in run.sample_ids:
        ref = run.read_anchors("ort", sid)
        for b in NATIVE:
            got = run.read_anchors(b, sid)
            for a in man.anchors:
                assert got[a.name].shape == ref[a.name].shape and got[a.name].dtype == ref[a.name].dtype, (b, a.name)
                worst[b, a.name] = max(worst.get((b, a.name), 0.0), _eps_units(got[a.name], ref[a.name]))
    assert max(worst.values()) <= 32, {k: round(v, 1) for k, v in worst.items() if v > 32}
    # ...and they are not trivially equal to ORT everywhere (independent kernels)
    assert any(v > 0 for k, v in worst.items() if k[0] == "tvm") and any(
        v > 0 for k, v in worst.items() if k[0] == "mnn"
    )


def test_ops_network_records_target_precision_and_kernels(ops_run):
    run, _, _ = ops_run
    tv, mv = run.statuses()["tvm"].versions, run.statuses()["mnn"].versions
    assert tv["tvm"] == __import__("tvm").__version__
    assert tv["tvm_target"] == '{"kind": "llvm"}' and tv["tvm_llvm_cpu"] == "generic"  # portable x86-64 baseline
    assert mv["mnn"] == "3.6.1" or mv["mnn"].startswith("3.")
    assert mv["mnn_precision"] == "Precision_High" and mv["mnn_winograd"].startswith("off") and mv["mnn_threads"] == "1"
    flags = run.meta["machine"]["cpu_flags"]
    want = (
        "avx512 (pack 16)" if "avx512bw" in flags else ("avx2+fma (pack 8)" if {"avx2", "fma"} <= set(flags) else None)
    )
    if want:
        assert mv["mnn_cpu_kernels"] == want
    assert run.meta["inputs"]["input_shapes"]["x"] == [1, 3, 40, 40]  # what tvm compiled for
    assert int(tv["tvm_shape_nodes_folded"]) >= 4  # Shape -> Gather -> Unsqueeze -> Concat -> Reshape


@pytest.mark.isa_independent(EXACT_OPS)
def test_fold_shape_computations_keeps_the_values(tmp_path):
    """Shape -> Cast -> Slice -> Cast -> Concat(constant) -> Reshape: at a concrete input shape the
    Reshape target becomes an initializer, the activations stay, and ONNX Runtime gives identical
    results before and after."""
    from anpred.backends.native_io import fold_shape_computations

    i64 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Slice", ["sf", "b", "e"], ["hw"]),
        helper.make_node("Cast", ["hw"], ["hwi"], to=TensorProto.INT64),
        helper.make_node("Mul", ["hwi", "two"], ["hw2"]),
        helper.make_node("Concat", ["one", "hw2"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y0"]),
        helper.make_node("Sigmoid", ["y0"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [i64("b", [2]), i64("e", [4]), i64("two", [1, 1]), i64("one", [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    folded, n = fold_shape_computations(m, {"x": [1, 2, 3, 4]})
    assert n == 6 and [x.op_type for x in folded.graph.node] == ["Relu", "Reshape", "Sigmoid"]
    target = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}["target"]
    np.testing.assert_array_equal(target, [2, 3, 4])
    x = np.random.RandomState(0).randn(1, 2, 3, 4).astype(np.float32)
    onnx.save(m, str(tmp_path / "a.onnx"))
    onnx.save(folded, str(tmp_path / "b.onnx"))
    ref = ort_outputs(tmp_path / "a.onnx", {"x": x})["y"]
    np.testing.assert_array_equal(ort_outputs(tmp_path / "b.onnx", {"x": x})["y"], ref)
    # TVM's importer refuses this Reshape target unfolded ("Reshape requires the input new shape to be
    # Shape"); the tvm backend folds it at the run's shapes and runs
    man = instrument_file(str(tmp_path / "a.onnx"), str(tmp_path / "a.anchored.onnx"))
    with TvmBackend({"input_shapes": {"x": [1, 2, 3, 4]}}) as b:
        b.prepare(tmp_path / "a.anchored.onnx", man, tmp_path / "w")
        got = b.run({"x": x})
        assert b.versions()["tvm_shape_nodes_folded"] == "6"
    assert _eps_units(got[next(a.name for a in man.anchors if a.value == "y")], ref) <= 4


def test_tvm_refuses_dynamic_shapes_without_concrete_ones(ops_run, tmp_path):
    _, man, model = ops_run
    with pytest.raises(BackendError, match=r"input 'x' has dynamic dimensions.*input_shapes"):
        TvmBackend({}).prepare(model, man, tmp_path)
    with pytest.raises(BackendError, match=r"does not fit"):
        TvmBackend({"input_shapes": {"x": [1, 4, 40, 40]}}).prepare(model, man, tmp_path)
    with pytest.raises(BackendError, match=r"does not know the CPU 'no-such-cpu'"):
        shapes = {"x": [1, 3, 40, 40], "ids": [1, 7]}
        TvmBackend({"input_shapes": shapes, "mcpu": "no-such-cpu"}).prepare(model, man, tmp_path)


def _lstm_model(d: Path) -> Path:
    """A bidirectional LSTM with initial states (h0, c0) and a Linear head: ONNX ``LSTM`` op."""
    import torch
    import torch.nn as nn

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 12, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(24, 4)

        def forward(self, x, h0, c0):
            y, (h, _c) = self.lstm(x, (h0, c0))
            return self.fc(y), h

    torch.manual_seed(0)
    args = (torch.rand(1, 6, 8), torch.rand(2, 1, 12), torch.rand(2, 1, 12))
    torch.onnx.export(
        Rnn().eval(),
        args,
        str(d / "lstm.onnx"),
        dynamo=False,
        opset_version=17,
        input_names=["x", "h0", "c0"],
        output_names=["y", "h"],
    )
    return d / "lstm.onnx"


def _mish_model(d: Path) -> Path:
    """Conv -> Mish -> Hardmax (opset 18), both activations graph outputs."""
    rs = np.random.RandomState(1)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Mish", ["c"], ["m"], name="mish"),
            helper.make_node("Hardmax", ["m"], ["y"], axis=-1, name="hardmax"),
        ],
        "mish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [
            helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 3, 5, 5]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 5, 5]),
        ],
        [numpy_helper.from_array(rs.randn(3, 2, 3, 3).astype(np.float32), "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(d / "mish.onnx"))
    return d / "mish.onnx"


def test_tvm_unrolls_the_lstm_its_frontend_lacks_and_mnn_runs_it(tmp_path):
    """TVM 0.27's Relax ONNX frontend has no LSTM converter: the backend unrolls the bidirectional LSTM
    with initial states first (passes.recurrent), so it is not listed as unsupported, and TVM then
    agrees with ONNX Runtime; MNN converts the same LSTM natively and agrees too."""
    model = _lstm_model(tmp_path)
    man = instrument_file(str(model), str(tmp_path / "lstm.a.onnx"))
    m = onnx.load(str(tmp_path / "lstm.a.onnx"))
    assert "LSTM" not in str(TvmBackend.unsupported_ops(m)) and TvmBackend.coverage_basis
    assert MnnBackend.unsupported_ops(m) == {}
    rs = np.random.RandomState(0)
    feeds = {
        "x": rs.randn(1, 6, 8).astype(np.float32),
        "h0": rs.randn(2, 1, 12).astype(np.float32),
        "c0": rs.randn(2, 1, 12).astype(np.float32),
    }
    ref = ort_outputs(tmp_path / "lstm.a.onnx", feeds)
    for cls in (TvmBackend, MnnBackend):
        with cls({}) as b:
            b.prepare(tmp_path / "lstm.a.onnx", man, tmp_path / f"w-{cls.name}")
            got = b.run(feeds)
            if cls is TvmBackend:
                assert b.versions()["tvm_unrolled"] == "1"
        assert set(got) == {a.name for a in man.anchors}
        for a in man.anchors:
            want = ref[a.value if a.value in ref else a.name]
            assert got[a.name].shape == want.shape
            assert _eps_units(got[a.name], want) <= 32, (cls.name, a.name, _eps_units(got[a.name], want))


@pytest.mark.kernels  # TVM's Mish within 32 float32 epsilons: its kernels' arithmetic
def test_mnn_lacks_mish_and_hardmax_which_tvm_runs(tmp_path):
    """MNN 3.6's converter list has neither Mish nor Hardmax: listed before running, and the conversion
    fails with a BackendError naming both (mnnconvert's own message); TVM runs the model and agrees
    with ONNX Runtime (Hardmax exactly)."""
    model = _mish_model(tmp_path)
    man = instrument_file(str(model), str(tmp_path / "mish.a.onnx"))
    m = onnx.load(str(tmp_path / "mish.a.onnx"))
    assert {"Mish", "Hardmax"} <= set(MnnBackend.unsupported_ops(m)) and MnnBackend.coverage_basis
    assert TvmBackend.unsupported_ops(m) == {}
    with pytest.raises(BackendError, match=r"not supported by MNN's ONNX converter: .*Hardmax.*Mish|Mish.*Hardmax"):
        MnnBackend({}).prepare(tmp_path / "mish.a.onnx", man, tmp_path / "w")
    x = np.random.RandomState(2).randn(1, 2, 5, 5).astype(np.float32)
    ref = ort_outputs(tmp_path / "mish.a.onnx", {"x": x})
    with TvmBackend({}) as b:
        b.prepare(tmp_path / "mish.a.onnx", man, tmp_path / "w")
        got = b.run({"x": x})
    by_value = {a.value: a.name for a in man.anchors}
    assert _eps_units(got[by_value["m"]], ref["m"]) <= 32
    np.testing.assert_array_equal(got[by_value["y"]], ref["y"])


def test_import_mnn_keeps_its_cpu_line_out_of_stdout():
    code = "from anpred.backends.mnn import import_mnn, device_line; import_mnn(); print('LINE=' + device_line())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("LINE="), r.stdout


def test_backends_listed_with_family_and_version():
    rows = {r["name"]: r for r in backend_table()}
    assert rows["tvm"]["family"] == "tvm" and rows["tvm"]["packages"]["apache-tvm"]
    assert rows["mnn"]["family"] == "mnn" and rows["mnn"]["packages"]["mnn"]
    assert rows["mnn-winograd"]["family"] == "mnn"
    assert rows["tvm"]["installed"] and rows["mnn"]["installed"]


@pytest.fixture(scope="module")
def yolo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("yolo") / "run"
    return run_model(
        run_models.anchored_zoo_yolo(320),
        ["ort", *NATIVE, "mnn-winograd"],
        str(run_models.ultralytics_assets()),
        out,
        timeout_s=300,
        progress=False,
    )


@pytest.mark.kernels
@pytest.mark.slow  # YOLOv8n compiled by TVM (~30 s cold)
def test_yolo_zoo_320_every_anchor_agrees_with_ort(yolo_run):
    man = yolo_run.manifest
    st = yolo_run.statuses()
    for b in ["ort", *NATIVE, "mnn-winograd"]:
        assert st[b].status == "ok", (b, st[b].reason)
        assert st[b].samples == 2 and st[b].anchors_captured == len(man.anchors) >= 12, b
    worst: dict[str, float] = {}
    for sid in yolo_run.sample_ids:
        ref = yolo_run.read_anchors("ort", sid)
        for b in [*NATIVE, "mnn-winograd"]:
            got = yolo_run.read_anchors(b, sid)
            for a in man.anchors:
                assert got[a.name].shape == ref[a.name].shape, (b, a.name)
                worst[b] = max(worst.get(b, 0.0), _eps_units(got[a.name], ref[a.name]))
    assert worst["tvm"] <= 1024 and worst["mnn"] <= 1024, worst
    # Winograd's fp32 rounding: larger, still small (measured 9.7e-4 relative)
    assert worst["mnn-winograd"] * EPS32 <= 1e-2, worst


@pytest.mark.slow  # YOLOv8n compiled by TVM (~35 s cold)
def test_yolo_tvm_library_is_cached_single_threaded_and_portable(yolo_run, tmp_path):
    """A second prepare loads the compiled library from the cache; the library calls no parallel
    launch (TVM's generated loops run on one thread) and was compiled for LLVM's generic CPU."""
    from anpred.manifest import AnchorManifest

    model = run_models.anchored_zoo_yolo(320)
    man = AnchorManifest.load(yolo_run.root / "manifest.json")
    with TvmBackend({}) as b:
        b.prepare(model, man, tmp_path)
        assert b.cache_hit and b.versions()["tvm_cache"] == "hit"
        lib = (b.cache_dir / "model.so").read_bytes()
    assert b"TVMBackendParallelLaunch" not in lib
    assert b.versions()["tvm_llvm_cpu"] == "generic"


@pytest.mark.kernels
def test_mnn_unrolls_the_recurrent_variants_its_converter_lacks(tmp_path):
    """models.opclass's recurrent network (peepholes, clip, input_forget, other activations): MNN's
    converter refuses some LSTM variants ("These Op Not Support: ONNX::LSTM"); the backend converts the
    unrolled graph instead (passes.recurrent) and says so in the cache folder; every anchor agrees with
    ONNX Runtime to fp32 rounding (2.3e-7 relative measured)."""
    import json

    import onnx

    from anpred.instrument import instrument_model
    from models.opclass import build

    p = build("recurrent", tmp_path / "rec.onnx")
    am, man = instrument_model(onnx.load(str(p)), stages=3)
    man.to_model(am)
    onnx.save(am, str(tmp_path / "a.onnx"))
    store = run_model(
        tmp_path / "a.onnx",
        ["ort", "mnn"],
        str(p.with_suffix(".inputs.npz")),
        tmp_path / "run",
        progress=False,
        timeout_s=600,
    )
    st = store.statuses()["mnn"]
    assert st.status == "ok", st.reason
    for sid in store.sample_ids:
        a, b = store.read_anchors("ort", sid), store.read_anchors("mnn", sid)
        for k in a:
            assert np.abs(a[k] - b[k]).max() <= 64 * np.finfo(np.float32).eps * max(1.0, np.abs(a[k]).max()), k
    from anpred.cache import cache_root

    unrolled = [json.loads(f.read_text()) for f in (cache_root() / "mnn").glob("*/unrolled.json")]
    assert any(len(u) >= 3 for u in unrolled)
