"""Warm workers across models: one long-lived process per backend that runs model after model.

:class:`WarmPool` is a :class:`anpred.run.driver.WorkerPool` whose workers are not tied to one model:
each :meth:`WarmPool.run` (one run folder, one model: :func:`anpred.run.run_model` with ``pool``)
sends every backend's worker the job of that model (:func:`anpred.run.driver.make_job`) with the
samples; the worker (``python -m anpred.run.worker --feed FD --models``,
:func:`anpred.run.worker.run_job`) closes the previous backend object, builds and prepares a new one
on the new model and runs the samples. The process, its imports (torch, TensorFlow, OpenVINO, TVM
...) and whatever its converter keeps warm (:mod:`anpred.backends.onnxsim_warm`: onnx2tf's onnx-simplifier
runs) stay up, so a single-node model costs its conversion and run only.

Isolation is kept per backend and per model:

- a Python exception while preparing or running a model (an unsupported operator, a converter
  error) is that model's status (``failed`` / ``unsupported`` with the reason) and the worker serves
  the next model;
- a crash (signal), an exit, or a model passing ``timeout_s`` (prepare and run of that model) is that
  model's status (``crashed`` / ``failed`` / ``timeout``), the process group is killed, and the next
  model gets a fresh worker (its status never says "in an earlier chunk": each model is a run of its own).

Memory: with ``max_rss_bytes`` a watchdog thread reads each worker's resident set (``/proc/<pid>/statm``,
every 0.5 s) and kills a worker above it (its process group); that model's status is ``crashed`` with
the figure, and the next model gets a fresh worker. (Why: one library can take the machine down on
one node case; the case and its figure: docs/conformance.md, 'Measured'.)

The backends of a run work one after the other or side by side (``side_by_side``), as in the base
class. Each model's job and scratch folder is ``work/<label>/m<k>/``; a model's folder is removed when
the model after the next starts (the backend may read its scratch files until it is closed).
Used by :mod:`anpred.conformance` (one run per ONNX node case) and by campaigns
(:mod:`anpred.campaign.warm`: one run per configuration); the one-shot path can use it the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from anpred.backends.base import BackendStatus
from anpred.run.jobs import make_job
from anpred.run.limits import RunGuards
from anpred.run.pool import WorkerPool
from anpred.run.spec import BackendSpec
from anpred.run.store import RunStore

__all__ = ["WarmPool"]


class WarmPool(WorkerPool):
    """Long-lived backend workers that run one model after another (module docstring).

    Args (keywords as :class:`~anpred.run.driver.WorkerPool`): ``work`` (job folders and the workers'
    logs ``work/<label>.log``), ``timeout_s`` (per model: prepare and run), ``side_by_side``,
    ``direct_io``, ``guards`` (the memory bounds of :class:`anpred.run.limits.RunGuards`, watched as
    in a one-shot run: a worker over its bound is that model's ``failed`` status; None: the
    defaults); ``max_rss_bytes`` (a worker's resident memory above which it is killed, a
    ``crashed`` status; None: no such limit). Mode ``tensors`` only. Attributes: ``started`` (label
    -> worker processes started, a fresh one after each crash or timeout), ``models`` (runs served),
    ``shared`` (the folder of the shared-conversion records the next model's jobs name,
    :mod:`anpred.backends.shared`: a campaign points it at each configuration's own folder).
    """

    worker_args = ("--models",)

    def __init__(
        self,
        work: str | Path,
        *,
        timeout_s: float = 600,
        side_by_side: bool = False,
        direct_io: bool = True,
        max_rss_bytes: int | None = None,
        guards: RunGuards | None = None,
    ):
        super().__init__(
            work, timeout_s=timeout_s, side_by_side=side_by_side, mode="tensors", direct_io=direct_io, guards=guards
        )
        self.started: dict[str, int] = {}
        self.models = 0
        self._folders: dict[str, list[Path]] = {}
        self.max_rss_bytes = max_rss_bytes
        self.over_memory: dict[int, int] = {}  # pid -> resident bytes when it was killed
        self._stop = threading.Event()
        if max_rss_bytes:
            threading.Thread(target=self._watch_memory, name="warm-pool-rss", daemon=True).start()

    def _watch_memory(self) -> None:
        """Kill (SIGKILL to its process group) a worker whose resident set passes ``max_rss_bytes``."""
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.5):
            for w in list(self.workers.values()):
                pid = w["proc"].pid
                try:
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    continue
                if rss > self.max_rss_bytes and pid not in self.over_memory:
                    self.over_memory[pid] = rss
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def close(self) -> None:
        self._stop.set()
        super().close()

    def _survives(self, b: str, how: str) -> bool:
        """A worker that reported its model's status (``done``) serves the next model; one that crashed,
        exited or timed out is gone (killed here) and the next model starts a fresh one."""
        return how == "done"

    def run(
        self,
        store: RunStore,
        specs: list[BackendSpec],
        model_path: Path,
        input_shapes: dict[str, list[int]] | None = None,
    ) -> dict[str, BackendStatus]:
        """Run ``store``'s samples on ``specs`` (each on its ``model`` option when given, else
        ``model_path``); returns label -> this model's status (``seconds_prepare``: this model's
        preparation on the warm worker)."""
        k, self.k = self.k, self.k + 1
        self.models += 1
        groups = [list(specs)] if self.side_by_side else [[s] for s in specs]
        out: dict[str, BackendStatus] = {}
        for group in groups:
            for spec in group:
                self._send(k, store, spec, Path(model_path), input_shapes)
            out.update(self._wait(k, [s.label for s in group], store))
            for spec in group:
                if spec.label in self.dead:  # crashed or timed out: the next model gets a fresh worker
                    del self.dead[spec.label]
                    w = self.workers.pop(spec.label)
                    self._close_fds(w)
                    rss = self.over_memory.get(w["proc"].pid)
                    if rss is not None:
                        st = out[spec.label]
                        st.status = "crashed"
                        st.reason = (
                            f"killed: resident memory {rss / 2**30:.2f} GiB over the pool's limit "
                            f"{self.max_rss_bytes / 2**30:.2f} GiB (while "
                            f"{'running' if w['prepared'] else 'preparing'})"
                        )
                (self.work / spec.label / f"chunk{k}.json").unlink(missing_ok=True)
        return out

    def _send(self, k: int, store: RunStore, spec: BackendSpec, model_path: Path, input_shapes) -> None:
        """Write model ``k``'s job for ``spec`` and send it with the samples to its worker (started
        here when it has none)."""
        wdir = self.work / spec.label / f"m{k}"
        job, job_path, _, status_path, _ = make_job(
            store, spec, model_path, self.mode, input_shapes, wdir, self.work / f"{spec.label}.log", self.shared
        )
        if spec.label not in self.workers:
            self.workers[spec.label] = self._start(store, spec, model_path, input_shapes)
            self.started[spec.label] = self.started.get(spec.label, 0) + 1
        w = self.workers[spec.label]
        w.update(
            status=status_path,
            family=job.family,
            prepared=False,
            done=0,
            t0=time.monotonic(),
            chunk_status=self.work / spec.label / f"chunk{k}.json",
        )
        old = self._folders.setdefault(spec.label, [])
        old.append(wdir)
        while len(old) > 2:
            shutil.rmtree(old.pop(0), ignore_errors=True)
        req = {
            "k": k,
            "store": str(store.root),
            "samples": store.sample_ids,
            "status": str(w["chunk_status"]),
            "job": str(job_path),
        }
        try:
            w["feed"].write(json.dumps(req) + "\n")
            w["feed"].flush()
        except OSError:  # the worker is gone: its status comes from the wait
            pass

    @staticmethod
    def _close_fds(w: dict) -> None:
        import os

        for close in (lambda: w["feed"].close(), lambda: os.close(w["rfd"])):
            try:
                close()
            except OSError:
                pass
