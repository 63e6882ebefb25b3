"""Benchmark: the dashboard (``anpred dashboard``) at 100 models x 30 backends x 200 runs.

Builds a synthetic history database with the schema :mod:`anpred.report.history` writes (its own DDL,
through :func:`anpred.report.history.record_bisection` and a first real connection): per model 200 runs,
per run 30 backends (verdict rows with library versions that change every ~40 runs, beside them the
run facts real backends record in ``versions`` (:func:`_versions`), 5 % of the
backends flagged after a version change, their origin anchor and culprit operator), per (run,
backend) one cell per anchor (6 anchors; ``stats`` holds only the nRMSE, where a real report stores
all statistics: the database is smaller than a real one, the dashboard reads none of them), task
metrics (``truth.top1``) for a fifth of the models with drops beyond the margin, and one bisection
per flagged series. Then measures:

- the history's size; ``collect`` + ``write_site`` time (the site's build);
- the site's size (one ``index.html``);
- its load time in headless Chromium: the page's own ``performance.now()`` when its script has drawn
  the grid (``data-render-ms``: navigation start to the grid drawn, HTML and JSON parsing included),
  and the wall time of a ``chromium --screenshot`` process (start, load, layout, paint, PNG) less
  the same for an empty page (Chromium's own start and exit).

Usage: python benchmarks/bench_dashboard.py [--models 100] [--backends 30] [--runs 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAMILIES = ["onnxruntime", "openvino", "torch", "tensorflow", "tvm", "mnn", "ncnn", "ai-edge-litert"]
PRECISIONS = ["fp32", "fp16", "int8"]
OPS = ["Conv", "Softplus", "AveragePool", "Resize", "LayerNormalization", "Gelu", "MatMul"]


def _versions(fam: str, prec: str, version: str, model: int, rng: random.Random) -> dict[str, str]:
    """A verdict row's ``versions`` as the backends record them: the package's version, ``python``,
    and the run facts some backends record beside it (per model: the converted model's hash, the
    kernels' precisions, the ops after optimisation; they are not versions, the dashboard leaves them
    out, but they make the rows as long and as varied as real ones)."""
    v = {"python": "3.11.2", fam: version}
    if fam == "openvino":
        v["openvino_build"] = f"{version}-17911-83c047443de-releases/2026/4"
        v["openvino_cpu_capabilities"] = "FP32 FP16 INT8 BIN EXPORT_IMPORT"
        v["openvino_compiled_precision_hint"] = "f32"
        v["openvino_runtime_precisions"] = f"Const/fp32:{4 + model % 7},Convolution/fp32:{8 + model % 5},Result/fp32:1"
    if prec == "fp16":
        v["onnxconverter-common"] = "1.14.0"
        v["fp16_model_sha256"] = f"{model * 2654435761 % 2**64:016x}" * 4
        v["converted_weights"] = f"float16:{10 + model % 9},float32:0"
        v["ort_optimized_ops"] = f"Conv:{6 + model % 4},Relu:{3 + model % 3},Cast:{2 + model % 2}"
        v["ort_kernel_precisions"] = f"Conv/fp16:{6 + model % 4},Relu/fp16:{3 + model % 3}"
    if prec == "int8":
        v["int8_model_sha256"] = f"{model * 40503 % 2**64:016x}" * 4
        v["mlas_u8s8_kernel"] = rng.choice(["avx512vnni", "avx2"])
    return v


def synthetic(db: Path, models: int, backends: int, runs: int, seed: int = 0) -> dict[str, int]:
    """Write the synthetic history (module docstring) to ``db``; returns row counts."""
    from anpred.report.history import create

    rng = random.Random(seed)
    create(db)
    con = sqlite3.connect(str(db))
    bnames = [
        (
            f"{FAMILIES[i % len(FAMILIES)]}-{PRECISIONS[(i // len(FAMILIES)) % 3]}-{i}",
            FAMILIES[i % len(FAMILIES)],
            PRECISIONS[(i // len(FAMILIES)) % 3],
        )
        for i in range(backends)
    ]
    anchors = [f"anchor/{k:02d}/t{k}" for k in range(5)] + ["output/y"]
    counts = {"runs": 0, "verdicts": 0, "cells": 0, "tasks": 0, "bisections": 0}
    rid = 0
    # a flagged series turns bad at a release (every 40 runs), as a bisection would find it
    bad = {
        (m, b): 40 * rng.randrange(1, max(2, runs // 40))
        for m in range(models)
        for b in range(backends)
        if rng.random() < 0.05
    }
    t0 = datetime.datetime(2026, 1, 1)
    for m in range(models):
        with con:
            for r in range(runs):
                rid += 1
                created = (t0 + datetime.timedelta(hours=6 * r, seconds=m)).isoformat()
                con.execute(
                    "INSERT INTO runs (id, created, run_dir, model, model_sha256, machine, cpu, status, "
                    "oracle, samples, inputs, inputs_sha256, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        rid,
                        created,
                        f"/nowhere/m{m}/r{r}/run",
                        f"model-{m:03d}",
                        "",
                        "{}",
                        "",
                        "consistent",
                        "consensus",
                        4,
                        "{}",
                        "inputs-a",
                        None,
                    ),
                )
                verdicts, cells, tasks = [], [], []
                for b, (name, fam, prec) in enumerate(bnames):
                    ver = _versions(fam, prec, f"{1 + b % 3}.{r // 40}.0", m, rng)
                    flagged = (m, b) in bad and r >= bad[(m, b)]
                    base = {"fp32": 1e-7, "fp16": 1e-3, "int8": 2e-2}[prec]
                    vals = [
                        base * (1 + k) * rng.uniform(0.7, 1.3) * (300 if flagged and k >= 2 else 1)
                        for k in range(len(anchors))
                    ]
                    worst = max(range(len(anchors)), key=lambda k: vals[k])
                    verdicts.append(
                        (
                            rid,
                            name,
                            fam,
                            prec,
                            json.dumps(ver),
                            int(flagged),
                            anchors[2] if flagged else None,
                            2 if flagged else None,
                            anchors[worst],
                            vals[worst],
                            "amplified" if flagged else "none",
                            None,
                            None,
                            "flagged" if flagged else "consistent",
                            f"node{m}_{b}" if flagged else None,
                            OPS[(m + b) % len(OPS)] if flagged else None,
                        )
                    )
                    cells += [
                        (rid, name, a, k, vals[k], int(flagged and k >= 2), json.dumps({"nrmse": vals[k]}))
                        for k, a in enumerate(anchors)
                    ]
                    if m % 5 == 0:
                        top1 = 0.9 - (0.05 if flagged else 0.0) + rng.uniform(-0.003, 0.003)
                        tasks.append((rid, name, "classify", "truth.top1", top1))
                con.executemany("INSERT INTO verdicts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", verdicts)
                con.executemany("INSERT INTO cells VALUES (?,?,?,?,?,?,?)", cells)
                con.executemany("INSERT INTO tasks VALUES (?,?,?,?,?)", tasks)
                counts["runs"] += 1
                counts["verdicts"] += len(verdicts)
                counts["cells"] += len(cells)
                counts["tasks"] += len(tasks)
    con.close()
    from anpred.report.history import record_bisection

    for (m, b), r in list(bad.items())[:50]:
        name, fam, _ = bnames[b]
        record_bisection(
            db,
            {
                "package": fam,
                "model": f"model-{m:03d}",
                "backend": name,
                "candidates": ["a", "b"],
                "first_bad": f"{1 + b % 3}.{r // 40}.0",
                "last_good": f"{1 + b % 3}.{max(0, r // 40 - 1)}.0",
                "origin_stage": 2,
                "culprit": {"node": f"node{m}_{b}", "op_type": OPS[(m + b) % len(OPS)]},
            },
            "synthetic",
            db.parent,
        )
        counts["bisections"] += 1
    return counts


def _chromium(args: list[str], profile: Path) -> tuple[str, float]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("headless Chromium not installed (apt-get install -y chromium)")
    t = time.perf_counter()
    out = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    return out, time.perf_counter() - t


def chromium_load(page: Path, profile: Path) -> tuple[float, int, int, float]:
    """``(render ms from the page, cells drawn, script errors, wall s of a 1400x900 screenshot)``:
    the page's own clock when its script has drawn the grid (``--dump-dom``), and a screenshot's
    process (start, load, layout, paint, PNG)."""
    out, _ = _chromium(["--dump-dom", page.as_uri()], profile)
    body = re.search(r"<body([^>]*)>", out)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1) if body else ""))
    _, wall = _chromium(
        [f"--screenshot={profile.parent / (page.stem + '.png')}", "--window-size=1400,900", page.as_uri()], profile
    )
    return float(attrs.get("render-ms", "nan")), int(attrs.get("cells", "0")), int(attrs.get("errors", "-1")), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--backends", type=int, default=30)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out", default="bench-dashboard")
    args = ap.parse_args()
    from anpred.dashboard import SiteOptions, collect, write_site

    out = Path(args.out).absolute()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    db = out / "history.sqlite"
    t = time.perf_counter()
    counts = synthetic(db, args.models, args.backends, args.runs)
    print(f"synthetic history: {counts} in {time.perf_counter() - t:.1f} s, {db.stat().st_size / 2**20:.1f} MiB")
    t = time.perf_counter()
    hist = collect([db])
    t_collect = time.perf_counter() - t
    page = write_site(hist, out / "site", SiteOptions(title="synthetic: dashboard benchmark"))
    t_build = time.perf_counter() - t
    regs = sum(e["kind"] == "regression" for s in hist.series for e in s.events)
    items = {(k, v) for s in hist.series for p in s.points for k, v in p.versions.items()}
    print(
        f"site build: {t_build:.2f} s (collect {t_collect:.2f} s); {len(hist.series)} cells, {regs} regressions; "
        f"{len(items)} library versions in the filter; index.html {page.stat().st_size / 2**20:.2f} MiB"
    )
    empty = out / "empty.html"
    empty.write_text("<!doctype html><body data-render-ms=0 data-cells=0 data-errors=0></body>")
    base = sorted(chromium_load(empty, out / "profile")[3] for _ in range(3))[1]
    loads = [chromium_load(page, out / "profile") for _ in range(3)]
    render, wall = (sorted(x[k] for x in loads)[1] for k in (0, 3))
    print(
        f"chromium: grid drawn {render:.0f} ms after navigation start ({loads[0][1]} cells, {loads[0][2]} script "
        f"errors); a screenshot {wall:.2f} s against {base:.2f} s for an empty page: load, layout and paint "
        f"{wall - base:.2f} s (medians of 3)"
    )


if __name__ == "__main__":
    main()
