"""False alarms of the oracle on clean runs of zoo models that the reference evaluation does not use.

The localization trace-back and the sustained-departure rule (``origin_k``, ``origin_floor_fraction``,
``sustained_anchors`` in :mod:`anpred.defaults`) were added after the evaluation of docs/evaluation.md
showed where the per-anchor rule missed and mislocalized faults. Their false-alarm safety is checked
here on *other* models: each is instrumented and run once on the clean fp32 backends and the
reduced-precision ones (:func:`evaluation.prepare_model`), judged with the default oracle, and
the script prints per model: flagged backends (with the rule that flagged them), and over the clean
voting backends the largest ratio of S to the peers' median (the quantity ``origin_k`` is compared
with) and the longest run of departures along the data flow (``sustained_anchors`` flags >= 3).

Usage:
  .venv/bin/python benchmarks/clean_holdout.py [--models
  yolov8s:320,yolov5s:320,ppocr-rec,mobilenetv2-keras,ppocr-det:320]
      [--real 2] [--random 6] [--work /tmp/anpred-holdout] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def measure(name: str, size: int | None, work: Path, real: int, random: int) -> dict:
    import models
    from anpred.judge import check_run
    from anpred.defaults import OracleConfig
    from evaluation import prepare_model

    entry = models.REGISTRY[name]
    folder = work / f"{name}-{size or 'default'}"
    t0 = time.perf_counter()
    setup = prepare_model(name, folder, imgsz=size if entry.resizable else None, n_real=real, n_random=random)
    cfg = OracleConfig(reservoir=0)
    rep = check_run(setup.clean_dir, config=cfg)
    votes = {b for b, v in rep.verdicts.items() if v.votes}
    worst_ratio, worst_where = 0.0, ""
    dep: dict[str, list[str]] = {b: [] for b in votes}
    for c in rep.cells:  # the oracle's departure test (Oracle._departs), peers' median 0 included
        if c.backend not in votes or c.peer_level is None:
            continue
        r = c.primary / c.peer_level if c.peer_level > 0 else (math.inf if c.primary > 0 else 0.0)
        if r > worst_ratio:
            worst_ratio, worst_where = r, f"{c.backend} at {c.anchor} (S {c.primary:.3g})"
        if c.nonfinite or (c.primary > cfg.origin_k * c.peer_level and c.primary > cfg.origin_floor_fraction * c.floor):
            dep[c.backend].append(c.anchor)
    flagged = {
        b: {"anchors": v.flagged_anchors, "rules": sorted({_rule(rep.cell(a, b).reason) for a in v.flagged_anchors})}
        for b, v in rep.verdicts.items()
        if v.flagged
    }
    return {
        "model": name,
        "size": size,
        "samples": rep.samples,
        "backends": sorted(rep.verdicts),
        "status": rep.status,
        "flagged": flagged,
        "worst_ratio_to_peers": worst_ratio,
        "where": worst_where,
        "departures": {b: a for b, a in dep.items() if a},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _rule(reason: str) -> str:
    """Which oracle rule flagged a cell, from its reason (anpred.judge.Oracle.finish)."""
    for prefix, rule in (("sustained", "sustained"), ("signal lost", "signal-lost")):
        if reason.startswith(prefix):
            return rule
    return "per-anchor"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="yolov8s:320,yolov5s:320,ppocr-rec,mobilenetv2-keras,ppocr-det:320")
    ap.add_argument("--real", type=int, default=2)
    ap.add_argument("--random", type=int, default=6)
    ap.add_argument("--work", default="/tmp/anpred-holdout")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = []
    for spec in a.models.split(","):
        name, _, size = spec.partition(":")
        r = measure(name, int(size) if size else None, Path(a.work), a.real, a.random)
        out.append(r)
        print(
            f"{name}:{size or '-'} {r['samples']} samples, {len(r['backends'])} backends, {r['seconds']} s: "
            f"status {r['status']}; flagged {r['flagged'] or 'none'}; clean voters: largest S / peers' median "
            f"{r['worst_ratio_to_peers']:.2f} ({r['where']}); departures {r['departures'] or 'none'}",
            flush=True,
        )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
