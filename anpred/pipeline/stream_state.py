"""Checkpoints of a streamed dataset run, to resume it after an interruption (issue 20).

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
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = ["STATE_FILE", "ResumeRefused", "fingerprint", "save", "load", "reconcile"]

STATE_FILE = "state.pkl"


class ResumeRefused(AnpredError):
    """A checkpoint that cannot be resumed (missing, unreadable, made for another run, inputs changed)."""
SCHEMA = "anpred.stream-state/1"
#: what a checkpoint keeps of the stream's state (anpred.pipeline.stream.stream_test)
KEYS = ("n", "sources", "added", "shas", "heaps", "kept", "max_dev", "judge", "acc", "run",
        "seconds_run", "seconds_judge", "statuses")


def fingerprint(anchored: str | Path, specs: list, **options: Any) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the anchored model's SHA-256, the backends
    (label, name, options) and ``options`` (JSON-able values)."""
    h = hashlib.sha256()
    with open(anchored, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"model_sha256": h.hexdigest(),
            "backends": [[s.label, s.name, json.dumps(s.options, sort_keys=True, default=str)] for s in specs],
            **{k: json.loads(json.dumps(v, sort_keys=True, default=str)) for k, v in options.items()}}


def save(folder: Path, state: dict[str, Any], fp: dict[str, Any]) -> str | None:
    """Write the checkpoint of ``state`` (the samples judged so far) into ``folder/state.pkl``.
    Returns None, or why it could not be written (a user's task adapter that cannot be pickled, a
    full disk): the run goes on without a newer checkpoint."""
    data = {"schema": SCHEMA, "fingerprint": fp, **{k: state.get(k) for k in KEYS}}
    data["sources"] = list(state["sources"][:state["n"]])  # the reader thread may be ahead of the judge
    final = state.get("final")  # the backends' statuses summed over the chunks judged (counts, times, failures)
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
    """The checkpoint in ``folder`` (a dict of :data:`KEYS`).

    Raises:
        AnpredError: no checkpoint there, an unreadable one, or one made for another run (what differs
            is named).
    """
    path = folder / STATE_FILE
    if not path.is_file():
        raise ResumeRefused(f"nothing to resume: no checkpoint {path} (a streamed run writes one after each chunk "
                          f"it has judged; run without --resume to start over)")
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is an unreadable checkpoint
        raise ResumeRefused(f"{path}: unreadable checkpoint ({type(err).__name__}: {err}); run without --resume "
                          f"to start over") from err
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResumeRefused(f"{path}: not a checkpoint of this version of anpred (schema {SCHEMA})")
    old = data.get("fingerprint", {})
    differ = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
    if differ:
        raise ResumeRefused(f"{path} was made for another run: {', '.join(differ)} differ; run without --resume "
                          f"to start over")
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
