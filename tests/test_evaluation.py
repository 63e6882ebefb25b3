"""A reduced reference evaluation (issue 7): YOLOv8n at 320 px, the clean backends ort, openvino, torch,
tf and onnx-reference run once on one real and one random input; two fault kinds x two stages run
only the faulty variant (ONNX Runtime, its own family) judged with the clean backends' linked tensors.
The ground truth must be recovered: the faulty backend flagged, its origin stage the injected stage,
no clean backend flagged (and nothing flagged in the clean and null configurations)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the evaluation package
import evaluation as ev  # noqa: E402

from isa_reasons import DEFECT_BOUND, SAME_DATA, SAME_RUNTIME
from ort_session import ort_anchors

KINDS = (("round", 8.0), ("approx-sigmoid", 1.0))  # bfloat16 rounding; the fast sigmoid in place of Sigmoid
STAGES = (1, 3)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory, yolov8n_onnx):
    work = tmp_path_factory.mktemp("evaluation")
    setup = ev.prepare_model("yolov8n", work, imgsz=320, n_real=1, n_random=1, lowp=())
    clean = ev.clean_summary(setup)
    null = ev.run_configuration(setup, clean, None, None, None, work / "configs")
    faulty = [
        ev.run_configuration(setup, clean, k, s, m, work / "configs", keep=(k, s) == ("round", 1))
        for k, m in KINDS
        for s in STAGES
    ]
    return setup, clean, null, faulty, work


@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_clean_backends_ran_and_are_not_flagged(reduced):
    from anpred.run import RunStore

    setup, clean, null, _, _ = reduced
    # yolov8n has a native PyTorch rebuild: eager PyTorch (torch-native) is a clean backend too
    assert setup.backends == [*ev.CLEAN_BACKENDS, "torch-native"]
    st = RunStore.open(setup.clean_dir).statuses()["torch-native"]
    assert st.anchors_captured == len(clean.anchors), st.reason
    assert sorted(setup.samples.values()) == ["random", "real"]
    assert clean.flagged == []
    assert null.truth is None and not null.flagged and null.clean_flagged == []
    # the null configuration's fault slot is ONNX Runtime on the clean model: bit-identical to clean ort
    assert null.output_nrmse == 0.0
    # every clean fp32 backend's detections are compared with the clean consensus
    assert set(clean.detections) == {*ev.CLEAN_BACKENDS, "torch-native"}
    assert all(d["n_ref"] > 0 for d in clean.detections.values())


@pytest.mark.isa_independent(DEFECT_BOUND)
@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_ground_truth_recovered(reduced):
    _, _, _, faulty, _ = reduced
    assert len(faulty) == len(KINDS) * len(STAGES)
    for r in faulty:
        tag = f"{r.kind}@{r.stage} m={r.magnitude:g}"
        assert not r.skipped, f"{tag}: {r.skipped}"
        assert r.truth["stage"] == r.stage and r.truth["kind"] == r.kind
        assert r.flagged, f"{tag}: faulty backend not flagged (profile {r.profile})"
        assert r.origin_stage == r.stage, f"{tag}: origin stage {r.origin_stage} ({r.origin_anchor})"
        assert r.clean_flagged == [], f"{tag}: clean backends flagged {r.clean_flagged}"
        # the true effect: nothing upstream of the injection stage changed, the injection stage did
        stages = [a["stage"] for a in reduced[1].anchors]
        upstream = [v for v, s in zip(r.true_profile, stages) if s < r.stage]
        assert all(v == 0.0 for v in upstream), f"{tag}: upstream anchors changed {upstream}"
        assert r.injected_nrmse > 1e-4


@pytest.mark.isa_independent(SAME_DATA)
@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_threshold_baseline_is_consistent_with_its_critical_tolerance(reduced):
    _, clean, _, faulty, _ = reduced
    for r in faulty:
        assert set(r.threshold) == {f"{t:g}" for t in ev.TOLERANCES}
        for t in ev.TOLERANCES:  # flagged at t  <=>  some element has min(|x-r|, |x-r|/|r|) > t
            assert r.threshold[f"{t:g}"] == (r.critical_tolerance > t)
    for b, flags in clean.threshold.items():
        crit = clean.threshold_max[b]["critical_tolerance"]
        assert all(flags[f"{t:g}"] == (crit > t) for t in ev.TOLERANCES)


@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_configuration_reuses_clean_tensors(reduced):
    setup, _, _, faulty, work = reduced
    from anpred.run import RunStore

    run = work / "configs" / "round-s1-m8" / "run"
    store = RunStore.open(run)
    clean = RunStore.open(setup.clean_dir)
    for b in setup.backends:
        assert os.path.islink(store.backend_dir(b))
        assert os.path.realpath(store.backend_dir(b)) == os.path.realpath(clean.backend_dir(b))
        assert store.meta["backends"][b] == clean.meta["backends"][b]
    assert store.statuses()[ev.FAULT_LABEL].family == ev.FAULT_FAMILY
    # the other configurations' folders were removed after judging
    assert sorted(p.name for p in (work / "configs").iterdir()) == ["round-s1-m8"]


@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_summary_and_bars(reduced):
    setup, clean, null, faulty, _ = reduced
    s = ev.summarize([null, *faulty], {"yolov8n": clean})["yolov8n"]
    assert s["detection"]["anpred"]["all"]["all"]["rate"] == 1.0
    # 6 clean fp32 verdicts in the clean run + 6 clean and the fault slot in the null configuration
    assert s["false_alarm"]["anpred"]["clean_configs"] == {"n": 6 + 7, "k": 0, "rate": 0.0}
    assert s["localization"]["top1"]["rate"] == 1.0
    b = ev.bars(s)
    assert b["false_alarm"]["met"] and b["localization"]["met"] and b["detection"]["met"]


@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_bad_requests(reduced):
    setup = reduced[0]
    with pytest.raises(ev.EvaluationError, match="unknown fault kind"):
        ev.configurations(setup, ["cosmic-ray"])
    with pytest.raises(ev.EvaluationError, match="no stage"):
        ev.configurations(setup, ["round"], stages=[99])
    with pytest.raises(ev.EvaluationError, match="at least one sample"):
        ev.prepare_model("yolov8n", reduced[4] / "never", n_real=0, n_random=0)
    assert not (reduced[4] / "never").exists()


def test_bad_stage_rejected_before_any_clean_run(tmp_path, yolov8n_onnx):
    work = tmp_path / "w"
    with pytest.raises(ev.EvaluationError, match=r"no stage \[99\]; stages are \[0, 1"):
        ev.prepare_model("yolov8n", work, imgsz=320, n_real=1, n_random=0, stages=[99])
    assert not work.exists()  # nothing written, no backend ran


@pytest.mark.parametrize(
    "kind,m,ok",
    [
        ("round", 40, False),
        ("round", 8.5, False),
        ("round", 11, True),
        ("approx-sigmoid", 5, False),
        ("approx-sigmoid", 0, False),
        ("approx-sigmoid", 1e-4, True),
        ("norm-epsilon", 0, False),
        ("norm-epsilon", 1, False),
        ("norm-epsilon", 1000, True),
        ("weight-ulp", 0, False),
        ("weight-ulp", 2.5, False),
        ("weight-ulp", 256, True),
        ("rounding-mode", 3, False),
        ("padding-same", 1, True),
        ("round", float("nan"), False),
    ],
)
def test_magnitude_ranges(kind, m, ok):
    assert (ev.magnitude_problem(kind, m) is None) == ok


def test_invalid_magnitudes_one_message():
    with pytest.raises(ev.EvaluationError) as e:
        ev.validate_magnitudes({"round": (40, 11), "approx-sigmoid": (5,), "weight-ulp": ()})
    msg = str(e.value)
    assert "round=40" in msg and "approx-sigmoid=5" in msg and "weight-ulp: no magnitude" in msg
    assert "round=11" not in msg
    ev.validate_magnitudes(ev.DEFAULT_MAGNITUDES)  # the defaults are valid


def test_no_bar_is_met_on_nothing():
    s = ev.summarize([], {})["all"]
    assert s["configs"] == 0
    b = ev.bars(s)
    assert not b["detection"]["met"] and not b["false_alarm"]["met"] and not b["localization"]["met"]


def _oracle_eval_module():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "oracle_eval", Path(__file__).resolve().parent.parent / "benchmarks" / "oracle_eval.py"
    )
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


@pytest.mark.slow  # the reduced evaluation (clean YOLOv8n run on 9 backends + fault configurations)
def test_outputs_tables_and_plots_are_written(reduced, tmp_path):
    """The command's last step on the reduced evaluation's results: results.json, summary.md and every
    plot (a regression: a stray ``del`` of a removed variable crashed the plots after a 10-minute run)."""
    import argparse
    import json

    cli = _oracle_eval_module()
    setup, clean, null, faulty, _ = reduced
    args = argparse.Namespace(models="yolov8n", imgsz=320, seed=0)
    payload = cli.write_outputs(
        args,
        tmp_path,
        [null, *faulty],
        {"yolov8n": clean},
        {"yolov8n": setup},
        {"yolov8n": {"configs": 1 + len(faulty)}},
        0.0,
        plots_=True,
    )
    got = json.loads((tmp_path / "results.json").read_text())
    # faulty ones
    assert got["summary"]["yolov8n"]["configs"] == payload["summary"]["yolov8n"]["configs"] == len(faulty)
    assert "yolov8n" in (tmp_path / "summary.md").read_text()
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    # (no per-model detection-vs-magnitude plot: one magnitude per kind here)
    assert pngs == ["eval_detection_vs_size.png", "eval_propagation_yolov8n.png"], pngs
    assert all((tmp_path / p).stat().st_size > 5000 for p in pngs)


def test_cli_rejects_bad_requests_before_running(tmp_path, capsys):
    cli = _oracle_eval_module()
    out = tmp_path / "o"
    assert cli.main(["--out", str(out), "--models", "yolov8n", "--magnitudes", "round=40;approx-sigmoid=5"]) == 2
    err = capsys.readouterr().err
    assert "round=40" in err and "approx-sigmoid=5" in err and not out.exists()
    f = tmp_path / "file"
    f.write_text("x")
    assert cli.main(["--out", str(f), "--models", "yolov8n"]) == 2
    assert "not a folder" in capsys.readouterr().err and f.read_text() == "x"
    # round is listed from the smallest fault (most bits) to the largest, others ascending
    assert cli.mag_order("round", ["8", "16", "11"]) == ["16", "11", "8"]
    assert cli.mag_order("weight-ulp", ["4096", "16", "256"]) == ["16", "256", "4096"]


# -- the fault pass on the kinds the YOLOs cannot show: norm-epsilon (BatchNorm kept) and Round ------
def _assert_differs_exactly_from(model, manifest, variant, truth, feeds):
    clean = ort_anchors(model, manifest, feeds, threads=1)
    faulty = ort_anchors(variant, manifest, feeds, threads=1)
    diff = {a.name: float(np.abs(faulty[a.name].astype(np.float64) - clean[a.name]).max()) for a in manifest.anchors}
    stage = {a.name: a.stage for a in manifest.anchors}
    up = {k: d for k, d in diff.items() if stage[k] < truth.stage}
    down = {k: d for k, d in diff.items() if stage[k] >= truth.stage}
    assert all(d == 0.0 for d in up.values()), f"{truth.kind}@{truth.stage}: upstream changed {up}"
    assert down and max(down.values()) > 0, f"{truth.kind}@{truth.stage}: nothing downstream changed {down}"
    outs = [a.name for a in manifest.anchors if a.kind == "output"]
    assert any(diff[o] > 0 for o in outs), f"{truth.kind}@{truth.stage}: outputs unchanged"
    return up, down


@pytest.mark.isa_independent(SAME_RUNTIME)
@pytest.mark.parametrize("name", ["ppocr-det", "ppocr-rec"])
def test_norm_epsilon_differs_exactly_from_injection_stage(name):
    """PP-OCR keeps BatchNormalization nodes (the YOLOs fuse theirs): epsilon x1000 at the first stage
    holding one changes nothing upstream and something from that stage on (ONNX Runtime)."""
    import onnx

    import models
    from anpred.instrument import instrument_model
    from passes.faults import applicable_nodes, inject_fault

    zm = models.get(name)
    model, man = instrument_model(onnx.load(str(zm.onnx_path())))
    cand = set(applicable_nodes(model, "norm-epsilon"))
    assert cand, f"{name}: no BatchNormalization left"
    variant = truth = None
    for st in sorted({a.stage for a in man.anchors if a.stage > 0}):
        try:
            variant, truth = inject_fault(model, "norm-epsilon", stage=st, magnitude=1000.0, manifest=man)
            break
        except ev.AnpredError:
            continue
    assert truth is not None and truth.node in cand and truth.stage > 0
    x = zm.real_inputs(1)[0]
    _assert_differs_exactly_from(model, man, variant, truth, {model.graph.input[0].name: x})


@pytest.mark.isa_independent(SAME_RUNTIME)
def test_round_op_rounding_mode_differs_exactly_from_injection_stage():
    """No zoo model has a ``Round`` node, so a small conv net with one (quantise-like ``Round(2 x)``
    between convolutions) is built with onnx.helper; its inputs are multiples of 0.25 so that ``2 x``
    hits exact ties, where half-to-even (ONNX ``Round``) and half-away-from-zero differ."""
    import onnx
    import onnx.helper as h
    from onnx import TensorProto, numpy_helper

    from anpred.instrument import instrument_model
    from passes.faults import inject_fault

    rng = np.random.default_rng(0)
    inits, nodes, prev = [numpy_helper.from_array(np.array(2.0, np.float32), "two")], [], "x"
    for i in range(12):
        cin = 1 if i == 0 else 4
        if i < 6:  # integer weights in {-1, 0, 1}: the values stay exact multiples of 0.25
            w = rng.integers(-1, 2, (4, cin, 3, 3)).astype(np.float32)
        else:
            w = rng.normal(0, 0.3, (4, cin, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        if i == 6:
            nodes += [
                h.make_node("Mul", [prev, "two"], ["m3"], name="mul3"),
                h.make_node("Round", ["m3"], ["q3"], name="round3"),
            ]
            prev = "q3"
        nodes += [
            h.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            h.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"act{i}"),
        ]
        prev = f"r{i}"
    g = h.make_graph(
        nodes,
        "roundnet",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16, 16])],
        [h.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4, 16, 16])],
        inits,
    )
    proto = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    onnx.checker.check_model(proto)
    model, man = instrument_model(proto, stages=3, max_cut_width=1)
    variant, truth = inject_fault(model, "rounding-mode", node="round3", manifest=man)
    # (truth.op_type records the node after injection: "Identity" for a replaced Round, passes/faults.py)
    assert truth.node == "round3" and truth.stage is not None
    assert len({a.stage for a in man.anchors}) >= 3
    x = (rng.integers(-8, 9, (1, 1, 16, 16)) / 4).astype(np.float32)  # 2x: ties at every odd quarter
    up, down = _assert_differs_exactly_from(model, man, variant, truth, {"x": x})
    assert truth.stage > 0 and up, (
        "the Round node should not sit in the first stage (nothing upstream tested): "
        f"{man.stages} {[(a.name, a.stage) for a in man.anchors]}"
    )
