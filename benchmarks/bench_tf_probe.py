"""The onnx2tf probe of the pre-run coverage (:mod:`anpred.backends.tf_probe`) against what the ``tf``
backend does on whole models: ONNX node cases run by ``anpred conformance --backends tf --keep-runs``
(no precheck: the backend converts every case), each case's model (its weight inputs bound, as the run
bound them) probed with an empty probe cache. Counts foreseen failures (the probe refuses a case the
backend failed), false refusals (it refuses a case the backend ran) and the probe's time; with
``--zoo``, the zoo's YOLOv8n (320 px, cold then warm).

Usage::

    anpred conformance -o OUT --backends tf --cases 'a,b,...' --keep-runs
    .venv/bin/python benchmarks/bench_tf_probe.py OUT [--zoo]

docs/backends-converters.md ("Pre-run coverage") quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cases(conf: Path) -> list[tuple[str, Path, str, str]]:
    """``[(case, model the tf backend converted, its status, its reason)]`` from a conformance folder."""
    out = []
    for rec in sorted((conf / "cases").glob("*.json")):
        r = json.loads(rec.read_text())
        tf = (r.get("backends") or {}).get("tf")
        if not tf:
            continue
        bound = conf / ".work" / "bound" / f"{r['case']}.onnx"
        model = bound if bound.is_file() else conf / ".work" / "models" / r["case"] / "model.onnx"
        if model.is_file():
            out.append((r["case"], model, tf.get("status", ""), tf.get("reason", "")))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("conf", type=Path, help="an `anpred conformance --backends tf --keep-runs` folder")
    ap.add_argument("--zoo", action="store_true", help="also the zoo's YOLOv8n at 320 px (cold, warm)")
    args = ap.parse_args(argv)
    from anpred.backends.tf_probe import onnx2tf_refusals
    from anpred.onnx_io import load_model

    with tempfile.TemporaryDirectory(prefix="bench-tf-probe-") as d:
        os.environ["ANPRED_CACHE"] = str(Path(d) / "cache")  # cold probes: an empty cache
        foreseen = missed = false = 0
        total = 0.0
        cases = _cases(args.conf)
        for case, path, status, reason in cases:
            t0 = time.perf_counter()
            refused = onnx2tf_refusals(load_model(path, load_external=True))
            dt = time.perf_counter() - t0
            total += dt
            failed = status in ("failed", "crashed", "unsupported")  # (no precheck: the backend's own refusal)
            foreseen += bool(refused) and failed
            missed += failed and not refused
            false += bool(refused) and not failed
            tag = "FALSE REFUSAL" if refused and not failed else "foreseen" if refused else "missed" if failed else ""
            print(
                f"{case:<60} {status:<11} {dt:5.2f} s {tag:<13} {json.dumps(refused)[:200]}"
                + (f"  | run: {reason[:160]}" if failed else ""),
                flush=True,
            )
        n_failed = sum(1 for c in cases if c[2] in ("failed", "crashed", "unsupported"))
        print(
            f"{len(cases)} cases: tf failed {n_failed}; foreseen {foreseen}, missed {missed}, "
            f"false refusals {false}; probe {total:.1f} s in all (a worker per case, cold cache)"
        )
        if args.zoo:
            from anpred.pipeline.subject import resolve_model

            sub = resolve_model("yolov8n", imgsz=320, workdir=Path(d) / "yolo")
            model = load_model(sub.onnx_path, load_external=True)
            for run in ("cold", "warm"):
                t0 = time.perf_counter()
                refused = onnx2tf_refusals(model)
                print(
                    f"yolov8n-320 ({len(model.graph.node)} nodes) {run}: {time.perf_counter() - t0:.1f} s, "
                    f"refused {refused}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
