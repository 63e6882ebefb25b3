"""The reference evaluation: ANPRED vs threshold baselines on injected faults (issues 7 and 10).

For each model, the clean backends (ort, openvino, torch, tf, onnx-reference, and torch-native = eager
PyTorch for the models with a native PyTorch rebuild: all YOLOs) and the reduced-precision
ones (ort-fp16, ort-int8, openvino-bf16) run ONCE on real inputs (photos; rendered document pages for
yolov8n-doclaynet) and seeded uniform random inputs; then every fault kind x every stage x the kind's
magnitudes is injected (passes/faults.py) and only the faulty variant runs (ONNX Runtime, backend label
``fault`` with its own family), judged together with the clean backends' stored tensors (linked, not
recomputed) by ANPRED (``check_run``) and by the threshold baseline at atol = rtol in
{1e-5, 1e-4, 1e-3, 1e-2} on the final outputs against the onnx-reference outputs. See
benchmarks/evaluation/ (its package docstring) for the definitions.

Usage (the command whose numbers are in docs/evaluation.md)::

    .venv/bin/python benchmarks/oracle_eval.py --out eval-out \\
        --models yolov8n,yolov5n,yolov8n-doclaynet --imgsz 320 --real 2 --random 2 --doc-real 2 --doc-random 1

Invalid magnitudes (e.g. round=40), an --out that is a file and --stages the models do not have are
rejected with one message (exit 2) before any backend runs.

Options: --models (yolov8n,yolov5n,yolov8n-doclaynet; yolov8s,yolov5s too), --kinds (default all of
the fp32 kinds of evaluation.DEFAULT_MAGNITUDES), --stages (default all; e.g. 0,2,4), --magnitudes (e.g.
"round=16,11,8;weight-ulp=256"), --imgsz (resizable models; doclaynet is static 1024), --real/--random
(samples per model; --doc-real/--doc-random for doclaynet), --doc-magnitudes (doclaynet override,
default: the middle and the largest magnitude, to fit the time budget), --keep-runs, --no-plots.
Writes OUT/results.json, OUT/summary.md (tables) and OUT/eval_*.png (plots; copy them to docs/images/).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: see benchmarks/evaluation/__init__.py (performance)

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the evaluation package beside this file

import numpy as np  # noqa: E402

import evaluation as ev  # noqa: E402
from anpred.errors import AnpredError  # noqa: E402
from oracle_eval_plots import mag_order, plots  # noqa: E402

DOC = "yolov8n-doclaynet"


def parse_magnitudes(text: str | None) -> dict[str, tuple[float, ...]]:
    """``"round=16,11;weight-ulp=256"`` -> ``{"round": (16.0, 11.0), "weight-ulp": (256.0,)}``."""
    out: dict[str, tuple[float, ...]] = {}
    if not text:
        return out
    for part in text.split(";"):
        if not part.strip():
            continue
        if "=" not in part:
            raise AnpredError(f"--magnitudes: {part!r} is not KIND=M1,M2")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = tuple(float(x) for x in v.split(",") if x.strip())
        except ValueError as err:
            raise AnpredError(f"--magnitudes: {v!r} is not a list of numbers") from err
    return out


def doc_default_magnitudes() -> dict[str, tuple[float, ...]]:
    return {k: (v[len(v) // 2], v[-1]) if len(v) > 2 else v for k, v in ev.DEFAULT_MAGNITUDES.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default=f"{DOC},yolov8n,yolov5n")
    # the fp32 evaluation's kinds: the reduced-precision implementation kinds (passes.faults_lowp)
    # are measured by benchmarks/population_eval.py on the converted models
    ap.add_argument("--kinds", default=",".join(ev.DEFAULT_MAGNITUDES))
    ap.add_argument("--stages", default="all", help="comma-separated stage indices, or 'all'")
    ap.add_argument("--magnitudes", default=None, help='e.g. "round=16,11,8;weight-ulp=256,4096"')
    ap.add_argument(
        "--doc-magnitudes", default=None, help="override for yolov8n-doclaynet (default: middle and largest)"
    )
    ap.add_argument("--imgsz", type=int, default=320, help="input side of resizable models (doclaynet: 1024, static)")
    ap.add_argument("--real", type=int, default=2)
    ap.add_argument("--random", type=int, default=2)
    ap.add_argument("--doc-real", type=int, default=2)
    ap.add_argument("--doc-random", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="eval-out")
    ap.add_argument("--keep-runs", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except AnpredError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def run(args) -> int:
    from tqdm import tqdm

    import models as zoo
    from passes.faults import FAULT_KINDS

    models_ = [m.strip() for m in args.models.split(",") if m.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    mags = parse_magnitudes(args.magnitudes)
    doc_mags = parse_magnitudes(args.doc_magnitudes) if args.doc_magnitudes else {**doc_default_magnitudes(), **mags}
    if not models_:
        raise AnpredError("--models: no model given")
    if not kinds:
        raise AnpredError("--kinds: no fault kind given")
    for m in models_:
        zoo.get(m) if m == DOC else zoo.get(m, imgsz=args.imgsz)  # unknown name / bad size: one clear error
    bad = [k for k in kinds + list(mags) + list(doc_mags) if k not in FAULT_KINDS]
    if bad:
        raise AnpredError(f"unknown fault kind(s) {', '.join(dict.fromkeys(bad))}; known: {', '.join(FAULT_KINDS)}")
    ev.validate_magnitudes(mags)  # every invalid magnitude in one message, before anything runs
    ev.validate_magnitudes(doc_mags)
    if args.stages != "all" and not all(s.strip().isdigit() for s in args.stages.split(",")):
        raise AnpredError(f"--stages must be 'all' or comma-separated stage indices, got {args.stages!r}")
    stages = None if args.stages == "all" else [int(s) for s in args.stages.split(",")]
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise AnpredError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AnpredError(f"--out {out}: cannot create the folder: {err}") from err
    t_all = time.monotonic()
    results: list[ev.ConfigResult] = []
    cleans: dict[str, ev.CleanSummary] = {}
    setups: dict[str, ev.ModelSetup] = {}
    timings: dict[str, dict[str, float]] = {}
    for name in models_:
        doc = name == DOC
        print(f"== {name}: clean run", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        setup = ev.prepare_model(
            name,
            out / name,
            imgsz=None if doc else args.imgsz,
            n_real=args.doc_real if doc else args.real,
            n_random=args.doc_random if doc else args.random,
            seed=args.seed,
            progress=True,
            stages=stages,
        )
        setups[name] = setup
        clean = cleans[name] = ev.clean_summary(setup)
        t1 = time.monotonic()
        grid = ev.configurations(setup, kinds, stages, doc_mags if doc else mags)
        grid = [(None, None, None)] + grid
        for kind, stage, mag in tqdm(grid, desc=name, unit="cfg", file=sys.stderr):
            r = ev.run_configuration(
                setup, clean, kind, stage, mag, out / name / "configs", seed=args.seed, keep=args.keep_runs
            )
            results.append(r)
        timings[name] = {
            "clean_run_s": round(setup.seconds_clean, 1),
            "clean_judge_s": round(clean.seconds, 1),
            "configs_s": round(time.monotonic() - t1, 1),
            "total_s": round(time.monotonic() - t0, 1),
            "configs": len(grid),
        }
        print(f"   {name}: {timings[name]}", file=sys.stderr, flush=True)
        write_outputs(args, out, results, cleans, setups, timings, t_all, plots_=False)
    write_outputs(args, out, results, cleans, setups, timings, t_all, plots_=not args.no_plots)
    print((out / "summary.md").read_text())
    return 0


def write_outputs(args, out, results, cleans, setups, timings, t_all, plots_: bool) -> dict:
    """Summarize and write OUT/results.json, OUT/summary.md (and the plots); called after every model
    so that a failure later keeps the finished models' numbers."""
    from anpred.machine import machine_info

    summary = ev.summarize(results, cleans)
    bars = {scope: ev.bars(s) for scope, s in summary.items()}
    payload = {
        "command": " ".join([sys.executable.split('/')[-1], *sys.argv]),
        "code_version": _code_version(),
        "machine": machine_info(),
        "versions": _versions(),
        "args": vars(args),
        "timings": timings,
        "wall_s": round(time.monotonic() - t_all, 1),
        "models": {n: dict(vars(s)) for n, s in setups.items()},
        "clean": {n: c.to_dict() for n, c in cleans.items()},
        "summary": summary,
        "bars": bars,
        "findings": findings(results, cleans),
        "configs": [r.to_dict() for r in results],
    }
    ev.save_results(out / "results.json", payload)
    (out / "summary.md").write_text(markdown(payload))
    if plots_:
        plots(payload, out)
    return payload


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    v = {}
    for p in ("onnxruntime", "openvino", "torch", "tensorflow-cpu", "onnx", "onnx2torch", "onnx2tf", "numpy"):
        try:
            v[p] = md.version(p)
        except md.PackageNotFoundError:
            v[p] = "absent"
    return v


