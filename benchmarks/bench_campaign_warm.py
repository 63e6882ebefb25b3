"""A campaign of small configurations run one-shot (one Ray task and one backend process per
(configuration, backend)) against the same campaign batched onto warm workers (issue 38, deliverable 2),
in one run: the ratio of their wall times.

Writes ``OUT/models/*.onnx`` (``--models`` single-node float32 models built with ``onnx.helper``:
activations, Conv, MatMul, pooling, Softmax; seeded weights, inputs from the default generator) and
``OUT/campaign.toml`` (one backend set, ``--backends``), then runs, each as a child process
``anpred campaign OUT/campaign.toml -o OUT/<name> -q --cpus C --batch B``:

1. warm-up (batched; fills the conversion cache, not counted; ``--no-warmup`` skips it);
2. ``one-shot``: ``--batch 0``;
3. ``batched``: ``--batch`` left to its default (:data:`anpred.campaign.warm.DEFAULT_BATCH`, or fewer
   to fill the CPUs).

Both must give the same records (run status and verdict per configuration and backend: checked
here, a difference is printed and makes the exit status 1).

    .venv/bin/python benchmarks/bench_campaign_warm.py --out bench-campaign-warm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKENDS = ["ort", "openvino", "torch", "onnx-reference"]
#: (operator, attributes) of the single-node models, on a 1x4x8x8 input (Conv/MatMul take weights)
OPS = [
    ("Relu", {}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("Softplus", {}),
    ("Elu", {"alpha": 0.5}),
    ("LeakyRelu", {"alpha": 0.1}),
    ("Softmax", {"axis": 1}),
    ("Conv", {"pads": [1, 1, 1, 1]}),
    ("MatMul", {}),
    ("AveragePool", {"kernel_shape": [2, 2]}),
    ("MaxPool", {"kernel_shape": [2, 2]}),
    ("HardSigmoid", {}),
    ("Erf", {}),
    ("Abs", {}),
    ("Neg", {}),
    ("Exp", {}),
]


def write_models(folder: Path, n: int) -> list[Path]:
    """``n`` single-node models (:data:`OPS`, cycled with other seeds), saved under ``folder``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        op, attrs = OPS[i % len(OPS)]
        rng = np.random.default_rng(i)
        inits, ins, yshape = [], ["x"], [1, 4, 8, 8]
        if op == "Conv":
            inits = [numpy_helper.from_array(rng.normal(size=(4, 4, 3, 3)).astype(np.float32), "w")]
        elif op == "MatMul":
            inits = [numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w")]
        elif op.endswith("Pool"):
            yshape = [1, 4, 7, 7]
        ins += [t.name for t in inits]
        g = helper.make_graph(
            [helper.make_node(op, ins, ["y"], name=op.lower(), **attrs)],
            f"{op}{i}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, yshape)],
            initializer=inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        p = folder / f"{i:02d}-{op.lower()}.onnx"
        onnx.save(m, str(p))
        paths.append(p)
    return paths


def write_campaign(path: Path, models: list[Path], backends: list[str], samples: int) -> None:
    lines = [
        "[campaign]",
        'name = "bench-warm"',
        "retries = 1",
        "",
        "[defaults]",
        f"samples = {samples}",
        "stages = 1",
        "",
    ]
    for m in models:
        lines += ["[[models]]", f'model = "{m.relative_to(path.parent)}"', ""]
    lines += ["[backend_sets]", f"fp32 = {json.dumps(backends)}", ""]
    path.write_text("\n".join(lines))


def campaign(anpred: str, camp: Path, out: Path, cpus: int, batch: int | None) -> dict:
    """Run the campaign into ``out`` (removed first); returns wall time, exit status, the records'
    (id -> backend -> run status, verdict)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [anpred, "campaign", str(camp), "-o", str(out), "-q", "--cpus", str(cpus)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    t = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.perf_counter() - t
    recs = json.loads((out / "campaign.json").read_text())["records"]
    standing = {
        r["id"]: {b: (x.get("run"), x.get("verdict")) for b, x in r.get("backends", {}).items()}
        if r.get("state") == "complete"
        else r.get("reason", "failed")
        for r in recs
    }
    return {
        "wall_s": round(wall, 1),
        "rc": rc,
        "complete": sum(r.get("state") == "complete" for r in recs),
        "standing": standing,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-campaign-warm")
    ap.add_argument("--models", type=int, default=16, help="single-node models (configurations)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    camp = out / "campaign.toml"
    write_campaign(camp, write_models(out / "models", args.models), args.backends.split(","), args.samples)
    anpred = str(Path(sys.executable).with_name("anpred"))
    res: dict = {"configurations": args.models, "backends": args.backends.split(","), "cpus": args.cpus}
    if not args.no_warmup:
        res["warmup_s"] = campaign(anpred, camp, out / "warmup", args.cpus, None)["wall_s"]
        print("warm-up", res["warmup_s"], "s", flush=True)
    one = campaign(anpred, camp, out / "one-shot", args.cpus, 0)
    print("one-shot", one["wall_s"], "s", flush=True)
    warm = campaign(anpred, camp, out / "batched", args.cpus, None)
    print("batched", warm["wall_s"], "s", flush=True)
    same = one["standing"] == warm["standing"]
    res.update({k: {x: v for x, v in r.items() if x != "standing"} for k, r in (("one_shot", one), ("batched", warm))})
    res["same_records"] = same
    res["ratio_batched_to_one_shot"] = round(warm["wall_s"] / max(one["wall_s"], 1e-9), 3)
    res["per_configuration_s"] = {
        "one_shot": round(one["wall_s"] / args.models, 2),
        "batched": round(warm["wall_s"] / args.models, 2),
    }
    if not same:
        diff = {
            k: (one["standing"].get(k), warm["standing"].get(k))
            for k in one["standing"]
            if one["standing"].get(k) != warm["standing"].get(k)
        }
        res["differences"] = diff
    (out / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
