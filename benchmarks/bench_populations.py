"""Cost of the precision populations in ``anpred check`` (issue 17), as ratios taken in one run.

Given a run folder that holds the fp32 voters and the int8/fp16 population members (e.g. a clean run
of ``benchmarks/population_eval.py``: ``OUT/yolov8n/clean``), it links two run folders from it (no
tensor is copied): the previous default backend set (ort, openvino, torch, ort-fp16, ort-int8: one
member per precision, so no population oracle runs) and the population default set (+ the members
``anpred test`` now runs by default), and times ``check_run`` on each, best of ``--repeat``, wall and
CPU seconds, peak RSS of this process. docs/oracle.md ("Speed") quotes the figures.

Usage: .venv/bin/python benchmarks/bench_populations.py --run OUT/yolov8n/clean [--work /tmp/bench-pop] [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

OLD = ["ort", "openvino", "torch", "ort-fp16", "ort-int8"]
NEW = OLD + ["ort-fp16-noopt", "openvino-fp16", "torch-fp16", "ort-int8-noopt", "openvino-int8", "onnx-reference-int8"]


def _time(run: Path, repeat: int) -> tuple[float, float, int]:
    from anpred.judge import check_run

    best = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        rep = check_run(run)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        best = (dt, dc) if best is None or dc < best[1] else best
    return best[0], best[1], len(rep.verdicts)


def main(argv=None) -> int:
    from evaluation import link_run

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a run folder with the fp32 voters and both populations")
    ap.add_argument("--work", default="/tmp/bench-pop")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    work = Path(a.work)
    rows = []
    for name, keep in (("previous default set", OLD), ("population default set", NEW)):
        folder = link_run(Path(a.run), work / name.replace(" ", "-"), keep)
        wall, cpu, n = _time(folder.root, a.repeat)
        rows.append((name, n, wall, cpu))
        print(f"{name:<24} {n:>2} backends  check_run {wall:6.2f} s wall  {cpu:6.2f} s CPU (best of {a.repeat})")
    print(
        f"ratio population / previous set: {rows[1][3] / rows[0][3]:.2f}x CPU, {rows[1][2] / rows[0][2]:.2f}x wall; "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
