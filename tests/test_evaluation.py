"""A reduced reference evaluation (issue 7): YOLOv8n at 320 px, the clean backends ort, openvino, torch,
tf and onnx-reference run once on one real and one random input; two fault kinds x two stages run
only the faulty variant (ONNX Runtime, its own family) judged with the clean backends' linked tensors.
The ground truth must be recovered: the faulty backend flagged, its origin stage the injected stage,
no clean backend flagged (and nothing flagged in the clean and null configurations)."""

from __future__ import annotations

import os

import pytest

from anpred import evaluation as ev

KINDS = (("round", 8.0), ("approx-sigmoid", 1.0))  # bfloat16 rounding; the fast sigmoid in place of Sigmoid
STAGES = (1, 3)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory, yolov8n_onnx):
    work = tmp_path_factory.mktemp("evaluation")
    setup = ev.prepare_model("yolov8n", work, imgsz=320, n_real=1, n_random=1, lowp=())
    clean = ev.clean_summary(setup)
    null = ev.run_configuration(setup, clean, None, None, None, work / "configs")
    faulty = [ev.run_configuration(setup, clean, k, s, m, work / "configs", keep=(k, s) == ("round", 1))
              for k, m in KINDS for s in STAGES]
    return setup, clean, null, faulty, work


def test_clean_backends_ran_and_are_not_flagged(reduced):
    setup, clean, null, _, _ = reduced
    assert setup.backends == list(ev.CLEAN_BACKENDS)
    assert sorted(setup.samples.values()) == ["random", "real"]
    assert clean.flagged == []
    assert null.truth is None and not null.flagged and null.clean_flagged == []
    # the null configuration's fault slot is ONNX Runtime on the clean model: bit-identical to clean ort
    assert null.output_nrmse == 0.0
    # every clean fp32 backend's detections are compared with the clean consensus
    assert set(clean.detections) == set(ev.CLEAN_BACKENDS)
    assert all(d["n_ref"] > 0 for d in clean.detections.values())


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


def test_threshold_baseline_is_consistent_with_its_critical_tolerance(reduced):
    _, clean, _, faulty, _ = reduced
    for r in faulty:
        assert set(r.threshold) == {f"{t:g}" for t in ev.TOLERANCES}
        for t in ev.TOLERANCES:  # flagged at t  <=>  some element has min(|x-r|, |x-r|/|r|) > t
            assert r.threshold[f"{t:g}"] == (r.critical_tolerance > t)
    for b, flags in clean.threshold.items():
        crit = clean.threshold_max[b]["critical_tolerance"]
        assert all(flags[f"{t:g}"] == (crit > t) for t in ev.TOLERANCES)


def test_configuration_reuses_clean_tensors(reduced):
    setup, _, _, faulty, work = reduced
    from anpred.runstore import RunStore

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


def test_summary_and_bars(reduced):
    setup, clean, null, faulty, _ = reduced
    s = ev.summarize([null, *faulty], {"yolov8n": clean})["yolov8n"]
    assert s["detection"]["anpred"]["all"]["all"]["rate"] == 1.0
    assert s["false_alarm"]["anpred"]["clean_configs"] == {"n": 5 + 6, "k": 0, "rate": 0.0}
    assert s["localization"]["top1"]["rate"] == 1.0
    b = ev.bars(s)
    assert b["false_alarm"]["met"] and b["localization"]["met"] and b["detection"]["met"]


def test_bad_requests(reduced):
    setup = reduced[0]
    with pytest.raises(ev.EvaluationError, match="unknown fault kind"):
        ev.configurations(setup, ["cosmic-ray"])
    with pytest.raises(ev.EvaluationError, match="no stage"):
        ev.configurations(setup, ["round"], stages=[99])
    with pytest.raises(ev.EvaluationError, match="at least one sample"):
        ev.prepare_model("yolov8n", reduced[4] / "never", n_real=0, n_random=0)
    assert not (reduced[4] / "never").exists()
