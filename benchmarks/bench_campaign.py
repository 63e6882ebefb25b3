"""A campaign on Ray against the same configurations run one after another (issue 21), and the
campaign's scaling to N workers, simulated from the measured task times.

Writes ``OUT/campaign.toml`` (zoo models x one backend set of every fp32 family plus an fp16 and an
int8 member; --models, --backends), then, each in a child process whose whole process tree's
memory is polled every 0.25 s (proportional set size, psutil: shared pages such as Ray's object
store counted once):

1. warm-up: the campaign once (fills the conversion cache; not counted);
2. ``sequential``: one ``anpred test`` command per configuration, one after another, same options;
3. ``ray``: ``anpred campaign OUT/campaign.toml -o OUT/ray --cpus C --batch B`` (embedded local Ray;
   ``--batch`` 0 by default: one task per backend run, the task structure the scaling simulation
   replays; batches on warm workers are measured by ``benchmarks/bench_campaign_warm.py``);
4. Ray's own overhead, measured apart: ``ray.init`` + ``ray.shutdown`` wall time, the round trip of
   200 empty tasks (per-task overhead), and the memory of the idle embedded Ray (raylet, GCS, the
   pre-started workers).

Then the scaling: the per-task wall times the campaign recorded (``timings`` of each configuration:
prepare, each backend run, judge) replayed through a greedy list scheduler (tasks start in
submission order as soon as their inputs are done and a worker is free; one task per worker) for
N = 1, 2, 4, 8, 16 workers, each task lengthened by the measured per-task overhead. The task times
come from the run with 2 tasks side by side on 2 cores, so they include that contention; on N
machines with one task each they would be shorter, so the simulated times are upper bounds.

    .venv/bin/python benchmarks/bench_campaign.py --out bench-campaign
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = [
    ("yolov8n", {"imgsz": 160}),
    ("yolov5n", {"imgsz": 160}),
    ("ppocr-rec", {}),
    ("ppocr-cls", {}),
    ("mobilenetv2-keras", {}),
]
BACKENDS = ["ort", "openvino", "torch", "tf", "tvm", "mnn", "ncnn", "litert", "ort-fp16", "ort-int8"]


class TreeMemory(threading.Thread):
    """Peak proportional set size (bytes) of a process and all its descendants, polled."""

    def __init__(self, pid: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak, self.stop = pid, every, 0, threading.Event()

    def run(self):
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self.stop.is_set():
            total = 0
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                break
            for q in procs:
                try:
                    total += q.memory_full_info().pss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(self.every)


def timed(cmd: list[str], log: Path) -> dict:
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        mem = TreeMemory(proc.pid)
        mem.start()
        rc = proc.wait()
        mem.stop.set()
        mem.join()
    return {"wall_s": round(time.perf_counter() - t, 1), "peak_pss_gib": round(mem.peak / 2**30, 2), "rc": rc}


def write_campaign(path: Path, models, backends, samples: int, stages: int) -> None:
    lines = [
        '[campaign]',
        'name = "bench"',
        'retries = 1',
        '',
        '[defaults]',
        f'samples = {samples}',
        f'stages = {stages}',
        '',
    ]
    for name, opts in models:
        lines += ['[[models]]', f'model = "{name}"'] + [f'{k} = {json.dumps(v)}' for k, v in opts.items()] + ['']
    lines += ['[backend_sets]', f'all = {json.dumps(backends)}', '']
    path.write_text("\n".join(lines))


def ray_overhead(cpus: int) -> dict:
    code = f"""
