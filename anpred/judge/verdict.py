"""The oracle's decisions: one cell (a backend at an anchor) and one backend over all anchors.

Contract: :func:`judge_cell` turns an (anchor, backend)'s pooled statistics and its peers' primary
statistics into a :class:`anpred.judge.struct.Cell` (flagged or not, and why); :func:`backend_verdict`
turns a backend's cells and gaps into a :class:`anpred.judge.struct.BackendVerdict` (status, what
could not be judged, worst anchor) and hands origin and propagation to
:meth:`anpred.judge.localize.Localizer.localize`. Rules (``docs/oracle.md``):

- **outlier + floor**: flagged when ``S > k * median(S_peers)`` and ``S > floor(precision, stage)``
  (the floor alone without peers), or when the backend produced NaN/Inf where the consensus is finite;
- **signal lost**: pooled cosine similarity with a nonzero consensus <= 0 flags whatever the floor,
  provided the peers are > k times closer;
- **part range rule**: a part of an output is flagged only where its largest deviation also exceeds
  the floor times its largest |consensus|;
- **wrong tail** (fp32 voters; a graded finding: ``Cell.tail`` and a warning of the verdict, never a
  flag): an error confined to small values (an activation's tail) is invisible in nRMSE, which the
  large values dominate. A cell the nRMSE passes carries the finding when the
  ``ulp_quantile`` quantile of its error in ULPs of the consensus (``ErrorStats.ulp_q``: relative to
  each element's magnitude) exceeds ``ulp_floor`` and ``k`` times its peers' median while the bulk,
  the median ULP error (``ulp_median``), does not depart from the peers' (within ``origin_k`` times
  theirs: a tail, not a broad error; a broad error below the floor also has large ULP errors where the
  consensus is small, and stays the floor's to judge). Peers whose nRMSE median is 0 (bit-identical
  to the consensus) leave it to the floor too. Not applied to an output judged part by part (its
  parts judge its small-valued portions, with the part range rule) nor to the parts. Where the float64
  execution ran, the same warning is also given against it, which sees a tail most families share
  (:meth:`anpred.judge.arbiter.Arbiter.tails`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from anpred.defaults import OracleConfig
from anpred.judge.accumulate import Accumulator
from anpred.judge.localize import Localizer
from anpred.judge.scales import threshold_basis
from anpred.judge.stats import ErrorStats
from anpred.judge.struct import AnchorInfo, BackendInfo, BackendVerdict, Cell

__all__ = ["CellBasis", "backend_verdict", "gap_text", "judge_cell"]


def _within_one_step(st: ErrorStats, units: dict | None) -> bool:
    """The one-step rule of an int8 cell: every element at most one grid point away from the nearest
    grid point of the consensus (``max |d| <= 1.5 steps``: half a step of rounding to nearest plus one
    step) and no bias beyond half a step (``|mean d| <= 0.5 step``). A correct implementation on the int8
    grid can land on the next grid point where the exact value lies near a rounding boundary (its
    accumulation differs in the last bits); rounding to nearest is unbiased, so a mean beyond half a
    step (a shifted zero point: every element one step off) is not rounding. Both bounds are in the
    grid's own unit."""
    if not units or units.get("unit") != "int8 step" or not units.get("size"):
        return False
    return units["max"] <= 1.5 + 1e-9 and abs(st.mean_signed) <= 0.5 * units["size"]


