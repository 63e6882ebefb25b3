"""anpred diff: structural diff on real graph pairs (tests/diff_cases.py).

Pairs: YOLOv8n (ultralytics YAML, seeded, dynamo export at 160 px) vs the same after ONNX Runtime's
offline optimisation; vs its fp16 conversion (onnxconverter-common); a Keras CNN exported by tf2onnx
vs the same network written in PyTorch and exported by torch; identical graphs; a renamed node; every
name scrambled; the command line. Anchors, stages and run diffs: tests/test_diff_runs.py.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from anpred.cache import cache_key, cached_dir
from anpred.diff import GraphDiff, diff_files, diff_models

from diff_cases import VERSIONS, build_cnn_pair, fp16_copy, ort_optimised


@pytest.fixture(scope="session")
def cnn_pair() -> tuple[Path, Path]:
    d = cached_dir("test-diff-cnn-pair", cache_key("v1", VERSIONS), build_cnn_pair)
    return d / "keras.onnx", d / "torch.onnx"


# ------------------------------------------------------------------------------------------------
# structural diff
# ------------------------------------------------------------------------------------------------
def test_identical_graphs_give_an_empty_diff(yolo_path):
    m = onnx.load(str(yolo_path))
    d = diff_models(m, copy.deepcopy(m))
    assert d.identical
    assert d.matched == len(m.graph.node)
    assert not d.changed and not d.only_a and not d.only_b and not d.regions and not d.io


def test_renamed_node_is_the_only_change(yolo_path):
    m = onnx.load(str(yolo_path))
    m2 = copy.deepcopy(m)
    k = [i for i, n in enumerate(m2.graph.node) if n.op_type == "Conv"][7]
    old = m2.graph.node[k].name
    m2.graph.node[k].name = "my_renamed_conv"
    d = diff_models(m, m2)
    assert not d.identical
    assert d.matched == len(m.graph.node) and not d.only_a and not d.only_b and not d.regions
    assert len(d.changed) == 1
    (c,) = d.changed[0].changes
    assert (c.kind, c.a, c.b) == ("renamed", old, "my_renamed_conv")


def test_ort_offline_optimisation_fusions_are_found_and_named(yolo_path, yolo_ort_path):
    a, b = onnx.load(str(yolo_path)), onnx.load(str(yolo_ort_path))
    n_sig_a = sum(n.op_type == "Sigmoid" for n in a.graph.node)
    n_qg = sum(n.op_type == "QuickGelu" for n in b.graph.node)
    assert n_qg > 40  # ORT fused SiLU = x*sigmoid(x) into com.microsoft QuickGelu
    d = diff_files(yolo_path, yolo_ort_path)
    fused = [r for r in d.regions if r.kind == "fused"]
    assert Counter(r.label for r in fused) == {"Sigmoid+Mul -> QuickGelu(com.microsoft)": n_qg}
    # every QuickGelu of B is in exactly one fused region; the one Sigmoid ORT left alone matched
    assert sorted(x for r in fused for x in r.b_nodes) == sorted(
        n.name for n in b.graph.node if n.op_type == "QuickGelu"
    )
    assert len(d.only_a) == 2 * n_qg and sum(r.op_type == "Sigmoid" for r in d.only_a) == n_qg < n_sig_a
    assert d.matched == len(b.graph.node) - n_qg
    # all Conv nodes kept, unchanged
    assert not d.changed
    assert d.summary().count("QuickGelu") >= 1
    d2 = GraphDiff.from_dict(json.loads(json.dumps(d.to_dict())))
    assert d2 == d


@pytest.mark.kernels
def test_fp16_conversion_casts_found(yolo_path):
    a = onnx.load(str(yolo_path))
    b = fp16_copy(a)
    n_cast = sum(n.op_type == "Cast" for n in b.graph.node)
    d = diff_models(a, b)
    assert d.insertions() == {"Cast": n_cast} and n_cast >= 2
    assert d.matched == len(a.graph.node) and not d.only_a
    kinds = d.change_counts()
    assert kinds["dtype"] >= len(a.graph.node) - 5  # float32 -> float16 nearly everywhere
    conv = next(m for m in d.changed if m.op_type == "Conv")
    w = next(c for c in conv.changes if c.kind == "initializer")
    assert w.a.startswith("float32") and w.b.startswith("float16")
    # the max difference is the fp16 rounding of the weights: real, non-zero, below 2**-11 relative
    wa = onnx.numpy_helper.to_array(next(t for t in a.graph.initializer if t.name == a.graph.node[0].input[1]))
    assert 0 < w.max_abs_diff <= np.abs(wa).max() * 2.0**-11


def test_keras_vs_torch_matched_by_structure(cnn_pair):
    ka, tb = cnn_pair
    d = diff_files(ka, tb)
    a, b = onnx.load(str(ka)), onnx.load(str(tb))
    names_a, names_b = {n.name for n in a.graph.node}, {n.name for n in b.graph.node}
    assert not names_a & names_b  # nothing to match by name
    pairs = {(m.op_type, m.a, m.b) for m in d.changed}
    convs = sorted((x, y) for op, x, y in pairs if op == "Conv")
    assert len(convs) == 2
    # stem conv of Keras <-> first conv of torch, block conv <-> second (by weights shape + dataflow)
    assert "stem" in convs[1][0] and convs[1][1] == b.graph.node[0].name
    assert "block_conv" in convs[0][0]
    assert {op for op, _, _ in pairs} >= {"Conv", "Relu", "MaxPool", "ReduceMean"}
    kinds = Counter(r.kind for r in d.regions)
    assert kinds["removed"] == 2  # tf2onnx's NHWC<->NCHW Transposes
    assert any(r.label == "MatMul -> Gemm" for r in d.regions)


def test_cli_graph_diff_and_bad_input(yolo_path, yolo_ort_path, tmp_path, capsys):
    from anpred.cli import main

    assert main(["diff", str(yolo_path), str(yolo_path)]) == 0
    assert "identical" in capsys.readouterr().out
    rc = main(
        [
            "diff",
            str(yolo_path),
            str(yolo_ort_path),
            "--json",
            str(tmp_path / "g.json"),
            "--html",
            str(tmp_path / "g.html"),
        ]
    )
    assert rc == 1 and "QuickGelu" in capsys.readouterr().out
    assert "QuickGelu" in (tmp_path / "g.html").read_text()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["diff", str(yolo_path), str(bad), "--json", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
    assert main(["diff", str(yolo_path), str(tmp_path)]) == 2
    assert "both" in capsys.readouterr().err


def _scramble(model):
    """Every node name and every internal value/initializer name replaced (graph I/O kept)."""
    m = copy.deepcopy(model)
    keep = {i.name for i in m.graph.input} | {o.name for o in m.graph.output}
    ren: dict[str, str] = {}

    def r(v):
        return v if not v or v in keep else ren.setdefault(v, f"v{len(ren)}")

    for t in m.graph.initializer:
        t.name = r(t.name)
    for k, n in enumerate(m.graph.node):
        n.name = f"n{k}"
        n.input[:] = [r(x) for x in n.input]
        n.output[:] = [r(x) for x in n.output]
    del m.graph.value_info[:]
    return m


def test_matching_without_names_steps_across_fusions(yolo_path, yolo_ort_path):
    a = onnx.load(str(yolo_path))
    b = _scramble(onnx.load(str(yolo_ort_path)))
    n_qg = sum(n.op_type == "QuickGelu" for n in b.graph.node)
    d = diff_models(a, b)
    assert d.match_counts["name"] == 0
    # every node that survived the optimisation is paired: only the fused SiLUs are left
    assert d.matched == len(b.graph.node) - n_qg
    assert Counter(r.kind for r in d.regions) == {"fused": n_qg}
    assert Counter(n.op_type for n in d.only_a) == {"Sigmoid": n_qg, "Mul": n_qg}
    # and the pairs are the right ones: the scrambled B keeps node order, so B's node k is the
    # optimiser's node k; compare with the name-matched diff of the unscrambled pair
    ref = diff_files(yolo_path, yolo_ort_path)
    assert ref.matched == d.matched
    conv_b = [n.name for n in onnx.load(str(yolo_ort_path)).graph.node]
    renamed = {m.a: conv_b[m.b_index] for m in d.changed if m.b_index < len(conv_b)}
    checked = [(x, y) for x, y in renamed.items() if x in conv_b]
    assert len(checked) == d.matched and all(x == y for x, y in checked)


def test_contrib_domain_defaults_are_not_changes(yolo_path, tmp_path):
    allopt = ort_optimised(yolo_path, tmp_path / "all.onnx", "ORT_ENABLE_ALL")
    b = onnx.load(str(allopt))
    nchwc = [n for n in b.graph.node if n.domain == "com.microsoft.nchwc"]
    assert len(nchwc) > 40
    d = diff_files(yolo_path, allopt)
    spelled = [
        (m.a, c.what, c.a, c.b)
        for m in d.changed
        for c in m.changes
        if c.kind == "attribute" and c.what in ("auto_pad", "group", "ceil_mode", "storage_order")
    ]
    assert spelled == []
    doms = [m for m in d.changed if any(c.kind == "domain" for c in m.changes)]
    assert len(doms) == sum(n.name in {m.b for m in doms} for n in nchwc) > 40


def test_cli_run_only_options_and_file_modes(yolo_path, yolo_ort_path, tmp_path, capsys):
    import os

    from anpred.cli import main

    for extra in (["--pair", "ort=ort-fp16"], ["--backends", "ort"], ["--config", str(tmp_path / "c.toml")]):
        assert main(["diff", str(yolo_path), str(yolo_ort_path), "--json", str(tmp_path / "n.json"), *extra]) == 2
        assert "only apply to a diff of two run folders" in capsys.readouterr().err
        assert not (tmp_path / "n.json").exists()
    old = os.umask(0o022)
    try:
        assert (
            main(
                [
                    "diff",
                    str(yolo_path),
                    str(yolo_ort_path),
                    "-q",
                    "--json",
                    str(tmp_path / "g.json"),
                    "--html",
                    str(tmp_path / "g.html"),
                ]
            )
            == 1
        )
    finally:
        os.umask(old)
    for f in ("g.json", "g.html"):
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o644
