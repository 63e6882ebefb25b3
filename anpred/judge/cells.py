"""The decision of every judged (anchor, backend) cell of an :class:`anpred.judge.consensus.Oracle`
over the samples it has seen: the cell's peers, its floor and basis (:mod:`anpred.judge.scales`) and
the verdict (:func:`anpred.judge.verdict.judge_cell`).
"""

from __future__ import annotations

import math
from typing import Any

from anpred.judge.scales import CellMeasures, cell_precision, floor_and_basis, natural_units
from anpred.judge.stats import ErrorStats
from anpred.judge.struct import AnchorInfo, Cell
from anpred.judge.verdict import CellBasis, judge_cell


def judge_cells(o, scaled: set[str]) -> dict[tuple[str, str], Cell]:
    """Every judged (anchor, backend), decided against its peers (:func:`judge_cell`) with the floor
    and basis of :mod:`anpred.judge.scales`: fp32 voters against their fp32 peers; a
    reduced-precision backend of the fp32 oracle (its *budget* verdict) against the other families
    of its own precision population, measured against the fp32 consensus, its lost-signal test
    against the fp32 voters; members of a population oracle against each other."""
    cells: dict[tuple[str, str], Cell] = {}
    pooled = {k: acc.pooled() for k, acc in o.acc.items()}
    for a in o.anchors:
        judged = [b for b in o.backends if (a.name, b) in pooled]
        for b in judged:
            info = o.backends[b]
            acc = o.acc[(a.name, b)]
            corr = o.families.merged_with(a.name, info.family)
            # peers: other (not merged) families; after a split, only those never on a losing camp
            # there (the deviation a camp not decided for shows is no level of ordinary noise)
            losers = o.splits.losers(a.name)
            voters = [
                p
                for p in judged
                if p != b
                and o.backends[p].votes
                and o.backends[p].family != info.family
                and o.backends[p].family not in corr
                and o.backends[p].family not in losers
            ]
            prec = cell_precision(info.precision, a.dtype)
            step = quantization_step(o, a, b)
            rms = math.sqrt(acc.cc / acc.n) if acc.n else None
            extra: dict[str, Any] = {}
            if info.votes and o.population is None and prec != "fp32" and prec != info.precision:
                # a tensor of the model's own reduced type (float16 weights and activations): its
                # peers' spread, with the natural unit of that type as the floor
                peers = voters
                floor, basis = floor_and_basis(o.cfg, prec, a.stage, population=peers, anchor_type=True)
            elif info.votes and o.population is None:
                peers = voters
                floor, basis = floor_and_basis(o.cfg, prec, a.stage)
            else:
                peers = (
                    voters
                    if info.votes
                    else [
                        p
                        for p in judged
                        if p != b
                        and not o.backends[p].votes
                        and o.backends[p].precision == info.precision
                        and o.backends[p].family != info.family
                        and o.backends[p].program == info.program
                    ]
                )  # one program's population (populations.py)
                measured = CellMeasures(step=step, rms=rms, cost=o.cost_for(a.name, b))
                floor, basis = floor_and_basis(
                    o.cfg, prec, a.stage, population=peers, measured=measured, implementation=o.population is not None
                )
                if not info.votes:  # budget verdict: the population's cost; the signal is the fp32 voters'
                    extra["signal_peers"] = [
                        v for v in (primary(o, pooled[(a.name, p)]) for p in voters) if not math.isnan(v)
                    ]
                    if not peers:
                        peers = voters  # no population peer: today's rule, the constant floor decides
            levels = [primary(o, pooled[(a.name, p)]) for p in peers]
            if info.votes and b in o.tie_judged.get(a.name, ()):
                levels += o.tie_levels.get(a.name, [])  # judged against a candidate of a tie
                basis += (
                    "; at a tie (no consensus): judged against the nearest tied camp, the tied camps' "
                    "distance from each other counted as a peer's level"
                )
            levels = [v for v in levels if not math.isnan(v)]
            st = pooled[(a.name, b)]
            units = natural_units(prec, st.max_abs, math.sqrt(acc.dd / acc.n) if acc.n else math.nan, rms, step)
            if o.population is not None:
                extra["k"] = o.cfg.k_for(o.population, population=True)
            elif info.votes and prec == "fp32" and a.name not in scaled:
                # the wrong-tail rule: the ULP-error quantile against the same peers' (verdict.py)
                extra["peer_ulps"] = [
                    (pooled[(a.name, p)].ulp_q, pooled[(a.name, p)].ulp_median)
                    for p in peers
                    if not math.isnan(pooled[(a.name, p)].ulp_q)
                ]
            cells[(a.name, b)] = judge_cell(
                a,
                info,
                acc,
                st,
                levels,
                o.cfg,
                o.consensus_max.get(a.name, 0.0),
                CellBasis(floor=floor, basis=basis, units=units, **extra),
            )
    return cells


def primary(o, s: ErrorStats) -> float:
    return float(getattr(s, o.cfg.primary))


def quantization_step(o, a: AnchorInfo, backend: str | None = None) -> float | None:
    """int8 quantization step of anchor ``a`` (a part: its output's; an anchor without its own:
    the nearest ancestor anchor's that has one, through the data flow when known), in the program
    ``backend`` ran where the oracle's ``member_steps`` has it, else the run's."""
    steps = o.member_steps.get(backend or "") or o.steps
    name = a.part_of or a.name
    if name in steps:
        return steps[name]
    if o.descendants is None:
        return None
    ups = [x.name for x in o.anchors if x.name in steps and name in o.descendants.get(x.name, ())]
    return steps[ups[-1]] if ups else None