@dataclass
class CellBasis:
    """What a cell is judged against besides its peers' primary statistic (:func:`judge_cell`).

    Attributes:
        floor: the threshold's lower bound (default ``config.floor_at(info.precision, stage)``);
            ``basis`` says where it and the peers come from (:mod:`anpred.judge.scales`).
        signal_peers: the primary statistic of the backends whose closeness makes a lost signal a
            finding (default the peers): a reduced-precision backend's budget verdict passes the fp32
            voters here, its population peers as the peers. With ``signal_peers`` given, an nRMSE >= 1
            (no more of the consensus than an all-zero tensor) counts as a lost signal too.
        units: the deviation in the natural unit of the precision (:func:`anpred.judge.scales.natural_units`).
        k: the outlier factor (default ``config.k_for(info.precision)``).
        peer_ulps: the peers' ``(ulp_q, ulp_median)`` (:class:`ErrorStats`); given (fp32 voters), the
            wrong-tail rule applies (module docstring).
    """

    floor: float | None = None
    basis: str = ""
    signal_peers: list[float] | None = None
    units: dict | None = None
    k: float | None = None
    peer_ulps: list[tuple[float, float]] | None = None


def judge_cell(
    anchor: AnchorInfo,
    info: BackendInfo,
    acc: Accumulator,
    st: ErrorStats,
    peers: list[float],
    config: OracleConfig,
    consensus_max: float = 0.0,
    opts: CellBasis | None = None,
) -> Cell:
    """The verdict of backend ``info`` at ``anchor`` (module docstring).

    Args:
        acc: the (anchor, backend)'s accumulator; ``st``: its pooled statistics (``acc.pooled()``).
        peers: the pooled primary statistic of each peer (judged backends of other, not merged
            families at this anchor, of the population the backend is judged in), NaN left out.
        consensus_max: for a part of an output, its largest finite |consensus| over the samples.
        opts: floor, basis, signal peers, units, k and the peers' ULP statistics (:class:`CellBasis`).
    """
    cfg = config
    o = opts or CellBasis()
    floor, basis, signal_peers, units, k, peer_ulps = o.floor, o.basis, o.signal_peers, o.units, o.k, o.peer_ulps
    prim = float(getattr(st, cfg.primary))
    peer_level = float(np.median(peers)) if peers else None
    if floor is None:
        floor = cfg.floor_at(info.precision, anchor.stage)
    if k is None:
        k = cfg.k_for(info.precision)
    thr = max(k * peer_level, floor) if peer_level is not None else floor
    threshold_by, basis = threshold_basis(thr, k, peer_level, floor, basis)
    ps = np.array(acc.per_sample) if acc.per_sample else np.array([np.nan])
    reason = tail = ""
    # a part of an output: its largest deviation relative to its largest |consensus| value
    range_ratio = None
    if anchor.part_of:
        range_ratio = st.max_abs / consensus_max if consensus_max > 0 else math.inf
    sig = peers if signal_peers is None else signal_peers
    sig_level = float(np.median(sig)) if sig else None
    no_signal = st.n > 0 and acc.cc > 0 and (st.cosine <= 0.0 or (signal_peers is not None and st.nrmse >= 1.0))
    lost = cfg.signal_lost and no_signal and (sig_level is None or prim > k * sig_level)
    if acc.nonfinite or acc.suppressed or acc.mismatched:
        flagged, reason = True, _nonfinite_reason(acc)
    elif st.n == 0:
        flagged, reason = False, "no finite value to judge"
    elif lost and not prim > thr:
        flagged = True
        lost = (
            "every value 0"
            if acc.xx == 0
            else "no positive correlation"
            if st.cosine <= 0
            else "nRMSE >= 1, no closer than an all-zero tensor"
        )
        reason = (
            f"signal lost: cosine similarity {st.cosine:.3g} with the consensus ({lost}; "
            f"{cfg.primary} {prim:.3g}, under the threshold {thr:.3g})"
        )
    else:
        flagged = bool(prim > thr)
        if flagged and range_ratio is not None and not range_ratio > floor:
            flagged = False
            reason = (
                f"not flagged: {cfg.primary} {prim:.3g} > threshold {thr:.3g}, but its largest "
                f"deviation {st.max_abs:.3g} is {range_ratio:.3g} of the part's largest value, "
                f"under the floor {floor:.3g} (part range rule)"
            )
        elif flagged and _within_one_step(st, units):
            flagged = False
            reason = (
                f"not flagged: {cfg.primary} {prim:.3g} > threshold {thr:.3g}, but every element is within one "
                f"int8 grid point of the consensus' (max {units['max']:.3g} step <= 1.5) and the mean deviation "
                f"{st.mean_signed / units['size']:+.3g} step is within half a step: the grid's resolution "
                "(one-step rule)"
            )
        elif not flagged and peer_ulps is not None:
            tail = _wrong_tail(st, peer_ulps, k, cfg, prim, thr, peer_level)[1]
        elif flagged:
            reason = _flag_reason(f"{cfg.primary} {prim:.3g}", floor, k, peer_level, range_ratio)
    return Cell(
        anchor=anchor.name,
        backend=info.name,
        samples=acc.samples,
        stats=st,
        primary=prim,
        per_sample=_per_sample(ps),
        floor=floor,
        peer_level=peer_level,
        threshold=thr,
        nonfinite=acc.nonfinite,
        flagged=flagged,
        reason=reason,
        range_ratio=range_ratio,
        basis=basis,
        threshold_by=threshold_by,
        units=units or {},
        suppressed=acc.suppressed + acc.mismatched,
        undecided=acc.undecided,
        tail=tail,
    )


