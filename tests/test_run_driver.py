"""The run driver's API and CLI: stats mode (memory that does not grow, streaming statistics merged,
non-finite values), bad input (exit 2, nothing overwritten; a shape error in every backend), API errors
and another model, the model copied with its external data, short reasons, stream threads' priority.
Isolation of the backends: tests/test_run_isolation.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import run_models

from anpred.cli import main as cli
from anpred.errors import BackendError, OutputPathError
from anpred.run import BackendSpec, StreamingStats, read_stats, run_model

from isa_reasons import DEFECT_BOUND, SAME_DATA


@pytest.mark.isa_independent(SAME_DATA)
def test_stats_mode_memory_does_not_grow(yolo, tmp_path):
    runs = {}
    for n in (2, 16):
        runs[n] = run_model(
            yolo, ["ort"], f"random:normal:seed=2:n={n}", tmp_path / f"s{n}", mode="stats", progress=False
        )
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
    assert np.isclose(s["rms"], np.sqrt((allv**2).mean()), rtol=1e-9)


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
    cases = [
        (["-b", "ort", "-i", "random:uniform", "-o", str(out)], "already holds a run"),
        (["-b", "ort,nope", "-i", "random:uniform", "-o", str(out), "--overwrite"], "unknown backend 'nope'"),
        (["-b", "ort", "-i", str(tmp_path / "missing"), "-o", str(out), "--overwrite"], "no such file"),
        (["-b", "ort", "-i", str(bad_npz), "-o", str(out), "--overwrite"], "does not fit"),
        (["-b", "ort", "-i", str(tmp_path / "imgs"), "-o", str(out), "--overwrite"], "cannot read image"),
        (["-b", "ort", "-i", str(corrupt), "-o", str(out), "--overwrite"], "not a valid .npz"),
        (["-b", "ort", "-i", "random:uniform", "-o", str(tmp_path / "afile" / "sub")], "afile is a file"),
    ]
    # a wrong spatial size on a dynamic model (PP-OCR det needs multiples of 32): caught before running
    ocr = run_models.anchored_ppocr_det()
    cases_ocr = [
        (
            ["-b", "ort,openvino", "-i", "random:uniform:shape=1x3x250x250", "-o", str(out), "--overwrite"],
            "x=1x3x250x250 does not fit the model: Add node",
        )
    ]
    for model, args, msg in [(yolo, *c) for c in cases] + [(ocr, *c) for c in cases_ocr]:
        assert cli(["run", str(model), *args]) == 2, args
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
        assert (out / "run.json").read_bytes() == before  # the earlier run is untouched
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["a"]  # no partial folder left
    assert not (tmp_path / "afile").is_dir()
    assert (
        cli(["run", str(tmp_path / "nothere.onnx"), "-b", "ort", "-i", "random:uniform", "-o", str(tmp_path / "b")])
        == 2
    )


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
    store = run_model(
        yolo,
        ["ort", BackendSpec("ort", "ort-alt", {"model": str(alt), "family": "faulty"})],
        "random:uniform:n=1",
        tmp_path / "r",
        progress=False,
    )
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

    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("s", TensorProto.INT64, [2], [2, -1])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    out = tmp_path / "r"
    assert (
        cli(
            [
                "run",
                str(tmp_path / "m.onnx"),
                "-b",
                "ort,openvino",
                "-i",
                "random:uniform:shape=1x5",
                "-o",
                str(out),
                "-q",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "every backend (ort, openvino) failed on sample s0000" in err and "shape" in err and err.count("\n") == 1
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    # n = 6 fits: the same model runs
    assert (
        cli(
            [
                "run",
                str(tmp_path / "m.onnx"),
                "-b",
                "ort,openvino",
                "-i",
                "random:uniform:shape=1x6",
                "-o",
                str(out),
                "-q",
            ]
        )
        == 0
    )


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

    dump = (
        "Received args: (<tf.Tensor: shape=(1, 3, 256, 256), dtype=float32, numpy=\narray([[[["
        + "-1.7411594 , -1.6897851 ,\n " * 200
        + "]]]], dtype=float32)>,) and kwargs: {}"
    )
    r = short_reason(TypeError("Binding inputs to tf.function failed due to `Can not cast`. " + dump))
    assert r.startswith("TypeError: Binding inputs") and "-1.74" not in r and len(r) < 300, r
    assert "<tf.Tensor (1, 3, 256, 256) float32>" in r
    assert len(short_reason(ValueError("x" * 5000))) <= 620


def test_stream_threads_lower_their_priority():
    """The stream's judge and reader threads raise their own nice value by JUDGE_NICE (capped at 19),
    not the process's (the backends' workers, the driver's main thread keep theirs)."""
    import threading

    from anpred.pipeline.stream import JUDGE_NICE
    from anpred.pipeline.stream_inputs import lower_priority

    before = os.getpriority(os.PRIO_PROCESS, 0)
    got = {}
    th = threading.Thread(
        target=lambda: got.update(new=lower_priority(), seen=os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    )
    th.start()
    th.join()
    assert JUDGE_NICE == 10 and got["new"] == got["seen"] == min(19, before + JUDGE_NICE)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
