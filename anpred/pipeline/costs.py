"""What each backend costs on this machine, measured on the runs and recorded, to order witnesses.

After every one-shot run :func:`record` appends, per backend that ran, what it took (the seconds to
prepare, i.e. convert or compile the model, and to run each sample, from the backend's status) with
the model's size (nodes, weight elements) to ``<cache>/costs/<machine>.json`` (:func:`machine_key`:
CPU model and core count). :func:`estimate` predicts a backend's seconds on a model from those
records: the same model's latest observation when there is one, else the observation of the nearest
model size (weight elements, within :data:`NEAR_FACTOR`): its seconds to start and prepare, and its
seconds per sample scaled by the ratio of weight elements.
A backend never measured here falls back to :data:`PRIOR_SECONDS`, measured on YOLOv8n at 320 with an
empty conversion cache (docs/run.md), and is marked so.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["PRIOR_SECONDS", "machine_key", "model_size", "record", "estimate", "costs_file"]

#: Seconds (to start and prepare, to run one sample) of each fp32 family and the float64 arbiter on
#: YOLOv8n at 320x320 (:data:`PRIOR_MODEL`): run.json ``resources[b].seconds_wall`` - ``seconds_run``,
#: and ``seconds_run`` per sample, cold conversion cache (how and where measured: docs/run.md, "The
#: default set is chosen by measured cost"; ``litert``'s measured alone, with the onnx2tf conversion it
#: otherwise shares with ``tf``). Used only until this machine has measured the backend.
PRIOR_SECONDS: dict[str, tuple[float, float]] = {
    "ort": (0.78, 0.02),
    "openvino": (1.01, 0.02),
    "mnn": (0.87, 0.03),
    "torch": (1.93, 0.05),
    "onnx-reference": (1.16, 0.59),
    "onnx-reference-fp64": (1.13, 0.68),
    "litert": (25.0, 0.04),
    "ncnn": (3.69, 0.56),
    "tvm": (10.06, 0.58),
    "tf": (28.19, 0.09),
}
#: the model PRIOR_SECONDS was measured on: nodes and weight elements of YOLOv8n at 320
PRIOR_MODEL = {"nodes": 244, "params": 3_158_094}
#: most observations kept per backend (the latest)
KEEP = 50
#: a run of another model here predicts this one's cost when their weights are within this factor
#: (else the prior): per-sample times of much smaller models are mostly per-call overhead, so scaling
#: them by weights overestimates a large model many times (docs/run.md, "Witnesses")
NEAR_FACTOR = 10.0


def machine_key() -> str:
    """This machine's key: CPU model and logical core count, as a file name."""
    import platform
    import re

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return re.sub(r"[^A-Za-z0-9.]+", "-", f"{cpu}-{os.cpu_count()}cpu").strip("-")[:120] or "unknown"


def costs_file() -> Path:
    """``<cache>/costs/<machine key>.json`` (:func:`anpred.cache.cache_root`)."""
    from anpred.cache import cache_root

    return cache_root() / "costs" / f"{machine_key()}.json"


def model_size(proto) -> dict[str, Any]:
    """``{"nodes": int, "params": int}``: the graph's node count (subgraphs included) and the number
    of elements of its initializers (a model's weights; external data counted from the dims)."""
    import numpy as np

    def count(graph) -> int:
        n = 0
        for node in graph.node:
            n += 1
            for a in node.attribute:
                if a.g is not None and a.HasField("g"):
                    n += count(a.g)
                n += sum(count(g) for g in a.graphs)
        return n

    params = sum(int(np.prod(t.dims)) if len(t.dims) else 1 for t in proto.graph.initializer)
    return {"nodes": count(proto.graph), "params": params}


def _load() -> dict[str, list[dict[str, Any]]]:
    f = costs_file()
    try:
        data = json.loads(f.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def record(statuses: dict[str, Any], model_sha: str, size: dict[str, Any], meta: dict[str, Any]) -> None:
    """Append what each backend that ran ``ok`` took (``statuses``: label -> BackendStatus) to the
    machine's costs file: its process's wall time (run.json ``resources[label].seconds_wall``: start,
    imports, conversion and samples) less the samples' time, and the seconds per sample. ``meta``:
    the run store's meta (``backend_specs`` maps a label to its registry name). Never raises for an
    unwritable cache (the costs are a help, not a result)."""
    from anpred.onnx_io import atomic_write_text

    data = _load()
    for label, st in statuses.items():
        if st.status != "ok" or not st.samples:
            continue
        name = (meta.get("backend_specs") or {}).get(label, {}).get("name", label)
        wall = (meta.get("resources") or {}).get(label, {}).get("seconds_wall")
        start = float(wall) - float(st.seconds_run) if wall else float(st.seconds_prepare)
        obs = {
            "model": model_sha,
            "nodes": size["nodes"],
            "params": size["params"],
            "prepare_s": round(max(start, float(st.seconds_prepare)), 4),
            "sample_s": round(float(st.seconds_run) / max(1, st.samples), 5),
        }
        data[name] = (data.get(name, []) + [obs])[-KEEP:]
    try:
        f = costs_file()
        f.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(f, json.dumps(data, indent=0))
    except OSError:
        pass


def estimate(name: str, model_sha: str, size: dict[str, Any], samples: int) -> dict[str, Any]:
    """The predicted seconds of backend ``name`` on a model (its sha256 and :func:`model_size`) for
    ``samples`` samples: ``{"seconds", "basis"}``, basis ``this model`` (its latest observation
    here), ``N runs here, nearest W weights`` (the run of the nearest model size on this machine, within
    :data:`NEAR_FACTOR` of its weights, its samples scaled by the weights) or ``prior``
    (:data:`PRIOR_SECONDS` scaled; ``seconds`` None for a backend without one)."""
    obs = _load().get(name) or []
    same = [o for o in obs if o.get("model") == model_sha]
    if same:
        o = same[-1]
        return {"seconds": round(o["prepare_s"] + samples * o["sample_s"], 3), "basis": "this model"}
    nodes, params = max(1, int(size["nodes"])), max(1, int(size["params"]))
    near = min(obs, key=lambda o: abs(math.log(max(1, o["params"]) / params))) if obs else None
    # a run of a model within NEAR_FACTOR of this one's weights here; farther, the per-sample time of a
    # small model (mostly the per-call overhead) says little about a large one: the prior, if any
    if near is not None and (
        abs(math.log(max(1, near["params"]) / params)) <= math.log(NEAR_FACTOR) or name not in PRIOR_SECONDS
    ):
        # starting a backend (imports, a converter) costs about the same whatever the model; its
        # samples scale with the weights
        runs = f"{len(obs)} run{'' if len(obs) == 1 else 's'} here"
        secs = near["prepare_s"] + samples * near["sample_s"] * params / max(1, near["params"])
        return {"seconds": round(secs, 3), "basis": f"{runs}, nearest {near['params']} weights"}
    if name not in PRIOR_SECONDS:
        return {"seconds": None, "basis": "never measured"}
    prep, smp = PRIOR_SECONDS[name]
    secs = prep * nodes / PRIOR_MODEL["nodes"] + samples * smp * params / PRIOR_MODEL["params"]
    return {"seconds": round(secs, 3), "basis": "prior (YOLOv8n 320, docs/run.md)"}
