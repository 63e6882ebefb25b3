"""How much judging intermediate anchors on K sampled positions changes (issue 20; docs/task.md,
"Sampled positions"): the same stored run judged in full and on K positions per anchor, per K.

For a run folder (``anpred run`` / ``anpred test`` output with every anchor stored), judges it with
every element (``positions=0``) and with each K of --positions, in one process, and reports per K:
the judging time per sample, the largest relative change of a cell's pooled primary statistic over
the (anchor, backend) cells of the sampled anchors (median and max), the same for the pooled
Wasserstein distance (computed on min(K, DISTRIBUTION_POSITIONS) positions of every larger anchor,
the outputs included), whether any cell's verdict or
any backend's standing changed, and the cells whose relative change exceeds 10%. Usage::

    .venv/bin/python -m anpred test yolov8n-doclaynet --inputs PAGES --backends ort,openvino,torch,ort-int8 -o OUT
    .venv/bin/python benchmarks/bench_positions.py OUT/run --positions 4096,16384,65536,262144
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from anpred.judge.positions import DISTRIBUTION_POSITIONS  # noqa: E402


def judge(run_dir: str, k: int):
    from anpred.judge.check import finish, usable_backends
    from anpred.judge.samples import SampleJudge

    run = usable_backends(run_dir, oracle="consensus", config=None, allow_incomplete=True)
    t = time.perf_counter()
    j = SampleJudge(run, positions=k)
    j.add_store(run.store)
    rep = finish(run, j.judged())
    return rep, (time.perf_counter() - t) / max(1, len(run.store.sample_ids)), run.store.manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--positions", default="4096,16384,65536")
    a = ap.parse_args()
    full, t_full, manifest = judge(a.run_dir, 0)
    sizes = {
        x.name: int(np.prod(x.shape)) for x in manifest.anchors if x.shape and all(isinstance(d, int) for d in x.shape)
    }
    outputs = {x.name for x in manifest.anchors if x.kind == "output"}
    rows = [{"positions": 0, "seconds_per_sample": round(t_full, 3)}]
    for k in [int(v) for v in a.positions.split(",")]:
        rep, t, _ = judge(a.run_dir, k)
        rel, changed, big, w1 = [], [], [], []
        pairs = [(c, None) for c in rep.cells] + [(c, pop) for pop, cs in rep.population_cells.items() for c in cs]
        for c, pop in pairs:
            w = full.cell(c.anchor, c.backend, pop)
            if (
                pop is None
                and w is not None
                and sizes.get(c.anchor, 0) > min(k, DISTRIBUTION_POSITIONS)
                and np.isfinite(w.stats.wasserstein)
                and w.stats.wasserstein > 0
            ):
                # the Wasserstein distance (outputs included): on min(K, DISTRIBUTION_POSITIONS) positions
                w1.append(abs(c.stats.wasserstein - w.stats.wasserstein) / w.stats.wasserstein)
            if c.anchor in outputs or sizes.get(c.anchor, 0) <= k:
                continue
            if w is None or not np.isfinite(w.primary) or w.primary == 0:
                continue
            r = abs(c.primary - w.primary) / abs(w.primary)
            rel.append(r)
            if r > 0.10:
                big.append(f"{c.anchor}/{c.backend}{'/' + pop if pop else ''}: {w.primary:.3g} -> {c.primary:.3g}")
            if c.flagged != w.flagged:
                changed.append(f"{c.anchor}/{c.backend}{'/' + pop if pop else ''}: flagged {w.flagged} -> {c.flagged}")
        standings = {b: (v.status, v.origin_anchor) for b, v in rep.verdicts.items()}
        standings_full = {b: (v.status, v.origin_anchor) for b, v in full.verdicts.items()}
        rows.append(
            {
                "positions": k,
                "seconds_per_sample": round(t, 3),
                "cells": len(rel),
                "median_rel_change": float(np.median(rel)) if rel else None,
                "max_rel_change": float(np.max(rel)) if rel else None,
                "wasserstein_cells": len(w1),
                "wasserstein_median_rel_change": float(np.median(w1)) if w1 else None,
                "wasserstein_max_rel_change": float(np.max(w1)) if w1 else None,
                "verdicts_changed": changed,
                "cells_over_10pct": big[:10],
                "standings_equal": standings == standings_full,
                "standings": standings,
                **({} if standings == standings_full else {"standings_full": standings_full}),
            }
        )
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
