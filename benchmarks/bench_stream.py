"""Streamed dataset runs (issue 20): peak memory and disk against the number of inputs, and the run's
wall time against the backends' own inference time.

For each N in --pages, renders N document pages with their drawn boxes as ground truth
(:func:`models.documents.write_pages_with_truth`), then runs, in a child process,

    anpred test yolov8n-doclaynet --inputs PAGES --labels PAGES/truth.json --stream --backends B -o OUT

while polling (every 0.2 s, psutil) the resident memory of the whole process tree (the driver, its
judge and every backend worker), the size of OUT and of the chunk folders in memory-backed folders
(``/dev/shm/anpred-stream-<its pid>-*``, :mod:`anpred.pipeline.scratch`: memory, reported apart and added to the
tree's resident memory). Reports per N: wall time of the stream phase,
the sum over backends of their inference time inside the stream (``seconds_run`` of the run record,
summed over chunks; each is slowed by the judge beside it, and with --side-by-side by the other backends) and of
their preparation, and the backends' OWN inference over the same inputs measured apart (the same
preprocessed pages, each backend alone in a process of its own, one after the other, no judge), the
ratio of the stream's wall time to that, peak RSS of the tree, peak disk of OUT, and the task
headline of each backend. The own inference is timed around ``Backend.run`` alone in a process per
backend (``_time_alone``: nothing written, no statistic computed beside it; earlier rounds used ``anpred
run --mode stats``, whose writer thread folds every anchor into statistics beside the next run, about
8% slower for ort). ``--own-only`` measures it again on an earlier output's pages. Usage (the numbers
in docs/task.md, "Datasets, streamed")::

    .venv/bin/python benchmarks/bench_stream.py --pages 30,100 --out bench-stream [--side-by-side]
    .venv/bin/python benchmarks/bench_stream.py --pages 100,1000 --out /tmp/bs --side-by-side  # (the 1.07x row)
    .venv/bin/python benchmarks/bench_stream.py --pages 1000 --out bench-stream --own-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _tree_rss(p) -> int:
    import psutil

    total = 0
    try:
        procs = [p] + p.children(recursive=True)
    except psutil.Error:
        return 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def _du(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _own_inference(anchored: Path, pages: Path, work: Path, backends: str) -> tuple[float, dict[str, float]]:
    """Sum over ``backends`` of their ``Backend.run`` seconds on ``pages`` (preprocessed as the zoo's
    DocLayNet model does), each backend alone in its own process, one after the other, nothing else in
    the process (:func:`_time_alone`: no tensor written, no statistic computed beside it); also per
    backend."""
    import shutil

    import numpy as np

    import models
    from anpred.pipeline.stream import zoo_image_samples

    npz = work / "inputs"
    shutil.rmtree(work, ignore_errors=True)
    npz.mkdir(parents=True)
    for i, (_, arrays) in enumerate(zoo_image_samples(models.get("yolov8n-doclaynet"), pages)):
        np.savez(npz / f"{i:06d}.npz", **arrays)
    from anpred.run.driver import _worker_env

    # the environment of anpred's own backend workers, except that ONNX Runtime spins here (its default,
    # faster alone; a stream's workers do not, beside the judge): the malloc tunables of
    # anpred.run.driver.worker_malloc_tunables: without them openvino took 29% longer, torch 12%, ort 8% on
    # 24 pages), so that the ratio measures what the stream adds, not what the tunables save
    env = _worker_env()
    per = {}
    for b in backends.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--time-alone", b, "--model", str(anchored), "--out", str(npz)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        per[b] = float(out.stdout.strip().splitlines()[-1])
    shutil.rmtree(npz, ignore_errors=True)
    return sum(per.values()), per


def _time_alone(name: str, model: Path, npz: Path) -> float:
    """Seconds of ``Backend.run`` of backend ``name`` over every ``.npz`` in ``npz`` (each loaded
    before its run, outside the timing), prepared once on ``model`` (an int8 backend calibrated on the
    first 32 inputs, as a streamed run does), with the backend's defaults and nothing else running in
    this process: the backend's own inference."""
    import tempfile

    import numpy as np

    from anpred.backends import backend_class
    from anpred.run.model import load_anchored

    files = sorted(npz.glob("*.npz"))
    cls = backend_class(name)
    options = {"calibration": [str(f) for f in files[:32]]} if getattr(cls, "needs_calibration", False) else {}
    b = cls(options)
    b.prepare(model, load_anchored(model)[1], tempfile.mkdtemp(prefix="anpred-own-"))
    total = 0.0
    for f in files:
        with np.load(f) as z:
            x = {k: z[k] for k in z.files}
        t = time.perf_counter()
        b.run(x)
        total += time.perf_counter() - t
    return total


