"""Alignment (anpred.align) of YOLOv8n converted with onnx2tf (backend ``tf``, channels-last) against
onnxruntime (NCHW): the known permutation, defects put into the converter's real output that must stay
different, and manifest pins that do not fit. Nothing stands in for a converter. The Keras case:
tests/test_align_keras.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from anpred.align import Aligner, find_segment_permutation
from anpred.backends.base import BackendStatus
from anpred.manifest import AnchorManifest

from isa_reasons import DEFECT_BOUND, FP32_BOUND
from align_cases import FP32_NOISE, keras_run

YOLO_SIZE = 192  # the converter tests' anchored YOLOv8n (same cache key: the onnx2tf conversion is shared)


@pytest.fixture(scope="module")
def yolo_anchored() -> Path:
    from anpred.cache import cache_key, cached_dir

    def build(d: Path) -> None:
        import onnx
        import torch

        from anpred.compat import import_ultralytics
        from anpred.instrument import instrument_model
        from exporters.torch_export import export_torch

        ul = import_ultralytics()
        torch.manual_seed(0)
        net = ul.YOLO("yolov8n.yaml").model.eval()
        net.model[-1].export = True
        export_torch(net, (torch.rand(1, 3, YOLO_SIZE, YOLO_SIZE),), d / "yolov8n.onnx", dynamo=True, cache=False)
        model, manifest = instrument_model(onnx.load(str(d / "yolov8n.onnx")), stages=6, source_path=d / "yolov8n.onnx")
        manifest.to_model(model)
        onnx.save(model, str(d / "yolov8n.anchored.onnx"))

    d = cached_dir("test-models", cache_key("converters-yolov8n-dynamo", YOLO_SIZE, 1), build)
    return d / "yolov8n.anchored.onnx"


def _model4(manifest) -> str:
    """The anchor of module ``model.4``'s output (its stage index depends on the partition)."""
    (name,) = [a.name for a in manifest.anchors if a.scope == "model.4"]
    return name


@pytest.fixture(scope="module")
def yolo_run(yolo_anchored):
    """YOLOv8n (192 px) run through the real ``ort`` and ``tf`` (onnx2tf, cached) backends, 2 samples."""
    import onnx

    from anpred.backends import backend_class

    manifest = AnchorManifest.from_model(onnx.load(str(yolo_anchored), load_external_data=False))
    rng = np.random.default_rng(0)
    graph = onnx.load(str(yolo_anchored), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    feeds = [
        {i.name: rng.random((1, 3, YOLO_SIZE, YOLO_SIZE), dtype=np.float32) for i in graph.input if i.name not in inits}
        for _ in range(2)
    ]
    statuses, raw = {}, {}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("ort", "tf"):
            cls = backend_class(name)
            with cls({}) as b:  # (TF threads cannot be set once TF ran in this process)
                b.prepare(yolo_anchored, manifest, Path(tmp) / name)
                raw[name] = [b.run(f) for f in feeds]
                statuses[name] = BackendStatus(
                    name, cls.family, "ok", captures={a: c.__dict__ for a, c in b.anchor_info().items()}
                )
    return {"manifest": manifest, "statuses": statuses, "raw": raw, "feeds": feeds}


@pytest.mark.isa_independent(FP32_BOUND)
@pytest.mark.slow
def test_yolov8n_onnx2tf_nhwc_vs_ort_nchw(yolo_run):
    from anpred.judge import error_stats

    manifest, statuses = yolo_run["manifest"], yolo_run["statuses"]
    raw = {b: yolo_run["raw"][b][0] for b in ("ort", "tf")}
    al = Aligner(manifest, statuses)
    res = al.align("s0000", raw)
    assert not res.unaligned
    four_d = [a for a in manifest.anchors if len(a.shape) == 4]
    assert four_d
    worst = 0.0
    for a in manifest.anchors:
        t = res.tensors[a.name]
        e = error_stats(t["tf"], t["ort"]).nrmse
        worst = max(worst, e)
        assert t["tf"].shape == tuple(a.shape) and t["tf"].dtype == np.float64
        assert e < FP32_NOISE, (a.name, e)  # nRMSE, the oracle's statistic
    for a in four_d:
        d = al.decisions[(a.name, "tf")]
        assert d.source == "capture" and d.rule == {"permute": [0, 3, 1, 2]}, (a.name, d)
        assert raw["tf"][a.name].shape != tuple(a.shape) or a.shape[1] == a.shape[3]
    print(f"\nyolov8n {YOLO_SIZE}: {len(four_d)} 4-D anchors by the known rule; worst nRMSE {worst:.2e}")
    assert math.isfinite(worst)
    # the text report lists every anchor of a group (no cut at 6)
    text = al.report().format_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("  tf: permute [0, 3, 1, 2] [capture]"))
    assert f"({len(four_d)})" in line and all(a.name in line for a in four_d) and "..." not in line


