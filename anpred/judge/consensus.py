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
   ``min_voters`` distinct votes remain; the result lists where this happened.
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

import itertools
import math
import warnings
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig
from anpred.judge.accumulate import Accumulator, Reservoir
from anpred.judge.independence import PairDistances, merge_correlated
from anpred.judge.localize import Localizer
from anpred.judge.positions import sample_positions
from anpred.judge.scales import cell_precision, floor_and_basis, natural_units
from anpred.judge.stats import ErrorStats, Reference, same_array, ulp_dtype
from anpred.judge.struct import AnchorInfo, BackendInfo, Cell, OracleResult
from anpred.judge.verdict import backend_verdict, gap_text, judge_cell

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

    def __init__(self, anchors: list[AnchorInfo], backends: list[BackendInfo], config: OracleConfig | None = None,
                 reference: str | None = None, seed: int = 0, descendants: dict[str, set[str]] | None = None,
                 population: str | None = None, steps: dict[str, float] | None = None):
        self.cfg = config or OracleConfig()
        # None: the fp32 oracle (voters against the fp32 consensus, reduced-precision backends' budget
        # verdicts against it too); "int8"/"fp16"/...: a precision population whose members all vote
        # (their implementation verdicts, :mod:`anpred.judge.populations`)
        self.population = population
        self.steps = dict(steps or {})  # anchor -> int8 quantization step (scale) in the QDQ model
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
        self.merged: dict[str, dict[frozenset, int]] = {a.name: {} for a in self.anchors}
        self.apart: dict[str, dict[frozenset, int]] = {a.name: {} for a in self.anchors}
        self.consensus_modes: dict[str, set[str]] = {a.name: set() for a in self.anchors}
        self.samples = 0
        self.sample_ids: list[str] = []
        # the latest sample's consensus at each output anchor and each backend's (nRMSE, non-finite count)
        # there, reused by a streamed run (anpred.pipeline.stream); replaced by add(), not pickled
        self.last_consensus: dict[str, np.ndarray] = {}
        self.last_nrmse: dict[tuple[str, str], tuple[float, int]] = {}
        self._rho_merged_now = False  # set by _groups: families merged by error correlation at this anchor
        # largest finite |consensus| over the samples, for parts and their outputs (scale guard)
        self._part_of = {a.name: a.part_of for a in self.anchors if a.part_of}
        self._scaled = set(self._part_of) | set(self._part_of.values())
        self.consensus_max: dict[str, float] = {}
        self.skipped_parts: dict[str, str] = {}  # part -> why it was not judged on its own
        self.undecided: dict[str, int] = {}  # anchor -> elements where the families' votes tied (NaN/Inf)
        self.all_nonfinite: set[str] = set()  # anchors whose consensus was NaN/Inf everywhere (agreed on)
        # float64 execution(s) of the model: (anchor, voter) -> [sum d^2, sum c^2] against it
        self._fp64 = [b.name for b in backends if b.precision == "fp64"]
        self._fp64_sums: dict[tuple[str, str], list[float]] = {}
        self._fp64_consensus: dict[str, list[float]] = {}  # anchor -> the consensus' (dd, cc) against fp64
        # pooled distances between family votes: error correlation (partial kernel sharing)
        self.indep = PairDistances()
        self.rho_merged: dict[str, dict[frozenset, float]] = {a.name: {} for a in self.anchors}  # last rho

    # ---- consensus ------------------------------------------------------------------------------
    def _pick_reference(self, present: list[str]) -> str | None:
        if self.reference is not None:
            return self.reference if self.reference in present else None
        # a backend whose library has a known defect this model reaches is the reference only as a last resort
        for clean in (True, False):
            for name in self.cfg.reference_priority:
                if name in present and name in self.backends and self.backends[name].votes and \
                        (not clean or not self.backends[name].defects):
                    return name
        voters = [b for b in present if self.backends[b].votes]
        voters.sort(key=lambda b: bool(self.backends[b].defects))
        return voters[0] if voters else None

    def _identical(self, a: np.ndarray, b: np.ndarray) -> bool:
        tol = self.cfg.correlated_nrmse
        if tol <= 0:
            return same_array(a, b)  # NaN != NaN: agreeing on NaN is not shared kernels
        d = (a - b).ravel()
        bb = float(np.einsum("i,i->", b.ravel(), b.ravel()))
        dd = float(np.einsum("i,i->", d, d))
        return bool(np.isfinite(dd)) and (dd == 0.0 or (bb > 0 and math.sqrt(dd / bb) <= tol))

    def _groups(self, votes: dict[str, np.ndarray], anchor: str | None = None) -> list[list[str]]:
        """Families whose votes are identical (``correlated_nrmse``) grouped; singletons otherwise.
        No merge when all are identical (nothing tells correlation from agreement) or when fewer than
        ``min_voters`` distinct votes would remain. Then, at ``anchor``, groups whose pooled error
        correlation so far (:mod:`anpred.judge.independence`, this sample included) is at least
        ``correlated_rho`` are merged too, most correlated first, while ``min_voters`` groups remain."""
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
        per = self.indep.d2.get(anchor or "", {})
        self._rho_merged_now = False
        if anchor is not None and len(groups) >= 4 and self.cfg.correlated_rho < 1 and \
                all(frozenset(p) in per for p in itertools.combinations([g[0] for g in groups], 2)):
            groups, merged = merge_correlated(per, groups, self.cfg.correlated_rho, self.cfg.min_voters)
            self.rho_merged[anchor].update(merged)
            self._rho_merged_now = bool(merged)
        return groups

    def consensus(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray | None, str, str | None]:
        """Consensus of one anchor in one sample. Returns ``(c, mode, reference)`` with mode
        ``median:<families>`` (merged families joined by ``+``) or ``reference:<name>``; ``c`` is None
        when no consensus can be formed."""
        c, mode, ref, _, _ = self._consensus(arrays)
        return c, mode, ref

    def _consensus(self, arrays, anchor: str | None = None):
        """``(c, mode, reference, groups, undecided)``: the median of the family votes (non-finite
        values voted on element-wise, :func:`vote`), else one reference backend's tensor (its NaN/Inf
        then undecided: one backend cannot outvote anyone); ``c`` None when no voter has a finite value."""
        fams: dict[str, list[np.ndarray]] = {}
        for b, a in arrays.items():
            info = self.backends[b]
            if info.votes:
                fams.setdefault(info.family, []).append(a)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, counted later
            if len(fams) >= self.cfg.min_voters:
                # a family's vote: its members voted on like families (a NaN/finite tie inside a family
                # of two is undecided there: that family abstains at those elements)
                fv = {f: ((m[0], None) if len(m) == 1 else vote(m)) for f, m in fams.items()}
                votes = {f: v for f, (v, _) in fv.items()}
                if anchor is not None:
                    self.indep.add(anchor, votes)
                groups = self._groups(votes, anchor)
                # a family whose members tie at an element abstains there
                c, undecided = vote([votes[g[0]] for g in groups], [fv[g[0]][1] for g in groups])
                if undecided is not None and undecided.all():
                    return None, "undecided", None, [], None  # the votes tie at every element
                mode = "median:" + ",".join(sorted("+".join(g) for g in groups))
                return c, mode, None, groups, undecided
        if not any(np.isfinite(a).any() for m in fams.values() for a in m) and fams:
            return None, "none", None, [], None
        ref = self._pick_reference([b for b in arrays if np.isfinite(arrays[b]).any()])
        if ref is None:
            return None, "none", None, [], None
        c = arrays[ref]
        und = ~np.isfinite(c)
        return c, f"reference:{ref}", ref, [], (und if und.any() else None)

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
        self.last_consensus, self.last_nrmse = {}, {}
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
            self._rho_merged_now = False
            c, mode, ref, groups, undecided = self._consensus(got, a.name)
            if c is None:
                msg = ("the voting families tie between NaN/Inf and finite values at every element: no consensus"
                       if mode == "undecided" else "no finite value in any voting backend (all NaN/Inf): no consensus")
                self.anchor_gaps.setdefault(a.name, {}).setdefault(msg, []).append(sid)
                for b in got:
                    self._gap(a.name, b, msg, sid)
                continue
            self.consensus_modes[a.name].add(mode)
            if a.kind == "output" and not self._rho_merged_now:  # (else not what consensus() gives)
                self.last_consensus[a.name] = c
            if a.name in self._scaled:
                with np.errstate(invalid="ignore"):
                    m = float(np.nanmax(np.abs(np.where(np.isfinite(c), c, np.nan)))) if c.size else 0.0
                self.consensus_max[a.name] = max(self.consensus_max.get(a.name, 0.0), m)
            for g in groups:
                key = frozenset(g)
                if len(g) > 1:
                    self.merged[a.name][key] = self.merged[a.name].get(key, 0) + 1
            if undecided is not None:
                key = a.name if ref is None else f"{a.name} (reference {ref}: its NaN/Inf)"
                self.undecided[key] = self.undecided.get(key, 0) + int(np.count_nonzero(undecided))
            if not np.isfinite(c).any():
                self.all_nonfinite.add(a.name)
            if self._fp64 and self._fp64[0] in got:
                self._add_fp64(a.name, got, c)
            ref_tensor = Reference(c, undecided, distribution_positions=self._distribution_positions(a.name, c.size))
            done: list[tuple[np.ndarray, str, Any]] = []  # (tensor, ULP dtype, its Comparison)
            for b, x in got.items():
                if b == ref:
                    self.ref_at[(a.name, b)] = self.ref_at.get((a.name, b), 0) + 1
                    if a.kind == "output":
                        self.last_nrmse[(a.name, b)] = (0.0, 0)  # it is the consensus here
                    continue
                acc = self.acc.get((a.name, b))
                if acc is None:
                    acc = self.acc[(a.name, b)] = Accumulator(self.cfg.primary, Reservoir(self.cfg.reservoir, self.rng))
                dt = ulp_dtype(cell_precision(self.backends[b].precision, a.dtype))
                # a tensor bit-identical to one already compared (members of one population sharing a
                # kernel path, correlated families) has the same Comparison: reuse it (no second sort)
                cmp = next((c_ for y, d_, c_ in done if d_ == dt and same_array(x, y)), None)
                if cmp is None:
                    cmp = ref_tensor.compare(x, dt, distribution=self.population is None)
                    done.append((x, dt, cmp))
                acc.add(cmp)
                if a.kind == "output":
                    self.last_nrmse[(a.name, b)] = (cmp.stats.nrmse, cmp.nonfinite)

    def __getstate__(self):
        st = self.__dict__.copy()  # (a checkpoint of a streamed run: the latest sample's tensors are not kept)
        st["last_consensus"], st["last_nrmse"] = {}, {}
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

    def _add_fp64(self, anchor: str, got: dict[str, np.ndarray], consensus: np.ndarray | None = None) -> None:
        """Each voter's (and the consensus') squared deviation from the float64 execution at ``anchor``
        (finite positions)."""
        ref = got[self._fp64[0]]
        tensors = [((anchor, b), x) for b, x in got.items() if self.backends[b].votes]
        if consensus is not None and consensus.shape == ref.shape:
            tensors.append((None, consensus))
        for key, x in tensors:
            ok = np.isfinite(x) & np.isfinite(ref)
            d = (x - ref)[ok]
            r = ref[ok]
            s = self._fp64_sums.setdefault(key, [0.0, 0.0]) if key else self._fp64_consensus.setdefault(anchor, [0.0, 0.0])
            s[0] += float(np.einsum("i,i->", d, d))
            s[1] += float(np.einsum("i,i->", r, r))

    @property
    def fp64_consensus_error(self) -> dict[str, float]:
        """anchor -> pooled nRMSE of the consensus against the float64 execution (empty when no
        ``fp64`` backend ran)."""
        return {a: (math.sqrt(dd / cc) if cc > 0 else (0.0 if dd == 0 else math.inf))
                for a, (dd, cc) in self._fp64_consensus.items()}

    def _arbitrate(self, cells: dict[tuple[str, str], Cell]) -> list[str]:
        """Accuracy arbitration by the float64 execution (where ``onnx-reference-fp64`` ran): a flagged
        cell of an fp32 voter whose own deviation from the float64 execution is smaller than the
        consensus' (pooled nRMSE, :attr:`fp64_error` vs :attr:`fp64_consensus_error`) departs from the
        consensus because the consensus is less accurate there (a majority sharing one error, e.g. a
        sequential float32 sum, docs/oracle.md): it is unflagged, with the two figures in its reason.
        A voter on the arbiter's own library (family ``onnx-reference``) is never arbitrated: it shares the
        library's defects, and its closeness to the arbiter proves nothing. The float64 execution's own
        flagged cells are cleared only at anchors where an independent fp32 voter that is flagged itself
        (departs from the consensus) is closer to it than the consensus (else the arbiter departing alone
        is the library's defect, and stays flagged; a clean voter nearer by float32 noise backs
        nothing). No constant: the comparison is between two measurements of the run. Returns one note
        per backend arbitrated."""
        if not self._fp64_consensus:
            return []
        mine, theirs = self.fp64_error, self.fp64_consensus_error
        arbiter = self._fp64[0]
        # the library the float64 execution runs on (its family without "-fp64"): a voter on that library
        # shares its defects, so its closeness to the arbiter proves nothing; it is never arbitrated
        lib = self.backends[arbiter].family.removesuffix("-fp64")
        done: dict[str, list[str]] = {}
        backed: dict[str, str] = {}  # anchor -> a flagged independent voter found closer to float64 there

        def closer(a: str, b: str) -> tuple[float, float] | None:
            e_b, e_c = mine.get((a, b)), theirs.get(a)
            return (e_b, e_c) if e_b is not None and e_c is not None and e_b < e_c else None

        def clear(cell, e_b: float, e_c: float, by: str = "") -> None:
            cell.flagged = False
            why = f"backed by {by}, which departs from the consensus too and is closer to float64; " if by else ""
            cell.reason = (f"not flagged: closer to the float64 execution than the consensus (nRMSE {e_b:.3g} "
                           f"against {e_c:.3g}); {why}the consensus shares an error here"
                           + (f" [{cell.reason}]" if cell.reason else ""))
            done.setdefault(cell.backend, []).append(f"{cell.anchor} ({e_b:.2g} vs {e_c:.2g}{', backed by ' + by if by else ''})")

        for (a, b), cell in cells.items():
            info = self.backends[b]
            if not (info.votes and info.precision == "fp32") or info.family == lib or cell.nonfinite:
                continue
            pair = closer(a, b) if cell.flagged else None
            if pair is None:
                continue
            # a voter that departs from the consensus itself and is closer to float64 (a clean voter that
            # happens to be nearer by float32 noise does not count: with a wrong arbiter, every voter and
            # the consensus sit at about the arbiter's own error)
            backed.setdefault(a, b)
            clear(cell, *pair)
        for (a, b), cell in cells.items():  # the arbiter itself: only where such a voter backs it
            if b == arbiter and cell.flagged and not cell.nonfinite and a in backed:
                clear(cell, 0.0, theirs[a], by=backed[a])
        return [f"{b}: departs from the consensus at {len(v)} anchor(s) but is closer to the float64 execution "
                f"({self._fp64[0]}) than the consensus there, nRMSE {'; '.join(v[:4])}{' ...' if len(v) > 4 else ''}: "
                "the majority shares an error (a less accurate computation), not flagged"
                for b, v in done.items()]

    @property
    def fp64_error(self) -> dict[tuple[str, str], float]:
        """(anchor, voter) -> pooled nRMSE of the voter against the float64 execution (empty when no
        ``fp64`` backend ran)."""
        return {k: (math.sqrt(dd / cc) if cc > 0 else (0.0 if dd == 0 else math.inf))
                for k, (dd, cc) in self._fp64_sums.items()}

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
        """Decide every (anchor, backend) over the samples seen, then each backend's verdict."""
        notes: list[str] = []
        self._guard_parts(notes)
        cells = self._cells()
        loc = Localizer(self.anchors, self.backends, self.cfg, self.descendants, self._part_of)
        if self.cfg.sustained_anchors >= 2:
            loc.mark_sustained(cells)
        notes.extend(self._arbitrate(cells))
        if not self._fp64 and self.population is None and any(
                c.flagged and self.backends[c.backend].votes and self.backends[c.backend].precision == "fp32"
                for c in cells.values()):
            notes.append("an fp32 voter is flagged against the consensus; whether it is the less accurate one or a "
                         "majority shares an error can be told by a float64 execution: add onnx-reference-fp64 to the "
                         "backends (docs/oracle.md, the float64 arbiter)")
        verdicts = {b: backend_verdict(info, self.anchors, cells, gaps=self.gaps, ref_at=self.ref_at,
                                       samples=self.samples, localizer=loc)
                    for b, info in self.backends.items()}
        consensus = {a.name: sorted(self.consensus_modes[a.name]) for a in self.anchors}
        notes.extend(self._basis_notes(verdicts, consensus))
        unjudged_anchors = self._unjudged_anchors(cells, notes)
        correlated = self._correlated()
        notes.extend(self._correlated_notes(correlated))
        for a, n in self.undecided.items():
            notes.append(f"anchor {a}: the votes tied between finite and NaN/Inf values at {n} element(s) "
                         "(summed over samples): undecided there, judged for no backend")
        for a in sorted(self.all_nonfinite):
            notes.append(f"anchor {a}: the voting families agreed on NaN/Inf at every element in some sample: "
                         "no finite value to compare, only whether each backend returns the same NaN/Inf")
        return OracleResult(
            cells=[cells[k] for a in self.anchors for k in [(a.name, b) for b in self.backends] if k in cells],
            verdicts=verdicts, consensus=consensus, unjudged_anchors=unjudged_anchors, notes=notes,
            correlated=correlated, samples=self.samples, independence=self.indep.summary(self.cfg.correlated_rho),
            plot_data={k: acc.res.data for k, acc in self.acc.items()})

    def _basis_notes(self, verdicts, consensus: dict[str, list[str]]) -> list[str]:
        """Notes on what the verdicts rest on: the manifest order (data flow unknown), a reference."""
        notes = []
        if self.descendants is None and any(v.flagged for v in verdicts.values()):
            notes.append("propagation follows the manifest order (the run's data flow is unknown): parallel "
                         "branches interleave there, so ratios and non-monotonic marks may mix branches")
        ref_modes = sorted({m for ms in consensus.values() for m in ms if m.startswith("reference:")})
        if ref_modes:
            notes.append("fewer than %d voting families at some anchors: consensus = %s (the reference is not judged "
                         "there; verdicts rest on the noise floor and fewer peers)"
                         % (self.cfg.min_voters, ", ".join(ref_modes)))
        return notes

    def _unjudged_anchors(self, cells: dict[tuple[str, str], Cell], notes: list[str]) -> dict[str, str]:
        """Anchors no backend could be judged at -> why; a note per anchor with gaps (appended to ``notes``)."""
        unjudged_anchors: dict[str, str] = {}
        for a in self.anchors:
            gaps = self.anchor_gaps.get(a.name)
            if not gaps or a.part_of:
                continue
            text = gap_text(gaps, self.samples)
            if not any(k[0] == a.name for k in cells):
                unjudged_anchors[a.name] = text
                notes.append(f"anchor {a.name} could not be judged: {text}")
            else:
                notes.append(f"anchor {a.name} could not be judged in some samples: {text}")
        return unjudged_anchors

    def _correlated_notes(self, correlated: list[dict[str, Any]]) -> list[str]:
        cfg, notes = self.cfg, []
        for c in correlated:
            n_all = len(self.anchors)
            tol = "bit-identical" if cfg.correlated_nrmse <= 0 else f"within nRMSE {cfg.correlated_nrmse:g}"
            if c.get("rho"):
                r = list(c["rho"].values())
                tol = (f"error-correlated (three-cornered hat rho {min(r):.2f}-{max(r):.2f} >= correlated_rho "
                       f"{cfg.correlated_rho:g}) or bit-identical")
            differ = f"; judged apart at {', '.join(c['differ'][:4])}{' ...' if len(c['differ']) > 4 else ''}" \
                if c["differ"] else ""
            notes.append(f"correlated backends: {' and '.join(c['backends'])} (families {', '.join(c['families'])}) "
                         f"gave {tol} tensors at {len(c['anchors'])} of {n_all} anchors (in {min(c['anchors'].values())}"
                         f"-{max(c['anchors'].values())} of {self.samples} samples each): counted as one consensus vote "
                         f"there (shared kernels){differ}")
        return notes

    def _cells(self) -> dict[tuple[str, str], Cell]:
        """Every judged (anchor, backend), decided against its peers (:func:`judge_cell`) with the floor
        and basis of :mod:`anpred.judge.scales`: fp32 voters against their fp32 peers; a
        reduced-precision backend of the fp32 oracle (its *budget* verdict) against the other families
        of its own precision population, measured against the fp32 consensus, its lost-signal test
        against the fp32 voters; members of a population oracle against each other."""
        cells: dict[tuple[str, str], Cell] = {}
        pooled = {k: acc.pooled() for k, acc in self.acc.items()}
        for a in self.anchors:
            judged = [b for b in self.backends if (a.name, b) in pooled]
            for b in judged:
                info = self.backends[b]
                acc = self.acc[(a.name, b)]
                corr = self._merged_families(a.name, info.family)
                voters = [p for p in judged
                          if p != b and self.backends[p].votes and self.backends[p].family != info.family
                          and self.backends[p].family not in corr]
                prec = cell_precision(info.precision, a.dtype)
                step = self._step(a)
                rms = math.sqrt(acc.cc / acc.n) if acc.n else None
                extra: dict[str, Any] = {}
                if info.votes and self.population is None and prec != "fp32" and prec != info.precision:
                    # a tensor of the model's own reduced type (float16 weights and activations): its
                    # peers' spread, with the natural unit of that type as the floor
                    peers = voters
                    floor, basis = floor_and_basis(self.cfg, prec, a.stage, population=peers, anchor_type=True)
                elif info.votes and self.population is None:
                    peers = voters
                    floor, basis = floor_and_basis(self.cfg, prec, a.stage)
                else:
                    peers = voters if info.votes else \
                        [p for p in judged if p != b and not self.backends[p].votes
                         and self.backends[p].precision == info.precision and self.backends[p].family != info.family]
                    floor, basis = floor_and_basis(self.cfg, prec, a.stage, population=peers, step=step, rms=rms,
                                                   implementation=self.population is not None,
                                                   cost=self.cost_for(a.name, b))
                    if not info.votes:  # budget verdict: the population's cost; the signal is the fp32 voters'
                        extra["signal_peers"] = [v for v in (self._primary(pooled[(a.name, p)]) for p in voters)
                                                 if not math.isnan(v)]
                        if not peers:
                            peers = voters  # no population peer: today's rule, the constant floor decides
                levels = [self._primary(pooled[(a.name, p)]) for p in peers]
                levels = [v for v in levels if not math.isnan(v)]
                st = pooled[(a.name, b)]
                units = natural_units(prec, st.max_abs, math.sqrt(acc.dd / acc.n) if acc.n else math.nan, rms, step)
                if self.population is not None:
                    extra["k"] = self.cfg.k_for(self.population, population=True)
                cells[(a.name, b)] = judge_cell(a, info, acc, st, levels, self.cfg,
                                                self.consensus_max.get(a.name, 0.0), floor=floor, basis=basis,
                                                units=units, **extra)
        return cells

    def cost_for(self, anchor: str, backend: str) -> float | None:
        """The precision's cost at ``anchor`` for ``backend``'s implementation verdict: the median
        deviation of the population's *other* members from the fp32 consensus (None when unknown)."""
        others = [v for b, v in self.costs.get(anchor, {}).items() if b != backend]
        return float(np.median(others)) if others else None

    def _step(self, a: AnchorInfo) -> float | None:
        """int8 quantization step of anchor ``a`` (a part: its output's; an anchor without its own:
        the nearest ancestor anchor's that has one, through the data flow when known)."""
        name = a.part_of or a.name
        if name in self.steps:
            return self.steps[name]
        if self.descendants is None:
            return None
        ups = [x.name for x in self.anchors if x.name in self.steps and name in self.descendants.get(x.name, ())]
        return self.steps[ups[-1]] if ups else None

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
            rho = {a: r for a in anchors if (r := self.rho_merged[a].get(g)) is not None}
            out.append({"families": fams, "backends": members, "anchors": anchors, "differ": differ,
                        "kind": "error-correlated" if rho else "bit-identical", "rho": rho})
        return out

