"""Conformance at scale (anpred.conformance, anpred.run.warm, passes.bind_inputs.weight_inputs,
anpred.backends.onnxsim_warm): warm workers across models with per-model isolation, the ground truth
with the suite's tolerance, weights given as graph inputs bound for the converters that need them,
the oracle's score on cases written here in ONNX's backend-test layout (expected outputs computed in
float64 by numpy), and onnx2tf's simplifier runs served by one warm process."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from anpred.run import run_model
from anpred.run.spec import BackendSpec
from isa_reasons import FP32_BOUND, NOT_A_KERNEL_VALUE


def _model(nodes, inputs, outputs, opset=17):
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs],
        [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _case(root, name, model, inputs: list[np.ndarray], outputs: list[np.ndarray], data=None):
    """Write one case in ONNX's backend-test layout under ``root``."""
    d = root / name
    (d / "test_data_set_0").mkdir(parents=True)
    onnx.save(model, str(d / "model.onnx"))
    for kind, arrays in (("input", inputs), ("output", outputs)):
        for i, a in enumerate(arrays):
            (d / "test_data_set_0" / f"{kind}_{i}.pb").write_bytes(nh.from_array(a).SerializeToString())
    if data is not None:
        (d / "data.json").write_text(json.dumps(data))
    return d


def _conv_case(root, rng):
    """Conv with its weights W and bias B fed as graph inputs (as ONNX's node cases do); expected in
    float64: y[o, i, j] = B[o] + sum_c sum_k sum_l x[c, i + k, j + l] W[o, c, k, l]."""
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    y = np.zeros((1, 3, 3, 3))
    for i in range(3):
        for j in range(3):
            y[0, :, i, j] = np.einsum(
                "ckl,ockl->o", x[0, :, i : i + 3, j : j + 3].astype(np.float64), w.astype(np.float64)
            )
    y += b[None, :, None, None]
    m = _model(
        [h.make_node("Conv", ["x", "W", "B"], ["y"])],
        [("x", [1, 2, 5, 5]), ("W", [3, 2, 3, 3]), ("B", [3])],
        [("y", [1, 3, 3, 3])],
    )
    return _case(root, "test_conv_weights_as_inputs", m, [x, w, b], [y.astype(np.float32)])


def test_weight_inputs_are_the_operator_parameters():
    from passes.bind_inputs import bind_inputs, weight_inputs

    conv = _model(
        [h.make_node("Conv", ["x", "W", "B"], ["y"])],
        [("x", [1, 1, 3, 3]), ("W", [1, 1, 1, 1]), ("B", [1])],
        [("y", None)],
    )
    assert weight_inputs(conv) == ["W", "B"]
    # read as a first operand somewhere: data, not a parameter
    mixed = _model(
        [h.make_node("Add", ["x", "s"], ["a"]), h.make_node("Mul", ["s", "a"], ["y"])],
        [("x", [2]), ("s", [2])],
        [("y", None)],
    )
    assert weight_inputs(mixed) == []
    # every input would qualify (all read at position >= 1 only): the first stays fed
    only = _model([h.make_node("Concat", ["", "a", "b"], ["y"], axis=0)], [("a", [2]), ("b", [2])], [("y", None)])
    assert weight_inputs(only) == ["b"]
    bound, info = bind_inputs(conv, {"W": np.full((1, 1, 1, 1), 2.0, np.float32), "B": np.ones(1, np.float32)})
    assert [i.name for i in bound.graph.input] == ["x"] and set(info["bound"]) == {"W", "B"}


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_ground_truth_uses_the_suite_test():
    from anpred.conformance.truth import compare

    ref = np.array([1.0, -2.0, np.nan, 1e-9], np.float32)
    # |out - ref| <= atol + rtol |ref|: 1.0009 is inside rtol 1e-3, 2.003 outside
    ok = compare(np.array([1.0009, -2.0, np.nan, 1.05e-9]), ref, 1e-3, 1e-7, "float32")
    assert ok.ok and ok.mismatched == 0
    bad = compare(np.array([1.0, -2.003, np.nan, 0.0]), ref, 1e-3, 1e-7, "float32")
    assert not bad.ok and bad.mismatched == 1 and bad.max_abs == pytest.approx(0.003, rel=1e-3)
    assert bad.max_excess == pytest.approx(0.003 / (1e-7 + 2e-3), rel=1e-3)
    assert not compare(np.array([1.0, -2.0, 0.0, 1e-9]), ref, 1e-3, 1e-7).ok  # a finite value where NaN is expected
    assert "dtype float64" in compare(ref.astype(np.float64), ref, 1e-3, 1e-7, "float64").reason
    assert "shape [2]" in compare(np.zeros(2), ref, 1e-3, 1e-7).reason


