"""The instrumentation compiler on real models: YOLOv8n / YOLOv5nu (dynamo and TorchScript exports),
the trained PP-OCRv4 det/rec models shipped in rapidocr_onnxruntime, a Keras CNN through tf2onnx and a
synthetic >10,000-node graph. Every anchored model passes the full ONNX checker and runs in ONNX
Runtime; stages are contiguous slices closed by true cuts; the original outputs do not change.

Exports are cached with anpred.cache (kind ``test-instrument``), so only the first session pays.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from anpred.cli import instrument_main
from anpred.instrument import default_manifest_path, instrument_file, instrument_model
from anpred.manifest import AnchorManifest
from anpred.naming import output_anchor_name

from isa_reasons import NOT_A_KERNEL_VALUE, SAME_DATA

IMGSZ = 160


# ------------------------------------------------------------------------------------------------
# model builders (cached)
# ------------------------------------------------------------------------------------------------
def yolo_onnx(cfg: str, dynamo: bool, size: int = IMGSZ) -> Path:
    """ultralytics ``cfg`` (seeded random weights, one-output export head) exported by torch."""
    from anpred.cache import cache_key, cached_dir

    key = cache_key("test-instrument-yolo/1", cfg, dynamo, size, md.version("torch"), md.version("ultralytics"),
                    md.version("onnx"))

    def build(tmp: Path) -> None:
        import torch

        from anpred.compat import import_ultralytics

        import_ultralytics()
        from ultralytics import YOLO

        torch.manual_seed(0)
        model = YOLO(cfg).model.eval()
        head = model.model[-1]
        head.export, head.format = True, "onnx"
        x = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        kw = {"external_data": False} if dynamo else {"dynamo": False}
        torch.onnx.export(model, (x,), str(tmp / "model.onnx"), **kw)

    return cached_dir("test-instrument", key, build) / "model.onnx"


KERAS_LAYERS = ["conv1", "bn1", "relu1", "conv2", "add1", "pool1", "conv3", "gap", "logits"]


def keras_onnx() -> Path:
    """A small functional Keras CNN (conv, BN, residual add, pooling, dense) through tf2onnx."""
    from anpred.cache import cache_key, cached_dir

    vers = []
    for p in ("tensorflow-cpu", "keras", "tf2onnx", "onnx"):
        try:
            vers.append(md.version(p))
        except md.PackageNotFoundError:
            vers.append(None)
    key = cache_key("test-instrument-keras/1", vers)

    def build(tmp: Path) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import keras
        import tensorflow as tf
        import tf2onnx

        keras.utils.set_random_seed(0)
        L = keras.layers
        inp = keras.Input((32, 32, 3), batch_size=1, name="image")
        x = L.Conv2D(8, 3, padding="same", name="conv1")(inp)
        x = L.BatchNormalization(name="bn1")(x)
        x = L.ReLU(name="relu1")(x)
        y = L.Conv2D(8, 3, padding="same", activation="relu", name="conv2")(x)
        x = L.Add(name="add1")([x, y])
        x = L.MaxPooling2D(name="pool1")(x)
        x = L.Conv2D(16, 3, padding="same", activation="relu", name="conv3")(x)
        x = L.GlobalAveragePooling2D(name="gap")(x)
        x = L.Dense(10, name="logits")(x)
        model = keras.Model(inp, x, name="smallcnn")
        spec = [tf.TensorSpec((1, 32, 32, 3), tf.float32, name="image")]
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(tmp / "model.onnx"))

    return cached_dir("test-instrument", key, build) / "model.onnx"


def ppocr_onnx(which: str) -> Path:
    """The trained PP-OCRv4 det/rec model inside the rapidocr_onnxruntime wheel (not imported)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    assert spec is not None, "rapidocr_onnxruntime is not installed"
    folder = Path(next(iter(spec.submodule_search_locations))) / "models"
    return folder / f"ch_PP-OCRv4_{which}_infer.onnx"


def synthetic_onnx(tmp: Path, nodes: int = 10_500, kind: str = "conv") -> Path:
    import onnx

    from passes.synthetic import skip_chain_model

    p = tmp / f"skip_chain_{kind}_{nodes}.onnx"
    if not p.exists():
        onnx.save(skip_chain_model(nodes, kind=kind), str(p))
    return p


