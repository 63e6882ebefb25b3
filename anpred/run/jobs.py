"""What a backend worker process is given (its job file, its environment) and which backends are not
started at all (the pre-run coverage check): the driver's side of the driver -> worker contract of
:mod:`anpred.run.spec`, used by :func:`anpred.run.driver.run_model` and its
:class:`~anpred.run.driver.WorkerPool`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from anpred.backends import backend_class
from anpred.backends.base import BackendStatus
from anpred.errors import BackendError
from anpred.run.spec import BackendSpec, WorkerJob
from anpred.run.store import RunStore

__all__ = [
    "WORKER_MALLOC_TUNABLES",
    "worker_malloc_tunables",
    "worker_env",
    "precheck_refusals",
    "make_job",
    "read_status",
]


#: glibc malloc settings of every backend worker (see :func:`worker_malloc_tunables`)
WORKER_MALLOC_TUNABLES = {"glibc.malloc.mmap_threshold": str(256 << 20), "glibc.malloc.trim_threshold": str(1 << 30)}


def worker_malloc_tunables(existing: str = "") -> str:
    """``GLIBC_TUNABLES`` for a backend worker: ``existing`` plus :data:`WORKER_MALLOC_TUNABLES` for
    the malloc settings it does not set itself (a user's own settings win).

    Why: every sample allocates the same large arrays again (inputs, the backend's outputs: tens of
    megabytes per sample for YOLOv8n at 640x640). With glibc's defaults, blocks above the dynamic mmap threshold
    (at most 32 MiB) are ``mmap``-ed and freed blocks at the top of the heap are trimmed, so each
    sample faults in fresh pages again (what that costs: docs/run.md, 'Measurements: page faults').
    A fixed 256 MiB mmap threshold and a 1 GiB trim
    threshold keep those blocks in the heap for reuse; memory stays bounded by one sample's working
    set (peak RSS in docs/run.md). Other C libraries ignore the variable."""
    have = {kv.split("=", 1)[0] for kv in existing.split(":") if "=" in kv}
    add = [f"{k}={v}" for k, v in WORKER_MALLOC_TUNABLES.items() if k not in have]
    return ":".join([x for x in [existing] if x] + add)


def precheck_refusals(
    store: RunStore, specs: list[BackendSpec], model_path: Path, progress: bool
) -> dict[str, BackendStatus]:
    """Pre-run coverage of every backend (on the model it will run: its ``model`` option, else the
    run's), stored in ``store.meta["coverage"]`` and printed (with ``progress``). Returns the statuses
    of the backends not to start (``unsupported``, reason naming the operators)."""
    from anpred.backends.coverage import format_coverage, precheck, refusal

    groups: dict[str, dict[str, str]] = {}
    for s in specs:
        groups.setdefault(str(Path(s.options.get("model", model_path)).resolve()), {})[s.label] = s.name
    coverage: dict[str, dict] = {}
    for path, names in groups.items():
        coverage.update(precheck(path, names))
    coverage = {s.label: coverage[s.label] for s in specs}
    store.meta["coverage"] = coverage
    store.save_meta()
    lines = format_coverage(coverage)
    if progress:
        print(
            "pre-run coverage: "
            + ("; ".join(lines) if lines else "no backend's operator table lacks an operator of the model"),
            file=sys.stderr,
        )
    refused = {}
    for s in specs:
        row = coverage[s.label]
        if row.get("ops"):
            try:
                nominal = backend_class(s.name).precision
            except BackendError:
                nominal = "fp32"
            refused[s.label] = BackendStatus(
                name=s.label,
                family=s.family(),
                status="unsupported",
                reason=refusal(row),
                precision=nominal,
                precision_requested=nominal,
            )
    return refused


def make_job(
    store: RunStore,
    spec: BackendSpec,
    model_path: Path,
    mode: str,
    input_shapes: dict[str, list[int]] | None,
    work: Path,
    log_path: Path,
    shared: Path | None = None,
):
    """The worker job of ``spec`` on ``store`` in folder ``work`` (its options without the runner's
    own keys; int8 calibration on the run's samples; the run's input shapes where the backend needs
    them; ``shared``: the folder of the run's shared-conversion records, :mod:`anpred.backends.shared`).
    Returns ``(job, job path, log path, status path, python_path folders)``."""
    work.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    status_path = work / "status.json"
    options = dict(spec.options)
    model = Path(options.pop("model", model_path)).resolve()
    python_path = [str(f) for f in options.pop("python_path", None) or []]
    family = spec.family()
    options.pop("family", None)
    try:
        cls = backend_class(spec.name)
    except BackendError:
        cls = None
    if getattr(cls, "needs_calibration", False) and "calibration" not in options:
        options["calibration"] = [str(store.input_file(sid)) for sid in store.sample_ids]
    if getattr(cls, "needs_input_shapes", False) and input_shapes and "input_shapes" not in options:
        options["input_shapes"] = input_shapes  # the run's concrete input shapes (all samples share them)
    job = WorkerJob(
        store=str(store.root),
        name=spec.name,
        label=spec.label,
        family=family,
        options=options,
        model=str(model),
        mode=mode,
        samples=store.sample_ids,
        status_path=str(status_path),
        shared_dir=str(shared or work.parent / "shared"),
    )
    job_path = work / "job.json"
    job.save(job_path)
    return job, job_path, log_path, status_path, python_path


def worker_env(python_path: list[str] | None = None, direct_io: bool = True) -> dict[str, str]:
    """The worker's environment: this one, with faulthandler on, the malloc tunables
    (:func:`worker_malloc_tunables`), this ``anpred`` first on ``PYTHONPATH``, then the spec's
    ``python_path`` folders (another release of the backend's library); ``direct_io=False``: its
    tensor files are written through the page cache (``ANPRED_DIRECT_IO=0``) and its thread pools do
    not spin (``ANPRED_THREAD_SPINNING=0``)."""
    env = dict(os.environ)
    if not direct_io:  # (a streamed run: its judge reads the tensors at once and shares the cores)
        env["ANPRED_DIRECT_IO"] = "0"
        env.setdefault("ANPRED_THREAD_SPINNING", "0")  # thread pools sleep when idle (anpred.backends.ort)
    env["PYTHONFAULTHANDLER"] = "1"
    env["GLIBC_TUNABLES"] = worker_malloc_tunables(env.get("GLIBC_TUNABLES", ""))
    pkg_parent = str(Path(__file__).resolve().parents[2])  # the folder holding the anpred package
    parts = [pkg_parent, *(python_path or [])] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def read_status(path: Path) -> BackendStatus | None:
    if not path.is_file():
        return None
    try:
        return BackendStatus.from_dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, TypeError):
        return None


def worker_argv(job_path, wfd: int, *extra: str) -> list[str]:
    """The command line of a backend worker (:mod:`anpred.run.worker`): its job file, the pipe it
    reports on (``wfd``), this process as its parent, then ``extra`` (a pool worker's ``--feed`` ...)."""
    return [
        sys.executable,
        "-m",
        "anpred.run.worker",
        "--worker",
        str(job_path),
        "--fd",
        str(wfd),
        "--parent",
        str(os.getpid()),
        *extra,
    ]
