"""Numeric diff of two run folders: did any backend's anchors move between run A and run B?

Typical pairs: yesterday's and today's run, two library versions, the original and an optimised or
converted model. For every backend that is ``ok`` in both runs and every anchor present in both (by
name; else through the structural anchor correspondence of the two runs' ``model.onnx``), the tensors
of the samples whose inputs are identical in both runs (same sha256 of the input arrays) are aligned
with each run's :class:`anpred.align.Aligner` to the canonical ONNX shape and compared with the
oracle's statistics (:func:`anpred.stats.error_stats`, run B's tensor ``x`` against run A's ``c``).

Per (anchor, backend) the worst sample (largest primary statistic) is kept. A cell has *moved* when
its primary statistic (``OracleConfig.primary``, nRMSE by default) exceeds the noise floor
``OracleConfig.floor_at(precision, stage)`` of the backend's effective precision in run B (see
``anpred/defaults.py``). The *first moved anchor* is the moved anchor earliest in topological order
(``Anchor.order``, ties by stage): where the change between the runs is born.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import AnpredError, JudgeError

SCHEMA = "anpred.rundiff/1"


@dataclass
class CellDiff:
    """One (anchor, backend): run B's tensor against run A's, worst sample.

    stats: :meth:`anpred.stats.ErrorStats.to_dict` of the worst sample; value: its primary statistic;
    floor: the noise floor it is compared with; moved: ``value > floor`` (NaN/Inf counts > 0 in B
    and not in A also count as moved); samples: paired samples compared; worst_sample: its id in A.
    """

    backend: str
    value: float
    floor: float
    moved: bool
    samples: int
    worst_sample: str
    stats: dict[str, Any]


@dataclass
class AnchorDiff:
    anchor: str
    b_anchor: str
    stage: int
    order: int
    cells: list[CellDiff] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # backend -> why not compared

    @property
    def moved(self) -> bool:
        return any(c.moved for c in self.cells)


@dataclass
class RunDiff:
    """Numeric diff of run B against run A (schema ``anpred.rundiff/1``).

    first_moved: ``{"anchor", "backend", "stage", "value", "floor", "statistic"}`` of the earliest
    moved cell, None when nothing moved. stage_deviation: per stage (string key), the largest primary
    statistic over its anchors and backends. graph: the structural diff of the runs' models when both
    folders hold one.
    """

    run_a: str
    run_b: str
    statistic: str
    backends: list[str]
    samples: list[list[str]]  # [[sample id in A, sample id in B], ...]
    anchors: list[AnchorDiff]
    first_moved: dict[str, Any] | None
    first_moved_by_backend: dict[str, str]
    stage_deviation: dict[str, float]
    skipped_backends: dict[str, str] = field(default_factory=dict)
    unpaired_anchors: list[str] = field(default_factory=list)
    graph: Any = None  # GraphDiff | None
    schema: str = SCHEMA

    @property
    def moved(self) -> bool:
        return self.first_moved is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["graph"] = self.graph.to_dict() if self.graph is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunDiff":
        from anpred.graphdiff import GraphDiff

        if d.get("schema") != SCHEMA:
            raise AnpredError(f"unsupported run diff schema {d.get('schema')!r} (expected {SCHEMA!r})")
        try:
            anchors = [AnchorDiff(**{**a, "cells": [CellDiff(**c) for c in a["cells"]]}) for a in d["anchors"]]
            return cls(**{**d, "anchors": anchors,
                          "graph": GraphDiff.from_dict(d["graph"]) if d.get("graph") else None})
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed run diff: {err}") from err

    def summary(self, max_lines: int = 30) -> str:
        L = [f"A: {self.run_a}", f"B: {self.run_b}",
             f"{len(self.samples)} paired sample(s), backends: {', '.join(self.backends) or '(none)'}; "
             f"statistic {self.statistic} (B against A) vs the noise floor"]
        for b, why in self.skipped_backends.items():
            L.append(f"  skipped {b}: {why}")
        if self.first_moved:
            f = self.first_moved
            L.append(f"first moved anchor: {f['anchor']} (stage {f['stage']}) on {f['backend']}: "
                     f"{self.statistic} {f['value']:.3g} > floor {f['floor']:.3g}")
            for b, a in self.first_moved_by_backend.items():
                L.append(f"  {b}: first moved at {a}")
        else:
            L.append("no anchor moved beyond the noise floor")
        L.append("stage  max " + self.statistic)
        for s, v in sorted(self.stage_deviation.items(), key=lambda kv: int(kv[0])):
            L.append(f"  {int(s):3d}  {v:.3g}")
        if self.graph is not None and not self.graph.identical:
            L.append("models differ structurally:")
            L.extend("  " + x for x in self.graph.summary(10).splitlines()[2:])
        return "\n".join(L[: max_lines + 10])


def _sample_keys(store) -> dict[str, str]:
    return {s["id"]: s.get("sha256", "") for s in store.meta.get("samples", [])}


def _aligned(store, aligner, sid: str, backends: list[str]) -> dict[str, dict[str, np.ndarray]]:
    raw = {b: store.read_anchors(b, sid) for b in backends}
    if aligner is not None:
        try:
            return aligner.align(sid, raw).tensors
        except AnpredError:
            pass
    out: dict[str, dict[str, np.ndarray]] = {}
    for b, anchors in raw.items():
        for name, arr in anchors.items():
            out.setdefault(name, {})[b] = np.asarray(arr, dtype=np.float64)
    return out


def _anchor_pairs(A, B) -> tuple[list[tuple[Any, str]], list[str]]:
    """(anchor of A, name in B) for anchors both runs have; by name first, then via the structural
    correspondence of the runs' models."""
    bnames = {a.name for a in B.manifest.anchors}
    pairs, missing = [], []
    todo = []
    for a in A.manifest.anchors:
        if a.name in bnames:
            pairs.append((a, a.name))
        else:
            todo.append(a)
    if todo and (A.root / "model.onnx").is_file() and (B.root / "model.onnx").is_file():
        from anpred.graphdiff import diff_files

        corr = {m.anchor: m for m in diff_files(A.root / "model.onnx", B.root / "model.onnx").anchors}
        bval = {a.value: a.name for a in B.manifest.anchors}
        for a in list(todo):
            m = corr.get(a.name)
            if m is not None and m.status != "unmapped" and m.b_value in bval:
                pairs.append((a, bval[m.b_value]))
                todo.remove(a)
    missing = [a.name for a in todo]
    return pairs, missing


