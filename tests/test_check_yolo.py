"""Acceptance of `anpred check` on real library behaviour (issue 6): clean fp32 zoo YOLOv8n and YOLOv5n
(seeded, BN-calibrated) on ort, ort-noopt, openvino, torch (onnx2torch), tf (onnx2tf) and
onnx-reference, on the two photographs shipped in ``ultralytics/assets`` and 20 seeded uniform random
inputs: no backend flagged, every anchor judged on every sample. On YOLOv8n also ort-fp16, ort-int8 and
openvino-bf16 against the fp32 peers (observations written down in docs/oracle.md).

Size: 160x160 (the suite's budget: the ONNX reference evaluator takes ~2 s per YOLO sample on the
busy 2-core machine whatever the size, so the 22 samples are kept and the pixels reduced). Exports and
conversions come from anpred.cache; each backend runs in its own process (anpred.runner)."""

from __future__ import annotations

import math

import pytest

IMGSZ = 160
N_REAL, N_RANDOM = 2, 20
CLEAN = ("ort", "ort-noopt", "openvino", "torch", "tf", "onnx-reference")
LOWP = ("ort-fp16", "ort-int8", "openvino-bf16")


@pytest.fixture(scope="module")
def yolo_reports(tmp_path_factory):
    """``{name: (ModelSetup, CheckReport)}`` for yolov8n (clean + reduced precision) and yolov5n (clean)."""
    from anpred.check import check_run
    from anpred.evaluation import prepare_model

    out = {}
    for name, lowp in (("yolov8n", LOWP), ("yolov5n", ())):
        setup = prepare_model(name, tmp_path_factory.mktemp(name), imgsz=IMGSZ, n_real=N_REAL, n_random=N_RANDOM,
                              backends=CLEAN, lowp=lowp)
        out[name] = (setup, check_run(setup.clean_dir))
    return out


@pytest.mark.parametrize("name", ["yolov8n", "yolov5n"])
def test_clean_fp32_yolo_flags_nothing_and_judges_everything(yolo_reports, name):
    setup, rep = yolo_reports[name]
    assert setup.backends == list(CLEAN), setup  # every clean backend ran
    assert sorted(setup.samples.values()).count("real") == N_REAL and rep.samples == N_REAL + N_RANDOM
    # only ort-int8 (judged on yolov8n only) is flagged: its class probabilities are all 0 (below)
    assert rep.flagged_backends == (["ort-int8"] if name == "yolov8n" else []) and rep.incomplete == []
    assert rep.status == ("flagged" if name == "yolov8n" else "consistent")
    n = len(rep.anchors)
    for b in CLEAN:
        v = rep.verdicts[b]
        assert v.status == "consistent" and not v.flagged, (b, v)
        assert v.judged_anchors == n and v.samples == rep.samples and not v.partial
        # fp32 noise: nonzero, and below the threshold (k x peers' median, at least the fp32 floor)
        assert 1e-7 < v.worst_primary < 3e-5 and v.worst_ratio_to_threshold < 0.5, (b, v.worst_primary)
    for c in rep.cells:
        if c.backend in CLEAN:
            assert c.primary < c.floor and c.samples == rep.samples


@pytest.mark.parametrize("name", ["yolov8n", "yolov5n"])
def test_tf_and_openvino_share_kernels_and_one_vote(yolo_reports, name):
    """onnx2tf's TensorFlow (oneDNN custom ops on) and OpenVINO's CPU plugin (oneDNN) give bit-identical
    tensors at every inner anchor; only the decoded output differs. They are counted as one vote there."""
    _, rep = yolo_reports[name]
    inner = [a["name"] for a in rep.anchors if a["kind"] not in ("output", "part")]
    # the outputs and the parts of them judged on their own (anpred.parts)
    outputs = [a["name"] for a in rep.anchors if a["kind"] in ("output", "part")]
    assert len(outputs) > 1
    (c,) = rep.correlated
    assert c["families"] == ["openvino", "tensorflow"] and c["backends"] == ["openvino", "tf"]
    assert sorted(c["anchors"]) == sorted(inner) and set(c["anchors"].values()) == {rep.samples}
    assert c["differ"] == outputs
    assert all(m == ["median:onnx-reference,onnxruntime,openvino+tensorflow,torch"] for a, m in rep.consensus.items()
               if a in inner)
    ov, tf = rep.cell(inner[2], "openvino"), rep.cell(inner[2], "tf")
    assert ov.primary == tf.primary and ov.stats == tf.stats


def test_reduced_precision_against_fp32_peers(yolo_reports):
    """ort-fp16, openvino-bf16 and ort-int8 on YOLOv8n: judged at every anchor, fp16 and bf16 not flagged
    with the registry floors (measured in benchmarks/noise_floor.py), and ordered as their rounding steps
    predict: fp16 (unit roundoff 2^-11) < bf16 (2^-8, 8x) < int8 (per-tensor 8-bit steps) at every
    anchor, each far above fp32 noise; the deviation grows along the backbone and attenuates at the
    decoded output. ort-int8 is flagged at the output's class-probability part only: ORT's static QDQ
    quantization gives the output Concat one scale (boxes up to the image size), so every probability
    rounds to 0 (signal lost: cosine 0, nRMSE exactly 1, under its floor)."""
    _, rep = yolo_reports["yolov8n"]
    judged = [a["name"] for a in rep.anchors]  # manifest anchors and the output's parts (anpred.parts)
    anchors = [a["name"] for a in rep.anchors if a["kind"] != "part"]
    assert len(judged) == len(anchors) + 2  # output = Concat(boxes, class probabilities)
    out = anchors[-1]
    for b, p in zip(LOWP, ("fp16", "int8", "bf16")):
        v = rep.verdicts[b]
        assert v.precision == p and not v.votes and v.judged_anchors == len(judged)
        if b == "ort-int8":
            cls = f"{out}[:, 4:84]"
            assert v.status == "flagged" and v.flagged_anchors == [cls] and v.origin_anchor == cls and v.output_flagged
            c = rep.cell(cls, b)
            assert c.primary == 1.0 and c.stats.cosine == 0.0 and c.stats.max_abs > 0.5 and c.primary < c.floor
            assert c.reason.startswith("signal lost: cosine similarity 0 with the consensus (every value 0")
        else:
            assert v.status == "consistent" and v.origin_anchor is None and v.worst_ratio_to_threshold < 1
    for a in judged:
        fp32_max = max(rep.cell(a, b).primary for b in CLEAN)
        s16, sbf, s8 = (rep.cell(a, b).primary for b in ("ort-fp16", "openvino-bf16", "ort-int8"))
        assert 100 * fp32_max < s16 < sbf < s8, a
        assert 3 < sbf / s16 < 20, (a, sbf / s16)  # ~8 = 2^-8 / 2^-11
    for b in LOWP:
        prof = [rep.cell(a, b).primary for a in anchors]
        assert max(prof[:-1]) > 5 * prof[0]  # amplified along the backbone
        assert prof[-1] < max(prof[:-1])  # attenuated at the decoded output (sigmoid scores, box decode)
        assert not math.isnan(prof[-1])
