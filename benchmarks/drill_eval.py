"""Drill-down evaluation (issue 19): is the culprit the injected node, and what does it cost?

For each model, the clean backends run once (benchmarks/evaluation, ``prepare_model``); then each
fault kind is injected at each chosen stage (passes/faults.py, the kind's middle magnitude), only the
faulty variant runs (ONNX Runtime, label ``fault``, its own family), the run is judged, and where the
fault is flagged :func:`anpred.drill.drill_run` drills it down. A hit: the culprit's output is the
injected fault's first changed tensor (``FaultTruth.value``) or its node is the injected node. The
clean configuration (no fault) must produce no culprit. Cost: the drill's wall time and sub-runs
beside the time of the run it drills (the clean backends' run + the faulty one).

Usage (the command whose numbers are in docs/evaluation.md, "Drill-down")::

    .venv/bin/python benchmarks/drill_eval.py --out drill-eval --imgsz 160 \\
        --models yolov8n,yolov5n --kinds round,approx-sigmoid,weight-ulp,rounding-mode,padding-same \\
        --stages 0,1,2,3,4,5,6,7
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import evaluation as ev  # noqa: E402

BACKENDS = ("ort", "openvino", "torch", "onnx-reference")


def _mb(folder: Path) -> float:
    """MiB of the files under ``folder`` (symbolic links followed: the linked clean tensors count)."""
    total = 0
    for root, _, files in os.walk(folder, followlinks=True):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="yolov8n")
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--kinds", default="round,approx-sigmoid,norm-epsilon,weight-ulp")
    ap.add_argument("--stages", default="0,2,4,6")
    ap.add_argument("--real", type=int, default=2)
    ap.add_argument("--random", type=int, default=0)
    a = ap.parse_args(argv)
    from anpred.drill import drill_run
    from anpred.judge import check_run

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        t0 = time.perf_counter()
        setup = ev.prepare_model(
            name, out / name, imgsz=a.imgsz, n_real=a.real, n_random=a.random, backends=BACKENDS, lowp=()
        )
        clean = ev.clean_summary(setup)
        t_clean = time.perf_counter() - t0
        stages = [int(s) for s in a.stages.split(",")]
        configs = [(None, None, None)] + [
            (k, s, ev.DEFAULT_MAGNITUDES[k][len(ev.DEFAULT_MAGNITUDES[k]) // 2])
            for k in a.kinds.split(",")
            for s in stages
        ]
        for kind, stage, mag in configs:
            t1 = time.perf_counter()
            res = ev.run_configuration(setup, clean, kind, stage, mag, out / name / "configs", keep=True)
            t_run = time.perf_counter() - t1 + t_clean
            row = {
                "model": name,
                "kind": kind or "clean",
                "stage": stage,
                "magnitude": mag,
                "skipped": res.skipped,
                "flagged": res.flagged,
                "truth": res.truth,
            }
            if not res.skipped and (res.flagged or kind is None):
                tag = "null" if kind is None else f"{kind}-s{stage}-m{mag:g}"
                run_dir = out / name / "configs" / tag / "run"
                rep = check_run(run_dir, config=ev.measures.judge_config())
                t2 = time.perf_counter()
                d = drill_run(run_dir, rep)
                c = d["culprits"].get(ev.FAULT_LABEL)
                row.update(
                    drill_s=time.perf_counter() - t2,
                    run_s=t_run,
                    runs=d["runs"],
                    culprit=c,
                    drill_mb=_mb(run_dir / "drill"),
                    run_tensors_mb=_mb(run_dir / "tensors"),
                    other_culprits=sorted(b for b in d["culprits"] if b != ev.FAULT_LABEL),
                )
                if res.truth and c:
                    row["hit"] = c["output"] == res.truth["value"] or c["node"] == res.truth["node"]
                elif res.truth:
                    row["hit"] = False
            rows.append(row)
            print(
                json.dumps(
                    {k: row.get(k) for k in ("model", "kind", "stage", "flagged", "hit", "drill_s", "run_s", "runs")}
                ),
                flush=True,
            )
            (out / "drill_results.json").write_text(json.dumps(rows, indent=1, default=str))
    lines = [
        "| model | fault kind | detected | culprit = injected node | drill runs | drill s / run s | "
        "drill MiB / run tensors MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, k in sorted({(r["model"], r["kind"]) for r in rows}):
        rs = [r for r in rows if r["model"] == m and r["kind"] == k and not r["skipped"]]
        det = [r for r in rs if r["flagged"]] if k != "clean" else rs
        hits = sum(1 for r in det if r.get("hit"))
        runs = [r["runs"] for r in det if "runs" in r]
        ratio = [r["drill_s"] / r["run_s"] for r in det if "drill_s" in r]
        hit_txt = (
            f"{hits}/{len(det)}"
            if k != "clean"
            else (
                "no culprit"
                if all(r.get("culprit") is None and not r.get("other_culprits") for r in rs)
                else "CULPRIT ON A CLEAN RUN"
            )
        )
        lines.append(
            f"| {m} | {k} | {len(det)}/{len(rs)} | {hit_txt} | "
            f"{min(runs, default=0)}-{max(runs, default=0)} | "
            f"{(sum(ratio) / len(ratio)) if ratio else 0:.2f} | "
            + (
                f"{max(r['drill_mb'] for r in det if 'drill_mb' in r):.1f} / "
                f"{max(r['run_tensors_mb'] for r in det if 'drill_mb' in r):.1f} |"
                if any("drill_mb" in r for r in det)
                else "- |"
            )
        )
    (out / "drill_summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
