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
from anpred.compat import own_process_group
from anpred.errors import AnpredError, BackendError, OutputPathError, Terminated
from anpred.folders import commit_partial, partial_dir
from anpred.onnx_io import to_json
from anpred.run.jobs import (WORKER_MALLOC_TUNABLES, make_job, precheck_refusals, read_status, worker_env,
                              worker_malloc_tunables)
from anpred.run.jobs import worker_env as _worker_env  # noqa: F401 - its earlier name (tests, benchmarks)
from anpred.run.limits import MemoryWatch, RunGuards
from anpred.run.model import copy_model, load_anchored
from anpred.run.outcome import format_summary, lost_status, raise_if_inputs_misfit
from anpred.run.spec import MODES, BackendSpec, RunSettings
from anpred.run.store import RunStore

__all__ = ["run_model", "Terminated", "format_summary", "WORKER_MALLOC_TUNABLES", "worker_malloc_tunables",
           "WorkerPool", "sigterm_raises", "RunGuards", "make_job"]


def run_model(model_path: str | Path, backends: Iterable["str | BackendSpec"], inputs: Any, out_dir: str | Path,
              settings: RunSettings | None = None, **fields: Any):
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
    from anpred.onnx_io import sha256_file

    cfg = dataclasses.replace(settings or RunSettings(), **fields)
    mode, timeout_s, overwrite, progress = cfg.mode, cfg.timeout_s, cfg.overwrite, cfg.progress
    precheck, pool, guards = cfg.precheck, cfg.pool, cfg.guards
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
    guards = guards or RunGuards()
    watch = MemoryWatch(guards)  # (raises on a malformed ANPRED_MEMORY_BOUND before anything is written)
    model_path = Path(model_path).resolve()
    model, manifest, man_source = load_anchored(model_path)
    in_spec = inputs if isinstance(inputs, ArraySamples) else InputSpec.parse(inputs, preprocess=cfg.preprocess)
    out = Path(out_dir).absolute()
    _check_out_dir(out, overwrite)
    hint = " ".join([model_path.name, model.producer_name, model.doc_string] +
                    [f"{p.key} {p.value}" for p in model.metadata_props if p.key != "anpred.manifest"] +
                    [str(manifest.model.get("source", ""))])
    try:
        tmp = partial_dir(out)  # stale partial folders of dead drivers are removed too
    except OSError as err:
        raise OutputPathError(f"cannot create run folder {err.filename or out}: {err.strerror or err}") from err
    restore_sigterm = sigterm_raises()
    try:
        store = RunStore.create(tmp, manifest, mode=mode, inputs=in_spec.describe(hint), model={
            "path": str(model_path), "name": model_path.stem,
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "manifest_source": man_source})
        store.meta["model"].update(copy_model(model_path, model, tmp))
        run_model_path = tmp / "model.onnx"
        shape_hint = _store_samples(store, in_spec, model, hint)
        store.meta["backend_specs"] = {s.label: {"name": s.name, "options": json.loads(to_json(s.options))}
                                       for s in specs}
        for s in specs:
            if "model" in s.options:
                store.meta["backend_specs"][s.label]["model_sha256"] = sha256_file(s.options["model"])
        store.meta["memory_bounds"] = watch.record
        store.save_meta()
        shared = Path(guards.shared_dir) if guards.shared_dir else tmp / ".work" / "shared"
        refused = precheck_refusals(store, specs, run_model_path, progress) if precheck else {}
        for spec in specs:
            if spec.label in refused:
                store.set_status(refused[spec.label])
            elif pool is None:
                store.set_status(_run_backend(store, spec, run_model_path, mode, timeout_s, progress,
                                              _RunContext(shape_hint, watch, shared)))
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
                raise OutputPathError(f"{out} already holds a run; choose another -o or pass --overwrite "
                                      "(nothing was written)")
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


