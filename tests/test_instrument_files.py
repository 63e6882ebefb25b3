"""The instrumentation compiler's files and command line: a model's external data next to its source
(referenced) or in another folder (refused, or copied streaming within a bounded peak RSS), the output
files' mode, bad input (one message, exit 2, nothing written) and the CLI's outputs, on real models
(tests/instrument_models.py) and small built ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from anpred.cli import instrument_main
from anpred.instrument import instrument_file
from anpred.manifest import AnchorManifest

from isa_reasons import NOT_A_KERNEL_VALUE, SAME_DATA
from instrument_models import feeds_for


def _check_source_loads(path: Path) -> None:
    """The user's model still loads with its weights through onnx (refuses hard links and paths
    outside the folder) and passes the full checker."""
    import onnx

    m = onnx.load(str(path))  # loads the external data
    assert all(not t.external_data for t in m.graph.initializer)
    onnx.checker.check_model(str(path), full_check=True)


@pytest.mark.isa_independent(SAME_DATA)
def test_external_data_next_to_source_is_referenced(model_path, tmp_path):
    import onnx
    import onnxruntime as ort

    from anpred.onnx_io import external_data_files

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    onnx.save(
        onnx.load(str(model_path("yolov8n-dynamo"))),
        str(src_dir / "m.onnx"),
        save_as_external_data=True,
        location="m.weights",
    )
    assert (src_dir / "m.weights").stat().st_size > 10_000_000
    man = instrument_file(src_dir / "m.onnx", src_dir / "anchored.onnx")
    assert sorted(p.name for p in src_dir.iterdir()) == [
        "anchored.anchors.json",
        "anchored.onnx",
        "m.onnx",
        "m.weights",
    ]
    assert (src_dir / "m.weights").stat().st_nlink == 1  # referenced: no link, no copy
    assert (src_dir / "anchored.onnx").stat().st_size < (src_dir / "m.onnx").stat().st_size + 50_000
    assert external_data_files(onnx.load(str(src_dir / "anchored.onnx"), load_external_data=False)) == ["m.weights"]
    _check_source_loads(src_dir / "m.onnx")
    _check_source_loads(src_dir / "anchored.onnx")
    plain = ort.InferenceSession(str(src_dir / "m.onnx"), providers=["CPUExecutionProvider"])
    anch = ort.InferenceSession(str(src_dir / "anchored.onnx"), providers=["CPUExecutionProvider"])
    feeds = feeds_for(plain)
    assert np.array_equal(plain.run(None, feeds)[0], anch.run(None, feeds)[0])
    assert len(anch.get_outputs()) == len(man.anchors)


def _big_weights_model(folder: Path) -> Path:
    """x: float32[1, 3600] -> MatMul(W: 3600x3600, 51.8 MB, external) -> Relu -> Tanh -> Sigmoid -> y."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((0.02 * rng.standard_normal((3600, 3600), dtype=np.float32)), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Tanh", ["r"], ["t"], name="tanh"),
        helper.make_node("Sigmoid", ["t"], ["y"], name="sig"),
    ]
    g = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3600])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3600])],
        initializer=[w],
    )
    folder.mkdir()
    path = folder / "big.onnx"
    onnx.save(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
        str(path),
        save_as_external_data=True,
        location="big.onnx.data",
        size_threshold=1024,
    )
    assert (folder / "big.onnx.data").stat().st_size >= 50_000_000
    return path


# peak RSS of this process image: VmHWM (getrusage's ru_maxrss keeps the forking parent's peak across exec)
_RSS_CHILD = """
import sys
from anpred.cli import instrument_main
rc = instrument_main(sys.argv[1:])
print("RSS_KB", next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
sys.exit(rc)
"""


