"""Campaign configurations batched onto warm workers (issue 38, deliverable 2): real runtimes (ONNX
Runtime, the ONNX reference evaluator, PyTorch through onnx2torch) on the embedded Ray.

The models are small and built here: two Conv nets, a Det net (onnx2torch has no converter for
Det: torch is ``unsupported`` on that configuration alone) and an Expand net whose one 1 GiB
intermediate tensor passes the campaign's memory bound (the backend workers holding it are killed:
that configuration's status, and the next configuration gets fresh workers)."""

from __future__ import annotations

import json

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _save(nodes, name, x_shape, y_shape, inits, path: Path) -> None:
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def conv_net(path: Path, seed: int, act: str) -> None:
    """Conv (2 -> 4 channels, 3x3, seeded weights) then ``act``; input 1x2x8x8."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 2, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(act, ["c"], ["y"], name="act"),
    ]
    _save(nodes, f"conv{seed}", [1, 2, 8, 8], [1, 4, 8, 8], inits, path)


def det_net(path: Path) -> None:
    """Conv -> Reshape to 4 matrices of 3x3 -> Det: ONNX Runtime and the reference evaluator run
    Det, onnx2torch has no converter for it."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 4, 3, 3], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["m"], name="reshape"),
        helper.make_node("Det", ["m"], ["y"], name="det"),
    ]
    _save(nodes, "det_net", [1, 1, 3, 3], [1, 4], inits, path)


def expand_net(path: Path, gib: float) -> None:
    """x (1x4) expanded to ``gib`` GiB of float32, then its mean over the long axis: one intermediate
    tensor of that size in every backend that materializes Expand."""
    n = int(gib * 2**30 / 16)
    inits = [numpy_helper.from_array(np.array([n, 4], np.int64), "shape")]
    nodes = [
        helper.make_node("Expand", ["x", "shape"], ["e"], name="expand"),
        helper.make_node("ReduceMean", ["e"], ["y"], name="mean", axes=[0], keepdims=1),
    ]
    _save(nodes, "expand_net", [1, 4], [1, 4], inits, path)


def _write(base: Path, models: list[str], backends: list[str], head: str = "") -> Path:
    lines = [
        "[campaign]",
        'name = "warm"',
        "retries = 0",
        "timeout = 300",
        head,
        "[defaults]",
        "samples = 2",
        "stages = 2",
        "",
    ]
    for m in models:
        lines += ["[[models]]", f'model = "{m}"', ""]
    lines += [
        "[backend_sets]",
        f"fp32 = {backends!r}".replace("'", '"'),
        "",
        "[resources]",
        "cpus = 1",
        "memory_gb = 1",
    ]
    path = base / "campaign.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _standing(rec: dict) -> dict:
    """What a configuration's record says about each backend (the content the one-shot and the
    batched paths must agree on)."""
    keys = ("run", "verdict", "flagged", "origin_anchor", "origin_stage")
    return {
        "state": rec["state"],
        "status": rec.get("status"),
        "exit_code": rec.get("exit_code"),
        "backends": {b: {k: r.get(k) for k in keys} for b, r in rec.get("backends", {}).items()},
    }


def _three(base: Path) -> list[str]:
    conv_net(base / "a.onnx", 0, "Relu")
    det_net(base / "det.onnx")
    conv_net(base / "b.onnx", 1, "Sigmoid")
    return ["a.onnx", "det.onnx", "b.onnx"]


BACKENDS = ["ort", "onnx-reference", "torch"]