# real converter output with a defect put into one anchor (NHWC as onnx2tf returns it)
DEFECTS = {
    "channel halves swapped": lambda t: np.concatenate([t[..., 32:], t[..., :32]], axis=3),
    "rows flipped": lambda t: t[:, ::-1].copy(),
    "3-column roll": lambda t: np.roll(t, 3, axis=2),
}


@pytest.mark.isa_independent(DEFECT_BOUND)
@pytest.mark.slow
def test_onnx2tf_reorderings_stay_different(yolo_run):
    """onnx2tf runs the ONNX graph and reports its exact transform: a channel swap, flipped rows or
    rolled columns in its output is a defect. Each stays exactly as different as it is after the
    known permutation (no segment search), although an unrestricted search fits all three."""
    from anpred.judge import error_stats

    manifest, statuses = yolo_run["manifest"], yolo_run["statuses"]
    a = _model4(yolo_run["manifest"])
    assert manifest[a].shape == [1, 64, 24, 24]
    for what, defect in DEFECTS.items():
        al = Aligner(manifest, statuses)
        tf = dict(yolo_run["raw"]["tf"][0])
        tf[a] = defect(tf[a])
        res = al.align("s0000", {"ort": yolo_run["raw"]["ort"][0], "tf": tf})
        d = al.decisions[(a, "tf")]
        assert d.source == "capture" and d.rule == {"permute": [0, 3, 1, 2]}, (what, d)
        got, ref = res.tensors[a]["tf"], res.tensors[a]["ort"]
        assert np.array_equal(got, np.transpose(tf[a], [0, 3, 1, 2]).astype(np.float64))
        nrmse = error_stats(got, ref).nrmse
        unrestricted = find_segment_permutation(got, ref, max_blocks=10**6, min_block_fraction=0.0)
        print(
            f"\ntf {what}: nRMSE kept {nrmse:.3f}; an unrestricted search would fit "
            f"{unrestricted and (unrestricted[0]['axis'], len(unrestricted[0]['order']), f'{unrestricted[1]:.1e}')}"
        )
        assert nrmse > 0.1, (what, nrmse)
        assert not al.report().segments_by_data
        if what != "rows flipped":  # (24 single rows: below the 2-slice floor even unrestricted)
            assert unrestricted is not None and unrestricted[1] < FP32_NOISE
        # the restricted search along the channel axis (what a native backend would get) rejects the flip
        # and the roll outright
        if what != "channel halves swapped":
            assert find_segment_permutation(got, ref, axes=[1]) is None


