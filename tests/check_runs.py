"""Small CNNs and their runs for the ``anpred check`` tests (tests/test_check_*.py, test_wider_population.py):
networks holding real OpenVINO 2026.4.1 defects (Softplus below -10, AveragePool ceil_mode/count_include_pad),
a sigmoid and a plain CNN, a two-branch CNN, and :func:`make_run`, which writes a RunStore with the real
backends (ort, ort-noopt, openvino, onnx-reference, torch via onnx2torch, tf via onnx2tf) one backend at a
time, as the run driver does. ``softplus_run``, ``avgpool_run`` and ``clean_run`` (conftest.py, session
scope) run them once.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from anpred.backends import backend_class
from anpred.instrument import instrument_model
from anpred.onnx_io import save_model
from anpred.run import RunStore

BACKENDS = ["ort", "ort-noopt", "openvino", "onnx-reference", "torch", "tf"]
CLEAN_BACKENDS = BACKENDS[:-1]  # clean fp32 with tf: tests/test_check_yolo.py


# ---- models ----------------------------------------------------------------------------------------
def conv_layer(name, x, y, cin, cout, rng, k=3, stride=1, pad=1, bias=0.0, scale=None):
    w = (rng.standard_normal((cout, cin, k, k)) * (scale or 1.0 / np.sqrt(cin * k * k))).astype(np.float32)
    b = (bias + 0.05 * rng.standard_normal(cout)).astype(np.float32)
    node = h.make_node(
        "Conv", [x, f"{name}.w", f"{name}.b"], [y], name=name, kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4
    )
    return node, [nh.from_array(w, f"{name}.w"), nh.from_array(b, f"{name}.b")]


def cnn_model(name, chain, in_shape, out_shape, stages):
    nodes, inits = [], []
    for n, i in chain:
        nodes.append(n)
        inits += i
    g = h.make_graph(
        nodes,
        name,
        [h.make_tensor_value_info("x", T.FLOAT, in_shape)],
        [h.make_tensor_value_info("y", T.FLOAT, out_shape)],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return instrument_model(m, stages=stages)


def _activation_cnn(op: str, value: str, bias: float, seed: int):
    """conv -> relu -> conv (bias ``bias``: the activation's inputs far below 0) -> ``op`` (output
    ``value``) -> conv -> relu -> conv."""
    rng = np.random.default_rng(seed)
    chain = [
        conv_layer("c0", "x", "t0", 3, 8, rng),
        (h.make_node("Relu", ["t0"], ["r0"], name="relu0"), []),
        conv_layer("c1", "r0", "t1", 8, 8, rng, bias=bias, scale=0.3),
        (h.make_node(op, ["t1"], [value], name=op.lower()), []),
        conv_layer("c2", value, "t2", 8, 8, rng),
        (h.make_node("Relu", ["t2"], ["r2"], name="relu2"), []),
        conv_layer("c3", "r2", "y", 8, 4, rng),
    ]
    return cnn_model(f"{op.lower()}_cnn", chain, [1, 3, 16, 16], [1, 4, 16, 16], 7)


def softplus_cnn():
    """Softplus inputs mostly in [-20, -10] (bias -15)."""
    return _activation_cnn("Softplus", "sp", -15.0, 0)


def sigmoid_cnn():
    """Sigmoid inputs mostly in [-21, -11] (bias -16): outputs are probabilities of 1e-9..1e-5, like a
    random-weight detector's class scores."""
    return _activation_cnn("Sigmoid", "sg", -16.0, 3)


def avgpool_cnn():
    """conv (stride 2: 8x8 -> 4x4) -> relu -> AveragePool(k3, s2, p1, ceil_mode=1, count_include_pad=1) -> conv -> relu
    -> conv."""
    rng = np.random.default_rng(1)
    pool = h.make_node(
        "AveragePool",
        ["r0"],
        ["p"],
        name="avgpool",
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
        count_include_pad=1,
    )
    chain = [
        conv_layer("c0", "x", "t0", 3, 8, rng, stride=2, bias=0.5),
        (h.make_node("Relu", ["t0"], ["r0"], name="relu0"), []),
        (pool, []),
        conv_layer("c1", "p", "t1", 8, 8, rng, k=1, pad=0),
        (h.make_node("Relu", ["t1"], ["r1"], name="relu1"), []),
        conv_layer("c2", "r1", "y", 8, 4, rng, k=1, pad=0),
    ]
    return cnn_model("avgpool_cnn", chain, [1, 3, 8, 8], [1, 4, 3, 3], 6)


def plain_cnn():
    rng = np.random.default_rng(2)
    chain = [
        conv_layer("c0", "x", "t0", 3, 16, rng),
        (h.make_node("Relu", ["t0"], ["r0"], name="relu0"), []),
        conv_layer("c1", "r0", "t1", 16, 16, rng, stride=2),
        (h.make_node("Sigmoid", ["t1"], ["s1"], name="sig"), []),
        (h.make_node("Mul", ["t1", "s1"], ["m1"], name="silu"), []),
        conv_layer("c2", "m1", "t2", 16, 16, rng),
        (h.make_node("MaxPool", ["t2"], ["p2"], name="pool", kernel_shape=[2, 2], strides=[2, 2]), []),
        conv_layer("c3", "p2", "y", 16, 8, rng, k=1, pad=0),
    ]
    return cnn_model("plain_cnn", chain, [1, 3, 32, 32], [1, 8, 8, 8], 6)


