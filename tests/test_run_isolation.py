"""The run driver's isolation: real crashes, hangs and a missing operator in backend processes leave the
other backends' results intact; SIGTERM to the driver kills its workers and removes the partial run; a
worker pool prepares once and keeps going after a crash; a stream keeps its first failure. The driver's
API and CLI: tests/test_run_driver.py; its inputs and scratch folders: tests/test_run_scratch.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from anpred.cli import main as cli
from anpred.run import BackendSpec, run_model

from isa_reasons import NOT_A_KERNEL_VALUE, SAME_DATA
from ort_session import ort_outputs


# A limit for hangs only: the healthy backends of these tests finish in seconds alone, and must not be
# timed out by a loaded machine or an emulated CPU (issue 32: a 10 s window failed under load)
HANG_S = 600
# The limit given to a backend that hangs for real (it never finishes: any limit gives "timeout"; short
# to keep the test cheap, and alone in its run or pool, so that nothing healthy shares that limit)
HANGING_S = 3


@pytest.mark.isa_independent(SAME_DATA)
def test_crashing_backends_leave_the_others_intact(yolo, tmp_path):
    """Every fault kind in a backend's own process; the others' results are intact. The hanging one runs
    alone, in a run of its own with a short limit (the limit is the run's, not a backend's)."""
    specs = [
        "ort",
        BackendSpec("ort", "ort-segv", {"_fault": "segfault"}),
        BackendSpec("ort-noopt", "noopt-abort", {"_fault": "abort", "_fault_at": "prepare"}),
        BackendSpec("ort", "ort-exit", {"_fault": "exit", "_fault_at": "prepare"}),
        BackendSpec("ort", "ort-raise", {"_fault": "raise"}),
        "openvino",
    ]
    store = run_model(yolo, specs, "random:uniform:seed=1:n=2", tmp_path / "r", timeout_s=HANG_S, progress=False)
    hung = run_model(
        yolo,
        [BackendSpec("ort-noopt", "noopt-hang", {"_fault": "hang", "_fault_at": "prepare"})],
        "random:uniform:seed=1:n=2",
        tmp_path / "h",
        timeout_s=HANGING_S,
        progress=False,
    )
    st = {**store.statuses(), **hung.statuses()}
    assert list(store.statuses()) == ["ort", "ort-segv", "noopt-abort", "ort-exit", "ort-raise", "openvino"]
    assert st["ort-segv"].status == "crashed" and "SIGSEGV" in st["ort-segv"].reason
    # named from faulthandler's stack in the worker log: the innermost frame (the fault hook's ctypes.string_at)
    assert st["ort-segv"].reason.startswith("crash of ctypes (SIGSEGV in string_at")
    assert st["noopt-abort"].status == "crashed" and "SIGABRT" in st["noopt-abort"].reason
    assert "preparing" in st["noopt-abort"].reason
    assert st["ort-exit"].status == "failed" and "sys.exit(3)" in st["ort-exit"].reason
    assert st["ort-raise"].status == "failed" and "RuntimeError" in st["ort-raise"].reason
    assert st["noopt-hang"].status == "timeout" and f"{HANGING_S} s" in st["noopt-hang"].reason
    assert hung.ok_backends() == [] and hung.read_anchors("noopt-hang", hung.sample_ids[0]) == {}
    assert st["noopt-hang"].family == "onnxruntime"
    assert store.ok_backends() == ["ort", "openvino"]
    n = len(store.manifest.anchors)
    assert st["ort"].anchors_captured == n and st["openvino"].anchors_captured == n
    # the surviving results equal a plain InferenceSession on the same stored inputs
    for sid in store.sample_ids:
        plain = ort_outputs(yolo, {"images": store.read_inputs(sid)["images"]})
        got = store.read_anchors("ort", sid)
        for a in store.manifest.anchors:
            key = a.name if a.name in plain else a.value
            np.testing.assert_array_equal(got[a.name], plain[key])
        assert store.read_anchors("ort-segv", sid) == {}
    assert (store.root / "logs" / "ort-segv.log").read_text().count("Segmentation fault") >= 1
    assert not (store.root / ".work").exists()


def test_unsupported_operator_is_a_status(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NoSuchOp", ["r"], ["y"], domain="example.unknown")],
        "g",
        [x],
        [y],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.unknown", 1)])
    onnx.save(m, tmp_path / "m.onnx")
    store = run_model(tmp_path / "m.onnx", ["ort", "openvino"], "random:normal:n=1", tmp_path / "r", progress=False)
    st = store.statuses()
    assert st["ort"].status == "unsupported" and "NoSuchOp" in st["ort"].reason
    assert st["openvino"].status in ("unsupported", "failed") and st["openvino"].reason
    assert store.meta["model"]["manifest_source"] == "outputs-only"


def _start_and_wait_for_anchors(cmd, runs):
    """Start ``anpred run`` (``cmd``) and wait until its worker has written anchors into the partial
    run folder; returns (process, that partial folder)."""
    import subprocess
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(runs.glob(".t.partial-*/tensors/onnx-reference/*.safetensors"))
        if found:
            return proc, found[0].parents[2]
        time.sleep(0.1)
    raise AssertionError(proc.communicate())


def _no_worker_left(partial: Path) -> bool:
    """True once no process holds ``partial`` (the partial run's folder) on its command line, waiting for
    that as long as a hang would take (a killed worker's exit is asynchronous: under load it may take
    more than any fixed pause)."""
    import subprocess
    import time

    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-f", str(partial)], capture_output=True, text=True).stdout.strip() == "":
            return True
        time.sleep(0.2)
    return False


def test_sigterm_to_the_driver_kills_workers_and_removes_the_partial_run(yolo, tmp_path):
    """Regression (review): SIGTERM to `anpred run` left the worker running and writing into a
    `.NAME.partial-PID` folder that no later run removed. Now: exit 143, no worker left, no partial
    folder; a partial folder of a dead driver is removed by the next run."""
    import signal
    import sys

    out = tmp_path / "runs" / "t"
    cmd = [
        sys.executable,
        "-m",
        "anpred.cli",
        "run",
        str(yolo),
        "-b",
        "onnx-reference",
        "-i",
        "random:images:n=40",
        "-o",
        str(out),
        "-q",
    ]
    proc, partial = _start_and_wait_for_anchors(cmd, tmp_path / "runs")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 143 and "terminated by signal SIGTERM" in err
    assert not partial.exists() and not out.exists()  # removed before the driver exits
    assert _no_worker_left(partial)  # no worker left with the job of that run
    # SIGKILL cannot be handled: the worker dies with the driver (PR_SET_PDEATHSIG); the partial
    # folder stays until the next run into the same place
    proc, partial = _start_and_wait_for_anchors(cmd, tmp_path / "runs")
    proc.kill()
    proc.communicate(timeout=HANG_S)
    assert _no_worker_left(partial) and partial.exists()
    # a stale partial of a dead driver goes with the next run (and one of a pid that never existed)
    stale = tmp_path / "runs" / f".t.partial-{2**22 + 1}"
    (stale / "tensors").mkdir(parents=True)
    assert cli(["run", str(yolo), "-b", "ort", "-i", "random:images:n=1", "-o", str(out), "-q"]) == 0
    assert not stale.exists() and not partial.exists() and (out / "run.json").is_file()


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_worker_pool_prepares_once_and_keeps_going_after_a_crash(yolo, tmp_path):
    """Long-lived workers (streamed datasets): three runs of two samples each on one WorkerPool.
    Each backend's process is started and prepared once (same pid in every run, prepare time only in
    the first run's status); the tensors equal a plain InferenceSession's; a backend that segfaults in
    its first run is `crashed` there and in every later run (naming the earlier chunk), the others
    are untouched; a hanging one times out."""
    from anpred.run.driver import WorkerPool

    specs = [
        BackendSpec("ort"),
        BackendSpec("openvino"),
        BackendSpec("ort", "ort-segv", {"_fault": "segfault"}),
        BackendSpec("ort", "ort-later", {"_fault": "raise", "_fault_after": 3}),
    ]
    hang = [BackendSpec("ort-noopt", "noopt-hang", {"_fault": "hang", "_fault_at": "prepare"})]
    pids, stores = [], []
    # the hanging backend in a pool of its own with a short limit (the limit is the pool's, and the healthy
    # workers get one for hangs only)
    with (
        WorkerPool(tmp_path / "workers", timeout_s=HANG_S, side_by_side=True) as pool,
        WorkerPool(tmp_path / "workers-hang", timeout_s=HANGING_S, side_by_side=True) as hang_pool,
    ):
        for k in range(3):
            inputs = f"random:uniform:seed={k}:n=2"
            hung = run_model(yolo, hang, inputs, tmp_path / f"h{k}", progress=False, precheck=False, pool=hang_pool)
            store = run_model(yolo, specs, inputs, tmp_path / f"r{k}", progress=False, precheck=False, pool=pool)
            stores.append(store)
            st = store.statuses()
            # statuses first: a worker that ended (a failure) has no process left to look at
            assert st["ort"].status == "ok" and st["openvino"].status == "ok" and st["ort"].samples == 2
            pids.append({b: w["proc"].pid for b, w in pool.workers.items() if b in ("ort", "openvino")})
            for pid in pids[-1].values():  # each its own process group (killed as one), in this session
                assert os.getpgid(pid) == pid != os.getpgid(0) and os.getsid(pid) == os.getsid(0)
            assert st["ort-segv"].status == "crashed" and "SIGSEGV" in st["ort-segv"].reason
            assert hung.statuses()["noopt-hang"].status == "timeout"
            assert ("in an earlier chunk" in hung.statuses()["noopt-hang"].reason) == (k > 0)
            if k:
                assert st["ort"].seconds_prepare == 0.0 and "in an earlier chunk" in st["ort-segv"].reason
            else:
                assert st["ort"].seconds_prepare > 0.0
            # fails at its 4th sample: the second sample of the second run; details kept afterwards
            assert st["ort-later"].status == ("ok" if k == 0 else "failed")
            if k == 1:
                assert st["ort-later"].reason.startswith("sample s0001: RuntimeError") and st["ort-later"].samples == 1
            if k == 2:
                assert st["ort-later"].reason.startswith("in an earlier chunk: sample s0001")
                assert st["ort-later"].versions.get("onnxruntime") and st["ort-later"].precision == "fp32"
                assert st["ort-later"].captures
    assert pids[0] == pids[1] == pids[2]
    for store in stores:
        for sid in store.sample_ids:
            plain = ort_outputs(yolo, {"images": store.read_inputs(sid)["images"]})
            got = store.read_anchors("ort", sid)
            for a in store.manifest.anchors:
                key = a.name if a.name in plain else a.value
                if key in plain:
                    np.testing.assert_array_equal(got[a.name], plain[key])
    assert not pool.workers  # closed: every worker ended
    # one after the other (the default): the same tensors
    with WorkerPool(tmp_path / "workers-serial", timeout_s=HANG_S, side_by_side=False) as serial:
        again = run_model(
            yolo,
            specs[:2],
            "random:uniform:seed=0:n=2",
            tmp_path / "serial",
            progress=False,
            precheck=False,
            pool=serial,
        )
    for sid in again.sample_ids:
        for b in ("ort", "openvino"):
            for name, x in again.read_anchors(b, sid).items():
                np.testing.assert_array_equal(x, stores[0].read_anchors(b, sid)[name])


def test_stream_keeps_the_first_failure_with_its_chunk_and_sample(yolo, tmp_path):
    """A streamed run (a first chunk of 2, then chunks of 2 x LATER_CHUNK_FACTOR: YOLOv8n's anchors are
    sampled) where one backend fails at the 3rd sample of the dataset: its final status names that
    chunk and that sample by the dataset's ids (not a later chunk, not the chunk's own numbering),
    keeps its details, and counts the samples it did run; the others judge all 6."""
    from anpred.options import JudgeOptions, RunOptions, StreamOptions
    from anpred.pipeline.stream import LATER_CHUNK_FACTOR, stream_test

    rng = np.random.default_rng(0)
    samples = iter([(f"gen{i}", {"images": rng.random((1, 3, 224, 224), dtype=np.float32)}) for i in range(6)])
    specs = [
        "ort",
        "openvino",
        "onnx-reference",
        BackendSpec("ort", "ort-later", {"_fault": "raise", "_fault_after": 2}),
    ]
    rep = stream_test(
        yolo,
        samples,
        tmp_path / "run",
        run=RunOptions(backends=specs),
        quiet=True,
        judge=JudgeOptions(allow_incomplete=True),
        stream=StreamOptions(chunk=2, keep=1),
    )
    from anpred.run import RunStore

    st = RunStore.open(tmp_path / "run").statuses()
    assert st["ort"].status == "ok" and st["ort"].samples == 6
    assert st["ort-later"].status == "failed" and st["ort-later"].samples == 2
    last = min(2 + 2 * LATER_CHUNK_FACTOR, 6) - 1  # the second chunk: s000002 to the end (6 samples)
    assert RunStore.open(tmp_path / "run").meta["stream"]["later_chunks"] == 2 * LATER_CHUNK_FACTOR
    assert st["ort-later"].reason.startswith(f"chunk of samples s000002..s{last:06d}: sample s000002: RuntimeError")
    assert st["ort-later"].versions.get("onnxruntime")
    assert rep.inputs["samples"] == 6
