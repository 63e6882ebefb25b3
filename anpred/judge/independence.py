r"""Independence of the voting families, measured on the run: the error correlation of each pair.

Two families that share kernels, or a converter that lowers onto the same kernels, make the same
rounding errors; their votes then count twice in a median. Bit-identical votes are merged already
(:meth:`anpred.judge.families.FamilyGroups.groups`); this module measures *partial* sharing.

Method: the **three-cornered hat** (J. E. Gray and D. W. Allan, "A method for estimating the frequency
stability of an individual oscillator", 28th Annual Symposium on Frequency Control, 1974; with the
correlation terms of F. Vernotte et al., "Oscillator noise analysis: multivariance measurement",
IEEE Trans. Instrum. Meas. 42(2), 1993). No family is the truth: only the pairwise differences are
seen. Per anchor, pooled over the samples so far,

    D²_ij = Σ_s ||v_i,s − v_j,s||²                   (squared distance of the family votes)
    σ²_i  = median over pairs {k, l} of other families, k, l ∉ {i, j}, of (D²_ik + D²_il − D²_kl) / 2
    ρ_ij  = (σ²_i + σ²_j − D²_ij) / (2 σ_i σ_j)       (clipped to [−1, 1])

For independent families ``D²_ij = σ²_i + σ²_j`` and ρ ≈ 0; families sharing part of their
arithmetic have ``D²_ij`` below that sum and ρ up to 1. ``σ²_i`` of the pair (i, j) is estimated
without j (and ``σ²_j`` without i), so one correlated partner does not bias its own estimate; this
needs at least four families (two other corners). Units: ρ is dimensionless; the nRMSE of a family's
own error is ``sqrt(σ²_i / Σ_s ||c_s||²)``.

A pair with ``ρ ≥ correlated_rho`` (:class:`anpred.defaults.OracleConfig`; docs/oracle.md gives the
source of the default and its sensitivity) is merged into one vote, like bit-identical families.

**With the truth.** Where the float64 execution ran, the error of each family is seen
directly, ``e_i = v_i − round(t)`` (``t`` the float64 execution's tensor rounded to the anchor's element
type), and :class:`TruthErrors` pools ``Σ e_i·e_j`` per anchor:
``ρ_ij = Σ e_i·e_j / sqrt(Σ e_i² · Σ e_j²)``, the plain correlation of the two errors. A family
with zero error is correct and is never merged (correct implementations of an exact operator are
bit-identical because they are correct); identical values alone are no evidence. The three-cornered
hat is the estimate for runs without the truth, and it is applied within a camp only
(:mod:`anpred.judge.camps`): measured against a consensus that deviating families pulled away, the
correct families' "errors" are one and the same tensor and look perfectly correlated.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

__all__ = ["PairDistances", "TruthErrors", "error_correlation", "merge_correlated"]


def error_correlation(d2: dict[frozenset, float], families: list[str]) -> dict[frozenset, float]:
    """ρ per pair of ``families`` from their pooled squared distances ``d2`` (``{frozenset({i, j}):
    D²_ij}``, every pair present), by the three-cornered hat with the pair's own members left out of
    each other's variance (module docstring). Pairs whose ρ is undefined (fewer than four families,
    a non-positive variance estimate, a zero distance) are left out."""
    out: dict[frozenset, float] = {}
    if len(families) < 4:
        return out
    fs = sorted(families)

    def var(i: str, without: str) -> float:
        others = [f for f in fs if f not in (i, without)]
        est = [
            (d2[frozenset((i, k))] + d2[frozenset((i, l))] - d2[frozenset((k, l))]) / 2
            for k, l in itertools.combinations(others, 2)  # noqa: E741 - k, l as in the module docstring
        ]
        return float(np.median(est))

    for i, j in itertools.combinations(fs, 2):
        dij = d2[frozenset((i, j))]
        si, sj = var(i, j), var(j, i)
        if not (dij > 0 and si > 0 and sj > 0 and math.isfinite(dij)):
            continue
        out[frozenset((i, j))] = max(-1.0, min(1.0, (si + sj - dij) / (2 * math.sqrt(si * sj))))
    return out


def merge_correlated(
    d2: dict[frozenset, float], groups: list[list[str]], threshold: float, min_groups: int
) -> tuple[list[list[str]], dict[frozenset, float]]:
    """Merge the most correlated pair of ``groups`` (lists of families; each group's first family is
    its corner) while its ρ (:func:`error_correlation` over the corners) is at least ``threshold``, the
    pair passes the nearest-corner guard (:func:`_nearest`) and more than ``min_groups`` groups remain,
    recomputing ρ after each merge (a correlated pair left as two corners biases every other
    estimate). Returns ``(groups, {merged group: ρ at its merge})``."""
    groups = [list(g) for g in groups]
    merged: dict[frozenset, float] = {}
    while len(groups) > min_groups:
        corners = [g[0] for g in groups]
        rho = error_correlation(d2, corners)
        ok = {p: r for p, r in rho.items() if r >= threshold and _nearest(d2, p, corners, threshold)}
        if not ok:
            break
        pair, r = max(ok.items(), key=lambda kv: kv[1])
        a, b = [g for g in groups if g[0] in pair]
        groups.remove(b)
        a.extend(b)
        merged[frozenset(a)] = r
    return groups, merged


def _nearest(d2: dict[frozenset, float], pair: frozenset, corners: list[str], threshold: float) -> bool:
    """The guard of a merge: the pair is much closer to each other than either is to any third corner,
    ``D²_ij <= 2 (1 - threshold) x min over k of min(D²_ik, D²_jk)``. Since ``σ²_i <= D²_ik`` for every
    k, two independent families of equal error can only pass it when every other family is much less
    precise than both; it keeps a noisy hat estimate (variances that differ by orders of magnitude,
    e.g. one family with a real defect among precise ones) from merging precise, independent families."""
    i, j = sorted(pair)
    others = [k for k in corners if k not in pair]
    if not others:
        return False
    near = min(min(d2[frozenset((i, k))], d2[frozenset((j, k))]) for k in others)
    return d2[pair] <= 2 * (1 - threshold) * near


class PairDistances:
    """Per anchor, the pooled squared distances between the family votes (streaming).

    :meth:`add` takes one sample's family votes at one anchor (``{family: float64 array}``, one shape,
    finite elements compared only); :meth:`rho` gives the pooled ρ of every pair at an anchor;
    :meth:`summary` the per-pair median ρ over anchors for the report."""

    def __init__(self) -> None:
        self.d2: dict[str, dict[frozenset, float]] = {}

    def add(self, anchor: str, votes: dict[str, np.ndarray]) -> None:
        """All pairwise squared distances in one matrix product: with ``e_i = v_i − v_0`` (the first
        family's vote as origin, so the products are of error size and ``D²_ij = G_ii + G_jj − 2 G_ij``
        with ``G = E Eᵀ`` loses nothing to cancellation at the scale of the values), elements where
        any vote is non-finite left out."""
        per = self.d2.setdefault(anchor, {})
        fams = sorted(votes)
        if len(fams) < 2:
            return
        stack = np.stack([np.asarray(votes[f], dtype=np.float64).ravel() for f in fams])
        e = stack[1:] - stack[0]
        ok = np.isfinite(e).all(axis=0)
        if not ok.all():
            e = e[:, ok]
        g = e @ e.T
        d = np.diag(g)
        for a, b in itertools.combinations(range(len(fams)), 2):
            if a == 0:
                val = d[b - 1]
            else:
                val = d[a - 1] + d[b - 1] - 2 * g[a - 1, b - 1]
            key = frozenset((fams[a], fams[b]))
            per[key] = per.get(key, 0.0) + max(float(val), 0.0)

    def rho(self, anchor: str, families: list[str]) -> dict[frozenset, float]:
        """ρ per pair of ``families`` at ``anchor`` over the samples added so far ({} when a pair was
        never seen together or fewer than four families are given)."""
        per = self.d2.get(anchor, {})
        if any(frozenset(p) not in per for p in itertools.combinations(families, 2)):
            return {}
        return error_correlation(per, families)

    def summary(self, threshold: float = 1.0) -> dict[str, Any]:
        """``{"method", "threshold", "pairs": {"a|b": {"rho_median", "rho_max", "anchors"}},
        "merged": {"a+b": anchors}}``: per anchor, bit-identical families count as one corner and pairs
        at or above ``threshold`` are merged first (:func:`merge_correlated`, down to three groups);
        ``pairs`` gives the ρ of the remaining corners over the anchors where it was defined, ``merged``
        how often each merged group was formed (pairs named in sorted order)."""
        vals: dict[frozenset, list[float]] = {}
        merged: dict[str, int] = {}
        for anchor, per in self.d2.items():
            groups: list[list[str]] = []
            for f in sorted({f for p in per for f in p}):  # bit-identical families: one corner
                g = next((g for g in groups if per.get(frozenset((f, g[0])), 1.0) == 0), None)
                if g is None:
                    groups.append([f])
                else:
                    g.append(f)
            if threshold < 1:
                groups, m = merge_correlated(per, groups, threshold, 3)
                for g in m:
                    merged["+".join(sorted(g))] = merged.get("+".join(sorted(g)), 0) + 1
            if any(frozenset(p) not in per for p in itertools.combinations([g[0] for g in groups], 2)):
                continue
            for pair, r in error_correlation(per, [g[0] for g in groups]).items():
                vals.setdefault(pair, []).append(r)
        pairs = {
            "|".join(sorted(p)): {"rho_median": float(np.median(v)), "rho_max": float(max(v)), "anchors": len(v)}
            for p, v in sorted(vals.items(), key=lambda kv: sorted(kv[0]))
        }
        return {
            "method": "three-cornered hat (Gray & Allan 1974), pooled over samples per anchor",
            "threshold": threshold,
            "pairs": pairs,
            "merged": merged,
        }


class TruthErrors:
    """Per anchor, the pooled products of the families' errors against the truth (streaming; module
    docstring, "With the truth").

    :meth:`add` takes one sample's family votes and the truth at one anchor; :meth:`rho` the pooled
    correlation of a pair; :meth:`merge` the groups of one camp merged by it."""

    def __init__(self) -> None:
        self.g: dict[str, dict[frozenset, float]] = {}  # anchor -> {frozenset({i, j}) or {i}: sum e_i e_j}

    def add(self, anchor: str, votes: dict[str, np.ndarray], truth: np.ndarray) -> None:
        """Accumulate ``Σ e_i·e_j`` (``e = vote − truth``, float64) over the elements where every vote and
        the truth are finite."""
        per = self.g.setdefault(anchor, {})
        fams = sorted(votes)
        t = np.asarray(truth, dtype=np.float64).ravel()
        e = np.stack([np.asarray(votes[f], dtype=np.float64).ravel() for f in fams]) - t
        ok = np.isfinite(e).all(axis=0)
        if not ok.all():
            e = e[:, ok]
        g = e @ e.T
        for a in range(len(fams)):
            for b in range(a, len(fams)):
                key = frozenset((fams[a], fams[b]))
                per[key] = per.get(key, 0.0) + float(g[a, b])

    def error(self, anchor: str, family: str) -> float | None:
        """``Σ e²`` of ``family`` at ``anchor`` so far (None: never seen)."""
        return self.g.get(anchor, {}).get(frozenset((family,)))

    def rho(self, anchor: str, i: str, j: str) -> float | None:
        """The pooled error correlation of ``i`` and ``j`` at ``anchor``; None when either has zero error
        (a correct family is never merged) or the pair was never seen together."""
        per = self.g.get(anchor, {})
        ii, jj, ij = per.get(frozenset((i,))), per.get(frozenset((j,))), per.get(frozenset((i, j)))
        if ii is None or jj is None or ij is None or not (ii > 0 and jj > 0):
            return None
        return max(-1.0, min(1.0, ij / math.sqrt(ii * jj)))

    def merge(
        self, anchor: str, groups: list[list[str]], threshold: float
    ) -> tuple[list[list[str]], dict[frozenset, float]]:
        """Merge the groups (lists of families; the first is the group's corner) whose corners' error
        correlation is at least ``threshold``, most correlated first, each family joining at most one
        merge at a time (the corner of a merged group is its first family). Returns ``(groups,
        {merged group: ρ at its merge})``."""
        groups = [list(g) for g in groups]
        merged: dict[frozenset, float] = {}
        while len(groups) > 1:
            best = None
            for a, b in itertools.combinations(range(len(groups)), 2):
                r = self.rho(anchor, groups[a][0], groups[b][0])
                if r is not None and r >= threshold and (best is None or r > best[0]):
                    best = (r, a, b)
            if best is None:
                break
            r, a, b = best
            groups[a].extend(groups[b])
            del groups[b]
            merged[frozenset(groups[a])] = r
        return groups, merged