def diff_runs(run_a: str | Path, run_b: str | Path, *, config=None, backends: list[str] | None = None,
              with_graph: bool = True) -> RunDiff:
    """Compare run folder ``run_b`` against ``run_a`` anchor by anchor (see the module docstring).

    Args:
        run_a, run_b: run folders (``anpred run`` output).
        config: an :class:`anpred.defaults.OracleConfig` (None: defaults).
        backends: restrict to these backends (default: those ``ok`` in both runs).
        with_graph: also diff the runs' ``model.onnx`` structurally when both exist.

    Raises:
        AnpredError: a folder is not a run.
        JudgeError: no backend ok in both runs, or no sample with identical inputs in both.
    """
    from anpred.defaults import OracleConfig
    from anpred.runstore import RunStore
    from anpred.stats import error_stats

    cfg = config or OracleConfig()
    A, B = RunStore.open(run_a), RunStore.open(run_b)
    sa, sb = A.statuses(), B.statuses()
    ok_a, ok_b = set(A.ok_backends()), set(B.ok_backends())
    skipped = {b: f"not ok in run {'A' if b not in ok_a else 'B'}" for b in sorted(ok_a ^ ok_b)}
    common = [b for b in A.ok_backends() if b in ok_b]
    if backends:
        unknown = [b for b in backends if b not in common]
        if unknown:
            raise JudgeError(f"backend(s) {', '.join(unknown)} not ok in both runs; usable: {', '.join(common) or '(none)'}")
        common = [b for b in common if b in backends]
    if not common:
        raise JudgeError(f"no backend is ok in both runs ({run_a}: {sorted(ok_a)}, {run_b}: {sorted(ok_b)})")
    ka, kb = _sample_keys(A), _sample_keys(B)
    by_hash = {}
    for sid, h in kb.items():
        by_hash.setdefault(h, sid)
    samples = [[sid, by_hash[h]] for sid, h in ka.items() if h and h in by_hash]
    if not samples:
        raise JudgeError("the runs share no sample with identical inputs (sha256 of the input arrays); "
                         "run both on the same inputs (anpred run --inputs ...)")
    pairs, unpaired = _anchor_pairs(A, B)
    try:
        from anpred.align import Aligner

        al_a, al_b = Aligner(A.manifest, sa), Aligner(B.manifest, sb)
    except Exception:  # alignment unavailable: compare as stored
        al_a = al_b = None
    worst: dict[tuple[str, str], tuple[float, str, Any, int]] = {}
    missing: dict[str, dict[str, str]] = {}
    for sid_a, sid_b in samples:
        ta, tb = _aligned(A, al_a, sid_a, common), _aligned(B, al_b, sid_b, common)
        for anc, bname in pairs:
            for be in common:
                xa, xb = ta.get(anc.name, {}).get(be), tb.get(bname, {}).get(be)
                if xa is None or xb is None:
                    missing.setdefault(anc.name, {})[be] = f"not aligned in run {'A' if xa is None else 'B'}"
                    continue
                if xa.shape != xb.shape:
                    missing.setdefault(anc.name, {})[be] = f"shapes differ: {list(xa.shape)} vs {list(xb.shape)}"
                    continue
                st = error_stats(xb, xa, dtype="float32")
                v = getattr(st, cfg.primary)
                key = (anc.name, be)
                prev = worst.get(key)
                n = (prev[3] if prev else 0) + 1
                if prev is None or _gt(v, prev[0]) or (st.nan + st.inf > 0 and prev[2].nan + prev[2].inf == 0):
                    worst[key] = (v, sid_a, st, n)
                else:
                    worst[key] = (*prev[:3], n)
    anchors_out: list[AnchorDiff] = []
    stage_dev: dict[str, float] = {}
    first: dict[str, Any] | None = None
    first_by: dict[str, str] = {}
    for anc, bname in sorted(pairs, key=lambda p: (p[0].order, p[0].stage)):
        ad = AnchorDiff(anc.name, bname, anc.stage, anc.order, missing=missing.get(anc.name, {}))
        for be in common:
            w = worst.get((anc.name, be))
            if w is None:
                continue
            ad.missing.pop(be, None)
            v, sid, st, n = w
            prec = sb[be].precision if be in sb else "fp32"
            floor = cfg.floor_at(prec, anc.stage)
            moved = bool(_gt(v, floor)) or st.nan + st.inf > st.nan_ref + st.inf_ref
            ad.cells.append(CellDiff(be, _num(v), floor, moved, n, sid, st.to_dict()))
            key = str(anc.stage)
            if math.isfinite(v) or math.isinf(v):
                stage_dev[key] = max(stage_dev.get(key, 0.0), v if not math.isnan(v) else 0.0)
            if moved:
                first_by.setdefault(be, anc.name)
                if first is None:
                    first = {"anchor": anc.name, "backend": be, "stage": anc.stage, "value": _num(v),
                             "floor": floor, "statistic": cfg.primary}
        anchors_out.append(ad)
    graph = None
    if with_graph and (A.root / "model.onnx").is_file() and (B.root / "model.onnx").is_file():
        from anpred.graphdiff import diff_files

        graph = diff_files(A.root / "model.onnx", B.root / "model.onnx")
    return RunDiff(str(run_a), str(run_b), cfg.primary, common, samples, anchors_out, first, first_by,
                   {k: _num(v) for k, v in stage_dev.items()}, skipped, unpaired, graph)


def _gt(a: float, b: float) -> bool:
    if math.isnan(a):
        return False
    return a > b if not math.isnan(b) else True


def _num(v: float) -> float:
    return float(v) if math.isfinite(v) else (float("inf") if v > 0 else float("-inf")) if not math.isnan(v) else float("nan")
