"""Seconds per ONNX node case on the fp32 backends: warm workers across models against one process per
backend and case (issue 38), and where onnx2tf's conversion of one node spends its time.

1. ``warm``: ``--cases`` float32 node cases (evenly spaced over the suite's sorted names) through
   :func:`anpred.conformance.runner.run_batch` (one :class:`anpred.run.warm.WarmPool`, the backends
   side by side, the cores divided): wall seconds per case (run + both judgments) and per backend
   ``seconds_prepare`` (conversion on the warm worker);
2. ``cold``: the first ``--cold`` of those cases the way a case ran before: :func:`anpred.run.run_model`
   with a fresh worker process per backend and case (imports, converter start-up each time), the
   backends one after the other, onnx2tf's simplifier as new processes (``ANPRED_WARM_ONNXSIM=0``),
   then the same judgments;
3. ``--profile-onnx2tf``: one case converted by the ``tf`` backend in this process, twice warm (imports
   paid), with the simplifier's subprocess runs and with the warm server, cProfile splitting the
   time into the simplifier, onnx2tf's own graph building and the SavedModel export.

Both 1 and 2 run in one invocation (ratios taken in one run), each with a private conversion cache
(``ANPRED_CACHE`` in ``--out``: nothing is reused from earlier runs nor between the two). Run it on an
otherwise idle machine::

    .venv/bin/python benchmarks/bench_conformance.py --out /tmp/bench-conf --cases 40 --cold 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cases(folder, n: int) -> list[Path]:
    from anpred.conformance.suite import select_cases

    chosen, _ = select_cases(folder, None, "float32")
    step = max(1, len(chosen) // max(1, n))
    return chosen[::step][:n]


def _warm(cases: list[Path], out: Path, backends: list[str]) -> dict:
    from anpred.conformance.runner import BatchOptions, run_batch
    from anpred.conformance.score import load_records

    t0 = time.perf_counter()
    run_batch([str(c) for c in cases], out, BatchOptions(backends=backends), progress=True)
    total = time.perf_counter() - t0
    recs = load_records(out)
    per = [r["seconds"] for r in recs]
    prep = {
        b: statistics.median([r["backends"][b]["seconds_prepare"] for r in recs if b in r.get("backends", {})])
        for b in backends
    }
    return {
        "cases": len(recs),
        "seconds_total": round(total, 1),
        "median_case_s": round(statistics.median(per), 3),
        "p90_case_s": round(sorted(per)[int(0.9 * (len(per) - 1))], 3),
        "mean_case_s_incl_startup": round(total / len(recs), 3),
        "median_prepare_s": prep,
    }


def _cold(cases: list[Path], out: Path, backends: list[str]) -> dict:
    from anpred.conformance.cases import load_case
    from anpred.conformance.runner import anchored_copy, judge_case
    from anpred.inputs import ArraySamples
    from anpred.run.driver import run_model

    os.environ["ANPRED_WARM_ONNXSIM"] = "0"  # the workers inherit it: onnx2tf's own subprocess runs
    warm_cache = os.environ.get("ANPRED_CACHE")
    os.environ["ANPRED_CACHE"] = str(out / "cache")  # no conversion of the warm phase reused
    per = []
    prep: dict[str, list[float]] = {}
    try:
        for c in cases:
            case = load_case(c)
            t0 = time.perf_counter()
            model = anchored_copy(case, out / "work")
            store = run_model(
                model,
                backends,
                ArraySamples([(case.name, case.inputs)]),
                out / "runs" / case.name,
                progress=False,
                precheck=False,
            )
            judge_case(out / "runs" / case.name, case)
            per.append(time.perf_counter() - t0)
            for b, st in store.statuses().items():
                prep.setdefault(b, []).append(st.seconds_prepare)
            print(f"cold {case.name}: {per[-1]:.1f} s", flush=True)
    finally:
        os.environ.pop("ANPRED_WARM_ONNXSIM", None)
        if warm_cache is not None:
            os.environ["ANPRED_CACHE"] = warm_cache
    return {
        "cases": len(per),
        "median_case_s": round(statistics.median(per), 2),
        "per_case_s": [round(x, 2) for x in per],
        "median_prepare_s": {b: round(statistics.median(v), 3) for b, v in prep.items()},
    }


def _profile_onnx2tf(case_dir: Path, out: Path) -> dict:
    """tf's conversion of one case in this process: the simplifier as subprocesses, then warm."""
    import cProfile
    import pstats

    from anpred.backends import backend_class
    from anpred.run.model import load_anchored

    res = {}
    cls = backend_class("tf")
    for k, (label, warm) in enumerate(
        (("imports (not counted)", "1"), ("onnxsim subprocesses", "0"), ("warm onnxsim server", "1"))
    ):
        os.environ["ANPRED_WARM_ONNXSIM"] = warm
        os.environ["ANPRED_CACHE"] = str(out / f"cache-profile-{k}")
        _, manifest, _ = load_anchored(case_dir / "model.onnx")
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        cls({}).prepare(case_dir / "model.onnx", manifest, out / f"scratch-{k}")
        prof.disable()
        total = time.perf_counter() - t0
        stats = pstats.Stats(prof).stats

        def cum(fragment: str) -> float:
            return max((v[3] for key, v in stats.items() if fragment in f"{key[0]}:{key[2]}"), default=0.0)

        res[label] = {
            "seconds": round(total, 3),
            "onnx2tf.convert": round(cum("onnx2tf.py:convert"), 3),
            "simplifier (subprocess / server calls)": round(
                cum("subprocess.py:check_output") + cum("onnxsim_warm.py:call"), 3
            ),
            "SavedModel export": round(cum("export_lib.py:write_out"), 3),
            "SavedModel load": round(cum("tf_onnx.py:_load_converted"), 3),
        }
    os.environ.pop("ANPRED_WARM_ONNXSIM", None)
    return res


def main(argv=None) -> None:
    from anpred.conformance.suite import FP32_BACKENDS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--folder", default=None, help="cases (default: the node suite installed by scripts/setup.sh)")
    p.add_argument("--cases", type=int, default=40)
    p.add_argument("--cold", type=int, default=3)
    p.add_argument("--backends", default=",".join(FP32_BACKENDS))
    p.add_argument("--profile-onnx2tf", action="store_true")
    a = p.parse_args(argv)
    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    os.environ["ANPRED_CACHE"] = str(a.out / "cache")
    backends = a.backends.split(",")
    cases = _cases(a.folder, a.cases)
    from anpred.machine import machine_info

    res = {"backends": backends, "cpus": os.cpu_count(), "cpu": machine_info().get("cpu", "")}
    if a.profile_onnx2tf:
        res["onnx2tf_profile"] = _profile_onnx2tf(cases[0], a.out)
        print(json.dumps(res["onnx2tf_profile"], indent=1), flush=True)
    res["warm"] = _warm(cases, a.out / "warm", backends)
    print(json.dumps(res["warm"], indent=1), flush=True)
    if a.cold:
        res["cold"] = _cold(cases[: a.cold], a.out / "cold", backends)
        res["ratio_median_cold_over_warm"] = round(res["cold"]["median_case_s"] / res["warm"]["median_case_s"], 1)
    (a.out / "bench_conformance.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k not in ("onnx2tf_profile",)}, indent=1))


if __name__ == "__main__":
    main()