def test_suite_tolerance_from_onnx_loader(tmp_path):
    from anpred.conformance.cases import load_case

    m = _model([h.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    x = np.array([-1.0, 2.0], np.float32)
    plain = load_case(_case(tmp_path, "test_plain", m, [x], [np.maximum(x, 0)]))
    loose = load_case(_case(tmp_path, "test_loose", m, [x], [np.maximum(x, 0)], data={"rtol": 0.25, "atol": 0.5}))
    assert (plain.rtol, plain.atol) == (1e-3, 1e-7)  # onnx/backend/test/loader defaults
    assert (loose.rtol, loose.atol) == (0.25, 0.5) and plain.float32 and plain.op == "Relu"


def test_empty_input_is_hashed():
    from anpred.run.store import sample_sha256

    a = sample_sha256({"x": np.zeros((0, 3), np.float32)})
    assert a != sample_sha256({"y": np.zeros((0, 3), np.float32)}) and len(a) == 64


@pytest.mark.kernels
def test_warm_pool_runs_models_one_after_another_with_isolation(tmp_path):
    """One ort process serves three different models (started once); a Python failure on one model
    (an operator ONNX Runtime lacks) is that model's status and the worker serves the next; a worker
    that segfaults on its 2nd sample is `crashed` for that model and the next model gets a fresh one."""
    from anpred.inputs import ArraySamples
    from anpred.run.warm import WarmPool

    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    models = []
    for k, op in enumerate(["Relu", "Neg", "Sigmoid"]):
        p = tmp_path / f"m{k}.onnx"
        onnx.save(_model([h.make_node(op, ["x"], ["y"])], [("x", [1, 3])], [("y", [1, 3])]), str(p))
        models.append(p)
    bad = tmp_path / "bad.onnx"
    m = _model([h.make_node("NoSuchOp", ["x"], ["y"], domain="ai.anpred.test")], [("x", [1, 3])], [("y", [1, 3])])
    m.opset_import.append(h.make_opsetid("ai.anpred.test", 1))
    onnx.save(m, str(bad))
    specs = [BackendSpec("ort"), BackendSpec("ort", "ort-crash", {"_fault": "segfault", "_fault_after": 1})]
    want = [np.maximum(x, 0), -x, 1 / (1 + np.exp(-x))]
    with WarmPool(tmp_path / "w", timeout_s=600, side_by_side=True) as pool:
        st = {}
        for k, path in enumerate([models[0], bad, models[1], models[2]]):
            store = run_model(
                path,
                specs,
                ArraySamples([("s", {"x": x})]),
                tmp_path / f"r{k}",
                progress=False,
                precheck=False,
                pool=pool,
            )
            st[k] = store.statuses()
            if path != bad:
                from anpred.judge import read_tensors

                got = read_tensors(store, "ort", store.sample_ids[0])["output/y"]
                np.testing.assert_allclose(got, want[models.index(path)], rtol=1e-6)
        assert [st[k]["ort"].status for k in range(4)] == ["ok", "failed", "ok", "ok"]
        assert "NoSuchOp" in st[1]["ort"].reason
        assert pool.started["ort"] == 1
        # ort-crash: 1st sample of its process ok, 2nd (model 2, bad: fails before running) ... the process
        # survives the Python failure, crashes at its 2nd sample (model 3), a fresh worker runs model 4
        assert [st[k]["ort-crash"].status for k in range(4)] == ["ok", "failed", "crashed", "ok"]
        assert "SIGSEGV" in st[2]["ort-crash"].reason and pool.started["ort-crash"] == 2


def test_warm_pool_kills_a_worker_over_its_memory_limit(tmp_path):
    """A worker whose resident set passes max_rss_bytes is killed: that model's status is `crashed`
    with the figure; the next model gets a fresh worker (killed again here: ONNX Runtime's import alone
    is above 16 MB)."""
    from anpred.inputs import ArraySamples
    from anpred.run.warm import WarmPool

    p = tmp_path / "m.onnx"
    onnx.save(_model([h.make_node("Relu", ["x"], ["y"])], [("x", [1, 3])], [("y", [1, 3])]), str(p))
    x = np.ones((1, 3), np.float32)
    with WarmPool(tmp_path / "w", timeout_s=600, max_rss_bytes=16 << 20) as pool:
        for k in range(2):
            st = run_model(
                p,
                ["ort"],
                ArraySamples([("s", {"x": x})]),
                tmp_path / f"r{k}",
                progress=False,
                precheck=False,
                pool=pool,
            ).statuses()["ort"]
            assert st.status == "crashed" and "over the pool's limit 0.02 GiB" in st.reason, st.reason
        assert pool.started["ort"] == 2


@pytest.mark.slow
def test_onnx2torch_needs_the_weights_bound(tmp_path):
    """The regression of the issue: onnx2torch on a Conv whose W is a graph input fails (KeyError: 'W');
    bound as an initializer (as the conformance run does for it) it converts and runs."""
    from anpred.inputs import ArraySamples

    d = _conv_case(tmp_path, np.random.default_rng(0))
    from anpred.conformance.cases import load_case

    c = load_case(d)
    store = run_model(
        c.model, ["torch"], ArraySamples([("s", c.inputs)]), tmp_path / "r", progress=False, precheck=False
    )
    assert store.statuses()["torch"].status == "failed" and "'W'" in store.statuses()["torch"].reason


def test_conformance_judges_twice_and_scores_the_oracle(tmp_path):
    """Four cases in ONNX's layout on ort, onnx-reference and torch (in this process, no Ray):
    Conv with weights as inputs (torch gets W and B bound and matches, the record says so); a Relu
    case whose expected output is wrong at one element (every backend deviates: the consensus
    fails the suite's test); Sigmoid within the case's own tolerance; a random generator (no truth).
    The score counts them."""
    from anpred.conformance.suite import ConformanceOptions, run_conformance

    rng = np.random.default_rng(1)
    cases = tmp_path / "cases"
    _conv_case(cases, rng)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    y = np.maximum(x, 0)
    y[0, 0] += 0.5  # a wrong expected value
    _case(
        cases,
        "test_relu_wrong_expected",
        _model([h.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])]),
        [x],
        [y],
    )
    _case(
        cases,
        "test_sigmoid",
        _model([h.make_node("Sigmoid", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])]),
        [x],
        [(1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)],
    )
    # a generator (ONNX's test_bernoulli_seed_expanded draws with RandomUniformLike): one draw is expected,
    # which binds no backend: truth "random", counted neither as matching nor as deviating
    _case(
        cases,
        "test_random_uniform_like",
        _model([h.make_node("RandomUniformLike", ["x"], ["y"], seed=0.0)], [("x", [2, 3])], [("y", [2, 3])]),
        [x],
        [rng.random((2, 3)).astype(np.float32)],
    )
    opts = ConformanceOptions(backends=["ort", "onnx-reference", "torch"], ray=False, progress=False, batch=2)
    res = run_conformance(cases, tmp_path / "out", opts)
    rec = {r["case"]: r for r in res["records"]}
    rnd = rec["test_random_uniform_like"]["backends"]
    assert rnd["ort"]["truth"] == "random" and "RandomUniformLike" in rnd["ort"]["reason"], rnd["ort"]
    assert not rec["test_random_uniform_like"]["consensus_wrong"]
    conv = rec["test_conv_weights_as_inputs"]
    assert conv["bound"] == {"torch": ["W", "B"]}
    assert {b: r["truth"] for b, r in conv["backends"].items()} == {
        "ort": "matches",
        "onnx-reference": "matches",
        "torch": "matches",
    }
    wrong = rec["test_relu_wrong_expected"]
    assert {r["truth"] for r in wrong["backends"].values()} == {"deviates"} and wrong["consensus_wrong"] is True
    assert "1 of 6 elements" in wrong["backends"]["ort"]["reason"]
    s = res["summary"]
    assert s["score"]["deviating"] == 3 and s["score"]["matching"] == 6 and s["consensus_wrong"]["cases"] == 1
    assert s["backends"]["torch"]["matches"] == 2
    assert (tmp_path / "out" / "matrix.tsv").read_text().splitlines()[0] == "case\tort\tonnx-reference\ttorch"
    # resumable: a second call runs nothing and reads the same records
    again = run_conformance(cases, tmp_path / "out", opts)
    assert [r["case"] for r in again["records"]] == [r["case"] for r in res["records"]]


