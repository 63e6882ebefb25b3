r"""Ties: the backends outside a split that no rule decides (:mod:`anpred.judge.camps`).

A tie leaves an anchor without a consensus: two or more camps of the largest count (families, one per
conversion: :func:`anpred.judge.camps.camp_counts`), and no float64 execution agreeing with one of them
within the floor. Every *candidate* (the element-wise median of one
tied camp's members) may be the right value; a backend outside the tied camps is judged against the
candidate **nearest** to it (its smallest primary statistic): a deviation from that one is a deviation
from every candidate, whichever is right. Its peers' level is the candidates' own disagreement (each
candidate's primary statistic against the nearest other one): an outsider is flagged only where it is
``k`` times further from every candidate than the candidates are from each other, and beyond the floor
(:func:`anpred.judge.verdict.judge_cell`). The members of the tied camps stay unjudged there (no rule
says which of them is wrong).

Why: a wrong backend (OpenVINO's Softplus far below zero returns 0) was left unjudged at its own
operator when the correct libraries split by their own rounding on tiny values (three computing
``log(1 + exp(x))`` in float32, three ``log1p``-accurate): its origin moved to the next judged anchor.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from anpred.judge.camps import Decision
from anpred.judge.stats import Reference
from anpred.judge.votes import vote

__all__ = ["TieCandidates"]


class TieCandidates:
    """The candidates of one tied split at one anchor and sample.

    Args:
        dec: the tie (:class:`anpred.judge.camps.Decision`, ``winner`` None).
        got: backend -> float64 tensor (the anchor's canonical shape).
        family_of: backend -> its family (voters only; other backends map to None).

    Attributes:
        tied: the families of the tied camps (every camp of the largest count).
        refs: one :class:`Reference` per tied camp (the element-wise median of its members, NaN/Inf
            voted on element by element, :func:`anpred.judge.votes.vote`).
    """

    def __init__(self, dec: Decision, got: dict[str, np.ndarray], family_of: dict[str, str | None]):
        sizes = dec.counts or [len(c) for c in dec.camps]  # independent conversions per camp
        top = max(sizes)
        camps = [c for c, n in zip(dec.camps, sizes) if n == top]
        self.tied = {f for c in camps for f in c}
        self.refs: list[Reference] = []
        for camp in camps:
            members = [x for b, x in got.items() if family_of.get(b) in camp]
            c, undecided = vote(members)
            self.refs.append(Reference(c, undecided))

    def outside(self, backend: str, family_of: dict[str, str | None]) -> bool:
        """True for a backend judged here: not a voter of a tied camp."""
        return family_of.get(backend) not in self.tied

    def nearest(self, compare: Callable[[Reference], object], primary: Callable[[object], float]):
        """The comparison (``compare(ref)``) with the smallest ``primary`` over the candidates."""
        best, best_v = None, np.inf
        for ref in self.refs:
            cmp = compare(ref)
            v = primary(cmp)
            if best is None or v < best_v:
                best, best_v = cmp, v
        return best

    def levels(self, primary: Callable[[Reference, np.ndarray], float]) -> list[float]:
        """Per candidate, ``primary(ref_j, candidate_i)`` against the nearest other candidate: the
        uncertainty of the consensus here (the peers' level of an outsider)."""
        out = []
        for i, ri in enumerate(self.refs):
            vals = [primary(rj, ri.full.reshape(ri.shape)) for j, rj in enumerate(self.refs) if j != i]
            vals = [v for v in vals if np.isfinite(v)]
            if vals:
                out.append(min(vals))
        return out
