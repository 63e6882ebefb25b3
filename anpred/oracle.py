"""The consensus population-deviation oracle, localization, propagation and the threshold baseline.

Streaming: :class:`Oracle` receives one aligned sample at a time (``{anchor: {backend: float64
array}}``, canonical ONNX shape) and keeps, per (anchor, backend), a few sums, the per-sample primary
statistic and a bounded reservoir of values for plots; nothing else survives a sample.

Per sample and anchor (formulas and defaults: ``docs/oracle.md``, :mod:`anpred.defaults`):

1. **Consensus** ``c``: voting backends (fp32, not a reduced-precision variant) are grouped into
   families; a family's vote is the element-wise median of its members; ``c`` is the element-wise
   median (NaN-ignoring) of the family votes when at least ``min_voters`` families voted, else the
   tensor of one named reference backend (which is then not judged at that anchor).
   **Correlated families** are merged: family votes that are bit-identical at this anchor and sample
   (nRMSE between them <= ``correlated_nrmse``, default 0) while another family's vote differs count as
   one vote (e.g. TensorFlow and OpenVINO both running oneDNN kernels), as long as at least
   ``min_voters`` distinct votes remain; the result lists where this happened.
2. Each backend's deviation from ``c`` (:class:`anpred.stats.Reference`), accumulated over samples.
   Every (anchor, backend, sample) that could not be judged is recorded with its reason: a verdict
   lists the anchors it could not judge (``unjudged``) and those judged on only part of the samples
   (``partial``); its ``status`` is then ``incomplete`` (``unjudged`` when nothing was judged), never
   plainly ``consistent``.

After the last sample, per (anchor, backend), the pooled primary statistic ``S`` (nRMSE over the
whole population: ``sqrt(sum_s ||x_s - c_s||^2 / sum_s ||c_s||^2)``) is compared with its peers
(judged backends of *other* families that vote): **flagged** when ``S > k * median(S_peers)`` and
``S > floor(precision, stage)``, or when the backend produced NaN/Inf where the consensus is finite.
Peers exclude backends merged with it (correlated) at that anchor. Without peers the floor alone
decides. **Localization**: the first flagged anchor in manifest (topological) order is where the
deviation first exceeds the flagging threshold; the **origin** is traced back from it along the data
flow to the earliest ancestor anchor from which the backend departs from its peers without a break
(``S > origin_k * median(S_peers)`` and ``S > origin_floor_fraction * floor`` at that anchor and at
every judged anchor between it and the first flagged one): a fault born below the floor and flagged
only where it has grown is placed where it was born, not where it crossed the line. **Sustained
departure**: a voting backend that departs (same test) at ``sustained_anchors`` (3) or more judged
anchors in a row along the data flow is flagged at each of them, even below the floor (one anchor at 4x
its peers can be noise; a run of them is an error carried through the network). Neither rule applies
to reduced-precision variants, which depart from their fp32 peers everywhere by design. **Signal
lost**: a backend of any precision whose pooled cosine similarity with a nonzero consensus is <= 0 (an
all-zero tensor, or one with no positive correlation) is flagged there whatever its floor (int8's is
above the nRMSE of 1 such a tensor has), provided its peers are > k times closer. **Parts**
of concatenated outputs (:mod:`anpred.parts`, ``AnchorInfo.part_of``) are judged like anchors with
their output's stage when their largest |consensus| is at least ``part_min_scale`` x their output's
(else left out, with a note) and flagged only where, besides the rule above, their largest deviation
exceeds the floor times their largest |consensus| (**part range rule**: a part judged relative to its
RMS, e.g. class probabilities that are nearly all 0, would otherwise turn deviations far below its
range, such as ONNX Runtime's Sigmoid tail, into flags); a part and its own output are not two links of
one data-flow chain. The
**propagation** profile gives the ratio of ``S`` between consecutive judged
anchors along the data flow: the origin and its descendants (:func:`anchor_descendants`, from the
run's model), so that anchors of a parallel branch the fault cannot reach are left out.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig
from anpred.stats import Comparison, ErrorStats, Reference, _from_json_float, _json_float


# ------------------------------------------------------------------------------------------------
# description of what is judged
@dataclass
class BackendInfo:
    """A backend as the oracle sees it: family (one vote), precision (floor), whether it votes.

    ``precision`` is what the backend *computed* in (read back from the runtime, see
    :class:`anpred.backends.base.BackendStatus`), ``requested`` what it was asked for (the
    ``reduced_precision`` table, else its nominal precision); they differ e.g. for ``openvino-bf16``
    on a CPU without bf16 instructions (compiled to fp32), which is then judged as fp32 (fp32 floor
    and k), never as bf16. A backend asked for reduced precision does not vote either way."""

    name: str
    family: str
    precision: str = "fp32"
    votes: bool = True
    requested: str = ""

    @classmethod
    def make(cls, name: str, family: str | None = None, precision: str | None = None,
             config: OracleConfig | None = None, requested: str | None = None) -> "BackendInfo":
        """Args: ``precision``: the effective precision from the run record (``None``: unknown, the
        requested one is assumed); ``requested``: the nominal precision from the run record."""
        cfg = config or OracleConfig()
        fam = cfg.families.get(name) or family or name
        reduced = cfg.reduced_precision.get(name)
        asked = reduced or requested or precision or "fp32"
        prec = precision or asked
        if prec not in cfg.floor:
            prec = "fp32"
        if asked not in cfg.floor:
            asked = "fp32"
        return cls(name=name, family=fam, precision=prec, votes=(reduced is None and asked == "fp32" and prec == "fp32"),
                   requested=asked)


@dataclass
class AnchorInfo:
    """An anchor in manifest (topological) order.

    ``part_of``: for a *part* of a concatenated output (:mod:`anpred.parts`, ``kind == "part"``), the
    output anchor it is a slice of; judged like an anchor (same stage and floor as its output) when it
    passes the scale guard ``OracleConfig.part_min_scale``, else left out without a gap."""

    name: str
    stage: int
    kind: str = "boundary"
    op_type: str = ""
    dtype: str = "float32"
    part_of: str | None = None


# ------------------------------------------------------------------------------------------------
# results
@dataclass
class Cell:
    """The verdict of one backend at one anchor, over the whole population of inputs.

    ``stats`` are pooled over samples (nRMSE, SNR and cosine from pooled sums; max_abs, max_ulp maxima;
    mean_abs, mean_signed over all elements; wasserstein the mean of per-sample values). ``per_sample``
    holds the primary statistic's median, 90th percentile and maximum over samples. ``primary`` is the
    pooled primary statistic; ``peer_level`` the median of peers' (None: no peers), ``threshold``
    ``max(k * peer_level, floor)`` (the floor alone without peers). ``range_ratio``: for a part of an
    output only, ``max_abs / max |consensus|`` over the samples (unitless; the part range rule).
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
    range_ratio: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stats"] = self.stats.to_dict()
        for k in ("primary", "floor", "peer_level", "threshold", "range_ratio"):
            d[k] = _json_float(d[k])
        d["per_sample"] = {k: _json_float(v) for k, v in self.per_sample.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cell":
        d = dict(d)
        d["stats"] = ErrorStats.from_dict(d["stats"])
        for k in ("primary", "floor", "peer_level", "threshold", "range_ratio"):
            if k in d:
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
    """Per backend: verdict, origin, worst anchor and propagation (see module docstring).

    ``status``: ``flagged`` (some anchor flagged), ``incomplete`` (nothing flagged, but some anchor
    could not be judged or was judged on fewer samples than the run has), ``unjudged`` (no anchor
    judged), ``consistent`` (every anchor judged on every sample, nothing flagged). ``unjudged``:
    anchor -> reason; ``partial``: anchor -> which samples are missing and why; ``reference_at``:
    anchors where this backend *was* the consensus (fewer than ``min_voters`` families; not a gap).
    ``samples``: samples in which it was judged at one anchor at least.

    Propagation (flagged backends): with the run's data flow known, ``steps`` follow
    ``profile_anchors`` = the origin plus the judged anchors that are data-flow descendants of it, in
    topological order (``profile_basis == "dataflow"``); without it, all judged anchors in manifest
    order (``"manifest"``, which interleaves parallel branches). Unflagged backends: manifest order."""

    backend: str
    family: str
    precision: str
    votes: bool
    flagged: bool
    origin_anchor: str | None = None
    origin_stage: int | None = None
    first_flagged_anchor: str | None = None
    origin_traced: str = ""  # how the origin was found from the first flagged anchor (empty: it is that anchor)
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
    status: str = "consistent"  # consistent | flagged | incomplete | unjudged | reference
    partial: dict[str, str] = field(default_factory=dict)  # anchor -> missing samples and why
    reference_at: list[str] = field(default_factory=list)
    samples: int = 0
    profile_anchors: list[str] = field(default_factory=list)  # anchors ``steps`` follow, in order
    profile_basis: str = "manifest"  # dataflow | manifest
    # the precision asked for when the backend computed in another one (``precision``, which it is judged as)
    precision_requested: str = ""

    @property
    def complete(self) -> bool:
        """Every anchor judged on every sample (``reference_at`` anchors excepted)."""
        return not self.unjudged and not self.partial and self.judged_anchors > 0

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
    """Everything the oracle decided. ``correlated``: one entry per group of families merged into one
    vote somewhere (``families``, ``backends``, ``anchors``: anchor -> samples merged, ``differ``:
    anchors where they were judged apart). ``plot_data[(anchor, backend)]`` holds reservoirs ``err``,
    ``x``, ``c`` (float64 1-D) for the HTML report; it is not serialised."""

    cells: list[Cell]
    verdicts: dict[str, BackendVerdict]
    consensus: dict[str, Any]
    unjudged_anchors: dict[str, str]
    notes: list[str]
    correlated: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
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

    def add(self, cmp: Comparison) -> None:
        s = cmp.stats
        self.samples += 1
        self.nan += s.nan
        self.inf += s.inf
        self.nan_ref += s.nan_ref
        self.inf_ref += s.inf_ref
        self.nonfinite += cmp.nonfinite
        if s.n == 0:
            return
        self.n += s.n
        self.dd += cmp.dd
        self.cc += cmp.cc
        self.xx += cmp.xx
        self.xc += cmp.xc
        self.sum_abs += s.mean_abs * s.n
        self.sum_signed += s.mean_signed * s.n
        self.max_abs = max(self.max_abs, s.max_abs)
        self.max_ulp = max(self.max_ulp, s.max_ulp)
        self.w.append(s.wasserstein)
        self.per_sample.append(float(getattr(s, self.primary)))
        if self.res.size > 0:
            self.res.add({"err": cmp.d, "x": cmp.x, "c": cmp.c})

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
        descendants: anchor name -> names of the anchors downstream of it in the data flow (see
            :func:`anchor_descendants`); None: propagation follows the manifest order (a note says so
            when a backend is flagged).

    Use :meth:`add` once per sample, then :meth:`finish`.
    """

    def __init__(self, anchors: list[AnchorInfo], backends: list[BackendInfo], config: OracleConfig | None = None,
                 reference: str | None = None, seed: int = 0, descendants: dict[str, set[str]] | None = None):
        self.cfg = config or OracleConfig()
        self.descendants = descendants
        self.anchors = list(anchors)
        self.backends = {b.name: b for b in backends}
        self.reference = reference
        self.rng = np.random.default_rng(seed)
        self.acc: dict[tuple[str, str], _Acc] = {}
        # (anchor, backend) -> reason -> sample ids where that backend could not be judged there
        self.gaps: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.anchor_gaps: dict[str, dict[str, list[str]]] = {}  # anchor -> reason -> sample ids
        self.ref_at: dict[tuple[str, str], int] = {}  # (anchor, backend) -> samples it was the consensus
        self.merged: dict[str, dict[frozenset, int]] = {a.name: {} for a in self.anchors}
        self.apart: dict[str, dict[frozenset, int]] = {a.name: {} for a in self.anchors}
        self.consensus_modes: dict[str, set[str]] = {a.name: set() for a in self.anchors}
        self.samples = 0
        self.sample_ids: list[str] = []
        # largest finite |consensus| over the samples, for parts and their outputs (scale guard)
        self._part_of = {a.name: a.part_of for a in self.anchors if a.part_of}
        self._scaled = set(self._part_of) | set(self._part_of.values())
        self.consensus_max: dict[str, float] = {}
        self.skipped_parts: dict[str, str] = {}  # part -> why it was not judged on its own

    # ---- consensus ------------------------------------------------------------------------------
    def _pick_reference(self, present: list[str]) -> str | None:
        if self.reference is not None:
            return self.reference if self.reference in present else None
        for name in self.cfg.reference_priority:
            if name in present and name in self.backends and self.backends[name].votes:
                return name
        voters = [b for b in present if self.backends[b].votes]
        return voters[0] if voters else None

    def _identical(self, a: np.ndarray, b: np.ndarray) -> bool:
        tol = self.cfg.correlated_nrmse
        if tol <= 0:
            return bool(np.array_equal(a, b))
        d = (a - b).ravel()
        bb = float(np.einsum("i,i->", b.ravel(), b.ravel()))
        dd = float(np.einsum("i,i->", d, d))
        return bool(np.isfinite(dd)) and (dd == 0.0 or (bb > 0 and math.sqrt(dd / bb) <= tol))

    def _groups(self, votes: dict[str, np.ndarray]) -> list[list[str]]:
        """Families whose votes are identical (``correlated_nrmse``) grouped; singletons otherwise.
        No merge when all are identical (nothing tells correlation from agreement) or when fewer than
        ``min_voters`` distinct votes would remain."""
        groups: list[list[str]] = []
        for f in sorted(votes):
            for g in groups:
                if self._identical(votes[f], votes[g[0]]):
                    g.append(f)
                    break
            else:
                groups.append([f])
        if len(groups) < self.cfg.min_voters:
            return [[f] for f in sorted(votes)]
        return groups

    def consensus(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray | None, str, str | None]:
        """Consensus of one anchor in one sample. Returns ``(c, mode, reference)`` with mode
        ``median:<families>`` (merged families joined by ``+``) or ``reference:<name>``; ``c`` is None
        when no consensus can be formed."""
        c, mode, ref, _ = self._consensus(arrays)
        return c, mode, ref

    def _consensus(self, arrays):
        fams: dict[str, list[np.ndarray]] = {}
        for b, a in arrays.items():
            info = self.backends[b]
            if info.votes and np.isfinite(a).any():
                fams.setdefault(info.family, []).append(a)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, counted later
            if len(fams) >= self.cfg.min_voters:
                votes = {f: (m[0] if len(m) == 1 else median_of(m)) for f, m in fams.items()}
                groups = self._groups(votes)
                c = median_of([votes[g[0]] for g in groups])
                mode = "median:" + ",".join(sorted("+".join(g) for g in groups))
                return c, mode, None, groups
        ref = self._pick_reference([b for b in arrays if np.isfinite(arrays[b]).any()])
        if ref is None:
            return None, "none", None, []
        return arrays[ref], f"reference:{ref}", ref, []

    # ---- streaming ------------------------------------------------------------------------------
    def _gap(self, anchor: str, backend: str, why: str, sid: str) -> None:
        self.gaps.setdefault((anchor, backend), {}).setdefault(why, []).append(sid)

    def add(self, tensors: dict[str, dict[str, np.ndarray]], unaligned: dict[tuple[str, str], str] | None = None,
            sample_id: str | None = None, absent: dict[str, str] | None = None) -> None:
        """Judge one sample.

        Args:
            tensors: ``{anchor: {backend: array}}`` (aligned, canonical shape).
            unaligned: ``{(anchor, backend): reason}`` for tensors the aligner could not align.
            sample_id: the sample's id (for the report of what could not be judged).
            absent: ``{backend: reason}`` for backends that stored nothing for this sample.
        """
        sid = sample_id if sample_id is not None else f"#{self.samples}"
        self.samples += 1
        self.sample_ids.append(sid)
        unaligned = {tuple(k): v for k, v in (unaligned or {}).items()}
        absent = absent or {}
        for a in self.anchors:
            raw = tensors.get(a.name) or {}
            got: dict[str, np.ndarray] = {}
            why: dict[str, str] = {}
            for b in self.backends:
                if b in raw:
                    got[b] = np.asarray(raw[b], dtype=np.float64)
                elif b in absent:
                    why[b] = absent[b]
                elif (a.name, b) in unaligned:
                    why[b] = f"not aligned: {unaligned[(a.name, b)]}"
                else:
                    why[b] = "anchor missing in this backend's output"
            # shapes: the voters' most common shape is canonical; others cannot be judged
            if got:
                shapes: dict[tuple, int] = {}
                for b, v in got.items():
                    shapes[v.shape] = shapes.get(v.shape, 0) + (2 if self.backends[b].votes else 1)
                canon = max(shapes, key=shapes.get)
                for b in [b for b, v in got.items() if v.shape != canon]:
                    why[b] = f"shape {list(got[b].shape)} differs from the other backends' shape {list(canon)}"
                    del got[b]
            for b, w in why.items():
                self._gap(a.name, b, w, sid)
            if len(got) < 2:
                unal = [f"{b}: {w[len('not aligned: '):]}" for b, w in why.items() if w.startswith("not aligned: ")]
                other = [f"{b}: {w}" for b, w in why.items() if not w.startswith("not aligned: ")]
                parts = [f"fewer than two backends produced it ({', '.join(got)})" if got
                         else "no backend produced a usable tensor"]
                if unal:
                    parts.append("not aligned: " + "; ".join(unal))
                parts.extend(other)
                msg = "; ".join(parts)
                self.anchor_gaps.setdefault(a.name, {}).setdefault(msg, []).append(sid)
                for b in got:
                    self._gap(a.name, b, "no other backend to compare with here", sid)
                continue
            c, mode, ref, groups = self._consensus(got)
            if c is None or not np.isfinite(c).any():
                msg = ("no finite value in any voting backend (all NaN/Inf): no consensus" if c is None
                       else "consensus has no finite value")
                self.anchor_gaps.setdefault(a.name, {}).setdefault(msg, []).append(sid)
                for b in got:
                    self._gap(a.name, b, msg, sid)
                continue
            self.consensus_modes[a.name].add(mode)
            if a.name in self._scaled:
                with np.errstate(invalid="ignore"):
                    m = float(np.nanmax(np.abs(np.where(np.isfinite(c), c, np.nan)))) if c.size else 0.0
                self.consensus_max[a.name] = max(self.consensus_max.get(a.name, 0.0), m)
            for g in groups:
                key = frozenset(g)
                if len(g) > 1:
                    self.merged[a.name][key] = self.merged[a.name].get(key, 0) + 1
            ref_tensor = Reference(c)
            for b, x in got.items():
                if b == ref:
                    self.ref_at[(a.name, b)] = self.ref_at.get((a.name, b), 0) + 1
                    continue
                acc = self.acc.get((a.name, b))
                if acc is None:
                    acc = self.acc[(a.name, b)] = _Acc(self.cfg.primary, _Reservoir(self.cfg.reservoir, self.rng))
                acc.add(ref_tensor.compare(x, ulp_dtype(self.backends[b].precision)))

    # ---- verdicts -------------------------------------------------------------------------------
    def _primary(self, s: ErrorStats) -> float:
        return float(getattr(s, self.cfg.primary))

    def _merged_families(self, anchor: str, family: str) -> set[str]:
        out: set[str] = set()
        for g in self.merged.get(anchor, {}):
            if family in g:
                out |= g
        out.discard(family)
        return out

    def _guard_parts(self, notes: list[str]) -> None:
        """Leave out the parts that fail the scale guard (``part_min_scale``): from here on
        ``self.anchors`` holds the anchors that are judged (manifest anchors and kept parts)."""
        keep = []
        for a in self.anchors:
            if a.part_of:
                pm, om = self.consensus_max.get(a.name, 0.0), self.consensus_max.get(a.part_of, 0.0)
                if not (om > 0 and pm >= self.cfg.part_min_scale * om):
                    self.skipped_parts[a.name] = (f"largest |consensus| {pm:.3g} < part_min_scale "
                                                  f"{self.cfg.part_min_scale:g} x its output's {om:.3g}")
                    continue
            keep.append(a)
        if self.skipped_parts:
            notes.append(f"{len(self.skipped_parts)} part(s) of concatenated outputs judged only as part of the whole "
                         f"output (scale guard part_min_scale = {self.cfg.part_min_scale:g}): " +
                         "; ".join(f"{k}: {v}" for k, v in list(self.skipped_parts.items())[:4]) +
                         (" ..." if len(self.skipped_parts) > 4 else ""))
        self.anchors = keep

    def finish(self) -> OracleResult:
        cfg = self.cfg
        notes: list[str] = []
        self._guard_parts(notes)
        cells: dict[tuple[str, str], Cell] = {}
        pooled = {k: acc.pooled() for k, acc in self.acc.items()}
        for a in self.anchors:
            judged = [b for b in self.backends if (a.name, b) in pooled]
            for b in judged:
                info = self.backends[b]
                st = pooled[(a.name, b)]
                acc = self.acc[(a.name, b)]
                prim = self._primary(st)
                corr = self._merged_families(a.name, info.family)
                peers = [self._primary(pooled[(a.name, p)]) for p in judged
                         if p != b and self.backends[p].votes and self.backends[p].family != info.family
                         and self.backends[p].family not in corr]
                peers = [v for v in peers if not math.isnan(v)]
                peer_level = float(np.median(peers)) if peers else None
                floor = cfg.floor_at(info.precision, a.stage)
                thr = max(cfg.k_for(info.precision) * peer_level, floor) if peer_level is not None else floor
                ps = np.array(acc.per_sample) if acc.per_sample else np.array([np.nan])
                reason = ""
                # a part of an output: its largest deviation relative to its largest |consensus| value
                range_ratio = None
                if a.part_of:
                    cmax = self.consensus_max.get(a.name, 0.0)
                    range_ratio = st.max_abs / cmax if cmax > 0 else math.inf
                lost = (cfg.signal_lost and st.n > 0 and acc.cc > 0 and st.cosine <= 0.0
                        and (peer_level is None or prim > cfg.k_for(info.precision) * peer_level))
                if acc.nonfinite:
                    flagged, reason = True, f"{acc.nonfinite} NaN/Inf where the consensus is finite"
                elif st.n == 0:
                    flagged, reason = False, "no finite value to judge"
                elif lost and not prim > thr:
                    flagged = True
                    reason = (f"signal lost: cosine similarity {st.cosine:.3g} with the consensus "
                              f"({'every value 0' if acc.xx == 0 else 'no positive correlation'}; {cfg.primary} "
                              f"{prim:.3g}, under the {info.precision} floor {floor:.3g})")
                else:
                    flagged = bool(prim > thr)
                    if flagged and range_ratio is not None and not range_ratio > floor:
                        flagged = False
                        reason = (f"not flagged: {cfg.primary} {prim:.3g} > threshold {thr:.3g}, but its largest "
                                  f"deviation {st.max_abs:.3g} is {range_ratio:.3g} of the part's largest value, "
                                  f"under the floor {floor:.3g} (part range rule)")
                    elif flagged:
                        why = [f"{cfg.primary} {prim:.3g} > floor {floor:.3g}"]
                        if peer_level is not None:
                            why.append(f"> {cfg.k_for(info.precision):g} x peers' median {peer_level:.3g}")
                        if range_ratio is not None:
                            why.append(f"largest deviation {range_ratio:.3g} of the part's largest value")
                        reason = " and ".join(why)
                cells[(a.name, b)] = Cell(
                    anchor=a.name, backend=b, samples=acc.samples, stats=st, primary=prim,
                    per_sample={"p50": float(np.median(ps)), "p90": float(np.quantile(ps, 0.9)), "max": float(np.max(ps))},
                    floor=floor, peer_level=peer_level, threshold=thr, nonfinite=acc.nonfinite,
                    flagged=flagged, reason=reason, range_ratio=range_ratio)
        if cfg.sustained_anchors >= 2:
            self._mark_sustained(cells)
        verdicts = {b: self._verdict(b, cells) for b in self.backends}
        if self.descendants is None and any(v.flagged for v in verdicts.values()):
            notes.append("propagation follows the manifest order (the run's data flow is unknown): parallel "
                         "branches interleave there, so ratios and non-monotonic marks may mix branches")
        consensus = {a.name: sorted(self.consensus_modes[a.name]) for a in self.anchors}
        ref_modes = sorted({m for ms in consensus.values() for m in ms if m.startswith("reference:")})
        if ref_modes:
            notes.append("fewer than %d voting families at some anchors: consensus = %s (the reference is not judged "
                         "there; verdicts rest on the noise floor and fewer peers)" % (cfg.min_voters, ", ".join(ref_modes)))
        unjudged_anchors: dict[str, str] = {}
        for a in self.anchors:
            gaps = self.anchor_gaps.get(a.name)
            if not gaps or a.part_of:
                continue
            text = _gap_text(gaps, self.samples)
            if not any(k[0] == a.name for k in cells):
                unjudged_anchors[a.name] = text
                notes.append(f"anchor {a.name} could not be judged: {text}")
            else:
                notes.append(f"anchor {a.name} could not be judged in some samples: {text}")
        correlated = self._correlated()
        for c in correlated:
            n_all = len(self.anchors)
            tol = "bit-identical" if cfg.correlated_nrmse <= 0 else f"within nRMSE {cfg.correlated_nrmse:g}"
            differ = f"; judged apart at {', '.join(c['differ'][:4])}{' ...' if len(c['differ']) > 4 else ''}" \
                if c["differ"] else ""
            notes.append(f"correlated backends: {' and '.join(c['backends'])} (families {', '.join(c['families'])}) "
                         f"gave {tol} tensors at {len(c['anchors'])} of {n_all} anchors (in {min(c['anchors'].values())}"
                         f"-{max(c['anchors'].values())} of {self.samples} samples each): counted as one consensus vote "
                         f"there (shared kernels){differ}")
        return OracleResult(
            cells=[cells[k] for a in self.anchors for k in [(a.name, b) for b in self.backends] if k in cells],
            verdicts=verdicts, consensus=consensus, unjudged_anchors=unjudged_anchors, notes=notes,
            correlated=correlated, samples=self.samples,
            plot_data={k: acc.res.data for k, acc in self.acc.items()})

    def _correlated(self) -> list[dict[str, Any]]:
        groups: dict[frozenset, dict[str, int]] = {}
        for a in self.anchors:
            for g, n in self.merged[a.name].items():
                groups.setdefault(g, {})[a.name] = n
        out = []
        for g, anchors in groups.items():
            fams = sorted(g)
            members = [b for b, i in self.backends.items() if i.votes and i.family in g]
            differ = [a.name for a in self.anchors if a.name not in anchors and
                      sum(1 for b in members if (a.name, b) in self.acc) >= 2]
            out.append({"families": fams, "backends": members, "anchors": anchors, "differ": differ})
        return out

    def _verdict(self, b: str, cells: dict[tuple[str, str], Cell]) -> BackendVerdict:
        info = self.backends[b]
        v = BackendVerdict(backend=b, family=info.family, precision=info.precision, votes=info.votes, flagged=False,
                           precision_requested=info.requested if info.requested != info.precision else "")
        profile: list[tuple[AnchorInfo, Cell]] = []
        for a in self.anchors:
            cell = cells.get((a.name, b))
            nref = self.ref_at.get((a.name, b), 0)
            if nref:
                v.reference_at.append(a.name)
            gaps = self.gaps.get((a.name, b), {})
            if cell is None:
                if (nref and nref == self.samples) or a.part_of:
                    continue  # a part's gaps are its output's
                v.unjudged[a.name] = _gap_text(gaps, self.samples) if gaps else "not judged"
                continue
            if cell.samples + nref < self.samples and not a.part_of:
                v.partial[a.name] = (f"judged on {cell.samples} of {self.samples} samples; "
                                     + (_gap_text(gaps, self.samples) if gaps else "other samples not judged"))
            profile.append((a, cell))
        v.judged_anchors = len(profile)
        v.samples = max((c.samples for _, c in profile), default=0)
        flagged = [(a, c) for a, c in profile if c.flagged]
        v.flagged = bool(flagged)
        v.flagged_anchors = [a.name for a, _ in flagged]
        if v.flagged:
            v.status = "flagged"
        elif not profile:
            v.status = "reference" if v.reference_at and not v.unjudged else "unjudged"
        elif v.unjudged or v.partial:
            v.status = "incomplete"
        else:
            v.status = "consistent"
        def over(c: Cell) -> float:
            return c.primary / c.threshold if c.threshold > 0 else (math.inf if c.primary > 0 else 0.0)

        if profile:
            worst_a, worst_c = max(profile, key=lambda ac: (ac[1].flagged, _finite_key(over(ac[1]))))
            v.worst_anchor, v.worst_primary = worst_a.name, worst_c.primary
            v.worst_ratio_to_threshold = over(worst_c)
        if flagged:
            v.first_flagged_anchor = flagged[0][0].name
            o_a, o_c = self._trace_origin(profile, flagged[0])
            v.origin_anchor, v.origin_stage = o_a.name, o_a.stage
            if o_a.name != v.first_flagged_anchor:
                ratio = o_c.primary / o_c.peer_level if o_c.peer_level else math.inf
                v.origin_traced = (f"traced back from {v.first_flagged_anchor}: departs from its peers from "
                                   f"{o_a.name} on ({self.cfg.primary} {o_c.primary:.3g} = {ratio:.3g} x peers' "
                                   f"median, below the flagging threshold {o_c.threshold:.3g})")
        # propagation between consecutive anchors of the profile: for a flagged backend with the data
        # flow known, the origin and its judged descendants (topological order); else all judged anchors
        # Parts of outputs are left out of the path unless the origin is one (a part -> output step is
        # dilution, not propagation): the profile and the trend end at the whole output; an output whose
        # part is flagged counts as flagged (not masked).
        part_pairs: dict[str, list[tuple[AnchorInfo, Cell]]] = {}
        for a, c in profile:
            if a.part_of:
                part_pairs.setdefault(a.part_of, []).append((a, c))

        def out_flagged(a: AnchorInfo, c: Cell, reach: set[str] | None) -> bool:
            return c.flagged or any(pc.flagged for pa, pc in part_pairs.get(a.name, [])
                                    if reach is None or pa.name in reach)

        path = [(a, c) for a, c in profile if not a.part_of or a.name == v.origin_anchor]
        reach = None
        if flagged and self.descendants is not None:
            reach = self._down(v.origin_anchor)
            path = [(a, c) for a, c in path if a.name == v.origin_anchor or a.name in reach]
            v.profile_basis = "dataflow"
        v.profile_anchors = [a.name for a, _ in path]
        band = self.cfg.propagation_band
        for (a0, c0), (a1, c1) in zip(path, path[1:]):
            if c0.primary > 0:
                r = c1.primary / c0.primary
                kind = "amplified" if r > band else ("attenuated" if r < 1 / band else "stable")
            else:
                r = None
                kind = "appeared" if c1.primary > 0 else "clean"
            c1_flagged = c1.flagged or (a1.kind == "output" and out_flagged(a1, c1, reach))
            if c0.flagged and not c1_flagged and kind != "amplified":
                kind = "vanished" if c1.primary <= c1.threshold else kind
            v.steps.append(Step(a0.name, a1.name, r, kind))
        outputs = [(a, c) for a, c in profile if a.kind == "output"]
        v.output_flagged = any(out_flagged(a, c, None) for a, c in outputs)
        if flagged:
            origin_idx = next(i for i, (a, _) in enumerate(path) if a.name == v.origin_anchor)
            after = v.steps[origin_idx:]
            ups = any(s.kind == "amplified" for s in after)
            downs = any(s.kind == "attenuated" for s in after)
            v.non_monotonic = ups and downs
            # masked: the output anchor(s) downstream of the origin (and their parts it reaches) are clean
            # while it is flagged
            outs = [(a, c) for a, c in path if a.kind == "output"] if v.profile_basis == "dataflow" else outputs
            if outs and not any(out_flagged(a, c, reach) for a, c in outs):
                v.propagation = "masked"
            else:
                last = outs[-1][1] if outs else path[-1][1]
                origin = next(c for a, c in path if a.name == v.origin_anchor)
                r = last.primary / origin.primary if origin.primary > 0 else math.inf
                v.propagation = "amplified" if r > band else ("attenuated" if r < 1 / band else "stable")
        return v

    def _successors(self, names: list[str]) -> dict[str, list[str]]:
        """Immediate successors among the judged anchors ``names`` (topological order): ``q`` follows
        ``p`` when ``q`` is downstream of ``p`` with no judged anchor between them on the data flow;
        without the data flow, the next anchor in manifest order."""
        if self.descendants is None:
            return {p: names[i + 1:i + 2] for i, p in enumerate(names)}
        out = {}
        for i, p in enumerate(names):
            down = self._down(p)
            later = [q for q in names[i + 1:] if q in down]
            out[p] = [q for q in later if not any(q in self._down(r) for r in later if r != q)]
        return out

    def _down(self, name: str) -> set[str]:
        """Anchors downstream of ``name`` in the data flow, without the edge from a part of an output to
        that output (the output contains the part: not a further anchor of the same chain)."""
        down = self.descendants.get(name, set()) if self.descendants is not None else set()
        owner = self._part_of.get(name)
        return down - {owner} if owner else down

    def _mark_sustained(self, cells: dict[tuple[str, "str"], Cell]) -> None:
        """Flag the cells of a voting backend that lie on a run of at least ``sustained_anchors``
        judged anchors, each the immediate successor of the previous along the data flow, at all of
        which the backend departs from its peers (:meth:`_departs`). Longest runs by dynamic
        programming over the topological order (ending at / starting from each anchor)."""
        m = self.cfg.sustained_anchors
        for b in self.backends:
            names = [a.name for a in self.anchors if (a.name, b) in cells]
            dep = {n for n in names if self._departs(cells[(n, b)])}
            if len(dep) < m:
                continue
            succ = self._successors(names)
            end = {n: 1 for n in dep}
            for p in names:
                if p in dep:
                    for q in succ[p]:
                        if q in dep:
                            end[q] = max(end[q], end[p] + 1)
            start: dict[str, int] = {}
            for p in reversed(names):
                if p in dep:
                    start[p] = 1 + max((start[q] for q in succ[p] if q in dep), default=0)
            for n in names:
                if n not in dep or end[n] + start[n] - 1 < m:
                    continue
                c = cells[(n, b)]
                if c.flagged:
                    continue
                ratio = c.primary / c.peer_level if c.peer_level else math.inf
                c.flagged = True
                c.reason = (f"sustained departure: > {self.cfg.origin_k:g} x peers' median at {end[n] + start[n] - 1} "
                            f"anchors in a row along the data flow ({self.cfg.primary} {c.primary:.3g} = {ratio:.3g} x "
                            f"peers' median {c.peer_level:.3g} here; floor {c.floor:.3g})")

    def _departs(self, c: Cell) -> bool:
        """``c``'s backend departs from its peers at that anchor (localization rule, module docstring).
        Only a voting backend can depart below the flagging threshold: a reduced-precision variant
        departs from its fp32 peers everywhere by design, so for it only flagged cells count (its
        origin stays the first flagged anchor and the sustained rule never fires)."""
        if c.nonfinite or c.flagged:
            return True
        if c.peer_level is None or not self.backends[c.backend].votes:
            return False
        if c.range_ratio is not None and not c.range_ratio > self.cfg.origin_floor_fraction * c.floor:
            return False  # a part: the deviation must also reach its range (the part range rule)
        return c.primary > self.cfg.origin_k * c.peer_level and c.primary > self.cfg.origin_floor_fraction * c.floor

    def _trace_origin(self, profile: list[tuple["AnchorInfo", Cell]],
                      first: tuple["AnchorInfo", Cell]) -> tuple["AnchorInfo", Cell]:
        """The origin of a flagged backend: the earliest judged anchor ``o`` (topological order) that is
        ``first`` or an ancestor of it, such that the backend departs from its peers (:meth:`_departs`)
        at ``o`` and at every judged anchor that lies downstream of ``o`` and upstream of ``first``.
        Ancestry from the run's data flow; without it, every anchor before ``first`` in manifest order
        counts as upstream (parallel branches then break chains, so the origin stays later)."""
        names = [a.name for a, _ in profile]
        fi = names.index(first[0].name)
        before = profile[:fi]
        if self.descendants is not None:
            up = [(a, c) for a, c in before if first[0].name in self._down(a.name)]
        else:
            up = list(before)
        origin = first
        for i in range(len(up) - 1, -1, -1):  # walk back, latest first (manifest order: stop at a break)
            a, c = up[i]
            if self.descendants is not None:
                # only anchors on a path a -> first must depart; those checked already did
                between = [(b, d) for b, d in up[i + 1:] if b.name in self._down(a.name)]
            else:
                between = up[i + 1:]
            if self._departs(c) and all(self._departs(d) for _, d in between):
                origin = (a, c)
            elif not self._departs(c) and self.descendants is None:
                break
        return origin


def anchor_descendants(model, values: dict[str, str], index=None) -> dict[str, set[str]]:
    """Which anchors lie downstream of which, in the data flow of ``model``.

    Args:
        model: an ``onnx.ModelProto`` or the path of an ONNX file (external weights are not read).
        values: anchor name -> its ONNX value name (manifest ``anchor.value``).
        index: ``passes.graph.build_index(model.graph)`` when the caller has it already.

    Returns:
        anchor name -> the set of anchor names computed (directly or not) from it; an anchor is not its
        own descendant. One iterative forward sweep over the topologically ordered nodes
        (:func:`passes.graph.build_index`), each value carrying the bit set (a Python int) of the
        anchors it depends on: O(nodes x anchors / 64). Values read inside sub-graphs count as inputs
        of the node that owns the sub-graph.

    Raises:
        GraphError: the graph cannot be indexed (cycle, dangling input ...) or an anchor's value is
            neither produced in it nor one of its inputs (the model does not match the manifest).
        ModelLoadError: ``model`` is a path that cannot be read as ONNX.
    """
    from anpred.errors import GraphError
    from passes.graph import build_index

    if not hasattr(model, "graph"):
        from anpred.onnx_io import load_model

        model = load_model(model, load_external=False)
    idx = index if index is not None else build_index(model.graph)
    names = list(values)
    bit_of: dict[str, int] = {}
    for i, n in enumerate(names):
        val = values[n]
        if val not in idx.producer and val not in idx.graph_inputs and val not in idx.initializers:
            raise GraphError(f"anchor {n!r}: value {val!r} is not in the model's graph (does the model match "
                             "the manifest?)")
        bit_of[val] = bit_of.get(val, 0) | (1 << i)
    anc: dict[str, int] = {v: b for v, b in bit_of.items() if v in idx.graph_inputs or v in idx.initializers}
    for pos in range(len(idx.nodes)):
        mask = 0
        for v in idx.inputs[pos]:
            mask |= anc.get(v, 0)
        for v in idx.outputs[pos]:
            anc[v] = mask | bit_of.get(v, 0)
    out: dict[str, set[str]] = {n: set() for n in names}
    for j, n in enumerate(names):
        mask = anc.get(values[n], 0) & ~(1 << j)
        i = 0
        while mask:
            if mask & 1:
                out[names[i]].add(n)
            mask >>= 1
            i += 1
    return out


def _gap_text(gaps: dict[str, list[str]], total: int) -> str:
    """``reason (in N of M samples: s0004, s0005)`` per reason, joined by ``; ``."""
    parts = []
    for why, sids in gaps.items():
        if len(sids) >= total:
            parts.append(why)
        else:
            shown = ", ".join(sids[:4]) + (f" +{len(sids) - 4} more" if len(sids) > 4 else "")
            parts.append(f"{why} (in {len(sids)} of {total} samples: {shown})")
    return "; ".join(parts)


def median_of(arrays: list[np.ndarray]) -> np.ndarray:
    """Element-wise median of a few equally shaped float64 arrays (``np.nanmedian(stack, axis=0)``).

    Without NaN and with at most 9 arrays it runs a compare-exchange sorting network of
    ``np.minimum``/``np.maximum`` (contiguous passes; measured 1.2 ms against 15 ms for ``np.median``
    over axis 0 of a 5 x 102,400 stack, identical results); otherwise ``np.nanmedian``."""
    n = len(arrays)
    if n == 1:
        return arrays[0]
    if n > 9 or any(np.isnan(a).any() for a in arrays):
        return np.nanmedian(np.stack(arrays), axis=0)
    if n == 2:
        return 0.5 * (arrays[0] + arrays[1])
    v = list(arrays)
    # bubble network: after pass i the largest i+1 values sit at the end; half the passes suffice
    need = n // 2 + 1
    for i in range(need):
        for j in range(n - 1 - i):
            lo, hi = np.minimum(v[j], v[j + 1]), np.maximum(v[j], v[j + 1])
            v[j], v[j + 1] = lo, hi
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def _finite_key(v: float) -> float:
    return 1e300 if math.isinf(v) else (-1.0 if math.isnan(v) else v)


def ulp_dtype(precision: str) -> str:
    """The dtype whose ULP ``max_ulp`` counts for a backend of ``precision``: fp32 -> float32, fp16 ->
    float16, bf16 -> bfloat16, int8 -> **float32** (quantized backends hand back dequantized float32
    anchors; an int8 step is a per-tensor scale, not a unit of the anchor's dtype)."""
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
