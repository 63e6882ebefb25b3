"""Datasets, streamed: ``anpred test MODEL --inputs DIR --stream``.

The samples are read lazily (a thread reads, preprocesses and writes the next chunk's inputs while the
current one runs) and run in chunks of ``chunk`` samples: each chunk is one
:func:`anpred.run.run_model` (every backend in its own process, the same chunk for all), judged sample
by sample by ONE oracle for the whole dataset (:class:`anpred.judge.samples.SampleJudge`: its
accumulators are streaming, so memory stays flat in the number of inputs) and by the task adapter
(:class:`anpred.task.impact.TaskAccumulator`), then deleted. While chunk ``k`` is judged (a thread),
chunk ``k + 1`` runs: the judge works beside the backends. Each backend runs in ONE long-lived worker
process for the whole dataset (:class:`anpred.run.driver.WorkerPool`: imported, converted and prepared
once); the backends of a chunk run one after the other (``side_by_side``: at once, the cores divided
among them).

Intermediate anchors of more than ``positions`` elements are judged on that many sampled positions
(:mod:`anpred.judge.positions`); once the first chunk (stored in full) has fixed the alignment, each
worker stores only those values (:mod:`anpred.run.positions`), so later chunks write, read and judge
a few hundred KB per sample and backend instead of tens of MB. Outputs are always stored and judged in
full (task metrics, output verdicts).

The run folder keeps only the ``keep`` most deviating samples per backend (deviation: the nRMSE of the
backend's outputs against the consensus', summed over the outputs), with every backend's tensors for
them, run once more at the end with every anchor in full (for the report's plots and for ``anpred
check RUN --drill``). The chunks' folder (a memory-backed one where it has room, else beside the run:
:mod:`anpred.pipeline.scratch`) holds three chunks of tensors at most (one judged, one queued, one
running; only the first at full size) and five of inputs (those three, one queued by the reader, one
being written: a reader thread reads, preprocesses, hashes and writes the next chunk's inputs while one
runs); the disk, the ``keep`` samples per backend. A progress
line per chunk gives samples/s and the running verdict (the task's headline per backend, else each
backend's largest output deviation so far). The judge and reader threads run at a lower priority
(:data:`JUDGE_NICE`): the backends get the cores first.

The report (status, verdicts, cells) covers every sample; ``report.stream`` records the chunking.

:func:`stream_test` is a short driver over named steps: :func:`open_stream` (open or resume),
:func:`run_chunks` (the chunks run, each judged by :mod:`anpred.pipeline.stream_judge` in a thread
beside the next one's run), :func:`write_report`; the state they share is typed
(:class:`anpred.pipeline.stream_state.StreamState`, :class:`anpred.pipeline.stream_state.StreamPlan`);
the inputs are read by :mod:`anpred.pipeline.stream_inputs`, the kept samples handled by
:mod:`anpred.pipeline.stream_kept`, testing hooks injected (:mod:`anpred.pipeline.stream_hooks`).
"""

from __future__ import annotations

import itertools
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError
from anpred.options import JudgeOptions, RunOptions, StreamOptions
from anpred.pipeline.scratch import static_size
from anpred.pipeline.stream_hooks import StreamHooks
from anpred.pipeline.stream_inputs import (
    JUDGE_NICE,
    StreamInputs,
    calibrated,
    prefetched,
    skip_judged,
    zoo_image_samples,
)
from anpred.pipeline.stream_judge import ChunkJudge, JudgeThread
from anpred.pipeline.stream_state import StreamPlan, StreamState

__all__ = [
    "stream_test",
    "open_stream",
    "run_chunks",
    "write_report",
    "StreamInputs",
    "StreamHooks",
    "zoo_image_samples",
    "auto_chunk",
    "CHUNK_BYTES",
    "JUDGE_NICE",
    "LATER_CHUNK_FACTOR",
]

#: default bytes of anchor tensors one chunk may write (all backends together): 1 GiB, so that the two
#: chunks in flight and the kept samples stay a few GiB on disk whatever the model (docs/run.md)
CHUNK_BYTES = 1 << 30