def test_onnxsim_runs_are_served_by_one_warm_process(tmp_path):
    """onnx2tf's `onnxsim IN OUT` command, routed by warm_onnxsim: the simplifier's own entry point
    runs in one server process (same pid for two calls) and writes the simplified model (the Add of
    two constants folded away); a server killed between calls is replaced."""
    pytest.importorskip("onnxsim")
    pytest.importorskip("onnx2tf")
    import onnx2tf.onnx2tf as o2t

    from anpred.backends.onnxsim_warm import warm_onnxsim

    c = h.make_node("Constant", [], ["c"], value=nh.from_array(np.array([1.0, 2.0], np.float32)))
    m = _model(
        [c, h.make_node("Add", ["c", "c"], ["cc"]), h.make_node("Add", ["x", "cc"], ["y"])], [("x", [2])], [("y", [2])]
    )
    src = tmp_path / "m.onnx"
    onnx.save(m, str(src))
    with warm_onnxsim() as server:
        o2t.subprocess.check_output(["onnxsim", str(src), str(tmp_path / "s1.onnx")], stderr=o2t.subprocess.PIPE)
        pid = server.proc.pid
        o2t.subprocess.check_output(["onnxsim", str(src), str(tmp_path / "s2.onnx")], stderr=o2t.subprocess.PIPE)
        assert server.proc.pid == pid
        server.proc.kill()
        server.proc.wait()
        o2t.subprocess.check_output(["onnxsim", str(src), str(tmp_path / "s3.onnx")], stderr=o2t.subprocess.PIPE)
        assert server.proc.pid != pid
    import subprocess

    assert o2t.subprocess is subprocess  # restored
    for k in (1, 2, 3):
        s = onnx.load(str(tmp_path / f"s{k}.onnx"))
        assert [n.op_type for n in s.graph.node].count("Add") == 1  # c + c folded: one Add of the two left


