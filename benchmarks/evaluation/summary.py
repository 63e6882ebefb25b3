"""The evaluation's rates and bars: :func:`summarize` turns the :class:`ConfigResult` list into
detection, false-alarm, localization and propagation rates; :func:`bars` checks the project's bars;
:func:`save_results` writes ``results.json`` (schema :data:`EVAL_SCHEMA`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .grid import EVAL_SCHEMA, TOLERANCES
from .measures import finite
from .results import CleanSummary, ConfigResult

__all__ = ["summarize", "bars", "save_results", "json_default"]


def _rate(num: int, den: int) -> dict[str, Any]:
    return {"n": den, "k": num, "rate": (num / den) if den else None}


def summarize(results: list[ConfigResult], cleans: dict[str, CleanSummary | dict[str, Any]]) -> dict[str, Any]:
    """Rates over the configurations of one or more models.

    Returns a dict with, per model and over all models:
    ``detection[method][kind][magnitude]`` (method ``anpred`` or ``threshold@<t>``: rate of flagged
    faulty variants), ``false_alarm[method]`` on clean configurations and among clean backends of
    faulty ones (rate over backend verdicts), ``localization`` (top-1 and within one stage, over
    ANPRED's detections), ``propagation`` counts (masked, non-monotonic) and ``skipped`` counts.
    """
    methods = ["anpred"] + [f"threshold@{t:g}" for t in TOLERANCES]
    out: dict[str, Any] = {}
    models_ = sorted({r.model for r in results} | set(cleans))
    for scope in models_ + ["all"]:
        rs = [r for r in results if scope in ("all", r.model)]
        cl = [c if isinstance(c, dict) else c.to_dict() for m, c in cleans.items() if scope in ("all", m)]
        faulty = [r for r in rs if r.kind is not None and not r.skipped]
        null = [r for r in rs if r.kind is None and not r.skipped]
        det: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in methods}
        for r in faulty:
            mag = f"{r.magnitude:g}"
            flags = {"anpred": r.flagged, **{f"threshold@{t}": v for t, v in r.threshold.items()}}
            for m in methods:
                cell = det[m].setdefault(r.kind, {}).setdefault(mag, {"k": 0, "n": 0})
                cell["n"] += 1
                cell["k"] += int(bool(flags[m]))
        for m in methods:
            for k in det[m]:
                for mag, c in det[m][k].items():
                    c["rate"] = c["k"] / c["n"] if c["n"] else None
            tot = [r for r in faulty]
            hit = sum(
                1 for r in tot if ({"anpred": r.flagged, **{f"threshold@{t}": v for t, v in r.threshold.items()}}[m])
            )
            det[m]["all"] = {"all": _rate(hit, len(tot))}
        # false alarms (rates over backend verdicts). All-clean configurations: the clean run's fp32
        # backends and the null configurations' backends (the clean ones and the fault slot running the
        # clean model). The baseline's verdicts on clean backends are the same in every configuration.
        fa: dict[str, Any] = {}
        n_cc = sum(len(c["backends"]) for c in cl) + sum(len(_clean_backends(cleans, r.model)) + 1 for r in null)
        k_cc = sum(len([b for b in c["flagged"] if b in c["backends"]]) for c in cl) + sum(
            len(r.clean_flagged) + int(r.flagged) for r in null
        )
        n_fb = sum(len(_clean_backends(cleans, r.model)) for r in faulty)
        k_fb = sum(len(r.clean_flagged) for r in faulty)
        fa["anpred"] = {
            "clean_configs": _rate(k_cc, n_cc),
            "clean_backends_of_faulty": _rate(k_fb, n_fb),
            "faulty_configs_with_false_alarm": _rate(sum(1 for r in faulty if r.clean_flagged), len(faulty)),
        }
        for t in TOLERANCES:
            key = f"{t:g}"
            k = n = kf = nf = 0
            for c in cl:
                judged = [b for b in c["backends"] if b in c["threshold"]]  # the reference is not judged
                flagged = sum(int(c["threshold"][b][key]) for b in judged)
                repeats = 1 + sum(1 for r in null if r.model == c["model"])
                nfaulty = sum(1 for r in faulty if r.model == c["model"])
                n += len(judged) * repeats
                k += flagged * repeats
                nf += len(judged) * nfaulty
                kf += flagged * nfaulty
            n += len(null)
            k += sum(1 for r in null if r.threshold.get(key))
            fa[f"threshold@{key}"] = {"clean_configs": _rate(k, n), "clean_backends_of_faulty": _rate(kf, nf)}
        detected = [r for r in faulty if r.flagged and r.truth and r.truth.get("stage") is not None]
        top1 = sum(1 for r in detected if r.origin_stage == r.truth["stage"])
        near = sum(1 for r in detected if r.origin_stage is not None and abs(r.origin_stage - r.truth["stage"]) <= 1)
        loc = {"top1": _rate(top1, len(detected)), "within_one": _rate(near, len(detected)), "by_kind": {}}
        for k in sorted({r.kind for r in detected}):
            d = [r for r in detected if r.kind == k]
            loc["by_kind"][k] = {
                "top1": _rate(sum(1 for r in d if r.origin_stage == r.truth["stage"]), len(d)),
                "within_one": _rate(sum(1 for r in d if abs((r.origin_stage or 0) - r.truth["stage"]) <= 1), len(d)),
            }
        prop = {
            "flagged": len([r for r in faulty if r.flagged]),
            "masked": sum(1 for r in faulty if r.flagged and r.propagation == "masked"),
            "non_monotonic": sum(1 for r in faulty if r.flagged and r.non_monotonic),
            "by_kind": {
                p: sum(1 for r in faulty if r.flagged and r.propagation == p)
                for p in ("amplified", "attenuated", "stable", "masked")
            },
        }
        skipped = {}
        for r in rs:
            if r.skipped:
                skipped.setdefault(r.kind, []).append(r.stage)
        out[scope] = {
            "configs": len(faulty),
            "null_configs": len(null),
            "detection": det,
            "false_alarm": fa,
            "localization": loc,
            "propagation": prop,
            "skipped": {k: sorted(set(v)) for k, v in skipped.items()},
        }
    return out


def _clean_backends(cleans: dict[str, Any], model: str) -> list[str]:
    """The clean fp32 backends of ``model`` in ``cleans`` (CleanSummary or its dict)."""
    c = cleans.get(model)
    if c is None:
        return []
    return list(c["backends"] if isinstance(c, dict) else c.backends)


def bars(summary: dict[str, Any]) -> dict[str, Any]:
    """The project's bars on a :func:`summarize` scope: ANPRED's detection rate >= the best baseline's
    at every (kind, magnitude) where that baseline has zero false alarms on clean configurations;
    ANPRED's false-alarm rate 0 on clean configurations; top-1 localization >= 90%. A bar is never
    met on nothing: detection needs at least one faulty configuration, false alarms at least one clean
    verdict, localization at least one detected fault.
    Returns ``{"detection": {"met": bool, "violations": [...]}, "false_alarm": {...}, "localization": {...}}``."""
    det = summary["detection"]
    fa = summary["false_alarm"]
    zero = [m for m in det if m != "anpred" and (fa[m]["clean_configs"]["rate"] or 0) == 0]
    viol = []
    for m in zero:
        for k, mags in det[m].items():
            if k == "all":
                continue
            for mag, c in mags.items():
                a = det["anpred"].get(k, {}).get(mag, {})
                if c["rate"] is not None and (a.get("rate") or 0) < c["rate"]:
                    viol.append(
                        {
                            "baseline": m,
                            "kind": k,
                            "magnitude": mag,
                            "anpred": a.get("rate"),
                            "baseline_rate": c["rate"],
                        }
                    )
    fa_rate = fa["anpred"]["clean_configs"]["rate"]
    top1 = summary["localization"]["top1"]["rate"]
    n = summary.get("configs", 0)
    return {
        "detection": {
            "met": bool(n) and not viol,
            "configs": n,
            "zero_false_alarm_baselines": zero,
            "violations": viol,
        },
        "false_alarm": {"met": fa_rate is not None and fa_rate == 0, "rate": fa_rate},
        "localization": {"met": top1 is not None and top1 >= 0.9, "top1": top1},
    }


def save_results(path: str | Path, payload: dict[str, Any]) -> None:
    """Write the evaluation JSON atomically (schema :data:`EVAL_SCHEMA`)."""
    from anpred.onnx_io import atomic_write_text

    atomic_write_text(Path(path), json.dumps({"schema": EVAL_SCHEMA, **payload}, indent=1, default=json_default))


def json_default(o):
    """The encoder of ``results.json``: numpy floats through :func:`~.measures.finite` (NaN as null, an
    infinity as 1e300, like every float the results hold), anything else as the one JSON encoder
    :func:`anpred.onnx_io.json_default` writes it (numpy integers as numbers, arrays as lists, paths as
    strings)."""
    from anpred.onnx_io import json_default as core_default

    if isinstance(o, np.floating):
        return finite(float(o))
    return core_default(o)
