"""Pre-run coverage below the operator name (issue 34, item 3): attribute, dtype and input limits the
converters state, asked of the converters themselves. onnx2torch refuses Reshape with ``allowzero=1``
and Clip with computed min/max (its converters raise NotImplementedError); ncnn's backend feeds float32
and integer inputs only (a bool input is refused); pnnx crashes on GridSample ``mode=cubic``. The
pre-run coverage must say so, the run must mark those backends ``unsupported`` with the reason, and each
refusal is checked against the converter run on the whole model (no precheck: the same failure)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _save(g, opset: int, path):
    """The graph ``g`` as a checked model (IR 8, the default domain at ``opset``) saved at ``path``."""
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(path))
    return path


def limits_model(path):
    """x[1, 4, 6] -> Reshape(allowzero=1, [1, 4, 3, 2]) -> Relu -> Clip(min = ReduceMin(x), max =
    0.5 ReduceMax(x)) -> Reshape back -> Where(mask, ., 0), ``mask`` a bool input: every operator is in
    every table."""
    nodes = [
        h.make_node("Reshape", ["x", "shape"], ["r"], name="reshape_az", allowzero=1),
        h.make_node("Relu", ["r"], ["a"], name="relu"),
        h.make_node("ReduceMin", ["x"], ["lo"], name="lo", keepdims=0),
        h.make_node("ReduceMax", ["x"], ["hi0"], name="hi0", keepdims=0),
        h.make_node("Mul", ["hi0", "half"], ["hi"], name="hi"),
        h.make_node("Clip", ["a", "lo", "hi"], ["c"], name="clip_dyn"),
        h.make_node("Reshape", ["c", "back"], ["c2"], name="back"),
        h.make_node("Where", ["mask", "c2", "zero"], ["y"], name="where"),
    ]
    inits = [
        nh.from_array(np.array([1, 4, 3, 2], np.int64), "shape"),
        nh.from_array(np.array(0.5, np.float32), "half"),
        nh.from_array(np.array([1, 4, 6], np.int64), "back"),
        nh.from_array(np.array(0.0, np.float32), "zero"),
    ]
    g = h.make_graph(
        nodes,
        "limits",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6]), h.make_tensor_value_info("mask", T.BOOL, [1, 4, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6])],
        inits,
    )
    return _save(g, 17, path)


def cubic_grid_model(path):
    """x[1, 2, 6, 6] -> Conv 1x1 -> GridSample(mode="cubic") with a grid computed from x -> y."""
    rng = np.random.default_rng(0)
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        h.make_node("Tanh", ["g0"], ["grid"], name="grid"),
        h.make_node("GridSample", ["c", "grid"], ["y"], name="sample", mode="cubic"),
    ]
    g = h.make_graph(
        nodes,
        "cubic",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 6, 6]), h.make_tensor_value_info("g0", T.FLOAT, [1, 4, 4, 2])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 4, 4])],
        [nh.from_array(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "w")],
    )
    return _save(g, 17, path)


def test_converters_asked_node_by_node(tmp_path, monkeypatch):
    from anpred.backends.coverage import format_coverage, unsupported_by

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))  # the probes' own answers, not cached ones
    rows = unsupported_by(limits_model(tmp_path / "limits.onnx"), {"torch": "torch", "ncnn": "ncnn", "ort": "ort"})
    assert rows["torch"]["ops"] == {
        "Reshape": "onnx2torch: \"allowzero=1\" is not implemented (node 'reshape_az')",
        "Clip": "onnx2torch: Dynamic value of min/max is not implemented (node 'clip_dyn')",
    }
    assert rows["torch"]["nodes"] == ["Reshape", "Clip"]  # not the operator table: the converters
    assert list(rows["ncnn"]["ops"]) == ["input mask"] and "'mask' is bool" in rows["ncnn"]["ops"]["input mask"]
    assert rows["ort"]["ops"] == {}
    lines = format_coverage(rows)
    assert any(
        ln.startswith("torch: cannot run the model: Reshape (onnx2torch: \"allowzero=1\" is not implemented")
        and ln.endswith("[onnx2torch's converters called on each node (the NotImplementedError they raise)]")
        for ln in lines
    )
    # a node pnnx crashes on, found by converting that node alone; cached by the node's content
    path = cubic_grid_model(tmp_path / "cubic.onnx")
    rows = unsupported_by(path, {"ncnn": "ncnn"})
    assert rows["ncnn"]["ops"] == {"GridSample": "pnnx: pnnx crashed on this node alone (signal 11) (node 'sample')"}
    probes = sorted((tmp_path / "cache" / "coverage-probe" / "pnnx").glob("*.json"))
    assert len(probes) >= 3  # Conv, Tanh, GridSample (and the first model's nodes)
    from anpred.backends.ncnn_probe import pnnx_probe

    probe = pnnx_probe()
    again = probe.refusals(onnx.load(str(path)))
    assert again == {"GridSample": "pnnx: pnnx crashed on this node alone (signal 11) (node 'sample')"}
    assert probe.probed == 0 and probe.cached == 3  # every answer from the cache


def test_run_marks_the_refused_backends_and_the_converters_agree(tmp_path):
    """The run does not start torch and ncnn on the limits model (``unsupported``, the converter's words);
    run without the precheck, each fails at conversion for the reason the coverage gave."""
    from anpred.run import run_model

    path = limits_model(tmp_path / "limits.onnx")
    rng = np.random.default_rng(0)
    (tmp_path / "in").mkdir()
    np.savez(
        tmp_path / "in" / "0000.npz",
        x=rng.standard_normal((1, 4, 6)).astype(np.float32),
        mask=rng.random((1, 4, 6)) > 0.5,
    )
    store = run_model(path, ["ort", "torch", "ncnn"], tmp_path / "in", tmp_path / "run", progress=False, timeout_s=300)
    st = store.statuses()
    assert st["ort"].status == "ok"
    assert st["torch"].status == "unsupported" and "\"allowzero=1\" is not implemented" in st["torch"].reason
    assert st["torch"].reason.startswith("not run: the pre-run coverage found 2 operator(s) or input(s) it refuses")
    assert st["ncnn"].status == "unsupported" and "input mask" in st["ncnn"].reason
    free = run_model(
        path, ["torch", "ncnn"], tmp_path / "in", tmp_path / "run2", progress=False, timeout_s=300, precheck=False
    )
    st = free.statuses()
    assert (
        st["torch"].status in ("failed", "unsupported") and "\"allowzero=1\" is not implemented" in st["torch"].reason
    )
    assert st["ncnn"].status in ("failed", "unsupported") and "'mask' is bool" in st["ncnn"].reason


def test_cubic_grid_sample_crashes_pnnx_in_the_whole_model_too(tmp_path):
    """The probe's refusal checked against the converter: ncnn's conversion of the whole model fails."""
    from anpred.run import run_model

    path = cubic_grid_model(tmp_path / "cubic.onnx")
    (tmp_path / "in").mkdir()
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "in" / "0000.npz",
        x=rng.standard_normal((1, 2, 6, 6)).astype(np.float32),
        g0=rng.standard_normal((1, 4, 4, 2)).astype(np.float32),
    )
    st = run_model(
        path, ["ncnn"], tmp_path / "in", tmp_path / "run", progress=False, timeout_s=300, precheck=False
    ).statuses()["ncnn"]
    assert st.status in ("failed", "unsupported") and "pnnx" in st.reason, st.reason


# ~8 s: the coverage of every backend, converters asked: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
def test_cli_backends_names_the_converters_refusals(tmp_path, capsys):
    import json

    from anpred.cli import main

    path = limits_model(tmp_path / "limits.onnx")
    assert main(["backends", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "torch: cannot run the model: Reshape (onnx2torch: \"allowzero=1\" is not implemented (node 'reshape_az'))"
    ) in out
    assert "ncnn: cannot run the model: input mask (ncnn: input 'mask' is bool" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("torch "))
    assert " lacks " in row
    assert main(["backends", "--model", str(path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["torch"]["coverage"]["nodes"] == ["Reshape", "Clip"] and rows["ort"]["coverage"]["ops"] == {}


def test_anchor_identities_do_not_lose_ncnn(tmp_path, monkeypatch):
    """pnnx folds an Identity away; alone it leaves an empty graph and crashes (signal 11). Every anchor
    of an instrumented model is an Identity: the probe asks such a crash again with a consumer of the
    node's outputs, so ncnn is not refused, and it runs the anchored model (regression: ncnn was
    'unsupported' on every anchored model)."""
    from anpred.backends.coverage import unsupported_by
    from anpred.backends.ncnn_probe import pnnx_probe
    from anpred.instrument import instrument_model
    from anpred.run import run_model

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"], name="relu"),
        h.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    g = h.make_graph(
        nodes,
        "cr",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])],
        [
            nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
            nh.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w2"),
        ],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    anchored, _ = instrument_model(m, stages=2)
    assert any(n.op_type == "Identity" for n in anchored.graph.node)
    onnx.save(anchored, str(tmp_path / "anchored.onnx"))
    probe = pnnx_probe()
    assert probe.refusals(anchored) == {}
    assert unsupported_by(tmp_path / "anchored.onnx", {"ncnn": "ncnn"})["ncnn"]["ops"] == {}
    store = run_model(
        tmp_path / "anchored.onnx", ["ncnn", "onnx-reference"], "random:normal:n=1", tmp_path / "run", progress=False
    )
    assert store.statuses()["ncnn"].status == "ok", store.statuses()["ncnn"].reason


def constant_float_model(path):
    """x[1, 3, 4] -> Mul(x, Constant(value_float=1.6733)) -> Relu -> y: the shape of ONNX's expanded
    function bodies (Selu, Elu, HardSigmoid, LeakyRelu ...), which hold their attributes as
    ``Constant`` nodes with ``value_float``."""
    nodes = [
        h.make_node("Constant", [], ["k"], name="alpha", value_float=1.6733),
        h.make_node("Mul", ["x", "k"], ["m"], name="mul"),
        h.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    g = h.make_graph(
        nodes,
        "constant_float",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 4])],
    )
    return _save(g, 18, path)


def test_tvm_frontend_asked_node_by_node_and_the_whole_model_agrees(tmp_path, monkeypatch):
    """TVM's Relax ONNX frontend refuses a ``Constant`` holding ``value_float`` (``ValueError: no value in
    Constant``; 21 of ONNX's expanded node cases failed on it at run time, none was foreseen by the
    operator table). The coverage asks the frontend node by node and says so; run without the
    precheck, the whole model fails for that reason; the limits and cubic models convert (nothing
    refused)."""
    from anpred.backends.coverage import unsupported_by
    from anpred.run import run_model

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    path = constant_float_model(tmp_path / "cf.onnx")
    row = unsupported_by(path, {"tvm": "tvm"})["tvm"]
    assert row["ops"] == {
        "Constant": "tvm: the Relax ONNX frontend refuses it alone: ValueError: no value in Constant (node 'alpha')"
    }, row
    assert row["nodes"] == ["Constant"] and row["node_basis"].startswith("TVM's Relax ONNX frontend")
    for other in (limits_model(tmp_path / "limits.onnx"), cubic_grid_model(tmp_path / "cubic.onnx")):
        assert unsupported_by(other, {"tvm": "tvm"})["tvm"]["ops"] == {}
    (tmp_path / "in").mkdir()
    np.savez(tmp_path / "in" / "0000.npz", x=np.ones((1, 3, 4), np.float32))
    st = run_model(
        path, ["tvm"], tmp_path / "in", tmp_path / "run", progress=False, timeout_s=300, precheck=False
    ).statuses()["tvm"]
    assert st.status in ("failed", "unsupported") and "no value in Constant" in st.reason, st.reason


def attention_model(path):
    """torch.nn.MultiheadAttention (embed 32, 4 heads) after a LayerNorm, exported with torch.onnx's
    TorchScript exporter at a static [1, 10, 32]: its graph holds the head-splitting arithmetic (Mod,
    Div, Reshape ...) that pnnx fuses into one MultiHeadAttention layer."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            h = self.norm(x)
            return self.attn(h, h, h, need_weights=False)[0] + x

    torch.manual_seed(0)
    torch.onnx.export(
        Block().eval(),
        (torch.zeros(1, 10, 32),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        opset_version=17,
        dynamo=False,
    )
    return path


def test_a_node_that_crashes_pnnx_alone_but_vanishes_in_its_model_is_not_refused(tmp_path, monkeypatch):
    """A new user's attention block: a node of its head arithmetic crashes pnnx alone (signal), so the
    coverage refused ncnn, while pnnx converts the whole model (the block becomes one MultiHeadAttention
    layer). The Mod reads two constants only: it is folded in its model and no longer asked at all
    (tests below); a crash alone is still checked on the whole model, and the cubic GridSample, which
    crashes the whole conversion too, stays refused."""
    from anpred.backends.ncnn_pnnx import NcnnBackend
    from anpred.backends.ncnn_probe import converts_whole, pnnx_probe

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    m = onnx.load(str(attention_model(tmp_path / "attn.onnx")))
    alone = pnnx_probe().refusals(m)
    assert alone == {}, alone
    assert converts_whole(m)
    assert NcnnBackend.refused_nodes(m) == {}, alone
    cubic = onnx.load(str(cubic_grid_model(tmp_path / "cubic.onnx")))
    assert not converts_whole(cubic)
    assert "GridSample" in NcnnBackend.refused_nodes(cubic)


def dilated_pool_model(path):
    """x[1, 2, 8, 8, 8] -> Conv 1x1x1 -> MaxPool(kernel 2, dilations 2, strides 2, 3-D) -> y: onnx2tf 1.29
    refuses a dilated MaxPool with strides in 3-D (``ops/MaxPool.py`` raises ``NotImplementedError``)
    and converts the Conv."""
    w = np.random.default_rng(2).standard_normal((2, 2, 1, 1, 1)).astype(np.float32)
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        h.make_node(
            "MaxPool", ["c"], ["y"], name="pool", kernel_shape=[2, 2, 2], dilations=[2, 2, 2], strides=[2, 2, 2]
        ),
    ]
    g = h.make_graph(
        nodes,
        "dilated_pool",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 8, 8, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 3, 3, 3])],
        [nh.from_array(w, "w")],
    )
    return _save(g, 17, path)