@pytest.mark.isa_independent(DEFECT_BOUND)
@pytest.mark.slow
def test_onnx2tf_channel_swap_check_origin(yolo_run, tmp_path):
    """`anpred check` on a run whose tf (onnx2tf) model.4 has its channel halves swapped: tf is flagged
    with the origin at that anchor's stage, not one stage late, and no segment order is reported."""
    from anpred.judge import check_run
    from anpred.run import RunStore

    a4 = _model4(yolo_run["manifest"])
    stage4 = yolo_run["manifest"][a4].stage
    store = RunStore.create(tmp_path / "run", yolo_run["manifest"])
    for i, feeds in enumerate(yolo_run["feeds"]):
        s = f"s{i:04d}"
        store.add_sample(s, feeds)
        store.write_anchors("ort", s, yolo_run["raw"]["ort"][i])
        tf = dict(yolo_run["raw"]["tf"][i])
        tf[a4] = DEFECTS["channel halves swapped"](tf[a4])
        store.write_anchors("tf", s, tf)
    for st in yolo_run["statuses"].values():
        store.set_status(st)
    rep = check_run(tmp_path / "run")
    v = rep.verdicts["tf"]
    c = rep.cell(a4, "tf")
    print(f"\ncheck: tf {rep.status}, origin {v.origin_anchor} (stage {v.origin_stage}), nRMSE there {c.primary:.3f}")
    assert rep.status == "flagged" and v.flagged and v.origin_anchor == a4 and v.origin_stage == stage4
    assert c.flagged and c.primary > 0.1
    assert not any("segment" in n for n in rep.notes) and not rep.alignment["unaligned"]


@pytest.mark.slow  # needs the onnx2tf YOLOv8n run (yolo_run: about 40 s cold)
def test_pins_that_do_not_fit_leave_the_anchor_unaligned(keras_case, yolo_run, tmp_path):
    """A pin is never silently replaced: one that does not fit the shapes makes the anchor unaligned for
    that backend with the reason, and `anpred check` says so; a pin for an unknown backend is a warning."""
    from anpred.judge import check_run
    from anpred.report.text import format_text

    # on the onnx2tf output (4-D NHWC) of YOLOv8n
    a = _model4(yolo_run["manifest"])
    for pin, shown in [({"permute": [0, 2, 1]}, "permute [0, 2, 1]"), ({"view": [1, 2, 3]}, "view [1, 2, 3]")]:
        m = AnchorManifest.from_dict(yolo_run["manifest"].to_dict())
        m[a].alignment = {"tf": pin, "tff": {"permute": [0, 3, 1, 2]}}
        al = Aligner(m, yolo_run["statuses"])
        res = al.align("s0000", {b: yolo_run["raw"][b][0] for b in ("ort", "tf")})
        why = res.unaligned[a]["tf"]
        assert f"manifest pin '{shown}' does not fit backend shape [1, 24, 24, 64] -> canonical [1, 64, 24, 24]" in why
        assert "tf" not in res.tensors[a] and (a, "tf") not in al.decisions
        rep = al.report()
        assert [w for w in rep.warnings if "'tff'" in w and a in w]
        assert "warning: manifest pin for unknown backend 'tff'" in rep.format_text()
    # through anpred check: the unaligned reason reaches the report (not just "fewer than two backends")
    run = keras_run(
        keras_case,
        tmp_path / "run",
        pins={
            "anchor/00/relu1": {"tf-native": {"permute": [0, 2, 1]}},
            "anchor/02/conv2": {"tff": {"exclude": "typo"}},
        },
    )
    rep = check_run(run)
    why = rep.unjudged_anchors["anchor/00/relu1"]
    assert "not aligned: tf-native: manifest pin 'permute [0, 2, 1]' does not fit" in why
    why_unjudged = rep.verdicts["tf-native"].unjudged["anchor/00/relu1"]
    assert why_unjudged.startswith("not aligned: manifest pin 'permute [0, 2, 1]'")
    text = format_text(rep)
    assert (
        "note: anchor anchor/00/relu1 could not be judged: fewer than two backends produced it (ort); "
        "not aligned: tf-native: manifest pin 'permute [0, 2, 1]'"
    ) in text
    assert "note: alignment warning: manifest pin for unknown backend 'tff' at anchor/02/conv2" in text
    assert "report_error" not in rep.alignment and rep.alignment["schema"] == "anpred.alignment/1"
