r"""Camps: which voting families agree, and which camp the consensus is taken from.

Correct independent implementations agree exactly or to rounding *because* they are correct: exact
operators (Mod, Round, comparisons, Where, Resize nearest, max pooling, data movement) give
bit-identical results in every correct library. Agreement is therefore no evidence of shared kernels,
and a median over "merged" groups of agreeing families can hand a wrong minority the majority. So
before anything is merged, the family votes of one anchor and sample are split into **camps**:

    camp distance  D_ij = ||v_i - v_j||_2 / median_f ||v_f||_2

over the elements where every vote is finite (non-finite values are voted on element by element,
:func:`anpred.judge.votes.vote`: a family returning NaN where the others agree on a finite value is
flagged there, and is no camp of its own for it). Camps are the clusters of complete linkage
(``scipy.cluster.hierarchy``) cut at ``t = max(floor, k * s)`` (:func:`camp_cut`): the voters' noise
floor at the anchor (the floor a deviation must exceed to be flagged,
:func:`anpred.judge.scales.floor_and_basis`), or ``k`` times the voters' own spread ``s`` (the median
distance of a family to its nearest other one) where that is larger, as the verdict's threshold is
``max(floor, k * peers' median)``: every two families of one camp are within ``t`` of each other, and
two camps are apart by more than ``t``. A split into several camps
is **material** by construction: a member of a camp the consensus is not taken from deviates from it by
more than the floor, i.e. it can be flagged.

**Decision.** One camp: nothing to decide (the ordinary median of every family). Several:

1. *by the float64 execution* where it ran (``onnx-reference-fp64``): the truth ``t64`` rounded to the
   anchor's element type; each camp's error is the nRMSE of its closest member (leaving out the
   arbiter's own library, ``onnx-reference``: it shares the arbiter's defects, its closeness proves
   nothing) against it; the camp closest to it is decided for, provided its error is within the floor
   (a float64 execution that agrees with no camp is no arbiter: then step 2);
2. *by the count of families* (never of merged groups: bit-identical families are counted each, since
   correct ones are bit-identical; but families that run one conversion of the graph count once,
   :func:`camp_counts`): the largest camp, when it is strictly larger than every other;
3. otherwise a **tie**: no consensus at that anchor and sample (reported); only the backends outside
   the tied camps are judged there, against the nearest tied camp (:mod:`anpred.judge.ties`).

Each decision is reported (:class:`SplitLog`): the camps, the one decided for and on what basis.
Merging families into one vote (bit-identical or error-correlated, :mod:`anpred.judge.independence`)
happens within a camp only, so it can no longer change who wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


__all__ = ["Decision", "SplitLog", "camp_cut", "camp_distances", "decide", "form_camps", "truth_camps", "vote_camps"]

_FAR = 1e300  # a finite stand-in for "infinitely far" (scipy's linkage needs finite distances)


def camp_distances(votes: dict[str, np.ndarray]) -> tuple[list[str], np.ndarray, float]:
    """Pairwise camp distances of the family votes (module docstring).

    Args:
        votes: family -> vote (float64 arrays of one shape).

    Returns:
        ``(families sorted, D (F x F, nRMSE, symmetric, 0 on the diagonal), scale)``: ``D_ij`` =
        ``||v_i - v_j||_2 / scale`` over the elements where every vote is finite, ``scale`` the median
        of the votes' norms there (robust: one wild family does not set it; the votes' norms differ by
        their errors only); inf for a nonzero difference at scale 0.
    """
    fams = sorted(votes)
    stack = np.stack([np.asarray(votes[f], dtype=np.float64).ravel() for f in fams])
    ok = np.isfinite(stack).all(axis=0)
    if not ok.all():
        stack = stack[:, ok]
    norms = np.sqrt(np.einsum("ij,ij->i", stack, stack))
    scale = float(np.median(norms)) if norms.size else 0.0
    # one Gram matrix of the differences to the first vote (products of error size: no cancellation
    # at the scale of the values, as in anpred.judge.independence.PairDistances)
    e = stack[1:] - stack[0]
    g = e @ e.T
    dg = np.diag(g)
    n = len(fams)
    d2 = np.zeros((n, n))
    d2[0, 1:] = d2[1:, 0] = dg
    d2[1:, 1:] = np.maximum(dg[:, None] + dg[None, :] - 2 * g, 0.0)
    np.fill_diagonal(d2, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(d2 == 0, 0.0, np.sqrt(d2) / scale if scale > 0 else np.inf)
    return fams, d, scale


def form_camps(fams: list[str], d: np.ndarray, floor: float, k: float | None = None) -> list[list[str]]:
    """Complete-linkage clusters of ``fams`` with distance matrix ``d`` cut at :func:`camp_cut` (every two
    members of a camp within it), largest first (ties: by the first family's name)."""
    n = len(fams)
    cut = camp_cut(d, floor, k)
    if n == 1 or not (d > cut).any():
        return [list(fams)]
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    cond = squareform(np.minimum(d, _FAR), checks=False)
    labels = fcluster(linkage(cond, method="complete"), t=cut, criterion="distance")
    camps: dict[int, list[str]] = {}
    for f, lab in zip(fams, labels):
        camps.setdefault(int(lab), []).append(f)
    return sorted(camps.values(), key=lambda c: (-len(c), c[0]))


def camp_cut(d: np.ndarray, floor: float, k: float | None = None) -> float:
    """The distance at which the families' votes are cut into camps: ``max(floor, k * s)``, ``s`` the
    median over the families of the distance to their nearest other family (the voters' own spread at
    this anchor and sample), ``k`` the factor a flagged cell must exceed its peers' median by
    (``DEFAULTS.k``, :func:`anpred.judge.verdict.judge_cell`); ``floor`` alone when ``k`` is None.

    Why the spread: a split must be one the verdict would act on. Independent correct libraries differ
    by their rounding, which can reach the floor (sequential float32 sums); cut at the floor alone, such
    noise broke the families into camps of one and the vote into ties, every family unjudged (the
    regression: ``tests/test_camps.py::test_independent_rounding_near_the_floor_forms_no_camps``). Families that agree
    exactly or to rounding have nearest neighbours at 0 or at their rounding, so a wrong minority (or a
    wrong plurality of one shared converter) still forms a camp of its own. But the floor alone when
    ``s > 2 * floor``: two families each within the floor of a common truth are at most ``2 * floor``
    apart (triangle inequality), so nearest families further apart disagree beyond rounding; cut by
    their spread, such voters (every family off in its own way, or three correct families against three
    each off in its own way) were one camp whose spread raised every threshold and nobody was flagged.
    Cut at the floor they form camps: decided by the float64 execution (:func:`truth_camps`), by count,
    or a tie (no consensus there, :mod:`anpred.judge.ties`)."""
    if k is None or len(d) < 2:
        return floor
    off = np.where(np.eye(len(d), dtype=bool), np.inf, d)
    spread = float(np.median(off.min(axis=1)))
    if not np.isfinite(spread) or spread > 2 * floor:
        return floor
    return max(floor, k * spread)


def truth_camps(
    fams: list[str],
    votes: dict[str, np.ndarray],
    truth: np.ndarray,
    floor: float,
    k: float,
    arbiter_library: str | None = None,
) -> list[list[str]] | None:
    """Camps decided by the float64 execution ``truth`` (rounded to the anchor's type), or None when it
    is no credible arbiter here (no family other than its own library within ``floor`` of it).

    The families within ``floor`` of the truth (nRMSE; the arbiter's own library left out: its closeness
    proves nothing) set the level of correct rounding ``r`` (their median error); the camp decided for
    holds every family within ``max(floor, k * r)`` of the truth, the others form camps by distance
    (:func:`form_camps`). Returns ``[fams]`` when every family is within it (no split). Why: where the
    truth is known, agreement among the others cannot outvote it (every family but one off in its own
    way formed one camp by the voters' spread: ``tests/test_camps.py``,
    ``test_every_family_off_in_its_own_way_is_not_one_camp``), and rounding near the floor is not a
    split (families with independent noise just under the floor are within ``k * r`` of the truth)."""
    t = np.asarray(truth, dtype=np.float64).ravel()
    tf = np.isfinite(t)
    tt = float(np.einsum("i,i->", t[tf], t[tf]))
    errs: dict[str, float] = {}
    for f in fams:
        v = np.asarray(votes[f], dtype=np.float64).ravel()
        if v.shape != t.shape:
            return None
        ok = np.isfinite(v) & tf
        dv = v[ok] - t[ok]
        dd = float(np.einsum("i,i->", dv, dv))
        errs[f] = 0.0 if dd == 0 else (math.sqrt(dd / tt) if tt > 0 else math.inf)
    good = [e for f, e in errs.items() if e <= floor and f != arbiter_library]
    if not good:
        return None
    cut = max(floor, k * float(np.median(good)))
    won = [f for f in fams if errs[f] <= cut]
    rest = [f for f in fams if errs[f] > cut]
    if not rest:
        return [list(fams)]
    if len(rest) == 1:
        camps = [won, rest]
    else:
        names, d, _ = camp_distances({f: votes[f] for f in rest})
        camps = [won] + form_camps(names, d, floor, k)
    return sorted(camps, key=lambda c: (-len(c), c[0]))  # largest first, as form_camps


def vote_camps(
    fams: list[str],
    d: np.ndarray,
    votes: dict[str, np.ndarray],
    floor: float,
    truth: np.ndarray | None,
    k: float,
    arbiter_library: str | None = None,
) -> list[list[str]]:
    """The camps of one anchor and sample: decided by the float64 execution where it is a credible
    arbiter here (:func:`truth_camps`), else by distance (:func:`form_camps`)."""
    camps = truth_camps(fams, votes, truth, floor, k, arbiter_library) if truth is not None else None
    return camps if camps is not None else form_camps(fams, d, floor, k)


@dataclass
class Decision:
    """The decision of one split: ``camps`` (lists of families, largest first), ``winner`` (index into
    ``camps``, None for a tie), ``basis`` (``float64`` | ``count`` | ``tie``), ``truth_error``: per camp
    the nRMSE of its closest independent member against the float64 execution (None where unknown)."""

    camps: list[list[str]]
    winner: int | None
    basis: str
    truth_error: list[float | None] = field(default_factory=list)
    #: per camp, its count of independent conversions (:func:`camp_counts`)
    counts: list[int] = field(default_factory=list)


def camp_counts(camps: list[list[str]], units: dict[str, str] | None = None) -> list[int]:
    """Per camp, the number of its families counted as independent: families that run another family's
    conversion of the graph (``units``: family -> that family, :data:`anpred.defaults.CONVERSION_UNITS`)
    count once with it (litert with tensorflow: one onnx2tf conversion)."""
    units = units or {}
    return [len({units.get(f, f) for f in c}) for c in camps]


def decide(
    camps: list[list[str]],
    votes: dict[str, np.ndarray],
    floor: float,
    truth: np.ndarray | None = None,
    arbiter_library: str | None = None,
    units: dict[str, str] | None = None,
) -> Decision:
    """Decide a split (module docstring).

    Args:
        camps: from :func:`form_camps` (at least two).
        votes: family -> vote.
        floor: the voters' floor at the anchor (nRMSE).
        truth: the float64 execution's tensor rounded to the anchor's element type (None: not run here).
        arbiter_library: the family of the library the float64 execution runs on (its members' closeness
            to it does not count).
        units: family -> the family whose conversion it runs (:func:`camp_counts`).
    """
    errs: list[float | None] = [None] * len(camps)
    if truth is not None:
        t = np.asarray(truth, dtype=np.float64).ravel()
        tf = np.isfinite(t)
        tt = float(np.einsum("i,i->", t[tf], t[tf]))
        for k, camp in enumerate(camps):
            best = None
            for f in camp:
                if f == arbiter_library:
                    continue
                v = np.asarray(votes[f], dtype=np.float64).ravel()
                ok = np.isfinite(v) & tf
                dv = v[ok] - t[ok]
                dd = float(np.einsum("i,i->", dv, dv))
                e = 0.0 if dd == 0 else (math.sqrt(dd / tt) if tt > 0 else math.inf)
                best = e if best is None else min(best, e)
            errs[k] = best
        known = [(e, k) for k, e in enumerate(errs) if e is not None]
        if known:
            e, k = min(known)
            if e <= floor and sum(1 for x, _ in known if x == e) == 1:
                return Decision(camps, k, "float64", errs, camp_counts(camps, units))
    sizes = camp_counts(camps, units)
    top = max(sizes)
    if sizes.count(top) == 1:
        return Decision(camps, sizes.index(top), "count", errs, sizes)
    return Decision(camps, None, "tie", errs, sizes)


class SplitLog:
    """Per anchor, the splits seen over the samples: ``record`` one :class:`Decision`; ``summary``
    gives one entry per (anchor, camps, winner, basis) with the number of samples; ``losers`` the
    families that were on a camp not decided for (or tied) at an anchor in some sample."""

    def __init__(self) -> None:
        self._seen: dict[tuple, dict[str, Any]] = {}
        self._losers: dict[str, set[str]] = {}

    def record(self, anchor: str, sample: str, dec: Decision) -> None:
        camps = tuple(tuple(c) for c in dec.camps)
        key = (anchor, camps, dec.winner, dec.basis)
        e = self._seen.setdefault(
            key,
            {
                "anchor": anchor,
                "camps": [list(c) for c in camps],
                "decided_for": list(camps[dec.winner]) if dec.winner is not None else None,
                "basis": dec.basis,
                "samples": [],
                "truth_error": [],
                "counts": list(dec.counts) or [len(c) for c in camps],
            },
        )
        e["samples"].append(sample)
        e["truth_error"].append(dec.truth_error)
        for k, c in enumerate(dec.camps):
            if k != dec.winner:
                self._losers.setdefault(anchor, set()).update(c)

    def losers(self, anchor: str) -> set[str]:
        return set(self._losers.get(anchor, ()))

    def summary(self) -> list[dict[str, Any]]:
        """JSON-ready entries: ``anchor``, ``camps``, ``decided_for`` (None: tie), ``basis``,
        ``samples`` (count), ``sample_ids`` (first 8), ``truth_error`` (per camp, the largest over the
        samples; None where not measured)."""
        out = []
        for e in self._seen.values():
            per = list(zip(*e["truth_error"])) if e["truth_error"] else []
            te = [max((x for x in col if x is not None), default=None) for col in per]
            out.append(
                {
                    "anchor": e["anchor"],
                    "camps": e["camps"],
                    "decided_for": e["decided_for"],
                    "basis": e["basis"],
                    "samples": len(e["samples"]),
                    "sample_ids": e["samples"][:8],
                    "truth_error": te,
                    "counts": e.get("counts") or [len(c) for c in e["camps"]],
                }
            )
        return out

    def notes(self, samples: int) -> list[str]:
        """One line per split entry (module docstring's wording)."""
        lines = []
        for e in self.summary():
            camps = " | ".join("(" + ", ".join(c) + ")" for c in e["camps"])
            head = (
                f"anchor {e['anchor']}: split vote, the families form camps {camps} in {e['samples']} of "
                f"{samples} sample(s)"
            )
            if e["basis"] == "tie":
                top = max(e["counts"])
                rest = [f for c, n in zip(e["camps"], e["counts"]) if n < top for f in c]
                judged = (
                    f"the tied camps' members not judged there; {', '.join(rest)} judged against the nearest "
                    "tied camp (a deviation from every candidate, anpred.judge.ties)"
                    if rest
                    else "judged for no voting family"
                )
                lines.append(
                    f"{head}: a tie (no camp has more families than every other) and no float64 execution "
                    f"agreeing with one camp within the floor: no consensus there, {judged} "
                    "(add onnx-reference-fp64 to the backends to decide)"
                )
                continue
            won = ", ".join(e["decided_for"])
            if e["basis"] == "float64":
                errs = ", ".join("-" if x is None else f"{x:.3g}" for x in e["truth_error"])
                lines.append(
                    f"{head}: decided for ({won}) by the float64 execution (nRMSE of each camp against it: {errs})"
                )
            else:
                counts = " against ".join(str(n) for n in e["counts"])
                lines.append(f"{head}: decided for ({won}) by the count of families ({counts})")
        return lines