# ~12 s: a Ray campaign in batches, resumed: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
def test_a_batch_runs_on_one_worker_per_backend_and_resumes(tmp_path):
    """3 configurations x (ort, onnx-reference, torch) in one batch: one worker process per backend
    for the whole batch (the records name the same pid for every configuration, a fresh worker only
    for the first); torch is ``unsupported`` on the Det net alone (the reason names Det) and its
    worker serves the next configuration; a re-run skips the recorded configurations and runs only
    the one whose folder was removed, with the same result."""
    from anpred.campaign import load_campaign, run_campaign

    base = tmp_path / "c"
    base.mkdir()
    path = _write(base, _three(base), BACKENDS, "batch = 3")
    res = run_campaign(load_campaign(path), tmp_path / "out", num_cpus=2, progress=False)
    by = {r["label"]: r for r in res.records}
    # (the Det configuration is incomplete: one of its backends did not run)
    assert [(by[m]["state"], by[m]["status"]) for m in ("a", "det", "b")] == [
        ("complete", "consistent"),
        ("complete", "incomplete"),
        ("complete", "consistent"),
    ]
    tr = by["det"]["backends"]["torch"]
    assert tr["run"] == "unsupported" and "Det" in tr["reason"], tr
    assert {b: r["run"] for b, r in by["det"]["backends"].items() if b != "torch"} == {
        "ort": "ok",
        "onnx-reference": "ok",
    }
    assert by["a"]["backends"]["torch"]["run"] == "ok" and by["b"]["backends"]["torch"]["run"] == "ok"
    for b in BACKENDS:
        w = [by[m]["timings"]["warm"][b] for m in ("a", "det", "b")]
        assert {x["batch"] for x in w} == {by["a"]["id"]}
        assert [x["fresh"] for x in w] == [True, False, False], (b, w)
        assert w[0]["pid"] is not None and len({x["pid"] for x in w}) == 1, (b, w)
    assert not (tmp_path / "out" / ".work").exists()  # the batch's pool folder and work folders are gone
    again = run_campaign(load_campaign(path), tmp_path / "out", num_cpus=2, progress=False)
    assert again.ran == [] and len(again.skipped) == 3  # resume: nothing to run


@pytest.mark.slow  # ~50 s: the one-shot path starts 9 backend processes
def test_batched_records_equal_the_one_shot_path(tmp_path):
    """The same 3 configurations batched (``batch = 3``) and one-shot (``batch = 0``, one Ray task per
    backend run): the same ids and, per configuration and backend, the same run status, verdict,
    flag and origin."""
    from anpred.campaign import load_campaign, run_campaign

    base = tmp_path / "c"
    base.mkdir()
    models = _three(base)
    res = run_campaign(
        load_campaign(_write(base, models, BACKENDS, "batch = 3")), tmp_path / "warm", num_cpus=2, progress=False
    )
    ref = run_campaign(
        load_campaign(_write(base, models, BACKENDS, "batch = 0")), tmp_path / "one", num_cpus=2, progress=False
    )
    assert [r["id"] for r in res.records] == [r["id"] for r in ref.records]  # (batch is no part of the id)
    assert [_standing(r) for r in res.records] == [_standing(r) for r in ref.records]
    assert all("warm" in r["timings"] for r in res.records) and all("warm" not in r["timings"] for r in ref.records)
    assert [r["backends"]["torch"]["run"] for r in ref.records] == ["ok", "unsupported", "ok"]


@pytest.mark.slow  # ~30 s: a memory-bound kill and a fresh worker; the batching itself stays in the default run
def test_a_worker_killed_on_one_configuration_leaves_the_others_and_the_next_gets_a_fresh_one(tmp_path):
    """ort and onnx-reference on three configurations in one batch, the middle one an Expand net whose
    1 GiB intermediate passes the campaign's memory bound (0.6 GiB): both workers are killed on it
    (their ``failed`` status names the bound), the configuration before keeps its results, and the
    next configuration runs on fresh workers (new pids) and completes. A re-run after that
    configuration's folder was removed runs it alone, with the same result."""
    from anpred.campaign import load_campaign, run_campaign

    base = tmp_path / "c"
    base.mkdir()
    conv_net(base / "a.onnx", 0, "Relu")
    expand_net(base / "big.onnx", 1.0)
    conv_net(base / "b.onnx", 1, "Tanh")
    camp = load_campaign(
        _write(base, ["a.onnx", "big.onnx", "b.onnx"], ["ort", "onnx-reference"], "batch = 3\nmemory_bound = 0.6")
    )
    res = run_campaign(camp, tmp_path / "out", num_cpus=2, progress=False)
    by = {r["label"]: r for r in res.records}
    for m in ("a", "b"):
        assert by[m]["state"] == "complete" and by[m]["status"] == "consistent", by[m]
        assert {b: r["run"] for b, r in by[m]["backends"].items()} == {"ort": "ok", "onnx-reference": "ok"}
    big = by["big"]  # judged: no backend ran, so the report says error
    assert (big["state"], big["status"]) == ("complete", "error"), big
    for b, r in big["backends"].items():
        assert r["run"] == "failed" and "exceeded the memory bound of 614 MiB per backend" in r["reason"], (b, r)
    # the bound the pool enforced is the one run.json records (a review found the machine default there)
    meta = json.loads((tmp_path / "out" / "configs" / by["a"]["id"] / "run" / "run.json").read_text())
    assert meta["memory_bounds"]["backend_bytes"] == int(0.6 * 2**30), meta["memory_bounds"]
    for b in ("ort", "onnx-reference"):
        wa, wb = by["a"]["timings"]["warm"][b], by["b"]["timings"]["warm"][b]
        assert wa["batch"] == wb["batch"] == by["a"]["id"], (wa, wb)  # one batch, in the campaign's order
        assert wa["fresh"] and wb["fresh"] and wa["pid"] != wb["pid"], (b, wa, wb)
    # resume: a configuration whose folder was removed is run again, alone, with the same result
    shutil.rmtree(tmp_path / "out" / "configs" / by["b"]["id"])
    res2 = run_campaign(load_campaign(base / "campaign.toml"), tmp_path / "out", num_cpus=2, progress=False)
    assert res2.ran == [by["b"]["id"]] and sorted(res2.skipped) == sorted([by["a"]["id"], big["id"]])
    assert _standing(res2.records[2]) == _standing(by["b"]) and res2.records[2]["timings"]["warm"]["ort"]["fresh"]


