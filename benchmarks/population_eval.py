"""Evaluation of the precision populations (issue 17): implementation faults injected into ONE member
of an int8 or fp16 population, judged three ways.

For each zoo model: one clean run (fp32 voters + the int8 and fp16 populations, one conversion per
precision, cached) judged by ``anpred check`` (false alarms: any verdict raised on it); then per fault
(kind, magnitude, stage, target backend) a run folder that links every clean backend's tensors except
the target's, whose faulty converted model is run anew (``options["fault"]``, the other members run
the clean converted model), judged:

- **populations** (today's code): the target detected when either of its verdicts flags it
  (``any_flagged``), localized when the flagging verdict's origin stage is the fault's stage (the
  implementation verdict's origin when it is flagged, else the budget's); a false alarm when another
  backend is flagged (other than by the budget verdict of a whole population that loses the signal,
  which the clean run shows too, counted separately);
- **fp32-only** (the oracle before issue 17): the same folder with the target's population peers
  left out, so the target is judged against the fp32 consensus alone with the constant floor of its
  precision (``floor_and_basis`` fallback: exactly the previous rule);
- **best fixed tolerance**: the target's output nRMSE against the fp32 consensus compared with the
  largest clean output nRMSE of that precision over every clean run of the evaluation (the smallest
  fixed tolerance with no false alarm, chosen in-sample: generous to the baseline).

Usage::

    .venv/bin/python benchmarks/population_eval.py --out OUT --models yolov8n:320,yolov5n:320 \\
        --real 2 --random 1 --stages 1,3,5

``OUT/results.json`` holds every number; the tables are printed (docs/evaluation.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import evaluation as ev  # noqa: E402

FP32 = ("ort", "openvino", "onnx-reference", "torch")
INT8 = ("ort-int8", "ort-int8-noopt", "openvino-int8", "onnx-reference-int8")
FP16 = ("ort-fp16", "ort-fp16-noopt", "openvino-fp16", "onnx-reference-fp16", "torch-fp16")
# (kind, magnitude, target backend); stages from --stages
FAULTS = (
    ("quantize-rounding", 1, "ort-int8"),
    ("zero-point", 1, "openvino-int8"),
    ("zero-point", 4, "openvino-int8"),
    ("zero-point", 4, "onnx-reference-int8"),
    ("accumulator-saturation", 16, "ort-int8"),
    ("fp16-overflow", 14, "ort-fp16"),
    ("fp16-overflow", 14, "openvino-fp16"),
    ("fp16-overflow", 14, "torch-fp16"),
)


def _add_backend(store, side) -> None:
    """Link the single backend of run ``side`` into ``store``."""
    b = next(iter(side.statuses()))
    os.symlink(side.backend_dir(b).resolve(), store.backend_dir(b), target_is_directory=True)
    store.meta["backends"][b] = side.meta["backends"][b]
    store.save_meta()


def _output_nrmse(rep, backend: str, outputs: list[str]) -> float:
    vals = [c.primary for c in rep.cells if c.backend == backend and c.anchor in outputs]
    return max(vals) if vals else float("nan")


def _flags(rep) -> dict[str, Any]:
    """Per backend: the anchors its budget (main) and implementation verdicts flag, and the stages."""
    stage = {a["name"]: a["stage"] for a in rep.anchors}
    out = {}
    for b, v in rep.verdicts.items():
        impl = v.implementation
        out[b] = {
            "budget": sorted(v.flagged_anchors),
            "implementation": sorted(impl.flagged_anchors) if impl else [],
            "implementation_origin": impl.origin_stage if impl and impl.flagged else None,
            "first_stage": {a: stage.get(a) for a in v.flagged_anchors},
        }
    return out


def _new(now: dict[str, Any], clean: dict[str, Any] | None) -> tuple[bool, int | None]:
    """Whether a backend's verdicts flag something its clean verdicts did not (implementation flags,
    or budget flags at other anchors), and the stage where: the implementation verdict's origin, else
    the earliest stage among the newly flagged budget anchors."""
    clean = clean or {"budget": [], "implementation": []}
    if now["implementation"] and not clean["implementation"]:
        return True, now["implementation_origin"]
    extra = [a for a in now["budget"] if a not in clean["budget"]]
    if extra:
        return True, min(now["first_stage"][a] for a in extra)
    return False, None


def _reused_setup(name: str, work: Path):
    """The :class:`evaluation.ModelSetup` of a clean run already in ``work/clean`` (``--reuse``)."""
    from anpred.run import RunStore

    store = RunStore.open(work / "clean")
    st = store.statuses()
    ok = [b for b, x in st.items() if x.status == "ok"]
    return ev.ModelSetup(
        name=name,
        trained=False,
        imgsz=(0, 0),
        layout=None,
        anchored=str(work / "anchored.onnx"),
        clean_dir=str(work / "clean"),
        samples={sid: "" for sid in store.sample_ids},
        backends=[b for b in ok if b in FP32],
        lowp=[b for b in ok if b not in FP32],
    )


def _fp32_only_clean_flags(setup, work: Path, ok: list[str], targets: set[str], cfg) -> dict[str, Any]:
    """The fp32-only judgement of each clean population member in ``targets`` (the rule before issue 17),
    for the baseline of what "newly flagged" means there: member -> its flags (:func:`_flags`) in a run
    of the clean fp32 backends and that member only (linked under WORK/fp32-only-clean/<member>)."""
    from anpred.judge import check_run

    old_clean: dict[str, Any] = {}
    for b in targets:
        pop = INT8 if b in INT8 else FP16
        only = ev.link_run(
            Path(setup.clean_dir), work / "fp32-only-clean" / b, [x for x in ok if x not in pop or x == b]
        )
        old_clean[b] = _flags(check_run(only.root, config=cfg))[b]
    return old_clean


def evaluate_model(
    name: str,
    work: Path,
    *,
    imgsz: int | None,
    n_real: int,
    n_random: int,
    stages: list[int] | None,
    faults=FAULTS,
    reuse: bool = False,
) -> dict[str, Any]:
    from anpred.judge import check_run
    from anpred.run import BackendSpec, RunStore, run_model

    t0 = time.monotonic()
    if reuse and (work / "clean" / "run.json").is_file():
        setup = _reused_setup(name, work)
    else:
        setup = ev.prepare_model(
            name,
            work,
            imgsz=imgsz,
            n_real=n_real,
            n_random=n_random,
            backends=list(FP32),
            lowp=list(INT8 + FP16),
            stages=stages,
        )
    clean_s = time.monotonic() - t0
    from evaluation.measures import judge_config

    cfg = judge_config()
    t1 = time.monotonic()
    clean = check_run(setup.clean_dir, config=cfg)
    check_s = time.monotonic() - t1
    store = RunStore.open(setup.clean_dir)
    man = store.manifest
    outputs = [a.name for a in man.anchors if a.kind == "output"]
    stats = {b: s for b, s in store.statuses().items()}
    res: dict[str, Any] = {
        "model": name,
        "imgsz": imgsz,
        "samples": len(store.sample_ids),
        "seconds_clean_run": round(clean_s, 1),
        "seconds_clean_check": round(check_s, 1),
        "backends": {
            b: {
                "status": s.status,
                "precision": s.precision,
                "reason": s.reason[:300],
                "seconds_prepare": round(s.seconds_prepare, 1),
                "seconds_run": round(s.seconds_run, 1),
            }
            for b, s in stats.items()
        },
        "clean": {
            "status": clean.status,
            "flags": _flags(clean),
            "scales": clean.scales,
            "output_nrmse": {b: _output_nrmse(clean, b, outputs) for b in clean.verdicts},
        },
        "faults": [],
    }
    ok = [b for b, s in stats.items() if s.status == "ok"]
    clean_flags = _flags(clean)
    old_clean = _fp32_only_clean_flags(setup, work, ok, {t for _, _, t in faults if t in ok}, cfg)
    all_stages = [s.index for s in man.stages] if stages is None else stages
    inputs = Path(setup.anchored).parent / "inputs"
    for kind, mag, target in faults:
        if target not in ok:
            continue
        pop = INT8 if target in INT8 else FP16
        for st in all_stages:
            tag = f"{kind}-{mag:g}-{target}-s{st}"
            cdir = work / "faults" / tag
            side_dir = cdir / "side"
            shutil.rmtree(cdir, ignore_errors=True)
            spec = BackendSpec(target, options={"fault": {"kind": kind, "stage": st, "magnitude": mag, "seed": 0}})
            side = run_model(setup.anchored, [spec], inputs, side_dir, overwrite=True, progress=False)
            sst = side.statuses()[target]
            row: dict[str, Any] = {
                "kind": kind,
                "magnitude": mag,
                "target": target,
                "stage": st,
                "status": sst.status,
                "reason": sst.reason[:300],
            }
            if sst.status != "ok":
                res["faults"].append(row)
                continue
            full = ev.link_run(Path(setup.clean_dir), cdir / "populations", [b for b in ok if b != target])
            _add_backend(full, side)
            rep = check_run(full.root, config=cfg)
            only = ev.link_run(
                Path(setup.clean_dir), cdir / "fp32-only", [b for b in ok if b != target and b not in pop]
            )
            _add_backend(only, side)
            old = check_run(only.root, config=cfg)
            flags = _flags(rep)
            det, where = _new(flags[target], clean_flags.get(target))
            odet, owhere = _new(_flags(old)[target], old_clean.get(target))
            row.update(
                {
                    "detected": det,
                    "origin_stage": where,
                    "implementation": bool(flags[target]["implementation"]),
                    "budget_new": sorted(set(flags[target]["budget"]) - set(clean_flags[target]["budget"])),
                    "others_flagged": sorted(b for b in flags if b != target and _new(flags[b], clean_flags.get(b))[0]),
                    "fp32_only_detected": odet,
                    "fp32_only_origin": owhere,
                    "output_nrmse": _output_nrmse(rep, target, outputs),
                }
            )
            res["faults"].append(row)
            shutil.rmtree(cdir, ignore_errors=True)
    return res


def summarize(results: list[dict[str, Any]]) -> str:
    """The tables: clean false alarms per model; per fault kind detection/localization for the three
    judges (the fixed tolerance per precision = the largest clean output nRMSE of that precision)."""
    lines = []
    tol: dict[str, float] = {}
    for r in results:
        for b, v in r["clean"]["output_nrmse"].items():
            p = "int8" if b in INT8 else "fp16" if b in FP16 else None
            if p and v == v:
                tol[p] = max(tol.get(p, 0.0), v)
    lines.append("clean runs (implementation / budget verdicts raised):")
    for r in results:
        if r.get("error"):
            lines.append(f"  {r['model']}: NOT RUN: {r['error'][:300]}")
            continue
        impl = [b for b, f in r["clean"]["flags"].items() if f["implementation"]]
        bud = [f"{b} ({', '.join(f['budget'])})" for b, f in r["clean"]["flags"].items() if f["budget"]]
        lines.append(f"  {r['model']}: implementation {impl or 'none'}; budget {bud or 'none'}")
    lines.append(f"best fixed tolerance (largest clean output nRMSE per precision): {tol}")
    lines.append(
        f"{'kind':<24}{'target':<16}{'runs':>5}{'pop det':>9}{'pop loc':>9}{'fp32 det':>9}"
        f"{'fp32 loc':>9}{'tol det':>8}{'false al':>9}"
    )
    rows: dict[tuple, list] = {}
    for r in results:
        for f in r["faults"]:
            if f["status"] == "ok":
                rows.setdefault((f["kind"], f["magnitude"], f["target"]), []).append(f)
    for (kind, mag, target), fs in rows.items():
        p = "int8" if target in INT8 else "fp16"
        det = sum(f["detected"] for f in fs)
        loc = sum(f["detected"] and f["origin_stage"] == f["stage"] for f in fs)
        odet = sum(f["fp32_only_detected"] for f in fs)
        oloc = sum(f["fp32_only_detected"] and f["fp32_only_origin"] == f["stage"] for f in fs)
        tdet = sum(f["output_nrmse"] > tol.get(p, float("inf")) for f in fs)
        fa = sum(bool(f["others_flagged"]) for f in fs)
        lines.append(
            f"{kind + ' ' + format(mag, 'g'):<24}{target:<16}{len(fs):>5}{det:>9}{loc:>9}{odet:>9}"
            f"{oloc:>9}{tdet:>8}{fa:>9}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        default="yolov8n:320,yolov5n:320",
        help="zoo names, each optionally with ':SIZE' (square input of a resizable model)",
    )
    ap.add_argument("--real", type=int, default=2)
    ap.add_argument("--random", type=int, default=1)
    ap.add_argument("--stages", default=None, help="comma-separated stage indices (default all)")
    ap.add_argument("--clean-only", action="store_true", help="only the clean runs (false alarms), no faults")
    ap.add_argument("--reuse", action="store_true", help="reuse a clean run already in OUT/<model>/clean")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [int(s) for s in a.stages.split(",")] if a.stages else None
    results = []
    t0 = time.monotonic()
    for spec in a.models.split(","):
        m, _, size = spec.partition(":")
        try:
            results.append(
                evaluate_model(
                    m,
                    out / m,
                    imgsz=int(size) if size else None,
                    n_real=a.real,
                    n_random=a.random,
                    stages=stages,
                    faults=() if a.clean_only else FAULTS,
                    reuse=a.reuse,
                )
            )
        except ev.EvaluationError as err:  # one model failing its clean run does not end the evaluation
            results.append(
                {"model": m, "error": str(err)[:2000], "clean": {"flags": {}, "output_nrmse": {}}, "faults": []}
            )
        (out / "results.json").write_text(
            json.dumps({"results": results, "seconds": time.monotonic() - t0}, indent=1, default=str)
        )
    print(summarize(results))
    print(f"wall {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
