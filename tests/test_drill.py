"""The drill-down (issue 19) on real runtimes: small CNNs holding real OpenVINO 2026.4.1 defects
(Softplus far below zero; AveragePool with ceil_mode and count_include_pad) cut into few stages, so
that the origin stage holds several operators: the culprit must be the defective node, its repro one
node that, re-run alone, departs in OpenVINO only; a clean run gives no culprit and every backend's
local error (each stage replayed alone from the consensus) at fp32 noise. Backends: ort, openvino,
torch (onnx2torch, a converter: each subgraph converted anew) and onnx-reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anpred.drill import DrillConfig, drill_run
from anpred.instrument import instrument_model
from anpred.judge import check_run
from check_runs import avgpool_cnn, make_run, plain_cnn, random_inputs as _inputs, softplus_cnn

from isa_reasons import DEFECT_BOUND, FP32_BOUND

BACKENDS = ["ort", "openvino", "torch", "onnx-reference"]


def _coarse(build, stages):
    """The test network of ``build`` re-instrumented into ``stages`` stages (the partition is redone;
    the anchors of the finer one are dropped)."""
    am, _ = build()
    return instrument_model(am, stages=stages)


@pytest.fixture(scope="module")
def softplus_drill(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drill-softplus")
    am, man = _coarse(softplus_cnn, 2)
    run = make_run(tmp, am, man, _inputs([1, 3, 16, 16], 4, 0), backends=BACKENDS)
    rep = check_run(run)
    res = drill_run(run, rep)
    return run, rep, res, man


def _rerun_repro(repro: Path, tmp: Path):
    """Re-run a repro folder's model on the four backends (its inputs.npz) and judge it."""
    from anpred.run import run_model

    store = run_model(repro / "model.onnx", BACKENDS, repro / "inputs.npz", tmp, progress=False)
    return check_run(store.root)