@pytest.mark.slow  # ~30 s: two campaigns
def test_a_lost_batch_task_keeps_the_configurations_it_finished(tmp_path):
    """The Ray worker running a batch is killed (SIGKILL, retries = 0) while it runs the second of
    three configurations: the first, whose run was committed, is judged and complete; the other two
    fail their run step with Ray's reason; a re-run completes only those two."""
    import os
    import signal
    import threading
    import time

    from anpred.campaign import load_campaign, run_campaign

    base = tmp_path / "c"
    base.mkdir()
    for i, act in enumerate(("Relu", "Tanh", "Sigmoid")):
        conv_net(base / f"m{i}.onnx", i, act)
    path = _write(base, ["m0.onnx", "m1.onnx", "m2.onnx"], ["ort", "onnx-reference"], "batch = 3")
    camp = load_campaign(path)
    ids = [c.id for c in camp.configurations]
    out = tmp_path / "out"
    killed: list[int] = []
    stop = threading.Event()

    def kill_second():  # the batch's pid file appears while it runs the second configuration
        pidf = out / ".work" / ids[1] / ".batch.pid"
        while not stop.is_set() and not killed:
            try:
                pid = int(pidf.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (OSError, ValueError):
                time.sleep(0.02)

    t = threading.Thread(target=kill_second, daemon=True)
    t.start()
    try:
        res = run_campaign(camp, out, num_cpus=2, progress=False)
    finally:
        stop.set()
        t.join()
    assert len(killed) == 1
    states = [(r["state"], r.get("step")) for r in res.records]
    assert states == [("complete", None), ("failed", "run"), ("failed", "run")], res.records
    assert "batch task of ort, onnx-reference" in res.records[1]["reason"], res.records[1]["reason"]
    res2 = run_campaign(load_campaign(path), out, num_cpus=2, progress=False)
    assert res2.ran == ids[1:] and res2.skipped == ids[:1]
    assert [r["state"] for r in res2.records] == ["complete"] * 3
    assert not (out / ".work").exists()  # the killed batch's pool folder is removed too


def test_batch_size_and_its_option(tmp_path):
    """The default batch fills every Ray CPU before it grows to DEFAULT_BATCH; ``batch`` in the file
    must be an integer >= 0 (0: one task per backend run)."""
    from anpred.campaign import load_campaign
    from anpred.campaign.warm import DEFAULT_BATCH, batch_size
    from anpred.errors import AnpredError

    assert DEFAULT_BATCH == 8
    assert [batch_size(None, n, 2.0, 1.0) for n in (1, 3, 16, 40)] == [1, 2, 8, 8]
    assert batch_size(None, 16, 16.0, 2.0) == 2 and batch_size(5, 40, 2.0, 1.0) == 5
    conv_net(tmp_path / "a.onnx", 0, "Relu")
    assert load_campaign(_write(tmp_path, ["a.onnx"], ["ort", "onnx-reference"], "batch = 0")).batch == 0
    assert load_campaign(_write(tmp_path, ["a.onnx"], ["ort", "onnx-reference"])).batch is None
    with pytest.raises(AnpredError, match="batch must be >= 0"):
        load_campaign(_write(tmp_path, ["a.onnx"], ["ort", "onnx-reference"], "batch = -1"))
    with pytest.raises(AnpredError, match="batch = 'x' has the wrong type"):
        load_campaign(_write(tmp_path, ["a.onnx"], ["ort", "onnx-reference"], "batch = 'x'"))