# ---- runs ------------------------------------------------------------------------------------------
def random_inputs(shape, n, seed=0, image=False):
    rng = np.random.default_rng(seed)
    out = [rng.random(shape, dtype=np.float32) for _ in range(n)]
    if image:  # a real photograph (shipped with ultralytics), resized to the input
        import cv2
        from anpred.inputs import default_images_dir

        imgs = sorted(p for p in default_images_dir().iterdir() if p.suffix.lower() in (".jpg", ".png"))
        for p in imgs[:2]:
            img = cv2.resize(cv2.imread(str(p))[:, :, ::-1], (shape[3], shape[2])).astype(np.float32) / 255
            out.append(np.ascontiguousarray(img.transpose(2, 0, 1)[None]))
    return out


def make_run(tmp, anchored, manifest, inputs, backends=BACKENDS, models=None):
    """Run ``anchored`` on each backend (``models[b]``: another ONNX file for backend b) into a RunStore.

    In-process, one backend after the other, except ``tf``: TensorFlow's thread pools can be set up only
    once per process, so it runs through the run driver (its own process) on the same samples and its
    tensors and status are copied in."""
    from anpred.backends.base import BackendStatus
    from anpred.run import BackendSpec, run_model

    tmp.mkdir(parents=True, exist_ok=True)
    mpath = tmp / "model.onnx"
    save_model(anchored, mpath)
    store = RunStore.create(tmp / "run", manifest, model={"name": anchored.graph.name, "path": str(mpath)})
    for i, x in enumerate(inputs):
        store.add_sample(f"s{i:04d}", {"x": x})
    for b in backends:
        if b == "tf":
            folder = tmp / "tf-inputs"
            folder.mkdir()
            for i, x in enumerate(inputs):
                np.savez(folder / f"{i:04d}.npz", x=x)
            # (no "threads" option: tf_onnx sets it after onnx2tf initialised TF, which TF refuses)
            side = run_model(mpath, [BackendSpec("tf")], folder, tmp / "tf-run", progress=False)
            for sid in side.sample_ids:
                store.write_anchors("tf", sid, side.read_anchors("tf", sid))
            store.set_status(side.statuses()["tf"])
            continue
        cls = backend_class(b)
        with cls({"threads": 1}) as be:
            be.prepare((models or {}).get(b, mpath), manifest, tmp / "work" / b)
            for i, x in enumerate(inputs):
                store.write_anchors(b, f"s{i:04d}", be.run({"x": x}))
            store.set_status(
                BackendStatus(
                    name=b,
                    family=cls.family,
                    status="ok",
                    versions=be.versions(),
                    precision=be.effective_precision(),
                    samples=len(inputs),
                    captures={k: asdict(v) for k, v in be.anchor_info().items()},
                )
            )
    store.save_meta()
    return tmp / "run"


def softplus_run(tmp):
    """``(run folder, manifest)`` of the Softplus CNN (OpenVINO's defect below -10) run on
    :data:`BACKENDS`, 6 samples; written under the folder ``tmp``."""
    am, man = softplus_cnn()
    return make_run(tmp, am, man, random_inputs([1, 3, 16, 16], 6, 0)), man


def avgpool_run(tmp):
    """``(run folder, manifest)`` of the AveragePool CNN (OpenVINO's ceil_mode/count_include_pad
    defect) run on :data:`BACKENDS`, 6 samples; written under the folder ``tmp``."""
    am, man = avgpool_cnn()
    return make_run(tmp, am, man, random_inputs([1, 3, 8, 8], 6, 1)), man


def clean_run(tmp):
    """``(run folder, manifest)`` of the plain CNN run on :data:`CLEAN_BACKENDS`, 10 samples (2
    photographs); written under the folder ``tmp``."""
    am, man = plain_cnn()
    return make_run(tmp, am, man, random_inputs([1, 3, 32, 32], 10, 2, image=True), backends=CLEAN_BACKENDS), man


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---- propagation along the data flow ----------------------------------------------------------------
def branch_cnn():
    """conv -> relu -> {branch A: conv a1 -> relu -> conv a2; branch B: conv b1} -> concat -> conv.

    Nodes are in file order c0, relu0, a1, b1, relua1, a2, concat, c3, so the manifest interleaves the
    branches (ta1, tb1, ra1, ta2): tb1 sits between two branch-A anchors but is not downstream of a1."""
    rng = np.random.default_rng(3)
    chain = [
        conv_layer("c0", "x", "t0", 3, 8, rng),
        (h.make_node("Relu", ["t0"], ["r0"], name="relu0"), []),
        conv_layer("a1", "r0", "ta1", 8, 8, rng),
        conv_layer("b1", "r0", "tb1", 8, 8, rng),
        (h.make_node("Relu", ["ta1"], ["ra1"], name="relua1"), []),
        conv_layer("a2", "ra1", "ta2", 8, 8, rng),
        (h.make_node("Concat", ["ta2", "tb1"], ["cat"], name="concat", axis=1), []),
        conv_layer("c3", "cat", "y", 16, 4, rng),
    ]
    nodes, inits = [], []
    for n, i in chain:
        nodes.append(n)
        inits += i
    g = h.make_graph(
        nodes,
        "branch_cnn",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 16, 16])],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return instrument_model(m, stages=6, anchors=["ta1", "tb1", "ta2"])
