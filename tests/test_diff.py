"""anpred diff: structural diff on real graph pairs, anchor correspondence, run diff on real runs.

Pairs: YOLOv8n (ultralytics YAML, seeded, dynamo export at 160 px) vs the same after ONNX Runtime's
offline optimisation; vs its fp16 conversion (onnxconverter-common); a Keras CNN exported by tf2onnx
vs the same network written in PyTorch and exported by torch; identical graphs; a renamed node.
Exports are cached with anpred.cache (TF/torch are only imported on a cold cache).
"""

from __future__ import annotations

import copy
import importlib.metadata as md
import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from anpred.cache import cache_key, cached_dir
from anpred.diff import GraphDiff, diff_files, diff_models

from isa_reasons import FP32_BOUND, SAME_DATA

VERSIONS = {p: md.version(p) for p in ("torch", "onnx", "tensorflow-cpu", "tf2onnx", "ultralytics")}


# ------------------------------------------------------------------------------------------------
# real models (cached)
# ------------------------------------------------------------------------------------------------
def _build_yolo(d: Path) -> None:
    import torch

    from anpred.compat import import_ultralytics

    ul = import_ultralytics()
    torch.manual_seed(0)
    m = ul.YOLO("yolov8n.yaml").model.eval()
    for mod in m.modules():
        if hasattr(mod, "export"):
            mod.export = True
            mod.format = "onnx"
    torch.onnx.export(m, (torch.zeros(1, 3, 160, 160),), str(d / "model.onnx"), dynamo=True, external_data=False)


def _build_cnn_pair(d: Path) -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf2onnx

    k = tf.keras
    tf.random.set_seed(0)
    inp = k.Input((32, 32, 3), batch_size=1, name="image")
    x = k.layers.Conv2D(8, 3, padding="same", name="stem_conv")(inp)
    x = k.layers.BatchNormalization(name="stem_bn")(x)
    x = k.layers.ReLU(name="stem_relu")(x)
    x = k.layers.MaxPooling2D(2, name="pool1")(x)
    x = k.layers.Conv2D(16, 3, padding="same", activation="relu", name="block_conv")(x)
    x = k.layers.GlobalAveragePooling2D(name="gap")(x)
    out = k.layers.Dense(10, name="classifier")(x)
    km = k.Model(inp, out)
    spec = [tf.TensorSpec((1, 32, 32, 3), tf.float32, name="image")]
    mp, _ = tf2onnx.convert.from_keras(km, input_signature=spec, opset=18)
    onnx.save(mp, str(d / "keras.onnx"))

    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            x = torch.relu(self.bn(self.c1(x)))
            x = torch.nn.functional.max_pool2d(x, 2)
            x = torch.relu(self.c2(x))
            return self.fc(x.mean((2, 3)))

    torch.manual_seed(0)
    torch.onnx.export(Net().eval(), (torch.zeros(1, 3, 32, 32),), str(d / "torch.onnx"), dynamo=True,
                      external_data=False)


@pytest.fixture(scope="session")
def yolo_path() -> Path:
    return cached_dir("test-diff-yolov8n160", cache_key("v1", VERSIONS), _build_yolo) / "model.onnx"


@pytest.fixture(scope="session")
def yolo_ort_path(yolo_path, tmp_path_factory) -> Path:
    import onnxruntime as ort

    out = tmp_path_factory.mktemp("ortopt") / "yolo_ext.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(yolo_path), so, providers=["CPUExecutionProvider"])
    return out


@pytest.fixture(scope="session")
def cnn_pair() -> tuple[Path, Path]:
    d = cached_dir("test-diff-cnn-pair", cache_key("v1", VERSIONS), _build_cnn_pair)
    return d / "keras.onnx", d / "torch.onnx"


def _fp16(model, **kw):
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(copy.deepcopy(model), keep_io_types=True, **kw)


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
    assert sorted(x for r in fused
                  for x in r.b_nodes) == sorted(n.name for n in b.graph.node if n.op_type == "QuickGelu")
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
    b = _fp16(a)
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
    assert 0 < w.max_abs_diff <= np.abs(wa).max() * 2.0 ** -11


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


