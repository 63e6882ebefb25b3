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
from anpred.graphdiff import GraphDiff, diff_files, diff_models

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
    assert sorted(x for r in fused for x in r.b_nodes) == sorted(n.name for n in b.graph.node if n.op_type == "QuickGelu")
    assert len(d.only_a) == 2 * n_qg and sum(r.op_type == "Sigmoid" for r in d.only_a) == n_qg < n_sig_a
    assert d.matched == len(b.graph.node) - n_qg
    # all Conv nodes kept, unchanged
    assert not d.changed
    assert d.summary().count("QuickGelu") >= 1
    d2 = GraphDiff.from_dict(json.loads(json.dumps(d.to_dict())))
    assert d2 == d


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


def test_run_diff_names_first_moved_anchor(anchored, tmp_path):
    from anpred.rundiff import RunDiff, diff_runs
    from anpred.runner import run_model

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
