"""A campaign's configurations batched onto warm workers (the run step of :mod:`anpred.campaign.engine`).

A configuration that runs in the default environment (no ``[[versions]]`` entry applies to its
backends) and whose backends fit one node is *batchable*: instead of one Ray task per (configuration,
backend), each starting a backend process that imports its library and converts the model, one
Ray task (:func:`run_configurations`) takes a batch of prepared configurations and runs each one's
anchored model on all its backends through one :class:`anpred.run.warm.WarmPool`
(:func:`anpred.run.run_model` with ``pool``: one run folder, ``OUT/.work/<id>/warm``, holding every
backend of the configuration). Each backend's process, its imports and what its converter keeps warm
stay up from configuration to configuration; the configurations are then judged by the engine's
judge tasks exactly as the one-shot runs (same merge, same record, same report).

Isolation, as :class:`~anpred.run.warm.WarmPool` keeps it: a backend that fails, crashes, times out
or passes its memory bound on one configuration has that status for that configuration only, and
the next configuration gets a fresh worker for it. The bad-input rule is not applied in the run
(``bad_input_rule=False``): the engine applies it over the configuration's statuses, as for the
one-shot runs (:func:`anpred.run.outcome.inputs_misfit`). An exception of ANPRED's run (inputs that
do not fit the model) is that configuration's ``error``, and the batch goes on.

Resume: a configuration whose warm run is committed (``run.json``) is not run again, by a retried
batch task or a later invocation (:func:`warm_statuses`); the engine reads the runs a lost batch
task had finished from the same place.

The backends of a batch run one after the other (the task asks for the largest of their resources,
:func:`batch_resources`); batches run side by side as Ray's CPUs allow.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.campaign.tasks import import_paths

__all__ = [
    "WarmBatch",
    "DEFAULT_BATCH",
    "WARM_RUN",
    "batchable",
    "batch_size",
    "batch_resources",
    "run_configurations",
    "warm_statuses",
]

#: configurations per batch task when neither ``[campaign] batch`` nor ``--batch`` sets it: at most
#: this many, and fewer when that leaves a Ray CPU without a batch (``ceil(configurations / slots)``,
#: :func:`batch_size`). A batch pays each backend's process start and imports once (seconds per
#: backend for torch, TensorFlow, OpenVINO: docs/campaigns.md, 'Measured: figures behind defaults'),
#: so 8 configurations cut that cost by 8x; a larger batch saves little more while its configurations
#: wait longer for their judge (a batch task returns when all its configurations have run) and the
#: progress bar moves in bigger steps.
DEFAULT_BATCH = 8
#: a batched configuration's run folder under ``OUT/.work/<id>/`` (all its backends in one run store)
WARM_RUN = "warm"


@dataclass
class WarmBatch:
    """What one batch task needs besides its configurations: ``out`` (the campaign's output folder),
    ``timeout_s`` (per configuration and backend: prepare and run, as a one-shot backend run),
    ``paths`` (import paths: the working folder and the campaign's), ``memory_bound_gb`` (a
    backend worker's RSS bound; None: from the node's available memory, :mod:`anpred.run.limits`),
    ``name`` (the batch's name in the records)."""

    out: str
    timeout_s: float
    paths: list[str]
    memory_bound_gb: float | None = None
    name: str = ""


def batchable(cfg) -> bool:
    """Whether configuration ``cfg`` runs in the default environment: no runtime version pinned for
    any of its backends (those keep their single-backend runs with the version first on the path)."""
    return not cfg.versions


def batch_resources(cfgs: list) -> dict[str, float]:
    """The Ray resources of one batch task: the largest ``cpus``, ``memory_gb`` and ``gpus`` of the
    backends of its configurations (the backends run one after the other; the run's memory bound,
    :class:`anpred.run.limits.RunGuards`, watches the idle warm workers too)."""
    res = [r for c in cfgs for r in c.resources.values()] or [{}]
    return {k: max(float(r.get(k, d)) for r in res) for k, d in (("cpus", 1.0), ("memory_gb", 2.0), ("gpus", 0.0))}


def batch_size(batch: int | None, n: int, cpus: float, task_cpus: float) -> int:
    """Configurations per batch: ``batch`` when given (> 0), else :data:`DEFAULT_BATCH` or fewer so
    that the ``n`` configurations fill every batch slot of the cluster (``cpus // task_cpus``)."""
    if batch:
        return int(batch)
    slots = max(1, int(cpus // max(task_cpus, 1e-9)))
    return max(1, min(DEFAULT_BATCH, math.ceil(n / slots)))


def warm_statuses(work: Path, backends: list[str]) -> dict[str, dict[str, Any]] | None:
    """The statuses (backend -> status dict, with ``run_folder`` and ``task_seconds``) of a
    configuration's committed warm run in ``work`` (``OUT/.work/<id>``), None when there is none or
    it lacks one of ``backends``."""
    from anpred.errors import AnpredError
    from anpred.run import RunStore

    folder = Path(work) / WARM_RUN
    if not (folder / "run.json").is_file():
        return None
    try:
        sts = RunStore.open(folder).statuses()
    except (OSError, ValueError, AnpredError):
        return None
    if any(b not in sts for b in backends):
        return None
    out = {}
    for b in backends:
        d = sts[b].to_dict()
        # the judge reads this backend's run here; the task time is the backend's own share of the run
        d["run_folder"] = WARM_RUN
        d["task_seconds"] = round(sts[b].seconds_prepare + sts[b].seconds_run, 3)
        out[b] = d
    return out


def run_configurations(items: list[tuple[Any, Any]], opts: WarmBatch) -> dict[str, dict[str, Any]]:
    """Run each prepared configuration of ``items`` (``(Configuration, Prepared)`` pairs) on warm
    workers (module docstring). Returns configuration id -> ``{"statuses": {backend: status dict},
    "seconds": wall time of its run}`` or ``{"error": "Type: message"}``; each status dict carries
    ``run_folder``, ``task_seconds`` and ``warm`` (``batch``, the worker's ``pid`` after the run or None
    when it ended, ``fresh``: a worker process was started for this configuration)."""
    from anpred.run.warm import WarmPool

    out_dir = Path(opts.out)
    pool_dir = out_dir / ".work" / f".pool-{os.getpid()}-{time.time_ns()}"
    pools: dict[str | None, WarmPool] = {}
    results: dict[str, dict[str, Any]] = {}
    try:
        with import_paths(opts.paths):
            for cfg, prep in items:
                results[cfg.id] = _run_one(cfg, prep, pools, pool_dir, opts)
    finally:
        for pool in pools.values():
            pool.close()
        shutil.rmtree(pool_dir, ignore_errors=True)
    return results


def _pool_for(prep, pools: dict, pool_dir: Path, opts: WarmBatch):
    """The warm pool of the configurations whose factory folder is ``prep.sys_path`` (a worker's
    ``PYTHONPATH`` is fixed when it starts, so another folder gets its own pool)."""
    from anpred.run.limits import RunGuards, parse_gib
    from anpred.run.warm import WarmPool

    key = prep.sys_path
    if key not in pools:
        guards = RunGuards(
            backend_memory=parse_gib(opts.memory_bound_gb) if opts.memory_bound_gb else None, bad_input_rule=False
        )
        pools[key] = WarmPool(pool_dir / f"p{len(pools)}", timeout_s=opts.timeout_s, side_by_side=False, guards=guards)
    return pools[key]


def _run_one(cfg, prep, pools: dict, pool_dir: Path, opts: WarmBatch) -> dict[str, Any]:
    """One configuration's run on its warm pool (kept when an earlier attempt committed it)."""
    from anpred.pipeline.subject import PythonPath
    from anpred.run import BackendSpec, run_model
    from anpred.run.limits import RunGuards, parse_gib

    work = Path(opts.out) / ".work" / cfg.id
    t0 = time.perf_counter()
    done = warm_statuses(work, cfg.backends)
    if done is not None:
        return {"statuses": done, "seconds": 0.0}
    pool = _pool_for(prep, pools, pool_dir, opts)
    before = dict(pool.started)
    pool.shared = work / "shared"  # one folder of shared-conversion records per configuration, as one-shot
    # which process runs this configuration's batch (operators: to find, or kill, a stuck batch)
    pid_file = work / ".batch.pid"
    pid_file.write_text(str(os.getpid()))
    try:
        with PythonPath(prep.sys_path):
            run_model(
                work / "build" / "anchored.onnx",
                [BackendSpec(b, b, {}) for b in cfg.backends],
                prep.spec,
                work / WARM_RUN,
                mode="tensors",
                timeout_s=opts.timeout_s,
                progress=False,
                overwrite=True,
                # the pool's memory bound (it enforces it) recorded in run.json, as a one-shot run does
                guards=RunGuards(
                    backend_memory=parse_gib(opts.memory_bound_gb) if opts.memory_bound_gb else None,
                    bad_input_rule=False,
                    shared_dir=str(work / "shared"),
                ),
                pool=pool,
            )
    except Exception as err:  # noqa: BLE001 - any failure of one configuration is its own; the batch goes on
        return {"error": " ".join(f"{type(err).__name__}: {err}".split())[:600]}
    finally:
        pid_file.unlink(missing_ok=True)
    _keep_logs(pool, work / WARM_RUN, cfg.backends)
    statuses = warm_statuses(work, cfg.backends) or {}
    for b, st in statuses.items():
        w = pool.workers.get(b)
        st["warm"] = {
            "batch": opts.name,
            "pid": w["proc"].pid if w else None,
            "fresh": pool.started.get(b, 0) > before.get(b, 0),
        }
    return {"statuses": statuses, "seconds": round(time.perf_counter() - t0, 3)}


def _keep_logs(pool, run_dir: Path, backends: list[str]) -> None:
    """Copy the worker log of each backend that did not end ``ok`` into the run's ``logs/`` (a crash
    reason points there; the pool's folder is removed when the batch ends)."""
    from anpred.run import RunStore

    sts = RunStore.open(run_dir).statuses()
    for b in backends:
        log = pool.work / f"{b}.log"
        if b in sts and sts[b].status != "ok" and log.is_file():
            (run_dir / "logs").mkdir(exist_ok=True)
            shutil.copyfile(log, run_dir / "logs" / f"{b}.log")