@pytest.mark.slow  # ~10 s: a drill-down on real runtimes; test_drill_grow.py keeps one in the default run
@pytest.mark.isa_independent(DEFECT_BOUND)
def test_softplus_culprit_in_a_coarse_stage(softplus_drill, tmp_path):
    run, rep, res, man = softplus_drill
    assert rep.flagged_backends == ["openvino"]
    v = rep.verdicts["openvino"]
    # the origin stage holds conv, relu, conv, Softplus: the stage alone is too coarse
    assert len(man.stages) == 2 and man.stages[v.origin_stage].num_nodes == 4
    c = v.culprit
    assert c["node"] == "softplus" and c["op_type"] == "Softplus" and c["stage"] == v.origin_stage
    assert c["reproduced"] and c["scope"] == "operator"
    assert c["local_nrmse"] > 0.05 and c["peers_nrmse"] < 1e-5  # OpenVINO returns 0 or -1.9e-6 there
    assert res["culprits"] == {"openvino": c} and set(res["culprits"]) == set(rep.flagged_backends)
    # stage replay: OpenVINO introduces the error in stage 0 and only carries it through stage 1
    prof = {p["stage"]: p for p in res["stages"]["openvino"]}
    assert prof[0]["role"] == "introduced" and prof[1]["role"] == "carried"
    assert prof[1]["local"] < 1e-6 and prof[1]["carried"] > 10 * prof[1]["local"]  # stage 1 alone: clean
    for b in ("ort", "torch", "onnx-reference"):
        assert all(p["role"] == "clean" and p["local"] < 1e-5 for p in res["stages"][b]), res["stages"][b]
    # the repro: one node, its real input values, the consensus and each backend's outputs
    repro = Path(c["repro"])
    import onnx

    m = onnx.load(repro / "model.onnx")
    assert [n.op_type for n in m.graph.node] == ["Softplus"]
    x = np.load(repro / "inputs.npz")
    (name,) = x.files
    assert x[name].shape == (1, 8, 16, 16) and np.median(x[name]) < -10  # the values it received: far below 0
    expected = np.load(repro / "expected.npz")
    outs = {b: np.load(repro / "outputs" / f"{b}.npz") for b in BACKENDS}
    (out,) = expected.files

    def nrmse(a):
        return float(np.linalg.norm(a - expected[out]) / np.linalg.norm(expected[out]))

    assert nrmse(outs["openvino"][out]) > 0.05 and max(nrmse(outs[b][out]) for b in ("ort", "torch")) < 1e-5
    assert "anpred test model.onnx --inputs inputs.npz" in (repro / "README.md").read_text()
    assert c["flagged_in_repro"]
    # re-run alone with the README's command, verbatim, from the repro folder: exit status 1, flagged in
    # OpenVINO only (one re-run: the Python API's is the same pipeline, in tests/test_drill.py's slow cases)
    readme = (repro / "README.md").read_text()
    cmd = next(line.strip() for line in readme.splitlines() if line.strip().startswith("anpred test "))
    p = subprocess.run(
        [sys.executable, "-m", "anpred", *cmd.split()[1:]], cwd=repro, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 1 and "FLAGGED" in p.stdout, (p.returncode, p.stdout[-1500:], p.stderr[-1500:])
    out = Path(cmd.split("-o ", 1)[1].split()[0])
    verdicts = json.loads((repro / out / "report.json").read_text())["verdicts"]
    assert sorted(b for b, v in verdicts.items() if v["flagged"]) == ["openvino"]


@pytest.mark.slow  # ~20 s; the Softplus case covers the same path in the default run
def test_avgpool_culprit(tmp_path):
    am, man = _coarse(avgpool_cnn, 2)
    run = make_run(tmp_path, am, man, _inputs([1, 3, 8, 8], 4, 1), backends=BACKENDS)
    rep = check_run(run)
    assert rep.flagged_backends == ["openvino"]
    res = drill_run(run, rep)
    c = rep.verdicts["openvino"].culprit
    assert c["node"] == "avgpool" and c["op_type"] == "AveragePool" and c["reproduced"] and c["scope"] == "operator"
    import onnx

    m = onnx.load(Path(c["repro"]) / "model.onnx")
    (node,) = m.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["ceil_mode"] == 1 and attrs["count_include_pad"] == 1 and list(attrs["pads"]) == [1, 1, 1, 1]
    assert res["runs"] <= 4  # replay, one drill round, the repro (+1 when the operator's inputs were not exposed)
    again = _rerun_repro(Path(c["repro"]), tmp_path / "again")
    assert again.flagged_backends == ["openvino"]  # the one-node repro, alone: OpenVINO only


@pytest.mark.slow
def test_bisection_with_few_exposed_tensors(softplus_drill, tmp_path):
    """A stage with more inner tensors than ``max_exposed`` is searched k-ary: same culprit, more rounds."""
    run, rep, _, _ = softplus_drill
    res = drill_run(run, rep, tmp_path / "d", drill=DrillConfig(max_exposed=2, max_samples=2))
    c = res["culprits"]["openvino"]
    assert c["node"] == "softplus" and c["rounds"] >= 2 and c["reproduced"]
    assert all(p["exposed"] <= 2 for p in c["path"])


@pytest.mark.isa_independent(FP32_BOUND)
def test_clean_run_has_no_culprit_and_local_error_at_noise(tmp_path):
    am, man = _coarse(plain_cnn, 3)
    run = make_run(tmp_path, am, man, _inputs([1, 3, 32, 32], 4, 2), backends=BACKENDS)
    rep = check_run(run)
    assert rep.flagged_backends == []
    res = drill_run(run, rep)
    assert res["culprits"] == {} and all(v.culprit is None for v in rep.verdicts.values())
    assert res["runs"] == 1  # the replay only: nothing to drill
    for b, prof in res["stages"].items():
        assert len(prof) == len(man.stages)
        for p in prof:  # fp32 noise: nonzero, below the anchor's floor
            floor = rep.cell(p["anchor"], b).floor
            assert p["role"] == "clean" and 0 <= p["local"] < floor, (b, p, floor)
            assert p["local"] < 1e-5


@pytest.mark.slow  # ~20 s; the README command of the repro is run in the default case
def test_cli_check_drill_writes_culprit(softplus_drill, tmp_path):
    run, _, _, _ = softplus_drill
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-m", "anpred", "check", str(run), "--drill", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    assert "culprit openvino: Softplus 'softplus'" in p.stdout
    d = json.loads(out.read_text())
    assert d["verdicts"]["openvino"]["culprit"]["node"] == "softplus"
    assert d["verdicts"]["openvino"]["stage_roles"]["anchor/00/sp"] == "introduced"
    assert d["verdicts"]["ort"]["culprit"] is None and d["drill"]["stages"]["openvino"][0]["role"] == "introduced"


def _if_softplus_cnn():
    """conv -> If(mean(x) > -1e9, computed: always true) whose branches compute Softplus(t - 15) and
    Softplus(t - 16) -> conv: OpenVINO's Softplus defect inside a subgraph-bearing operator."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from check_runs import conv_layer as _conv

    rng = np.random.default_rng(5)
    c0, i0 = _conv("c0", "x", "t0", 3, 8, rng)
    c1, i1 = _conv("c1", "sp", "y", 8, 4, rng)

    def branch(name, shift):
        k = nh.from_array(np.array(shift, np.float32), f"{name}.k")
        return h.make_graph(
            [
                h.make_node("Sub", ["t0", k.name], [f"{name}.s"], name=f"{name}.sub"),
                h.make_node("Softplus", [f"{name}.s"], [f"{name}.o"], name=f"{name}.softplus"),
            ],
            name,
            [],
            [h.make_tensor_value_info(f"{name}.o", T.FLOAT, [1, 8, 16, 16])],
            [k],
        )

    lim = nh.from_array(np.array(-1e9, np.float32), "lim")
    nodes = [
        c0,
        h.make_node("ReduceMean", ["t0"], ["m"], name="mean", keepdims=0),
        h.make_node("Greater", ["m", "lim"], ["cond"], name="gt"),
        h.make_node(
            "If", ["cond"], ["sp"], name="branchy", then_branch=branch("then", 15.0), else_branch=branch("else", 16.0)
        ),
        c1,
    ]
    g = h.make_graph(
        nodes,
        "if_softplus",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 16, 16])],
        i0 + i1 + [lim],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return instrument_model(m, stages=1, anchors=["sp"])  # one stage: conv, mean, greater, If


@pytest.mark.slow
def test_culprit_inside_an_if_body(tmp_path):
    """The defect sits in an If's branch: the drill finds the If, inlines it one level down and names
    the branch's Softplus; the repro is that Softplus alone, reproduced."""
    am, man = _if_softplus_cnn()
    run = make_run(tmp_path, am, man, _inputs([1, 3, 16, 16], 3, 4), backends=BACKENDS)
    rep = check_run(run)
    assert rep.flagged_backends == ["openvino"], rep.flagged_backends
    res = drill_run(run, rep)
    c = res["culprits"]["openvino"]
    assert c["body_of"] == "branchy" and c["op_type"] == "Softplus" and c["node"] == "branchy/then/then.softplus"
    assert [p["first"] for p in c["path"]][0] == "sp" and c["reproduced"] and c["scope"] == "operator"
    import onnx

    assert [n.op_type for n in onnx.load(Path(c["repro"]) / "model.onnx").graph.node] == ["Softplus"]


@pytest.mark.slow
def test_anpred_test_drill_writes_repro_in_the_report_folder(tmp_path):
    """``anpred test MODEL --drill``: the drill runs in the partial folder; the culprit and its repro
    are named at their final place and the repro folder is there."""
    import anpred
    from pipeline_factories import softplus_onnx

    out = tmp_path / "report"
    res = anpred.test(
        str(softplus_onnx(tmp_path / "m.onnx")), out=out, backends=BACKENDS, samples=2, stages=2, quiet=True, drill=True
    )
    c = res.report.verdicts["openvino"].culprit
    assert c["node"] == "softplus" and c["reproduced"]
    assert Path(c["repro"]) == out / "drill" / "repro" / "openvino" and (Path(c["repro"]) / "model.onnx").is_file()
    d = json.loads((out / "report.json").read_text())
    assert d["verdicts"]["openvino"]["culprit"]["repro"] == str(out / "drill" / "repro" / "openvino")
    assert "culprit openvino: Softplus 'softplus'" in res.format_text()
    assert res.seconds["drill"] > 0
    assert ".partial" not in (out / "drill" / "drill.json").read_text()  # named at the final place
    page = (out / "report.html").read_text()
    assert "<h2>Drill-down</h2>" in page and "Softplus <code>softplus</code>" in page and "(introduced)" in page


@pytest.mark.slow
def test_bisection_follows_the_ancestors_on_a_branching_stage(tmp_path):
    """Regression (review): with two branches joined by an Add and 2 tensors exposed per round, the
    search once narrowed to the interval before the first departing tensor and named the Mul that only
    carried the error (and a "stage prefix" repro hid it). It must follow the departing tensor's
    ancestors and name the Softplus, with a one-operator repro."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from check_runs import conv_layer as _conv

    rng = np.random.default_rng(0)
    c1, i1 = _conv("c1", "x", "a0", 3, 3, rng, bias=-15.0, scale=0.3)
    nodes = [
        c1,
        h.make_node("Softplus", ["a0"], ["a1"], name="A1_softplus"),
        h.make_node("Relu", ["x"], ["b1"], name="B1"),
        h.make_node("Neg", ["b1"], ["b2"], name="B2"),
        h.make_node("Abs", ["b2"], ["b3"], name="B3"),
        h.make_node("Mul", ["a1", "big"], ["a2"], name="A2_mul"),
        h.make_node("Add", ["a2", "b3"], ["y"], name="J"),
    ]
    g = h.make_graph(
        nodes,
        "branchy",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 16, 16])],
        i1 + [nh.from_array(np.array(1e6, np.float32), "big")],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    am, man = instrument_model(m, stages=1)
    run = make_run(tmp_path, am, man, _inputs([1, 3, 16, 16], 3, 0), backends=BACKENDS)
    rep = check_run(run)
    assert rep.flagged_backends == ["openvino"]
    res = drill_run(run, rep, tmp_path / "d", drill=DrillConfig(max_exposed=2, max_samples=2))
    c = res["culprits"]["openvino"]
    assert c["node"] == "A1_softplus" and c["scope"] == "operator" and c["reproduced"], c
    assert c["path"][-1]["candidates"] <= 2 and c["rounds"] >= 2


def test_drill_refuses_the_threshold_oracle(softplus_drill):
    run, _, _, _ = softplus_drill
    p = subprocess.run(
        [sys.executable, "-m", "anpred", "check", str(run), "--drill", "--oracle", "threshold"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and "--drill needs the consensus oracle" in p.stderr