def vote(arrays: list[np.ndarray], abstain: list[np.ndarray | None] | None = None
         ) -> tuple[np.ndarray, np.ndarray | None]:
    """Element-wise consensus of family votes with non-finite values voted on (``docs/oracle.md``).

    Each element's votes fall in four classes: finite, NaN, +Inf, -Inf. The class most votes fall in
    wins: finite -> the median of the finite votes (:func:`median_of`), NaN/+Inf/-Inf -> that value. A
    tie between the largest classes (e.g. one NaN, one Inf, one finite; two NaN, two finite) is
    *undecided*: NaN in the result and True in the returned mask, judged for no one.

    Args:
        arrays: the family votes, equally shaped float64 arrays (at least one).
        abstain: per vote, a boolean mask of the elements where it abstains (a family whose own
            members tied there), or None; abstaining votes are not counted.

    Returns:
        ``(c, undecided)``: float64 array of the votes' shape; boolean mask or None when no element
        is undecided. Without any non-finite vote this is exactly :func:`median_of`.
    """
    if all(np.isfinite(a).all() for a in arrays) and not any(m is not None for m in (abstain or [])):
        return median_of(arrays), None
    stack = np.stack(arrays)
    present = np.ones(stack.shape, bool)
    for i, m in enumerate(abstain or []):
        if m is not None:
            present[i] = ~m
    isnan = np.isnan(stack) & present
    pinf, ninf = (stack == np.inf) & present, (stack == -np.inf) & present
    fin = np.isfinite(stack) & present
    counts = np.stack([fin.sum(0), isnan.sum(0), pinf.sum(0), ninf.sum(0)])
    top = counts.max(0)
    undecided = ((counts == top).sum(0) > 1) | (top == 0)
    cls = counts.argmax(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(np.where(fin, stack, np.nan), axis=0)
    c = np.select([cls == 0, cls == 1, cls == 2], [med, np.nan, np.inf], -np.inf).astype(np.float64)
    c[undecided] = np.nan
    return c, (undecided if undecided.any() else None)


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