def bench_pages(n: int, out: Path, a: argparse.Namespace) -> dict:
    """Runs ``anpred test --stream`` on ``n`` rendered pages (written into OUT/pages-N once) into OUT/run-N,
    watching the process tree's RSS, the run's disk and the memory-backed scratch; prints and returns its
    row (seconds, MiB, ratios to the backends' own inference, the phases)."""
    import psutil

    from anpred.pipeline.scratch import MEMORY_FOLDERS, PREFIX
    from models.documents import write_pages_with_truth

    pages = out / f"pages-{n}"
    if not (pages / "truth.json").is_file():
        write_pages_with_truth(pages, range(n))
    dst = out / f"run-{n}"
    cmd = [
        sys.executable,
        "-m",
        "anpred",
        "test",
        "yolov8n-doclaynet",
        "--inputs",
        str(pages),
        "--labels",
        str(pages / "truth.json"),
        "--stream",
        *(["--chunk", str(a.chunk)] if a.chunk else []),
        "--backends",
        a.backends,
        "-o",
        str(dst),
        "--overwrite",
        "-q",
        *(["--side-by-side"] if a.side_by_side else []),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    ps = psutil.Process(proc.pid)
    peak_rss = peak_disk = peak_scratch = peak_total = 0
    while proc.poll() is None:
        rss = _tree_rss(ps)
        peak_rss = max(peak_rss, rss)
        parent = dst.parent
        peak_disk = max(
            peak_disk, sum(_du(p) for p in parent.glob(f".{dst.name}*")) + (_du(dst) if dst.exists() else 0)
        )
        # the chunks in a memory-backed folder (anpred.pipeline.scratch): memory, not disk
        scratch = sum(_du(p) for m in MEMORY_FOLDERS for p in Path(m).glob(f"{PREFIX}{proc.pid}-*"))
        peak_scratch = max(peak_scratch, scratch)
        peak_total = max(peak_total, rss + scratch)
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    text = proc.stdout.read().decode(errors="replace")
    test = json.loads((dst / "test.json").read_text())
    run = json.loads((dst / "run" / "run.json").read_text())
    inf = sum(b.get("seconds_run", 0.0) for b in run["backends"].values())
    prep = sum(b.get("seconds_prepare", 0.0) for b in run["backends"].values())
    rep = json.loads((dst / "report.json").read_text())
    row = {
        "pages": n,
        "rc": proc.returncode,
        "wall_s": wall,
        "stream_s": test["seconds"].get("stream"),
        "inference_s": inf,
        "prepare_s": prep,
        "ratio_stream_to_inference": test["seconds"].get("stream", 0) / inf if inf else None,
        "peak_rss_mib": peak_rss / 2**20,
        "peak_disk_mib": peak_disk / 2**20,
        "peak_scratch_memory_mib": peak_scratch / 2**20,
        "peak_rss_plus_scratch_mib": peak_total / 2**20,
        "kept_samples": len(run["samples"]),
        "disk_final_mib": _du(dst) / 2**20,
        "stream_meta": {k: v for k, v in run.get("stream", {}).items() if k != "kept"},
        "headlines": {b: d["headline"] for b, d in rep["task"]["backends"].items()},
        "map50": {b: (d.get("truth") or {}).get("map50") for b, d in rep["task"]["backends"].items()},
    }
    # the backends' own inference over the same inputs, measured apart (_own_inference, _time_alone)
    own, per = _own_inference(dst / "anchored.onnx", pages, out / f"own-{n}", a.backends)
    row["own_inference_s"] = own
    row["own_inference_per_backend_s"] = per
    row["inference_per_backend_s"] = {b: v.get("seconds_run", 0.0) for b, v in run["backends"].items()}
    row["ratio_stream_to_own_inference"] = (test["seconds"].get("stream", 0) / own) if own else None
    row["ratio_command_to_own_inference"] = (wall / own) if own else None  # resolving and the report included
    # where the time goes: before the first chunk is judged (workers started and prepared, int8
    # calibrated, the first chunk run and judged in full), the chunks after it (steady state: seconds per
    # sample against the own inference's), after the last one (the kept samples refilled, the report)
    at = run.get("stream", {}).get("judged_at") or []
    if len(at) >= 2 and own:
        steady = (at[-1][1] - at[0][1]) / (at[-1][0] - at[0][0])
        row["phases"] = {
            "until_first_chunk_judged_s": at[0][1],
            "steady_s_per_sample": steady,
            "steady_ratio_to_own": steady / (own / n),
            "after_last_chunk_s": test["seconds"].get("stream", 0) - at[-1][1],
        }
    print(json.dumps(row), flush=True)
    if proc.returncode not in (0, 1):
        print(text[-3000:])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", default="30,100")
    ap.add_argument("--out", required=True)
    ap.add_argument("--backends", default="ort,openvino,torch,ort-int8")
    ap.add_argument("--chunk", type=int, default=None, help="default: anpred's (1 GiB of anchor tensors)")
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="the backends of a chunk at once, the cores divided among them (anpred.run.spec.split_threads)",
    )
    ap.add_argument(
        "--own-only",
        action="store_true",
        help="measure only the backends' own inference again, on OUT's pages and run folders",
    )
    ap.add_argument("--time-alone", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.time_alone:  # (the child process of _own_inference)
        print(_time_alone(a.time_alone, Path(a.model), Path(a.out)))
        return 0
    if a.own_only:
        for n in [int(x) for x in a.pages.split(",")]:
            own, per = _own_inference(
                Path(a.out) / f"run-{n}" / "anchored.onnx",
                Path(a.out) / f"pages-{n}",
                Path(a.out) / f"own-{n}",
                a.backends,
            )
            print(json.dumps({"pages": n, "own_inference_s": own, "own_inference_per_backend_s": per}), flush=True)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in [int(x) for x in a.pages.split(",")]:
        rows.append(bench_pages(n, out, a))
    (out / "bench_stream.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