def test_findings_deduplicate_and_render(tmp_path):
    """The ledger from results alone: two variants of one Concat case (axis 0 and 1: the same code
    path) deviating on tf and litert are one onnx2tf defect; a Flatten deviation on tf alone is
    tensorflow's; a case where the float64 execution deviates too is disputed, not a defect; a failure
    is counted apart; notes by library|operator and by defect id (merged) reach the table."""
    from anpred.conformance.findings import extract, render

    cases = tmp_path / "cases"
    x = np.zeros((2, 2), np.float32)
    for name, node in (
        ("test_concat_a0", h.make_node("Concat", ["x", "y"], ["z"], axis=0)),
        ("test_concat_a1", h.make_node("Concat", ["x", "y"], ["z"], axis=1)),
        ("test_flatten", h.make_node("Flatten", ["x"], ["z"])),
        ("test_disputed", h.make_node("Relu", ["x"], ["z"])),
    ):
        n_in = len(node.input)
        _case(cases, name, _model([node], [(i, [2, 2]) for i in node.input], [("z", None)]), [x] * n_in, [x])

    def row(truth, reason="", excess=0.0):
        r = {"truth": truth, "reason": reason}
        if truth == "deviates":
            r["outputs"] = {"output/z": {"max_excess": excess}}
        return r

    ok = row("matches")
    recs = [
        {
            "case": "test_concat_a0",
            "op": "Concat",
            "backends": {
                "tf": row("deviates", "4 of 8 elements outside", 500.0),
                "litert": row("deviates", "4 of 8", 500.0),
                "ort": ok,
                "onnx-reference-fp64": ok,
            },
        },
        {
            "case": "test_concat_a1",
            "op": "Concat",
            "backends": {
                "tf": row("deviates", "2 of 8 elements outside", 20.0),
                "litert": row("deviates", "2 of 8", 20.0),
                "ort": ok,
                "onnx-reference-fp64": ok,
            },
        },
        {
            "case": "test_flatten",
            "op": "Flatten",
            "backends": {
                "tf": row("deviates", "110 of 120 elements outside", 1e5),
                "litert": ok,
                "ort": ok,
                "onnx-reference-fp64": ok,
                "ncnn": row("failed", "prepare: BackendError: pnnx failed on test_flatten.onnx"),
            },
        },
        {
            "case": "test_disputed",
            "op": "Relu",
            "backends": {"ort": row("deviates", "1 of 4", 2.0), "onnx-reference-fp64": row("deviates", "1 of 4", 2.0)},
        },
    ]
    folder = tmp_path / "findings"
    folder.mkdir()
    doc = {
        "plan": {"folder": str(cases), "backends": ["ort", "tf", "litert", "ncnn", "onnx-reference-fp64"]},
        "versions": {"tf": {"onnx2tf": "1.29.24", "tensorflow": "2.20.0"}, "litert": {"onnx2tf": "1.29.24"}},
        "records": recs,
    }
    (folder / "run.conformance.json").write_text(json.dumps(doc))
    defects = extract([folder / "run.conformance.json"], folder, [cases])
    real = {k: d for k, d in defects.items() if k != "disputed"}
    assert sorted((d["library"], d["op"], len(d["cases"])) for d in real.values()) == [
        ("onnx2tf", "Concat", 2),
        ("onnx2tf/tensorflow", "Flatten", 1),
    ]
    concat = next(d for d in real.values() if d["op"] == "Concat")
    assert concat["example"] == "test_concat_a0" and concat["versions"] == {"onnx2tf": "1.29.24"}
    assert (folder / "repros" / "test_concat_a0" / "model.onnx").is_file()
    assert defects["disputed"]["cases"] == ["test_disputed (onnx-reference-fp64, ort)"]
    flatten = next(k for k, d in real.items() if d["op"] == "Flatten")
    (folder / "notes.json").write_text(
        json.dumps(
            {
                "onnx2tf|Concat": {"tracker": "not found", "cause": "a cause"},
                "onnx2tf/tensorflow|Flatten": {"tracker": "#1"},
                flatten: {"first_bad": "onnx2tf 1.2.0 (last good 1.1.0)"},
            }
        )
    )
    md = render(folder)
    assert "**2 distinct numeric defects**" in md and "| not bisected | not found | a cause |" in md
    # a defect's own note (its bisection) is merged over its operator's (the tracker)
    assert "| onnx2tf 1.2.0 (last good 1.1.0) | #1 |  |" in md
    assert "| pnnx/ncnn | 1 | 0 | 1 |" in md


