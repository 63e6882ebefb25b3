"""What the evaluation measures beside the oracle: the output anchors and the reference backend, the
oracle configuration used, detections decoded and matched (:mod:`models.detect`), the pooled nRMSE
accumulators of the injected size, the threshold baseline's critical tolerance, and :func:`finite`
(every float the results hold: NaN as None, an infinity as 1e300)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "output_anchors",
    "reference_backend",
    "judge_config",
    "decode_detections",
    "match_summary",
    "add_match",
    "finish_match",
    "nrmse_acc",
    "nrmse_of",
    "critical_tolerance",
    "finite",
]


def output_anchors(manifest) -> list[str]:
    outs = [a.name for a in manifest.anchors if a.kind == "output"]
    return outs or [a.name for a in manifest.anchors if a.stage == max(x.stage for x in manifest.anchors)]


def reference_backend(backends: list[str]) -> str:
    from anpred.defaults import REFERENCE_PRIORITY

    return next((b for b in REFERENCE_PRIORITY if b in backends), backends[0])


def judge_config():
    """The oracle configuration used: the defaults, without the HTML plot reservoirs (plots only)."""
    from anpred.defaults import OracleConfig

    return OracleConfig(reservoir=0)


def decode_detections(output: np.ndarray, layout: str | None):
    from models.detect import decode

    return decode(output, layout=layout) if layout else None


def match_summary(dets, ref) -> dict[str, Any]:
    """Detections ``dets`` vs ``ref``: counts, matched pairs, unmatched (changed), mean IoU of matches."""
    from models.detect import match_detections

    m = match_detections(dets, ref)
    return {
        "n": len(dets),
        "n_ref": len(ref),
        "matched": int(len(m.pairs)),
        "changed": int(m.changed),
        "missing": int(len(m.unmatched_b)),
        "extra": int(len(m.unmatched_a)),
        "iou_sum": float(np.sum(m.ious)) if len(m.pairs) else 0.0,
    }


def add_match(acc: dict[str, Any], s: dict[str, Any]) -> None:
    for k, v in s.items():
        acc[k] = acc.get(k, 0) + v


def finish_match(acc: dict[str, Any]) -> dict[str, Any]:
    out = dict(acc)
    out["mean_iou"] = out.pop("iou_sum", 0.0) / out["matched"] if out.get("matched") else None
    return out


def nrmse_acc(acc: dict[str, list[float]], key: str, x: np.ndarray, o: np.ndarray) -> None:
    x = np.asarray(x, dtype=np.float64).ravel()
    o = np.asarray(o, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(o)
    d = x[ok] - o[ok]
    a = acc.setdefault(key, [0.0, 0.0, 0])
    a[0] += float(np.dot(d, d))
    a[1] += float(np.dot(o[ok], o[ok]))
    a[2] += int((~ok).sum())


def nrmse_of(a: list[float]) -> float:
    if a[2]:
        return math.inf
    return 0.0 if a[0] == 0 else (math.sqrt(a[0] / a[1]) if a[1] > 0 else math.inf)


def critical_tolerance(al: dict[str, dict[str, np.ndarray]], outs: list[str], b: str, ref: str) -> float:
    """Smallest t for which the baseline at atol = rtol = t passes ``b``: ``max min(|x-r|, |x-r|/|r|)``
    over the output elements (inf with NaN/Inf where the reference is finite; 0 when b is the reference)."""
    if b == ref:
        return 0.0
    worst = 0.0
    for o in outs:
        per = al.get(o) or {}
        if b not in per or ref not in per:
            continue
        x, r = per[b], per[ref]
        rf = np.isfinite(r)
        if (~np.isfinite(x) & rf).any():
            return math.inf
        ok = np.isfinite(x) & rf
        ad = np.abs(x[ok] - r[ok])
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = ad / np.abs(r[ok])
        m = np.minimum(ad, np.nan_to_num(rel, nan=0.0, posinf=np.inf))
        if m.size:
            worst = max(worst, float(m.max()))
    return worst


def finite(v):
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else (None if math.isnan(v) else 1e300)
