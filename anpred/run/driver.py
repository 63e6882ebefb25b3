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
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from anpred.backends import REGISTRY, backend_class
from anpred.backends.base import BackendStatus
from anpred.compat import own_process_group
from anpred.errors import AnpredError, BackendError, OutputPathError
from anpred.folders import commit_partial, partial_dir
from anpred.onnx_io import to_json
from anpred.run.model import copy_model, load_anchored
from anpred.run.spec import MODES, BackendSpec, WorkerJob
from anpred.run.store import RunStore

__all__ = ["run_model", "Terminated", "format_summary", "WORKER_MALLOC_TUNABLES", "worker_malloc_tunables",
           "WorkerPool", "sigterm_raises"]


def run_model(model_path: str | Path, backends: Iterable["str | BackendSpec"], inputs: Any, out_dir: str | Path,
              *, mode: str = "tensors", timeout_s: float = 600, overwrite: bool = False, progress: bool = True,
              preprocess: str | None = None, precheck: bool = True, pool: "WorkerPool | None" = None):
    """Run the anchored model on every backend and return the :class:`~anpred.run.store.RunStore`.

    Args:
        model_path: an anchored ``.onnx`` (manifest in its metadata, or ``<stem>.anchors.json`` beside
            it; a model without one is run with its graph outputs as the only anchors).
        backends: registry names or :class:`BackendSpec` objects, run in this order.
        inputs: an :class:`anpred.inputs.InputSpec`, or its text form (a folder, a ``.npz``/``.npy``/
            image file, or ``random:uniform|normal|images[:seed=S][:n=N][:shape=...]``), or samples in
            memory (:class:`anpred.inputs.ArraySamples`).
        out_dir: the run folder to create (its parent folders are created).
        mode: ``tensors`` (store every anchor tensor) or ``stats`` (streaming statistics only).
        timeout_s: per backend limit in seconds for preparing and running all samples.
        overwrite: replace ``out_dir`` if it holds a run (only once the new run is complete).
        progress: show a tqdm bar per backend and print the summary table (stderr).
        preprocess: image preprocessing override (``yolo`` | ``imagenet`` | ``unit``).
        precheck: before running, ask every backend's operator table which operators of the model it
            lacks (:mod:`anpred.backends.coverage`, in a child process; ``meta["coverage"]``); a
            backend with a known missing operator is not started and gets status ``unsupported``
            naming the operators. False: run every backend.
        pool: a :class:`WorkerPool` whose long-lived workers run the backends (prepared once for
            a stream of runs) instead of one new process per backend and run; mode ``tensors`` only.
            Its workers run ``model_path`` itself (not the run folder's copy), prepared by the first
            run: every run of one pool must use the same model.

    Raises:
        BackendError: unknown backend or duplicate labels (before anything is written).
        InputError: missing/unreadable inputs, inputs that do not fit the model.
        OutputPathError: ``out_dir`` holds another run (without ``overwrite``) or other files.
        ModelLoadError: the model is not readable ONNX.
    A backend that fails, crashes or times out does not raise: see the statuses in the store.
    """
    from anpred.inputs import ArraySamples, InputSpec, check_shapes_fit, model_inputs
    from anpred.onnx_io import sha256_file

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
    model_path = Path(model_path).resolve()
    model, manifest, man_source = load_anchored(model_path)
    in_spec = inputs if isinstance(inputs, ArraySamples) else InputSpec.parse(inputs, preprocess=preprocess)
    out = Path(out_dir).absolute()
    _check_out_dir(out, overwrite)
    for anc in [out.parent, *out.parent.parents]:
        if anc.exists():
            if not anc.is_dir():
                raise OutputPathError(f"cannot create {out}: {anc} is a file, not a folder (nothing was written)")
            break
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create {out.parent}: {err.strerror or err}") from err
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
        minputs = model_inputs(model)
        checked: set = set()
        first_shapes: dict[str, list[int]] | None = None
        same_shapes = True
        for i, (src, arrays) in enumerate(in_spec.samples(minputs, hint)):
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
        # the shapes actually fed (``size`` in the spec only applies to dynamic dims)
        store.meta["inputs"]["input_shapes"] = first_shapes if same_shapes else "varies by sample"
        store.meta["backend_specs"] = {s.label: {"name": s.name, "options": json.loads(to_json(s.options))} for s in specs}
        for s in specs:
            if "model" in s.options:
                store.meta["backend_specs"][s.label]["model_sha256"] = sha256_file(s.options["model"])
        store.save_meta()
        shape_hint = first_shapes if same_shapes else None
        refused = _precheck(store, specs, run_model_path, progress) if precheck else {}
        for spec in specs:
            if spec.label in refused:
                store.set_status(refused[spec.label])
            elif pool is None:
                store.set_status(_run_backend(store, spec, run_model_path, mode, timeout_s, progress, shape_hint))
        if pool is not None:
            for st in pool.run(store, [s for s in specs if s.label not in refused], model_path, shape_hint).values():
                store.set_status(st)
        _raise_if_all_failed_on_shapes(store)
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