DILATED_POOL_REFUSAL = (
    "onnx2tf: NotImplementedError: Dilated MaxPool with strides is not supported for 3D and "
    "above for now. (node 'pool')"
)


def test_onnx2tf_asked_node_by_node(tmp_path, monkeypatch):
    """The coverage asks onnx2tf itself, node by node (a one-node model of each node converted in one
    worker process): the dilated 3-D MaxPool is refused for ``tf`` and ``litert`` in onnx2tf's words, the
    Conv is not; the answers are cached by the node's content (the second asking converts nothing)."""
    from anpred.backends.coverage import unsupported_by
    from anpred.backends.tf_probe import onnx2tf_probe

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    path = dilated_pool_model(tmp_path / "pool.onnx")
    rows = unsupported_by(path, {"tf": "tf", "litert": "litert"})
    for label in ("tf", "litert"):
        assert rows[label]["ops"] == {"MaxPool": DILATED_POOL_REFUSAL}, rows[label]
        assert rows[label]["nodes"] == ["MaxPool"] and rows[label]["node_basis"].startswith("onnx2tf on a one-node")
    answers = {
        json.loads(f.read_text())["op"]: json.loads(f.read_text())["refused"]
        for f in (tmp_path / "cache" / "coverage-probe" / "onnx2tf").glob("*.json")
    }
    assert answers == {
        "Conv": "",
        "MaxPool": DILATED_POOL_REFUSAL.removeprefix("onnx2tf: ").removesuffix(" (node 'pool')"),
    }
    probe = onnx2tf_probe()
    assert probe.refusals(onnx.load(str(path))) == {"MaxPool": DILATED_POOL_REFUSAL}
    assert probe.probed == 0 and probe.cached == 2 and probe.worker.proc is None  # no worker started