def _nonfinite_reason(acc: Accumulator) -> str:
    """What the backend's NaN/Inf differ in from the consensus' (counts over the samples)."""
    what = []
    if acc.nonfinite:
        what.append(f"{acc.nonfinite} NaN/Inf where the consensus is finite")
    if acc.suppressed:
        what.append(f"{acc.suppressed} finite values where the consensus is NaN/Inf (NaN suppressed)")
    if acc.mismatched:
        what.append(f"{acc.mismatched} NaN/Inf of another kind than the consensus'")
    return "; ".join(what)


def _flag_reason(value: str, floor: float, k: float, peer_level: float | None, range_ratio: float | None) -> str:
    """Why a cell is flagged: its statistic (``value``: name and value) above the floor, above ``k`` x the
    peers' median, and for a part its largest deviation relative to the part's largest value."""
    why = [f"{value} > floor {floor:.3g}"]
    if peer_level is not None:
        why.append(f"> {k:g} x peers' median {peer_level:.3g}")
    if range_ratio is not None:
        why.append(f"largest deviation {range_ratio:.3g} of the part's largest value")
    return " and ".join(why)


def _per_sample(ps) -> dict[str, float]:
    """The per-sample primary statistic's median, 90th percentile and largest value. An infinite value
    (a nonzero tensor against an all-zero consensus: nRMSE inf) is taken as it is: no interpolation
    between infinities (inf - inf, numpy's warning, a NaN)."""
    v = np.asarray(ps, dtype=np.float64)
    how = "linear" if np.isfinite(v).all() else "higher"
    return {
        "p50": float(np.quantile(v, 0.5, method=how)),
        "p90": float(np.quantile(v, 0.9, method=how)),
        "max": float(np.max(v)),
    }


def _wrong_tail(
    st: ErrorStats,
    peer_ulps: list[tuple[float, float]],
    k: float,
    cfg: OracleConfig,
    prim: float,
    thr: float,
    peer_level: float | None,
) -> tuple[bool, str]:
    """The wrong-tail rule (module docstring): ``(flagged, reason)``."""
    q, med = st.ulp_q, st.ulp_median
    if math.isnan(q) or not q > cfg.ulp_floor or not peer_ulps or not peer_level:
        return False, ""
    level = float(np.median([u for u, _ in peer_ulps]))
    bulk = float(np.median([m for _, m in peer_ulps]))
    # the bulk must not depart (the localization rule's factor origin_k; >= 1 ULP: a peer median of 0 is exactness)
    if not (q > k * level and med <= cfg.origin_k * max(bulk, 1.0)):
        return False, ""
    return True, (
        f"wrong tail (a warning, not a flag): the {cfg.ulp_quantile:g} quantile of the error in ULPs of the "
        f"consensus {q:.3g} > "
        f"{k:g} x peers' median {level:.3g} and > ulp_floor {cfg.ulp_floor:g}, while its median ULP error "
        f"{med:.3g} is within origin_k {cfg.origin_k:g} x the peers' {bulk:.3g} ({cfg.primary} {prim:.3g}, "
        "under its threshold "
        f"{thr:.3g}): an error relative to each element's magnitude, on part of the values"
    )


