"""Which voting families count as one consensus vote: the correlated-family merge of the consensus
oracle (:class:`anpred.judge.consensus.Oracle`) and its record over the samples.

Two families that share kernels make the same rounding errors, and their votes would count twice in
the median. :class:`FamilyGroups` groups the families of one camp (:mod:`anpred.judge.camps`) into
votes, per anchor and sample: bit-identical votes (``correlated_nrmse``), and families whose errors
correlate by at least ``correlated_rho`` (against the float64 execution where it ran, else the
three-cornered hat over the samples so far; the measurements are :mod:`anpred.judge.independence`).
It keeps, per anchor, how often each group was merged and the correlation that merged it, which
:func:`anpred.judge.oracle_notes.correlated` turns into the report's record (docs/oracle.md).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from anpred.defaults import OracleConfig
from anpred.judge.independence import PairDistances, TruthErrors, merge_correlated
from anpred.judge.stats import same_array

__all__ = ["FamilyGroups"]


class FamilyGroups:
    """The grouping of voting families into consensus votes and its record.

    Args:
        cfg: ``correlated_nrmse``, ``correlated_rho`` and ``min_voters`` of
            :class:`anpred.defaults.OracleConfig`.
        anchors: the names of every anchor the oracle may judge (parts included).

    Attributes:
        indep: pooled squared distances between family votes per anchor (the three-cornered hat,
            :class:`anpred.judge.independence.PairDistances`).
        truth_errors: the families' pooled errors against the float64 execution
            (:class:`anpred.judge.independence.TruthErrors`).
        merged: anchor -> group of families (frozenset) -> samples in which it counted as one vote.
        rho_merged: anchor -> group -> the error correlation that merged it, the latest.
        truth_merged: (anchor, group) merged by their errors against the float64 execution.
        merged_now: whether a group was merged by error correlation since it was last reset (the
            oracle resets it per anchor and sample).
    """

    def __init__(self, cfg: OracleConfig, anchors: list[str]):
        self.cfg = cfg
        self.indep = PairDistances()
        self.truth_errors = TruthErrors()
        self.merged: dict[str, dict[frozenset, int]] = {a: {} for a in anchors}
        self.rho_merged: dict[str, dict[frozenset, float]] = {a: {} for a in anchors}
        self.truth_merged: set[tuple[str, frozenset]] = set()
        self.merged_now = False

    def measure(self, anchor: str, votes: dict[str, np.ndarray], truth: np.ndarray | None) -> None:
        """Pool one sample's family ``votes`` (family -> tensor of one shape) at ``anchor``: their
        distances, and with ``truth`` (the float64 execution's tensor, rounded) their errors."""
        self.indep.add(anchor, votes)
        if truth is not None:
            self.truth_errors.add(anchor, votes, truth)

    def identical(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether two votes count as the same tensor: bit-identical (``correlated_nrmse`` 0; NaN !=
        NaN), else nRMSE of ``a`` against ``b`` <= ``correlated_nrmse``."""
        tol = self.cfg.correlated_nrmse
        if tol <= 0:
            return same_array(a, b)  # NaN != NaN: agreeing on NaN is not shared kernels
        d = (a - b).ravel()
        bb = float(np.einsum("i,i->", b.ravel(), b.ravel()))
        dd = float(np.einsum("i,i->", d, d))
        return bool(np.isfinite(dd)) and (dd == 0.0 or (bb > 0 and math.sqrt(dd / bb) <= tol))

    def groups(self, votes: dict[str, np.ndarray], anchor: str | None = None, truth: bool = False) -> list[list[str]]:
        """The families of one camp grouped into votes. With the truth (``truth``: the float64 execution
        ran at this anchor and sample, its errors are in :attr:`truth_errors`): groups whose errors
        against it correlate by at least ``correlated_rho`` are merged (:class:`TruthErrors`; a family
        with zero error is never merged). Without it: families whose votes are identical
        (``correlated_nrmse``) are grouped, but not when all are identical (nothing tells correlation
        from agreement) or when fewer than ``min_voters`` distinct votes would remain; then, at
        ``anchor``, groups whose pooled three-cornered-hat correlation so far is at least
        ``correlated_rho`` are merged, most correlated first, while ``min_voters`` groups remain."""
        singles = [[f] for f in sorted(votes)]
        if anchor is not None and truth:
            if self.cfg.correlated_rho >= 1:
                return singles
            groups, merged = self.truth_errors.merge(anchor, singles, self.cfg.correlated_rho)
            self.rho_merged[anchor].update(merged)
            self.truth_merged.update((anchor, g) for g in merged)
            self.merged_now = self.merged_now or bool(merged)
            return groups
        groups: list[list[str]] = []
        for f in sorted(votes):
            for g in groups:
                if self.identical(votes[f], votes[g[0]]):
                    g.append(f)
                    break
            else:
                groups.append([f])
        if len(groups) < self.cfg.min_voters:
            return singles
        per = self.indep.d2.get(anchor or "", {})
        if (
            anchor is not None
            and len(groups) >= 4
            and self.cfg.correlated_rho < 1
            and all(frozenset(p) in per for p in itertools.combinations([g[0] for g in groups], 2))
        ):
            groups, merged = merge_correlated(per, groups, self.cfg.correlated_rho, self.cfg.min_voters)
            self.rho_merged[anchor].update(merged)
            self.merged_now = self.merged_now or bool(merged)
        return groups

    def count(self, anchor: str, groups: list[list[str]]) -> None:
        """Record one sample's ``groups`` at ``anchor``: each group of two or more families counted once."""
        for g in groups:
            if len(g) > 1:
                self.merged[anchor][frozenset(g)] = self.merged[anchor].get(frozenset(g), 0) + 1

    def merged_with(self, anchor: str, family: str) -> set[str]:
        """The families merged with ``family`` at ``anchor`` in any sample (not ``family`` itself)."""
        out: set[str] = set()
        for g in self.merged.get(anchor, {}):
            if family in g:
                out |= g
        out.discard(family)
        return out
