"""Numeric diff of two run folders: did any backend's anchors move between run A and run B?
(:func:`diff_runs`, filling :class:`~anpred.diff.struct.RunDiff`)

Typical pairs: yesterday's and today's run, two library versions, the original and an optimised or
converted model. Backends are compared in pairs ``(X of run A, Y of run B)``: by default every
backend ``ok`` in both runs with itself; ``pairs={"ort": "ort-fp16"}`` (CLI ``--pair ort=ort-fp16``)
pairs different ones. Anchors are paired by name, else through the structural anchor correspondence
of the two runs' ``model.onnx`` (:func:`anpred.diff.structural.diff_files`). Only samples whose inputs are
identical in both runs (same sha256 of the input arrays) are compared.

Two comparisons, chosen by the runs' mode (``run.json`` ``"mode"``):

* **tensors** (both runs stored tensors): each run's tensors are aligned with that run's
  :class:`anpred.align.Aligner` to the canonical ONNX shape (float64) and compared with the oracle's
  statistics (:func:`anpred.judge.error_stats`, run B's tensor ``x`` against run A's ``c``). The
  statistic is ``OracleConfig.primary`` (nRMSE by default).
* **stats** (either run is a ``anpred run --mode stats`` run, which stores per-sample summaries and no
  tensors; a tensors run's side is summarised the same way from its tensors): per sample and anchor
  the summaries ``mean``, ``std``, ``rms`` (over finite elements, ``stats/<label>.samples.jsonl``,
  see :func:`anpred.run.sample_summary`) give the statistic ``nrmse_lb``::

      nrmse_lb = max(|mean_B - mean_A|, |std_B - std_A|, |rms_B - rms_A|) / rms_A

  a *lower bound* of the nRMSE ``||x - c|| / ||c||`` of the tensors that were not stored: with
  ``d = x - c`` over ``n`` elements, ``|mean d| <= rms d`` (Cauchy-Schwarz), ``|rms x - rms c| <= rms d``
  (triangle inequality in the scaled Euclidean norm) and ``|std x - std c| <= std d <= rms d`` (the same
  on the centred vectors; centring is an orthogonal projection). So ``nrmse_lb > floor`` implies
  ``nrmse > floor``: a moved verdict is never a false alarm of the summaries, but a change that keeps
  every summary (e.g. values permuted) is not seen. These summaries are layout-invariant, so no
  alignment is needed; summaries of quantized raw values (a ``dequantize`` rule) are not comparable
  and are reported as not compared. Only valid with ``primary = "nrmse"`` (the floors are nRMSE
  floors).

Per (anchor, backend pair) the worst sample (largest statistic) is kept. A cell has *moved* when its
statistic exceeds the noise floor ``OracleConfig.floor_at(precision, stage)`` of the backend's
effective precision in run B (the less precise of the two sides when their precisions differ; see
``anpred/defaults.py``), or B has more NaN/Inf than A. The *first moved anchor* is the moved anchor
earliest in topological order (``Anchor.order``, ties by stage): where the change is born.

Nothing is silently dropped: every (anchor, pair) that could not be compared carries its reason in
``AnchorDiff.missing``, anchors of one run without a counterpart are listed as unpaired, and a diff in
which no anchor at all could be compared raises :class:`JudgeError` instead of reporting "no
difference".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from anpred.diff.struct import STATS_STATISTIC, AnchorDiff, CellDiff, RunDiff
from anpred.diff.structural import diff_files
from anpred.errors import AnpredError, JudgeError

__all__ = ["diff_runs"]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _sample_keys(store) -> dict[str, str]:
    return {s["id"]: s.get("sha256", "") for s in store.meta.get("samples", [])}


def _not_ok(store, b: str, side: str) -> str:
    st = store.meta.get("backends", {}).get(b)
    if st is None:
        return f"not in run {side}"
    return f"not ok in run {side} ({st.get('status')}{': ' + st['reason'][:120] if st.get('reason') else ''})"


def _capture_reason(store, b: str, anchor: str, side: str) -> str:
    cap = (store.meta.get("backends", {}).get(b, {}).get("captures") or {}).get(anchor) or {}
    if cap.get("status") == "missing":
        return f"not captured by {b} in run {side}: {cap.get('reason') or 'missing'}"
    return f"not stored by {b} in run {side}"


def _needs_dequantize(store, b: str, anchor) -> bool:
    cap = (store.meta.get("backends", {}).get(b, {}).get("captures") or {}).get(anchor.name) or {}
    rules = [
        cap.get("transform") or {},
        (anchor.alignment or {}).get(b) or {},
        (anchor.native.get(b) or {}).get("transform") or {},
    ]
    return any("dequantize" in r for r in rules if isinstance(r, dict))


def _anchor_pairs(A, B, graph) -> tuple[list[tuple[Any, str]], list[str], list[str]]:
    """(anchor of A, name in B) for anchors both runs have, by name first, then through the
    structural correspondence ``graph.anchors`` of the runs' models; plus A's and B's unpaired names."""
    bnames = {a.name for a in B.manifest.anchors}
    pairs, todo = [], []
    for a in A.manifest.anchors:
        (pairs.append((a, a.name)) if a.name in bnames else todo.append(a))
    if todo and graph is not None:
        corr = {m.anchor: m for m in graph.anchors}
        bval = {a.value: a.name for a in B.manifest.anchors}
        taken = {n for _a, n in pairs}
        for a in list(todo):
            m = corr.get(a.name)
            if m is None or m.status == "unmapped":
                continue
            bn = m.b_value if m.b_value in bnames else bval.get(m.b_value)
            if bn is not None and bn not in taken:
                pairs.append((a, bn))
                taken.add(bn)
                todo.remove(a)
    taken = {n for _a, n in pairs}
    return pairs, [a.name for a in todo], [a.name for a in B.manifest.anchors if a.name not in taken]