def auto_chunk(manifest, n_backends: int, budget: int = CHUNK_BYTES, most: int = 64) -> int:
    """Samples per chunk: ``budget`` bytes over the anchor bytes one sample writes for ``n_backends``
    backends (static anchor shapes of the manifest; an unknown dim counts as 1), between 1 and ``most``."""
    from anpred.pipeline.scratch import sample_anchor_bytes

    return int(max(1, min(most, budget // max(1, sample_anchor_bytes(manifest, n_backends)))))


#: where positions are sampled, the chunks after the first hold this many times the first's samples (at most
#: 64): they store a few MB per sample instead of the first's hundreds, and a chunk has a fixed cost
#: (its run folder, one hand-off per backend, waiting for its last sample's write) that small chunks pay
#: per page (docs/task.md, 'Measurements: chunk overhead'); three chunks of inputs stay in memory (the
#: one running, the one queued, the one being read)
LATER_CHUNK_FACTOR = 4


def _samples_positions(manifest, k: int) -> bool:
    """Whether a stream with ``--positions k`` samples some anchor: an intermediate anchor of the
    anchored model's ``manifest`` has a static shape of more than ``k`` elements."""
    return bool(k) and any(a.kind != "output" and static_size(a) > k for a in manifest.anchors)


def stream_test(
    anchored: str | Path,
    inputs: StreamInputs | Any,
    out_run: str | Path,
    *,
    run: RunOptions,
    judge: JudgeOptions | None = None,
    stream: StreamOptions | None = None,
    quiet: bool = False,
    checkpoint: bool = False,
):
    """Run and judge a dataset in chunks (module docstring); returns the :class:`anpred.judge.CheckReport`.

    Args:
        anchored: the anchored model.
        inputs: the dataset (:class:`StreamInputs`: the samples, read lazily, and what the run records
            as its inputs), or an iterator of ``(source, {input name: array})`` per sample.
        out_run: the run folder to create (it keeps ``stream.keep`` samples per backend).
        run: the backends (``run.backends``: names or :class:`anpred.run.BackendSpec`), ``timeout_s``,
            and ``side_by_side``: the backends of a chunk run at the same time, each in its own
            long-lived worker (:class:`anpred.run.driver.WorkerPool`), the cores divided among them
            (:func:`anpred.run.spec.split_threads`: a backend given no ``threads`` option gets
            ``cores // backends``, at least 1); default False: one after the other, each with its
            library's default threads (docs/task.md, "Side by side").
        judge: oracle, config, allow_incomplete as :func:`anpred.judge.check_run`; ``task``: the task
            adapter (:func:`anpred.task.adapters.load_adapter`) or None, ``labels`` its ground truth.
        stream: ``chunk``: samples per chunk (memory and disk: three chunks of inputs and tensors at
            most; None: :func:`auto_chunk`); where positions are sampled (an intermediate anchor of
            more than ``positions`` elements), the chunks after the first hold
            :data:`LATER_CHUNK_FACTOR` times as many (at most 64, or ``chunk`` when larger).
            ``keep``: most deviating samples kept per backend. ``positions``: every intermediate
            anchor of more than this many elements is judged on this many sampled positions
            (:mod:`anpred.judge.positions`; default :data:`anpred.judge.positions.DEFAULT_POSITIONS`;
            0: every element), and from the second chunk on each backend's worker stores only those
            values (:mod:`anpred.run.positions`); the kept samples are run once more at the end and
            stored in full. ``resume``: continue the interrupted run whose checkpoint and run folder
            are there: the samples judged before are skipped (read, not run), the report is the
            uninterrupted run's. ``hooks``: testing hooks (:class:`StreamHooks`).
        quiet: no progress lines on stderr.
        checkpoint: after each judged chunk, write the judge's state beside ``out_run``
            (:mod:`anpred.pipeline.stream_state`), so that an interrupted run can be resumed.

    Raises:
        AnpredError: a chunk below 1, no sample, the first chunk cannot be judged (every backend failed);
            ``resume`` without a checkpoint, or with one made for another run (model, backends, options,
            inputs).
    """
    if not isinstance(inputs, StreamInputs):
        inputs = StreamInputs(inputs)
    plan, state = open_stream(
        anchored,
        out_run,
        run=run,
        judge=judge or JudgeOptions(),
        stream=stream or StreamOptions(),
        inputs_description=inputs.description,
        quiet=quiet,
        checkpoint=checkpoint,
    )
    head, samples = _calibration_and_skip(plan, state, inputs.samples)
    run_chunks(plan, state, samples, head)
    return write_report(plan, state)


def _backends(run: RunOptions) -> list:
    """``run.backends`` as :class:`anpred.run.BackendSpec` (the cores divided among them side by side).
    Raises AnpredError: no backend."""
    from anpred.run.spec import BackendSpec, split_threads

    names = run.backends.split(",") if isinstance(run.backends, str) else list(run.backends or [])
    if not names:
        raise AnpredError("stream: no backend to run (RunOptions.backends)")
    specs = [BackendSpec.coerce(b) for b in names]
    # side by side: the cores divided among the backends (in the fingerprint: resumed only with the same threads)
    if run.side_by_side:
        specs = split_threads(specs)
    return specs


def _adapter(task: Any):
    """The task adapter of ``JudgeOptions.task``: None, an adapter, or a name
    (:func:`anpred.task.adapters.load_adapter`)."""
    if task is None or not isinstance(task, str):
        return task
    from anpred.task.adapters import load_adapter

    return load_adapter(task)


def open_stream(
    anchored: str | Path,
    out_run: str | Path,
    *,
    run: RunOptions,
    judge: JudgeOptions,
    stream: StreamOptions,
    inputs_description: dict[str, Any] | None,
    quiet: bool,
    checkpoint: bool,
) -> tuple[StreamPlan, StreamState]:
    """Step 1, open or resume: the options checked and resolved into a :class:`StreamPlan`, and the
    :class:`StreamState` to start from (empty; with ``stream.resume``, the checkpoint's, its run folder
    made what it was then). The folder beside ``out_run`` is made empty. Arguments as :func:`stream_test`.

    Raises:
        AnpredError: a chunk below 1, a negative keep or positions; ResumeRefused: ``resume`` without
            a checkpoint, or with one made for another run.
    """
    import anpred.pipeline.stream_state as stream_state
    from anpred.judge.positions import DEFAULT_POSITIONS
    from anpred.run import RunStore
    from anpred.run.model import load_anchored

    chunk, keep = stream.chunk, stream.keep
    if (chunk is not None and chunk < 1) or keep < 0:
        raise AnpredError(f"stream: chunk must be >= 1 and keep >= 0 (got {chunk}, {keep})")
    positions = DEFAULT_POSITIONS if stream.positions is None else int(stream.positions)
    if positions < 0:
        raise AnpredError(f"stream: positions must be >= 0 (got {positions})")
    out_run = Path(out_run)
    specs = _backends(run)
    adapter = _adapter(judge.task)
    manifest = load_anchored(Path(anchored))[1]  # (read once: the sampling and the chunks' estimate)
    if chunk is None:
        chunk = auto_chunk(manifest, len(specs))
    fp = stream_state.fingerprint(
        anchored,
        specs,
        chunk=chunk,
        keep=keep,
        positions=positions,
        oracle=judge.oracle,
        config=judge.config,
        inputs=inputs_description,
        allow_incomplete=judge.allow_incomplete,
        task=adapter.describe() if adapter is not None else None,
        labels=None if judge.labels is None else str(judge.labels),
    )
    # beside -o: the int8 calibration inputs, the kept samples' re-run (moved into the final run), the
    # chunks where no memory-backed folder has room for them (anpred.pipeline.scratch)
    side = out_run.parent / ".stream"
    plan = StreamPlan(
        anchored=Path(anchored),
        out_run=out_run,
        side=side,
        specs=specs,
        chunk=chunk,
        keep=keep,
        positions=positions,
        timeout_s=run.timeout_s,
        side_by_side=run.side_by_side,
        judge=judge,
        adapter=adapter,
        inputs_description=inputs_description,
        quiet=quiet,
        checkpoint=checkpoint,
        fingerprint=fp,
        hooks=stream.hooks or StreamHooks(),
        manifest=manifest,
    )
    state = StreamState()
    if stream.resume:
        state.restore(stream_state.load(out_run.parent, fp))
        state.final = RunStore.open(out_run)
        stream_state.reconcile(state.final, state.kept, state.heaps, state.statuses or {})
        # a backend that failed before the interruption keeps that status: not started again
        failed = {b for b, st in state.final.statuses().items() if st.status != "ok"}
        plan.specs = [x for x in plan.specs if x.label not in failed]
        if not quiet:
            print(f"stream: resuming after {state.n} samples judged", file=sys.stderr, flush=True)
    else:
        (out_run.parent / stream_state.STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    plan.t0, plan.n0 = time.perf_counter(), state.n
    # the first chunk is stored in full; where positions will be sampled (an intermediate anchor of more
    # than K elements in the manifest's static shapes) the later ones store a few MB a sample
    plan.sampling = _samples_positions(manifest, positions)
    plan.later = min(max(chunk, 64), chunk * LATER_CHUNK_FACTOR) if plan.sampling else chunk
    return plan, state


def _calibration_and_skip(plan: StreamPlan, state: StreamState, samples) -> tuple[list, Any]:
    """``(head, samples)``: the first sample (for the chunks' size estimate) and every sample to run.
    The first samples calibrate the int8 backends of ``plan.specs``; a resumed run's judged samples are
    read and checked (:func:`anpred.pipeline.stream_inputs.skip_judged`), not run."""
    # the first samples (at most 32) calibrate the int8 backends once for the whole dataset, whatever the chunk
    head = list(itertools.islice(samples, 32))
    plan.specs = calibrated(plan.specs, head, plan.side / "calibration")
    samples = itertools.chain(head, samples)
    if state.n:  # resumed: the samples judged before are read (their order and ids), not run
        samples = skip_judged(samples, state.sources[: state.n], state.shas[: state.n])
    return head[:1], samples


def run_chunks(plan: StreamPlan, state: StreamState, samples, head: list) -> None:
    """Step 2, the chunks: each run by every backend (one long-lived worker each) and handed to the
    judge thread (:mod:`anpred.pipeline.stream_judge`) while the next one runs; then the kept samples
    run once more in full. Everything transient goes on the way out, whatever stops it.

    Raises:
        the judge's or the run's error (KeyboardInterrupt, Terminated on SIGTERM); AnpredError: no sample.
    """
    from anpred.pipeline.scratch import remove_scratch, scratch_bytes, scratch_folder
    from anpred.pipeline.stream_kept import refill_kept
    from anpred.run.driver import WorkerPool, sigterm_raises

    judge = ChunkJudge(plan, state)
    judging = JudgeThread(judge)
    judging.start()
    # the chunks' tensors are read by the judge at once, then deleted: written through the page cache
    pool = WorkerPool(plan.side / "workers", timeout_s=plan.timeout_s, side_by_side=plan.side_by_side, direct_io=False)
    judge.pool = pool
    restore_sigterm = sigterm_raises()  # SIGTERM while waiting for the judge: cleaned up as Ctrl-C
    work = chunks = None  # (the chunks' folder: in memory where it fits, anpred.pipeline.scratch)
    try:
        work, plan.scratch = scratch_folder(
            plan.side / "chunks", scratch_bytes(plan.manifest, len(plan.specs), plan.chunk, plan.later, head)
        )
        judge.work = work
        chunks = prefetched(
            samples,
            plan.chunk,
            work,
            state.sources,
            first=state.n,
            description=plan.inputs_description,
            later=plan.later,
        )
        _run_each(plan, state, chunks, judging, pool, work)
        judging.end(drop=False)
        plan.hooks.before_refill()
        if state.error is None and state.final is not None and plan.positions:
            tr = time.perf_counter()
            refill_kept(state.final, plan.anchored, plan.specs, pool, plan.side / "refill", plan.timeout_s)
            state.seconds_refill = time.perf_counter() - tr
    except BaseException:
        pool.kill()  # interrupted or failed: nothing more to run, no 30 s wait per worker
        state.error = state.error or RuntimeError("stream interrupted")
        raise
    finally:
        try:
            if chunks is not None:
                chunks.close()
            pool.close()
            judging.end()
            if state.final is not None:  # the long-lived workers' logs, one per backend
                (plan.out_run / "logs").mkdir(exist_ok=True)
                for log in (plan.side / "workers").glob("*.log"):
                    shutil.copy2(log, plan.out_run / "logs" / log.name)
        finally:  # (even when a second Ctrl-C or a SIGTERM interrupts the above: no memory left held)
            try:
                remove_scratch(work)
                shutil.rmtree(plan.side, ignore_errors=True)
            finally:
                restore_sigterm()
    if state.error is not None:
        raise state.error
    if state.judge is None:
        raise AnpredError("stream: no sample to run")


def _run_each(plan: StreamPlan, state: StreamState, chunks, judging: JudgeThread, pool, work: Path) -> None:
    """Run each chunk ``(k, part, ids)`` of ``chunks`` (:func:`anpred.pipeline.stream_inputs.prefetched`)
    in ``work/run<k>`` and hand it to ``judging``; stop at the judge's first error."""
    from anpred.run import run_model

    for k, part, ids in chunks:
        if state.error is not None:
            break
        tr = time.perf_counter()
        store = run_model(
            plan.anchored,
            plan.specs,
            part,
            work / f"run{k}",
            timeout_s=plan.timeout_s,
            overwrite=True,
            progress=False,
            precheck=(k == 0),
            pool=pool,
        )
        del part
        state.seconds_run += time.perf_counter() - tr
        if k == 0:  # a backend refused by the pre-run coverage is not started again
            st0 = store.statuses()
            plan.specs = [x for x in plan.specs if st0.get(x.label) is None or st0[x.label].status != "unsupported"]
        shutil.rmtree(work / f"in{k}", ignore_errors=True)  # (what was not moved into the run)
        judging.put((k, store, ids))
        if k == 0 and plan.sampling:
            # the next chunk waits for the first one's judge (a few seconds, alone on the cores): from
            # it on, every worker stores only the sampled positions, whatever the judge's priority
            while not judging.judge.gather_ready.wait(0.5) and judging.is_alive():
                pass


def write_report(plan: StreamPlan, state: StreamState):
    """Step 3, the report: the run folder's record of the stream (``run.json``: ``stream``,
    ``backend_specs``) and the :class:`anpred.judge.CheckReport` over every sample, with the task's
    result and the notes on sampled positions and the chunking."""
    from anpred.judge.check import finish, inputs_sha256
    from anpred.task.impact import load_labels

    judge, final = state.judge, state.final
    final.meta["stream"] = _stream_record(plan, state)
    final.meta["backend_specs"] = {
        x.label: {"name": x.name, "options": {k: v for k, v in x.options.items() if k != "calibration"}}
        for x in plan.specs
    }
    final.save_meta()
    report = finish(state.run, judge.judged())
    report.run_dir = str(plan.out_run)
    report.inputs = {
        "description": plan.inputs_description or {},
        "samples": state.n,
        "sha256": inputs_sha256(state.shas),
    }
    if state.acc is not None:
        labels = plan.judge.labels
        if labels is not None:  # one pass over the labels (a class-folder layout needs every source)
            every = load_labels(
                labels,
                [{"id": f"s{i:06d}", "source": src} for i, src in enumerate(state.sources)],
                plan.adapter.name,
                require=False,
            )
            state.acc.labels = [every[i] for i in state.added]
        report.task = state.acc.result()
    positions = plan.positions
    if judge.sampler is not None and judge.sampler.sampled_sizes():
        big = judge.sampler.sampled_sizes()
        report.notes.append(
            f"sampled positions: {len(big)} intermediate anchor(s) of more than {positions} elements "
            f"(up to {max(big.values())}) judged on {positions} positions per sample, the same in "
            f"every sample and backend; their maxima (max_abs, max_ulp) are over those positions, "
            f"sums and means are estimates (docs/task.md, 'Sampled positions'); outputs judged in full"
        )
    dk = getattr(judge.oracle.main, "distribution_k", None) if judge.oracle is not None else None
    if dk:  # the Wasserstein distance on fewer positions (anpred.judge.positions.DISTRIBUTION_POSITIONS)
        report.notes.append(
            f"Wasserstein distance (W1): computed on {dk} sampled positions of every tensor of more "
            f"elements, the outputs included (an estimate; every other statistic of the outputs "
            f"uses every element; docs/task.md, 'Sampled positions')"
        )
    chunk, later = plan.chunk, plan.later
    report.notes.append(
        f"streamed: {state.n} samples judged in chunks of {chunk}"
        f"{f' (then {later})' if later != chunk else ''} "
        f"({time.perf_counter() - plan.t0:.0f} s); the run folder keeps the {plan.keep} most deviating "
        f"samples per backend ({len(final.sample_ids)} samples)"
    )
    return report


def _stream_record(plan: StreamPlan, state: StreamState) -> dict[str, Any]:
    """The run folder's record of the stream (``run.json``: ``stream``)."""
    import anpred.pipeline.stream_state as stream_state

    judge = state.judge
    # seconds_run: the chunks' runs as the driver waited for them (every backend, side by side or not);
    # seconds_judge: judging them (a thread beside the runs)
    return {
        "samples": state.n,
        "chunk": plan.chunk,
        "later_chunks": plan.later,
        "keep": plan.keep,
        "side_by_side": plan.side_by_side,
        # intra-op threads per backend given a threads option (split_threads side by side)
        "threads": {x.label: x.options["threads"] for x in plan.specs if "threads" in x.options},
        # where the chunks lived: "memory" (a tmpfs) or "disk" (anpred.pipeline.scratch)
        "scratch": plan.scratch,
        "seconds_run": round(state.seconds_run, 2),
        "seconds_judge": round(state.seconds_judge, 2),
        "seconds_refill": round(state.seconds_refill, 2),
        "seconds_checkpoint": round(state.seconds_checkpoint, 2),
        "checkpoint_bytes": _size(plan.out_run.parent / stream_state.STATE_FILE),
        # [samples judged, seconds since the stream began] after each chunk (this process)
        "judged_at": state.judged_at,
        # the judge thread's nice value per chunk (this process): the driver's for the
        # first chunk where positions are sampled, JUDGE_NICE more for the others
        "judge_nice": state.judge_nice,
        "positions": plan.positions,
        "wasserstein_positions": (
            getattr(judge.oracle.main, "distribution_k", None) if judge.oracle is not None else None
        ),
        "kept": {b: sorted(r for _, r in h) for b, h in state.heaps.items()},
    }


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