MODELS = {
    "yolov8n-dynamo": lambda tmp: yolo_onnx("yolov8n.yaml", True),
    "yolov8n-torchscript": lambda tmp: yolo_onnx("yolov8n.yaml", False),
    "yolov5nu-dynamo": lambda tmp: yolo_onnx("yolov5nu.yaml", True),
    "yolov5nu-torchscript": lambda tmp: yolo_onnx("yolov5nu.yaml", False),
    "ppocrv4-det": lambda tmp: ppocr_onnx("det"),
    "ppocrv4-rec": lambda tmp: ppocr_onnx("rec"),
    "keras-cnn-tf2onnx": lambda tmp: keras_onnx(),
    "synthetic-10k": lambda tmp: synthetic_onnx(tmp),
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("instrument-models")


@pytest.fixture(scope="session")
def model_path(model_dir):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = MODELS[name](model_dir)
        return cache[name]

    return get


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def feeds_for(sess, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every model input; symbolic dims: batch 1, others 64 (rec height fixed 48)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else (1 if k == 0 else 64) for k, d in enumerate(i.shape)]
        out[i.name] = rng.random(shape, dtype=np.float32)
    return out


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
        assert all(d is None or isinstance(d, str) or d == s
                   for d, s in zip(a.shape, arr.shape)), (a.name, a.shape, arr.shape)
    print(f"{name}: {manifest.partition['num_nodes']} nodes, {len(manifest.stages)} stages, {len(inner)} anchors: "
          f"{', '.join(a.name for a in inner)}")


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
    print(f"observer effect, YOLOv8n 160x160, ORT {ort.__version__}: max |plain - anchored| = {worst:.3g} "
          f"over 3 inputs ({sum(x.kind != 'output' for x in manifest.anchors)} anchors)")
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
    onnx.save(onnx.load(str(model_path("yolov8n-dynamo"))), str(src_dir / "m.onnx"), save_as_external_data=True,
              location="m.weights")
    assert (src_dir / "m.weights").stat().st_size > 10_000_000
    man = instrument_file(src_dir / "m.onnx", src_dir / "anchored.onnx")
    assert sorted(p.name for p in src_dir.iterdir()) == ["anchored.anchors.json", "anchored.onnx", "m.onnx",
                                                         "m.weights"]
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
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Tanh", ["r"], ["t"], name="tanh"), helper.make_node("Sigmoid", ["t"], ["y"], name="sig")]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3600])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3600])], initializer=[w])
    folder.mkdir()
    path = folder / "big.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, location="big.onnx.data", size_threshold=1024)
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
    rc, err, _ = _cli_child([str(src), "-o", str(out_dir / "a.onnx"), "--copy-external-data", "--manifest",
                             "/proc/m.json"])
    assert rc == 2 and "/proc" in err, err
    assert list(out_dir.iterdir()) == []
    # next to the source: the reference for peak memory (weights neither loaded nor copied)
    rc, err, rss_ref = _cli_child([str(src), "-o", str(src.parent / "ref.onnx")])
    assert rc == 0, err
    rc, err, rss_copy = _cli_child([str(src), "-o", str(out_dir / "a.onnx"), "--copy-external-data", "--stages", "3"])
    assert rc == 0, err
    weights = (src.parent / "big.onnx.data").stat().st_size
    print(f"peak RSS: referenced {rss_ref / 1e6:.1f} MB, copied {rss_copy / 1e6:.1f} MB "
          f"(weights {weights / 1e6:.1f} MB)")
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
    assert onnx.load(str(out_dir / "a.onnx"),
                     load_external_data=False).graph.initializer[0].external_data[0].value == "a.onnx.data"


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
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Sigmoid", ["a"], ["b"], name="s1"),
             helper.make_node("Tanh", ["b"], ["c"], name="t1"), helper.make_node("Relu", ["c"], ["y"], name="r2")]
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
    noin = helper.make_model(helper.make_graph([c, helper.make_node("Relu", ["k"], ["y"])], "g", [],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    onnx.save(noin, str(tmp / "noinputs.onnx"))
    cases["no-inputs"] = ([str(tmp / "noinputs.onnx")], "no inputs")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    cyc = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
         helper.make_node("Relu", ["a"], ["y"], name="n3")], "g", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    onnx.save(cyc, str(tmp / "cycle.onnx"))
    cases["cycle"] = ([str(tmp / "cycle.onnx")], "cycle")
    cases["unknown-anchor"] = ([str(ext / "m.onnx"), "--anchor", "nope"], "'nope'")
    cases["missing-folder"] = ([str(ext / "m.onnx"), "-o", str(tmp / "no" / "such" / "out.onnx")], "does not exist")
    cases["output-is-folder"] = ([str(ext / "m.onnx"), "-o", str(ext)], "folder")
    cases["no-such-file"] = ([str(tmp / "absent.onnx")], "no such file")
    cases["model-is-folder"] = ([str(ext)], "is a folder")
    onnx.save(onnx.load(str(yolo)), str(ext / "x.onnx"), save_as_external_data=True, location="x.bin")
    cases["output-is-the-weights"] = ([str(ext / "x.onnx"), "-o", str(ext / "x.bin")], "external weight files")
    noout = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="r")], "g", [x], []),
                              opset_imports=[helper.make_opsetid("", 17)])
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
    rc = instrument_main([str(src), "-o", str(tmp_path / "a.onnx"), "--stages", "5", "--anchor", target,
                          "--manifest", str(tmp_path / "m.json")])
    out = capsys.readouterr().out
    assert rc == 0
    man = AnchorManifest.load(tmp_path / "m.json")
    inner = sum(a.kind != "output" for a in man.anchors)
    assert f"5 stages, {inner} anchors + 1 output = {len(man.anchors)} in the manifest" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "m.json"]
    assert len(man.stages) == 5 and man.by_value()[target].kind == "explicit"
    assert man.by_value()[target].scope == "model.4"
