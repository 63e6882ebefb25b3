"""The Keras case of the alignment tests (tests/test_align_keras.py, tests/test_align_onnx2tf.py): a Keras
model exported with tf2onnx (exporters.tf_export, cached) and run in onnxruntime with intermediate values
exposed as outputs (NCHW/NCW/NCDHW), the same model run natively in TensorFlow (NHWC/NWC/NDHWC), the
backend statuses both report, and a run folder of the two. ``keras_case`` (conftest.py, session scope)
builds it once.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.manifest import Anchor, AnchorManifest

from ort_session import ort_outputs

FP32_NOISE = 1e-5  # normalised error after alignment between two fp32 libraries

# anchor -> (regex of the ONNX value in the tf2onnx export, Keras layer, canonical layout)
_F = r"functional(_\d+)?/"
ANCHORS = {
    "anchor/00/relu1": (_F + r"relu1(_\d+)?/Relu:0", "relu1", "NCHW"),
    "anchor/01/pool1": (_F + r"pool1(_\d+)?/MaxPool2d:0", "pool1", "NCHW"),
    "anchor/02/conv2": (_F + r"conv2(_\d+)?/Relu:0", "conv2", "NCHW"),
    "anchor/03/gap": (_F + r"gap(_\d+)?/Mean:0", "gap", "NCHW"),
    "anchor/04/cat": (_F + r"cat(_\d+)?/concat:0", "cat", "NCHW"),
    "anchor/05/c1d": (_F + r"c1d(_\d+)?/Relu:0", "c1d", "NCW"),
    "anchor/06/c3d": (_F + r"c3d(_\d+)?/Relu:0", "c3d", "NCDHW"),
    "output/flat": (r"flat", "flat", "unknown"),
}
NATIVE_LAYOUT = {"NCHW": "NHWC", "NCW": "NWC", "NCDHW": "NDHWC"}


def keras_model(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    k = keras.layers
    x = keras.Input((16, 16, 3), batch_size=1, name="x")
    s = keras.Input((32, 4), batch_size=1, name="s")
    v = keras.Input((6, 6, 6, 2), batch_size=1, name="v")
    h = k.Conv2D(8, 3, padding="same", name="conv1")(x)
    h = k.BatchNormalization(name="bn1")(h)
    h = k.ReLU(name="relu1")(h)
    h = k.MaxPooling2D(2, name="pool1")(h)  # 1x8x8x8: C == H == W
    h2 = k.Conv2D(16, 3, padding="same", activation="relu", name="conv2")(h)
    g = k.GlobalAveragePooling2D(name="gap")(h2)
    ha = k.Conv2D(4, 1, name="head_a")(h2)
    hb = k.Conv2D(6, 1, name="head_b")(h2)
    cat = k.Concatenate(name="cat")([ha, hb])
    f = k.Flatten(name="flat")(h2)
    out = k.Dense(10, name="dense")(g)
    c1 = k.Conv1D(6, 3, padding="same", activation="relu", name="c1d")(s)
    c3 = k.Conv3D(4, 3, padding="same", activation="relu", name="c3d")(v)
    model = keras.Model([x, s, v], [out, f, cat, c1, c3])
    # BatchNorm statistics away from the identity, so the folded conv is not trivial
    bn = model.get_layer("bn1")
    rng = np.random.default_rng(seed)
    bn.set_weights([rng.uniform(0.5, 1.5, 8), rng.normal(0, 0.2, 8), rng.normal(0, 0.2, 8), rng.uniform(0.5, 2, 8)])
    # the "Keras port" concatenating the two heads in the other order (same layers, same weights)
    swapped = k.Concatenate(name="cat_swapped")([hb, ha])
    names = [spec[1] for spec in ANCHORS.values()]
    native = keras.Model([x, s, v], [model.get_layer(n).output if n != "cat" else cat for n in names] + [swapped])
    return model, native


def expose_outputs(model, values):
    """Add ONNX values as graph outputs (types from ONNX shape inference)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    vi = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    have = {o.name for o in model.graph.output}
    for v in values:
        if v not in have:
            model.graph.output.append(vi[v])
    return model