class Terminated(KeyboardInterrupt):
    """SIGTERM received by the driver during :func:`run_model` (raised by its handler so that the
    worker process groups are killed and the partial run folder removed, as for Ctrl-C)."""


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


_SHAPE_FAIL_RE = re.compile(r"shape|dimension|Incompatible|broadcast|size mismatch|Sizes of tensors|"
                            r"must match|invalid size|cannot reshape", re.I)


def _raise_if_all_failed_on_shapes(store) -> None:
    """Bad input detected by the backends themselves: when *every* backend failed (not crashed) while
    running the same sample and every reason is a shape error, the sample does not fit the model.
    Raises InputError (one line) instead of storing a run in which nothing ran."""
    from anpred.errors import InputError

    sts = list(store.statuses().values())
    if not sts or any(s.status not in ("failed", "unsupported") for s in sts):
        return
    where = {s.reason.split(":", 1)[0] for s in sts}
    if len(where) != 1 or not next(iter(where)).startswith("sample ") or \
            not all(_SHAPE_FAIL_RE.search(s.reason) for s in sts):
        return
    sid = next(iter(where)).split()[1]
    src = next((x.get("source", "") for x in store.meta["samples"] if x["id"] == sid), "")
    first = sts[0].reason.split(":", 1)[1].strip().splitlines()[0][:240]
    raise InputError(f"the inputs do not fit the model: every backend ({', '.join(s.name for s in sts)}) failed on "
                     f"sample {sid} ({src}) with a shape error, e.g. {sts[0].name}: {first}")


