"""The three steps of a configuration, each executed as one Ray task (:mod:`anpred.campaign.engine`)
and written so that a retried or resumed step finds what an earlier attempt finished.

Work folder of a configuration: ``OUT/.work/<id>/`` (kept until the configuration is complete)::

    build/            the report folder being built (anchored model, samples, then the merged run)
    prepared.pkl      the prepared test (:class:`anpred.pipeline.oneshot.Prepared`), written atomically
    runs/<backend>/   one single-backend run store per backend (:func:`anpred.run.run_model`, committed
                      atomically by the driver of that run)
    warm/             or one run store of all the backends, run on warm workers (:mod:`anpred.campaign.warm`)

1. :func:`prepare_configuration`: resolve, instrument, map, choose the samples (``anpred test``'s
   steps before the run, :func:`anpred.pipeline.oneshot.prepare_test`).
2. :func:`run_backend`: one backend in its own worker process on the prepared samples, with the
   configuration's runtime versions first on its ``PYTHONPATH`` (:mod:`anpred.campaign.envs`); or,
   for a configuration in the default environment, all its backends in one run on warm workers
   shared with the other configurations of its batch (``warm/``, :mod:`anpred.campaign.warm`).
3. :func:`judge_configuration`: the single-backend runs merged into one run store (files hard-linked,
   samples checked to be the same), judged, task metrics, drill-down, reports; the report folder is
   committed to ``OUT/configs/<id>`` in one rename (:func:`anpred.folders.commit_partial`), so a
   configuration's result is written once, atomically, and a folder there is always complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = [
    "prepare_configuration",
    "run_backend",
    "judge_configuration",
    "merge_runs",
    "CONFIG_FILE",
    "record_of",
    "read_record",
    "import_paths",
]

#: the campaign's record of a finished configuration, inside its report folder
CONFIG_FILE = "campaign-config.json"


@contextlib.contextmanager
def import_paths(paths: list[str]):
    """``paths`` first on ``sys.path`` and ``PYTHONPATH`` (factories, user adapters) for the block."""
    old_sys, old_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path[:0] = [p for p in paths if p not in sys.path]
    if paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old_env] if old_env else []))
    try:
        yield
    finally:
        sys.path[:] = old_sys
        if old_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_env


def _atomic_pickle(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(pickle.dumps(obj))
    os.replace(tmp, path)


def _test_options(cfg, keys: tuple[str, ...]) -> dict[str, Any]:
    opts = {k: v for k, v in cfg.options.items() if k in keys}
    if isinstance(opts.get("imgsz"), list):
        opts["imgsz"] = tuple(opts["imgsz"])
    return opts


def prepare_configuration(cfg, work: str | Path, paths: list[str]):
    """Step 1 (see the module docstring). Returns the Prepared test (from ``prepared.pkl`` when an
    earlier attempt finished it). Raises what :func:`anpred.pipeline.oneshot.prepare_test` raises."""
    from anpred.pipeline.oneshot import prepare_test

    work = Path(work)
    done = work / "prepared.pkl"
    if done.is_file():
        return pickle.loads(done.read_bytes())
    build = work / "build"
    shutil.rmtree(build, ignore_errors=True)
    for runs in ("runs", "warm"):  # runs of an earlier preparation do not fit this one
        shutil.rmtree(work / runs, ignore_errors=True)
    build.mkdir(parents=True)
    opts = _test_options(
        cfg,
        ("inputs", "samples", "stages", "max_cut_width", "imgsz", "seed", "factory_kwargs", "bind", "task", "labels"),
    )
    with import_paths(paths):
        prep = prepare_test(cfg.model, build, backends=cfg.backends, **opts)
    _atomic_pickle(prep, done)
    return prep


def run_backend(
    cfg,
    backend: str,
    work: str | Path,
    prep,
    env_paths: list[str],
    timeout_s: float,
    paths: list[str],
    memory_bound_gb: float | None = None,
) -> dict[str, Any]:
    """Step 2: ``backend`` on the prepared samples into ``runs/<backend>`` (kept from an earlier
    attempt when complete). Returns its :class:`anpred.backends.base.BackendStatus` as a dict (a
    backend that fails, crashes, times out or passes its memory bound is a status, not an exception).

    The run holds one backend of the configuration, so it does not apply the bad-input rule (the
    engine applies it over all the configuration's backends, :func:`anpred.run.outcome.inputs_misfit`),
    and its population's shared conversion records go to the configuration's ``shared`` folder (one
    attempt for all its runs, :mod:`anpred.backends.shared`). ``memory_bound_gb``: the worker's bound
    (None: from this node's available memory, :mod:`anpred.run.limits`)."""
    from anpred.pipeline.subject import PythonPath
    from anpred.run import BackendSpec, RunStore, run_model
    from anpred.run.limits import RunGuards, parse_gib

    t0 = time.perf_counter()
    work = Path(work)
    out = work / "runs" / backend
    out.parent.mkdir(parents=True, exist_ok=True)
    # which process runs which backend while it runs (operators: to find, or kill, a stuck run); removed
    # when the task ends (Ray reuses its worker processes for other tasks). A file left by a killed
    # worker names a dead pid: check that the pid is alive before acting on it
    pid_file = out.parent / f".{backend}.pid"
    pid_file.write_text(str(os.getpid()))
    try:
        if not (out / "run.json").is_file():
            # the configuration's runtime versions: the spec's python_path (recorded with the run, so the
            # judge's drill-down runs the same release)
            spec = BackendSpec(backend, backend, {"python_path": [str(p) for p in env_paths]} if env_paths else {})
            guards = RunGuards(
                backend_memory=parse_gib(memory_bound_gb) if memory_bound_gb else None,
                bad_input_rule=False,
                shared_dir=str(work / "shared"),
            )
            with import_paths(paths), PythonPath(prep.sys_path):
                run_model(
                    work / "build" / "anchored.onnx",
                    [spec],
                    prep.spec,
                    out,
                    mode="tensors",
                    timeout_s=timeout_s,
                    progress=False,
                    overwrite=True,
                    guards=guards,
                )
    finally:
        pid_file.unlink(missing_ok=True)
    st = RunStore.open(out).statuses()[backend].to_dict()
    st["task_seconds"] = round(time.perf_counter() - t0, 3)  # this attempt (near 0: a run kept from an earlier one)
    return st


def merge_runs(runs: dict[str, Path], dst: Path, lost: dict[str, str] | None = None):
    """Merge single-backend run stores (backend -> folder, same model and samples; backends mapped to
    the first backend's folder are taken from it whole) into one run store
    at ``dst`` (tensor files hard-linked where the file system allows, else copied); ``lost``: backend
    -> reason for backends whose task was lost (status ``crashed``). Returns the merged RunStore.

    Raises:
        AnpredError: no run to merge; runs whose samples differ (input hashes).
    """
    from anpred.backends.base import BackendStatus
    from anpred.run import RunStore

    if not runs:
        raise AnpredError("no backend run finished: nothing to judge")

    def link(src, dst_path):
        try:
            os.link(src, dst_path)
        except OSError:
            shutil.copy2(src, dst_path)

    labels = list(runs)
    first = runs[labels[0]]
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(first, dst, copy_function=link)
    store = RunStore.open(dst)
    hashes = [s.get("sha256") for s in store.meta.get("samples", [])]
    for b in labels[1:]:
        if runs[b] == first:  # a run of several backends (a warm run): copied whole above
            continue
        other = RunStore.open(runs[b])
        if [s.get("sha256") for s in other.meta.get("samples", [])] != hashes:
            raise AnpredError(f"the run of {b} saw other samples than {labels[0]}'s: runs cannot be merged")
        src = runs[b] / "tensors" / b
        if src.is_dir():
            shutil.copytree(src, dst / "tensors" / b, copy_function=link)
        log = runs[b] / "logs" / f"{b}.log"
        if log.is_file():
            (dst / "logs").mkdir(exist_ok=True)
            link(log, dst / "logs" / f"{b}.log")
        for key in ("backends", "backend_specs", "resources", "coverage"):
            if isinstance(other.meta.get(key), dict):
                store.meta.setdefault(key, {}).update({k: v for k, v in other.meta[key].items() if k == b})
    for b, reason in (lost or {}).items():
        store.set_status(BackendStatus(name=b, status="crashed", reason=reason))
    store.save_meta()
    return RunStore.open(dst)


def judge_configuration(
    cfg,
    work: str | Path,
    final: str | Path,
    prep,
    statuses: dict[str, dict],
    lost: dict[str, str],
    campaign: dict[str, Any],
    paths: list[str],
) -> dict[str, Any]:
    """Step 3 (see the module docstring): merge, judge, report, commit to ``final``. ``statuses``:
    backend -> status dict of the finished runs; ``lost``: backend -> why its task was lost.
    Returns the configuration's record (:func:`record_of`)."""
    from anpred.folders import commit_partial
    from anpred.onnx_io import atomic_write_text, to_json
    from anpred.options import JudgeOptions, TestOptions
    from anpred.pipeline.oneshot import finish_run_store, finish_test, relocated

    t0 = time.perf_counter()
    work, final = Path(work), Path(final)
    done = read_record(final)
    if done is not None:  # an earlier attempt committed the folder and then died: its result stands
        shutil.rmtree(work, ignore_errors=True)
        return done
    build = work / "build"
    # a backend's run: its single-backend run, or the configuration's warm run (anpred.campaign.warm)
    runs = {b: work / statuses[b].get("run_folder", f"runs/{b}") for b in cfg.backends if b in statuses}
    store = merge_runs(runs, build / "run", lost)
    sts = finish_run_store(store, prep.label, prep.spec, prep.details.get("inputs") or {}, build, final)
    opts = cfg.options
    judge = JudgeOptions(
        oracle=opts.get("oracle", "consensus"),
        config=opts.get("config"),
        allow_incomplete=bool(opts.get("allow_incomplete")),
        labels=opts.get("labels"),
        drill=bool(opts.get("drill")),
    )
    with import_paths(paths):
        result = finish_test(
            prep,
            build,
            final,
            statuses=sts,
            opts=TestOptions.make(judge=judge, quiet=True),
            seconds=dict(prep.seconds or {}),
        )
    result.details = relocated(result.details, build, final)
    result.seconds["judge"] = time.perf_counter() - t0
    atomic_write_text(build / "test.json", to_json(result.to_dict(), indent=1))
    record = record_of(cfg, result.report, result.statuses, result.reasons, final)
    record["campaign"] = campaign
    # wall time of each step's task (s): for the scaling simulation of benchmarks/bench_campaign.py
    record["timings"] = {
        "prepare": round((prep.seconds or {}).get("prepare", 0.0), 3),
        "runs": {b: s.get("task_seconds") for b, s in statuses.items()},
        "judge": round(time.perf_counter() - t0, 3),
    }
    warm = {b: s["warm"] for b, s in statuses.items() if s.get("warm")}
    if warm:  # run on warm workers: the batch, each backend's worker pid and whether it was started for this one
        record["timings"]["warm"] = warm
    atomic_write_text(build / CONFIG_FILE, to_json(record, indent=1))
    final.parent.mkdir(parents=True, exist_ok=True)
    commit_partial(build, final)
    shutil.rmtree(work, ignore_errors=True)
    return record


def record_of(cfg, report, statuses: dict[str, str], reasons: dict[str, str], final: Path) -> dict[str, Any]:
    """The summary record of a judged configuration: its description, the report's status and exit
    code, and per backend the run status, verdict, origin (anchor, stage), largest nRMSE, the task
    headline, the culprit operator (drill-down) and the library versions."""
    task = (getattr(report, "task", None) or {}).get("backends", {})
    backends: dict[str, Any] = {}
    for b in cfg.backends:
        v = report.verdicts.get(b)
        info = report.backends.get(b) if isinstance(report.backends, dict) else None
        row: dict[str, Any] = {"run": statuses.get(b, "missing"), "reason": reasons.get(b, "")}
        if v is not None:
            impl = getattr(v, "implementation", None)
            row.update(
                verdict=v.status,
                flagged=bool(v.flagged or (impl is not None and impl.flagged)),
                origin_anchor=v.origin_anchor,
                origin_stage=v.origin_stage,
                worst_primary=v.worst_primary,
                culprit=(getattr(v, "culprit", None) or {}).get("node"),
                culprit_op=(getattr(v, "culprit", None) or {}).get("op_type"),
            )
        else:
            row.update(verdict="failed" if statuses.get(b) != "ok" else "unjudged", flagged=False)
        if b in task:
            row["task"] = task[b].get("headline")
        row["versions"] = (info.get("versions") if isinstance(info, dict) else getattr(info, "versions", None)) or {}
        backends[b] = row
    return {
        **cfg.to_dict(),
        "state": "complete",
        "status": report.status,
        "exit_code": report.exit_code,
        "folder": str(final),
        "report_html": str(final / "report.html"),
        "backends": backends,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def read_record(folder: Path) -> dict[str, Any] | None:
    """The record of a committed configuration folder, None when absent or unreadable; ``folder``
    and ``report_html`` name where it is now (an OUT moved or copied since keeps working)."""
    try:
        rec = json.loads((Path(folder) / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    rec["folder"], rec["report_html"] = str(Path(folder)), str(Path(folder) / "report.html")
    return rec
