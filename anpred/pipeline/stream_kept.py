"""The samples a streamed run keeps (:mod:`anpred.pipeline.stream`): each backend's most deviating
samples, by the nRMSE of its outputs against the consensus', with every backend's tensors for them, in
the run folder being built; the backends' statuses summed over the chunks; the positions each worker
stores once the first chunk has fixed the alignment; the kept samples run once more in full at the end.
"""

from __future__ import annotations

import heapq
import math
import os
import shutil
from pathlib import Path

import numpy as np

__all__ = ["output_deviation", "keep_samples", "gather_files", "refill_kept"]


def output_deviation(outs: list[str], last: dict[tuple[str, str], tuple[float, int]]) -> dict[str, float]:
    """backend -> sum over the output anchors of its nRMSE against the consensus in the sample just
    judged (``last``: :attr:`anpred.judge.consensus.Oracle.last_nrmse`; 0 where it is the consensus,
    inf where it has NaN/Inf where the consensus is finite)."""
    dev: dict[str, float] = {}
    for (a, b), (nrmse, nonfinite) in last.items():
        if a in outs:
            dev[b] = float("inf") if nonfinite else dev.get(b, 0.0) + (nrmse if math.isfinite(nrmse) else float("inf"))
    return dev


def keep_samples(state, store, ids: dict[str, str], devs: dict[str, dict[str, float]], keep: int) -> None:
    """Keep each backend's ``keep`` most deviating samples so far in ``state.final`` (``state``: the
    :class:`anpred.pipeline.stream_state.StreamState`; every
    backend's tensors of a kept sample), dropping the ones pushed out."""
    final = state.final
    want: set[str] = set()
    for rid, per in devs.items():
        for b, d in per.items():
            h = state.heaps.setdefault(b, [])
            if len(h) < keep:
                heapq.heappush(h, (d, rid))
            elif keep and d > h[0][0]:
                heapq.heapreplace(h, (d, rid))
    kept_now = {r for h in state.heaps.values() for _, r in h}
    inv = {v: k for k, v in ids.items()}
    for rid in sorted(kept_now):
        if rid in inv and rid not in state.kept:
            sid = inv[rid]
            # its files are moved from the chunk's run (deleted once judged), not read and written again
            final.adopt_sample(rid, store, sid, source=state.sources[int(rid[1:])])
            state.kept[rid] = True
            want.add(rid)
    for rid in [r for r in state.kept if r not in kept_now]:  # pushed out: its files go
        final.remove_sample(rid)
        del state.kept[rid]
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
                reason = reason.replace(f"sample {local}:", f"sample {glob}:")
                reason = reason.replace(f"sample {local} ", f"sample {glob} ")
            st.reason = f"chunk of samples {min(ids.values())}..{max(ids.values())}: {reason}"
        final.set_status(st)
    final.save_meta()


def gather_files(judge, folder: Path) -> dict[str, Path]:
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


def refill_kept(final, anchored, specs: list, pool, folder: Path, timeout_s: float) -> None:
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
    store = run_model(
        anchored,
        specs,
        part,
        folder / "run",
        timeout_s=timeout_s,
        overwrite=True,
        progress=False,
        precheck=False,
        pool=pool,
    )
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
