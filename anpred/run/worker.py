"""The backend worker: one backend run on every sample of a run, in its own process.

Started by the driver (:mod:`anpred.run.driver`) as::

    python -m anpred.run.worker --worker JOB --fd FD --parent PID

``JOB``: the job file (:class:`anpred.run.spec.WorkerJob`); ``FD``: the write end of a pipe on which
the worker reports progress lines (``prepared``, then ``sample <k>`` after each sample); ``PID``: the
driver, with which the worker dies (Linux ``PR_SET_PDEATHSIG``). The worker prepares the backend,
runs every sample, stores each sample's anchors (mode ``tensors``, :meth:`RunStore.write_anchors
<anpred.run.store.RunStore.write_anchors>`) or folds them into :class:`~anpred.run.streaming.StreamingStats`
(mode ``stats``) in a writer thread that overlaps the next sample, and always ends by writing its
:class:`~anpred.backends.base.BackendStatus` to the job's ``status_path`` (``ok``, or ``failed`` /
``unsupported`` with a reason) and ``resources.json`` beside it, then leaves with ``os._exit(0)``.
Crashes and timeouts are recorded by the driver, which reads the status file.

Testing hook: ``options["_fault"]`` (:data:`anpred.run.spec.FAULTS`) makes the worker crash, exit,
hang or raise for real at ``options["_fault_at"]`` (``prepare`` or ``run``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends import backend_class
from anpred.backends.base import AnchorCapture, BackendStatus
from anpred.backends.shared import set_scope
from anpred.manifest import AnchorManifest
from anpred.onnx_io import atomic_write_text, to_json
from anpred.run.positions import gather, load_gather
from anpred.run.spec import WorkerJob
from anpred.run.store import RunStore
from anpred.run.streaming import STATS_SCHEMA, StreamingStats, sample_summary

__all__ = ["short_reason", "run_job", "prepare_backend", "Served", "main"]

_UNSUPPORTED_RE = re.compile(
    r"not implemented|unsupported|not supported|NOT_IMPLEMENTED|No Op registered|"
    r"could not find an implementation|no converter|is not available",
    re.I,
)
_ARRAY_DUMP = re.compile(r"array\((?:[^()]|\([^()]*\))*\)", re.S)


def short_reason(err: BaseException, limit: int = 600) -> str:
    """``Type: message`` of an exception for a status reason: numpy array dumps inside the message
    (TensorFlow prints the arguments it received) become ``array(...)``, whitespace runs collapse,
    and the text is cut at ``limit`` characters (the full traceback is in the backend's log)."""
    text = _ARRAY_DUMP.sub("array(...)", str(err).strip())
    text = re.sub(r"<tf\.Tensor: shape=(\([^)]*\)), dtype=(\w+), numpy=\s*array\(\.\.\.\)>", r"<tf.Tensor \1 \2>", text)
    text = re.sub(r"\s+", " ", text)
    if len(text) > limit:
        text = text[: limit - 4].rstrip() + " ..."
    return f"{type(err).__name__}: {text}"


def _classify(err: BaseException) -> str:
    """``unsupported`` for a missing operator/feature (NotImplementedError or such a message) or a
    backend that does not apply to the model (an exception whose class sets ``skipped = True``), else
    ``failed``."""
    if isinstance(err, NotImplementedError) or getattr(err, "skipped", False) or _UNSUPPORTED_RE.search(str(err)):
        return "unsupported"
    return "failed"


def _missing_note(captures: dict[str, dict], manifest) -> str:
    """A short status reason for an ``ok`` backend that did not capture every anchor:
    ``"k of n anchors missing: <anchor>: <its reason>"`` (empty when all were captured)."""
    missing = [a.name for a in manifest.anchors if (captures.get(a.name) or {}).get("status") == "missing"]
    if not missing:
        return ""
    why = ((captures.get(missing[0]) or {}).get("reason") or "no reason given").strip().splitlines()[0]
    return f"{len(missing)} of {len(manifest.anchors)} anchors missing: {missing[0]}: {why[:160]}"


def _status_after_run(captures: dict[str, dict], manifest, log: Path | None) -> tuple[str, str]:
    """``(status, reason)`` of a backend whose samples all ran: ``ok`` with :func:`_missing_note`. When
    it returned no anchor at all (a library that reports its error only on its own output and returns
    nothing, e.g. MNN's ``Reshape error: 40960 -> 768``) the status stays ``ok`` (the oracle flags each
    anchor as a missing output, a deviation it counts) and the reason names the decisive line of its
    log (``log``: the worker's own output, logs/<label>.log), which was only in that log before."""
    note = _missing_note(captures, manifest)
    if not manifest.anchors or not note.startswith(f"{len(manifest.anchors)} of {len(manifest.anchors)} "):
        return "ok", note
    said = ""
    if log is not None and log.is_file():
        from anpred.backends.native_io import decisive_line

        _flush_native_output()
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()[-400:] if ln.strip()]
        said = decisive_line([ln for ln in lines if not ln.startswith(("prepared", "chunk "))])
    return "ok", f"returned no value for any anchor ({note})" + (f"; its log says: {said}" if said else "")