import json, time, os, psutil, ray
t = time.perf_counter(); ray.init(num_cpus={cpus}, include_dashboard=False, log_to_driver=False)
init = time.perf_counter() - t
@ray.remote(num_cpus=1)
def noop(i): return i
ray.get([noop.remote(i) for i in range(4)])
time.sleep(2)
me = psutil.Process()
idle = sum(p.memory_full_info().pss for p in [me] + me.children(recursive=True))
t = time.perf_counter(); ray.get([noop.remote(i) for i in range(200)]); per = (time.perf_counter() - t) / 200
t = time.perf_counter(); ray.shutdown(); down = time.perf_counter() - t
print(json.dumps({{"init_s": round(init, 2), "shutdown_s": round(down, 2), "task_overhead_ms": round(per * 1e3, 2),
                   "idle_pss_gib": round(idle / 2 ** 30, 2)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def simulate(records: list[dict], workers: int, overhead_s: float) -> float:
    """Makespan (s) of the campaign's tasks on ``workers`` one-task workers (greedy list scheduling)."""
    ready = []  # (ready time, order, duration, config, kind)
    order = 0
    for r in records:
        t = r.get("timings") or {}
        ready.append((0.0, order, t.get("prepare", 0.0) + overhead_s, r["id"], "prepare"))
        order += 1
    free = [0.0] * workers
    heapq.heapify(free)
    done_runs: dict[str, list[float]] = {}
    by_id = {r["id"]: r for r in records}
    end = 0.0
    heapq.heapify(ready)
    while ready:
        rt, _, dur, cid, kind = heapq.heappop(ready)
        w = heapq.heappop(free)
        start = max(w, rt)
        fin = start + dur
        heapq.heappush(free, fin)
        end = max(end, fin)
        t = by_id[cid].get("timings") or {}
        if kind == "prepare":
            for b, s in (t.get("runs") or {}).items():
                heapq.heappush(ready, (fin, order, (s or 0.0) + overhead_s, cid, "run"))
                order += 1
            done_runs[cid] = []
        elif kind == "run":
            done_runs[cid].append(fin)
            if len(done_runs[cid]) == len(t.get("runs") or {}):
                heapq.heappush(ready, (fin, order, t.get("judge", 0.0) + overhead_s, cid, "judge"))
                order += 1
    return end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-campaign")
    ap.add_argument("--models", default=None, help="comma-separated zoo names (default: five zoo models)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--batch", type=int, default=0, help="the campaign's --batch (default 0: one task per backend run)")
    args = ap.parse_args()
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    models = MODELS if not args.models else [(m, dict(MODELS).get(m, {})) for m in args.models.split(",")]
    backends = args.backends.split(",")
    camp = out / "campaign.toml"
    write_campaign(camp, models, backends, args.samples, args.stages)
    anpred = str(Path(sys.executable).with_name("anpred"))
    res: dict = {"models": [m for m, _ in models], "backends": backends, "cpus": args.cpus, "samples": args.samples}
    if not args.no_warmup:
        res["warmup"] = timed(
            [anpred, "campaign", str(camp), "-o", str(out / "warmup"), "-q", "--cpus", str(args.cpus)],
            out / "warmup.log",
        )
        print("warm-up", res["warmup"], flush=True)
    seq = {"wall_s": 0.0, "peak_pss_gib": 0.0, "rc": []}
    for name, opts in models:
        cmd = [
            anpred,
            "test",
            name,
            "--backends",
            ",".join(backends),
            "--samples",
            str(args.samples),
            "--stages",
            str(args.stages),
            "-o",
            str(out / "sequential" / name),
            "--overwrite",
            "-q",
        ]
        if "imgsz" in opts:
            cmd += ["--imgsz", str(opts["imgsz"])]
        r = timed(cmd, out / f"sequential-{name}.log")
        seq["wall_s"] = round(seq["wall_s"] + r["wall_s"], 1)
        seq["peak_pss_gib"] = max(seq["peak_pss_gib"], r["peak_pss_gib"])
        seq["rc"].append(r["rc"])
    res["sequential"] = seq
    print("sequential", seq, flush=True)
    import shutil

    shutil.rmtree(out / "ray", ignore_errors=True)
    res["ray"] = timed(
        [
            anpred,
            "campaign",
            str(camp),
            "-o",
            str(out / "ray"),
            "-q",
            "--cpus",
            str(args.cpus),
            "--batch",
            str(args.batch),
        ],
        out / "ray.log",
    )
    print("ray", res["ray"], flush=True)
    res["ray_overhead"] = ray_overhead(args.cpus)
    print("ray overhead", res["ray_overhead"], flush=True)
    summary = json.loads((out / "ray" / "campaign.json").read_text())
    recs = [r for r in summary["records"] if r.get("state") == "complete"]
    res["complete"] = len(recs)
    res["configurations"] = summary["configurations"]
    res["task_seconds_sum"] = round(
        sum(
            (r["timings"]["prepare"] + sum(v or 0 for v in r["timings"]["runs"].values()) + r["timings"]["judge"])
            for r in recs
        ),
        1,
    )
    ov = res["ray_overhead"]["task_overhead_ms"] / 1e3
    res["simulated_wall_s"] = {n: round(simulate(recs, n, ov), 1) for n in (1, 2, 4, 8, 16)}
    res["ratio_ray_to_sequential"] = round(res["ray"]["wall_s"] / max(seq["wall_s"], 1e-9), 3)
    (out / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
