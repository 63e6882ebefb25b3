"""Benchmark of the demo, README's first command (issue 9). Prints the numbers quoted in README.md.

Runs ``anpred test demo -o <tmp>/demo --overwrite`` twice in a fresh process each:

1. **cold**: ``ANPRED_CACHE`` pointing to an empty temporary folder, so every conversion is done
   (onnx2tf SavedModels, the float16 copy, the int8 quantisation, the onnx2torch modules);
2. **warm**: the same command again with the cache the cold run filled (the demo replaces its own
   previous folder).

For each run: wall time (``time.perf_counter``, seconds), CPU time of the process and all its
children (user + system, ``resource.getrusage(RUSAGE_CHILDREN)`` difference, seconds), the exit
status, and the 1-minute load average before and after (``os.getloadavg``; the machine is shared,
so wall time depends on it). The warm run's "where each backend stands" table is printed verbatim.
The demo writes about 1.5 GB per run; the temporary folder is removed at the end.

Run: .venv/bin/python benchmarks/bench_demo.py [--keep-output FILE]
"""

from __future__ import annotations

import argparse
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


def _run(out: Path, cache: Path) -> dict:
    env = {**os.environ, "ANPRED_CACHE": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run([str(ANPRED), "test", "demo", "-o", str(out), "--overwrite"], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "rc": proc.returncode, "load_before": load0, "load_after": os.getloadavg()[0],
            "stdout": proc.stdout, "stderr": proc.stderr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-output", metavar="FILE", help="also write the warm run's stdout to FILE")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="anpred-bench-demo-"))
    try:
        cache = tmp / "cache"
        cache.mkdir()
        rows = []
        for name in ("cold", "warm"):
            r = _run(tmp / "demo", cache)
            rows.append((name, r))
            if r["rc"] not in (0, 1):
                print(f"{name} run failed (exit {r['rc']}):\n{r['stderr'][-3000:]}", file=sys.stderr)
                return 2
        print(f"machine: {os.cpu_count()} CPUs; demo = anpred test demo (exit status {rows[-1][1]['rc']})")
        print(f"{'run':<6}{'wall s':>9}{'CPU s':>9}{'load before':>13}{'load after':>12}")
        for name, r in rows:
            print(f"{name:<6}{r['wall']:>9.1f}{r['cpu']:>9.1f}{r['load_before']:>13.2f}{r['load_after']:>12.2f}")
        warm = rows[-1][1]["stdout"]
        table = warm[warm.index("where each backend stands:"):] if "where each backend stands:" in warm else warm
        print()
        print(table.rstrip())
        def standing(text: str) -> str:
            return text.split("where each backend stands:")[-1].split("\n\ndemo finished")[0]

        same = standing(rows[0][1]["stdout"]) == standing(warm)
        print(f"\ncold and warm standing tables identical: {same}")
        if args.keep_output:
            Path(args.keep_output).write_text(warm)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
