"""Task-level cost (issue 20) of streamed runs: a streamed dataset, sampled positions, an interrupted
stream resumed, checkpoints, injected hooks and backends side by side, each against the run in one piece.

Real parts: a small CNN trained here on the handwritten digits bundled with scikit-learn
(tests/task_digits.py), exported to ONNX and run on fp32 and int8 backends with its labels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import anpred

from isa_reasons import SAME_DATA
import stream_faults
from task_digits import FP32, N_TEST, nice_allowed


@pytest.mark.isa_independent(SAME_DATA)
def test_streamed_dataset_matches_the_run_in_one_piece(digits, tmp_path, monkeypatch):
    """``--stream``: the 60 digits in chunks of 25 (the last one of 10), judged as they come: the same statistics at
    every (anchor, backend) as the same backends in one piece (int8 calibrated on the same first 32 samples),
    the same task metrics and input-set identity, and only the most deviating samples kept."""
    from anpred.run import RunStore

    model, inp, labels, eager, root = digits
    kw = dict(
        backends=FP32[:3] + ["ort-int8"], inputs=str(inp), task="classify", labels=str(labels), quiet=True, stages=3
    )
    whole = anpred.test(str(model), out=tmp_path / "w", **kw).report
    monkeypatch.setenv("ANPRED_STREAM_SCRATCH", "disk")  # the chunks beside -o (the other test: in memory)
    res = anpred.test(str(model), out=tmp_path / "s", stream=True, chunk=25, keep=2, **kw)
    rep = res.report
    assert rep.samples == N_TEST == whole.samples and rep.status == whole.status == "consistent"
    assert rep.inputs["sha256"] == whole.inputs["sha256"]  # one dataset identity for the history
    assert len(rep.cells) == len(whole.cells)
    for c in rep.cells:
        w = whole.cell(c.anchor, c.backend)
        assert c.samples == N_TEST and c.primary == pytest.approx(w.primary, rel=1e-9, abs=1e-15), (c.anchor, c.backend)
    for b in kw["backends"]:
        assert rep.task["backends"][b]["metrics"] == pytest.approx(whole.task["backends"][b]["metrics"])
        assert rep.task["backends"][b]["truth"]["top1"] == pytest.approx(whole.task["backends"][b]["truth"]["top1"])
    assert rep.task["backends"]["ort"]["truth"]["top1"] == pytest.approx(eager, abs=1e-12)
    kept = RunStore.open(res.run_dir)
    assert 1 <= len(kept.sample_ids) <= 2 * 4 and kept.meta["stream"]["samples"] == N_TEST
    assert not (res.out / ".stream").exists() and kept.statuses()["ort"].samples == N_TEST
    assert "streamed: 60 samples judged in chunks of 25" in rep.notes[-1]
    # no position sampled (the digits' anchors are under the default K): nothing waits for the first
    # chunk's judge, every chunk is judged at JUDGE_NICE more than the caller's nice value
    from anpred.pipeline.stream import JUDGE_NICE

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if nice_allowed():  # (thread priorities: Linux, where the system lets a thread lower its own)
        assert kept.meta["stream"]["judge_nice"] == [min(19, base + JUDGE_NICE)] * 3
    assert kept.meta["stream"]["scratch"] == "disk"
    assert kept.meta["stream"]["threads"] == {}  # one after the other: each library's default threads


@pytest.mark.isa_independent(SAME_DATA)
def test_streamed_sampled_positions_equal_the_whole_run_at_those_positions(digits, tmp_path, monkeypatch):
    """``positions=200``: the digits' intermediate anchors (1024 and 512 values per sample) are judged on 200
    sampled positions; from the second chunk on, each backend's worker stores only those values. Every
    statistic equals the one-piece run's full tensors judged at the same positions, so the workers' gather
    (mapped through each backend's alignment rule) is exact; the outputs are judged in full; the kept
    samples are stored in full again (re-run at the end)."""
    from anpred.judge.check import finish, usable_backends
    from anpred.judge.samples import SampleJudge
    from anpred.run import RunStore
    from anpred.run.positions import GATHERED_SUFFIX
    from anpred.tensorfile import array_file_keys

    model, inp, labels, eager, root = digits
    kw = dict(
        backends=FP32[:3] + ["ort-int8"], inputs=str(inp), task="classify", labels=str(labels), quiet=True, stages=3
    )
    whole = anpred.test(str(model), out=tmp_path / "w", **kw)
    # the chunks in a folder of their own (ANPRED_STREAM_SCRATCH): on this machine's tmpfs where there is
    # one (the kept samples then copied out of it onto the run folder's file system), the folder
    # removed at the end
    from anpred.pipeline.scratch import memory_backed

    shm = Path("/dev/shm")
    root = (
        shm / f"anpred-test-{os.getpid()}"
        if shm.is_dir() and os.access(shm, os.W_OK) and memory_backed(shm)
        else tmp_path / "scratch"
    )
    monkeypatch.setenv("ANPRED_STREAM_SCRATCH", str(root))
    try:
        res = anpred.test(str(model), out=tmp_path / "s", stream=True, chunk=25, keep=2, positions=200, **kw)
        assert root.is_dir() and not any(root.iterdir())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert RunStore.open(res.run_dir).meta["stream"]["scratch"] == ("memory" if memory_backed(root.parent) else "disk")
    run = usable_backends(whole.run_dir, oracle="consensus", config=None, allow_incomplete=False)
    judge = SampleJudge(run, positions=200)
    judge.add_store(run.store)
    at_positions = finish(run, judge.judged())
    rep = res.report
    assert rep.samples == N_TEST and rep.status == "consistent"
    sampled = {
        a.name
        for a in RunStore.open(whole.run_dir).manifest.anchors
        if a.kind != "output" and a.shape and int(np.prod(a.shape)) > 200
    }
    assert len(sampled) >= 2
    for c in rep.cells:
        w = at_positions.cell(c.anchor, c.backend)
        assert c.primary == pytest.approx(w.primary, rel=1e-9, abs=1e-15), (c.anchor, c.backend)
        if c.anchor in sampled:  # judged on 200 values per sample, not on the whole tensor
            assert c.stats.n == 200 * N_TEST, (c.anchor, c.backend, c.stats.n)
        else:
            assert c.primary == pytest.approx(whole.report.cell(c.anchor, c.backend).primary, rel=1e-9, abs=1e-15)
    assert rep.task["backends"]["ort"]["truth"]["top1"] == pytest.approx(eager, abs=1e-12)
    kept = RunStore.open(res.run_dir)
    assert kept.meta["stream"]["positions"] == 200 and kept.meta["stream"]["seconds_refill"] > 0
    # the runner waits for the first chunk's judge (the gathered positions): that one is judged at the
    # caller's nice value, the later ones (beside the backends' runs) at JUDGE_NICE more
    from anpred.pipeline.stream import JUDGE_NICE

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if nice_allowed():  # (thread priorities: Linux, where the system lets a thread lower its own)
        assert kept.meta["stream"]["judge_nice"] == [base, min(19, base + JUDGE_NICE)]  # 25, then 35 samples
    for sid in kept.sample_ids:
        for b in kw["backends"]:
            keys = array_file_keys(kept.anchor_file(b, sid))
            assert not any(k.endswith(GATHERED_SUFFIX) for k in keys) and sampled <= set(keys)


@pytest.mark.slow  # ~17 s (a stream interrupted, its resume refused three ways, then completed)
@pytest.mark.isa_independent(SAME_DATA)
def test_interrupted_stream_resumes_to_the_uninterrupted_report(digits, tmp_path):
    """Ctrl-C after the second of six chunks: the checkpoint stays beside -o; ``--resume`` skips the samples
    judged before and ends with the uninterrupted run's statistics, task metrics and input identity. A
    resume of another run (other backends) is refused naming what differs."""
    import signal

    model, inp, labels, eager, root = digits
    inp = Path(shutil.copytree(inp, tmp_path / "inputs"))
    backends = "ort,openvino,torch,ort-int8"
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "anpred",
        "test",
        str(model),
        "--inputs",
        str(inp),
        "--task",
        "classify",
        "--labels",
        str(labels),
        "--stream",
        "--chunk",
        "10",
        "--stages",
        "3",
        "--backends",
        backends,
        "-o",
        str(out),
    ]
    whole = anpred.test(
        str(model),
        out=tmp_path / "whole",
        backends=backends.split(","),
        inputs=str(inp),
        task="classify",
        labels=str(labels),
        quiet=True,
        stages=3,
        stream=True,
        chunk=10,
    ).report
    # a real SIGINT to the process' main thread once 20 samples are judged and checkpointed (the stream's
    # testing hook sends it, injected by tests/stream_faults.py: the test reading the progress line and
    # signalling then came too late under load, the whole run done by then)
    # (SIG_DFL in the child: a job started in the background, like a CI step under nohup, inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: the Ctrl-C would be ignored)
    proc = subprocess.run(
        stream_faults.command("sigint-after=20") + cmd[3:],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "ANPRED_STREAM_SCRATCH": str(tmp_path / "scratch")},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    rest = proc.stderr
    assert proc.returncode == 130, rest[-2000:]
    ck = tmp_path / ".out.stream"
    assert (ck / "state.pkl").is_file() and not out.exists() and "--resume" in rest
    # the chunks' folder (ANPRED_STREAM_SCRATCH) removed on the way out
    assert (tmp_path / "scratch").is_dir() and not any((tmp_path / "scratch").iterdir())
    other = subprocess.run(
        [a if a != backends else "ort,openvino,torch" for a in cmd] + ["--resume"], capture_output=True, text=True
    )
    assert other.returncode == 2 and "made for another run: backends" in other.stderr, other.stderr[-2000:]
    gone = sorted(inp.iterdir())[3]  # a sample judged before the interruption, removed since
    gone.rename(tmp_path / gone.name)
    moved = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert moved.returncode == 2 and "inputs changed since the checkpoint: sample s000003" in moved.stderr, (
        moved.stderr[-2000:]
    )
    (tmp_path / gone.name).rename(gone)
    a, b = sorted(inp.iterdir())[5], sorted(inp.iterdir())[6]  # same names, another sample's contents
    saved = a.read_bytes()
    a.write_bytes(b.read_bytes())
    changed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert changed.returncode == 2 and "sample s000005" in changed.stderr and "other contents" in changed.stderr, (
        changed.stderr[-2000:]
    )
    a.write_bytes(saved)
    res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = [ln for ln in res.stderr.splitlines() if ln.startswith("stream: resuming after")]
    n = int(resumed[0].split()[3])
    assert 20 <= n < 60, resumed  # what was judged before the interruption is not run again
    first = next(ln for ln in res.stderr.splitlines() if ln.startswith("stream: ") and "judged (" in ln)
    assert first.startswith(f"stream: {n + 10} samples judged"), first
    rep = json.loads((out / "report.json").read_text())
    assert rep["samples"] == N_TEST and rep["status"] == whole.status == "consistent"
    assert rep["inputs"]["sha256"] == whole.inputs["sha256"]
    for c in rep["cells"]:
        w = whole.cell(c["anchor"], c["backend"])
        assert c["primary"] == pytest.approx(w.primary, rel=1e-9, abs=1e-15), (c["anchor"], c["backend"])
    for b in backends.split(","):
        assert rep["task"]["backends"][b]["metrics"] == pytest.approx(whole.task["backends"][b]["metrics"])
    assert rep["task"]["backends"]["ort"]["truth"]["top1"] == pytest.approx(eager, abs=1e-12)
    assert not ck.exists()


@pytest.mark.slow  # four streamed runs of the digits through subprocesses (~20 s)
def test_resume_after_the_last_checkpoint_stores_the_kept_samples_in_full(digits, tmp_path):
    """Interrupted once every chunk is judged but before the kept samples are run again in full (testing hook
    ``before-refill``, tests/stream_faults.py): the resume has nothing left to run, yet re-runs the kept samples, so the
    run folder holds no sampled values and ``anpred check`` judges it whole; a resume with other labels is
    refused (the task and labels are part of the checkpoint's fingerprint)."""

    from anpred.run import RunStore
    from anpred.run.positions import GATHERED_SUFFIX
    from anpred.tensorfile import array_file_keys

    model, inp, labels, eager, root = digits
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "anpred",
        "test",
        str(model),
        "--inputs",
        str(inp),
        "--task",
        "classify",
        "--labels",
        str(labels),
        "--stream",
        "--chunk",
        "20",
        "--positions",
        "200",
        "--stages",
        "3",
        "--backends",
        "ort,openvino,torch",
        "-o",
        str(out),
    ]
    first = subprocess.run(stream_faults.command("before-refill") + cmd[3:], capture_output=True, text=True)
    assert first.returncode == 130 and "--resume" in first.stderr, first.stderr[-2000:]
    other = subprocess.run(
        [a for a in cmd if a not in ("--labels", str(labels))] + ["--resume"], capture_output=True, text=True
    )
    assert other.returncode == 2 and "labels" in other.stderr.split("made for another run:")[1], other.stderr[-1500:]
    res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "stream: resuming after 60 samples judged" in res.stderr
    run = RunStore.open(out / "run")
    assert run.meta["stream"]["seconds_refill"] > 0 and run.sample_ids
    for sid in run.sample_ids:
        for b in ("ort", "openvino", "torch"):
            assert not any(k.endswith(GATHERED_SUFFIX) for k in array_file_keys(run.anchor_file(b, sid)))
        assert run.statuses()["ort"].samples == N_TEST  # counts of the chunks judged, not counted twice
    chk = subprocess.run([sys.executable, "-m", "anpred", "check", str(out / "run")], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout[-2000:] + chk.stderr[-2000:]
    # interrupted while the report is written: the run folder goes back beside the checkpoint, and --resume
    # writes the report without running anything again
    out2 = tmp_path / "out2"
    cmd2 = cmd[:-1] + [str(out2)]
    late = subprocess.run(stream_faults.command("after-stream") + cmd2[3:], capture_output=True, text=True)
    assert late.returncode == 130 and "--resume" in late.stderr, late.stderr[-2000:]
    assert (tmp_path / ".out2.stream" / "state.pkl").is_file() and (tmp_path / ".out2.stream" / "run").is_dir()
    again = subprocess.run(cmd2 + ["--resume"], capture_output=True, text=True)
    assert again.returncode == 0 and "stream: resuming after 60 samples judged" in again.stderr, again.stderr[-2000:]
    assert json.loads((out2 / "report.json").read_text())["samples"] == N_TEST
    assert not (tmp_path / ".out2.stream").exists()


@pytest.mark.isa_independent(SAME_DATA)
def test_injected_hooks_interrupt_the_stream_and_resume_finishes_it(digits, tmp_path):
    """Testing hooks injected through the Python API (``StreamOptions.hooks``, no environment variable) see
    each judged chunk's count; a KeyboardInterrupt while the report is written leaves the checkpoint and the
    run folder beside -o, and ``resume`` writes the report without judging a sample again."""
    from anpred.run import RunStore

    model, inp, labels, eager, root = digits
    seen = []

    class Hooks(stream_faults.InterruptAt):
        def judged(self, n: int) -> None:
            seen.append(n)

    kw = dict(backends=FP32[:3], inputs=str(inp), quiet=True, stages=3, stream=True, chunk=25)
    with pytest.raises(KeyboardInterrupt):
        anpred.test(str(model), out=tmp_path / "s", hooks=Hooks("after_stream"), **kw)
    assert seen == [25, 50, N_TEST]
    ck = tmp_path / ".s.stream"
    assert (ck / "state.pkl").is_file() and (ck / "run").is_dir() and not (tmp_path / "s").exists()
    res = anpred.test(str(model), out=tmp_path / "s", resume=True, **kw)
    assert res.report.samples == N_TEST and not ck.exists()
    assert RunStore.open(res.run_dir).meta["stream"]["judged_at"] == []  # no chunk judged by the resume


def test_split_threads_divides_the_cores_among_backends_side_by_side():
    """``split_threads``: each backend that takes a ``threads`` option and was given none gets
    ``cores // backends`` (at least 1); one given threads and one without the option (the ONNX
    reference, pure numpy) are unchanged; labels and other options are kept."""
    from anpred.run.spec import BackendSpec, split_threads

    given = [
        BackendSpec("ort"),
        BackendSpec("openvino", "ov", {"x": 1}),
        BackendSpec("torch", options={"threads": 3}),
        BackendSpec("onnx-reference"),
    ]
    two = split_threads(given, cores=2)
    assert [s.label for s in two] == ["ort", "ov", "torch", "onnx-reference"]
    assert [s.options for s in two] == [{"threads": 1}, {"x": 1, "threads": 1}, {"threads": 3}, {}]
    assert [s.options.get("threads") for s in split_threads(given, cores=16)] == [4, 4, 3, None]
    assert [s.options["threads"] for s in split_threads(["ort", "ort-int8"], cores=7)] == [3, 3]
    assert given[0].options == {}  # (the caller's specs are not changed)


def test_side_by_side_stream_runs_each_backend_on_its_share_of_the_cores(digits, tmp_path, monkeypatch):
    """``--stream --side-by-side`` on a machine of 6 usable CPUs (the count set by the test): the
    backends of a chunk at once, each ONNX Runtime/OpenVINO worker with 6 // 3 = 2 threads (recorded in
    ``stream.threads`` and in the run's backend specs, which the drill-down re-runs with), the ONNX
    reference (no threads option) as it is; every digit judged. The backends apply the option: an ONNX
    Runtime session and an OpenVINO compiled model prepared with it report 2 threads."""
    import anpred.run.spec as spec
    from anpred.backends import backend_class
    from anpred.drill.runner import run_specs
    from anpred.run import RunStore
    from anpred.run.model import load_anchored

    monkeypatch.setattr(spec, "usable_cores", lambda: 6)
    model, inp, labels, _, _ = digits
    res = anpred.test(
        str(model),
        out=tmp_path / "s",
        backends=["ort", "openvino", "onnx-reference"],
        inputs=str(inp),
        task="classify",
        labels=str(labels),
        quiet=True,
        stages=3,
        stream=True,
        chunk=30,
        keep=1,
        side_by_side=True,
    )
    run = RunStore.open(res.run_dir)
    assert run.meta["stream"]["side_by_side"] is True and run.meta["stream"]["threads"] == {"ort": 2, "openvino": 2}
    assert run.meta["backend_specs"]["ort"] == {"name": "ort", "options": {"threads": 2}}
    assert run.meta["backend_specs"]["onnx-reference"]["options"] == {}
    assert run_specs(run)["openvino"].options == {"threads": 2}
    anchored = Path(res.out) / "anchored.onnx"
    ort_b, ov_b = backend_class("ort")({"threads": 2}), backend_class("openvino")({"threads": 2})
    for b in (ort_b, ov_b):
        b.prepare(anchored, load_anchored(anchored)[1], tmp_path / b.name)
    assert ort_b.sess.get_session_options().intra_op_num_threads == 2
    assert int(ov_b.compiled.get_property("INFERENCE_NUM_THREADS")) == 2
    assert res.report.samples == N_TEST and res.report.status == "consistent"
    assert all(run.statuses()[b].samples == N_TEST for b in ("ort", "openvino", "onnx-reference"))
