"""Judging a streamed run's chunks (:mod:`anpred.pipeline.stream`): a thread beside the backends' runs
takes each chunk's run folder as it comes, feeds it to ONE judge for the whole dataset
(:class:`anpred.judge.samples.SampleJudge`) and the task accumulator, keeps the most deviating samples
(:mod:`anpred.pipeline.stream_kept`), deletes the chunk, writes the checkpoint
(:mod:`anpred.pipeline.stream_state`) and prints the progress line.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
import time
from typing import Any

from anpred.errors import AnpredError
from anpred.pipeline.stream_inputs import lower_priority
from anpred.pipeline.stream_kept import gather_files, keep_samples, output_deviation
from anpred.pipeline.stream_state import StreamPlan, StreamState

__all__ = ["ChunkJudge", "JudgeThread"]


class ChunkJudge:
    """Judges one chunk after the other into ``state`` (the :class:`StreamState`) as ``plan`` (the
    :class:`StreamPlan`) says. ``pool`` (the backends' :class:`anpred.run.driver.WorkerPool`) and
    ``work`` (the chunks' folder) are set by the runner before its first chunk: the first chunk's
    alignment tells the workers which positions to store (``work/gather``). ``gather_ready`` is set
    once the first chunk is judged, or the judge failed."""

    def __init__(self, plan: StreamPlan, state: StreamState) -> None:
        self.plan, self.state = plan, state
        self.pool: Any = None
        self.work: Any = None
        # set once the first chunk is judged (its alignment fixes the positions the workers gather) or the judge failed
        self.gather_ready = threading.Event()

    def __call__(self, k: int, store, ids: dict[str, str]) -> None:
        """Judge chunk ``k`` (its run folder ``store``, deleted then; ``ids``: chunk sample id -> the
        dataset's id), timed into ``state.seconds_judge``.

        Raises:
            AnpredError: the first chunk cannot be judged (every backend failed)."""
        tj = time.perf_counter()
        try:  # the judge's nice value for this chunk (run.json: stream.judge_nice; Linux: per thread)
            if sys.platform.startswith("linux"):
                self.state.judge_nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        except OSError:
            pass
        try:
            self._judge(k, store, ids)
        finally:
            self.state.seconds_judge += time.perf_counter() - tj

    def _first(self, store) -> None:
        """The judge, the task accumulator and the run folder being built, from the first chunk."""
        from anpred.judge.check import usable_backends
        from anpred.judge.samples import SampleJudge
        from anpred.run import RunStore
        from anpred.task.impact import task_accumulator

        plan, state, j = self.plan, self.state, self.plan.judge
        run = usable_backends(store.root, oracle=j.oracle, config=j.config, allow_incomplete=j.allow_incomplete)
        if run.report.problems:
            raise AnpredError("stream: the first chunk cannot be judged: " + "; ".join(run.report.problems))
        state.run, state.judge = run, SampleJudge(run, positions=plan.positions)
        if plan.adapter is not None:
            state.acc = task_accumulator(run, plan.adapter)
        state.final = RunStore.create(
            plan.out_run,
            store.manifest,
            model=dict(store.meta.get("model", {})),
            inputs=plan.inputs_description or dict(store.meta.get("inputs", {})),
        )

    def _judge(self, k: int, store, ids: dict[str, str]) -> None:
        state = self.state
        if state.judge is None:
            self._first(store)
        judge, acc = state.judge, state.acc
        main = judge.oracle.main if judge.oracle is not None else None
        outs = [a.name for a in store.manifest.anchors if a.kind == "output"]
        devs: dict[str, dict[str, float]] = {}

        def each(rid: str, tensors) -> None:
            i = int(rid[1:])
            # the oracle's consensus of the outputs and each backend's nRMSE there, for this sample
            cons, last = (main.last_consensus, main.last_nrmse) if main is not None else ({}, {})
            if acc is not None and acc.add(tensors, consensus=cons):  # labels: matched at the end
                state.added.append(i)
            devs[rid] = output_deviation(outs, last)
            for b, d in devs[rid].items():
                state.max_dev[b] = max(state.max_dev.get(b, 0.0), d)

        for m in store.meta.get("samples", []):  # the input set's identity, as anpred check computes it
            state.shas.append(str(m.get("sha256", m.get("id", ""))))
        judge.add_store(store, ids, each)
        if k == 0 and judge.sampler is not None:  # the workers store the sampled positions from now on
            self.pool.gather.update(gather_files(judge, self.work / "gather"))
        if k == 0:
            self.gather_ready.set()
            if self.plan.sampling:  # the runner waited for this judge at the driver's priority: the rest at JUDGE_NICE
                lower_priority()
        keep_samples(state, store, ids, devs, self.plan.keep)
        state.n += len(ids)
        shutil.rmtree(store.root, ignore_errors=True)
        self._checkpoint()
        self.plan.hooks.judged(state.n)
        self._progress()

    def _checkpoint(self) -> None:
        """Write the checkpoint (where asked, until one could not be written)."""
        from anpred.pipeline.stream_state import save

        plan, state = self.plan, self.state
        if plan.checkpoint and not state.checkpoint_error:
            tc = time.perf_counter()
            why = save(plan.out_run.parent, state, plan.fingerprint)
            state.seconds_checkpoint += time.perf_counter() - tc
            if why:
                state.checkpoint_error = why
                print(
                    f"stream: no checkpoint after {state.n} samples ({why}): an interruption from now on "
                    f"cannot be resumed",
                    file=sys.stderr,
                    flush=True,
                )

    def _progress(self) -> None:
        """Record when the chunk was judged; the progress line (samples/s, the running verdict)."""
        plan, state, acc = self.plan, self.state, self.state.acc
        rate = (state.n - plan.n0) / (time.perf_counter() - plan.t0)
        state.judged_at.append([state.n, round(time.perf_counter() - plan.t0, 2)])
        if not plan.quiet:
            running = (
                "; ".join(f"{b}: {h}" for b, h in acc.running().items())
                if acc is not None
                else "; ".join(f"{b} max output dev {v:.2g}" for b, v in sorted(state.max_dev.items()))
            )
            print(
                f"stream: {state.n} samples judged ({rate:.2f} samples/s); running: {running}",
                file=sys.stderr,
                flush=True,
            )


class JudgeThread:
    """The thread that runs a :class:`ChunkJudge` on each chunk the runner hands it (:meth:`put`, at most
    one queued); a failure is kept in ``state.error`` (re-raised by the caller) and the chunks after it
    are drained unjudged, so that the runner never blocks."""

    def __init__(self, judge: ChunkJudge) -> None:
        self.judge = judge
        self.done: "queue.Queue[tuple[int, Any, dict[str, str]] | None]" = queue.Queue(maxsize=1)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, item: tuple[int, Any, dict[str, str]]) -> None:
        """Hand a chunk ``(k, store, ids)`` to the judge (blocks while one is queued)."""
        self.done.put(item)

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def _loop(self) -> None:
        state = self.judge.state
        if not self.judge.plan.sampling:  # (otherwise the runner waits for the first chunk's judge: lowered after it)
            lower_priority()
        while True:
            item = self.done.get()
            if item is None:
                return
            if state.error is not None:
                continue  # drain: a failed judge keeps the runner from blocking
            try:
                self.judge(*item)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                state.error = err
                self.judge.gather_ready.set()

    def end(self, drop: bool = True) -> None:
        """Send the judge thread its end marker and wait for it (idempotent). ``drop`` (after a failure or
        an interruption): a chunk still queued is dropped to make room for the marker; otherwise every
        queued chunk is judged first."""
        done, th = self.done, self.thread
        if not drop:
            if th.is_alive():
                done.put(None)
            th.join()
            return
        while th.is_alive():
            try:
                done.put(None, timeout=0.5)
                break
            except queue.Full:
                try:
                    done.get_nowait()
                except queue.Empty:
                    pass
        th.join()