def _run_backend(store: RunStore, spec: BackendSpec, model_path: Path, mode: str, timeout_s: float, progress: bool,
                 ctx: _RunContext) -> BackendStatus:
    """Run one backend in its own worker process and return its status (the worker's, completed
    with a crash, timeout or memory bound seen here); its resources go to
    ``store.meta["resources"][label]``."""
    from tqdm import tqdm

    from anpred.backends.shared import settle

    job, job_path, log_path, status_path, python_path = make_job(store, spec, model_path, mode, ctx.input_shapes,
                                                                  store.root / ".work" / spec.label,
                                                                  store.root / "logs" / f"{spec.label}.log", ctx.shared)
    n = len(store.sample_ids)
    rfd, wfd = os.pipe()
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "anpred.run.worker", "--worker", str(job_path), "--fd", str(wfd),
                                 "--parent", str(os.getpid())],
                                pass_fds=(wfd,), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(job_path.parent), env=worker_env(python_path), start_new_session=True)
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
        st.reason = (f"no result within {timeout_s:g} s (killed while {stage}; {done}/{n} samples done); "
                     "raise it with --timeout S if the backend needs longer")
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


def _watch(proc: subprocess.Popen, rfd: int, start: float, timeout_s: float, bar,
           memory: MemoryWatch) -> tuple[int, bool, bool]:
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


