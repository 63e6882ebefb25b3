"""Benchmark of the first minutes (issues 9 and 35): README's first command and the default command on
a mid-size model, each cold and warm. Prints the numbers quoted in README.md and docs/run.md.

Two commands, each run twice in a fresh process:

- ``anpred test demo -o <tmp>/demo --overwrite`` (the demo; ``--all``: the full set), and
- ``anpred test yolov8n --imgsz 320 -o <tmp>/yolo --overwrite`` (the default backends on a mid-size
  model: the goal is an answer with a real consensus within 60 s on 2 cores, cold);

1. **cold**: ``ANPRED_CACHE`` pointing to an empty temporary folder, so every conversion and export is
   done (the zoo's YOLOv8n export, onnx2torch, MNN's and pnnx's conversions, the int8 quantisation)
   and no cost of a backend has been measured yet;
2. **warm**: the same command again with the cache the cold run filled.

For each run: wall time (``time.perf_counter``, seconds), CPU time of the process and all its
children (user + system, ``resource.getrusage(RUSAGE_CHILDREN)`` difference, seconds), the exit
status, the 1-minute load average before and after (``os.getloadavg``; the machine is shared, so wall
time depends on it) and the per-phase seconds of each model's ``test.json``. The warm demo's "where
each backend stands" table is printed verbatim. The temporary folder is removed at the end.

Run: .venv/bin/python benchmarks/bench_demo.py [--only demo|yolo] [--all] [--side-by-side] [--keep-output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANPRED = Path(sys.executable).parent / "anpred"


def _run(argv: list[str], out: Path, cache: Path) -> dict:
    env = {**os.environ, "ANPRED_CACHE": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(
        [str(ANPRED), "test", *argv, "-o", str(out), "--overwrite"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    phases = {}
    for tj in sorted(out.rglob("test.json")):
        phases[tj.parent.name] = {k: round(v, 1) for k, v in json.loads(tj.read_text())["seconds"].items()}
    return {
        "wall": wall,
        "cpu": cpu,
        "rc": proc.returncode,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "stdout": proc.stdout,
        "stderr": proc.stderr,
        "phases": phases,
    }


def _standing(text: str) -> str:
    return text.split("where each backend stands:")[-1].split("\n\ndemo finished")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("demo", "yolo"), default=None, help="measure one command only")
    ap.add_argument("--all", action="store_true", help="the full set (anpred test ... --all)")
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="the backends at once, the cores divided (anpred test ... --side-by-side)",
    )
    ap.add_argument("--keep-output", metavar="FILE", help="also write the warm demo's stdout to FILE")
    args = ap.parse_args()
    commands = {"demo": ["demo"], "yolo": ["yolov8n", "--imgsz", "320"]}
    tmp = Path(tempfile.mkdtemp(prefix="anpred-bench-demo-"))
    try:
        rows = []
        for what, argv in commands.items():
            if args.only not in (None, what):
                continue
            cache = tmp / f"cache-{what}"
            cache.mkdir()
            for name in ("cold", "warm"):
                extra = (["--all"] if args.all else []) + (["--side-by-side"] if args.side_by_side else [])
                r = _run(argv + extra, tmp / what, cache)
                rows.append((what, name, r))
                if r["rc"] not in (0, 1):
                    print(f"{what} {name} run failed (exit {r['rc']}):\n{r['stderr'][-3000:]}", file=sys.stderr)
                    return 2
        print(
            f"machine: {os.cpu_count()} CPUs; {'full set (--all)' if args.all else 'default backends'}"
            f"{', side by side' if args.side_by_side else ', one after the other'}"
        )
        print(f"{'command':<8}{'run':<6}{'exit':>5}{'wall s':>9}{'CPU s':>9}{'load before':>13}{'load after':>12}")
        for what, name, r in rows:
            print(
                f"{what:<8}{name:<6}{r['rc']:>5}{r['wall']:>9.1f}{r['cpu']:>9.1f}{r['load_before']:>13.2f}"
                f"{r['load_after']:>12.2f}"
            )
        for what, name, r in rows:
            for model, ph in r["phases"].items():
                print(f"  {what} {name} {model}: " + ", ".join(f"{k} {v}" for k, v in ph.items()))
        demo = [r for what, name, r in rows if what == "demo"]
        if demo:
            warm = demo[-1]["stdout"]
            print("\nwhere each backend stands:" + _standing(warm).rstrip())
            print(f"\ncold and warm standing tables identical: {_standing(demo[0]['stdout']) == _standing(warm)}")
            if args.keep_output:
                Path(args.keep_output).write_text(warm)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
