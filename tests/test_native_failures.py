"""Converted models that a native library cannot load, and empty tensors (issue 34, items 4 and 10):
a model ending with a Concat of an empty tensor runs on every backend (TVM's exported library and ncnn's
weights used to fail to load); a converted model ncnn cannot load is reported with ncnn's own line; a
cached TVM library that does not load back is compiled again, and the versions say why.

Models built here, real runtimes and converters, each backend in its worker process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from isa_reasons import EXACT_OPS, FP32_BOUND


def empty_concat(path: Path) -> Path:
    """Conv -> Relu -> Concat(r, empty[1, 4, 0], ones[1, 4, 1]) along the last axis: y is r with a
    column of ones appended; the empty tensor adds nothing."""
    w = nh.from_array(np.random.default_rng(0).standard_normal((4, 4, 1)).astype(np.float32), "w")
    empty = nh.from_array(np.zeros((1, 4, 0), np.float32), "empty")
    one = nh.from_array(np.ones((1, 4, 1), np.float32), "one")
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        h.make_node("Relu", ["c"], ["r"], name="relu"),
        h.make_node("Concat", ["r", "empty", "one"], ["y"], axis=2, name="cat"),
    ]
    g = h.make_graph(
        nodes,
        "empty_concat",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 9])],
        [w, empty, one],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(path))
    return path


@pytest.mark.isa_independent(EXACT_OPS)
def test_drop_empty_concat_inputs_is_exact():
    from onnx.reference import ReferenceEvaluator

    from passes.empty_inputs import drop_empty_concat_inputs

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        m = onnx.load(str(empty_concat(Path(d) / "m.onnx")))
    before = ReferenceEvaluator(m).run(None, {"x": np.arange(32, dtype=np.float32).reshape(1, 4, 8) - 16})[0]
    assert drop_empty_concat_inputs(m) == 1
    assert list(m.graph.node[-1].input) == ["r", "one"]
    assert "empty" not in {t.name for t in m.graph.initializer}
    after = ReferenceEvaluator(m).run(None, {"x": np.arange(32, dtype=np.float32).reshape(1, 4, 8) - 16})[0]
    np.testing.assert_array_equal(before, after)
    assert drop_empty_concat_inputs(m) == 0


# ~9 s: every backend on one model: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
@pytest.mark.isa_independent(FP32_BOUND)
def test_a_concat_of_an_empty_tensor_runs_on_every_backend(tmp_path):
    from anpred.run import BackendSpec, run_model

    m = empty_concat(tmp_path / "m.onnx")
    backends = ["ort", "onnx-reference", "openvino", "tvm", "ncnn", "ort-int8"]
    specs = backends[:-1] + [BackendSpec("ort-int8", options={"threads": 2})]
    store = run_model(m, specs, "random:normal:n=2", tmp_path / "run", progress=False)
    st = store.statuses()
    for b in backends[:-1]:
        assert st[b].status == "ok", (b, st[b].reason)
    # ONNX Runtime 1.32's fused QLinearConcat crashed on an empty input at 2 intra-op threads on a held-out
    # model (docs/run.md, "Findings seen while testing"); on this case it runs (at 2 threads too), and a
    # crash would be named as one, not left as a bare stack
    assert st["ort-int8"].status == "ok" or st["ort-int8"].reason.startswith("crash of onnxruntime")
    assert st["tvm"].versions["tvm_empty_inputs_dropped"] == "1"
    assert "not cached" not in st["tvm"].versions["tvm_cache"]
    ref = store.read_anchors("onnx-reference", "s0000")["output/y"]
    assert ref.shape == (1, 4, 9) and np.all(ref[..., 8] == 1.0)
    for b in ("ort", "openvino", "tvm", "ncnn"):
        np.testing.assert_allclose(store.read_anchors(b, "s0000")["output/y"], ref, rtol=1e-5, atol=1e-5)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A conversion cache of the test's own (its entries are damaged on purpose)."""
    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_ncnn_that_cannot_load_its_weights_says_which_layer(tmp_path, own_cache):
    from anpred.run import run_model

    m = empty_concat(tmp_path / "m.onnx")
    assert (
        run_model(m, ["ncnn"], "random:normal:n=1", tmp_path / "r1", progress=False, precheck=False)
        .statuses()["ncnn"]
        .status
        == "ok"
    )
    (weights,) = own_cache.glob("pnnx/*/model.ncnn.bin")
    weights.write_bytes(weights.read_bytes()[:8])  # the Convolution's weights cut short
    st = run_model(m, ["ncnn", "ort"], "random:normal:n=1", tmp_path / "r2", progress=False, precheck=False).statuses()[
        "ncnn"
    ]
    assert st.status == "failed"
    # ncnn's own line (written to the C stderr), not only "cannot load the converted model"
    assert st.reason.startswith("prepare: BackendError: ncnn: cannot load the converted model: layer load_model "), (
        st.reason
    )
    assert "failed" in st.reason.split("converted model:", 1)[1].split("(ncnn", 1)[0]


def test_a_cached_tvm_library_that_does_not_load_is_compiled_again(tmp_path, own_cache):
    from anpred.run import run_model

    m = empty_concat(tmp_path / "m.onnx")
    first = run_model(m, ["tvm"], "random:normal:n=1", tmp_path / "r1", progress=False, precheck=False)
    assert first.statuses()["tvm"].status == "ok"
    (lib,) = own_cache.glob("tvm/*/model.so")
    lib.write_bytes(b"not a library")
    st = run_model(m, ["tvm"], "random:normal:n=1", tmp_path / "r2", progress=False, precheck=False).statuses()["tvm"]
    assert st.status == "ok"
    assert st.versions["tvm_cache"].startswith("the cached library in ")
    assert "does not load: the exported library does not load back" in st.versions["tvm_cache"]
    assert st.versions["tvm_cache"].endswith("compiled again in memory (remove that folder to cache it anew)")


def test_a_backend_that_returns_no_anchor_is_failed_with_its_log_line(tmp_path):
    """A new user's text model, valid at one sequence length only, run at another: MNN printed
    ``Reshape error`` on its own output, returned nothing and was reported ``ok`` with "8 of 8 anchors
    missing" and the cause only in its log. It stays ``ok`` (each anchor a missing output the oracle
    flags), and its reason now says it returned nothing and gives the decisive line of its log."""
    from anpred.run import run_model

    shape = nh.from_array(np.array([3, 4], np.int64), "shape")
    nodes = [
        h.make_node("Relu", ["x"], ["r"], name="relu"),
        h.make_node("Reshape", ["r", "shape"], ["y0"], name="reshape"),
        h.make_node("Tanh", ["y0"], ["y"], name="tanh"),
    ]
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, "n"])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, 4])],
        [shape],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    (tmp_path / "in").mkdir()
    np.savez(tmp_path / "in" / "s0.npz", x=np.random.default_rng(0).random((1, 16)).astype(np.float32))  # 16, not 12
    st = run_model(
        tmp_path / "m.onnx",
        ["ort", "mnn"],
        tmp_path / "in",
        tmp_path / "run",
        progress=False,
        timeout_s=300,
        precheck=False,
    ).statuses()
    assert st["ort"].status == "failed" and "Reshape" in st["ort"].reason
    assert st["mnn"].status == "ok", st["mnn"].reason
    assert st["mnn"].reason.startswith("returned no value for any anchor (1 of 1 anchors missing: output/y"), st["mnn"]
    assert "its log says: " in st["mnn"].reason and "Shape" in st["mnn"].reason, st["mnn"].reason