@pytest.mark.slow
@pytest.mark.isa_independent(FP32_BOUND)
def test_torch_backend_takes_one_tensor_as_the_first_output(tmp_path):
    """Regression (found by the conformance run): onnx2torch's LayerNormalization returns Y alone for a
    node declaring Y, Mean and InvStdDev; the torch backend handed Y's rows out as the three outputs
    (Y of shape [4] for [3, 4]). Y is now Y (equal to ONNX Runtime's), the outputs not computed are
    missing."""
    from anpred.inputs import ArraySamples

    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    w, b = np.full(4, 1.5, np.float32), np.full(4, 0.25, np.float32)
    node = h.make_node("LayerNormalization", ["x", "w", "b"], ["y", "mean", "inv"], axis=-1)
    g = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 4])],
        [
            h.make_tensor_value_info("y", T.FLOAT, [3, 4]),
            h.make_tensor_value_info("mean", T.FLOAT, [3, 1]),
            h.make_tensor_value_info("inv", T.FLOAT, [3, 1]),
        ],
        [nh.from_array(w, "w"), nh.from_array(b, "b")],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "ln.onnx"))
    store = run_model(
        tmp_path / "ln.onnx", ["torch"], ArraySamples([("s", {"x": x})]), tmp_path / "r", progress=False, precheck=False
    )
    from anpred.judge import read_tensors

    got = read_tensors(store, "torch", store.sample_ids[0])
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    assert got["output/y"].shape == (3, 4)
    np.testing.assert_allclose(got["output/y"], ref, rtol=1e-4, atol=1e-5)
    assert "output/mean" not in got or got["output/mean"].shape == (3, 1)


