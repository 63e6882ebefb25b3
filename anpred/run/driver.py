"""The run driver: execute an anchored model on several backends, each in its own process, and store
what every backend saw in a run folder (:mod:`anpred.run.store`).

Isolation: every backend runs in a fresh ``python -m anpred.run.worker --worker JOB`` subprocess
(:mod:`anpred.run.worker`, job: :class:`anpred.run.spec.WorkerJob`) in its own session (process
group). A segfault or abort (negative exit status), a timeout (the whole process group is killed), an
unsupported operator, a Python exception, or a converter calling ``sys.exit`` becomes that backend's
:class:`~anpred.backends.base.BackendStatus` (``ok`` | ``failed`` | ``unsupported`` | ``crashed`` |
``timeout`` with a reason); the other backends' results are kept. Backends run one after the other
(they use all cores each). The worker's stdout/stderr go to ``logs/<label>.log`` in the run folder
(with ``PYTHONFAULTHANDLER`` tracebacks on crashes).

The run is built in a hidden sibling folder ``.<name>.partial-<pid>`` and renamed to ``out_dir`` at the
end (:mod:`anpred.folders`), so a bad input, an interrupt or an error leaves nothing half-written and
an existing run is only replaced (with ``overwrite``) once the new one is complete. SIGTERM during a
run raises :class:`Terminated` in the driver (workers killed, partial folder removed, as for Ctrl-C).

Modes:

- ``tensors``: every anchor of every sample and backend in ``tensors/<label>/<sample>.safetensors``
  (``.npz`` for dtypes safetensors lacks; :mod:`anpred.tensorfile`) in the backend's own dtype and layout.
- ``stats``: no tensors; per backend ``stats/<label>.json`` holds streaming summaries per anchor over
  all samples, and ``stats/<label>.samples.jsonl`` one line of per-sample summaries per sample
  (written as it goes). Memory stays constant in the number of samples. See
  :class:`~anpred.run.streaming.StreamingStats` for the statistics; ``anpred check`` reads these files.

Long-lived workers that serve a stream of runs (``pool``) are :class:`anpred.run.pool.WorkerPool`.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from anpred.backends import REGISTRY
from anpred.backends.base import BackendStatus
from anpred.errors import AnpredError, BackendError, OutputPathError, Terminated
from anpred.folders import commit_partial, partial_dir
from anpred.onnx_io import to_json
from anpred.run.jobs import (
    WORKER_MALLOC_TUNABLES,
    make_job,
    precheck_refusals,
    worker_argv,
    read_status,
    worker_env,
    worker_malloc_tunables,
)
from anpred.run.jobs import worker_env as _worker_env  # noqa: F401 - its earlier name (tests, benchmarks)
from anpred.run.limits import MemoryWatch, RunGuards
from anpred.run.model import copy_model, load_anchored
from anpred.run.outcome import format_summary, lost_status, raise_if_inputs_misfit
from anpred.run.pool import WorkerPool  # its earlier home (callers and docs name anpred.run.driver.WorkerPool)
from anpred.run.spec import MODES, BackendSpec, RunSettings
from anpred.run.store import RunStore

__all__ = [
    "run_model",
    "Terminated",
    "format_summary",
    "WORKER_MALLOC_TUNABLES",
    "worker_malloc_tunables",
    "WorkerPool",
    "sigterm_raises",
    "RunGuards",
    "make_job",
]


def run_model(
    model_path: str | Path,
    backends: Iterable["str | BackendSpec"],
    inputs: Any,
    out_dir: str | Path,
    settings: RunSettings | None = None,
    **fields: Any,
):
    """Run the anchored model on every backend and return the :class:`~anpred.run.store.RunStore`.

    Args:
        model_path: an anchored ``.onnx`` (manifest in its metadata, or ``<stem>.anchors.json`` beside
            it; a model without one is run with its graph outputs as the only anchors).
        backends: registry names or :class:`BackendSpec` objects, run in this order.
        inputs: an :class:`anpred.inputs.InputSpec`, or its text form (a folder, a ``.npz``/``.npy``/
            image file, or ``random:uniform|normal|images[:seed=S][:n=N][:shape=...]``), or samples in
            memory (:class:`anpred.inputs.ArraySamples`).
        out_dir: the run folder to create (its parent folders are created).
        settings: how it runs (:class:`~anpred.run.spec.RunSettings`: mode, timeout, overwrite,
            progress, preprocessing, precheck, worker pool, guards; None: the defaults).
        fields: fields of :class:`~anpred.run.spec.RunSettings` by name (``timeout_s=60``,
            ``progress=False``), overriding those of ``settings``; another name is a ``TypeError``.

    Raises:
        BackendError: unknown backend or duplicate labels (before anything is written).
        InputError: missing/unreadable inputs, inputs that do not fit the model.
        OutputPathError: ``out_dir`` holds another run (without ``overwrite``) or other files.
        ModelLoadError: the model is not readable ONNX.
    A backend that fails, crashes, times out or passes a memory bound does not raise: see the statuses
    in the store.
    """
    from anpred.inputs import ArraySamples, InputSpec

    cfg = dataclasses.replace(settings or RunSettings(), **fields)
    mode, timeout_s, overwrite, progress = cfg.mode, cfg.timeout_s, cfg.overwrite, cfg.progress
    precheck, pool, guards = cfg.precheck, cfg.pool, cfg.guards
    specs = _checked_specs(backends, cfg)
    guards = guards or RunGuards()
    watch = MemoryWatch(guards)  # (raises on a malformed ANPRED_MEMORY_BOUND before anything is written)
    model_path = Path(model_path).resolve()
    model, manifest, man_source = load_anchored(model_path)
    in_spec = inputs if isinstance(inputs, ArraySamples) else InputSpec.parse(inputs, preprocess=cfg.preprocess)
    out = Path(out_dir).absolute()
    _check_out_dir(out, overwrite)
    hint = " ".join(
        [model_path.name, model.producer_name, model.doc_string]
        + [f"{p.key} {p.value}" for p in model.metadata_props if p.key != "anpred.manifest"]
        + [str(manifest.model.get("source", ""))]
    )
    try:
        tmp = partial_dir(out)  # stale partial folders of dead drivers are removed too
    except OSError as err:
        raise OutputPathError(f"cannot create run folder {err.filename or out}: {err.strerror or err}") from err
    restore_sigterm = sigterm_raises()
    try:
        store = RunStore.create(
            tmp,
            manifest,
            mode=mode,
            inputs=in_spec.describe(hint),
            model={
                "path": str(model_path),
                "name": model_path.stem,
                "producer": f"{model.producer_name} {model.producer_version}".strip(),
                "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
                "manifest_source": man_source,
            },
        )
        store.meta["model"].update(copy_model(model_path, model, tmp))
        run_model_path = tmp / "model.onnx"
        shape_hint = _store_samples(store, in_spec, model, hint)
        _record_specs(store, specs)
        store.meta["memory_bounds"] = watch.record
        store.save_meta()
        shared = Path(guards.shared_dir) if guards.shared_dir else tmp / ".work" / "shared"
        refused = precheck_refusals(store, specs, run_model_path, progress) if precheck else {}
        for spec in specs:
            if spec.label in refused:
                store.set_status(refused[spec.label])
            elif pool is None:
                store.set_status(
                    _run_backend(
                        store, spec, run_model_path, mode, timeout_s, progress, _RunContext(shape_hint, watch, shared)
                    )
                )
        if pool is not None:
            for st in pool.run(store, [s for s in specs if s.label not in refused], model_path, shape_hint).values():
                store.set_status(st)
        if guards.bad_input_rule:
            raise_if_inputs_misfit(store)
        shutil.rmtree(tmp / ".work", ignore_errors=True)
        commit_partial(tmp, out)
    except BaseException:
        if pool is not None:  # its workers may still be writing into the partial folder
            pool.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        restore_sigterm()
    result = RunStore.open(out)
    if progress:
        print(format_summary(result), file=sys.stderr)
    return result


def _checked_specs(backends: Iterable["str | BackendSpec"], cfg: RunSettings) -> list[BackendSpec]:
    """The backends as :class:`BackendSpec` objects, after checking them and the run settings ``cfg``.

    Raises:
        BackendError: no backend, an unknown one, or a label used twice.
        AnpredError: an unknown mode, a timeout that is not positive, a worker pool with a mode other
            than ``tensors``.
    """
    mode, timeout_s, pool = cfg.mode, cfg.timeout_s, cfg.pool
    if mode not in MODES:
        raise AnpredError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    specs = [BackendSpec.coerce(b) for b in backends]
    if not specs:
        raise BackendError("no backend given; known backends: " + ", ".join(REGISTRY))
    labels = [s.label for s in specs]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        raise BackendError(f"backend label(s) used twice: {', '.join(dups)} (give each spec its own label)")
    if not timeout_s or timeout_s <= 0:
        raise AnpredError(f"timeout must be positive (got {timeout_s})")
    if pool is not None and mode != "tensors":
        raise AnpredError("a WorkerPool runs mode 'tensors' only")
    return specs


def _record_specs(store: RunStore, specs: list[BackendSpec]) -> None:
    """Record each backend's registry name and options in ``store.meta["backend_specs"]`` (with the
    sha256 of a model file given as an option)."""
    from anpred.onnx_io import sha256_file

    store.meta["backend_specs"] = {s.label: {"name": s.name, "options": json.loads(to_json(s.options))} for s in specs}
    for s in specs:
        if "model" in s.options:
            store.meta["backend_specs"][s.label]["model_sha256"] = sha256_file(s.options["model"])


def sigterm_raises(replace: bool = False):
    """While a run is in progress, make SIGTERM raise :class:`Terminated` in the driver (only from the
    main thread, and only when SIGTERM has its default action: an application's own handler is
    kept, unless ``replace``: a campaign replaces the one ``ray.init`` installs, which aborts the
    process). Returns the function that restores the previous handler."""
    import threading

    old = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or (old is not signal.SIG_DFL and not replace):
        return lambda: None

    def handler(signum, frame):
        raise Terminated(f"terminated by signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


def _store_samples(store: RunStore, in_spec, model, hint: str) -> dict[str, list[int]] | None:
    """Check every sample of ``in_spec`` against ``model`` (:func:`anpred.inputs.check_shapes_fit`, once
    per distinct shape) and add it to ``store``; records the shapes fed in ``meta["inputs"]["input_shapes"]``
    (``size`` in the spec applies only to dynamic dims). Returns them, None when they vary by sample.
    Raises InputError."""
    from anpred.inputs import ArraySamples, check_shapes_fit, model_inputs

    checked: set = set()
    first_shapes: dict[str, list[int]] | None = None
    same_shapes = True
    for i, (src, arrays) in enumerate(in_spec.samples(model_inputs(model), hint)):
        key = tuple((k, tuple(v.shape)) for k, v in sorted(arrays.items()))
        if key not in checked:
            check_shapes_fit(model, {k: tuple(v.shape) for k, v in arrays.items()})
            checked.add(key)
        shapes = {k: list(v.shape) for k, v in arrays.items()}
        if first_shapes is None:
            first_shapes = shapes
        same_shapes = same_shapes and shapes == first_shapes
        pre = in_spec.prewritten_for(i, arrays) if isinstance(in_spec, ArraySamples) else None
        store.add_sample(f"s{i:04d}", arrays, source=src, prewritten=pre)
    store.meta["inputs"]["input_shapes"] = first_shapes if same_shapes else "varies by sample"
    return first_shapes if same_shapes else None


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists():
        if not out.is_dir():
            raise OutputPathError(f"{out} exists and is not a folder; nothing was written")
        if any(out.iterdir()):
            if not (out / "run.json").exists():
                raise OutputPathError(f"{out} exists and is not empty (and is not a run); nothing was written")
            if not overwrite:
                raise OutputPathError(
                    f"{out} already holds a run; choose another -o or pass --overwrite (nothing was written)"
                )
    for anc in [out.parent, *out.parent.parents]:
        if anc.exists():
            if not anc.is_dir():
                raise OutputPathError(f"cannot create {out}: {anc} is a file, not a folder (nothing was written)")
            break
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create {out.parent}: {err.strerror or err}") from err


@dataclass
class _RunContext:
    """What every backend of one run shares: the input shapes fed (None: they vary), the memory
    watchdog, the folder of the shared-conversion records."""

    input_shapes: dict[str, list[int]] | None
    watch: MemoryWatch
    shared: Path


def _run_backend(
    store: RunStore, spec: BackendSpec, model_path: Path, mode: str, timeout_s: float, progress: bool, ctx: _RunContext
) -> BackendStatus:
    """Run one backend in its own worker process and return its status (the worker's, completed
    with a crash, timeout or memory bound seen here); its resources go to
    ``store.meta["resources"][label]``."""
    from tqdm import tqdm

    from anpred.backends.shared import settle

    job, job_path, log_path, status_path, python_path = make_job(
        store,
        spec,
        model_path,
        mode,
        ctx.input_shapes,
        store.root / ".work" / spec.label,
        store.root / "logs" / f"{spec.label}.log",
        ctx.shared,
    )
    n = len(store.sample_ids)
    rfd, wfd = os.pipe()
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            worker_argv(job_path, wfd),
            pass_fds=(wfd,),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(job_path.parent),
            env=worker_env(python_path),
            start_new_session=True,
        )
    os.close(wfd)
    ctx.watch.watch(spec.label, proc.pid)
    bar = tqdm(total=n, desc=f"{spec.label:>14}", unit="sample", disable=not progress, leave=True, file=sys.stderr)
    try:
        done, prepared, timed_out = _watch(proc, rfd, start, timeout_s, bar, ctx.watch)
    finally:
        ctx.watch.forget(spec.label)
    elapsed = time.monotonic() - start
    st = read_status(status_path) or BackendStatus(name=spec.label, family=job.family)
    over = ctx.watch.killed.get(spec.label)
    stage = "running samples" if prepared else "preparing"
    if over:
        st.status, st.samples = "failed", done
        st.reason = ctx.watch.reason(spec.label, f"{stage} ({done}/{n} samples done)")
    elif timed_out:
        st.status = "timeout"
        st.reason = (
            f"no result within {timeout_s:g} s (killed while {stage}; {done}/{n} samples done); "
            "raise it with --timeout S if the backend needs longer"
        )
        st.samples = done
    elif st.status not in ("ok", "failed", "unsupported"):
        st = lost_status(st, proc.returncode, prepared, done, n, log_path, store.sample_ids)
    if st.status != "ok":  # a shared conversion it left unfinished failed with it, once for its population
        settle(ctx.shared, spec.label, st.reason)
    res_path = status_path.with_name("resources.json")
    resources = json.loads(res_path.read_text()) if res_path.is_file() else {}
    resources["seconds_wall"] = round(elapsed, 3)  # process start to exit, as seen by the driver
    # the worker's process tree as the memory watchdog sampled it (anpred.run.limits)
    resources["peak_rss_watched_bytes"] = ctx.watch.peak.get(spec.label, 0)
    resources["peak_vms_watched_bytes"] = ctx.watch.peak_vms.get(spec.label, 0)
    store.meta.setdefault("resources", {})[spec.label] = resources
    if st.status != "ok" and not prepared:
        st.seconds_prepare = st.seconds_prepare or elapsed
    return st


def _watch(
    proc: subprocess.Popen, rfd: int, start: float, timeout_s: float, bar, memory: MemoryWatch
) -> tuple[int, bool, bool]:
    """Follow the worker's progress lines on ``rfd`` (closed here) on the progress ``bar`` (closed
    here) until it exits, ``timeout_s`` after ``start`` passes, or ``memory`` kills it (its
    :meth:`~anpred.run.limits.MemoryWatch.check` between reads); a worker still running then is
    killed with its process group. Returns ``(samples done, prepared, timed out)``."""
    done, prepared, timed_out, buf = 0, False, False, b""
    bar.set_postfix_str("preparing")
    try:
        while True:
            remaining = start + timeout_s - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd], [], [], min(remaining, memory.interval))
            if memory.check():
                break
            if not ready:
                continue
            chunk = os.read(rfd, 4096)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                if ln == b"prepared":
                    prepared = True
                    bar.set_postfix_str("running")
                elif ln.startswith(b"sample "):
                    k = int(ln.split()[1])
                    bar.update(k - done)
                    done = k
        if not timed_out:
            try:
                proc.wait(timeout=max(start + timeout_s - time.monotonic(), 5.0))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        os.close(rfd)
        if timed_out or proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        bar.close()
    return done, prepared, timed_out