# ------------------------------------------------------------------------------------------------
def findings(results: list[ev.ConfigResult], cleans: dict[str, ev.CleanSummary]) -> dict:
    """Numbers behind the three published findings.

    - stage-concentrated: for each reduced-precision backend, the share of the total log-growth of its
      deviation (oracle nRMSE vs the consensus, along the anchors in order) that happens in the
      single largest step, and the stage where its deviation first exceeds the floor (origin).
    - dimension-sensitive: Spearman correlation (scipy.stats.spearmanr) between an anchor's channel
      count (dim 1) and the deviation of each reduced-precision backend there; and between the
      channel count and the true amplification of injected faults (output nRMSE / injected nRMSE).
    - non-monotonic propagation: share of ANPRED-detected faults whose profile after the origin is
      amplified at some step and attenuated at another (``BackendVerdict.non_monotonic``), and of
      masked ones (flagged inside, outputs within the floor).
    """
    from scipy.stats import spearmanr

    out: dict = {"stage_concentrated": {}, "dimension_sensitive": {}, "non_monotonic": {}}
    for name, c in cleans.items():
        anchors = c.anchors
        ch = [
            a["shape"][1] if a.get("shape") and len(a["shape"]) > 1 and isinstance(a["shape"][1], int) else None
            for a in anchors
        ]
        for b in ev.LOWP_BACKENDS:
            prof = c.profile.get(b)
            if not prof:
                continue
            vals = [(i, v) for i, v in enumerate(prof) if v is not None and v > 0]
            if len(vals) < 3:
                continue
            logs = [math_log10(v) for _, v in vals]
            steps = [logs[i + 1] - logs[i] for i in range(len(logs) - 1)]
            ups = [s for s in steps if s > 0]
            total_up = sum(ups)
            verdict = c.verdicts.get(b, {})
            out["stage_concentrated"][f"{name}/{b}"] = {
                "first_value": vals[0][1],
                "max_value": max(v for _, v in vals),
                "largest_step_share_of_growth": (max(ups) / total_up) if total_up > 0 else None,
                "largest_step_at": anchors[vals[int(np.argmax(steps)) + 1][0]]["name"] if steps else None,
                "origin_stage": verdict.get("origin_stage"),
                "flagged": verdict.get("flagged"),
                "propagation": verdict.get("propagation"),
                "non_monotonic": verdict.get("non_monotonic"),
            }
            pairs = [(ch[i], v) for i, v in vals if ch[i] is not None and anchors[i]["kind"] != "output"]
            if len(pairs) >= 4:
                rho, p = spearmanr([x for x, _ in pairs], [y for _, y in pairs])
                out["dimension_sensitive"][f"{name}/{b}"] = {"spearman_rho": float(rho), "p": float(p), "n": len(pairs)}
        rs = [
            r
            for r in results
            if r.model == name and r.kind and not r.skipped and r.injected_nrmse and r.output_nrmse and r.truth
        ]
        stage_ch = {}
        for a, k in zip(anchors, ch):
            if a["kind"] != "output" and k is not None:
                stage_ch.setdefault(a["stage"], k)
        pts = [
            (stage_ch.get(r.truth["stage"]), r.output_nrmse / r.injected_nrmse)
            for r in rs
            if stage_ch.get(r.truth["stage"])
        ]
        if len(pts) >= 4:
            rho, p = spearmanr([x for x, _ in pts], [y for _, y in pts])
            out["dimension_sensitive"][f"{name}/faults:amplification-vs-channels"] = {
                "spearman_rho": float(rho),
                "p": float(p),
                "n": len(pts),
            }
        det = [r for r in results if r.model == name and r.kind and r.flagged]
        out["non_monotonic"][name] = {
            "detected": len(det),
            "non_monotonic": sum(1 for r in det if r.non_monotonic),
            "masked": sum(1 for r in det if r.propagation == "masked"),
            "true_profile_non_monotonic": sum(1 for r in det if _true_nonmono(r)),
        }
    return out


