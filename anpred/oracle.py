"""The consensus population-deviation oracle, localization, propagation and the threshold baseline.

Streaming: :class:`Oracle` receives one aligned sample at a time (``{anchor: {backend: float64
array}}``, canonical ONNX shape) and keeps, per (anchor, backend), a few sums, the per-sample primary
statistic and a bounded reservoir of values for plots; nothing else survives a sample.

Per sample and anchor (formulas and defaults: ``docs/oracle.md``, :mod:`anpred.defaults`):

1. **Consensus** ``c``: voting backends (fp32, not a reduced-precision variant) are grouped into
   families; a family's vote is the element-wise median of its members; ``c`` is the element-wise
   median (NaN-ignoring) of the family votes when at least ``min_voters`` families voted, else the
   tensor of one named reference backend (which is then not judged at that anchor).
2. Each backend's deviation from ``c`` (:func:`anpred.stats.error_stats`), accumulated over samples.

After the last sample, per (anchor, backend), the pooled primary statistic ``S`` (nRMSE over the
whole population: ``sqrt(sum_s ||x_s - c_s||^2 / sum_s ||c_s||^2)``) is compared with its peers
(judged backends of *other* families that vote): **flagged** when ``S > k * median(S_peers)`` and
``S > floor(precision, stage)``, or when the backend produced NaN/Inf where the consensus is finite.
Without peers the floor alone decides. The **origin** is the first flagged anchor in manifest
(topological) order; the **propagation** profile gives the ratio of ``S`` between consecutive judged
anchors.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig
from anpred.stats import ErrorStats, _from_json_float, _json_float, error_stats


# ------------------------------------------------------------------------------------------------
# description of what is judged
@dataclass
class BackendInfo:
    """A backend as the oracle sees it: family (one vote), precision (floor), whether it votes."""

    name: str
    family: str
    precision: str = "fp32"
    votes: bool = True

    @classmethod
    def make(cls, name: str, family: str | None = None, precision: str | None = None,
             config: OracleConfig | None = None) -> "BackendInfo":
        cfg = config or OracleConfig()
        fam = cfg.families.get(name) or family or name
        reduced = cfg.reduced_precision.get(name)
        prec = reduced or (precision or "fp32")
        if prec not in cfg.floor:
            prec = "fp32"
        return cls(name=name, family=fam, precision=prec, votes=(reduced is None and prec == "fp32"))


@dataclass
class AnchorInfo:
    """An anchor in manifest (topological) order."""

    name: str
    stage: int
    kind: str = "boundary"
    op_type: str = ""
    dtype: str = "float32"


# ------------------------------------------------------------------------------------------------
# results
@dataclass
class Cell:
    """The verdict of one backend at one anchor, over the whole population of inputs.

    ``stats`` are pooled over samples (nRMSE, SNR and cosine from pooled sums; max_abs, max_ulp maxima;
    mean_abs, mean_signed over all elements; wasserstein the mean of per-sample values). ``per_sample``
    holds the primary statistic's median, 90th percentile and maximum over samples. ``primary`` is the
    pooled primary statistic; ``peer_level`` the median of peers' (None: no peers), ``threshold``
    ``max(k * peer_level, floor)`` (the floor alone without peers).
    """

    anchor: str
    backend: str
    samples: int
    stats: ErrorStats
    primary: float
    per_sample: dict[str, float]
    floor: float
    peer_level: float | None
    threshold: float
    nonfinite: int
    flagged: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stats"] = self.stats.to_dict()
        for k in ("primary", "floor", "peer_level", "threshold"):
            d[k] = _json_float(d[k])
        d["per_sample"] = {k: _json_float(v) for k, v in self.per_sample.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cell":
        d = dict(d)
        d["stats"] = ErrorStats.from_dict(d["stats"])
        for k in ("primary", "floor", "peer_level", "threshold"):
            d[k] = _from_json_float(d[k])
        d["per_sample"] = {k: _from_json_float(v) for k, v in d["per_sample"].items()}
        return cls(**d)


@dataclass
class Step:
    """Propagation from one judged anchor to the next: ``ratio = S(to) / S(from)`` (None when S(from)
    is 0), ``kind`` amplified | attenuated | stable | appeared | vanished | clean."""

    src: str
    dst: str
    ratio: float | None
    kind: str


@dataclass
class BackendVerdict:
    """Per backend: verdict, origin, worst anchor and propagation (see module docstring)."""

    backend: str
    family: str
    precision: str
    votes: bool
    flagged: bool
    origin_anchor: str | None = None
    origin_stage: int | None = None
    worst_anchor: str | None = None
    worst_primary: float | None = None
    worst_ratio_to_threshold: float | None = None
    flagged_anchors: list[str] = field(default_factory=list)
    output_flagged: bool = False
    propagation: str = "none"  # none | amplified | attenuated | stable | masked
    non_monotonic: bool = False
    steps: list[Step] = field(default_factory=list)
    judged_anchors: int = 0
    unjudged: dict[str, str] = field(default_factory=dict)  # anchor -> reason

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("worst_primary", "worst_ratio_to_threshold"):
            d[k] = _json_float(d[k])
        d["steps"] = [{**asdict(s), "ratio": _json_float(s.ratio)} for s in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BackendVerdict":
        d = dict(d)
        d["steps"] = [Step(**{**s, "ratio": _from_json_float(s["ratio"])}) for s in d.get("steps", [])]
        for k in ("worst_primary", "worst_ratio_to_threshold"):
            d[k] = _from_json_float(d[k])
        return cls(**d)


@dataclass
class ThresholdResult:
    """Polygraphy-style element-wise check of one backend's final outputs against one reference.

    An element fails when ``|x - r| > atol`` *and* ``|x - r| / |r| > rtol`` (Polygraphy's ``simple``
    compare function, ``check_error_stat="elemwise"``); NaN/Inf where the reference is finite fail.
    """

    backend: str
    reference: str
    atol: float
    rtol: float
    passed: bool
    failed_elements: int
    total_elements: int
    max_abs: float
    max_rel: float
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_abs"], d["max_rel"] = _json_float(self.max_abs), _json_float(self.max_rel)
        d["outputs"] = {k: {kk: _json_float(vv) for kk, vv in v.items()} for k, v in self.outputs.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ThresholdResult":
        d = dict(d)
        d["max_abs"], d["max_rel"] = _from_json_float(d["max_abs"]), _from_json_float(d["max_rel"])
        d["outputs"] = {k: {kk: _from_json_float(vv) for kk, vv in v.items()} for k, v in d["outputs"].items()}
        return cls(**d)


@dataclass
class OracleResult:
    """Everything the oracle decided. ``plot_data[(anchor, backend)]`` holds reservoirs ``err``, ``x``,
    ``c`` (float64 1-D) for the HTML report; it is not serialised."""

    cells: list[Cell]
    verdicts: dict[str, BackendVerdict]
    consensus: dict[str, Any]
    unjudged_anchors: dict[str, str]
    notes: list[str]
    plot_data: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict, repr=False)


# ------------------------------------------------------------------------------------------------
# accumulators
class _Reservoir:
    """An approximately uniform sample of at most ``size`` values of a stream of arrays: each merge
    keeps old and new values in proportion to how many each stands for."""

    def __init__(self, size: int, rng: np.random.Generator):
        self.size, self.rng, self.seen = size, rng, 0
        self.data: dict[str, np.ndarray] = {}

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        n = next(iter(arrays.values())).size
        if n == 0 or self.size <= 0:
            return
        take = min(n, self.size)
        idx = self.rng.choice(n, take, replace=False) if take < n else np.arange(n)
        new = {k: v[idx] for k, v in arrays.items()}
        if not self.data:
            self.data, self.seen = new, n
            return
        total = self.seen + n
        keep_old = min(len(next(iter(self.data.values()))), round(self.size * self.seen / total))
        keep_new = min(take, self.size - keep_old)
        io = self.rng.choice(len(next(iter(self.data.values()))), keep_old, replace=False)
        inew = self.rng.choice(take, keep_new, replace=False)
        self.data = {k: np.concatenate([self.data[k][io], new[k][inew]]) for k in self.data}
        self.seen = total


class _Acc:
    """Small per-(anchor, backend) accumulator: pooled sums, maxima, per-sample primary values."""

    def __init__(self, primary: str, reservoir: _Reservoir):
        self.primary = primary
        self.samples = 0
        self.n = 0
        self.dd = self.cc = self.xx = self.xc = 0.0
        self.sum_abs = self.sum_signed = 0.0
        self.max_abs = 0.0
        self.max_ulp = 0.0
        self.w = []
        self.per_sample: list[float] = []
        self.nan = self.inf = self.nan_ref = self.inf_ref = 0
        self.nonfinite = 0
        self.res = reservoir

    def add(self, x: np.ndarray, c: np.ndarray, dtype: str) -> None:
        s = error_stats(x, c, dtype)
        self.samples += 1
        self.nan += s.nan
        self.inf += s.inf
        self.nan_ref += s.nan_ref
        self.inf_ref += s.inf_ref
        cf = np.isfinite(c)
        self.nonfinite += int(np.count_nonzero(~np.isfinite(x) & cf))
        if s.n == 0:
            return
        ok = np.isfinite(x) & cf
        xo, co = (x, c) if ok.all() else (x[ok], c[ok])
        xo, co = xo.ravel(), co.ravel()
        d = xo - co
        self.n += s.n
        self.dd += float(d @ d)
        self.cc += float(co @ co)
        self.xx += float(xo @ xo)
        self.xc += float(xo @ co)
        self.sum_abs += s.mean_abs * s.n
        self.sum_signed += s.mean_signed * s.n
        self.max_abs = max(self.max_abs, s.max_abs)
        self.max_ulp = max(self.max_ulp, s.max_ulp)
        self.w.append(s.wasserstein)
        self.per_sample.append(float(getattr(s, self.primary)))
        self.res.add({"err": d, "x": xo, "c": co})

    def pooled(self) -> ErrorStats:
        nan = float("nan")
        counts = dict(nan=self.nan, inf=self.inf, nan_ref=self.nan_ref, inf_ref=self.inf_ref)
        if self.n == 0:
            return ErrorStats(0, nan, nan, nan, nan, nan, nan, nan, nan, **counts)
        if self.dd == 0.0:
            nrmse, snr = 0.0, float("inf")
        elif self.cc == 0.0:
            nrmse, snr = float("inf"), float("-inf")
        else:
            nrmse, snr = math.sqrt(self.dd / self.cc), 10 * math.log10(self.cc / self.dd)
        if self.xx == 0.0 and self.cc == 0.0:
            cos = 1.0
        elif self.xx == 0.0 or self.cc == 0.0:
            cos = 0.0
        else:
            cos = max(-1.0, min(1.0, self.xc / math.sqrt(self.xx * self.cc)))
        return ErrorStats(n=self.n, max_abs=self.max_abs, mean_abs=self.sum_abs / self.n,
                          mean_signed=self.sum_signed / self.n, nrmse=nrmse, snr_db=snr, cosine=cos,
                          wasserstein=float(np.mean(self.w)), max_ulp=self.max_ulp, **counts)


# ------------------------------------------------------------------------------------------------
class Oracle:
    """Streaming judge of aligned samples.

    Args:
        anchors: anchors in manifest (topological) order.
        backends: the backends of the run (names must be unique).
        config: decision parameters (:class:`anpred.defaults.OracleConfig`).
        reference: backend used as consensus when fewer than ``config.min_voters`` families vote
            (default: the first present in ``config.reference_priority``, else the first voter).
        seed: seed of the plot reservoirs.

    Use :meth:`add` once per sample, then :meth:`finish`.
    """

    def __init__(self, anchors: list[AnchorInfo], backends: list[BackendInfo], config: OracleConfig | None = None,
                 reference: str | None = None, seed: int = 0):
        self.cfg = config or OracleConfig()
        self.anchors = list(anchors)
        self.backends = {b.name: b for b in backends}
        self.reference = reference
        self.rng = np.random.default_rng(seed)
        self.acc: dict[tuple[str, str], _Acc] = {}
        self.missing: dict[tuple[str, str], str] = {}  # (anchor, backend) -> reason (first seen)
        self.anchor_problems: dict[str, str] = {}
        self.consensus_modes: dict[str, set[str]] = {a.name: set() for a in self.anchors}
        self.samples = 0

    # ---- consensus ------------------------------------------------------------------------------
    def _pick_reference(self, present: list[str]) -> str | None:
        if self.reference is not None:
            return self.reference if self.reference in present else None
        for name in self.cfg.reference_priority:
            if name in present and self.backends[name].votes:
                return name
        voters = [b for b in present if self.backends[b].votes]
        return voters[0] if voters else None

    def consensus(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray | None, str, str | None]:
        """Consensus of one anchor in one sample. Returns ``(c, mode, reference)`` with mode
        ``median:<families>`` or ``reference:<name>``; ``c`` is None when no consensus can be formed."""
        fams: dict[str, list[np.ndarray]] = {}
        for b, a in arrays.items():
            info = self.backends[b]
            if info.votes and np.isfinite(a).any():
                fams.setdefault(info.family, []).append(a)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, counted later
            if len(fams) >= self.cfg.min_voters:
                votes = [m[0] if len(m) == 1 else _nanmedian0(np.stack(m)) for m in fams.values()]
                return _nanmedian0(np.stack(votes)), "median:" + ",".join(sorted(fams)), None
        ref = self._pick_reference([b for b in arrays if np.isfinite(arrays[b]).any()])
        if ref is None:
            return None, "none", None
        return arrays[ref], f"reference:{ref}", ref

    # ---- streaming ------------------------------------------------------------------------------
    def add(self, tensors: dict[str, dict[str, np.ndarray]], unaligned: dict[tuple[str, str], str] | None = None) -> None:
        """Judge one sample. ``tensors``: ``{anchor: {backend: array}}`` (aligned, canonical shape);
        ``unaligned``: ``{(anchor, backend): reason}`` for tensors the aligner could not align."""
        self.samples += 1
        for key, why in (unaligned or {}).items():
            self.missing.setdefault(tuple(key), f"not aligned: {why}")
        for a in self.anchors:
            got = {b: np.asarray(v, dtype=np.float64) for b, v in (tensors.get(a.name) or {}).items()
                   if b in self.backends}
            for b in self.backends:
                if b not in got and (a.name, b) not in self.missing:
                    self.missing[(a.name, b)] = "anchor missing in this backend's output"
            if len(got) < 2:
                self.anchor_problems.setdefault(a.name, f"fewer than two backends produced it ({', '.join(got) or 'none'})")
                continue
            # shapes: the voters' most common shape is canonical; others cannot be judged
            shapes: dict[tuple, int] = {}
            for b, v in got.items():
                shapes[v.shape] = shapes.get(v.shape, 0) + (2 if self.backends[b].votes else 1)
            canon = max(shapes, key=shapes.get)
            for b in [b for b, v in got.items() if v.shape != canon]:
                self.missing.setdefault((a.name, b), f"shape {list(got[b].shape)} differs from the consensus shape {list(canon)}")
                del got[b]
            c, mode, ref = self.consensus(got)
            if c is None:
                self.anchor_problems.setdefault(a.name, "no finite value in any voting backend (all NaN/Inf): no consensus")
                continue
            if not np.isfinite(c).any():
                self.anchor_problems.setdefault(a.name, "consensus has no finite value")
                continue
            self.consensus_modes[a.name].add(mode)
            for b, x in got.items():
                if b == ref:
                    self.missing.setdefault((a.name, b), "is the reference (consensus) here: not judged")
                    continue
                acc = self.acc.get((a.name, b))
                if acc is None:
                    acc = self.acc[(a.name, b)] = _Acc(self.cfg.primary, _Reservoir(self.cfg.reservoir, self.rng))
                acc.add(x, c, _dtype_for(self.backends[b].precision))

    # ---- verdicts -------------------------------------------------------------------------------
    def _primary(self, s: ErrorStats) -> float:
        return float(getattr(s, self.cfg.primary))

    def finish(self) -> OracleResult:
        cfg = self.cfg
        notes: list[str] = []
        cells: dict[tuple[str, str], Cell] = {}
        pooled = {k: acc.pooled() for k, acc in self.acc.items()}
        for a in self.anchors:
            judged = [b for b in self.backends if (a.name, b) in pooled]
            for b in judged:
                info = self.backends[b]
                st = pooled[(a.name, b)]
                acc = self.acc[(a.name, b)]
                prim = self._primary(st)
                peers = [self._primary(pooled[(a.name, p)]) for p in judged
                         if p != b and self.backends[p].votes and self.backends[p].family != info.family]
                peers = [v for v in peers if not math.isnan(v)]
                peer_level = float(np.median(peers)) if peers else None
                floor = cfg.floor_at(info.precision, a.stage)
                thr = max(cfg.k_for(info.precision) * peer_level, floor) if peer_level is not None else floor
                ps = np.array(acc.per_sample) if acc.per_sample else np.array([np.nan])
                reason = ""
                if acc.nonfinite:
                    flagged, reason = True, f"{acc.nonfinite} NaN/Inf where the consensus is finite"
                elif st.n == 0:
                    flagged, reason = False, "no finite value to judge"
                else:
                    flagged = bool(prim > thr)
                    if flagged:
                        why = [f"{cfg.primary} {prim:.3g} > floor {floor:.3g}"]
                        if peer_level is not None:
                            why.append(f"> {cfg.k_for(info.precision):g} x peers' median {peer_level:.3g}")
                        reason = " and ".join(why)
                cells[(a.name, b)] = Cell(
                    anchor=a.name, backend=b, samples=acc.samples, stats=st, primary=prim,
                    per_sample={"p50": float(np.median(ps)), "p90": float(np.quantile(ps, 0.9)), "max": float(np.max(ps))},
                    floor=floor, peer_level=peer_level, threshold=thr, nonfinite=acc.nonfinite,
                    flagged=flagged, reason=reason)
        verdicts = {b: self._verdict(b, cells) for b in self.backends}
        consensus = {}
        for a in self.anchors:
            modes = sorted(self.consensus_modes[a.name])
            consensus[a.name] = modes
        ref_modes = sorted({m for ms in consensus.values() for m in ms if m.startswith("reference:")})
        if ref_modes:
            notes.append("fewer than %d voting families at some anchors: consensus = %s (the reference is not judged "
                         "there; verdicts rest on the noise floor and fewer peers)" % (cfg.min_voters, ", ".join(ref_modes)))
        for name, why in self.anchor_problems.items():
            notes.append(f"anchor {name} could not be judged: {why}")
        return OracleResult(
            cells=[cells[k] for a in self.anchors for k in [(a.name, b) for b in self.backends] if k in cells],
            verdicts=verdicts, consensus=consensus, unjudged_anchors=dict(self.anchor_problems), notes=notes,
            plot_data={k: acc.res.data for k, acc in self.acc.items()})

    def _verdict(self, b: str, cells: dict[tuple[str, str], Cell]) -> BackendVerdict:
        info = self.backends[b]
        v = BackendVerdict(backend=b, family=info.family, precision=info.precision, votes=info.votes, flagged=False)
        profile: list[tuple[AnchorInfo, Cell]] = []
        for a in self.anchors:
            cell = cells.get((a.name, b))
            if cell is None:
                v.unjudged[a.name] = self.anchor_problems.get(a.name) or self.missing.get((a.name, b), "not judged")
                continue
            profile.append((a, cell))
        v.judged_anchors = len(profile)
        flagged = [(a, c) for a, c in profile if c.flagged]
        v.flagged = bool(flagged)
        v.flagged_anchors = [a.name for a, _ in flagged]
        if profile:
            def over(c: Cell) -> float:
                return c.primary / c.threshold if c.threshold > 0 else (math.inf if c.primary > 0 else 0.0)

            worst_a, worst_c = max(profile, key=lambda ac: (ac[1].flagged, _finite_key(over(ac[1]))))
            v.worst_anchor, v.worst_primary = worst_a.name, worst_c.primary
            v.worst_ratio_to_threshold = over(worst_c)
        if flagged:
            v.origin_anchor, v.origin_stage = flagged[0][0].name, flagged[0][0].stage
        # propagation between consecutive judged anchors
        band = self.cfg.propagation_band
        for (a0, c0), (a1, c1) in zip(profile, profile[1:]):
            if c0.primary > 0:
                r = c1.primary / c0.primary
                kind = "amplified" if r > band else ("attenuated" if r < 1 / band else "stable")
            else:
                r = None
                kind = "appeared" if c1.primary > 0 else "clean"
            if c0.flagged and not c1.flagged and kind != "amplified":
                kind = "vanished" if c1.primary <= c1.threshold else kind
            v.steps.append(Step(a0.name, a1.name, r, kind))
        outputs = [(a, c) for a, c in profile if a.kind == "output"]
        v.output_flagged = any(c.flagged for _, c in outputs)
        if flagged:
            origin_idx = next(i for i, (a, _) in enumerate(profile) if a.name == v.origin_anchor)
            after = v.steps[origin_idx:]
            ups = any(s.kind == "amplified" for s in after)
            downs = any(s.kind == "attenuated" for s in after)
            v.non_monotonic = ups and downs
            if outputs and not v.output_flagged:
                v.propagation = "masked"
            else:
                last = outputs[-1][1] if outputs else profile[-1][1]
                origin = flagged[0][1]
                r = last.primary / origin.primary if origin.primary > 0 else math.inf
                v.propagation = "amplified" if r > band else ("attenuated" if r < 1 / band else "stable")
        return v


def _nanmedian0(a: np.ndarray) -> np.ndarray:
    """``np.nanmedian(a, axis=0)``; computed with ``np.median`` (partition-based, several times faster
    than nanmedian's masked-array path) when ``a`` holds no NaN, where the two are identical."""
    return np.nanmedian(a, axis=0) if np.isnan(a).any() else np.median(a, axis=0)


def _finite_key(v: float) -> float:
    return 1e300 if math.isinf(v) else (-1.0 if math.isnan(v) else v)


def _dtype_for(precision: str) -> str:
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "float32"}.get(precision, "float32")


