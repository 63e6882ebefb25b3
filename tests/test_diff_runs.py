"""anpred diff: anchor correspondence and stages between an anchored YOLOv8n (tests/diff_cases.py) and
its int8 QDQ, fp16 and optimised copies, graph I/O and opset changes, and run diffs on real runs (stats
and tensors mode, backend pairs). Structural diffs: tests/test_diff_graphs.py.
"""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import onnx
import pytest

from anpred.diff import diff_files, diff_models

from isa_reasons import FP32_BOUND, SAME_DATA
from diff_cases import fp16_copy, ort_optimised


# ------------------------------------------------------------------------------------------------
# anchors, stages, runs
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def anchored(yolo_path, tmp_path_factory):
    from anpred.instrument import instrument_model

    m = onnx.load(str(yolo_path))
    am, man = instrument_model(m, stages=6)
    d = tmp_path_factory.mktemp("anch")
    onnx.save(am, str(d / "a.onnx"))
    # B: the same anchored model with the Conv nodes of stages >= 3 quantized to int8 QDQ by ONNX
    # Runtime's static quantizer (calibrated on two random images); stages 0-2 stay untouched
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{m.graph.input[0].name: rng.random((1, 3, 160, 160), dtype=np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.it, None)

    first = man.stages[3].first
    late = [n.name for i, n in enumerate(am.graph.node) if i >= first and n.op_type == "Conv"]
    quantize_static(
        str(d / "a.onnx"),
        str(d / "b.onnx"),
        Reader(),
        quant_format=QuantFormat.QDQ,
        nodes_to_quantize=late,
        op_types_to_quantize=["Conv"],
    )
    return d / "a.onnx", d / "b.onnx", man


def test_stages_and_anchor_correspondence(anchored):
    pa, pb, man = anchored
    d = diff_files(pa, pb)
    assert [s.index for s in d.stages] == [s.index for s in man.stages]
    # Q/DQ pairs inserted in front of the quantized Convs (stages >= 3) and in front of everything
    # else that reads the same activations (the quantizer rewires those readers too); stages 0-1
    # untouched
    by = {s.index: s for s in d.stages}
    assert all(by[i].changed == 0 and not by[i].regions for i in (0, 1))
    assert all(by[i].regions for i in range(3, len(man.stages)))
    assert {r.kind for r in d.regions} == {"inserted"}
    ins = d.insertions()
    assert set(ins) == {"QuantizeLinear", "DequantizeLinear"} and ins["DequantizeLinear"] > ins["QuantizeLinear"]
    assert {a.anchor for a in d.anchors} == set(man.names())
    assert all(a.status in ("exact", "equivalent") for a in d.anchors)
    quantized = [a for a in d.anchors if a.transform and a.transform.get("quantized")]
    assert quantized and min(a.stage for a in quantized) == min(r.stage for r in d.regions)


@pytest.mark.isa_independent(FP32_BOUND)
def test_run_diff_names_first_moved_anchor(anchored, tmp_path):
    from anpred.diff import RunDiff, diff_runs
    from anpred.run import run_model

    pa, pb, man = anchored
    inputs = "random:uniform:seed=3:n=2"
    run_model(pa, ["ort"], inputs, tmp_path / "ra", progress=False)
    run_model(pb, ["ort"], inputs, tmp_path / "rb", progress=False)
    run_model(pa, ["ort"], inputs, tmp_path / "ra2", progress=False)
    same = diff_runs(tmp_path / "ra", tmp_path / "ra2")
    assert not same.moved and len(same.samples) == 2
    assert all(c.value <= c.floor for a in same.anchors for c in a.cells)
    rd = diff_runs(tmp_path / "ra", tmp_path / "rb")
    # the first anchor that moved is the first one that the structural diff sees behind a Q/DQ pair
    order = {a.name: a.order for a in man.anchors}
    quantized = sorted(
        (order[a.anchor], a.anchor) for a in rd.graph.anchors if a.transform and a.transform.get("quantized")
    )
    assert rd.moved and rd.first_moved["anchor"] == quantized[0][1], rd.summary()
    for a in rd.anchors:
        assert a.cells, a.missing
        if a.order < quantized[0][0]:
            assert not a.moved and a.cells[0].value < 1e-6
    assert rd.graph.insertions().get("QuantizeLinear", 0) > 0
    assert RunDiff.from_dict(json.loads(json.dumps(rd.to_dict()))).first_moved == rd.first_moved
    # CLI: exit 1 on a difference, JSON and HTML written
    from anpred.cli import main

    rc = main(
        [
            "diff",
            str(tmp_path / "ra"),
            str(tmp_path / "rb"),
            "--json",
            str(tmp_path / "d.json"),
            "--html",
            str(tmp_path / "d.html"),
            "-q",
        ]
    )
    assert rc == 1
    assert json.loads((tmp_path / "d.json").read_text())["first_moved"]["anchor"] == rd.first_moved["anchor"]
    assert rd.first_moved["anchor"] in (tmp_path / "d.html").read_text()


def test_fp16_keep_io_anchors_are_equivalent_dtype(anchored):
    pa, _pb, man = anchored
    a = onnx.load(str(pa))
    same = diff_models(a, copy.deepcopy(a)).anchors
    assert {x.status for x in same} == {"exact"} and len(same) == len(man.anchors)
    b = fp16_copy(a)
    d = diff_models(a, b)
    # every anchor output of B is an fp16 value cast back to float32 by an inserted Cast
    assert len(d.anchors) == len(man.anchors)
    for x in d.anchors:
        assert (x.status, x.transform) == ("equivalent", {"dtype": "float16"}), x
    exposed = [x for x in d.anchors if x.anchor in {o.name for o in b.graph.output}]
    assert exposed and all("Cast from float16" in x.reason for x in exposed if x.reason.startswith("exposed"))


def test_stages_placed_by_anchor_values_in_an_optimisers_copy(yolo_path, anchored, tmp_path):
    pa, _pb, man = anchored
    ext = ort_optimised(pa, tmp_path / "anch_ext.onnx", "ORT_ENABLE_EXTENDED")
    assert onnx.load(str(ext)).metadata_props  # the manifest survives in the copy's metadata
    # the reviewer's case: plain model vs the optimiser's copy of the anchored one
    d = diff_files(yolo_path, ext)
    assert [s.index for s in d.stages] == [s.index for s in man.stages]
    # each matched node sits in the stage the manifest's node slices give it in the anchored graph
    a = onnx.load(str(pa))
    pos_stage = {}
    for k, nd in enumerate(a.graph.node):  # (the anchors' exposing Identity nodes lie outside the slices)
        for s in man.stages:
            if s.first <= k <= s.last:
                pos_stage[nd.name] = s.index
    assert len(pos_stage) > 200
    d2 = diff_files(pa, ext)
    b_stage = {item.split(":")[1]: st.index for st in d2.stages for item in st.b_ops}
    a_stage = {item.split(":")[1]: st.index for st in d2.stages for item in st.a_ops}
    assert {n: a_stage[n] for n in pos_stage} == pos_stage  # A itself: positions and values agree
    both = [n for n in b_stage if n in pos_stage]
    assert len(both) > 100
    assert {n: b_stage[n] for n in both} == {n: pos_stage[n] for n in both}


def test_graph_io_by_name_and_opset_changes(anchored, tmp_path):
    from anpred.instrument import instrument_model

    pa, _pb, man = anchored
    a = onnx.load(str(pa))
    base = onnx.load(str(pa))
    for k in range(len(base.graph.output) - 1, -1, -1):
        if base.graph.output[k].name in set(man.names()) - {x.name for x in man.anchors if x.kind == "output"}:
            del base.graph.output[k]
    # same model with another anchor set (4 stages instead of 6): outputs differ only by anchors
    other, man4 = instrument_model(base, stages=4)
    d = diff_models(a, other)
    kinds = Counter(c.kind for c in d.io)
    assert set(kinds) == {"graph_output"}
    only_a = {c.a for c in d.io if c.a}
    only_b = {c.b for c in d.io if c.b}
    outs_a, outs_b = {o.name for o in a.graph.output}, {o.name for o in other.graph.output}
    assert only_a == outs_a - outs_b and only_b == outs_b - outs_a and only_a and only_b
    # a renamed graph input is one rename; an opset bump is reported per domain
    b = copy.deepcopy(a)
    old = b.graph.input[0].name
    for n in b.graph.node:
        n.input[:] = ["image" if x == old else x for x in n.input]
    b.graph.input[0].name = "image"
    b.opset_import[0].version += 1
    d = diff_models(a, b)
    assert [(c.kind, c.a, c.b) for c in d.io] == [("renamed", old, "image")]
    v = a.opset_import[0].version
    assert [(c.kind, c.what, c.a, c.b) for c in d.opset] == [("opset", a.opset_import[0].domain or "ai.onnx", v, v + 1)]
    assert "opset imports" in d.summary()


@pytest.fixture(scope="session")
def fp16_runs(anchored, tmp_path_factory):
    """Runs of the anchored model (A) and of its fp16 conversion (B): stats mode and tensors mode."""
    from anpred.run import run_model

    pa, _pb, _man = anchored
    d = tmp_path_factory.mktemp("fp16runs")
    onnx.save(fp16_copy(onnx.load(str(pa))), str(d / "b16.onnx"))
    inputs = "random:uniform:seed=3:n=2"
    run_model(pa, ["ort"], inputs, d / "sa", mode="stats", progress=False)
    run_model(d / "b16.onnx", ["ort"], inputs, d / "sb", mode="stats", progress=False)
    run_model(pa, ["ort"], inputs, d / "ta", progress=False)
    run_model(d / "b16.onnx", ["ort"], inputs, d / "tb", progress=False)
    return d


@pytest.mark.isa_independent(SAME_DATA)
def test_stats_mode_runs_are_compared_by_summaries(fp16_runs, anchored, tmp_path, capsys):
    from anpred.cli import main
    from anpred.diff import diff_runs

    d = fp16_runs
    _pa, _pb, man = anchored
    rs = diff_runs(d / "sa", d / "sb")  # the reviewer's case: was "no difference" with 0 cells
    assert rs.mode == "stats" and rs.statistic == "nrmse_lb"
    assert rs.compared == len(man.anchors) and not rs.not_compared()
    rt = diff_runs(d / "ta", d / "tb")
    assert rt.mode == "tensors" and rt.compared == len(man.anchors)
    nrmse = {a.anchor: a.cells[0].value for a in rt.anchors}
    lb = {a.anchor: a.cells[0].value for a in rs.anchors}
    # the summary statistic is a lower bound of the tensors' nRMSE, and not a vacuous one
    for k in lb:
        assert 0 <= lb[k] <= nrmse[k] * (1 + 1e-9) + 1e-15, (k, lb[k], nrmse[k])
    assert sum(v > 0 for v in lb.values()) >= len(lb) - 1
    # its value, recomputed from the stored tensors of the worst sample
    a0 = rs.anchors[0]
    from anpred.run import RunStore

    sid = a0.cells[0].worst_sample
    xa = RunStore.open(d / "ta").read_anchors("ort", sid)[a0.anchor].astype(np.float64)
    xb = RunStore.open(d / "tb").read_anchors("ort", sid)[a0.anchor].astype(np.float64)
    rms = lambda x: np.sqrt(np.mean(x * x))  # noqa: E731
    want = max(abs(xb.mean() - xa.mean()), abs(xb.std() - xa.std()), abs(rms(xb) - rms(xa))) / rms(xa)
    assert a0.cells[0].value == pytest.approx(want, rel=1e-6)
    # a tensors run against a stats run: the tensors side is summarised the same way
    rm = diff_runs(d / "ta", d / "sb")
    assert rm.mode == "stats" and {a.anchor: a.cells[0].value for a in rm.anchors} == pytest.approx(lb, rel=1e-6)
    # the fp16 model moved; a stats run against the same model's tensors run did not
    assert rs.moved and rs.first_moved["statistic"] == "nrmse_lb"
    same = diff_runs(d / "ta", d / "sa")
    assert not same.moved and same.compared == len(man.anchors)
    assert max(c.value for a in same.anchors for c in a.cells) < 1e-9
    assert main(["diff", str(d / "sa"), str(d / "sb"), "-q"]) == 1


def test_run_diff_refuses_when_nothing_was_compared(fp16_runs, tmp_path, capsys):
    import shutil

    from anpred.cli import main
    from anpred.errors import JudgeError
    from anpred.diff import diff_runs

    d = fp16_runs
    pruned = tmp_path / "pruned"
    shutil.copytree(d / "tb", pruned)
    shutil.rmtree(pruned / "tensors" / "ort")  # tensors cleaned up after the run
    with pytest.raises(JudgeError, match="no anchor could be compared.*not stored by ort in run B"):
        diff_runs(d / "ta", pruned)
    assert main(["diff", str(d / "ta"), str(pruned), "--json", str(tmp_path / "x.json")]) == 2
    assert "nothing was compared" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    # partly pruned: the rest is compared, the missing cells are shown with their reason
    shutil.copytree(d / "tb" / "tensors" / "ort", pruned / "tensors" / "ort")
    from anpred.run import RunStore

    ps = RunStore.open(pruned)
    for sid in ("s0001", "s0000"):  # drop the first anchor of one sample, then of the other
        kept = dict(list(ps.read_anchors("ort", sid).items())[1:])
        ps.write_anchors("ort", sid, kept)
        assert list(ps.read_anchors("ort", sid)) == list(kept)
        if sid == "s0001":
            rd = diff_runs(d / "ta", pruned)
            assert rd.compared == len(rd.anchors)  # sample s0000 still has every anchor
    rd = diff_runs(d / "ta", pruned)
    (gone,) = [a for a in rd.anchors if not a.cells]
    assert gone.missing == {"ort": "not stored by ort in run B"}
    assert f"{gone.anchor} on ort: not stored by ort in run B" in rd.summary()
    from anpred.report.diff_html import render_diff_html

    assert "not stored by ort in run B" in render_diff_html(runs=rd)


@pytest.mark.isa_independent(SAME_DATA)
def test_run_diff_backend_pairs(anchored, fp16_runs, tmp_path):
    from anpred.cli import main
    from anpred.defaults import OracleConfig
    from anpred.errors import JudgeError
    from anpred.diff import diff_runs
    from anpred.judge import error_stats
    from anpred.run import RunStore, run_model

    pa, _pb, man = anchored
    d = fp16_runs
    run_model(pa, ["ort-fp16"], "random:uniform:seed=3:n=2", tmp_path / "rf", progress=False)
    with pytest.raises(JudgeError, match=r"no backend is ok in both runs.*--pair"):
        diff_runs(d / "ta", tmp_path / "rf")
    with pytest.raises(JudgeError, match="ort-fp16: not in run A"):
        diff_runs(d / "ta", tmp_path / "rf", backends=["ort-fp16"])
    rd = diff_runs(d / "ta", tmp_path / "rf", pairs={"ort": "ort-fp16"})
    assert rd.backends == ["ort=ort-fp16"] and rd.pairs == [["ort", "ort-fp16"]]
    assert rd.compared == len(man.anchors)
    cfg = OracleConfig()
    out = next(a for a in rd.anchors if a.anchor.startswith("output/"))
    c = out.cells[0]
    assert c.floor == cfg.floor_at("fp16", out.stage)
    xa = RunStore.open(d / "ta").read_anchors("ort", c.worst_sample)[out.anchor]
    xb = RunStore.open(tmp_path / "rf").read_anchors("ort-fp16", c.worst_sample)[out.anchor]
    assert c.value == pytest.approx(error_stats(xb, xa).nrmse, rel=1e-9) and c.value > 0
    rc = main(
        ["diff", str(d / "ta"), str(tmp_path / "rf"), "--pair", "ort=ort-fp16", "--json", str(tmp_path / "p.json")]
    )
    assert rc in (0, 1) and json.loads((tmp_path / "p.json").read_text())["backends"] == ["ort=ort-fp16"]
    assert main(["diff", str(d / "ta"), str(tmp_path / "rf"), "--pair", "ort"]) == 2