def math_log10(v: float) -> float:
    import math

    return math.log10(v)


def _code_version() -> str:
    """The commit this script's tree is at (``git rev-parse HEAD``), or ``$ANPRED_CODE_VERSION`` for a
    tree without ``.git`` (e.g. a ``git archive`` of a commit), else ``"unknown"``."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and (root / ".git").exists():
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("ANPRED_CODE_VERSION", "unknown")


def _true_nonmono(r: ev.ConfigResult, band: float = 2.0) -> bool:
    """The fault's true profile (vs clean ort) after the injection stage both grows and shrinks by
    more than ``band`` between consecutive anchors."""
    vals = [v for v in r.true_profile if v]
    if len(vals) < 3:
        return False
    ratios = [b / a for a, b in zip(vals, vals[1:]) if a > 0]
    return any(x > band for x in ratios) and any(x < 1 / band for x in ratios)


# ------------------------------------------------------------------------------------------------
def _pct(c: dict | None) -> str:
    if not c or c.get("rate") is None:
        return "-"
    return f"{100 * c['rate']:.0f}% ({c['k']}/{c['n']})"


def markdown(p: dict) -> str:
    """Tables of the evaluation (pasted into docs/evaluation.md)."""
    lines = []
    methods = ["anpred"] + [f"threshold@{t:g}" for t in ev.TOLERANCES]
    for scope, s in p["summary"].items():
        trained = (
            ""
            if scope == "all"
            else (" (trained weights)" if p["models"][scope]["trained"] else " (seeded random weights)")
        )
        lines += [
            f"### {scope}{trained}",
            "",
            f"{s['configs']} faulty configurations, {s['null_configs']} null; "
            f"not applicable: " + (", ".join(f"{k} at stages {v}" for k, v in s["skipped"].items()) or "none"),
            "",
        ]
        lines += [
            "Detection rate (faulty backend flagged) per kind and magnitude:",
            "",
            "| kind | magnitude | " + " | ".join(methods) + " |",
            "|---|---|" + "---|" * len(methods),
        ]
        det = s["detection"]
        for kind in sorted(k for k in det["anpred"] if k != "all"):
            for mag in mag_order(kind, det["anpred"][kind]):
                lines.append(
                    f"| {kind} | {mag} | " + " | ".join(_pct(det[m].get(kind, {}).get(mag)) for m in methods) + " |"
                )
        lines.append("| **all** | | " + " | ".join(_pct(det[m]["all"]["all"]) for m in methods) + " |")
        fa = s["false_alarm"]
        lines += [
            "",
            "False-alarm rate (clean fp32 backend verdicts flagged):",
            "",
            "| method | all-clean configurations | clean backends of faulty configurations |",
            "|---|---|---|",
        ]
        for m in methods:
            lines.append(f"| {m} | {_pct(fa[m]['clean_configs'])} | {_pct(fa[m]['clean_backends_of_faulty'])} |")
        loc = s["localization"]
        lines += [
            "",
            f"Localization over ANPRED's detections: top-1 {_pct(loc['top1'])}, within one stage "
            f"{_pct(loc['within_one'])}.",
            "",
            "| kind | top-1 | within one |",
            "|---|---|---|",
        ]
        for k, v in loc["by_kind"].items():
            lines.append(f"| {k} | {_pct(v['top1'])} | {_pct(v['within_one'])} |")
        b = p["bars"][scope]
        lines += [
            "",
            "Bars: detection >= best zero-false-alarm baseline "
            f"({', '.join(b['detection']['zero_false_alarm_baselines']) or 'none'}): "
            f"{_bar_detection(b['detection'])}; "
            f"false alarms 0 on clean: {'met' if b['false_alarm']['met'] else 'NOT met'}; "
            f"top-1 >= 90%: {'met' if b['localization']['met'] else 'NOT met'}.",
            "",
        ]
    # clean runs: reduced precision and detections
    for name, c in p["clean"].items():
        lines += [
            f"### {name}: clean run, reduced-precision backends and detections",
            "",
            "| backend | ANPRED flagged | origin stage | worst anchor | worst nRMSE | propagation | "
            "non-monotonic | baseline critical tol | detections (n) | changed vs consensus | mean IoU |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for b, v in c["verdicts"].items():
            d = c["detections"].get(b, {})
            tol = c["threshold_max"].get(b, {}).get("critical_tolerance")
            lines.append(
                f"| {b} | {v['flagged']} | {v['origin_stage']} | {v['worst_anchor']} | "
                f"{_g(v['worst_primary'])} | {v['propagation']} | {v['non_monotonic']} | "
                f"{_g(tol) if b != c['reference'] else '(reference)'} | {d.get('n', '-')} | "
                f"{d.get('changed', '-')} | {_g(d.get('mean_iou'))} |"
            )
        lines.append("")
    # end-result impact of faults
    lines += [
        "### End-result impact of injected faults (detections vs the clean consensus, summed over samples)",
        "",
        "| model | kind | magnitude | configs | ANPRED flagged | mean injected nRMSE | mean output nRMSE | "
        "mean changed detections (real inputs) | configs changing any detection (real) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows: dict = {}
    for r in p["configs"]:
        if not r["kind"] or r["skipped"]:
            continue
        rows.setdefault((r["model"], r["kind"], r["magnitude"]), []).append(r)
    null = {r["model"]: r for r in p["configs"] if r["kind"] is None}
    for (m, k, mag), rs in sorted(
        rows.items(), key=lambda x: (x[0][0], x[0][1], -x[0][2] if x[0][1] == "round" else x[0][2])
    ):
        real = [r["detections_by_kind"].get("real", {}).get("changed", 0) for r in rs]
        base = null.get(m, {}).get("detections_by_kind", {}).get("real", {}).get("changed", 0)
        lines.append(
            f"| {m} | {k} | {mag:g} | {len(rs)} | {sum(r['flagged'] for r in rs)} | "
            f"{_g(_mean(r['injected_nrmse'] for r in rs))} | {_g(_mean(r['output_nrmse'] for r in rs))} | "
            f"{_g(_mean(real))} | {sum(1 for x in real if x > base)} |"
        )
    lines += [
        "",
        "Null configuration (clean model in the fault slot), changed detections on real inputs: "
        + ", ".join(
            f"{m}: {r.get('detections_by_kind', {}).get('real', {}).get('changed', '-')}" for m, r in null.items()
        ),
        "",
    ]
    lines += ["### Findings (numbers)", "", "```json", json.dumps(p["findings"], indent=1), "```", ""]
    lines += [f"Timings: {json.dumps(p['timings'])}; wall {p['wall_s']} s.", ""]
    return "\n".join(lines)


def _bar_detection(d: dict) -> str:
    if not d.get("configs"):
        return "NOT met (no faulty configuration ran)"
    return "met" if d["met"] else "NOT met: " + json.dumps(d["violations"])


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _g(v) -> str:
    return "-" if v is None else (f"{v:.3g}" if isinstance(v, (int, float)) else str(v))


if __name__ == "__main__":
    sys.exit(main())