# ------------------------------------------------------------------------------------------------
class ThresholdCheck:
    """Streaming Polygraphy-style baseline on the output anchors (see :class:`ThresholdResult`)."""

    def __init__(self, outputs: list[str], backends: list[str], reference: str, atol: float = 1e-5, rtol: float = 1e-5):
        self.outputs, self.reference, self.atol, self.rtol = list(outputs), reference, float(atol), float(rtol)
        self.res = {b: {"failed": 0, "total": 0, "max_abs": 0.0, "max_rel": 0.0, "outputs": {}}
                    for b in backends if b != reference}

    def add(self, tensors: dict[str, dict[str, np.ndarray]]) -> None:
        for o in self.outputs:
            per = tensors.get(o) or {}
            if self.reference not in per:
                continue
            r = np.asarray(per[self.reference], dtype=np.float64)
            for b, acc in self.res.items():
                if b not in per or np.shape(per[b]) != r.shape:
                    continue
                x = np.asarray(per[b], dtype=np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    ad = np.abs(x - r)
                    rel = ad / np.abs(r)
                rf = np.isfinite(r)
                nonfin = ~np.isfinite(x) & rf
                both = np.isfinite(x) & rf
                fail = nonfin | (both & (ad > self.atol) & (rel > self.rtol))
                nf, nt = int(fail.sum()), int(x.size)
                mad = float(ad[both].max()) if both.any() else 0.0
                mrel = float(np.nan_to_num(rel[both], nan=0.0, posinf=np.inf).max()) if both.any() else 0.0
                acc["failed"] += nf
                acc["total"] += nt
                acc["max_abs"] = max(acc["max_abs"], mad)
                acc["max_rel"] = max(acc["max_rel"], mrel)
                po = acc["outputs"].setdefault(o, {"failed": 0, "total": 0, "max_abs": 0.0, "max_rel": 0.0})
                po["failed"] += nf
                po["total"] += nt
                po["max_abs"] = max(po["max_abs"], mad)
                po["max_rel"] = max(po["max_rel"], mrel)

    def finish(self) -> dict[str, ThresholdResult]:
        return {b: ThresholdResult(backend=b, reference=self.reference, atol=self.atol, rtol=self.rtol,
                                   passed=(a["failed"] == 0 and a["total"] > 0), failed_elements=a["failed"],
                                   total_elements=a["total"], max_abs=a["max_abs"], max_rel=a["max_rel"],
                                   outputs=a["outputs"])
                for b, a in self.res.items()}
