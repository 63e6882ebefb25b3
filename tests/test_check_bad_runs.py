"""anpred check on runs that cannot be judged plainly: bad input, an all-NaN anchor, a missing anchor,
missing samples, a shape mismatch, unreadable run data, a bad config and an internal error; each is
reported (exit 2 or 3), never judged as a defect. The runs are real (tests/check_runs.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from anpred.judge import check_run
from anpred.errors import AnpredError
from anpred.run import RunStore

from check_runs import copy_run


# ---- bad input -------------------------------------------------------------------------------------
def test_bad_input_is_reported_not_judged(tmp_path, softplus_run, capsys):
    from anpred.backends.base import BackendStatus
    from anpred.cli import main

    run, man = softplus_run
    # a run with a single usable backend
    s = RunStore.create(tmp_path / "one", man)
    s.add_sample("s0000", {"x": np.zeros((1, 3, 16, 16), np.float32)})
    s.write_anchors("ort", "s0000", RunStore.open(run).read_anchors("ort", "s0000"))
    s.set_status(BackendStatus(name="ort", family="onnxruntime", status="ok"))
    s.set_status(BackendStatus(name="openvino", family="openvino", status="failed", reason="compile error"))
    rep = check_run(tmp_path / "one")
    assert rep.status == "error" and not rep and "fewer than two usable backends" in rep.problems[0]
    assert "openvino: run status failed: compile error" in rep.problems[0]
    assert main(["check", str(tmp_path / "one"), "--json", str(tmp_path / "one.json")]) == 2
    assert "cannot be judged" in capsys.readouterr().err
    assert json.loads((tmp_path / "one.json").read_text())["status"] == "error"
    # not a run folder
    with pytest.raises(AnpredError, match="not a run folder"):
        check_run(tmp_path)
    # mismatched manifest: tensors keyed by anchors of another model
    s2 = RunStore.create(tmp_path / "mism", man)
    s2.add_sample("s0000", {"x": np.zeros((1, 3, 16, 16), np.float32)})
    for b in ("ort", "openvino", "onnx-reference"):
        anchors = RunStore.open(run).read_anchors(b, "s0000")
        if b == "openvino":
            anchors = {k.replace("anchor/", "anchor/9"): v for k, v in anchors.items() if k.startswith("anchor/")}
        s2.write_anchors(b, "s0000", anchors)
        s2.set_status(BackendStatus(name=b, family=b, status="ok"))
    rep2 = check_run(tmp_path / "mism")
    assert "mismatched manifests" in rep2.unjudged_backends["openvino"]
    assert rep2.status != "error" and "openvino" not in rep2.verdicts


def test_all_nan_anchor_agreed_on_and_a_tie_is_not(tmp_path, softplus_run):
    """Every voting family returns NaN at anchor t1: they agree (issue 17: non-finite values are voted
    on), so nothing is flagged there and a note says no finite value was compared. Two NaN families
    against two finite ones is a tie at every element: that anchor cannot be judged (incomplete)."""
    from anpred.backends.base import BackendStatus

    run, man = softplus_run
    t1 = next(a.name for a in man.anchors if a.value == "t1")
    src = RunStore.open(run)
    s = RunStore.create(tmp_path / "nan", man)
    s.add_sample("s0000", {"x": np.zeros((1, 3, 16, 16), np.float32)})
    for b in ("ort", "onnx-reference", "torch"):
        anchors = src.read_anchors(b, "s0000")
        anchors[t1] = np.full_like(anchors[t1], np.nan)
        s.write_anchors(b, "s0000", anchors)
        s.set_status(BackendStatus(name=b, family=b, status="ok"))
    rep = check_run(tmp_path / "nan")
    assert rep.status == "consistent" and t1 not in rep.unjudged_anchors
    assert any(f"anchor {t1}: the voting families agreed on NaN/Inf" in n for n in rep.notes)
    tie = RunStore.create(tmp_path / "tie", man)
    tie.add_sample("s0000", {"x": np.zeros((1, 3, 16, 16), np.float32)})
    for b in ("ort", "onnx-reference", "torch", "openvino"):
        anchors = src.read_anchors(b, "s0000")
        if b in ("ort", "onnx-reference"):
            anchors[t1] = np.full_like(anchors[t1], np.nan)
        tie.write_anchors(b, "s0000", anchors)
        tie.set_status(BackendStatus(name=b, family=b, status="ok"))
    rep2 = check_run(tmp_path / "tie")
    assert t1 in rep2.unjudged_anchors
    assert "tie between NaN/Inf and finite values at every element" in rep2.unjudged_anchors[t1]
    # openvino's real Softplus defect downstream is still found; t1 itself is judged for no one
    assert rep2.flagged_backends == ["openvino"] and all(t1 in v.unjudged for v in rep2.verdicts.values())


def test_missing_anchor_is_incomplete_not_consistent(tmp_path, softplus_run, capsys):
    """Regression (review): with OpenVINO's Softplus anchor deleted from its tensors the real defect
    vanished and the check said CONSISTENT, exit 0, the gap visible only in the JSON."""
    from anpred.cli import main

    run, man = softplus_run
    sp = next(a for a in man.anchors if a.op_type == "Softplus").name
    run2 = copy_run(run, tmp_path / "run")
    store = RunStore.open(run2)
    for sid in store.sample_ids:
        t = store.read_anchors("openvino", sid)
        del t[sp]
        store.write_anchors("openvino", sid, t)
    # the defect's footprint downstream (nRMSE ~8e-6 where the peers agree to ~6e-10) is a run of
    # departures along the data flow: flagged there by the sustained rule, the gap still listed
    rep = check_run(run2)
    v = rep.verdicts["openvino"]
    assert v.flagged and v.status == "flagged" and rep.exit_code == 1
    assert v.origin_anchor == v.flagged_anchors[0] and all(a not in v.flagged_anchors for a in (sp,))
    assert all(rep.cell(a, "openvino").reason.startswith("sustained departure") for a in v.flagged_anchors)
    assert v.unjudged == {sp: "anchor missing in this backend's output"}
    assert rep.incomplete == [f"openvino: {sp} not judged: anchor missing in this backend's output"]
    # the original regression, with only the per-anchor rule: incomplete, never consistent
    cfg = tmp_path / "single.json"
    cfg.write_text('{"sustained_anchors": 0}')
    rep = check_run(run2, config=str(cfg))
    v = rep.verdicts["openvino"]
    assert not v.flagged and v.status == "incomplete" and rep.status == "incomplete" and rep.exit_code == 1
    assert v.unjudged == {sp: "anchor missing in this backend's output"}
    assert rep.incomplete == [f"openvino: {sp} not judged: anchor missing in this backend's output"]
    html = tmp_path / "r.html"
    assert main(["check", str(run2), "--report", str(html), "--config", str(cfg)]) == 1
    out, err = capsys.readouterr()
    assert "-> INCOMPLETE" in out and "NOT JUDGED (1)" in out and f"openvino: {sp} not judged" in out
    assert next(ln for ln in out.splitlines() if ln.startswith("openvino ")).split()[3] == "INCOMPLETE"
    assert "INCOMPLETE" in err
    text = html.read_text()
    assert "Not judged (1)" in text and f"openvino: {sp} not judged" in text and "INCOMPLETE" in text
    assert main(["check", str(run2), "-q", "--allow-incomplete", "--config", str(cfg)]) == 0


def test_missing_samples_are_reported(tmp_path, clean_run, capsys):
    """Regression (review): a backend judged on fewer samples than the run has was silently consistent."""
    from anpred.cli import main

    run, man = clean_run
    run2 = copy_run(run, tmp_path / "run")
    for sid in ("s0004", "s0005"):
        (run2 / "tensors" / "openvino" / f"{sid}.safetensors").unlink()
    rep = check_run(run2)
    v = rep.verdicts["openvino"]
    assert rep.status == "incomplete" and v.status == "incomplete" and v.samples == 10 and not v.unjudged
    assert len(v.partial) == len(man.anchors)
    assert set(v.partial.values()) == {
        "judged on 10 of 12 samples; no tensors stored for this sample (in 2 of 12 samples: s0004, s0005)"
    }
    assert main(["check", str(run2)]) == 1
    out = capsys.readouterr().out
    assert "judged on 10 of 12 samples" in out and f"{len(man.anchors)}/{len(man.anchors)}~" in out


def test_shape_mismatch_says_so(tmp_path, clean_run):
    """Regression (review): an anchor three backends stored with the wrong shape was reported as
    'fewer than two backends produced it (none)'; since issue 33 it is a flagged deviation, named."""
    run, man = clean_run
    run2 = copy_run(run, tmp_path / "run")
    store = RunStore.open(run2)
    name = man.anchors[1].name
    for b in ("ort", "openvino", "onnx-reference"):
        for sid in store.sample_ids:
            t = store.read_anchors(b, sid)
            t[name] = t[name][..., :-1]  # one column short: no alignment rule can fix it
            store.write_anchors(b, sid, t)
    rep = check_run(run2)
    # issue 33 (class 4): the anchor's ONNX shape is known and torch and tf agree on it; the three
    # runtimes of the ONNX graph returned another shape: a finding about each, flagged there, named
    for b in ("ort", "openvino", "onnx-reference"):
        c = rep.cell(name, b)
        assert c.flagged and c.deviation == "shape" and "(none)" not in c.reason, c.reason
        assert c.reason.startswith(f"wrong shape: {b} executes the ONNX graph in its layout and returned shape"), (
            c.reason
        )
    assert rep.status == "flagged" and set(rep.flagged_backends) == {"ort", "openvino", "onnx-reference"}


@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_unreadable_run_data_and_bad_config_exit_2(tmp_path, clean_run, capsys, ext):
    """Regression (review): a truncated tensor .npz gave a BadZipFile traceback and exit 1 ("flagged");
    config {"min_voters": "abc"} a ValueError traceback and exit 1. Both storage formats: safetensors
    (written since the direct-I/O writer) and .npz (runs of earlier versions, and dtypes safetensors
    lacks)."""
    from anpred.cli import main
    from anpred.errors import JudgeError
    from anpred.naming import file_key

    run, _ = clean_run
    run2 = copy_run(run, tmp_path / "run")
    store = RunStore.open(run2)
    if ext == ".npz":  # the same sample as an earlier version stored it
        t = store.read_anchors("torch", "s0003")
        (run2 / "tensors" / "torch" / "s0003.safetensors").unlink()
        np.savez(run2 / "tensors" / "torch" / "s0003.npz", **{file_key(k): v for k, v in t.items()})
        assert {k: v.tolist() for k, v in store.read_anchors("torch", "s0003").items()} == {
            k: v.tolist() for k, v in t.items()
        }
        assert check_run(run2).status == check_run(run).status
    f = run2 / "tensors" / "torch" / f"s0003{ext}"
    f.write_bytes(f.read_bytes()[:200])
    with pytest.raises(JudgeError, match=f"s0003{ext}: unreadable tensor file"):
        check_run(run2)
    assert main(["check", str(run2)]) == 2
    err = capsys.readouterr().err
    kind = "BadZipFile" if ext == ".npz" else "ValueError"
    assert len(err.strip().splitlines()) == 1 and f"unreadable tensor file ({kind}" in err
    for bad in (
        '{"min_voters": "abc"}',
        '{"threshold_atol": "x"}',
        '{"propagation_band": 0}',
        '{"floor": {"fp32": true}}',
    ):
        cfg = tmp_path / "c.json"
        cfg.write_text(bad)
        assert main(["check", str(run), "--config", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("anpred: error: oracle config ") and len(err.strip().splitlines()) == 1


def test_internal_error_exits_3_not_1(capsys, monkeypatch):
    """An unexpected exception is a bug: one line, exit 3 (1 means "flagged"); the traceback with
    ANPRED_DEBUG=1."""
    from anpred.cli import _dispatch

    def boom(args):
        return {}["missing"]

    monkeypatch.delenv("ANPRED_DEBUG", raising=False)
    assert _dispatch(boom, None) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err and "ANPRED_DEBUG=1" in err
    monkeypatch.setenv("ANPRED_DEBUG", "1")
    assert _dispatch(boom, None) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err