def format_summary(store) -> str:
    """The end-of-run table: backend, family, status, precision, samples, seconds (prepare / run),
    anchors captured of the manifest's, and the reason when not ok."""
    total = len(store.manifest.anchors)
    rows = [("backend", "family", "status", "precision", "samples", "prepare s", "run s", "anchors", "reason")]
    for label, st in store.statuses().items():
        prec = f"{st.precision} ({st.precision_requested} asked)" if st.precision_differs else st.precision
        rows.append((label, st.family, st.status, prec, str(st.samples), f"{st.seconds_prepare:.2f}",
                     f"{st.seconds_run:.2f}", f"{st.anchors_captured}/{total}", st.reason.splitlines()[0][:80] if st.reason else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


#: glibc malloc settings of every backend worker (see :func:`worker_malloc_tunables`)
WORKER_MALLOC_TUNABLES = {"glibc.malloc.mmap_threshold": str(256 << 20), "glibc.malloc.trim_threshold": str(1 << 30)}


def worker_malloc_tunables(existing: str = "") -> str:
    """``GLIBC_TUNABLES`` for a backend worker: ``existing`` plus :data:`WORKER_MALLOC_TUNABLES` for
    the malloc settings it does not set itself (a user's own settings win).

    Why: every sample allocates the same large arrays again (inputs, the backend's outputs: 19 MB per
    sample for YOLOv8n at 640x640). With glibc's defaults, blocks above the dynamic mmap threshold
    (at most 32 MiB) are ``mmap``-ed and freed blocks at the top of the heap are trimmed, so each
    sample faults in fresh pages again: measured 5 ms per 19 MB sample on the 2-core VM of
    docs/run.md, where a fresh page costs ~2-4 us. A fixed 256 MiB mmap threshold and a 1 GiB trim
    threshold keep those blocks in the heap for reuse; memory stays bounded by one sample's working
    set (peak RSS in docs/run.md). Other C libraries ignore the variable."""
    have = {kv.split("=", 1)[0] for kv in existing.split(":") if "=" in kv}
    add = [f"{k}={v}" for k, v in WORKER_MALLOC_TUNABLES.items() if k not in have]
    return ":".join([x for x in [existing] if x] + add)


def _tail(path: Path, n: int = 6) -> str:
    """The last ``n`` non-empty lines of a worker log, led by Python's fatal-error line if any."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    return " | ".join(fatal[-1:] + lines[-n:])[-800:]


def _precheck(store: RunStore, specs: list[BackendSpec], model_path: Path, progress: bool) -> dict[str, BackendStatus]:
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
        print("pre-run coverage: " + ("; ".join(lines) if lines else
                                      "no backend's operator table lacks an operator of the model"), file=sys.stderr)
    refused = {}
    for s in specs:
        row = coverage[s.label]
        if row.get("ops"):
            try:
                nominal = backend_class(s.name).precision
            except BackendError:
                nominal = "fp32"
            refused[s.label] = BackendStatus(name=s.label, family=s.family(), status="unsupported", reason=refusal(row),
                                             precision=nominal, precision_requested=nominal)
    return refused


def _make_job(store: RunStore, spec: BackendSpec, model_path: Path, mode: str,
              input_shapes: dict[str, list[int]] | None, work: Path, log_path: Path):
    """The worker job of ``spec`` on ``store`` in folder ``work`` (its options without the runner's
    own keys; int8 calibration on the run's samples; the run's input shapes where the backend needs
    them). Returns ``(job, job path, log path, status path, python_path folders)``."""
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
    job = WorkerJob(store=str(store.root), name=spec.name, label=spec.label, family=family, options=options,
                    model=str(model), mode=mode, samples=store.sample_ids, status_path=str(status_path))
    job_path = work / "job.json"
    job.save(job_path)
    return job, job_path, log_path, status_path, python_path


def _run_backend(store: RunStore, spec: BackendSpec, model_path: Path, mode: str, timeout_s: float, progress: bool,
                 input_shapes: dict[str, list[int]] | None = None) -> BackendStatus:
    """Run one backend in its own worker process and return its status (the worker's, completed
    with a crash or timeout seen here); its resources go to ``store.meta["resources"][label]``."""
    from tqdm import tqdm

    job, job_path, log_path, status_path, python_path = _make_job(store, spec, model_path, mode, input_shapes,
                                                                  store.root / ".work" / spec.label,
                                                                  store.root / "logs" / f"{spec.label}.log")
    family = job.family
    n = len(store.sample_ids)
    rfd, wfd = os.pipe()
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "anpred.run.worker", "--worker", str(job_path), "--fd", str(wfd),
                                 "--parent", str(os.getpid())],
                                pass_fds=(wfd,), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(job_path.parent), env=_worker_env(python_path), start_new_session=True)
    os.close(wfd)
    bar = tqdm(total=n, desc=f"{spec.label:>14}", unit="sample", disable=not progress, leave=True, file=sys.stderr)
    done, prepared, timed_out = _watch(proc, rfd, start, timeout_s, bar)
    elapsed = time.monotonic() - start
    st = None
    if status_path.is_file():
        try:
            st = BackendStatus.from_dict(json.loads(status_path.read_text()))
        except (OSError, json.JSONDecodeError, TypeError):
            st = None
    if st is None:
        st = BackendStatus(name=spec.label, family=family)
    final = st.status in ("ok", "failed", "unsupported")
    if timed_out:
        stage = "running samples" if prepared else "preparing"
        st.status = "timeout"
        st.reason = f"no result within {timeout_s:g} s (killed while {stage}; {done}/{n} samples done)"
        st.samples = done
    elif not final:
        rc = proc.returncode
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            st.status, what = "crashed", f"process killed by {sig}"
        else:
            st.status, what = "failed", f"process exited with status {rc} without a result"
        stage = "running samples" if prepared else "preparing"
        st.reason = f"{what} while {stage} ({done}/{n} samples done); log: {_tail(log_path, 4)}"
        st.samples = done
    res_path = status_path.with_name("resources.json")
    resources = json.loads(res_path.read_text()) if res_path.is_file() else {}
    resources["seconds_wall"] = round(elapsed, 3)  # process start to exit, as seen by the driver
    store.meta.setdefault("resources", {})[spec.label] = resources
    if st.status != "ok" and not prepared:
        st.seconds_prepare = st.seconds_prepare or elapsed
    return st


def _worker_env(python_path: list[str] | None = None, direct_io: bool = True) -> dict[str, str]:
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


def _watch(proc: subprocess.Popen, rfd: int, start: float, timeout_s: float, bar) -> tuple[int, bool, bool]:
    """Follow the worker's progress lines on ``rfd`` (closed here) on the progress ``bar`` (closed
    here) until it exits or ``timeout_s`` after ``start`` passes; a worker still running then is
    killed with its process group. Returns ``(samples done, prepared, timed out)``."""
    done, prepared, timed_out, buf = 0, False, False, b""
    bar.set_postfix_str("preparing")
    try:
        while True:
            remaining = start + timeout_s - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd], [], [], min(remaining, 1.0))
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

    def __init__(self, work: str | Path, *, timeout_s: float = 600, side_by_side: bool = False, mode: str = "tensors",
                 direct_io: bool = True):
        self.work = Path(work)
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
        job, job_path, log_path, status_path, python_path = _make_job(store, spec, Path(model_path), self.mode,
                                                                      input_shapes, wdir, self.work / f"{spec.label}.log")
        rfd, wfd = os.pipe()
        feed_r, feed_w = os.pipe()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "anpred.run.worker", "--worker", str(job_path), "--fd",
                                     str(wfd), "--parent", str(os.getpid()), "--feed", str(feed_r)],
                                    pass_fds=(wfd, feed_r), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(wdir),
                                    env=_worker_env(python_path, direct_io=self.direct_io),
                                    **own_process_group())  # (not a session of its own: the class docstring)
        os.close(wfd)
        os.close(feed_r)
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
            if not pending:
                break
            ready, _, _ = select.select(list(pending), [], [], 1.0)
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
            if st.status != "ok":
                self.dead[b] = st
                self._kill(b)
            out[b] = st
        return out

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
        if how == "timeout":
            st.status = "timeout"
            st.reason = f"no result within {self.timeout_s:g} s (killed while {stage}; {done}/{n} samples done)"
            return st
        rc = w["proc"].returncode
        what = (f"process killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 and -rc in
                signal.valid_signals() else f"process exited with status {rc} without a result")
        st.status = "crashed" if rc is not None and rc < 0 else "failed"
        st.reason = f"{what} while {stage} ({done}/{n} samples done); log: {_tail(w['log'], 4)}"
        return st

    @staticmethod
    def _sigkill(w: dict[str, Any]) -> None:
        if w["proc"].poll() is None:
            try:
                os.killpg(w["proc"].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _kill(self, b: str) -> None:
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
