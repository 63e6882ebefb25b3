"""The consensus tensors of a run, sample by sample: what the drill-down feeds a stage or an operator.

The consensus is the one the oracle judges against (:meth:`anpred.judge.consensus.Oracle.consensus`:
the element-wise median of the fp32 family votes, bit-identical families merged, non-finite values
voted on; fewer than ``min_voters`` families: the reference backend's tensor), over the tensors the
run stored, aligned to the canonical (ONNX) layout (:class:`anpred.align.Aligner`). Only fp32 voters
vote; a backend named in ``exclude`` (the one being drilled) never does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from anpred.tensorfile import c_contiguous

__all__ = ["consensus_samples", "backend_samples"]


def _judging(run_dir: str | Path, config=None):
    from anpred.judge.check import usable_backends

    return usable_backends(run_dir, config=config, allow_incomplete=True)


def consensus_samples(
    run_dir: str | Path,
    anchors: list[str],
    *,
    exclude: tuple[str, ...] = (),
    samples: list[str] | None = None,
    config=None,
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """Yield ``(sample id, {anchor: consensus array})`` for ``anchors`` (manifest anchor names) of the
    run in ``run_dir``, over ``samples`` (default: all). An anchor without a consensus in a sample
    (no voter stored it) is left out of that sample's dict. Arrays have the canonical shape and the
    dtype of the votes (float32 for an fp32 run; integer anchors: the voters' common value).

    Raises:
        AnpredError: not a readable run folder; JudgeError: an unreadable tensor file.
    """
    from anpred.judge.consensus import Oracle
    from anpred.judge.samples import aligned_sample, run_aligner, judged_anchors
    from anpred.judge.struct import BackendInfo

    run = _judging(run_dir, config)
    store, rep, cfg = run.store, run.report, run.config
    voters = [b for b in run.usable if b not in exclude and rep.backends[b]["precision"] == "fp32"]
    binfos = [BackendInfo.make(b, rep.backends[b]["family"], "fp32", cfg) for b in voters]
    orc = Oracle(judged_anchors(store.manifest, []), binfos, cfg)
    aligner = run_aligner(store, voters)
    names = set(store.manifest.names())
    want = [a for a in anchors if a in names]
    dtypes = {a.name: a.dtype for a in store.manifest.anchors}
    for sid in samples if samples is not None else store.sample_ids:
        tensors, _, _ = aligned_sample(store, aligner, voters, sid, names, [])
        out: dict[str, np.ndarray] = {}
        for a in want:
            per = {b: t for b, t in tensors.get(a, {}).items() if b in voters}
            if not per:
                continue
            if not all(np.issubdtype(t.dtype, np.floating) for t in per.values()):
                out[a] = next(iter(per.values()))  # integer tensors: exact, any voter's
                continue
            c, _, _ = orc.consensus(per)
            if c is not None:  # in the model's dtype (the aligner and the median work in float64)
                dt = np.dtype(dtypes.get(a) or next(iter(per.values())).dtype)
                out[a] = c_contiguous(c.astype(dt, copy=False))
        yield sid, out


def backend_samples(
    run_dir: str | Path, backend: str, anchors: list[str], samples: list[str] | None = None
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """Yield ``(sample id, {anchor: array})``: ``backend``'s own stored tensors, aligned."""
    from anpred.judge.samples import aligned_sample, run_aligner

    run = _judging(run_dir)
    store = run.store
    aligner = run_aligner(store, [backend])
    names = set(store.manifest.names())
    for sid in samples if samples is not None else store.sample_ids:
        tensors, _, _ = aligned_sample(store, aligner, [backend], sid, names, [])
        yield sid, {a: tensors[a][backend] for a in anchors if backend in tensors.get(a, {})}