def _backend_pairs(A, B, backends, pairs) -> tuple[list[tuple[str, str]], dict[str, str]]:
    ok_a, ok_b = set(A.ok_backends()), set(B.ok_backends())
    skipped: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    if pairs:
        for x, y in dict(pairs).items():
            why = [(_not_ok(A, x, "A")) if x not in ok_a else "", (_not_ok(B, y, "B")) if y not in ok_b else ""]
            why = [w for w in why if w]
            if why:
                raise JudgeError(
                    f"cannot pair {x} (run A) with {y} (run B): {x if x not in ok_a else y} "
                    f"{'; '.join(why)}; ok in A: {', '.join(sorted(ok_a)) or '(none)'}, "
                    f"ok in B: {', '.join(sorted(ok_b)) or '(none)'}"
                )
            out.append((x, y))
    if backends or not pairs:
        common = [b for b in A.ok_backends() if b in ok_b]
        if backends:
            unknown = [b for b in backends if b not in common]
            if unknown:
                reasons = "; ".join(
                    f"{b}: {_not_ok(A, b, 'A') if b not in ok_a else _not_ok(B, b, 'B')}" for b in unknown
                )
                raise JudgeError(
                    f"backend(s) not ok in both runs ({reasons}); usable: {', '.join(common) or '(none)'}"
                    " (pair different backends with --pair X=Y)"
                )
            common = [b for b in common if b in backends]
        else:
            for b in sorted(ok_a ^ ok_b):
                skipped[b] = _not_ok(A, b, "A") if b not in ok_a else _not_ok(B, b, "B")
        out += [(b, b) for b in common if (b, b) not in out]
    if not out:
        raise JudgeError(
            f"no backend is ok in both runs ({A.root}: {sorted(ok_a)}, {B.root}: {sorted(ok_b)}); "
            "pair different backends with --pair X=Y"
        )
    return out, skipped


def _label(x: str, y: str) -> str:
    return x if x == y else f"{x}={y}"


class _TensorSide:
    """One run's aligned tensors per sample (tensors mode)."""

    def __init__(self, store, side: str, backends: list[str]):
        from anpred.align import Aligner

        self.store, self.side, self.backends = store, side, sorted(set(backends))
        st = store.statuses()
        self.aligner = Aligner(store.manifest, {b: st[b] for b in self.backends})

    def sample(self, sid: str) -> tuple[dict[str, dict[str, np.ndarray]], dict[tuple[str, str], str]]:
        raw = {b: self.store.read_anchors(b, sid) for b in self.backends}
        try:
            al = self.aligner.align(sid, raw)
        except AnpredError as err:
            raise JudgeError(f"run {self.side} ({self.store.root}), sample {sid}: alignment failed: {err}") from err
        why: dict[tuple[str, str], str] = {}
        for anc in self.store.manifest.anchors:
            for b in self.backends:
                if anc.name in al.tensors and b in al.tensors[anc.name]:
                    continue
                if anc.name not in raw[b]:
                    why[(anc.name, b)] = _capture_reason(self.store, b, anc.name, self.side)
                else:
                    r = al.unaligned.get(anc.name, {}).get(b, "no alignment found")
                    why[(anc.name, b)] = f"not aligned in run {self.side}: {r}"
        return al.tensors, why


