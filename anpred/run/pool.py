"""Long-lived backend workers for a stream of runs: :class:`WorkerPool`.

A one-shot run (:func:`anpred.run.driver.run_model` without ``pool``) starts one worker process per
backend and waits for it to exit. A pool keeps one ``python -m anpred.run.worker --feed`` process per
backend up across runs (the chunks of a streamed dataset, :mod:`anpred.pipeline.stream`; the models
of :class:`anpred.run.warm.WarmPool`) and hands each run's samples to it on its feed pipe;
:func:`~anpred.run.driver.run_model` with ``pool`` runs through it. The same isolation holds: a
worker that fails, crashes, times out or passes a memory bound becomes that backend's status and the
others go on.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from anpred.backends.base import BackendStatus
from anpred.compat import own_process_group
from anpred.errors import AnpredError
from anpred.run.jobs import make_job, worker_argv, worker_env
from anpred.run.limits import MemoryWatch, RunGuards
from anpred.run.outcome import lost_status
from anpred.run.spec import BackendSpec
from anpred.run.store import RunStore

__all__ = ["WorkerPool"]


class WorkerPool:
    """Long-lived backend workers for a stream of runs (:func:`anpred.run.driver.run_model` with ``pool``; the
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

    def __init__(
        self,
        work: str | Path,
        *,
        timeout_s: float = 600,
        side_by_side: bool = False,
        mode: str = "tensors",
        direct_io: bool = True,
        guards: RunGuards | None = None,
    ):
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
            store, spec, Path(model_path), self.mode, input_shapes, wdir, self.work / f"{spec.label}.log", self.shared
        )
        rfd, wfd = os.pipe()
        feed_r, feed_w = os.pipe()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                worker_argv(job_path, wfd, "--feed", str(feed_r), *self.worker_args),
                pass_fds=(wfd, feed_r),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(wdir),
                env=worker_env(python_path, direct_io=self.direct_io),
                **own_process_group(),
            )  # (not a session of its own: the class docstring)
        os.close(wfd)
        os.close(feed_r)
        self.memory.watch(spec.label, proc.pid)
        return {
            "proc": proc,
            "rfd": rfd,
            "feed": os.fdopen(feed_w, "w"),
            "buf": b"",
            "prepared": False,
            "log": log_path,
            "status": status_path,
            "family": job.family,
            "spec": spec,
        }

    def run(
        self,
        store: RunStore,
        specs: list[BackendSpec],
        model_path: Path,
        input_shapes: dict[str, list[int]] | None = None,
    ) -> dict[str, BackendStatus]:
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
                raise AnpredError(
                    f"WorkerPool: {spec.label} was prepared for {self.workers[spec.label]['model']}, "
                    f"not {model_path} (one pool, one model)"
                )
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
                    req = {
                        "k": k,
                        "store": str(store.root),
                        "samples": store.sample_ids,
                        "status": str(w["chunk_status"]),
                    }
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
            res.update(
                seconds_wall=round(time.monotonic() - w["t0"], 3),
                seconds_prepare=round(st.seconds_prepare, 4),
                worker="long-lived",
            )
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
            st.reason = (
                f"no result within {self.timeout_s:g} s (killed while {stage}; {done}/{n} samples done); "
                "raise it with --timeout S if the backend needs longer"
            )
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