def _flush_native_output() -> None:
    """Flush Python's and the C library's buffered output, so what a native library printed is in the log."""
    import ctypes

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _fault(options: dict, where: str) -> None:
    kind = options.get("_fault")
    if not kind or options.get("_fault_at", "run") != where:
        return
    if where == "run" and options.get("_fault_after"):  # testing hook: the fault at sample N + 1 of the process
        options["_runs"] = options.get("_runs", 0) + 1
        if options["_runs"] <= int(options["_fault_after"]):
            return
    if kind == "segfault":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        sys.exit(3)
    elif kind == "hang":
        time.sleep(10**6)
    elif kind == "raise":
        raise RuntimeError("fault injected by the _fault option")


def _die_with_parent(ppid: int) -> None:
    """Linux: have the kernel SIGKILL this worker when the driver process ``ppid`` dies
    (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, prctl(2)), so a driver killed even by SIGKILL leaves no
    orphan writing into a removed folder; no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != ppid:  # the driver died before the request took effect
        os._exit(1)


def _write_summaries(stats: dict[str, StreamingStats], jsonl, sid: str, res: dict[str, np.ndarray]) -> None:
    """Mode ``stats``: fold one sample into the per-anchor :class:`StreamingStats` and append its line
    to ``stats/<label>.samples.jsonl`` (runs in the worker's writer thread)."""
    line = {k: sample_summary(stats[k].update(v)) for k, v in res.items() if k in stats}
    jsonl.write(json.dumps({"sample": sid, "anchors": line}) + "\n")
    jsonl.flush()


@dataclass
class SampleSink:
    """Where :func:`_sample_loop` puts each sample's anchors, on the ``writer`` thread
    (``concurrent.futures.ThreadPoolExecutor``, one worker) while the next sample runs: the run
    ``store`` under the backend's ``label`` (with ``gather_spec``, :func:`anpred.run.positions.load_gather`,
    only their sampled positions), or, with ``stats`` (anchor -> ``StreamingStats``), their summaries
    with one line per sample in ``jsonl`` (an open text file)."""

    store: RunStore
    label: str
    writer: Any
    stats: dict[str, StreamingStats] | None = None
    jsonl: Any = None
    gather_spec: Any = None


def _sample_loop(backend, samples, sink: SampleSink, st, emit, fault_opts, cursor: list | None = None):
    """Run ``samples`` (sample ids of ``sink.store``) through the prepared ``backend``, handing each
    sample's anchors to ``sink``; ``st.samples`` and the progress lines follow; ``cursor[0]`` is the
    sample in progress (for the caller's error message). Returns ``(anchors returned by every sample,
    seconds in Backend.run, seconds of the loop)``."""
    cursor = cursor if cursor is not None else [None]
    returned: set[str] | None = None
    run_s = 0.0
    loop_t0 = time.perf_counter()
    pending = None
    st.samples = 0
    for i, sid in enumerate(samples):
        cursor[0] = sid
        inputs = sink.store.read_inputs(sid)
        t = time.perf_counter()
        res = backend.run(inputs)
        run_s += time.perf_counter() - t
        _fault(fault_opts, "run")
        returned = set(res) if returned is None else returned & set(res)
        if i == 0 and not st.dtypes:
            st.dtypes = {k: str(np.asarray(v).dtype) for k, v in res.items()}
        if pending is not None:
            pending.result()
        if sink.stats is None:
            pending = sink.writer.submit(sink.store.write_anchors, sink.label, sid, gather(res, sink.gather_spec))
        else:
            pending = sink.writer.submit(_write_summaries, sink.stats, sink.jsonl, sid, res)
        st.samples = i + 1
        emit(f"sample {i + 1}")
    if pending is not None:
        pending.result()
    return returned or set(), run_s, time.perf_counter() - loop_t0


def _captured(st, manifest, returned: set[str]) -> None:
    """Mark the anchors the backend announced but never returned as missing; count the captured."""
    for a in manifest.anchors:
        cap = st.captures.setdefault(a.name, asdict(AnchorCapture(layout=a.layout)))
        if a.name not in returned and cap.get("status") != "missing":
            cap["status"] = "missing"
            cap["reason"] = cap.get("reason") or "announced by the backend but not returned by run()"
    st.anchors_captured = sum(1 for a in manifest.anchors if a.name in returned)


def _initial_status(job: WorkerJob) -> BackendStatus:
    """The status before ``prepare`` has read the precision back: the backend's nominal precision, so a
    member that fails while preparing is listed as what it was asked to be (``int8``, not ``fp32``)."""
    try:
        nominal = backend_class(job.name).precision
    except Exception:  # noqa: BLE001 - an unknown backend fails in prepare, with its own reason
        nominal = "fp32"
    return BackendStatus(name=job.label, family=job.family, precision=nominal, precision_requested=nominal)


def prepare_backend(job: WorkerJob, options: dict, st: BackendStatus, scratch: Path):
    """Build ``job``'s backend with ``options`` and prepare it on ``job.model`` (the manifest of
    ``job.store``), filling ``st`` (versions, ``seconds_prepare``, precision, quantization steps,
    captures). Returns ``(backend, manifest)``. Raises whatever the backend raises."""
    manifest = AnchorManifest.load(Path(job.store) / "manifest.json")
    backend = backend_class(job.name)(options)
    st.versions = backend.versions()
    t0 = time.perf_counter()
    backend.prepare(job.model, manifest, scratch)
    st.seconds_prepare = time.perf_counter() - t0
    st.precision, st.precision_requested = backend.effective_precision(), backend.precision
    st.quant_steps = {k: float(v) for k, v in backend.quantization_steps().items()}
    st.versions = backend.versions()
    st.captures = {k: asdict(v) for k, v in backend.anchor_info().items()}
    return backend, manifest


@dataclass
class Served:
    """What a long-lived worker holds between chunks (:func:`_serve`): the prepared ``backend`` and its
    ``manifest``, the worker's status ``st`` (as prepared), whether a failing chunk leaves the process
    alive for the next model (``survive``: a worker serving many models, :class:`anpred.run.warm.WarmPool`)."""

    backend: Any
    manifest: Any
    st: BackendStatus
    label: str
    survive: bool = False


def _switch_model(srv: Served, job_path: str, emit) -> None:
    """A worker serving many models (:class:`anpred.run.warm.WarmPool`): close the backend, build and
    prepare one on the job in ``job_path`` (another model; the libraries stay imported, converters
    warm). A failure leaves ``srv.backend`` None and ``srv.st`` with its status and reason."""
    job = WorkerJob.load(job_path)
    options = {k: v for k, v in job.options.items() if not k.startswith("_")}
    if srv.backend is not None:
        try:
            srv.backend.close()
        except Exception:  # noqa: BLE001 - the previous model's resources; the new one is unaffected
            pass
    srv.backend, srv.survive = None, True
    srv.st = _initial_status(job)
    t0 = time.perf_counter()
    try:
        srv.backend, srv.manifest = prepare_backend(job, options, srv.st, Path(job_path).parent / "scratch")
        srv.st.status = "running"
        atomic_write_text(Path(job.status_path), to_json(srv.st.to_dict()))
        emit("prepared")
    except Exception as err:  # noqa: BLE001 - this model's status; the worker serves the next one
        srv.st.status = _classify(err)
        srv.st.reason = f"prepare: {short_reason(err)}"
        srv.st.seconds_prepare = time.perf_counter() - t0
        import traceback

        traceback.print_exc()


def _serve(srv: Served, feed_fd: int, emit, writer, fault_opts, resources_path: Path) -> None:
    """The long-lived worker's loop (:class:`anpred.run.driver.WorkerPool`): each line read from
    ``feed_fd`` is a chunk ``{"k", "store", "samples", "status"[, "gather"][, "job"]}`` (``gather``: a file of
    :func:`anpred.run.positions.save_gather`; ``job``: a :class:`~anpred.run.spec.WorkerJob` file of
    another model, prepared before the chunk runs, :func:`_switch_model`); its samples run into that run
    store, its status (this chunk's samples and times) is written to ``status``, then ``chunk K
    done`` is emitted. A failing sample ends the process with that chunk's status written, unless
    the worker serves many models (``srv.survive``, set by the first ``job``): then a Python exception
    is that chunk's status (``chunk K done``) and the next chunk runs. Returns when the driver closes
    the feed."""
    feed = os.fdopen(feed_fd, "r")
    spec_of: dict[str, Any] = {}
    for line in feed:
        req = json.loads(line)
        if req.get("job"):
            _switch_model(srv, req["job"], emit)
        g = req.get("gather")  # the anchors to store as their sampled positions (anpred.run.positions)
        if g and g not in spec_of:
            spec_of[g] = load_gather(g)
        cst = BackendStatus.from_dict(srv.st.to_dict())
        if srv.backend is None:  # its model failed to prepare (a worker serving many models)
            atomic_write_text(Path(req["status"]), to_json(cst.to_dict()))
            emit(f"chunk {req['k']} done")
            continue
        cst.status = "running"
        cursor: list = [None]
        try:
            cstore = RunStore(Path(req["store"]), {}, srv.manifest)
            sink = SampleSink(cstore, srv.label, writer, gather_spec=spec_of.get(g) if g else None)
            returned, run_s, loop_s = _sample_loop(srv.backend, req["samples"], sink, cst, emit, fault_opts, cursor)
            cst.seconds_run = run_s
            _captured(cst, srv.manifest, returned)
            cst.status, cst.reason = _status_after_run(cst.captures, srv.manifest, None)
        except BaseException as err:  # noqa: BLE001 - the chunk's status, then the process ends
            cst.status = _classify(err)
            cst.reason = f"sample {cursor[0]}: {short_reason(err)}"
            atomic_write_text(Path(req["status"]), to_json(cst.to_dict()))
            if srv.survive and isinstance(err, Exception):
                emit(f"chunk {req['k']} done")
                continue
            emit(f"chunk {req['k']} failed")
            srv.st.status, srv.st.reason = cst.status, cst.reason
            return
        atomic_write_text(Path(req["status"]), to_json(cst.to_dict()))
        import resource

        atomic_write_text(
            resources_path,
            json.dumps(  # the process so far (Linux: KiB -> bytes)
                {
                    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                    "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
                }
            ),
        )
        emit(f"chunk {req['k']} done")
        srv.st.seconds_prepare = 0.0  # counted with the first chunk only
    srv.st.status = "ok"


def run_job(job_path: str, fd: int, feed_fd: int | None = None, models: bool = False) -> None:
    """Run the job in ``job_path`` (:class:`~anpred.run.spec.WorkerJob`), reporting progress lines on
    the pipe ``fd``; never returns (ends the process with ``os._exit(0)`` once the status is written).
    With ``feed_fd``: prepare once, then run the chunks the driver sends on that pipe (:func:`_serve`).
    With ``models`` too: nothing is prepared at start; every chunk names its model's job (a worker
    serving many models, :class:`anpred.run.warm.WarmPool`)."""
    from concurrent.futures import ThreadPoolExecutor

    job = WorkerJob.load(job_path)
    pipe = os.fdopen(fd, "wb", buffering=0)
    label, options = job.label, dict(job.options)
    fault_opts = {k: options.pop(k) for k in list(options) if k.startswith("_")}
    root = Path(job.store)
    manifest = AnchorManifest.load(root / "manifest.json")
    store = RunStore(root, {}, manifest)
    st = _initial_status(job)
    status_path = Path(job.status_path)
    set_scope(job.shared_dir or None, label)  # a population's shared conversion: once per run

    def save():
        atomic_write_text(status_path, to_json(st.to_dict()))

    def emit(line: str):
        try:
            pipe.write(line.encode() + b"\n")
        except OSError:
            pass

    stage = "preparing"
    cursor: list = [None]
    # one writer thread: storing sample i (tensors, or summaries in stats mode) overlaps running i+1
    writer = ThreadPoolExecutor(max_workers=1)
    try:
        if models and feed_fd is not None:
            srv = Served(None, manifest, st, label, survive=True)
            _serve(srv, feed_fd, emit, writer, fault_opts, status_path.with_name("resources.json"))
            st = srv.st
            return
        _fault(fault_opts, "prepare")
        backend, manifest = prepare_backend(job, options, st, Path(job_path).parent / "scratch")
        st.status = "running"
        save()
        emit("prepared")
        stage = "running"
        stats = {a.name: StreamingStats() for a in manifest.anchors} if job.mode == "stats" else None
        jsonl = None
        if stats is not None:
            (root / "stats").mkdir(exist_ok=True)
            jsonl = open(root / "stats" / f"{label}.samples.jsonl", "w")
        if feed_fd is not None:  # a long-lived worker: chunks of samples from the driver until it closes the feed
            srv = Served(backend, manifest, st, label)
            _serve(srv, feed_fd, emit, writer, fault_opts, status_path.with_name("resources.json"))
            st = srv.st  # (the last model's status, written by save())
            return
        sink = SampleSink(store, label, writer, stats, jsonl)
        returned, run_s, loop_s = _sample_loop(backend, job.samples, sink, st, emit, fault_opts, cursor)
        st.seconds_run = run_s
        _captured(st, manifest, returned)
        if stats is not None:
            jsonl.close()
            _write_stats(root / "stats" / f"{label}.json", label, st.samples, stats)
        st.status, st.reason = _status_after_run(st.captures, manifest, root / "logs" / f"{label}.log")
        _write_resources(status_path.with_name("resources.json"), loop_s, st.seconds_prepare)
    except SystemExit as err:
        st.status = "failed"
        st.reason = (
            f"sys.exit({err.code}) called while {stage}"
            + (f" sample {cursor[0]}" if stage == "running" else "")
            + " (a converter exiting the process; see logs/"
            + label
            + ".log)"
        )
    except BaseException as err:  # noqa: BLE001 - every failure becomes this backend's status
        st.status = _classify(err)
        where = f"sample {cursor[0]}" if stage == "running" else "prepare"
        # a backend that does not apply to the model says so first ("skipped: ..."), not as an error
        st.reason = str(err) if getattr(err, "skipped", False) else f"{where}: {short_reason(err)}"
        import traceback

        traceback.print_exc()
    finally:
        try:
            save()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            pipe.close()
            os._exit(0)  # skip interpreter teardown (some runtimes crash there)


def _write_stats(path: Path, label: str, samples: int, stats: dict[str, StreamingStats]) -> None:
    """Write the stats-mode summary of backend ``label`` over ``samples`` samples: each anchor's
    streaming statistics (anchors without a sample left out)."""
    atomic_write_text(
        path,
        json.dumps(
            {
                "schema": STATS_SCHEMA,
                "backend": label,
                "samples": samples,
                "anchors": {k: s.to_dict() for k, s in stats.items() if s.samples},
            },
            indent=1,
        ),
    )


def _write_resources(path: Path, loop_s: float, prepare_s: float) -> None:
    """Write the worker's resources: its peak RSS (bytes), the sample loop's and the prepare's seconds,
    and ``GLIBC_TUNABLES``."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    # seconds_loop: the sample loop as the worker saw it (reading inputs, Backend.run, storing
    # anchors or statistics, waiting for the last write), one-time start/prepare excluded
    atomic_write_text(
        path,
        json.dumps(
            {
                "peak_rss_bytes": peak,
                "seconds_loop": round(loop_s, 4),
                "seconds_prepare": round(prepare_s, 4),
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
            }
        ),
    )


def main(argv=None) -> None:
    """The worker's command line (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m anpred.run.worker", description="ANPRED backend worker (internal)")
    p.add_argument("--worker", required=True, help="job JSON written by run_model")
    p.add_argument("--fd", type=int, required=True, help="pipe for progress lines")
    p.add_argument("--parent", type=int, default=0, help="the driver's pid (the worker dies with it)")
    p.add_argument("--feed", type=int, default=None, help="pipe of chunks to run (a long-lived worker)")
    p.add_argument("--models", action="store_true", help="with --feed: each chunk names its model's job")
    a = p.parse_args(argv)
    if a.parent:
        _die_with_parent(a.parent)
    run_job(a.worker, a.fd, a.feed, a.models)


if __name__ == "__main__":
    main()