# ------------------------------------------------------------------------------------------------
# anchors, stages, runs
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def anchored(yolo_path, tmp_path_factory):
    from anpred.instrument import instrument_model

    m = onnx.load(str(yolo_path))
    am, man = instrument_model(m, stages=6)
    d = tmp_path_factory.mktemp("anch")
    onnx.save(am, str(d / "a.onnx"))
    # B: the same anchored model with the Conv nodes of stages >= 3 quantized to int8 QDQ by ONNX
    # Runtime's static quantizer (calibrated on two random images); stages 0-2 stay untouched
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{m.graph.input[0].name: rng.random((1, 3, 160, 160), dtype=np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.it, None)

    first = man.stages[3].first
    late = [n.name for i, n in enumerate(am.graph.node) if i >= first and n.op_type == "Conv"]
    quantize_static(str(d / "a.onnx"), str(d / "b.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    nodes_to_quantize=late, op_types_to_quantize=["Conv"])
    return d / "a.onnx", d / "b.onnx", man


def test_stages_and_anchor_correspondence(anchored):
    pa, pb, man = anchored
    d = diff_files(pa, pb)
    assert [s.index for s in d.stages] == [s.index for s in man.stages]
    # Q/DQ pairs inserted in front of the quantized Convs (stages >= 3) and in front of everything
    # else that reads the same activations (the quantizer rewires those readers too); stages 0-1
    # untouched
    by = {s.index: s for s in d.stages}
    assert all(by[i].changed == 0 and not by[i].regions for i in (0, 1))
    assert all(by[i].regions for i in range(3, len(man.stages)))
    assert {r.kind for r in d.regions} == {"inserted"}
    ins = d.insertions()
    assert set(ins) == {"QuantizeLinear", "DequantizeLinear"} and ins["DequantizeLinear"] > ins["QuantizeLinear"]
    assert {a.anchor for a in d.anchors} == set(man.names())
    assert all(a.status in ("exact", "equivalent") for a in d.anchors)
    quantized = [a for a in d.anchors if a.transform and a.transform.get("quantized")]
    assert quantized and min(a.stage for a in quantized) == min(r.stage for r in d.regions)


@pytest.mark.isa_independent(FP32_BOUND)
def test_run_diff_names_first_moved_anchor(anchored, tmp_path):
    from anpred.diff import RunDiff, diff_runs
    from anpred.run import run_model

    pa, pb, man = anchored
    inputs = "random:uniform:seed=3:n=2"
    run_model(pa, ["ort"], inputs, tmp_path / "ra", progress=False)
    run_model(pb, ["ort"], inputs, tmp_path / "rb", progress=False)
    run_model(pa, ["ort"], inputs, tmp_path / "ra2", progress=False)
    same = diff_runs(tmp_path / "ra", tmp_path / "ra2")
    assert not same.moved and len(same.samples) == 2
    assert all(c.value <= c.floor for a in same.anchors for c in a.cells)
    rd = diff_runs(tmp_path / "ra", tmp_path / "rb")
    # the first anchor that moved is the first one that the structural diff sees behind a Q/DQ pair
    order = {a.name: a.order for a in man.anchors}
    quantized = sorted((order[a.anchor], a.anchor) for a in rd.graph.anchors
                       if a.transform and a.transform.get("quantized"))
    assert rd.moved and rd.first_moved["anchor"] == quantized[0][1], rd.summary()
    for a in rd.anchors:
        assert a.cells, a.missing
        if a.order < quantized[0][0]:
            assert not a.moved and a.cells[0].value < 1e-6
    assert rd.graph.insertions().get("QuantizeLinear", 0) > 0
    assert RunDiff.from_dict(json.loads(json.dumps(rd.to_dict()))).first_moved == rd.first_moved
    # CLI: exit 1 on a difference, JSON and HTML written
    from anpred.cli import main

    rc = main(["diff", str(tmp_path / "ra"), str(tmp_path / "rb"), "--json", str(tmp_path / "d.json"),
               "--html", str(tmp_path / "d.html"), "-q"])
    assert rc == 1
    assert json.loads((tmp_path / "d.json").read_text())["first_moved"]["anchor"] == rd.first_moved["anchor"]
    assert rd.first_moved["anchor"] in (tmp_path / "d.html").read_text()


def test_cli_graph_diff_and_bad_input(yolo_path, yolo_ort_path, tmp_path, capsys):
    from anpred.cli import main

    assert main(["diff", str(yolo_path), str(yolo_path)]) == 0
    assert "identical" in capsys.readouterr().out
    rc = main(["diff", str(yolo_path), str(yolo_ort_path), "--json", str(tmp_path / "g.json"),
               "--html", str(tmp_path / "g.html")])
    assert rc == 1 and "QuickGelu" in capsys.readouterr().out
    assert "QuickGelu" in (tmp_path / "g.html").read_text()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["diff", str(yolo_path), str(bad), "--json", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
    assert main(["diff", str(yolo_path), str(tmp_path)]) == 2
    assert "both" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# regressions from the review of issue 8
# ------------------------------------------------------------------------------------------------
def _ort_optimised(src: Path, dst: Path, level: str) -> Path:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return dst


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


def test_fp16_keep_io_anchors_are_equivalent_dtype(anchored):
    pa, _pb, man = anchored
    a = onnx.load(str(pa))
    same = diff_models(a, copy.deepcopy(a)).anchors
    assert {x.status for x in same} == {"exact"} and len(same) == len(man.anchors)
    b = _fp16(a)
    d = diff_models(a, b)
    # every anchor output of B is an fp16 value cast back to float32 by an inserted Cast
    assert len(d.anchors) == len(man.anchors)
    for x in d.anchors:
        assert (x.status, x.transform) == ("equivalent", {"dtype": "float16"}), x
    exposed = [x for x in d.anchors if x.anchor in {o.name for o in b.graph.output}]
    assert exposed and all("Cast from float16" in x.reason for x in exposed if x.reason.startswith("exposed"))


def test_stages_placed_by_anchor_values_in_an_optimisers_copy(yolo_path, anchored, tmp_path):
    pa, _pb, man = anchored
    ext = _ort_optimised(pa, tmp_path / "anch_ext.onnx", "ORT_ENABLE_EXTENDED")
    assert onnx.load(str(ext)).metadata_props  # the manifest survives in the copy's metadata
    # the reviewer's case: plain model vs the optimiser's copy of the anchored one
    d = diff_files(yolo_path, ext)
    assert [s.index for s in d.stages] == [s.index for s in man.stages]
    # each matched node sits in the stage the manifest's node slices give it in the anchored graph
    a = onnx.load(str(pa))
    pos_stage = {}
    for k, nd in enumerate(a.graph.node):  # (the anchors' exposing Identity nodes lie outside the slices)
        for s in man.stages:
            if s.first <= k <= s.last:
                pos_stage[nd.name] = s.index
    assert len(pos_stage) > 200
    d2 = diff_files(pa, ext)
    b_stage = {item.split(":")[1]: st.index for st in d2.stages for item in st.b_ops}
    a_stage = {item.split(":")[1]: st.index for st in d2.stages for item in st.a_ops}
    assert {n: a_stage[n] for n in pos_stage} == pos_stage  # A itself: positions and values agree
    both = [n for n in b_stage if n in pos_stage]
    assert len(both) > 100
    assert {n: b_stage[n] for n in both} == {n: pos_stage[n] for n in both}


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
    allopt = _ort_optimised(yolo_path, tmp_path / "all.onnx", "ORT_ENABLE_ALL")
    b = onnx.load(str(allopt))
    nchwc = [n for n in b.graph.node if n.domain == "com.microsoft.nchwc"]
    assert len(nchwc) > 40
    d = diff_files(yolo_path, allopt)
    spelled = [(m.a, c.what, c.a, c.b) for m in d.changed for c in m.changes
               if c.kind == "attribute" and c.what in ("auto_pad", "group", "ceil_mode", "storage_order")]
    assert spelled == []
    doms = [m for m in d.changed if any(c.kind == "domain" for c in m.changes)]
    assert len(doms) == sum(n.name in {m.b for m in doms} for n in nchwc) > 40


def test_graph_io_by_name_and_opset_changes(anchored, tmp_path):
    from anpred.instrument import instrument_model

    pa, _pb, man = anchored
    a = onnx.load(str(pa))
    base = onnx.load(str(pa))
    for k in range(len(base.graph.output) - 1, -1, -1):
        if base.graph.output[k].name in set(man.names()) - {x.name for x in man.anchors if x.kind == "output"}:
            del base.graph.output[k]
    # same model with another anchor set (4 stages instead of 6): outputs differ only by anchors
    other, man4 = instrument_model(base, stages=4)
    d = diff_models(a, other)
    kinds = Counter(c.kind for c in d.io)
    assert set(kinds) == {"graph_output"}
    only_a = {c.a for c in d.io if c.a}
    only_b = {c.b for c in d.io if c.b}
    outs_a, outs_b = {o.name for o in a.graph.output}, {o.name for o in other.graph.output}
    assert only_a == outs_a - outs_b and only_b == outs_b - outs_a and only_a and only_b
    # a renamed graph input is one rename; an opset bump is reported per domain
    b = copy.deepcopy(a)
    old = b.graph.input[0].name
    for n in b.graph.node:
        n.input[:] = ["image" if x == old else x for x in n.input]
    b.graph.input[0].name = "image"
    b.opset_import[0].version += 1
    d = diff_models(a, b)
    assert [(c.kind, c.a, c.b) for c in d.io] == [("renamed", old, "image")]
    v = a.opset_import[0].version
    assert [(c.kind, c.what, c.a, c.b) for c in d.opset] == [("opset", a.opset_import[0].domain or "ai.onnx", v, v + 1)]
    assert "opset imports" in d.summary()


@pytest.fixture(scope="session")
def fp16_runs(anchored, tmp_path_factory):
    """Runs of the anchored model (A) and of its fp16 conversion (B): stats mode and tensors mode."""
    from anpred.run import run_model

    pa, _pb, _man = anchored
    d = tmp_path_factory.mktemp("fp16runs")
    onnx.save(_fp16(onnx.load(str(pa))), str(d / "b16.onnx"))
    inputs = "random:uniform:seed=3:n=2"
    run_model(pa, ["ort"], inputs, d / "sa", mode="stats", progress=False)
    run_model(d / "b16.onnx", ["ort"], inputs, d / "sb", mode="stats", progress=False)
    run_model(pa, ["ort"], inputs, d / "ta", progress=False)
    run_model(d / "b16.onnx", ["ort"], inputs, d / "tb", progress=False)
    return d


@pytest.mark.isa_independent(SAME_DATA)
def test_stats_mode_runs_are_compared_by_summaries(fp16_runs, anchored, tmp_path, capsys):
    from anpred.cli import main
    from anpred.diff import diff_runs

    d = fp16_runs
    _pa, _pb, man = anchored
    rs = diff_runs(d / "sa", d / "sb")  # the reviewer's case: was "no difference" with 0 cells
    assert rs.mode == "stats" and rs.statistic == "nrmse_lb"
    assert rs.compared == len(man.anchors) and not rs.not_compared()
    rt = diff_runs(d / "ta", d / "tb")
    assert rt.mode == "tensors" and rt.compared == len(man.anchors)
    nrmse = {a.anchor: a.cells[0].value for a in rt.anchors}
    lb = {a.anchor: a.cells[0].value for a in rs.anchors}
    # the summary statistic is a lower bound of the tensors' nRMSE, and not a vacuous one
    for k in lb:
        assert 0 <= lb[k] <= nrmse[k] * (1 + 1e-9) + 1e-15, (k, lb[k], nrmse[k])
    assert sum(v > 0 for v in lb.values()) >= len(lb) - 1
    # its value, recomputed from the stored tensors of the worst sample
    a0 = rs.anchors[0]
    from anpred.run import RunStore

    sid = a0.cells[0].worst_sample
    xa = RunStore.open(d / "ta").read_anchors("ort", sid)[a0.anchor].astype(np.float64)
    xb = RunStore.open(d / "tb").read_anchors("ort", sid)[a0.anchor].astype(np.float64)
    rms = lambda x: np.sqrt(np.mean(x * x))  # noqa: E731
    want = max(abs(xb.mean() - xa.mean()), abs(xb.std() - xa.std()), abs(rms(xb) - rms(xa))) / rms(xa)
    assert a0.cells[0].value == pytest.approx(want, rel=1e-6)
    # a tensors run against a stats run: the tensors side is summarised the same way
    rm = diff_runs(d / "ta", d / "sb")
    assert rm.mode == "stats" and {a.anchor: a.cells[0].value for a in rm.anchors} == pytest.approx(lb, rel=1e-6)
    # the fp16 model moved; a stats run against the same model's tensors run did not
    assert rs.moved and rs.first_moved["statistic"] == "nrmse_lb"
    same = diff_runs(d / "ta", d / "sa")
    assert not same.moved and same.compared == len(man.anchors)
    assert max(c.value for a in same.anchors for c in a.cells) < 1e-9
    assert main(["diff", str(d / "sa"), str(d / "sb"), "-q"]) == 1


def test_run_diff_refuses_when_nothing_was_compared(fp16_runs, tmp_path, capsys):
    import shutil

    from anpred.cli import main
    from anpred.errors import JudgeError
    from anpred.diff import diff_runs

    d = fp16_runs
    pruned = tmp_path / "pruned"
    shutil.copytree(d / "tb", pruned)
    shutil.rmtree(pruned / "tensors" / "ort")  # tensors cleaned up after the run
    with pytest.raises(JudgeError, match="no anchor could be compared.*not stored by ort in run B"):
        diff_runs(d / "ta", pruned)
    assert main(["diff", str(d / "ta"), str(pruned), "--json", str(tmp_path / "x.json")]) == 2
    assert "nothing was compared" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    # partly pruned: the rest is compared, the missing cells are shown with their reason
    shutil.copytree(d / "tb" / "tensors" / "ort", pruned / "tensors" / "ort")
    from anpred.run import RunStore

    ps = RunStore.open(pruned)
    for sid in ("s0001", "s0000"):  # drop the first anchor of one sample, then of the other
        kept = dict(list(ps.read_anchors("ort", sid).items())[1:])
        ps.write_anchors("ort", sid, kept)
        assert list(ps.read_anchors("ort", sid)) == list(kept)
        if sid == "s0001":
            rd = diff_runs(d / "ta", pruned)
            assert rd.compared == len(rd.anchors)  # sample s0000 still has every anchor
    rd = diff_runs(d / "ta", pruned)
    (gone,) = [a for a in rd.anchors if not a.cells]
    assert gone.missing == {"ort": "not stored by ort in run B"}
    assert f"{gone.anchor} on ort: not stored by ort in run B" in rd.summary()
    from anpred.report.diff_html import render_diff_html

    assert "not stored by ort in run B" in render_diff_html(runs=rd)


@pytest.mark.isa_independent(SAME_DATA)
def test_run_diff_backend_pairs(anchored, fp16_runs, tmp_path):
    from anpred.cli import main
    from anpred.defaults import OracleConfig
    from anpred.errors import JudgeError
    from anpred.diff import diff_runs
    from anpred.judge import error_stats
    from anpred.run import RunStore, run_model

    pa, _pb, man = anchored
    d = fp16_runs
    run_model(pa, ["ort-fp16"], "random:uniform:seed=3:n=2", tmp_path / "rf", progress=False)
    with pytest.raises(JudgeError, match=r"no backend is ok in both runs.*--pair"):
        diff_runs(d / "ta", tmp_path / "rf")
    with pytest.raises(JudgeError, match="ort-fp16: not in run A"):
        diff_runs(d / "ta", tmp_path / "rf", backends=["ort-fp16"])
    rd = diff_runs(d / "ta", tmp_path / "rf", pairs={"ort": "ort-fp16"})
    assert rd.backends == ["ort=ort-fp16"] and rd.pairs == [["ort", "ort-fp16"]]
    assert rd.compared == len(man.anchors)
    cfg = OracleConfig()
    out = next(a for a in rd.anchors if a.anchor.startswith("output/"))
    c = out.cells[0]
    assert c.floor == cfg.floor_at("fp16", out.stage)
    xa = RunStore.open(d / "ta").read_anchors("ort", c.worst_sample)[out.anchor]
    xb = RunStore.open(tmp_path / "rf").read_anchors("ort-fp16", c.worst_sample)[out.anchor]
    assert c.value == pytest.approx(error_stats(xb, xa).nrmse, rel=1e-9) and c.value > 0
    rc = main(["diff", str(d / "ta"), str(tmp_path / "rf"), "--pair", "ort=ort-fp16", "--json",
               str(tmp_path / "p.json")])
    assert rc in (0, 1) and json.loads((tmp_path / "p.json").read_text())["backends"] == ["ort=ort-fp16"]
    assert main(["diff", str(d / "ta"), str(tmp_path / "rf"), "--pair", "ort"]) == 2


def test_cli_run_only_options_and_file_modes(yolo_path, yolo_ort_path, tmp_path, capsys):
    import os

    from anpred.cli import main

    for extra in (["--pair", "ort=ort-fp16"], ["--backends", "ort"], ["--config", str(tmp_path / "c.toml")]):
        assert main(["diff", str(yolo_path), str(yolo_ort_path), "--json", str(tmp_path / "n.json"), *extra]) == 2
        assert "only apply to a diff of two run folders" in capsys.readouterr().err
        assert not (tmp_path / "n.json").exists()
    old = os.umask(0o022)
    try:
        assert main(["diff", str(yolo_path), str(yolo_ort_path), "-q", "--json", str(tmp_path / "g.json"),
                     "--html", str(tmp_path / "g.html")]) == 1
    finally:
        os.umask(old)
    for f in ("g.json", "g.html"):
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o644
