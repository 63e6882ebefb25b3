"""The run driver's inputs and scratch folders: samples held in memory move their pre-written inputs into
the run (copied where they cannot move), the stream's scratch folder takes memory only where the chunks
fit (read from the mounts), and the scratch folders of dead runs are removed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from anpred.run import run_model

from isa_reasons import NOT_A_KERNEL_VALUE


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

    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
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

    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    onnx.save(m, tmp_path / "relu.onnx")
    x = {"x": np.array([[-1.0, 2.0, -3.0]], np.float32)}
    src = run_model(
        tmp_path / "relu.onnx",
        ["ort"],
        ArraySamples([("a.png", x), ("b.png", x)], {}),
        tmp_path / "chunk",
        progress=False,
    )
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
    tmpfs = [
        m
        for m, k in mounts
        if k == "tmpfs"
        and os.path.isdir(m)
        and not any(o != m and o.startswith(m.rstrip("/") + "/") for o, _ in mounts)
    ]
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
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time\n"
                f"fd = os.open({str(tmp_path / 'anpred-stream-1-live' / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # holds the lock until killed, however long
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