@pytest.mark.slow
def test_onnx2tf_refusal_agrees_with_the_run(tmp_path):
    """The probe's refusal checked against the backend: run without the precheck, ``tf`` stops at the
    MaxPool with the same words (no terminal colour codes), and ``litert``, which shares its onnx2tf
    conversion, fails at once with that reason instead of converting again; with the precheck, ``tf`` is
    not started (``unsupported``, the refusal named)."""
    from anpred.run import run_model

    path = dilated_pool_model(tmp_path / "pool.onnx")
    (tmp_path / "in").mkdir()
    x = np.random.default_rng(3).standard_normal((1, 2, 8, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in" / "0000.npz", x=x)
    both = run_model(
        path, ["tf", "litert"], tmp_path / "in", tmp_path / "run", progress=False, timeout_s=300, precheck=False
    ).statuses()
    st = both["tf"]
    assert (
        st.status in ("failed", "unsupported")
        and "Dilated MaxPool with strides is not supported for 3D and above" in st.reason
    ), st.reason
    assert "\x1b[" not in st.reason, st.reason
    lite = both["litert"]
    assert (
        lite.status == st.status
        and "the onnx2tf conversion failed once for the tf and litert population in this run (in tf: " in lite.reason
        and lite.reason.endswith("not tried again")
    ), lite.reason
    st = run_model(path, ["ort", "tf"], tmp_path / "in", tmp_path / "run2", progress=False, timeout_s=300).statuses()
    assert st["ort"].status == "ok"
    assert st["tf"].status == "unsupported" and DILATED_POOL_REFUSAL in st["tf"].reason, st["tf"].reason


def test_onnx2tf_nodes_not_probed_within_the_budget_are_not_refused(tmp_path, monkeypatch):
    """With no time left (a budget of 0 s) no worker starts, no node is refused, every signature is
    counted unprobed and nothing is cached (the next coverage asks again)."""
    from anpred.backends.tf_probe import onnx2tf_probe, onnx2tf_refusals

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    model = onnx.load(str(dilated_pool_model(tmp_path / "pool.onnx")))
    probe = onnx2tf_probe(budget_s=0.0)
    assert probe.refusals(model) == {}
    assert (probe.probed, probe.cached, probe.unprobed) == (0, 0, 2) and probe.worker.proc is None
    assert not list((tmp_path / "cache" / "coverage-probe" / "onnx2tf").glob("*.json"))
    assert onnx2tf_refusals(model, budget_s=0.0) == {}


def test_a_node_of_constants_only_is_not_probed(tmp_path, monkeypatch):
    """A review's false refusal: ONNX's expanded LayerNormalization casts a ``Constant`` (its epsilon);
    pnnx alone keeps that Cast as a ``pnnx.Expression`` ncnn does not know, so the coverage refused ncnn,
    while the whole model converts (the Cast folded) and runs. A node whose every input is a constant is
    folded in its model and is not probed."""
    from anpred.backends.ncnn_pnnx import NcnnBackend
    from anpred.backends.ncnn_probe import pnnx_probe

    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    eps = h.make_node("Constant", [], ["eps"], value=nh.from_array(np.array(1e-5, np.float64)))
    cast = h.make_node("Cast", ["eps"], ["eps32"], to=T.FLOAT, name="eps_cast")
    relu = h.make_node("Relu", ["x"], ["r"], name="relu")
    add = h.make_node("Add", ["r", "eps32"], ["y"], name="add")
    g = h.make_graph(
        [eps, cast, relu, add],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
    )
    m = onnx.load(str(_save(g, 17, tmp_path / "eps.onnx")))
    probe = pnnx_probe()
    # asked: the Relu; not the Cast (constants only) nor the Add (it reads a value computed from constants)
    assert [n.name for n, _, _ in probe._keyed(m)] == ["relu"]  # noqa: SLF001 - which nodes are asked
    assert probe.refusals(m) == {} and NcnnBackend.refused_nodes(m) == {}
