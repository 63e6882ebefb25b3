"""The instrumentation compiler on real models (tests/instrument_models.py): YOLOv8n / YOLOv5nu (dynamo and
TorchScript exports), the trained PP-OCRv4 det/rec models shipped in rapidocr_onnxruntime, a Keras CNN
through tf2onnx and a synthetic >10,000-node graph. Every anchored model passes the full ONNX checker and
runs in ONNX Runtime; stages are contiguous slices closed by true cuts; the original outputs do not change.
External data, output files and the command line: tests/test_instrument_files.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from anpred.instrument import default_manifest_path, instrument_file, instrument_model
from anpred.manifest import AnchorManifest
from anpred.naming import output_anchor_name

from instrument_models import KERAS_LAYERS, MODELS, feeds_for


def data_values(model) -> set[str]:
    """Values that depend on the graph inputs through value-carrying ops (not only via Shape/Size)."""
    inits = {t.name for t in model.graph.initializer}
    data = {i.name for i in model.graph.input if i.name not in inits}
    for n in model.graph.node:  # file order is topological for every model here (checked)
        if n.op_type not in ("Shape", "Size") and any(v in data for v in n.input):
            data.update(v for v in n.output if v)
    return data


def assert_valid_partition(model, manifest: AnchorManifest) -> None:
    """Stages are contiguous non-empty slices covering all nodes, and each boundary is a cut: no node
    after it reads a data tensor produced before it unless the tensor is in the boundary or is a graph
    input/output."""
    nodes = list(model.graph.node)
    n = len(nodes)
    st = manifest.stages
    assert st and st[0].first == 0 and st[-1].last == n - 1
    for a, b in zip(st, st[1:]):
        assert b.first == a.last + 1
    for s in st:
        assert s.num_nodes == s.last - s.first + 1 > 0
    produced_at = {v: i for i, nd in enumerate(nodes) for v in nd.output}
    for i, nd in enumerate(nodes):
        assert all(produced_at.get(v, -1) < i for v in nd.input), f"file order not topological at {nd.name}"
    data = data_values(model)
    outputs = {o.name for o in model.graph.output}
    by_name = manifest.by_value()
    name_of = {a.name: a.value for a in manifest.anchors}
    # live nodes: reach an output
    live = [False] * n
    needed = set(outputs)
    for i in range(n - 1, -1, -1):
        if any(v in needed for v in nodes[i].output):
            live[i] = True
            needed.update(nodes[i].input)
    for s in st[:-1]:
        boundary = {name_of[b] for b in s.boundary}
        assert boundary and all(v in by_name for v in boundary)
        for j in range(s.last + 1, n):
            if not live[j]:
                continue
            for v in nodes[j].input:
                if v in data and v in produced_at and produced_at[v] <= s.last and v not in outputs:
                    assert v in boundary, f"stage {s.index}: node {nodes[j].name} reads {v} across the cut"


def instrumented(model_path, name, tmp_path_factory):
    src = model_path(name)
    out = tmp_path_factory.mktemp("anchored") / "anchored.onnx"
    manifest = instrument_file(src, out)
    return src, out, manifest


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_real_model_is_instrumented(name, model_path, tmp_path_factory):
    import onnx
    import onnxruntime as ort

    src, out, manifest = instrumented(model_path, name, tmp_path_factory)
    onnx.checker.check_model(str(out), full_check=True)
    plain = onnx.load(str(src), load_external_data=False)
    anchored = onnx.load(str(out), load_external_data=False)

    # manifest: stored in the model and next to it, anchors in topological order, outputs last
    assert AnchorManifest.from_model(anchored) == manifest == AnchorManifest.load(default_manifest_path(out))
    inner = [a for a in manifest.anchors if a.kind != "output"]
    outs = [a for a in manifest.anchors if a.kind == "output"]
    assert len(manifest.stages) >= 3 and len(inner) >= 2, manifest.stages
    assert [a.order for a in inner] == sorted(a.order for a in inner)
    assert [a.value for a in outs] == [o.name for o in plain.graph.output]
    assert [a.name for a in outs] == [output_anchor_name(o.name) for o in plain.graph.output]
    assert all(a.stage == manifest.stages[-1].index for a in outs)
    assert [o.name for o in anchored.graph.output] == [o.name for o in plain.graph.output] + [a.name for a in inner]
    data = data_values(plain)
    assert all(a.value in data for a in inner), "a constant/shape-only tensor became an anchor"
    assert_valid_partition(plain, manifest)

    # ONNX Runtime runs it; anchors come back with the manifest's dtype and static dims
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    res = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds_for(sess))))
    for a in inner:
        arr = res[a.name]
        assert arr.dtype == np.dtype(a.dtype) and np.isfinite(arr).all()
        assert len(arr.shape) == len(a.shape)
        assert all(d is None or isinstance(d, str) or d == s for d, s in zip(a.shape, arr.shape)), (
            a.name,
            a.shape,
            arr.shape,
        )
    print(
        f"{name}: {manifest.partition['num_nodes']} nodes, {len(manifest.stages)} stages, {len(inner)} anchors: "
        f"{', '.join(a.name for a in inner)}"
    )


def test_observer_effect_yolov8n(model_path, tmp_path_factory):
    """Anchoring does not change the original output on ONNX Runtime (all optimizations on)."""
    import onnxruntime as ort

    src, out, manifest = instrumented(model_path, "yolov8n-dynamo", tmp_path_factory)
    plain = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    anch = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    worst = 0.0
    for seed in range(3):
        feeds = feeds_for(plain, seed)
        a = plain.run(None, feeds)[0]
        b = anch.run([plain.get_outputs()[0].name], feeds)[0]
        assert a.shape == b.shape == (1, 84, 525)
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    print(
        f"observer effect, YOLOv8n 160x160, ORT {ort.__version__}: max |plain - anchored| = {worst:.3g} "
        f"over 3 inputs ({sum(x.kind != 'output' for x in manifest.anchors)} anchors)"
    )
    assert worst == 0.0


def test_yolov8n_anchors_are_module_outputs_in_both_exports(model_path):
    """Both torch exporters give the same stage boundaries, labelled with ultralytics module paths."""
    import onnx

    mans = {}
    for name in ("yolov8n-dynamo", "yolov8n-torchscript"):
        _, mans[name] = instrument_model(onnx.load(str(model_path(name))), stages=8)
    dyn, ts = mans["yolov8n-dynamo"], mans["yolov8n-torchscript"]
    assert dyn.partition["framework"] == "torch-dynamo" and ts.partition["framework"] == "torch-script"
    scopes = [a.scope for a in dyn.anchors if a.kind == "boundary"]
    assert sum(s.startswith("model.") for s in scopes) >= 6, scopes
    assert scopes == [a.scope for a in ts.anchors if a.kind == "boundary"]
    for a in dyn.anchors:
        if a.scope and a.kind != "output":
            assert a.name.endswith("/" + a.scope)
        if len(a.shape) == 4:
            assert a.layout == "NCHW"
    # YOLO's neck: some boundary carries the three feature maps side by side (P3/P4/P5)
    assert any({"model.15", "model.18", "model.21"} <= {dyn[b].scope for b in s.boundary} for s in dyn.stages)


def test_keras_anchors_carry_layer_names(model_path):
    import onnx

    _, man = instrument_model(onnx.load(str(model_path("keras-cnn-tf2onnx"))), stages=4)
    assert man.partition["framework"] == "tf2onnx"
    scoped = [a for a in man.anchors if a.kind == "boundary" and a.scope]
    assert scoped and all(a.scope in KERAS_LAYERS for a in scoped), [a.scope for a in man.anchors]
    assert all(a.layout == "NCHW" for a in scoped if len(a.shape) == 4)


def test_idempotent_and_pure(model_path, tmp_path):
    import onnx

    from passes.anchors import AnchorInsertionPass
    from passes.partition import StagePartitioner

    src = model_path("yolov8n-torchscript")
    model = onnx.load(str(src))
    before = model.SerializeToString()
    m1, man1 = instrument_model(model, stages=6)
    assert model.SerializeToString() == before  # pure
    m2, man2 = instrument_model(m1, stages=6)
    assert m2.SerializeToString() == m1.SerializeToString() and man2 == man1
    part = StagePartitioner(6).propose(m1)
    r = AnchorInsertionPass(part, man1.model)(m1)
    assert r.modified is False and r.model is m1
    # other options replace the earlier instrumentation instead of stacking on it
    m3, man3 = instrument_model(m1, stages=3)
    assert len(man3.stages) == 3
    n_anchor_nodes = sum(n.name.startswith("anpred/") for n in m3.graph.node)
    assert n_anchor_nodes == sum(a.kind != "output" for a in man3.anchors)
    # files: instrumenting the anchored file again writes the same bytes
    a1, a2 = tmp_path / "a1.onnx", tmp_path / "a2.onnx"
    instrument_file(src, a1)
    instrument_file(a1, a2)
    assert a1.read_bytes() == a2.read_bytes()
