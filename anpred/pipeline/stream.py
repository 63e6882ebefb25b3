"""Datasets, streamed: ``anpred test MODEL --inputs DIR --stream`` (issue 20).

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
"""

from __future__ import annotations

import heapq
import math
import os
import queue
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from anpred.errors import AnpredError
from anpred.pipeline.scratch import static_size

__all__ = ["stream_test", "zoo_image_samples", "auto_chunk", "CHUNK_BYTES", "JUDGE_NICE", "LATER_CHUNK_FACTOR"]

#: default bytes of anchor tensors one chunk may write (all backends together): 1 GiB, so that the two
#: chunks in flight and the kept samples stay a few GiB on disk whatever the model (docs/run.md)
CHUNK_BYTES = 1 << 30


def auto_chunk(manifest, n_backends: int, budget: int = CHUNK_BYTES, most: int = 64) -> int:
    """Samples per chunk: ``budget`` bytes over the anchor bytes one sample writes for ``n_backends``
    backends (static anchor shapes of the manifest; an unknown dim counts as 1), between 1 and ``most``."""
    from anpred.pipeline.scratch import sample_anchor_bytes

    return int(max(1, min(most, budget // max(1, sample_anchor_bytes(manifest, n_backends)))))


def zoo_image_samples(zm, folder: str | Path) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """``(source, {input name: array})`` for every image of ``folder`` (sorted names), preprocessed
    lazily as the zoo model ``zm`` wants (:meth:`models.zoo.ZooModel.preprocess`).

    Raises:
        InputError: a folder without images, an unreadable image.
    """
    from PIL import Image

    from anpred.errors import InputError
    from anpred.inputs import IMAGE_EXTS, input_files

    files = input_files(Path(folder), IMAGE_EXTS)
    if not files:
        raise InputError(f"inputs {folder}: no image in the folder")
    name = zm.input_names()[0]
    for f in files:
        try:
            with Image.open(f) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except OSError as err:
            raise InputError(f"{f}: unreadable image ({err})") from err
        yield str(f), {name: zm.preprocess(arr)}


#: nice increment of the stream's judge and input-reader threads: the backends' workers (at the driver's
#: nice value, in its session: :class:`anpred.run.driver.WorkerPool`) get the cores first, and the judge
#: works beside them with what they leave, at no cost to their parallel regions. Measured on 300
#: DocLayNet pages with four backends on 2 cores (docs/task.md): stream 275.7 s at 0, 235.6 s at 10,
#: 248.9 s at 19 (there the judge starves beside the backends that spin and the runner waits for it)
JUDGE_NICE = 10

#: where positions are sampled, the chunks after the first hold this many times the first's samples (at most
#: 64): they store a few MB per sample instead of the first's hundreds, and a chunk's fixed cost (its
#: run folder, one hand-off per backend, waiting for its last sample's write) was 0.27 s with four
#: backends, 0.05 s a page in chunks of 5 DocLayNet pages (docs/task.md); three chunks of inputs stay
#: in memory (the one running, the one queued, the one being read)
LATER_CHUNK_FACTOR = 4


def _samples_positions(manifest, k: int) -> bool:
    """Whether a stream with ``--positions k`` samples some anchor: an intermediate anchor of the
    anchored model's ``manifest`` has a static shape of more than ``k`` elements."""
    return bool(k) and any(a.kind != "output" and static_size(a) > k for a in manifest.anchors)


def _batched(it, n: int, later: int | None = None):
    """Lists of ``n`` items of ``it``, then of ``later`` (default ``n``); the last may be shorter."""
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
            n = later or n
    if buf:
        yield buf


def _out_dev(outs: list[str], last: dict[tuple[str, str], tuple[float, int]]) -> dict[str, float]:
    """backend -> sum over the output anchors of its nRMSE against the consensus in the sample just
    judged (``last``: :attr:`anpred.judge.consensus.Oracle.last_nrmse`; 0 where it is the consensus,
    inf where it has NaN/Inf where the consensus is finite)."""
    dev: dict[str, float] = {}
    for (a, b), (nrmse, nonfinite) in last.items():
        if a in outs:
            dev[b] = float("inf") if nonfinite else dev.get(b, 0.0) + (nrmse if math.isfinite(nrmse) else float("inf"))
    return dev


def stream_test(anchored: str | Path, backends: list, samples: Iterator[tuple[str, dict[str, np.ndarray]]],
                out_run: str | Path, *, chunk: int = 64, keep: int = 4, timeout_s: float = 600, quiet: bool = False,
                oracle: str = "consensus", config=None, allow_incomplete: bool = False, adapter=None, labels=None,
                inputs_description: dict[str, Any] | None = None, side_by_side: bool = False,
                positions: int | None = None, checkpoint: bool = False, resume: bool = False):
    """Run and judge a dataset in chunks (module docstring); returns the :class:`anpred.judge.CheckReport`.

    Args:
        anchored: the anchored model; backends: names or :class:`anpred.run.BackendSpec`.
        samples: ``(source, {input name: array})`` per sample (an iterator: read lazily).
        out_run: the run folder to create (it keeps ``keep`` samples per backend).
        chunk: samples per chunk (memory and disk: three chunks of inputs and tensors at most); where
            positions are sampled (an intermediate anchor of more than ``positions`` elements), the
            chunks after the first hold :data:`LATER_CHUNK_FACTOR` times as many (at most 64, or
            ``chunk`` when larger).
        keep: most deviating samples kept per backend.
        oracle, config, allow_incomplete: as :func:`anpred.judge.check_run`.
        adapter, labels: the task (:mod:`anpred.task`), or None.
        inputs_description: what the run records as its inputs.
        side_by_side: the backends of a chunk run at the same time, each in its own long-lived worker
            (:class:`anpred.run.driver.WorkerPool`), the cores divided among them
            (:func:`anpred.run.spec.split_threads`: a backend given no ``threads`` option gets
            ``cores // backends``, at least 1); default False: one after the other, each with its
            library's default threads (docs/task.md, "Side by side").
        positions: every intermediate anchor of more than this many elements is judged on this many
            sampled positions (:mod:`anpred.judge.positions`; default
            :data:`anpred.judge.positions.DEFAULT_POSITIONS`; 0: every element), and from the second
            chunk on each backend's worker stores only those values (:mod:`anpred.run.positions`);
            the kept samples are run once more at the end and stored in full.
        checkpoint: after each judged chunk, write the judge's state beside ``out_run``
            (:mod:`anpred.pipeline.stream_state`), so that an interrupted run can be resumed.
        resume: continue the interrupted run whose checkpoint and run folder are there: the samples
            judged before are skipped (read, not run), the report is the uninterrupted run's.

    Raises:
        AnpredError: a chunk below 1, no sample, the first chunk cannot be judged (every backend failed);
            ``resume`` without a checkpoint, or with one made for another run (model, backends, options,
            inputs).
    """
    from anpred.judge.check import finish, inputs_sha256, usable_backends
    from anpred.judge.positions import DEFAULT_POSITIONS
    from anpred.judge.samples import SampleJudge
    from anpred.run import RunStore, run_model
    from anpred.pipeline.scratch import remove_scratch, scratch_bytes, scratch_folder
    from anpred.run.driver import WorkerPool, sigterm_raises
    from anpred.task.impact import load_labels, task_accumulator

    if chunk < 1 or keep < 0:
        raise AnpredError(f"stream: chunk must be >= 1 and keep >= 0 (got {chunk}, {keep})")
    positions = DEFAULT_POSITIONS if positions is None else int(positions)
    if positions < 0:
        raise AnpredError(f"stream: positions must be >= 0 (got {positions})")
    import anpred.pipeline.stream_state as stream_state
    from anpred.run.spec import BackendSpec, split_threads

    out_run = Path(out_run)
    # beside -o: the int8 calibration inputs, the kept samples' re-run (moved into the final run), the
    # chunks where no memory-backed folder has room for them (anpred.pipeline.scratch)
    side = out_run.parent / ".stream"
    specs = [BackendSpec.coerce(b) for b in backends]
    if side_by_side:  # the cores divided among the backends (in the fingerprint: resumed only with the same threads)
        specs = split_threads(specs)
    fp = stream_state.fingerprint(anchored, specs, chunk=chunk, keep=keep, positions=positions, oracle=oracle,
                                  config=config, inputs=inputs_description, allow_incomplete=allow_incomplete,
                                  task=adapter.describe() if adapter is not None else None,
                                  labels=None if labels is None else str(labels))
    state: dict[str, Any] = {"judge": None, "acc": None, "final": None, "n": 0, "sources": [],
                             "error": None, "heaps": {}, "kept": {}, "shas": [], "max_dev": {},
                             "added": []}
    if resume:
        state.update(stream_state.load(out_run.parent, fp))
        state["final"] = RunStore.open(out_run)
        stream_state.reconcile(state["final"], state["kept"], state["heaps"], state.get("statuses") or {})
        # a backend that failed before the interruption keeps that status: not started again
        failed = {b for b, st in state["final"].statuses().items() if st.status != "ok"}
        specs = [x for x in specs if x.label not in failed]
        if not quiet:
            print(f"stream: resuming after {state['n']} samples judged", file=sys.stderr, flush=True)
    else:
        (out_run.parent / stream_state.STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    t0, n0 = time.perf_counter(), state["n"]
    done: "queue.Queue[tuple[int, Any, dict[str, str]] | None]" = queue.Queue(maxsize=1)
    # set once the first chunk is judged (its alignment fixes the positions the workers gather) or the judge failed
    gather_ready = threading.Event()

    def judge_chunk(k: int, store, ids: dict[str, str]) -> None:
        tj = time.perf_counter()
        try:  # the judge's nice value for this chunk (run.json: stream.judge_nice; Linux: per thread)
            if sys.platform.startswith("linux"):
                state.setdefault("judge_nice", []).append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        except OSError:
            pass
        try:
            _judge_chunk(k, store, ids)
        finally:
            state["seconds_judge"] = state.get("seconds_judge", 0.0) + time.perf_counter() - tj

    def _judge_chunk(k: int, store, ids: dict[str, str]) -> None:
        if state["judge"] is None:
            run = usable_backends(store.root, oracle=oracle, config=config, allow_incomplete=allow_incomplete)
            if run.report.problems:
                raise AnpredError("stream: the first chunk cannot be judged: " + "; ".join(run.report.problems))
            state["run"], state["judge"] = run, SampleJudge(run, positions=positions)
            if adapter is not None:
                state["acc"] = task_accumulator(run, adapter)
            state["final"] = RunStore.create(out_run, store.manifest, model=dict(store.meta.get("model", {})),
                                             inputs=inputs_description or dict(store.meta.get("inputs", {})))
        judge, acc = state["judge"], state["acc"]
        main = judge.oracle.main if judge.oracle is not None else None
        outs = [a.name for a in store.manifest.anchors if a.kind == "output"]
        devs: dict[str, dict[str, float]] = {}

        def each(rid: str, tensors) -> None:
            i = int(rid[1:])
            # the oracle's consensus of the outputs and each backend's nRMSE there, for this sample
            cons, last = (main.last_consensus, main.last_nrmse) if main is not None else ({}, {})
            if acc is not None and acc.add(tensors, consensus=cons):  # labels: matched at the end
                state["added"].append(i)
            devs[rid] = _out_dev(outs, last)
            for b, d in devs[rid].items():
                state["max_dev"][b] = max(state["max_dev"].get(b, 0.0), d)

        for m in store.meta.get("samples", []):  # the input set's identity, as anpred check computes it
            state["shas"].append(str(m.get("sha256", m.get("id", ""))))
        judge.add_store(store, ids, each)
        if k == 0 and judge.sampler is not None:  # the workers store the sampled positions from now on
            pool.gather.update(_gather_files(judge, work / "gather"))
        if k == 0:
            gather_ready.set()
            if sampling:  # the runner waited for this judge at the driver's priority: the rest at JUDGE_NICE
                _lower_priority()
        _keep(state, store, ids, devs, keep)
        state["n"] += len(ids)
        shutil.rmtree(store.root, ignore_errors=True)
        if checkpoint and not state.get("checkpoint_error"):
            tc = time.perf_counter()
            why = stream_state.save(out_run.parent, state, fp)
            state["seconds_checkpoint"] = state.get("seconds_checkpoint", 0.0) + time.perf_counter() - tc
            if why:
                state["checkpoint_error"] = why
                print(f"stream: no checkpoint after {state['n']} samples ({why}): an interruption from now on "
                      f"cannot be resumed", file=sys.stderr, flush=True)
        fault = os.environ.get("ANPRED_STREAM_FAULT", "")
        if fault.startswith("sigint-after=") and state["n"] >= int(fault.split("=", 1)[1]) \
                and not state.get("sigint_sent"):
            # testing hook: a real Ctrl-C (SIGINT to the main thread) once that many samples are judged and
            # checkpointed, whatever the load (a test that sends it on reading this line can come too late)
            import signal

            state["sigint_sent"] = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        rate = (state["n"] - n0) / (time.perf_counter() - t0)
        state.setdefault("judged_at", []).append([state["n"], round(time.perf_counter() - t0, 2)])
        if not quiet:
            running = ("; ".join(f"{b}: {h}" for b, h in acc.running().items())
                       if acc is not None else
                       "; ".join(f"{b} max output dev {v:.2g}" for b, v in sorted(state["max_dev"].items())))
            print(f"stream: {state['n']} samples judged ({rate:.2f} samples/s); running: {running}", file=sys.stderr,
                  flush=True)

    def judge_loop() -> None:
        if not sampling:  # (otherwise the runner waits for the first chunk's judge: lowered after it)
            _lower_priority()
        while True:
            item = done.get()
            if item is None:
                return
            if state["error"] is not None:
                continue  # drain: a failed judge keeps the runner from blocking
            try:
                judge_chunk(*item)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                state["error"] = err
                gather_ready.set()

    # the first samples (at most 32) calibrate the int8 backends once for the whole dataset, whatever the chunk
    import itertools

    head = list(itertools.islice(samples, 32))
    specs = _calibrated(specs, head, side / "calibration")
    samples = itertools.chain(head, samples)
    if state["n"]:  # resumed: the samples judged before are read (their order and ids), not run
        samples = _skip_judged(samples, state["sources"][:state["n"]], state["shas"][:state["n"]])
    # the first chunk is stored in full; where positions will be sampled (an intermediate anchor of more
    # than K elements in the manifest's static shapes) the later ones store a few MB a sample
    from anpred.run.model import load_anchored

    manifest = load_anchored(Path(anchored))[1]  # (read once: the sampling and the chunks' estimate)
    sampling = _samples_positions(manifest, positions)
    later = min(max(chunk, 64), chunk * LATER_CHUNK_FACTOR) if sampling else chunk
    th = threading.Thread(target=judge_loop, daemon=True)
    th.start()
    # the chunks' tensors are read by the judge at once, then deleted: written through the page cache
    pool = WorkerPool(side / "workers", timeout_s=timeout_s, side_by_side=side_by_side, direct_io=False)
    restore_sigterm = sigterm_raises()  # SIGTERM while waiting for the judge: cleaned up as Ctrl-C
    work = chunks = None  # (the chunks' folder: in memory where it fits, anpred.pipeline.scratch)
    try:
        work, scratch = scratch_folder(side / "chunks", scratch_bytes(manifest, len(specs), chunk, later, head[:1]))
        chunks = _prefetched(samples, chunk, work, state["sources"], first=state["n"],
                             description=inputs_description, later=later)
        for k, part, ids in chunks:
            if state["error"] is not None:
                break
            tr = time.perf_counter()
            store = run_model(anchored, specs, part, work / f"run{k}", timeout_s=timeout_s, overwrite=True,
                              progress=False, precheck=(k == 0), pool=pool)
            del part
            state["seconds_run"] = state.get("seconds_run", 0.0) + time.perf_counter() - tr
            if k == 0:  # a backend refused by the pre-run coverage is not started again
                st0 = store.statuses()
                specs = [x for x in specs if st0.get(x.label) is None or st0[x.label].status != "unsupported"]
            shutil.rmtree(work / f"in{k}", ignore_errors=True)  # (what was not moved into the run)
            done.put((k, store, ids))
            if k == 0 and sampling:
                # the next chunk waits for the first one's judge (a few seconds, alone on the cores): from
                # it on, every worker stores only the sampled positions, whatever the judge's priority
                while not gather_ready.wait(0.5) and th.is_alive():
                    pass
        _end_judge(done, th, drop=False)
        if os.environ.get("ANPRED_STREAM_FAULT") == "before-refill":  # testing hook: interrupted after the last checkpoint
            raise KeyboardInterrupt
        if state["error"] is None and state["final"] is not None and positions:
            tr = time.perf_counter()
            _refill_kept(state["final"], anchored, specs, pool, side / "refill", timeout_s)
            state["seconds_refill"] = time.perf_counter() - tr
    except BaseException:
        pool.kill()  # interrupted or failed: nothing more to run, no 30 s wait per worker
        state["error"] = state["error"] or RuntimeError("stream interrupted")
        raise
    finally:
        try:
            if chunks is not None:
                chunks.close()
            pool.close()
            _end_judge(done, th)
            if state["final"] is not None:  # the long-lived workers' logs, one per backend
                (out_run / "logs").mkdir(exist_ok=True)
                for log in (side / "workers").glob("*.log"):
                    shutil.copy2(log, out_run / "logs" / log.name)
        finally:  # (even when a second Ctrl-C or a SIGTERM interrupts the above: no memory left held)
            try:
                remove_scratch(work)
                shutil.rmtree(side, ignore_errors=True)
            finally:
                restore_sigterm()
    if state["error"] is not None:
        raise state["error"]
    if state["judge"] is None:
        raise AnpredError("stream: no sample to run")
    run, judge, final = state["run"], state["judge"], state["final"]
    # seconds_run: the chunks' runs as the driver waited for them (every backend, side by side or not);
    # seconds_judge: judging them (a thread beside the runs)
    final.meta["stream"] = {"samples": state["n"], "chunk": chunk, "later_chunks": later, "keep": keep,
                            "side_by_side": side_by_side,
                            # intra-op threads per backend given a threads option (split_threads side by side)
                            "threads": {x.label: x.options["threads"] for x in specs if "threads" in x.options},
                            # where the chunks lived: "memory" (a tmpfs) or "disk" (anpred.pipeline.scratch)
                            "scratch": scratch,
                            "seconds_run": round(state.get("seconds_run", 0.0), 2),
                            "seconds_judge": round(state.get("seconds_judge", 0.0), 2),
                            "seconds_refill": round(state.get("seconds_refill", 0.0), 2),
                            "seconds_checkpoint": round(state.get("seconds_checkpoint", 0.0), 2),
                            "checkpoint_bytes": _size(out_run.parent / stream_state.STATE_FILE),
                            # [samples judged, seconds since the stream began] after each chunk (this process)
                            "judged_at": state.get("judged_at", []),
                            # the judge thread's nice value per chunk (this process): the driver's for the
                            # first chunk where positions are sampled, JUDGE_NICE more for the others
                            "judge_nice": state.get("judge_nice", []),
                            "positions": positions,
                            "wasserstein_positions": (getattr(judge.oracle.main, "distribution_k", None)
                                                      if judge.oracle is not None else None),
                            "kept": {b: sorted(r for _, r in h) for b, h in state["heaps"].items()}}
    final.meta["backend_specs"] = {x.label: {"name": x.name, "options": {k: v for k, v in x.options.items()
                                                                         if k != "calibration"}} for x in specs}
    final.save_meta()
    report = finish(run, judge.judged())
    report.run_dir = str(out_run)
    report.inputs = {"description": inputs_description or {}, "samples": state["n"],
                     "sha256": inputs_sha256(state["shas"])}
    if state["acc"] is not None:
        if labels is not None:  # one pass over the labels (a class-folder layout needs every source)
            every = load_labels(labels, [{"id": f"s{i:06d}", "source": src} for i, src in enumerate(state["sources"])],
                                adapter.name, require=False)
            state["acc"].labels = [every[i] for i in state["added"]]
        report.task = state["acc"].result()
    if judge.sampler is not None and judge.sampler.sampled_sizes():
        big = judge.sampler.sampled_sizes()
        report.notes.append(f"sampled positions: {len(big)} intermediate anchor(s) of more than {positions} elements "
                            f"(up to {max(big.values())}) judged on {positions} positions per sample, the same in every "
                            f"sample and backend; their maxima (max_abs, max_ulp) are over those positions, sums and "
                            f"means are estimates (docs/task.md, 'Sampled positions'); outputs judged in full")
    dk = getattr(judge.oracle.main, "distribution_k", None) if judge.oracle is not None else None
    if dk:  # the Wasserstein distance on fewer positions (anpred.judge.positions.DISTRIBUTION_POSITIONS)
        report.notes.append(f"Wasserstein distance (W1): computed on {dk} sampled positions of every tensor of more "
                            f"elements, the outputs included (an estimate; every other statistic of the outputs "
                            f"uses every element; docs/task.md, 'Sampled positions')")
    report.notes.append(f"streamed: {state['n']} samples judged in chunks of {chunk}"
                        f"{f' (then {later})' if later != chunk else ''} "
                        f"({time.perf_counter() - t0:.0f} s); the run folder keeps the {keep} most deviating "
                        f"samples per backend ({len(final.sample_ids)} samples)")
    return report


def _skip_judged(samples, sources: list[str], shas: list[str]):
    """``samples`` after the ``len(sources)`` judged before an interruption, each checked to come from
    the same source with the same content as then (:func:`anpred.run.store.sample_sha256`): a file
    added, removed, renamed or rewritten since would change what the checkpoint's statistics mean.

    Raises:
        AnpredError: a sample's source or content differs, or the inputs end before them."""
    import anpred.pipeline.stream_state as stream_state
    from anpred.run.store import sample_sha256

    it = iter(samples)
    for i, want in enumerate(sources):
        got = next(it, None)
        if got is None or got[0] != want:
            raise stream_state.ResumeRefused(
                f"cannot resume: the inputs changed since the checkpoint: sample s{i:06d} was {want}, now "
                f"{'nothing (fewer inputs)' if got is None else got[0]}; run without --resume to start over")
        if i < len(shas) and sample_sha256(got[1]) != shas[i]:
            raise stream_state.ResumeRefused(
                f"cannot resume: the inputs changed since the checkpoint: sample s{i:06d} ({want}) has other "
                f"contents; run without --resume to start over")
    yield from it


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _prefetched(samples, chunk: int, work: Path, sources: list[str], first: int = 0,
                description: dict[str, Any] | None = None, later: int | None = None):
    """``(k, part, ids)`` per chunk of ``chunk`` samples (``later`` after the first): ``part`` the
    chunk's inputs in memory (:class:`anpred.inputs.ArraySamples`, ``description`` its inputs' record;
    each sample also hashed and written to ``work/in<k>``, to be moved into the chunk's run), ``ids``
    chunk sample id -> the dataset's id; ``sources`` grows with each sample's source; ``first``: the
    samples before it, already judged by a resumed run, are in ``sources`` and skipped by ``samples``.
    A thread reads and preprocesses the next chunk while the caller runs the current one (at most one
    chunk ahead, so at most three chunks of inputs are in memory: the one running, the one queued, the
    one being read); its errors (an unreadable image) are raised here. Closing the generator stops the thread."""
    from anpred.inputs import ArraySamples
    from anpred.run.store import sample_sha256
    from anpred.tensorfile import storable, write_safetensors

    del sources[first:]
    q: "queue.Queue[Any]" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        _lower_priority()
        try:
            for k, part in enumerate(_batched(samples, chunk, later)):
                ids = {}
                pre: list = []
                folder = work / f"in{k}"
                folder.mkdir(parents=True, exist_ok=True)
                for j, (src, arrays) in enumerate(part):
                    ids[f"s{j:04d}"] = f"s{len(sources):06d}"
                    sources.append(src)
                    # hashed and written here, beside the running chunk, then moved into the chunk's run
                    if storable(arrays):
                        write_safetensors(folder / f"{j:06d}.safetensors", arrays, direct=False)
                        pre.append((sample_sha256(arrays), folder / f"{j:06d}.safetensors"))
                    else:
                        pre.append(None)
                if not put((k, ArraySamples(part, description, pre), ids)):
                    return
            put(None)
        except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
            put(err)

    th = threading.Thread(target=produce, daemon=True, name="anpred-stream-inputs")
    th.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        th.join()


def _lower_priority(increment: int | None = None) -> int | None:
    """Raise the calling thread's nice value by ``increment`` (default :data:`JUDGE_NICE`; at most 19;
    Linux ``setpriority(2)`` on the thread id). Returns the new value, or None on another OS (not
    tried: there the thread id may name another process) or where the system refuses (a sandbox): the
    thread then keeps its priority."""
    inc = JUDGE_NICE if increment is None else increment
    if not sys.platform.startswith("linux"):  # elsewhere a thread id is no PRIO_PROCESS target (another process')
        return None
    try:
        tid = threading.get_native_id()
        new = min(19, os.getpriority(os.PRIO_PROCESS, tid) + inc)
        os.setpriority(os.PRIO_PROCESS, tid, new)
        return new
    except (OSError, AttributeError):
        return None


def _end_judge(done: "queue.Queue", th: threading.Thread, drop: bool = True) -> None:
    """Send the judge thread its end marker and wait for it (idempotent). ``drop`` (after a failure or
    an interruption): a chunk still queued is dropped to make room for the marker; otherwise every
    queued chunk is judged first."""
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


def _gather_files(judge, folder: Path) -> dict[str, Path]:
    """label -> file of the anchors its worker stores as their sampled positions
    (:func:`anpred.run.positions.save_gather`), from the judge's alignment decisions; backends with
    nothing to gather get no file."""
    from anpred.run.positions import backend_indices, save_gather

    decisions = judge.aligner.decisions
    files: dict[str, Path] = {}
    for b in judge.run.usable:
        spec = {}
        for a in judge.sampler.sampled:
            d = decisions.get((a, b))
            if d is None or not d.canonical_shape or not d.backend_shape:
                continue
            pos = judge.sampler.positions(a, int(np.prod(d.canonical_shape)))
            if pos is None:
                continue
            try:
                idx = backend_indices(d.rule, d.backend_shape, d.canonical_shape, pos)
            except ValueError:
                idx = None
            if idx is not None:
                spec[a] = (list(d.backend_shape), idx)
        if spec:
            files[b] = save_gather(folder / f"{len(files)}.npz", spec)
    return files


def _refill_kept(final, anchored, specs: list, pool, folder: Path, timeout_s: float) -> None:
    """Run the kept samples whose tensors were stored as sampled positions once more, with every
    anchor in full, and store those tensors in the final run folder (for the report's plots and the
    drill-down). A backend that fails here keeps its sampled tensors."""
    from anpred.inputs import ArraySamples
    from anpred.run import run_model
    from anpred.run.positions import GATHERED_SUFFIX
    from anpred.tensorfile import array_file_keys

    def sampled(rid: str) -> bool:
        files = [final.anchor_file(b, rid) for b in final.statuses()]
        return any(k.endswith(GATHERED_SUFFIX) for f in files if f is not None for k in array_file_keys(f))

    rids = [s["id"] for s in final.meta.get("samples", []) if sampled(s["id"])]
    if not rids:
        return
    part = ArraySamples([(rid, final.read_inputs(rid)) for rid in rids], {"kind": "arrays", "kept": len(rids)})
    pool.gather.clear()
    store = run_model(anchored, specs, part, folder / "run", timeout_s=timeout_s, overwrite=True, progress=False,
                      precheck=False, pool=pool)
    for j, rid in enumerate(rids):
        sid = f"s{j:04d}"
        for b, st in store.statuses().items():
            f = store.anchor_file(b, sid) if st.status == "ok" else None
            if f is None:
                continue
            old = final.anchor_file(b, rid)
            # moved, not copied (the full tensors of every kept sample would be on disk twice)
            os.replace(f, final.backend_dir(b) / f"{rid}{f.suffix}")
            if old is not None and old.suffix != f.suffix:
                old.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def _calibrated(specs: list, head: list, folder: Path) -> list:
    """``specs`` as :class:`anpred.run.BackendSpec`, those that calibrate on the run's inputs (int8)
    given the ``head`` samples (written into ``folder``) as their calibration: one quantized model for
    the whole dataset, calibrated as a run in one piece would be (its first 32 samples)."""
    from anpred.backends import backend_class
    from anpred.run import BackendSpec

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, (_, arrays) in enumerate(head):
        np.savez(folder / f"{i:06d}.npz", **arrays)
        files.append(str(folder / f"{i:06d}.npz"))
    out = []
    for s in specs:
        spec = BackendSpec.coerce(s)
        if files and getattr(backend_class(spec.name), "needs_calibration", False) and "calibration" not in spec.options:
            spec = BackendSpec(spec.name, spec.label, {**spec.options, "calibration": files})
        out.append(spec)
    return out


def _keep(state, store, ids: dict[str, str], devs: dict[str, dict[str, float]], keep: int) -> None:
    """Keep each backend's ``keep`` most deviating samples so far in the final run folder (every
    backend's tensors of a kept sample), dropping the ones pushed out."""
    final = state["final"]
    want: set[str] = set()
    for rid, per in devs.items():
        for b, d in per.items():
            h = state["heaps"].setdefault(b, [])
            if len(h) < keep:
                heapq.heappush(h, (d, rid))
            elif keep and d > h[0][0]:
                heapq.heapreplace(h, (d, rid))
    kept_now = {r for h in state["heaps"].values() for _, r in h}
    inv = {v: k for k, v in ids.items()}
    for rid in sorted(kept_now):
        if rid in inv and rid not in state["kept"]:
            sid = inv[rid]
            # its files are moved from the chunk's run (deleted once judged), not read and written again
            final.adopt_sample(rid, store, sid, source=state["sources"][int(rid[1:])])
            state["kept"][rid] = True
            want.add(rid)
    for rid in [r for r in state["kept"] if r not in kept_now]:  # pushed out: its files go
        final.remove_sample(rid)
        del state["kept"][rid]
    for b, st in store.statuses().items():  # statuses over the chunks: counts and times summed, a failure kept
        old = final.statuses().get(b)
        if old is not None:
            st.samples += old.samples
            st.seconds_run += old.seconds_run
            st.seconds_prepare += old.seconds_prepare
            if old.status != "ok":  # the first failure stays the status, with its chunk and details
                old.samples, old.seconds_run, old.seconds_prepare = st.samples, st.seconds_run, st.seconds_prepare
                st = old
        if st.status != "ok" and not st.reason.startswith("chunk "):
            reason = st.reason
            for local, glob in ids.items():  # the dataset's sample ids, not the chunk's
                reason = reason.replace(f"sample {local}:", f"sample {glob}:").replace(f"sample {local} ", f"sample {glob} ")
            st.reason = f"chunk of samples {min(ids.values())}..{max(ids.values())}: {reason}"
        final.set_status(st)
    final.save_meta()