class _SummarySide:
    """One run's per-sample summaries (stats mode): read from ``stats/<label>.samples.jsonl`` of a
    stats run, or computed from the stored tensors of a tensors run."""

    def __init__(self, store, side: str, backends: list[str]):
        from anpred.run import read_stats

        self.store, self.side, self.backends = store, side, sorted(set(backends))
        self.stats_mode = store.meta.get("mode") == "stats"
        self.lines: dict[str, dict[str, dict[str, Any]]] = {}
        if self.stats_mode:
            for b in self.backends:
                read_stats(store.root, b)  # validates the schema; AnpredError names the file
                p = store.root / "stats" / f"{b}.samples.jsonl"
                try:
                    with open(p) as f:
                        for line in f:
                            if line.strip():
                                d = json.loads(line)
                                self.lines.setdefault(d["sample"], {})[b] = d["anchors"]
                except (OSError, json.JSONDecodeError, KeyError) as err:
                    raise AnpredError(f"cannot read per-sample summaries {p}: {err}") from err

    def sample(self, sid: str) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[tuple[str, str], str]]:
        from anpred.run import StreamingStats, sample_summary

        out: dict[str, dict[str, dict[str, Any]]] = {}
        why: dict[tuple[str, str], str] = {}
        for b in self.backends:
            if self.stats_mode:
                got = self.lines.get(sid, {}).get(b)
                if got is None:
                    for anc in self.store.manifest.anchors:
                        why[(anc.name, b)] = f"no summaries of sample {sid} for {b} in run {self.side}"
                    continue
            else:
                got = {
                    k: sample_summary(StreamingStats.summarize(v)) for k, v in self.store.read_anchors(b, sid).items()
                }
            for anc in self.store.manifest.anchors:
                s = got.get(anc.name)
                if s is None:
                    why[(anc.name, b)] = _capture_reason(self.store, b, anc.name, self.side)
                elif _needs_dequantize(self.store, b, anc):
                    why[(anc.name, b)] = (
                        f"{b} in run {self.side} returns quantized values (dequantize rule): "
                        "their summaries are not comparable without the tensors"
                    )
                else:
                    out.setdefault(anc.name, {})[b] = s
        return out, why