class WorkerPool:
    """Long-lived backend workers for a stream of runs (:func:`run_model` with ``pool``; the
    streamed dataset of :mod:`anpred.pipeline.stream`): one ``python -m anpred.run.worker --feed``
    process per backend, started at its first run, prepared once (conversion, compilation, imports),
    then given each run's samples as a chunk on its feed pipe; the backends of a run work one after the
    other or side by side (``side_by_side``, each in its own process). A worker that fails, crashes
    or passes ``timeout_s`` on a chunk (prepare included for the first) gets that status for the
    chunk and every later one (reason: ``in an earlier chunk``); the others go on. Worker output goes
    to ``work/<label>.log``. Use as a context manager or call :meth:`close`.

    ``gather``: label -> a file of :func:`anpred.run.positions.save_gather`; runs started after it is set
    store those anchors of that backend as their sampled positions only (None: every anchor in full).

    ``direct_io``: False for runs whose tensors are read back at once and deleted (a streamed
    dataset's chunks, read by its judge while the next chunk runs): the workers write them through the
    page cache (``ANPRED_DIRECT_IO=0``, :func:`anpred.tensorfile.write_safetensors`), so the judge reads
    them from memory, not from the device, and their thread pools sleep instead of spin-waiting when
    idle (``ANPRED_THREAD_SPINNING=0``: ONNX Runtime's), so the judge gets those cycles (docs/task.md).

    Each worker leads a process group of its own (killed as one) inside the driver's session, not a
    session of its own: Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``)
    shares the CPU between sessions first, so a worker in its own session took half of the cores from a
    streamed run's judge and reader threads whatever their nice value; in one session the lower
    priority of those threads (:data:`anpred.pipeline.stream.JUDGE_NICE`) holds."""

    #: extra arguments of the worker command (``--models``: :class:`anpred.run.warm.WarmPool`)
    worker_args: tuple[str, ...] = ()

    def __init__(self, work: str | Path, *, timeout_s: float = 600, side_by_side: bool = False, mode: str = "tensors",
                 direct_io: bool = True, guards: RunGuards | None = None):
        self.work = Path(work)
        self.memory = MemoryWatch(guards)  # the memory bounds of its workers (anpred.run.limits)
        self.shared = Path(guards.shared_dir) if guards and guards.shared_dir else self.work / "shared"
        self.timeout_s, self.side_by_side, self.mode = timeout_s, side_by_side, mode
        self.direct_io = direct_io
        self.workers: dict[str, dict[str, Any]] = {}
        self.dead: dict[str, BackendStatus] = {}
        self.gather: dict[str, Path | None] = {}
        self.k = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self, store: RunStore, spec: BackendSpec, model_path: Path, input_shapes) -> dict[str, Any]:
        wdir = self.work / spec.label
        job, job_path, log_path, status_path, python_path = make_job(
            store, spec, Path(model_path), self.mode, input_shapes, wdir, self.work / f"{spec.label}.log", self.shared)
        rfd, wfd = os.pipe()
        feed_r, feed_w = os.pipe()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "anpred.run.worker", "--worker", str(job_path), "--fd",
                                     str(wfd), "--parent", str(os.getpid()), "--feed", str(feed_r),
                                     *self.worker_args],
                                    pass_fds=(wfd, feed_r), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(wdir),
                                    env=worker_env(python_path, direct_io=self.direct_io),
                                    **own_process_group())  # (not a session of its own: the class docstring)
        os.close(wfd)
        os.close(feed_r)
        self.memory.watch(spec.label, proc.pid)
        return {"proc": proc, "rfd": rfd, "feed": os.fdopen(feed_w, "w"), "buf": b"", "prepared": False,
                "log": log_path, "status": status_path, "family": job.family, "spec": spec}

    def run(self, store: RunStore, specs: list[BackendSpec], model_path: Path,
            input_shapes: dict[str, list[int]] | None = None) -> dict[str, BackendStatus]:
        """Run ``store``'s samples on ``specs`` (their anchors written into ``store``); returns label
        -> this run's status (samples and times of this run only; ``seconds_prepare`` on the first)."""
        k, self.k = self.k, self.k + 1
        out: dict[str, BackendStatus] = {}
        live = []
        for spec in specs:
            if spec.label in self.dead:  # the status of the chunk where it failed, with its details
                gone = BackendStatus.from_dict(self.dead[spec.label].to_dict())
                gone.samples, gone.seconds_run, gone.seconds_prepare = 0, 0.0, 0.0
                gone.reason = f"in an earlier chunk: {gone.reason}"
                out[spec.label] = gone
                continue
            if spec.label not in self.workers:
                self.workers[spec.label] = self._start(store, spec, model_path, input_shapes)
                self.workers[spec.label]["model"] = str(Path(model_path).resolve())
            elif self.workers[spec.label]["model"] != str(Path(model_path).resolve()):
                raise AnpredError(f"WorkerPool: {spec.label} was prepared for {self.workers[spec.label]['model']}, "
                                  f"not {model_path} (one pool, one model)")
            live.append(spec.label)
        groups = [live] if self.side_by_side else [[b] for b in live]
        for group in groups:
            for b in group:
                w = self.workers[b]
                w["chunk_status"] = self.work / b / f"chunk{k}.json"
                w["t0"] = time.monotonic()
                w["done"] = 0
                w["samples"] = store.sample_ids
                try:
                    req = {"k": k, "store": str(store.root), "samples": store.sample_ids,
                           "status": str(w["chunk_status"])}
                    if self.gather.get(b):  # store these anchors as their sampled positions (anpred.run.positions)
                        req["gather"] = str(self.gather[b])
                    w["feed"].write(json.dumps(req) + "\n")
                    w["feed"].flush()
                except OSError:  # the worker is gone: its status comes from the wait
                    pass
            out.update(self._wait(k, group, store))
        return out

    def _wait(self, k: int, labels: list[str], store: RunStore) -> dict[str, BackendStatus]:
        pending = {self.workers[b]["rfd"]: b for b in labels}
        ended: dict[str, str] = {}
        deadline = {b: self.workers[b]["t0"] + self.timeout_s for b in labels}
        while pending:
            now = time.monotonic()
            for fd, b in list(pending.items()):
                if now > deadline[b]:
                    ended[b] = "timeout"
                    del pending[fd]
            for b in self.memory.check():
                if b in deadline:
                    ended[b] = "memory"
                    pending = {fd: x for fd, x in pending.items() if x != b}
            if not pending:
                break
            ready, _, _ = select.select(list(pending), [], [], self.memory.interval)
            for fd in ready:
                b = pending[fd]
                w = self.workers[b]
                data = os.read(fd, 4096)
                if not data:
                    ended[b] = "eof"
                    del pending[fd]
                    continue
                w["buf"] += data
                *lines, w["buf"] = w["buf"].split(b"\n")
                for ln in lines:
                    if ln == b"prepared":
                        w["prepared"] = True
                    elif ln.startswith(b"sample "):
                        w["done"] = int(ln.split()[1])
                    elif ln.startswith(f"chunk {k} ".encode()):
                        ended[b] = ln.split()[-1].decode()
                        pending.pop(fd, None)
        out = {}
        for b in labels:
            w = self.workers[b]
            how = ended.get(b, "eof")
            st = None
            if how in ("done", "failed") and w["chunk_status"].is_file():
                st = BackendStatus.from_dict(json.loads(w["chunk_status"].read_text()))
            if st is None:
                st = self._lost(b, how, len(store.sample_ids))
            res_path = w["status"].with_name("resources.json")
            try:
                res = json.loads(res_path.read_text()) if res_path.is_file() else {}
            except (OSError, json.JSONDecodeError):
                res = {}
            res.update(seconds_wall=round(time.monotonic() - w["t0"], 3), seconds_prepare=round(st.seconds_prepare, 4),
                       worker="long-lived")
            store.meta.setdefault("resources", {})[b] = res
            if st.status != "ok" and not self._survives(b, how):
                from anpred.backends.shared import settle

                self.dead[b] = st
                self._kill(b)
                settle(self.shared, b, st.reason)  # its unfinished shared conversion failed, for its population
            out[b] = st
        return out

    def _survives(self, b: str, how: str) -> bool:
        """Whether worker ``b``, whose chunk ended ``how`` (``done`` | ``failed`` | ``timeout`` | ``eof``)
        with a status other than ``ok``, serves the next run: never here (one model: a failure is the
        backend's for the stream); :class:`anpred.run.warm.WarmPool` keeps a worker that reported."""
        return False

    def _lost(self, b: str, how: str, n: int) -> BackendStatus:
        """The status of a worker that timed out or ended without a chunk status (killed here): the
        worker's own status (precision, versions, captures as prepared) with the failure."""
        w = self.workers[b]
        self._kill(b)
        st = None
        if w["status"].is_file():  # written once prepared, or with a failure while preparing
            try:
                st = BackendStatus.from_dict(json.loads(w["status"].read_text()))
            except (OSError, json.JSONDecodeError, TypeError):
                st = None
        if st is not None and st.status in ("failed", "unsupported") and not w["prepared"]:
            st.seconds_prepare = st.seconds_prepare or time.monotonic() - w["t0"]
            return st
        st = st or BackendStatus(name=b, family=w["family"])
        stage = "running samples" if w["prepared"] else "preparing"
        done = w.get("done", 0)
        st.samples, st.seconds_run = done, 0.0
        if how == "memory" or b in self.memory.killed:  # (an idle worker of another group is watched too)
            st.status, st.reason = "failed", self.memory.reason(b, f"{stage} ({done}/{n} samples done)")
            return st
        if how == "timeout":
            st.status = "timeout"
            st.reason = (f"no result within {self.timeout_s:g} s (killed while {stage}; {done}/{n} samples done); "
                         "raise it with --timeout S if the backend needs longer")
            return st
        return lost_status(st, w["proc"].returncode, w["prepared"], done, n, w["log"], w.get("samples") or [])

    @staticmethod
    def _sigkill(w: dict[str, Any]) -> None:
        if w["proc"].poll() is None:
            try:
                os.killpg(w["proc"].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _kill(self, b: str) -> None:
        self.memory.forget(b)
        self._sigkill(self.workers[b])
        self.workers[b]["proc"].wait()

    def kill(self) -> None:
        """Kill every worker at once (an interrupted run: nothing more is to be written)."""
        for w in self.workers.values():
            self._sigkill(w)
        for w in self.workers.values():
            w["proc"].wait()

    def close(self) -> None:
        """End every worker: close its feed (it finishes and exits), wait up to 30 s, else kill it."""
        for b, w in self.workers.items():
            try:
                w["feed"].close()
            except OSError:
                pass
        for b, w in self.workers.items():
            try:
                w["proc"].wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill(b)
            try:
                os.close(w["rfd"])
            except OSError:
                pass
        self.workers = {}