def build_keras_case(tmp: Path) -> dict:
    """Keras model natively (TF) and via tf2onnx in ORT, 2 samples; plus a wrong model (seed 1). The
    export is written under the folder ``tmp``; returns ``{"manifest", "proto", "values", "samples", "ort",
    "keras", "wrong"}`` (tensors per sample: anchor -> float32 array, native layouts for ``keras``)."""
    import onnx

    from exporters.tf_export import export_keras

    model, native = keras_model(0)
    export_keras(model, tmp / "k.onnx")
    proto = onnx.load(str(tmp / "k.onnx"))
    node_outs = {o for n in proto.graph.node for o in n.output}
    values = {}
    for a, (pattern, _, _) in ANCHORS.items():
        hits = [o for o in node_outs if re.fullmatch(pattern, o)]
        assert len(hits) == 1, (a, hits)
        values[a] = hits[0]
    proto = expose_outputs(proto, list(values.values()))
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in proto.graph.output}
    anchors = [
        Anchor(
            name=a,
            value=values[a],
            stage=i,
            order=i,
            producer="",
            op_type="",
            shape=shapes[values[a]],
            dtype="float32",
            layout=ANCHORS[a][2],
        )
        for i, a in enumerate(ANCHORS)
    ]
    manifest = AnchorManifest(anchors=anchors)
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(2):
        samples.append(
            {
                "x": rng.normal(size=(1, 16, 16, 3)).astype(np.float32),
                "s": rng.normal(size=(1, 32, 4)).astype(np.float32),
                "v": rng.normal(size=(1, 6, 6, 6, 2)).astype(np.float32),
            }
        )
    model_bytes = proto.SerializeToString()
    ort_out, keras_out = [], []
    for feeds in samples:
        r = ort_outputs(model_bytes, feeds, list(values.values()))
        ort_out.append({a: r[values[a]] for a in ANCHORS})
        outs = [np.asarray(t) for t in native([feeds["x"], feeds["s"], feeds["v"]])]
        keras_out.append(dict(zip(ANCHORS, outs[:-1])) | {"cat_swapped": outs[-1]})
    _, wrong_native = keras_model(1)
    wrong = []
    for feeds in samples:
        outs = [np.asarray(t) for t in wrong_native([feeds["x"], feeds["s"], feeds["v"]])]
        wrong.append(dict(zip(ANCHORS, outs[:-1])))
    return {
        "manifest": manifest,
        "proto": proto,
        "values": values,
        "samples": samples,
        "ort": ort_out,
        "keras": keras_out,
        "wrong": wrong,
    }


def ort_status(manifest, name="ort", precision="fp32", captures=None):
    caps = captures or {
        a.name: AnchorCapture("exact", a.layout if a.layout != "unknown" else None).__dict__ for a in manifest.anchors
    }
    return BackendStatus(name=name, family="onnxruntime", status="ok", precision=precision, captures=caps)


def tf_status(manifest, known=True, overrides=None):
    """What a TensorFlow backend reports: channels-last layout and the permutation back (``known``), or
    nothing about the layout (``known=False``)."""
    caps = {}
    for a in manifest.anchors:
        r = len(a.shape)
        if known and a.layout in NATIVE_LAYOUT and a.name != "anchor/03/gap":
            caps[a.name] = AnchorCapture(
                "equivalent", NATIVE_LAYOUT[a.layout], {"permute": [0, r - 1, *range(1, r - 1)]}, target=a.name
            ).__dict__
        else:
            caps[a.name] = AnchorCapture("equivalent", None, None, target=a.name).__dict__
    caps.update(overrides or {})
    return BackendStatus(name="tf-native", family="tensorflow", status="ok", captures=caps)


def keras_run(keras_case, root: Path, tf_edit=None, pins=None) -> Path:
    """A run folder of the Keras case: ``ort`` (tf2onnx export) and ``tf-native`` (Keras), 2 samples;
    ``tf_edit(sample_tensors)`` puts a defect into the native tensors; ``pins`` are written into the run's
    manifest.json under ``anchors[i].alignment`` (where a user writes them)."""
    import json

    from anpred.run import RunStore

    m = keras_case["manifest"]
    store = RunStore.create(root, m)
    for sid, (feeds, o, k) in enumerate(zip(keras_case["samples"], keras_case["ort"], keras_case["keras"])):
        s = f"s{sid:04d}"
        store.add_sample(s, feeds)
        store.write_anchors("ort", s, o)
        t = {a: k[a] for a in ANCHORS}
        store.write_anchors("tf-native", s, tf_edit(t) if tf_edit else t)
    store.set_status(ort_status(m))
    store.set_status(tf_status(m))
    if pins:
        d = json.loads((root / "manifest.json").read_text())
        for a in d["anchors"]:
            a["alignment"] = pins.get(a["name"], {})
        (root / "manifest.json").write_text(json.dumps(d))
    return root