def _summary_stat(sb: dict[str, Any], sa: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """``nrmse_lb`` of summaries ``sb`` (run B) against ``sa`` (run A) and the stats dict."""
    st: dict[str, Any] = {}
    for k in ("mean", "std", "rms", "min", "max"):
        st[f"{k}_a"], st[f"{k}_b"] = sa.get(k), sb.get(k)
    st.update(nan=sb.get("nan", 0), inf=sb.get("inf", 0), nan_ref=sa.get("nan", 0), inf_ref=sa.get("inf", 0))
    if any(sa.get(k) is None or sb.get(k) is None for k in ("mean", "std", "rms")):
        return float("nan"), st  # no finite element on one side
    d = max(abs(sb["mean"] - sa["mean"]), abs(sb["std"] - sa["std"]), abs(sb["rms"] - sa["rms"]))
    st.update(d_mean=sb["mean"] - sa["mean"], d_std=sb["std"] - sa["std"], d_rms=sb["rms"] - sa["rms"])
    if d == 0.0:
        return 0.0, st
    return (d / sa["rms"] if sa["rms"] > 0 else float("inf")), st


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def diff_runs(
    run_a: str | Path,
    run_b: str | Path,
    *,
    config=None,
    backends: list[str] | None = None,
    pairs: dict[str, str] | list[tuple[str, str]] | None = None,
    with_graph: bool = True,
) -> RunDiff:
    """Compare run folder ``run_b`` against ``run_a`` anchor by anchor (see the module docstring).

    Args:
        run_a, run_b: run folders (``anpred run`` output, mode ``tensors`` or ``stats``).
        config: an :class:`anpred.defaults.OracleConfig` (None: defaults).
        backends: compare these backends, each with itself (default: all ``ok`` in both runs, unless
            ``pairs`` is given).
        pairs: backend of A -> backend of B to compare with each other (e.g. ``{"ort": "ort-fp16"}``);
            with ``pairs`` alone only those pairs are compared.
        with_graph: also keep the structural diff of the runs' ``model.onnx`` (it is computed anyway
            when anchors must be paired through it).

    Raises:
        AnpredError: a folder is not a run, or its summaries are unreadable.
        JudgeError: a requested backend (pair) is not ok in a run; no backend ok in both; no sample
            with identical inputs in both; stats mode with a primary statistic other than nRMSE;
            alignment failed; or no (anchor, backend) cell could be compared at all (the message gives
            the reasons).
    """
    from anpred.defaults import OracleConfig
    from anpred.run import RunStore

    cfg = config or OracleConfig()
    A, B = RunStore.open(run_a), RunStore.open(run_b)
    sa, sb = A.statuses(), B.statuses()
    bpairs, skipped = _backend_pairs(A, B, backends, pairs)
    mode = "stats" if "stats" in (A.meta.get("mode"), B.meta.get("mode")) else "tensors"
    if mode == "stats" and cfg.primary != "nrmse":
        raise JudgeError(
            f"stats-mode runs are compared by a lower bound of the nRMSE (no tensors stored); "
            f"the configured primary statistic is {cfg.primary!r}: use primary = \"nrmse\" "
            "or rerun with --mode tensors"
        )
    statistic = STATS_STATISTIC if mode == "stats" else cfg.primary
    samples = _shared_samples(A, B)
    graph = None
    need = with_graph or not {a.name for a in A.manifest.anchors} <= {a.name for a in B.manifest.anchors}
    if need and (A.root / "model.onnx").is_file() and (B.root / "model.onnx").is_file():
        graph = diff_files(A.root / "model.onnx", B.root / "model.onnx")
    apairs, unpaired, unpaired_b = _anchor_pairs(A, B, graph)
    Side = _SummarySide if mode == "stats" else _TensorSide
    side_a = Side(A, "A", [x for x, _ in bpairs])
    side_b = Side(B, "B", [y for _, y in bpairs])
    worst, missing = _worst_per_cell(samples, side_a, side_b, apairs, bpairs, mode == "stats", cfg.primary)
    anchors_out, first, first_by, stage_dev = _anchor_diffs(apairs, bpairs, worst, missing, cfg, (sa, sb), statistic)
    labels = [_label(x, y) for x, y in bpairs]
    rd = RunDiff(
        str(run_a),
        str(run_b),
        statistic,
        labels,
        samples,
        anchors_out,
        first,
        first_by,
        {k: float(v) for k, v in stage_dev.items()},
        skipped,
        unpaired,
        graph if with_graph else None,
        mode,
        [[x, y] for x, y in bpairs],
        unpaired_b,
    )
    if rd.compared == 0:
        nc = rd.not_compared()
        reasons = "; ".join(f"{a} on {b}: {why}" for a, b, why in nc[:3]) or "no anchor of A has a counterpart in B"
        raise JudgeError(
            f"no anchor could be compared between the runs ({len(apairs)} paired anchor(s), "
            f"{len(unpaired)} of A unpaired, {len(nc)} cell(s) not compared: {reasons}"
            f"{' ...' if len(nc) > 3 else ''}); nothing was compared, so no verdict"
        )
    return rd


def _shared_samples(A, B) -> list[list[str]]:
    """``[[sample id in A, sample id in B]]`` of the samples with identical inputs (sha256 of the input
    arrays) in both runs.

    Raises:
        JudgeError: none.
    """
    ka, kb = _sample_keys(A), _sample_keys(B)
    by_hash: dict[str, str] = {}
    for sid, h in kb.items():
        by_hash.setdefault(h, sid)
    samples = [[sid, by_hash[h]] for sid, h in ka.items() if h and h in by_hash]
    if not samples:
        raise JudgeError(
            "the runs share no sample with identical inputs (sha256 of the input arrays); "
            "run both on the same inputs (anpred run --inputs ...)"
        )
    return samples


def _worst_per_cell(samples, side_a, side_b, apairs, bpairs, stats_mode: bool, primary: str):
    """``(worst, missing)`` over the shared ``samples``: (anchor, pair label) -> ``(value, sample id of A,
    statistics, samples compared)`` of the sample where B deviates most from A (a sample with new NaN/Inf
    first), and anchor -> pair label -> why it was not compared. ``stats_mode``: the runs' summaries
    (:data:`STATS_STATISTIC`), else the tensors' ``primary`` statistic."""
    from anpred.judge import error_stats

    worst: dict[tuple[str, str], tuple[float, str, Any, int]] = {}
    missing: dict[str, dict[str, str]] = {}
    for sid_a, sid_b in samples:
        ta, why_a = side_a.sample(sid_a)
        tb, why_b = side_b.sample(sid_b)
        for anc, bname in apairs:
            for x, y in bpairs:
                lab = _label(x, y)
                xa, xb = ta.get(anc.name, {}).get(x), tb.get(bname, {}).get(y)
                if xa is None or xb is None:
                    why = why_a.get((anc.name, x)) if xa is None else why_b.get((bname, y))
                    missing.setdefault(anc.name, {})[lab] = why or "not available"
                    continue
                if stats_mode:
                    v, st = _summary_stat(xb, xa)
                    bad, bad_ref = st["nan"] + st["inf"], st["nan_ref"] + st["inf_ref"]
                else:
                    if xa.shape != xb.shape:
                        missing.setdefault(anc.name, {})[lab] = f"shapes differ: {list(xa.shape)} vs {list(xb.shape)}"
                        continue
                    st = error_stats(xb, xa, dtype="float32")
                    v = getattr(st, primary)
                    bad, bad_ref = st.nan + st.inf, st.nan_ref + st.inf_ref
                    st = st.to_dict()
                key = (anc.name, lab)
                prev = worst.get(key)
                n = (prev[3] if prev else 0) + 1
                if prev is None or _gt(v, prev[0]) or (bad > bad_ref and prev[2]["_bad"] <= prev[2]["_bad_ref"]):
                    worst[key] = (v, sid_a, {**st, "_bad": bad, "_bad_ref": bad_ref}, n)
                else:
                    worst[key] = (*prev[:3], n)
    return worst, missing


def _anchor_diffs(apairs, bpairs, worst, missing, cfg, statuses, statistic: str):
    """``(anchor diffs, first, first_by, stage deviation)``: each paired anchor's cells in graph order,
    a cell moved when its worst value is above the floor of the pair's precisions (``statuses``: the
    runs' backend statuses, A's and B's) or it has new NaN/Inf; the first moved cell, the first moved
    anchor per pair label, and the largest value per stage."""
    sa, sb = statuses
    anchors_out: list[AnchorDiff] = []
    stage_dev: dict[str, float] = {}
    first: dict[str, Any] | None = None
    first_by: dict[str, str] = {}
    for anc, bname in sorted(apairs, key=lambda p: (p[0].order, p[0].stage)):
        ad = AnchorDiff(anc.name, bname, anc.stage, anc.order, missing=missing.get(anc.name, {}))
        for x, y in bpairs:
            lab = _label(x, y)
            w = worst.get((anc.name, lab))
            if w is None:
                continue
            ad.missing.pop(lab, None)  # compared on some sample: the cell stands
            v, sid, st, n = w
            bad, bad_ref = st.pop("_bad"), st.pop("_bad_ref")
            floor = max(cfg.floor_at(sa[x].precision, anc.stage), cfg.floor_at(sb[y].precision, anc.stage))
            moved = bool(_gt(v, floor)) or bad > bad_ref
            ad.cells.append(CellDiff(lab, float(v), floor, moved, n, sid, st))
            key = str(anc.stage)
            if not math.isnan(v):
                stage_dev[key] = max(stage_dev.get(key, 0.0), v)
            if moved:
                first_by.setdefault(lab, anc.name)
                if first is None:
                    first = {
                        "anchor": anc.name,
                        "backend": lab,
                        "stage": anc.stage,
                        "value": float(v),
                        "floor": floor,
                        "statistic": statistic,
                    }
        anchors_out.append(ad)
    return anchors_out, first, first_by, stage_dev


def _gt(a: float, b: float) -> bool:
    if math.isnan(a):
        return False
    return a > b if not math.isnan(b) else True
