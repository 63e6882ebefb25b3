"""The consensus population-deviation oracle: consensus per anchor and sample, streaming accumulation,
and the verdicts it hands on (:class:`Oracle`).

Contract: :class:`Oracle` receives one aligned sample per :meth:`Oracle.add` and returns an
:class:`anpred.judge.struct.OracleResult` from :meth:`Oracle.finish`; the flagging rules of a cell and a
backend are in :mod:`anpred.judge.verdict`, origin and propagation in :mod:`anpred.judge.localize`.

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
   ``min_voters`` distinct votes remain; the result lists where this happened
   (:mod:`anpred.judge.families`).
2. Each backend's deviation from ``c`` (:class:`anpred.judge.stats.Reference`), accumulated over samples
   (:mod:`anpred.judge.accumulate`).
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
of concatenated outputs (:mod:`anpred.judge.parts`, ``AnchorInfo.part_of``) are judged like anchors with
their output's stage when their largest |consensus| is at least ``part_min_scale`` x their output's
(else left out, with a note) and flagged only where, besides the rule above, their largest deviation
exceeds the floor times their largest |consensus| (**part range rule**: a part judged relative to its
RMS, e.g. class probabilities that are nearly all 0, would otherwise turn deviations far below its
range, such as ONNX Runtime's Sigmoid tail, into flags); a part and its own output are not two links of
one data-flow chain. The **propagation** profile gives the ratio of ``S`` between consecutive judged
anchors along the data flow: the origin and its descendants
(:func:`anpred.judge.localize.anchor_descendants`, from the run's model), so that anchors of a parallel
branch the fault cannot reach are left out.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig
from anpred.judge.accumulate import Accumulator, Reservoir
from anpred.judge.arbiter import Arbiter, truth_of
from anpred.judge.camps import SplitLog, camp_distances, decide, vote_camps
from anpred.judge.cells import judge_cells
from anpred.judge.deviations import deviation_cells, shape_gap
from anpred.judge.families import FamilyGroups
from anpred.judge.localize import Localizer
from anpred.judge.oracle_notes import basis_notes, correlated, correlated_notes, unjudged_anchors
from anpred.judge.positions import sample_positions
from anpred.judge.scales import cell_precision, voter_floor
from anpred.judge.stats import Reference, same_array, ulp_dtype
from anpred.judge.ties import TieCandidates
from anpred.judge.struct import AnchorInfo, BackendInfo, OracleResult
from anpred.judge.verdict import backend_verdict
from anpred.judge.votes import median_of, vote

__all__ = ["Oracle", "median_of", "vote"]


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
            :func:`anpred.judge.localize.anchor_descendants`); None: propagation follows the manifest
            order (a note says so when a backend is flagged).

    Use :meth:`add` once per sample, then :meth:`finish`.
    """

    def __init__(
        self,
        anchors: list[AnchorInfo],
        backends: list[BackendInfo],
        config: OracleConfig | None = None,
        reference: str | None = None,
        seed: int = 0,
        descendants: dict[str, set[str]] | None = None,
        population: str | None = None,
        steps: dict[str, float] | None = None,
    ):
        self.cfg = config or OracleConfig()
        # None: the fp32 oracle (voters against the fp32 consensus, reduced-precision backends' budget
        # verdicts against it too); "int8"/"fp16"/...: a precision population whose members all vote
        # (their implementation verdicts, :mod:`anpred.judge.populations`)
        self.population = population
        self.steps = dict(steps or {})  # anchor -> int8 quantization step (scale) in the QDQ model
        # backend -> its own program's steps where the run's int8 members ran several programs
        # (anpred.judge.populations: the QDQ model and a PT2E program quantize with other scales)
        self.member_steps: dict[str, dict[str, float]] = {}
        # population oracles: anchor -> member -> its deviation from the fp32 consensus, set by
        # anpred.judge.populations before finish(): the precision's cost, a floor of the
        # implementation verdict (cost_for)
        self.costs: dict[str, dict[str, float]] = {}
        self.descendants = descendants
        self.anchors = list(anchors)
        self.backends = {b.name: b for b in backends}
        self.reference = reference
        self.rng = np.random.default_rng(seed)
        self.acc: dict[tuple[str, str], Accumulator] = {}
        # (anchor, backend) -> reason -> sample ids where that backend could not be judged there
        self.gaps: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.anchor_gaps: dict[str, dict[str, list[str]]] = {}  # anchor -> reason -> sample ids
        self.ref_at: dict[tuple[str, str], int] = {}  # (anchor, backend) -> samples it was the consensus
        self.consensus_modes: dict[str, set[str]] = {a.name: set() for a in self.anchors}
        self.samples = 0
        self.sample_ids: list[str] = []
        # the latest sample's consensus at each output anchor and each backend's (nRMSE, non-finite count)
        # there, reused by a streamed run (anpred.pipeline.stream); replaced by add(), not pickled
        self.last_consensus: dict[str, np.ndarray] = {}
        self.last_nrmse: dict[tuple[str, str], tuple[float, int]] = {}
        # the latest sample's consensus at each output anchor wherever one was formed (after a split or
        # a merge too; last_consensus holds only what consensus() gives): what the conformance scores
        self.formed_consensus: dict[str, np.ndarray] = {}
        # largest finite |consensus| over the samples, for parts and their outputs (scale guard)
        self._part_of = {a.name: a.part_of for a in self.anchors if a.part_of}
        self._scaled = set(self._part_of) | set(self._part_of.values())
        self.consensus_max: dict[str, float] = {}
        self.skipped_parts: dict[str, str] = {}  # part -> why it was not judged on its own
        self.undecided: dict[str, int] = {}  # anchor -> elements where the families' votes tied (NaN/Inf)
        self.all_nonfinite: set[str] = set()  # anchors whose consensus was NaN/Inf everywhere (agreed on)
        # float64 execution(s) of the model: distances from it, the arbitration (anpred.judge.arbiter)
        self.arbiter = Arbiter(self.backends, [b.name for b in backends if b.precision == "fp64"])
        # which families count as one vote (shared kernels), measured on the run (anpred.judge.families)
        self.families = FamilyGroups(self.cfg, [a.name for a in self.anchors])
        self.splits = SplitLog()  # split votes between camps of families (anpred.judge.camps)
        # (anchor, backend) -> (kind, reason) -> sample ids: a wrong shape or a missing output where the
        # voting families agree (anpred.judge.deviations)
        self.deviations: dict[tuple[str, str], dict[tuple[str, str], list[str]]] = {}
        # a tie (no consensus): anchor -> the candidates' disagreement, and the backends judged outside
        # the tied camps against the nearest candidate (anpred.judge.ties)
        self.tie_levels: dict[str, list[float]] = {}
        self.tie_judged: dict[str, set[str]] = {}

    # ---- consensus ------------------------------------------------------------------------------
    def _pick_reference(self, present: list[str]) -> str | None:
        if self.reference is not None:
            return self.reference if self.reference in present else None
        # a backend whose library has a known defect this model reaches is the reference only as a last resort
        for clean in (True, False):
            for name in self.cfg.reference_priority:
                if (
                    name in present
                    and name in self.backends
                    and self.backends[name].votes
                    and (not clean or not self.backends[name].defects)
                ):
                    return name
        voters = [b for b in present if self.backends[b].votes]
        voters.sort(key=lambda b: bool(self.backends[b].defects))
        return voters[0] if voters else None

    def voter_floor(self, a: AnchorInfo | None) -> float:
        """The fp32 voters' floor at anchor ``a`` (:func:`anpred.judge.scales.voter_floor`; stage 0 and
        float32 when None): what makes a split between camps material (:mod:`anpred.judge.camps`)."""
        return voter_floor(self.cfg, a.stage if a is not None else 0, a.dtype if a is not None else "float32")

    def _truth(self, arrays: dict[str, np.ndarray], a: AnchorInfo | None) -> np.ndarray | None:
        """The float64 execution's tensor at this anchor rounded to its element type (None: not here)."""
        name = self.arbiter.name
        if name is None or name not in arrays:
            return None
        return truth_of(arrays[name], a.dtype if a is not None else "float32")

    def consensus(
        self, arrays: dict[str, np.ndarray], anchor: AnchorInfo | None = None
    ) -> tuple[np.ndarray | None, str, str | None]:
        """Consensus of one anchor in one sample (``anchor``: its stage and type set the floor of a
        split, :meth:`voter_floor`; default stage 0, float32). Returns ``(c, mode, reference)`` with mode
        ``median:<families>`` (merged families joined by ``+``; after a split, the camp decided for and
        ``(split: ...)``), ``reference:<name>``, or ``tie`` (a split no rule decides); ``c`` is None when
        no consensus can be formed."""
        c, mode, ref, _, _, _ = self._consensus(arrays, anchor)
        return c, mode, ref

    def _consensus(self, arrays, a: AnchorInfo | None = None, sample: str | None = None):
        """``(c, mode, reference, groups, undecided, decision)``: the families' votes split into camps
        and the split decided (:mod:`anpred.judge.camps`), then the median of the decided camp's
        group votes (non-finite values voted on element-wise, :func:`vote`); else one reference
        backend's tensor (its NaN/Inf then undecided: one backend cannot outvote anyone); ``c`` None
        when no voter has a finite value or the split is a tie. With ``sample`` (streaming) the
        pooled measurements (error correlation, splits) are updated."""
        anchor = a.name if (a is not None and sample is not None) else None
        fams: dict[str, list[np.ndarray]] = {}
        for b, x in arrays.items():
            info = self.backends[b]
            if info.votes:
                fams.setdefault(info.family, []).append(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, counted later
            if len(fams) >= self.cfg.min_voters:
                # a family's vote: its members voted on like families (a NaN/finite tie inside a family
                # of two is undecided there: that family abstains at those elements)
                fv = {f: ((m[0], None) if len(m) == 1 else vote(m)) for f, m in fams.items()}
                votes = {f: v for f, (v, _) in fv.items()}
                truth = self._truth(arrays, a)
                if truth is not None and truth.shape != next(iter(votes.values())).shape:
                    truth = None
                if anchor is not None:
                    self.families.measure(anchor, votes, truth)
                floor = self.voter_floor(a)
                names, dist, _ = camp_distances(votes)
                camps = (
                    [names]
                    if self.population is not None
                    else vote_camps(names, dist, votes, floor, truth, self.cfg.k_for("fp32"), self.arbiter.library)
                )
                dec = None
                if len(camps) > 1:
                    dec = decide(camps, votes, floor, truth, self.arbiter.library, self.cfg.conversion_units)
                    if anchor is not None:
                        self.splits.record(anchor, sample, dec)
                    if dec.winner is None:
                        return None, "tie", None, [], None, dec
                groups = []
                for k, camp in enumerate(camps):
                    g = self.families.groups({f: votes[f] for f in camp}, anchor, truth is not None)
                    groups.extend(g)
                    if dec is None or k == dec.winner:
                        mine = g
                # a family whose members tie at an element abstains there
                c, undecided = vote([votes[g[0]] for g in mine], [fv[g[0]][1] for g in mine])
                if undecided is not None and undecided.all():
                    return None, "undecided", None, [], None, dec  # the votes tie at every element
                mode = "median:" + ",".join(sorted("+".join(g) for g in mine))
                if dec is not None:
                    lost = " | ".join(",".join(cp) for k, cp in enumerate(camps) if k != dec.winner)
                    mode += f" (split: decided by {dec.basis} against {lost})"
                return c, mode, None, groups, undecided, dec
        if not any(np.isfinite(x).any() for m in fams.values() for x in m) and fams:
            return None, "none", None, [], None, None
        ref = self._pick_reference([b for b in arrays if np.isfinite(arrays[b]).any()])
        if ref is None:
            return None, "none", None, [], None, None
        c = arrays[ref]
        und = ~np.isfinite(c)
        return c, f"reference:{ref}", ref, [], (und if und.any() else None), None

    # ---- streaming ------------------------------------------------------------------------------
    def _gap(self, anchor: str, backend: str, why: str, sid: str) -> None:
        self.gaps.setdefault((anchor, backend), {}).setdefault(why, []).append(sid)

    def add(
        self,
        tensors: dict[str, dict[str, np.ndarray]],
        unaligned: dict[tuple[str, str], str] | None = None,
        sample_id: str | None = None,
        absent: dict[str, str] | None = None,
    ) -> None:
        """Judge one sample.

        Args:
            tensors: ``{anchor: {backend: array}}`` (aligned, canonical shape).
            unaligned: ``{(anchor, backend): reason}`` for tensors the aligner could not align.
            sample_id: the sample's id (for the report of what could not be judged).
            absent: ``{backend: reason}`` for backends that stored nothing for this sample.
        """
        sid = sample_id if sample_id is not None else f"#{self.samples}"
        self.last_consensus, self.last_nrmse, self.formed_consensus = {}, {}, {}
        self.samples += 1
        self.sample_ids.append(sid)
        unaligned = {tuple(k): v for k, v in (unaligned or {}).items()}
        absent = absent or {}
        for a in self.anchors:
            got, why = self._collect(a, tensors.get(a.name) or {}, unaligned, absent)
            if len(got) < 2:
                for b, w in why.items():
                    self._gap(a.name, b, w, sid)
                unal = [f"{b}: {w[len('not aligned: ') :]}" for b, w in why.items() if w.startswith("not aligned: ")]
                other = [f"{b}: {w}" for b, w in why.items() if not w.startswith("not aligned: ")]
                parts = [
                    f"fewer than two backends produced it ({', '.join(got)})"
                    if got
                    else "no backend produced a usable tensor"
                ]
                if unal:
                    parts.append("not aligned: " + "; ".join(unal))
                parts.extend(other)
                msg = "; ".join(parts)
                self.anchor_gaps.setdefault(a.name, {}).setdefault(msg, []).append(sid)
                for b in got:
                    self._gap(a.name, b, "no other backend to compare with here", sid)
                continue
            self._judge_anchor(a, got, why, sid, absent)

    def _collect(
        self, a: AnchorInfo, raw: dict[str, np.ndarray], unaligned, absent
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The tensors of anchor ``a`` that can be compared (float64, the voters' most common shape) and,
        per other backend, why not."""
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
        # shapes: the voters' most common shape is canonical; others cannot be compared
        if got:
            shapes: dict[tuple, int] = {}
            for b, v in got.items():
                shapes[v.shape] = shapes.get(v.shape, 0) + (2 if self.backends[b].votes else 1)
            canon = max(shapes, key=shapes.get)
            for b in [b for b, v in got.items() if v.shape != canon]:
                why[b] = f"shape {list(got[b].shape)} differs from the other backends' shape {list(canon)}"
                del got[b]
        return got, why

    def _judge_anchor(
        self, a: AnchorInfo, got: dict[str, np.ndarray], why: dict[str, str], sid: str, absent: dict[str, str]
    ) -> None:
        """Form the consensus of anchor ``a`` in sample ``sid`` and compare every backend in ``got``
        with it; the backends in ``why`` are gaps, or deviations (a wrong shape, a missing output) where
        at least two voting families agree (:func:`anpred.judge.deviations.shape_gap`)."""
        self.families.merged_now = False
        c, mode, ref, groups, undecided, dec = self._consensus(got, a, sid)
        agreeing = len({self.backends[b].family for b in got if self.backends[b].votes})
        for b, w in why.items():
            kind = shape_gap(a, w, b in absent) if c is not None and agreeing >= 2 else ""
            if kind:
                self.deviations.setdefault((a.name, b), {}).setdefault((kind, w), []).append(sid)
            else:
                self._gap(a.name, b, w, sid)
        if c is None:
            msg = {
                "undecided": "the voting families tie between NaN/Inf and finite values at every element: no consensus",
                "tie": "split vote: the families form camps of equal size and no float64 execution decides "
                "(see the note on the split): no consensus",
            }.get(mode, "no finite value in any voting backend (all NaN/Inf): no consensus")
            family_of = {b: (self.backends[b].family if self.backends[b].votes else None) for b in got}
            tie = TieCandidates(dec, got, family_of) if mode == "tie" else None
            outside = {b: x for b, x in got.items() if tie is not None and tie.outside(b, family_of)}
            if not outside:
                self.anchor_gaps.setdefault(a.name, {}).setdefault(msg, []).append(sid)
            for b in got:
                if b not in outside:
                    self._gap(a.name, b, msg, sid)
            if outside:
                self._judge_outside_tie(a, tie, outside)
            return
        self.consensus_modes[a.name].add(mode)
        if a.kind == "output" and not self.families.merged_now and dec is None:  # (else not what consensus() gives)
            self.last_consensus[a.name] = c
        if a.kind == "output":
            self.formed_consensus[a.name] = c
        if a.name in self._scaled:
            with np.errstate(invalid="ignore"):
                m = float(np.nanmax(np.abs(np.where(np.isfinite(c), c, np.nan)))) if c.size else 0.0
            self.consensus_max[a.name] = max(self.consensus_max.get(a.name, 0.0), m)
        self.families.count(a.name, groups)
        if undecided is not None:
            key = a.name if ref is None else f"{a.name} (reference {ref}: its NaN/Inf)"
            self.undecided[key] = self.undecided.get(key, 0) + int(np.count_nonzero(undecided))
        if not np.isfinite(c).any():
            self.all_nonfinite.add(a.name)
        if self.arbiter.name is not None and self.arbiter.name in got:
            # ULPs against the truth for the wrong-tail warning (fp32 oracle; not the parts: range rule)
            ulp = (
                (a.dtype, ulp_dtype(cell_precision("fp32", a.dtype)), self.cfg.ulp_quantile)
                if self.population is None and a.name not in self._scaled
                else None
            )
            self.arbiter.add(a.name, got, c, ulp)
        ref_tensor = Reference(c, undecided, distribution_positions=self._distribution_positions(a.name, c.size))
        done: list[tuple[np.ndarray, str, Any, Any]] = []  # (tensor, ULP dtype, quantile, its Comparison)
        for b, x in got.items():
            if b == ref:
                self.ref_at[(a.name, b)] = self.ref_at.get((a.name, b), 0) + 1
                if a.kind == "output":
                    self.last_nrmse[(a.name, b)] = (0.0, 0)  # it is the consensus here
                continue
            acc = self._acc(a.name, b)
            dt, q = self._compare_args(a, b)
            # a tensor bit-identical to one already compared (members of one population sharing a
            # kernel path, correlated families) has the same Comparison: reuse it (no second sort)
            cmp = next((c_ for y, d_, q_, c_ in done if d_ == dt and q_ == q and same_array(x, y)), None)
            if cmp is None:
                cmp = ref_tensor.compare(x, dt, distribution=self.population is None, ulp_quantile=q)
                done.append((x, dt, q, cmp))
            acc.add(cmp)
            if a.kind == "output":
                self.last_nrmse[(a.name, b)] = (cmp.stats.nrmse, cmp.nonfinite)

    def _acc(self, anchor: str, backend: str) -> Accumulator:
        acc = self.acc.get((anchor, backend))
        if acc is None:
            acc = self.acc[(anchor, backend)] = Accumulator(self.cfg.primary, Reservoir(self.cfg.reservoir, self.rng))
        return acc

    def _compare_args(self, a: AnchorInfo, backend: str) -> tuple[str, float | None]:
        """``(ULP dtype, ULP quantile)`` of ``backend``'s comparison at anchor ``a``: the ULP quantiles
        only where the wrong-tail rule reads them (fp32 voters)."""
        prec = cell_precision(self.backends[backend].precision, a.dtype)
        return ulp_dtype(prec), (self.cfg.ulp_quantile if self.backends[backend].votes and prec == "fp32" else None)

    def _judge_outside_tie(self, a: AnchorInfo, tie: TieCandidates, outside: dict[str, np.ndarray]) -> None:
        """Judge the backends outside a tied split against the nearest candidate; record the
        candidates' own disagreement as their peers' level (:mod:`anpred.judge.ties`)."""
        prim = self.cfg.primary
        dt32 = ulp_dtype(cell_precision("fp32", a.dtype))
        self.tie_levels.setdefault(a.name, []).extend(
            tie.levels(lambda r, x: float(getattr(r.compare(x, dt32, ulp_quantile=None).stats, prim)))
        )
        for b, x in outside.items():
            dt, q = self._compare_args(a, b)
            cmp = tie.nearest(
                lambda r: r.compare(x, dt, distribution=self.population is None, ulp_quantile=q),
                lambda cm: float(getattr(cm.stats, prim)),
            )
            self._acc(a.name, b).add(cmp)
            self.tie_judged.setdefault(a.name, set()).add(b)

    def __getstate__(self):
        st = self.__dict__.copy()  # (a checkpoint of a streamed run: the latest sample's tensors are not kept)
        st["last_consensus"], st["last_nrmse"], st["formed_consensus"] = {}, {}, {}
        return st

    def _distribution_positions(self, anchor: str, size: int) -> np.ndarray | None:
        """The positions the Wasserstein distance of ``anchor`` is computed on: ``distribution_k`` (set
        by :class:`anpred.judge.samples.SampleJudge` in a streamed run) sampled positions
        (:func:`anpred.judge.positions.sample_positions`) of a larger tensor; None: every element."""
        k = getattr(self, "distribution_k", None)
        if not k or size <= k:
            return None
        cache = self.__dict__.setdefault("_dist_pos", {})
        if (anchor, size) not in cache:
            cache[(anchor, size)] = sample_positions(anchor, size, k)
        return cache[(anchor, size)]

    @property
    def fp64_error(self) -> dict[tuple[str, str], float]:
        """(anchor, voter) -> pooled nRMSE of the voter against the float64 execution (empty when no
        ``fp64`` backend ran; :class:`anpred.judge.arbiter.Arbiter`)."""
        return self.arbiter.error

    @property
    def fp64_consensus_error(self) -> dict[str, float]:
        """anchor -> pooled nRMSE of the consensus against the float64 execution (empty when none ran)."""
        return self.arbiter.consensus_error

    # ---- verdicts -------------------------------------------------------------------------------
    def _guard_parts(self, notes: list[str]) -> None:
        """Leave out the parts that fail the scale guard (``part_min_scale``): from here on
        ``self.anchors`` holds the anchors that are judged (manifest anchors and kept parts)."""
        keep = []
        for a in self.anchors:
            if a.part_of:
                pm, om = self.consensus_max.get(a.name, 0.0), self.consensus_max.get(a.part_of, 0.0)
                if not (om > 0 and pm >= self.cfg.part_min_scale * om):
                    self.skipped_parts[a.name] = (
                        f"largest |consensus| {pm:.3g} < part_min_scale "
                        f"{self.cfg.part_min_scale:g} x its output's {om:.3g}"
                    )
                    continue
            keep.append(a)
        if self.skipped_parts:
            notes.append(
                f"{len(self.skipped_parts)} part(s) of concatenated outputs judged only as part of the whole "
                f"output (scale guard part_min_scale = {self.cfg.part_min_scale:g}): "
                + "; ".join(f"{k}: {v}" for k, v in list(self.skipped_parts.items())[:4])
                + (" ..." if len(self.skipped_parts) > 4 else "")
            )
        self.anchors = keep

    def finish(self) -> OracleResult:
        """Decide every (anchor, backend) over the samples seen, then each backend's verdict."""
        notes: list[str] = []
        self._guard_parts(notes)
        cells = judge_cells(self, self._scaled)
        loc = Localizer(self.anchors, self.backends, self.cfg, self.descendants, self._part_of)
        if self.cfg.sustained_anchors >= 2:
            loc.mark_sustained(cells)
        deviation_cells(cells, self.deviations, self.anchors, self.backends, self.samples)
        notes.extend(self.arbiter.arbitrate(cells))
        self.arbiter.tails(cells, self.cfg, self._scaled)
        notes.extend(self.splits.notes(self.samples))
        if (
            self.arbiter.name is None
            and self.population is None
            and any(
                c.flagged and self.backends[c.backend].votes and self.backends[c.backend].precision == "fp32"
                for c in cells.values()
            )
        ):
            notes.append(
                "an fp32 voter is flagged against the consensus; whether it is the less accurate one or a "
                "majority shares an error can be told by a float64 execution: add onnx-reference-fp64 to the "
                "backends (docs/oracle.md, the float64 arbiter)"
            )
        verdicts = {
            b: backend_verdict(
                info, self.anchors, cells, gaps=self.gaps, ref_at=self.ref_at, samples=self.samples, localizer=loc
            )
            for b, info in self.backends.items()
        }
        consensus = {a.name: sorted(self.consensus_modes[a.name]) for a in self.anchors}
        notes.extend(w for v in verdicts.values() for w in v.warnings)  # wrong tails (graded findings)
        notes.extend(basis_notes(self, verdicts, consensus))
        unjudged = unjudged_anchors(self, cells, notes)
        corr = correlated(self)
        notes.extend(correlated_notes(self, corr))
        for a, n in self.undecided.items():
            notes.append(
                f"anchor {a}: the votes tied between finite and NaN/Inf values at {n} element(s) "
                "(summed over samples): undecided there, judged for no backend"
            )
        for a in sorted(self.all_nonfinite):
            notes.append(
                f"anchor {a}: the voting families agreed on NaN/Inf at every element in some sample: "
                "no finite value to compare, only whether each backend returns the same NaN/Inf"
            )
        return OracleResult(
            cells=[cells[k] for a in self.anchors for k in [(a.name, b) for b in self.backends] if k in cells],
            verdicts=verdicts,
            consensus=consensus,
            unjudged_anchors=unjudged,
            notes=notes,
            correlated=corr,
            samples=self.samples,
            independence=self.families.indep.summary(self.cfg.correlated_rho),
            plot_data={k: acc.res.data for k, acc in self.acc.items()},
            splits=self.splits.summary(),
        )

    def cost_for(self, anchor: str, backend: str) -> float | None:
        """The precision's cost at ``anchor`` for ``backend``'s implementation verdict: the median
        deviation of the population's *other* members from the fp32 consensus (None when unknown)."""
        others = [v for b, v in self.costs.get(anchor, {}).items() if b != backend]
        return float(np.median(others)) if others else None
