"""Checkpoints of a streamed dataset run, to resume it after an interruption.

After each chunk is judged, :func:`save` writes the judge's whole state (the oracle's streaming
accumulators and alignment decisions, the task accumulator, the kept-sample heaps, the sources and
input digests of the samples judged so far) to ``state.pkl`` beside the run folder being built, with
pickle, atomically (a temporary file, then a rename). A run resumed from it (:func:`load`) skips the
samples judged before, runs and judges the rest into the same run folder and gives the report the
uninterrupted run would have given: the accumulators are sums, maxima and seeded reservoirs, fed in
the same order. An interruption loses at most the chunks in flight (run but not yet judged).

The checkpoint names what it belongs to (:func:`fingerprint`: the anchored model's bytes, the
backends and their options, chunk, keep, positions, oracle and configuration, the input set's
description); a resume with anything else is refused with what differs.

:class:`StreamState` is where the stream stands (what a checkpoint keeps, and the timings of this
process); :class:`StreamPlan` what it was asked to do (its options resolved, its folders, its backends).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = ["STATE_FILE", "ResumeRefused", "StreamPlan", "StreamState", "fingerprint", "save", "load", "reconcile"]

STATE_FILE = "state.pkl"


class ResumeRefused(AnpredError):
    """A checkpoint that cannot be resumed (missing, unreadable, made for another run, inputs changed)."""


SCHEMA = "anpred.stream-state/1"
#: what a checkpoint keeps of the stream's state (:class:`StreamState`, anpred.pipeline.stream.stream_test)
KEYS = (
    "n",
    "sources",
    "added",
    "shas",
    "heaps",
    "kept",
    "max_dev",
    "judge",
    "acc",
    "run",
    "seconds_run",
    "seconds_judge",
    "statuses",
)


@dataclass
class StreamPlan:
    """What a streamed run was asked to do, its options resolved (:func:`anpred.pipeline.stream.open_stream`).

    Attributes:
        anchored: the anchored model; out_run: the run folder being built (it keeps ``keep`` samples
            per backend); side: the transient folder beside it (calibration inputs, workers' logs, the
            kept samples' re-run, chunks on disk).
        specs: the :class:`anpred.run.BackendSpec` still running (a backend that failed before a resume,
            or that the first chunk's pre-run coverage refused, leaves the list).
        chunk: samples in the first chunk; later: in the others (more where positions are sampled);
            keep: most deviating samples kept per backend; positions: sampled positions per
            intermediate anchor (0: every element); sampling: whether some anchor is sampled.
        timeout_s, side_by_side: as :class:`anpred.options.RunOptions`.
        judge: the :class:`anpred.options.JudgeOptions` (oracle, config, allow_incomplete, labels);
            adapter: the task adapter (:mod:`anpred.task`) or None.
        inputs_description: what the run records as its inputs.
        quiet: no progress lines; checkpoint: write the checkpoint after each judged chunk.
        fingerprint: what a checkpoint must match (:func:`fingerprint`).
        hooks: the testing hooks (:class:`anpred.pipeline.stream_hooks.StreamHooks`).
        manifest: the anchored model's manifest; t0: ``time.perf_counter()`` when the stream began;
            n0: samples judged before it (a resume); scratch: where the chunks live, ``memory`` or
            ``disk`` (:func:`anpred.pipeline.scratch.scratch_folder`).
    """

    anchored: Path
    out_run: Path
    side: Path
    specs: list
    chunk: int
    keep: int
    positions: int
    timeout_s: float
    side_by_side: bool
    judge: Any
    adapter: Any
    inputs_description: dict[str, Any] | None
    quiet: bool
    checkpoint: bool
    fingerprint: dict[str, Any]
    hooks: Any
    manifest: Any = None
    later: int = 0
    sampling: bool = False
    t0: float = 0.0
    n0: int = 0
    scratch: str = ""


@dataclass
class StreamState:
    """Where a streamed run stands (the fields of :data:`KEYS` are what a checkpoint keeps).

    Attributes:
        n: samples judged; sources: each sample's source (the reader thread may be ahead of ``n``);
            shas: each judged sample's input digest (:func:`anpred.run.store.sample_sha256`);
            added: the samples the task accumulator took (their labels are matched at the end).
        judge: the :class:`anpred.judge.samples.SampleJudge` (None until the first chunk is judged);
            run: its usable backends (:func:`anpred.judge.check.usable_backends`); acc: the task
            accumulator or None; final: the run folder being built (:class:`anpred.run.RunStore`).
        heaps: backend -> heap of ``(deviation, sample id)`` of its most deviating samples; kept:
            the sample ids in ``final``; max_dev: backend -> largest output deviation so far.
        statuses: the backends' statuses at the checkpoint (dicts; set by a resume).
        error: what stopped the judge or the run (re-raised in the caller's thread).
        seconds_run, seconds_judge, seconds_refill, seconds_checkpoint: wall seconds of this process.
        checkpoint_error: why a checkpoint could not be written (none written after it).
        judged_at: ``[samples judged, seconds since the stream began]`` after each chunk;
        judge_nice: the judge thread's nice value per chunk (Linux).
    """

    n: int = 0
    sources: list[str] = field(default_factory=list)
    shas: list[str] = field(default_factory=list)
    added: list[int] = field(default_factory=list)
    judge: Any = None
    run: Any = None
    acc: Any = None
    final: Any = None
    heaps: dict[str, list] = field(default_factory=dict)
    kept: dict[str, bool] = field(default_factory=dict)
    max_dev: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, dict] | None = None
    error: BaseException | None = None
    seconds_run: float = 0.0
    seconds_judge: float = 0.0
    seconds_refill: float = 0.0
    seconds_checkpoint: float = 0.0
    checkpoint_error: str | None = None
    judged_at: list[list[float]] = field(default_factory=list)
    judge_nice: list[int] = field(default_factory=list)

    def restore(self, data: dict[str, Any]) -> None:
        """Take the values of a checkpoint (:func:`load`); a value it lacks (None) keeps its default."""
        for k in KEYS:
            if data.get(k) is not None:
                setattr(self, k, data[k])


def fingerprint(anchored: str | Path, specs: list, **options: Any) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the anchored model's SHA-256, the backends
    (label, name, options) and ``options`` (JSON-able values)."""
    h = hashlib.sha256()
    with open(anchored, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {
        "model_sha256": h.hexdigest(),
        "backends": [[s.label, s.name, json.dumps(s.options, sort_keys=True, default=str)] for s in specs],
        **{k: json.loads(json.dumps(v, sort_keys=True, default=str)) for k, v in options.items()},
    }


def save(folder: Path, state: StreamState, fp: dict[str, Any]) -> str | None:
    """Write the checkpoint of ``state`` (the samples judged so far) into ``folder/state.pkl``.
    Returns None, or why it could not be written (a user's task adapter that cannot be pickled, a
    full disk): the run goes on without a newer checkpoint."""
    data = {"schema": SCHEMA, "fingerprint": fp, **{k: getattr(state, k) for k in KEYS}}
    data["sources"] = list(state.sources[: state.n])  # the reader thread may be ahead of the judge
    final = state.final  # the backends' statuses summed over the chunks judged (counts, times, failures)
    data["statuses"] = {b: st.to_dict() for b, st in final.statuses().items()} if final is not None else {}
    tmp = folder / (STATE_FILE + ".tmp")
    try:
        blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / STATE_FILE)
    except (pickle.PicklingError, TypeError, AttributeError, OSError) as err:
        tmp.unlink(missing_ok=True)
        return f"{type(err).__name__}: {err}"
    return None


def load(folder: Path, fp: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint in ``folder`` (a dict of :data:`KEYS`: :meth:`StreamState.restore`).

    Raises:
        AnpredError: no checkpoint there, an unreadable one, or one made for another run (what differs
            is named).
    """
    path = folder / STATE_FILE
    if not path.is_file():
        raise ResumeRefused(
            f"nothing to resume: no checkpoint {path} (a streamed run writes one after each chunk "
            f"it has judged; run without --resume to start over)"
        )
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is an unreadable checkpoint
        raise ResumeRefused(
            f"{path}: unreadable checkpoint ({type(err).__name__}: {err}); run without --resume to start over"
        ) from err
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResumeRefused(f"{path}: not a checkpoint of this version of anpred (schema {SCHEMA})")
    old = data.get("fingerprint", {})
    differ = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
    if differ:
        raise ResumeRefused(
            f"{path} was made for another run: {', '.join(differ)} differ; run without --resume to start over"
        )
    return {k: data.get(k) for k in KEYS}


def reconcile(final, kept: dict[str, bool], heaps: dict[str, list], statuses: dict[str, dict] | None = None) -> None:
    """Make the run folder ``final`` (a :class:`anpred.run.RunStore`) what it was at the checkpoint:
    exactly its kept samples (a sample written after it, by the chunk being judged when interrupted,
    goes; a kept sample whose files went is dropped from ``kept`` and ``heaps``) and its backends'
    ``statuses`` (sample counts and times of the chunks judged, as dicts)."""
    from anpred.backends.base import BackendStatus

    for d in (statuses or {}).values():
        final.set_status(BackendStatus.from_dict(d))
    have = {s["id"] for s in final.meta.get("samples", [])}
    for rid in sorted(have - set(kept)):
        final.remove_sample(rid)
    for rid in [r for r in kept if r not in have]:
        del kept[rid]
        for b, h in heaps.items():
            heaps[b] = [x for x in h if x[1] != rid]
    import heapq

    for h in heaps.values():
        heapq.heapify(h)
    final.save_meta()