def backend_verdict(
    info: BackendInfo,
    anchors: list[AnchorInfo],
    cells: dict[tuple[str, str], Cell],
    *,
    gaps: dict[tuple[str, str], dict[str, list[str]]],
    ref_at: dict[tuple[str, str], int],
    samples: int,
    localizer: Localizer,
) -> BackendVerdict:
    """The verdict on backend ``info`` (see :class:`anpred.judge.struct.BackendVerdict`).

    Args:
        anchors: the judged anchors in manifest order; ``cells``: (anchor, backend) -> :class:`Cell`.
        gaps: (anchor, backend) -> reason -> sample ids where it could not be judged.
        ref_at: (anchor, backend) -> samples in which the backend was the consensus.
        samples: samples in the run; ``localizer``: origin and propagation.
    """
    b = info.name
    v = BackendVerdict(
        backend=b,
        family=info.family,
        precision=info.precision,
        votes=info.votes,
        flagged=False,
        precision_requested=info.requested if info.requested != info.precision else "",
    )
    profile: list[tuple[AnchorInfo, Cell]] = []
    for a in anchors:
        cell = cells.get((a.name, b))
        nref = ref_at.get((a.name, b), 0)
        if nref:
            v.reference_at.append(a.name)
        gap = gaps.get((a.name, b), {})
        if cell is None:
            if (nref and nref == samples) or a.part_of:
                continue  # a part's gaps are its output's
            v.unjudged[a.name] = gap_text(gap, samples) if gap else "not judged"
            continue
        if cell.samples + nref < samples and not a.part_of:
            v.partial[a.name] = f"judged on {cell.samples} of {samples} samples; " + (
                gap_text(gap, samples) if gap else "other samples not judged"
            )
        profile.append((a, cell))
    v.judged_anchors = len(profile)
    v.samples = max((c.samples for _, c in profile), default=0)
    tails = [(a, c) for a, c in profile if c.tail and not c.flagged]
    if tails:
        a0, c0 = tails[0]
        more = (
            f" (and {len(tails) - 1} more anchor(s): {', '.join(a.name for a, _ in tails[1:4])})"
            if len(tails) > 1
            else ""
        )
        v.warnings.append(f"{b}: {c0.tail} at {a0.name}{more}")
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
    if profile:
        worst_a, worst_c = max(profile, key=lambda ac: (ac[1].flagged, _finite_key(_over(ac[1]))))
        v.worst_anchor, v.worst_primary = worst_a.name, worst_c.primary
        v.worst_ratio_to_threshold = _over(worst_c)
    localizer.localize(v, profile)
    return v


def gap_text(gaps: dict[str, list[str]], total: int) -> str:
    """``reason (in N of M samples: s0004, s0005)`` per reason, joined by ``; `` (``gaps``: reason ->
    sample ids; a reason of every one of the ``total`` samples is given alone)."""
    parts = []
    for why, sids in gaps.items():
        if len(sids) >= total:
            parts.append(why)
        else:
            shown = ", ".join(sids[:4]) + (f" +{len(sids) - 4} more" if len(sids) > 4 else "")
            parts.append(f"{why} (in {len(sids)} of {total} samples: {shown})")
    return "; ".join(parts)


def _over(c: Cell) -> float:
    """A cell's primary statistic over its threshold."""
    return c.primary / c.threshold if c.threshold > 0 else (math.inf if c.primary > 0 else 0.0)


def _finite_key(v: float) -> float:
    return 1e300 if math.isinf(v) else (-1.0 if math.isnan(v) else v)
