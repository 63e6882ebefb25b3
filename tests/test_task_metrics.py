"""Task-level cost (issue 20): task adapters against the consensus, labels, the history's task metrics.

Real parts: a small CNN trained here on the handwritten digits bundled with scikit-learn
(tests/task_digits.py), exported to ONNX and run on fp32, fp16 and int8 backends with its labels; the
trained YOLOv8n-DocLayNet on pages the project renders, with the boxes the renderer drew as ground truth
(slow). Streamed runs with a task: tests/test_task_stream.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import anpred
from anpred.task import ClassifyAdapter, DenseAdapter, DetectAdapter, coco_map50

from isa_reasons import DEFECT_BOUND, FP32_BOUND, NOT_A_KERNEL_VALUE
from task_digits import FP32, LOWP, N_TEST


@pytest.fixture(scope="module")
def digits_run(digits):
    model, inp, labels, eager, root = digits
    res = anpred.test(
        str(model),
        out=root / "out",
        backends=FP32 + LOWP,
        inputs=str(inp),
        task="classify",
        labels=str(labels),
        quiet=True,
        stages=3,
        history=str(root / "history.sqlite"),
    )
    return res, eager


@pytest.mark.isa_independent(FP32_BOUND)
def test_digits_top1_per_backend_against_labels(digits, digits_run):
    from anpred.run import RunStore

    res, eager = digits_run
    t = res.report.task
    assert t["samples"] == N_TEST and t["labels"] == N_TEST and t["task"]["task"] == "classify"
    assert set(t["backends"]) == set(FP32 + LOWP)
    labels = [int(v) for v in digits[2].read_text().split()]
    store = RunStore.open(res.run_dir)
    out = next(a.name for a in store.manifest.anchors if a.kind == "output")
    top1 = {b: np.array([int(np.argmax(store.read_anchors(b, s)[out])) for s in store.sample_ids]) for b in FP32 + LOWP}
    ref = top1["ort"]
    for b in FP32:  # every fp32 backend: the eager PyTorch model's top-1 on these digits, exactly
        assert t["backends"][b]["truth"]["top1"] == pytest.approx(eager, abs=1e-12), b
        assert t["backends"][b]["metrics"]["top1_agreement"] == 1.0
    assert 0.85 < eager < 1.0  # trained: well above chance (0.1), not perfect
    for b in LOWP:  # each reduced-precision copy: its agreement with fp32 and its top-1, as stored
        assert t["backends"][b]["metrics"]["top1_agreement"] == pytest.approx(float((top1[b] == ref).mean()))
        assert t["backends"][b]["truth"]["top1"] == pytest.approx(float((top1[b] == np.array(labels)).mean()))
        assert t["backends"][b]["truth"]["delta_to_consensus"] == pytest.approx(
            t["backends"][b]["truth"]["top1"] - t["consensus_truth"]["top1"]
        )
    text = res.format_text()
    assert text.splitlines()[1].startswith("task (classify, 60 samples")  # the task's cost leads the report
    d = json.loads((res.out / "report.json").read_text())
    assert d["task"]["backends"]["ort-int8"]["headline"].startswith("top-1 agrees with the consensus on ")


@pytest.mark.isa_independent(DEFECT_BOUND)
def test_history_task_regression_exits_1(digits, digits_run):
    """Two runs of a model named alike on the same inputs, the second with a degraded classifier: the
    regression command exits 1 naming the drop; a margin larger than the drop exits 0."""
    model, inp, labels, eager, root = digits
    db = root / "history.sqlite"
    res2 = anpred.test(
        str(root / "bad" / "digits.onnx"),
        out=root / "out-bad",
        backends=FP32[:3],
        inputs=str(inp),
        task="classify",
        labels=str(labels),
        quiet=True,
        stages=3,
        history=str(db),
    )
    before = digits_run[0].report.task["backends"]["ort"]["truth"]["top1"]
    after = res2.report.task["backends"]["ort"]["truth"]["top1"]
    assert before - after > 0.05, (before, after)
    p = subprocess.run(
        [sys.executable, "-m", "anpred", "history", str(db)], capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"REGRESSION digits ort truth.top1: {before:.4g} -> {after:.4g}" in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "anpred", "history", str(db), "--margin", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0 and "no task metric dropped by more than 1" in p.stdout


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_detect_adapter_counts_and_map():
    from models.detect import Detections

    ref = Detections(
        np.array([[0, 0, 10, 10], [20, 20, 40, 40], [50, 50, 60, 70]], float),
        np.array([0.9, 0.8, 0.7]),
        np.array([0, 1, 2]),
        None,
    )
    # two boxes kept (one shifted by 1 px: IoU 81/119), the third of another class, one extra box
    res = Detections(
        np.array([[0, 0, 10, 10], [21, 21, 41, 41], [50, 50, 60, 70], [80, 80, 90, 90]], float),
        np.array([0.85, 0.8, 0.7, 0.5]),
        np.array([0, 1, 3, 0]),
        None,
    )
    a = DetectAdapter()
    s = a.compare(res, ref)
    assert s == {
        "ref": 3.0,
        "dets": 4.0,
        "matched": 2.0,
        "iou_sum": pytest.approx(1 + 361 / 439),
        "shift_sum": pytest.approx(0.05),
    }
    m = a.summary(s, [res], [ref])
    assert m["kept"] == 2 and m["consensus_detections"] == 3 and m["precision"] == 0.5
    assert m["recall"] == pytest.approx(2 / 3) and m["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert a.headline(m) == "2 of 3 detections kept"
    assert coco_map50([ref], [ref]) == pytest.approx(1.0)
    empty = Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), None)
    assert coco_map50([ref], [empty]) == 0.0 and coco_map50([empty], [ref]) is None


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_classify_and_dense_adapters():
    c = ClassifyAdapter()
    ref = c.result({"y": np.array([[1.0, 3.0, 2.0]])})  # logits: softmax
    assert ref == pytest.approx(np.exp([1, 3, 2]) / np.exp([1, 3, 2]).sum())
    res = c.result({"y": np.array([0.2, 0.3, 0.5])})  # already probabilities
    s = c.compare(res, ref)
    assert s["top1"] == 0.0 and s["topk"] == 1.0 and s["shift_sum"] == pytest.approx(abs(0.3 - ref[1]))
    d = DenseAdapter(0.3)
    a, b = d.result({"m": np.array([0.1, 0.4, 0.9, 0.35])}), d.result({"m": np.array([0.5, 0.4, 0.2, 0.31])})
    m = d.summary(d.compare(a, b), [], [])
    assert m["iou"] == pytest.approx(2 / 4)


@pytest.mark.isa_independent(FP32_BOUND)
@pytest.mark.slow  # the 1024x1024 detector on four backends (~40 s)
def test_doclaynet_detections_kept_and_true_map(tmp_path):
    """The trained YOLOv8n-DocLayNet on three rendered pages: every fp32 backend keeps every consensus
    detection; ort-int8 (static QDQ: the output Concat gets one scale, so every class probability
    rounds to 0) keeps none, and the report says so first; true mAP@0.5 per backend against the
    boxes the renderer drew."""
    from models.documents import write_pages_with_truth

    write_pages_with_truth(tmp_path / "pages", range(3))
    res = anpred.test(
        "yolov8n-doclaynet",
        out=tmp_path / "out",
        backends=["ort", "openvino", "torch", "ort-int8"],
        inputs=str(tmp_path / "pages"),
        labels=str(tmp_path / "pages" / "truth.json"),
        quiet=True,
    )
    t = res.report.task
    assert t["task"]["task"] == "detect" and t["labels"] == 3
    n = t["backends"]["ort"]["metrics"]["consensus_detections"]
    assert n >= 30  # a trained detector on three pages
    for b in ("ort", "openvino", "torch"):
        m = t["backends"][b]["metrics"]
        assert m["kept_fraction"] >= 0.99 and m["map50_vs_consensus"] >= 0.99, (b, m)
        assert 0.5 < t["backends"][b]["truth"]["map50"] <= 1.0
    assert t["backends"]["ort-int8"]["metrics"]["kept"] == 0 and t["backends"]["ort-int8"]["truth"]["map50"] == 0.0
    lines = res.format_text().splitlines()
    assert lines[1].startswith("task (detect, 3 samples")
    assert f"ort-int8: 0 of {n} detections kept" in "\n".join(lines[:7])


def test_labels_are_checked_before_anything_runs(digits, tmp_path):
    from anpred.errors import AnpredError

    model, inp, labels, _, _ = digits
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for lab, task in ((str(labels), "none"), (str(bad), "classify")):
        with pytest.raises(AnpredError, match="labels"):
            anpred.test(
                str(model), out=tmp_path / "o", backends=FP32[:2], inputs=str(inp), task=task, labels=lab, quiet=True
            )
        assert not (tmp_path / "o").exists()  # refused before any backend ran: no output folder was made


def test_user_adapter_module_function(digits, digits_run, tmp_path, monkeypatch):
    """A user adapter ``module:function`` from the current folder, without ``describe``."""
    (tmp_path / "myadapt.py").write_text(
        "import numpy as np\n"
        "class Argmax:\n"
        "    name = 'argmax'\n"
        "    def result(self, outputs):\n"
        "        return int(np.argmax(next(iter(outputs.values()))))\n"
        "    def compare(self, res, ref):\n"
        "        return {'n': 1.0, 'same': float(res == ref)}\n"
        "    def summary(self, sums, results, refs):\n"
        "        return {'same': sums['same'] / sums['n']}\n"
        "    def headline(self, m):\n"
        "        return f\"same class {m['same']:.2f}\"\n"
        "def make():\n"
        "    return Argmax()\n"
    )
    monkeypatch.chdir(tmp_path)
    from anpred.task import load_adapter, task_impact

    res = digits_run[0]
    t = task_impact(res.run_dir, load_adapter("myadapt:make"))
    assert t["task"] == {"task": "argmax", "adapter": "myadapt:make"}
    assert t["backends"]["ort"]["headline"] == "same class 1.00"
    report_metrics = res.report.task["backends"]["ort-int8"]["metrics"]
    assert t["backends"]["ort-int8"]["metrics"]["same"] == report_metrics["top1_agreement"]


def test_classify_nan_output_agrees_with_nothing():
    c = ClassifyAdapter()
    ref = c.result({"y": np.array([0.1, 0.7, 0.2])})
    s = c.compare(c.result({"y": np.array([np.nan, 0.0, 0.0])}), ref)
    m = c.summary(s, [], [])
    assert m["top1_agreement"] == 0.0 and m["nonfinite_outputs"] == 1 and m["mean_prob_shift"] is None


def test_history_refuses_a_negative_margin(digits_run, digits):
    p = subprocess.run(
        [sys.executable, "-m", "anpred", "history", str(digits[4] / "history.sqlite"), "--margin", "-1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 2 and "--margin must be >= 0" in p.stderr


@pytest.mark.slow  # ~18 s: a task run over class folders; the other label sources stay in the default run
@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_labels_from_class_folders(digits, tmp_path):
    """``--labels folders``: INPUTS/<class>/<file> gives each sample its folder's class (sorted names); the
    same 60 digits give the labels file's top-1, streamed or not; a flat folder is refused, not labelled 0."""

    from anpred.errors import AnpredError

    model, inp, labels, eager, root = digits
    cf = tmp_path / "cf"
    for f, y in zip(sorted(inp.iterdir()), labels.read_text().split()):
        (cf / y).mkdir(parents=True, exist_ok=True)
        shutil.copy(f, cf / y / f.name)
    kw = dict(backends=["ort", "openvino"], task="classify", quiet=True, stages=3)
    flat = anpred.test(str(model), out=tmp_path / "flat", inputs=str(inp), labels=str(labels), **kw).report
    want = flat.task["backends"]["ort"]["truth"]["top1"]
    assert want == pytest.approx(eager, abs=1e-12)
    for stream in (False, True):
        rep = anpred.test(
            str(model), out=tmp_path / f"cf{stream}", inputs=str(cf), labels="folders", stream=stream, **kw
        ).report
        assert rep.samples == N_TEST and rep.task["labels"] == N_TEST
        assert rep.task["backends"]["ort"]["truth"]["top1"] == pytest.approx(want, abs=1e-12)
    for bad in (inp, cf):  # a flat folder; class folders with a stray file beside them: refused before running
        if bad == cf:
            shutil.copy(sorted(inp.iterdir())[0], cf / "stray.npz")
        with pytest.raises(AnpredError, match="one subfolder per class"):
            anpred.test(str(model), out=tmp_path / "bad", inputs=str(bad), labels="folders", **kw)
        assert not (tmp_path / "bad").exists()
    (cf / "stray.npz").unlink()
    # an empty class folder keeps its index (the classes are the subfolders, as torchvision's ImageFolder)
    for f in (cf / "4").iterdir():
        f.unlink()
    rep = anpred.test(str(model), out=tmp_path / "no4", inputs=str(cf), labels="folders", **kw).report
    assert rep.samples == N_TEST - labels.read_text().split().count("4")
    assert rep.task["backends"]["ort"]["truth"]["top1"] >= want - 0.05  # not 0.44 as with shifted classes


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_coco_map50_equals_cocoeval_summarize():
    """coco_map50 evaluates only IoU 0.5, area all, 100 detections: the same number as pycocotools'
    full evaluation (``stats[1]`` of ``summarize``), on 60 images of noisy, missed, extra and
    misclassified boxes of 4 classes (with over 100 detections on one image)."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from models.detect import Detections

    rng = np.random.default_rng(11)
    truth, dets = [], []
    for i in range(60):
        n = int(rng.integers(0, 12)) if i != 7 else 120
        xy = rng.uniform(0, 900, (n, 2))
        wh = rng.uniform(5, 200, (n, 2))
        boxes = np.concatenate([xy, xy + wh], 1)
        cls = rng.integers(0, 4, n)
        truth.append(Detections(boxes, np.ones(n), cls, None))
        keep = rng.random(n) > 0.15  # missed boxes
        noisy = boxes[keep] + rng.normal(0, 6, (int(keep.sum()), 4))
        extra = rng.uniform(0, 1000, (int(rng.integers(0, 4)), 4))
        extra = np.concatenate([np.minimum(extra[:, :2], extra[:, 2:]), np.maximum(extra[:, :2], extra[:, 2:]) + 1], 1)
        b = np.concatenate([noisy, extra])
        c = np.concatenate(
            [
                np.where(rng.random(int(keep.sum())) < 0.1, (cls[keep] + 1) % 4, cls[keep]),
                rng.integers(0, 4, len(extra)),
            ]
        )
        s = rng.random(len(b))
        o = np.argsort(-s)
        dets.append(Detections(b[o], s[o], c[o].astype(np.int64), None))
    images, anns, res = [], [], []
    for i, (t, d) in enumerate(zip(truth, dets)):  # the full evaluation, as coco_map50 did before
        images.append({"id": i + 1, "width": 1, "height": 1})
        for b, c in zip(t.boxes, t.classes):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i + 1,
                    "category_id": int(c) + 1,
                    "iscrowd": 0,
                    "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                    "area": (b[2] - b[0]) * (b[3] - b[1]),
                }
            )
        for b, c, s in zip(d.boxes, d.classes, d.scores):
            res.append(
                {
                    "image_id": i + 1,
                    "category_id": int(c) + 1,
                    "score": float(s),
                    "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                }
            )
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns, "categories": [{"id": c} for c in range(1, 5)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(res), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    assert 0.3 < ev.stats[1] < 0.95
    assert coco_map50(truth, dets) == ev.stats[1]
