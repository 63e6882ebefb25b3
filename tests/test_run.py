"""The run driver: isolation (real crashes in backend processes), streaming statistics, CLI, bad
input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_models  # noqa: E402

from anpred.cli import main as cli  # noqa: E402
from anpred.errors import BackendError, OutputPathError  # noqa: E402
from anpred.run import BackendSpec, StreamingStats, read_stats, run_model  # noqa: E402

from isa_reasons import DEFECT_BOUND, NOT_A_KERNEL_VALUE, SAME_DATA
from ort_session import ort_outputs


@pytest.fixture(scope="session")
def yolo():
    return run_models.anchored_yolo()


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
    specs = ["ort",
             BackendSpec("ort", "ort-segv", {"_fault": "segfault"}),
             BackendSpec("ort-noopt", "noopt-abort", {"_fault": "abort", "_fault_at": "prepare"}),
             BackendSpec("ort", "ort-exit", {"_fault": "exit", "_fault_at": "prepare"}),
             BackendSpec("ort", "ort-raise", {"_fault": "raise"}),
             "openvino"]
    store = run_model(yolo, specs, "random:uniform:seed=1:n=2", tmp_path / "r", timeout_s=HANG_S, progress=False)
    hung = run_model(yolo, [BackendSpec("ort-noopt", "noopt-hang", {"_fault": "hang", "_fault_at": "prepare"})],
                     "random:uniform:seed=1:n=2", tmp_path / "h", timeout_s=HANGING_S, progress=False)
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
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("NoSuchOp", ["r"], ["y"], domain="example.unknown")], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.unknown", 1)])
    onnx.save(m, tmp_path / "m.onnx")
    store = run_model(tmp_path / "m.onnx", ["ort", "openvino"], "random:normal:n=1", tmp_path / "r", progress=False)
    st = store.statuses()
    assert st["ort"].status == "unsupported" and "NoSuchOp" in st["ort"].reason
    assert st["openvino"].status in ("unsupported", "failed") and st["openvino"].reason
    assert store.meta["model"]["manifest_source"] == "outputs-only"


@pytest.mark.isa_independent(SAME_DATA)
def test_stats_mode_memory_does_not_grow(yolo, tmp_path):
    runs = {}
    for n in (2, 16):
        runs[n] = run_model(yolo, ["ort"], f"random:normal:seed=2:n={n}", tmp_path / f"s{n}", mode="stats",
                            progress=False)
    s16 = runs[16]
    assert not any((s16.root / "tensors").iterdir())
    stats = read_stats(s16.root, "ort")
    assert stats["samples"] == 16 and set(stats["anchors"]) == set(s16.manifest.names())
    lines = (s16.root / "stats" / "ort.samples.jsonl").read_text().splitlines()
    assert len(lines) == 16 and json.loads(lines[3])["sample"] == "s0003"
    peak = {n: r.meta["resources"]["ort"]["peak_rss_bytes"] for n, r in runs.items()}
    # 14 more samples of ~1.4 MB anchors each would add ~20 MB if anything accumulated
    assert peak[16] < peak[2] + 8 * 2**20, peak
    # the streaming summary equals the statistics of all samples at once (recomputed from a tensors run)
    full = run_model(yolo, ["ort"], "random:normal:seed=2:n=16", tmp_path / "t16", progress=False)
    k = "output/output0"
    allv = np.stack([full.read_anchors("ort", sid)[k] for sid in full.sample_ids]).astype(np.float64)
    s = stats["anchors"][k]
    assert s["count"] == allv.size and s["nan"] == 0
    assert np.isclose(s["mean"], allv.mean(), rtol=1e-9) and np.isclose(s["std"], allv.std(), rtol=1e-9)
    assert s["min"] == allv.min() and s["max"] == allv.max()
    assert np.isclose(s["rms"], np.sqrt((allv ** 2).mean()), rtol=1e-9)


@pytest.mark.isa_independent(SAME_DATA)
def test_streaming_stats_merge_and_nonfinite():
    rng = np.random.default_rng(0)
    parts = [rng.normal(5, 3, size=n) for n in (1, 50, 7, 300)]
    acc = StreamingStats()
    for p in parts:
        acc.update(p.astype(np.float32))
    allv = np.concatenate([p.astype(np.float32) for p in parts]).astype(np.float64)
    d = acc.to_dict()
    assert np.isclose(d["mean"], allv.mean(), rtol=1e-12) and np.isclose(d["std"], allv.std(), rtol=1e-10)
    acc.update(np.array([np.nan, np.inf, -np.inf, 1.0]))
    d = acc.to_dict()
    assert (d["nan"], d["posinf"], d["neginf"], d["count"]) == (1, 1, 1, allv.size + 1)


def test_cli_run_and_bad_input_exit_2_nothing_overwritten(yolo, tmp_path, capsys):
    out = tmp_path / "runs" / "a"
    assert cli(["run", str(yolo), "-b", "ort", "-i", "random:images:n=1", "-o", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    n_anchors = len(json.loads((out / "manifest.json").read_text())["anchors"])
    assert "ort" in text and "ok" in text and f"{n_anchors}/" in text
    shapes = json.loads((out / "run.json").read_text())["inputs"]["input_shapes"]  # review: size 640 was recorded
    assert list(shapes.values()) == [[1, 3, 224, 224]]  # the static 224 px model's, not the 640 default
    before = (out / "run.json").read_bytes()
    bad_npz = tmp_path / "bad.npz"
    np.savez(bad_npz, images=np.zeros((1, 3, 32, 32), np.float32))
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "broken.png").write_bytes(b"\x89PNG garbage")
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04" + b"\0" * 40)  # zip magic, not a zip archive
    (tmp_path / "afile").write_text("x")
    cases = [(["-b", "ort", "-i", "random:uniform", "-o", str(out)], "already holds a run"),
             (["-b", "ort,nope", "-i", "random:uniform", "-o", str(out), "--overwrite"], "unknown backend 'nope'"),
             (["-b", "ort", "-i", str(tmp_path / "missing"), "-o", str(out), "--overwrite"], "no such file"),
             (["-b", "ort", "-i", str(bad_npz), "-o", str(out), "--overwrite"], "does not fit"),
             (["-b", "ort", "-i", str(tmp_path / "imgs"), "-o", str(out), "--overwrite"], "cannot read image"),
             (["-b", "ort", "-i", str(corrupt), "-o", str(out), "--overwrite"], "not a valid .npz"),
             (["-b", "ort", "-i", "random:uniform", "-o", str(tmp_path / "afile" / "sub")], "afile is a file")]
    # a wrong spatial size on a dynamic model (PP-OCR det needs multiples of 32): caught before running
    ocr = run_models.anchored_ppocr_det()
    cases_ocr = [(["-b", "ort,openvino", "-i", "random:uniform:shape=1x3x250x250", "-o", str(out), "--overwrite"],
                  "x=1x3x250x250 does not fit the model: Add node")]
    for model, args, msg in [(yolo, *c) for c in cases] + [(ocr, *c) for c in cases_ocr]:
        assert cli(["run", str(model), *args]) == 2, args
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
        assert (out / "run.json").read_bytes() == before  # the earlier run is untouched
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["a"]  # no partial folder left
    assert not (tmp_path / "afile").is_dir()
    assert cli(["run", str(tmp_path / "nothere.onnx"), "-b", "ort", "-i", "random:uniform", "-o",
                str(tmp_path / "b")]) == 2


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_api_errors_and_alternative_model(yolo, tmp_path):
    with pytest.raises(BackendError, match="used twice"):
        run_model(yolo, ["ort", "ort"], "random:uniform", tmp_path / "x", progress=False)
    with pytest.raises(BackendError, match="does not exist"):
        BackendSpec("ort", "alt", {"model": str(tmp_path / "none.onnx")})
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="not a folder"):
        run_model(yolo, ["ort"], "random:uniform", tmp_path / "file", progress=False)
    # options["model"]: one backend runs another anchored ONNX (here: the same graph, weights scaled)
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(yolo))
    for t in [t for t in m.graph.initializer if len(t.dims) == 4]:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 2, t.name))
    alt = tmp_path / "alt.onnx"
    onnx.save(m, alt)
    store = run_model(yolo, ["ort", BackendSpec("ort", "ort-alt", {"model": str(alt), "family": "faulty"})],
                      "random:uniform:n=1", tmp_path / "r", progress=False)
    st = store.statuses()
    assert st["ort-alt"].status == "ok" and st["ort-alt"].family == "faulty"
    a, b = store.read_anchors("ort", "s0000"), store.read_anchors("ort-alt", "s0000")
    first_anchor = store.manifest.anchors[0].name
    assert not np.allclose(a[first_anchor], b[first_anchor])
    assert store.meta["backend_specs"]["ort-alt"]["options"]["model"] == str(alt)


def test_shape_error_in_every_backend_is_bad_input(tmp_path, capsys):
    """x (1, n) -> Reshape to (2, -1): ONNX shape inference accepts n = 5, every runtime refuses it."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("s", TensorProto.INT64, [2], [2, -1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    out = tmp_path / "r"
    assert cli(["run", str(tmp_path / "m.onnx"), "-b", "ort,openvino", "-i", "random:uniform:shape=1x5",
                "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "every backend (ort, openvino) failed on sample s0000" in err and "shape" in err and err.count("\n") == 1
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    # n = 6 fits: the same model runs
    assert cli(["run", str(tmp_path / "m.onnx"), "-b", "ort,openvino", "-i", "random:uniform:shape=1x6",
                "-o", str(out), "-q"]) == 0


def test_model_is_copied_with_its_external_data(yolo, tmp_path):
    """The run holds a copy of the model (and of its weight files): an in-place save of the original
    after the run changes nothing in the run, and the recorded hashes cover the weights."""
    import onnx

    from anpred.onnx_io import sha256_file

    src = tmp_path / "m" / "model.anchored.onnx"
    src.parent.mkdir()
    m = onnx.load(str(yolo))
    onnx.save(m, str(src), save_as_external_data=True, location="weights.bin", size_threshold=0)
    store = run_model(src, ["ort"], "random:uniform:n=1", tmp_path / "r", progress=False)
    assert store.statuses()["ort"].status == "ok"
    info = store.meta["model"]
    assert (store.root / "model.onnx").is_file() and (store.root / "weights.bin").is_file()
    assert info["sha256"] == sha256_file(src) == sha256_file(store.root / "model.onnx")
    assert info["external_data"] == {"weights.bin": sha256_file(src.parent / "weights.bin")}
    assert (store.root / "model.onnx").stat().st_ino != src.stat().st_ino  # a copy, not a hard link
    before = (store.root / "weights.bin").read_bytes()
    with open(src.parent / "weights.bin", "r+b") as f:  # in-place edit of the original's weights
        f.write(b"\xff" * 64)
    src.write_bytes(src.read_bytes())  # and an in-place save of the .onnx
    assert (store.root / "weights.bin").read_bytes() == before
    assert sha256_file(store.root / "weights.bin") == info["external_data"]["weights.bin"]
    # a different weight file changes the run's identity (sha256_all), not only its .onnx hash
    r2 = run_model(src, ["ort"], "random:uniform:n=1", tmp_path / "r2", progress=False)
    assert r2.meta["model"]["sha256"] == info["sha256"] and r2.meta["model"]["sha256_all"] != info["sha256_all"]


def test_short_reason_elides_array_dumps():
    from anpred.run.worker import short_reason

    dump = "Received args: (<tf.Tensor: shape=(1, 3, 256, 256), dtype=float32, numpy=\narray([[[[" + \
        "-1.7411594 , -1.6897851 ,\n " * 200 + "]]]], dtype=float32)>,) and kwargs: {}"
    r = short_reason(TypeError("Binding inputs to tf.function failed due to `Can not cast`. " + dump))
    assert r.startswith("TypeError: Binding inputs") and "-1.74" not in r and len(r) < 300, r
    assert "<tf.Tensor (1, 3, 256, 256) float32>" in r
    assert len(short_reason(ValueError("x" * 5000))) <= 620


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
    cmd = [sys.executable, "-m", "anpred.cli", "run", str(yolo), "-b", "onnx-reference", "-i",
           "random:images:n=40", "-o", str(out), "-q"]
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

    specs = [BackendSpec("ort"), BackendSpec("openvino"), BackendSpec("ort", "ort-segv", {"_fault": "segfault"}),
             BackendSpec("ort", "ort-later", {"_fault": "raise", "_fault_after": 3})]
    hang = [BackendSpec("ort-noopt", "noopt-hang", {"_fault": "hang", "_fault_at": "prepare"})]
    pids, stores = [], []
    # the hanging backend in a pool of its own with a short limit (the limit is the pool's, and the healthy
    # workers get one for hangs only)
    with WorkerPool(tmp_path / "workers", timeout_s=HANG_S, side_by_side=True) as pool, \
            WorkerPool(tmp_path / "workers-hang", timeout_s=HANGING_S, side_by_side=True) as hang_pool:
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
        again = run_model(yolo, specs[:2], "random:uniform:seed=0:n=2", tmp_path / "serial", progress=False,
                          precheck=False, pool=serial)
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
    specs = ["ort", "openvino", "onnx-reference",
             BackendSpec("ort", "ort-later", {"_fault": "raise", "_fault_after": 2})]
    rep = stream_test(yolo, samples, tmp_path / "run", run=RunOptions(backends=specs), quiet=True,
                      judge=JudgeOptions(allow_incomplete=True), stream=StreamOptions(chunk=2, keep=1))
    from anpred.run import RunStore

    st = RunStore.open(tmp_path / "run").statuses()
    assert st["ort"].status == "ok" and st["ort"].samples == 6
    assert st["ort-later"].status == "failed" and st["ort-later"].samples == 2
    last = min(2 + 2 * LATER_CHUNK_FACTOR, 6) - 1  # the second chunk: s000002 to the end (6 samples)
    assert RunStore.open(tmp_path / "run").meta["stream"]["later_chunks"] == 2 * LATER_CHUNK_FACTOR
    assert st["ort-later"].reason.startswith(f"chunk of samples s000002..s{last:06d}: sample s000002: RuntimeError")
    assert st["ort-later"].versions.get("onnxruntime")
    assert rep.inputs["samples"] == 6


def test_stream_threads_lower_their_priority():
    """The stream's judge and reader threads raise their own nice value by JUDGE_NICE (capped at 19),
    not the process's (the backends' workers, the driver's main thread keep theirs)."""
    import threading

    from anpred.pipeline.stream import JUDGE_NICE
    from anpred.pipeline.stream_inputs import lower_priority

    before = os.getpriority(os.PRIO_PROCESS, 0)
    got = {}
    th = threading.Thread(target=lambda: got.update(new=lower_priority(),
                                                    seen=os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    th.start()
    th.join()
    assert JUDGE_NICE == 10 and got["new"] == got["seen"] == min(19, before + JUDGE_NICE)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_samples_in_memory_move_their_prewritten_inputs_in(tmp_path):
    """A streamed chunk's inputs arrive in memory (anpred.inputs.ArraySamples), hashed and written by
    the reader thread beforehand: run_model moves that file into the run and records that digest; a
    sample whose arrays run_model has to cast (float64 for a float32 input) is hashed and written again
    from the cast arrays, and its prewritten file is left alone."""
    import onnx
    from onnx import TensorProto, helper

    from anpred.inputs import ArraySamples
    from anpred.run.store import sample_sha256
    from anpred.tensorfile import read_safetensors, write_safetensors

    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "relu.onnx")
    a32 = {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)}
    a64 = {"x": np.array([[5.0, -6.0, 7.0, -8.0]], np.float64)}
    pre = []
    for i, a in enumerate((a32, a64)):
        write_safetensors(tmp_path / f"pre{i}.safetensors", a, direct=False)
        pre.append((sample_sha256(a), tmp_path / f"pre{i}.safetensors"))
    part = ArraySamples([("page-a.png", a32), ("page-b.png", a64)], {"kind": "arrays", "path": "pages"}, pre)
    store = run_model(tmp_path / "relu.onnx", ["ort"], part, tmp_path / "run", progress=False)
    assert store.statuses()["ort"].status == "ok"
    assert [s["source"] for s in store.meta["samples"]] == ["page-a.png", "page-b.png"]
    assert store.meta["samples"][0]["sha256"] == pre[0][0] and not pre[0][1].exists()  # moved in
    cast = {"x": a64["x"].astype(np.float32)}
    assert store.meta["samples"][1]["sha256"] == sample_sha256(cast) != pre[1][0] and pre[1][1].exists()
    assert read_safetensors(store.input_file("s0001"))["x"].dtype == np.float32
    np.testing.assert_array_equal(store.read_inputs("s0000")["x"], a32["x"])
    (y,) = store.read_anchors("ort", "s0001").values()  # the graph output, the one anchor
    np.testing.assert_array_equal(y, np.maximum(cast["x"], 0))
    assert store.meta["inputs"]["path"] == "pages" and store.meta["inputs"]["samples"] == 2
    # a streamed dataset keeps a sample by moving its files out of the chunk's run (RunStore.adopt_sample)
    from anpred.run import RunStore

    final = RunStore.create(tmp_path / "final", store.manifest)
    sha = store.meta["samples"][1]["sha256"]
    src_in, src_t = store.input_file("s0001"), store.anchor_file("ort", "s0001")
    final.adopt_sample("s000042", store, "s0001", source="page-b.png")
    assert final.meta["samples"] == [{"id": "s000042", "source": "page-b.png", "sha256": sha}]
    assert not src_in.exists() and not src_t.exists()  # moved, not copied
    assert sample_sha256(final.read_inputs("s000042")) == sha
    np.testing.assert_array_equal(next(iter(final.read_anchors("ort", "s000042").values())), y)
    with pytest.raises(KeyError, match="no sample s0009"):
        final.adopt_sample("s000043", store, "s0009")


def test_adopt_sample_copies_where_it_cannot_move(tmp_path, monkeypatch):
    """Where a kept sample's files cannot be moved (another file system: ``os.replace`` raises EXDEV),
    ``RunStore.adopt_sample`` copies each under a temporary name and renames it: the same bytes arrive,
    no ``.part`` file stays; a copy that fails leaves no file under the final name."""
    import errno

    import onnx
    from onnx import TensorProto, helper

    from anpred.inputs import ArraySamples
    from anpred.run import RunStore
    from anpred.run import store as store_mod

    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "relu.onnx")
    x = {"x": np.array([[-1.0, 2.0, -3.0]], np.float32)}
    src = run_model(tmp_path / "relu.onnx", ["ort"], ArraySamples([("a.png", x), ("b.png", x)], {}),
                    tmp_path / "chunk", progress=False)
    final = RunStore.create(tmp_path / "final", src.manifest)
    real = os.replace

    def cross_device(a, b):  # every move refused as between file systems; the rename of a copy allowed
        if not str(a).endswith(".part"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(a, b)

    monkeypatch.setattr(store_mod.os, "replace", cross_device)
    src_in, src_t = src.input_file("s0000"), src.anchor_file("ort", "s0000")
    want_in, want_t = src_in.read_bytes(), src_t.read_bytes()
    final.adopt_sample("s000007", src, "s0000", source="a.png")
    assert not src_in.exists() and not src_t.exists()  # moved, as os.replace would have
    assert final.input_file("s000007").read_bytes() == want_in
    assert final.anchor_file("ort", "s000007").read_bytes() == want_t
    assert not list((tmp_path / "final").rglob("*.part"))

    def half_copy(a, b):  # the device fills up half-way through the copy
        Path(b).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.shutil, "copyfile", half_copy)
    with pytest.raises(OSError, match="No space left"):
        final.adopt_sample("s000008", src, "s0001")
    assert not list((tmp_path / "final" / "inputs").glob("s000008*"))
    assert not list((tmp_path / "final").rglob("*.part"))


def test_scratch_folder_takes_memory_only_where_the_chunks_fit(tmp_path, monkeypatch):
    """A streamed run's chunk folder (anpred.pipeline.scratch): on a memory-backed mount with room for
    the chunks' estimate, and that estimate within MEMORY_SHARE of the available memory, else beside -o;
    ``ANPRED_STREAM_SCRATCH=disk`` forces the disk, ``memory`` drops the share, a folder is used as
    given; a mount that is not memory-backed is never taken. (The mount's kind, its free bytes and the
    available memory are set here: the decision, not this machine, is tested.)"""
    from types import SimpleNamespace

    from anpred.pipeline import scratch

    monkeypatch.delenv("ANPRED_STREAM_SCRATCH", raising=False)
    mem = tmp_path / "shm"
    mem.mkdir()
    beside = tmp_path / "side" / "chunks"
    gib = 1 << 30
    monkeypatch.setattr(scratch, "memory_backed", lambda p: Path(p) == mem)
    monkeypatch.setattr(scratch.shutil, "disk_usage", lambda p: SimpleNamespace(total=16 * gib, free=10 * gib))
    monkeypatch.setattr(scratch, "_mem_available", lambda: 20 * gib)  # the share: 5 GiB
    got, kind = scratch.scratch_folder(beside, 4 * gib, candidates=[str(tmp_path / "other"), str(mem)])
    assert kind == "memory" and got.parent == mem and got.name.startswith(f"anpred-stream-{os.getpid()}-")
    assert [p.name for p in got.iterdir()] == [scratch.LOCK]  # empty but for the run's lock
    assert not list(mem.glob(".anpred-new-*"))  # made and locked under a hidden name, then renamed
    scratch.remove_scratch(got)
    assert not got.exists() and str(got) not in scratch._held
    assert scratch.scratch_folder(beside, 6 * gib, candidates=[str(mem)]) == (beside, "disk")  # over the share
    assert scratch.scratch_folder(beside, 11 * gib, candidates=[str(mem)]) == (beside, "disk")  # over the free bytes
    assert scratch.scratch_folder(beside, 1, candidates=[str(tmp_path / "other")]) == (beside, "disk")
    assert beside.is_dir()
    monkeypatch.setattr(scratch, "_mem_available", lambda: None)  # unknown: not taken
    assert scratch.scratch_folder(beside, 1, candidates=[str(mem)]) == (beside, "disk")
    monkeypatch.setenv("ANPRED_STREAM_SCRATCH", "memory")  # the share dropped, the free bytes still needed
    got, kind = scratch.scratch_folder(beside, 9 * gib, candidates=[str(mem)])
    assert kind == "memory" and got.parent == mem
    scratch.remove_scratch(got)
    assert scratch.scratch_folder(beside, 11 * gib, candidates=[str(mem)]) == (beside, "disk")
    monkeypatch.setenv("ANPRED_STREAM_SCRATCH", "disk")
    assert scratch.scratch_folder(beside, 1, candidates=[str(mem)]) == (beside, "disk")
    monkeypatch.setenv("ANPRED_STREAM_SCRATCH", str(mem / "given"))
    got, kind = scratch.scratch_folder(beside, 1, candidates=[str(mem)])
    assert got.parent == mem / "given" and kind == "disk"  # (only mem itself is memory-backed here)
    scratch.remove_scratch(got)


def test_memory_backed_reads_the_mounts():
    """``memory_backed``: the longest mount point above the folder, by /proc/mounts (Linux)."""
    from anpred.pipeline.scratch import memory_backed

    if not Path("/proc/mounts").is_file():
        pytest.skip("no /proc/mounts (not Linux)")
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    kinds = {mnt: kind for mnt, kind in mounts}
    assert memory_backed("/") == (kinds.get("/") == "tmpfs")
    tmpfs = [m for m, k in mounts if k == "tmpfs" and os.path.isdir(m) and not any(
        o != m and o.startswith(m.rstrip("/") + "/") for o, _ in mounts)]
    if tmpfs:
        assert memory_backed(tmpfs[0]) and memory_backed(os.path.join(tmpfs[0], "no", "such", "folder"))
    proc = [m for m, k in mounts if m == "/proc"]
    if proc:
        assert not memory_backed("/proc/self")


def test_scratch_folders_of_dead_runs_are_removed(tmp_path):
    """A run killed with SIGKILL leaves its memory-backed chunk folder: the next stream removes the
    ``anpred-stream-*`` folders whose lock no process holds, and leaves those of live runs (their lock
    held, whatever their pid: another container sharing /dev/shm) and those without a lock file."""
    import subprocess

    from anpred.pipeline import scratch

    (tmp_path / "anpred-stream-1-live").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(tmp_path / 'anpred-stream-1-live' / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # holds the lock until killed, however long
    try:
        (tmp_path / "anpred-stream-1-live" / "run0").mkdir()
        dead = tmp_path / "anpred-stream-2-dead"
        (dead / "run0").mkdir(parents=True)
        (dead / scratch.LOCK).write_text("")  # its process gone: nobody holds the lock
        nolock = tmp_path / "anpred-stream-3-nolock"
        (nolock / "run0").mkdir(parents=True)
        mine = scratch._locked_folder(tmp_path)  # this process' live run
        assert holder.stdout.readline().strip() == "held"
        assert scratch.remove_stale(tmp_path) == [dead]
        assert not dead.exists() and nolock.is_dir() and mine.is_dir() and (tmp_path / "anpred-stream-1-live").is_dir()
        scratch.remove_scratch(mine)
    finally:
        holder.kill()
        holder.wait()
    assert scratch.remove_stale(tmp_path) == [tmp_path / "anpred-stream-1-live"]  # its holder killed