def test_the_consensus_is_scored_after_a_split_too(tmp_path):
    """A review of issue 33: the consensus was scored against the expected outputs only where it was
    formed without a split or a merge, so a split decided for a wrong majority (ONNX's
    resize_downsample_scales_*_align_corners: ort, openvino, torch, mnn bit-identical, the spec's value
    elsewhere) left ``consensus_wrong`` empty. Here: Resize nearest (``round_prefer_ceil``, a tie at every
    other pixel) on ort and onnx-reference, which follow it, and torch, which rounds down (a camp of
    its own: the split is decided for the two by count); the case's expected output is the floor
    rounding, so the consensus fails the suite's test and the record says so."""
    from anpred.conformance.suite import ConformanceOptions, run_conformance

    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    scales = nh.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")
    node = h.make_node(
        "Resize",
        ["x", "", "scales"],
        ["y"],
        mode="nearest",
        nearest_mode="round_prefer_ceil",
        coordinate_transformation_mode="half_pixel",
    )
    m = _model([node], [("x", [1, 1, 4, 4])], [("y", [1, 1, 2, 2])], opset=13)
    m.graph.initializer.append(scales)
    floor_rounding = x[:, :, 0::2, 0::2]  # what torch returns (its nearest floors: pixel 2k, not 2k + 1)
    _case(tmp_path / "cases", "test_resize_rounding", m, [x], [floor_rounding.copy()])
    opts = ConformanceOptions(backends=["ort", "onnx-reference", "torch"], ray=False, progress=False, batch=1)
    rec = run_conformance(tmp_path / "cases", tmp_path / "out", opts)["records"][0]
    truth = {b: r["truth"] for b, r in rec["backends"].items()}
    assert truth == {"ort": "deviates", "onnx-reference": "deviates", "torch": "matches"}, rec
    assert "split" in rec["consensus_mode"]["output/y"][0], rec["consensus_mode"]
    assert rec["consensus_wrong"] is True and "of 4 elements" in rec["consensus_reason"]