def _cli_child(args: list[str]) -> tuple[int, str, int]:
    """Run anpred-instrument in a fresh process; returns (exit status, stderr, peak RSS in bytes)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, *args], capture_output=True, text=True, env=env, cwd=root)
    rss = next((int(line.split()[1]) * 1024 for line in r.stdout.splitlines() if line.startswith("RSS_KB")), -1)
    return r.returncode, r.stderr, rss


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_external_data_other_folder_refused_or_copied_streaming(tmp_path):
    """Another folder: refused (exit 2, one message naming both ways out, nothing written) unless
    --copy-external-data, which streams the weights next to the output: peak memory does not grow
    with the 51.8 MB of weights, ONNX Runtime loads and runs the copy, the source is untouched."""
    import filecmp

    import onnx
    import onnxruntime as ort

    src = _big_weights_model(tmp_path / "src")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # refused without the option
    rc, err, _ = _cli_child([str(src), "-o", str(out_dir / "a.onnx")])
    assert rc == 2 and err.startswith("anpred: error:") and err.count("\n") == 1, err
    assert "--copy-external-data" in err and "same folder" in err and "outside the model's folder" in err, err
    assert list(out_dir.iterdir()) == []
    # a failure after the copy was staged (unwritable manifest path) leaves nothing either
    rc, err, _ = _cli_child(
        [str(src), "-o", str(out_dir / "a.onnx"), "--copy-external-data", "--manifest", "/proc/m.json"]
    )
    assert rc == 2 and "/proc" in err, err
    assert list(out_dir.iterdir()) == []
    # next to the source: the reference for peak memory (weights neither loaded nor copied)
    rc, err, rss_ref = _cli_child([str(src), "-o", str(src.parent / "ref.onnx")])
    assert rc == 0, err
    rc, err, rss_copy = _cli_child([str(src), "-o", str(out_dir / "a.onnx"), "--copy-external-data", "--stages", "3"])
    assert rc == 0, err
    weights = (src.parent / "big.onnx.data").stat().st_size
    print(
        f"peak RSS: referenced {rss_ref / 1e6:.1f} MB, copied {rss_copy / 1e6:.1f} MB (weights {weights / 1e6:.1f} MB)"
    )
    assert rss_copy - rss_ref < 0.25 * weights, (rss_ref, rss_copy)
    assert sorted(p.name for p in out_dir.iterdir()) == ["a.anchors.json", "a.onnx", "a.onnx.data"]
    assert filecmp.cmp(out_dir / "a.onnx.data", src.parent / "big.onnx.data", shallow=False)
    assert (src.parent / "big.onnx.data").stat().st_nlink == 1
    _check_source_loads(src)
    _check_source_loads(out_dir / "a.onnx")
    plain = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    anch = ort.InferenceSession(str(out_dir / "a.onnx"), providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(1).standard_normal((1, 3600), dtype=np.float32)}
    y = anch.run(None, x)
    assert np.array_equal(plain.run(None, x)[0], y[0]) and len(y) == len(anch.get_outputs()) == 3
    assert (
        onnx.load(str(out_dir / "a.onnx"), load_external_data=False).graph.initializer[0].external_data[0].value
        == "a.onnx.data"
    )


def test_output_files_get_the_umask_mode(tmp_path):
    src = tmp_path / "m.onnx"
    import onnx

    onnx.save(_small_model(), str(src))
    old = os.umask(0o027)
    try:
        instrument_file(src, tmp_path / "a.onnx")
    finally:
        os.umask(old)
    assert (tmp_path / "a.onnx").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "a.anchors.json").stat().st_mode & 0o777 == 0o640
    old = os.umask(0o022)
    try:
        instrument_file(src, tmp_path / "b.onnx")
    finally:
        os.umask(old)
    assert (tmp_path / "b.onnx").stat().st_mode & 0o777 == 0o644


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def _small_model():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="s1"),
        helper.make_node("Tanh", ["b"], ["c"], name="t1"),
        helper.make_node("Relu", ["c"], ["y"], name="r2"),
    ]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def _bad_inputs(tmp: Path, yolo: Path) -> dict[str, tuple[list[str], str]]:
    import onnx
    from onnx import TensorProto, helper

    cases = {}
    (tmp / "notonnx.onnx").write_text("this is a text file, not a model\n" * 20)
    cases["not-onnx"] = ([str(tmp / "notonnx.onnx")], "not")
    data = yolo.read_bytes()
    (tmp / "trunc.onnx").write_bytes(data[: len(data) // 2])
    cases["truncated"] = ([str(tmp / "trunc.onnx")], "onnx")
    ext = tmp / "ext"
    ext.mkdir()
    onnx.save(_small_model(), str(ext / "m.onnx"))
    m = onnx.load(str(yolo))
    onnx.save(m, str(ext / "w.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    (ext / "w.bin").unlink()
    cases["missing-external-data"] = ([str(ext / "w.onnx")], "w.bin")
    c = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]))
    noin = helper.make_model(
        helper.make_graph(
            [c, helper.make_node("Relu", ["k"], ["y"])],
            "g",
            [],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    onnx.save(noin, str(tmp / "noinputs.onnx"))
    cases["no-inputs"] = ([str(tmp / "noinputs.onnx")], "no inputs")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    cyc = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                helper.make_node("Relu", ["a"], ["b"], name="n2"),
                helper.make_node("Relu", ["a"], ["y"], name="n3"),
            ],
            "g",
            [x],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    onnx.save(cyc, str(tmp / "cycle.onnx"))
    cases["cycle"] = ([str(tmp / "cycle.onnx")], "cycle")
    cases["unknown-anchor"] = ([str(ext / "m.onnx"), "--anchor", "nope"], "'nope'")
    cases["missing-folder"] = ([str(ext / "m.onnx"), "-o", str(tmp / "no" / "such" / "out.onnx")], "does not exist")
    cases["output-is-folder"] = ([str(ext / "m.onnx"), "-o", str(ext)], "folder")
    cases["no-such-file"] = ([str(tmp / "absent.onnx")], "no such file")
    cases["model-is-folder"] = ([str(ext)], "is a folder")
    onnx.save(onnx.load(str(yolo)), str(ext / "x.onnx"), save_as_external_data=True, location="x.bin")
    cases["output-is-the-weights"] = ([str(ext / "x.onnx"), "-o", str(ext / "x.bin")], "external weight files")
    noout = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="r")], "g", [x], []),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    onnx.save(noout, str(tmp / "nooutputs.onnx"))
    cases["no-outputs"] = ([str(tmp / "nooutputs.onnx")], "no outputs")
    # /proc refuses new files even to root (os.access says writable)
    cases["unwritable-output"] = ([str(ext / "m.onnx"), "-o", "/proc/a.onnx"], "/proc/a.onnx")
    cases["unwritable-manifest"] = ([str(ext / "m.onnx"), "--manifest", "/proc/m.json"], "/proc/m.json")
    return cases


def test_cli_bad_input_one_message_exit_2_nothing_written(model_path, tmp_path, capsys):
    cases = _bad_inputs(tmp_path, model_path("yolov8n-dynamo"))
    for name, (argv, needle) in cases.items():
        outdir = tmp_path / f"out-{name}"
        outdir.mkdir()
        if "-o" not in argv:
            argv = argv + ["-o", str(outdir / "anchored.onnx")]
        before = {p for p in tmp_path.rglob("*")}
        rc = instrument_main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2, (name, err)
        assert err.startswith("anpred: error:") and "\n" not in err and needle.lower() in err.lower(), (name, err)
        assert {p for p in tmp_path.rglob("*")} == before, f"{name}: something was written"
        print(f"{name}: {err}")


def test_cli_writes_and_lists(model_path, tmp_path, capsys):
    src = model_path("yolov8n-torchscript")
    rc = instrument_main([str(src), "--list", "--stages", "5", "--max-cut-width", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and list(tmp_path.iterdir()) == []
    assert "stage" in out and "boundary anchor" in out and "anchor/00/" in out and "1x84x525" in out
    assert "5 stages" in out
    target = "/model.4/cv2/act/Mul_output_0"
    rc = instrument_main(
        [
            str(src),
            "-o",
            str(tmp_path / "a.onnx"),
            "--stages",
            "5",
            "--anchor",
            target,
            "--manifest",
            str(tmp_path / "m.json"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    man = AnchorManifest.load(tmp_path / "m.json")
    inner = sum(a.kind != "output" for a in man.anchors)
    assert f"5 stages, {inner} anchors + 1 output = {len(man.anchors)} in the manifest" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "m.json"]
    assert len(man.stages) == 5 and man.by_value()[target].kind == "explicit"
    assert man.by_value()[target].scope == "model.4"
