"""Precision populations: reduced-precision backends judged by their own peers, and by the fp32 consensus.

Contract: :class:`PopulationOracle` has the interface of :class:`anpred.judge.consensus.Oracle`
(:meth:`add` one aligned sample, :meth:`finish` an :class:`anpred.judge.struct.OracleResult`) and runs
one fp32 oracle plus one oracle per *precision population*: the reduced-precision backends that
computed the same reduced model (``precision`` int8, fp16, bf16 as read back from the run record, and
the program they ran, :func:`program_of`), when at least two of them ran. Members of one precision
that ran different programs (the ONNX QDQ model of ``ort-int8`` and ExecuTorch's PT2E program: other
observers, scales and granularity) are different populations, never judged against each other, and
a note says so. Each reduced-precision backend then gets two verdicts:

- **budget** (its main verdict, ``judged_against == "fp32 consensus"``): against the fp32 consensus,
  with the precision's cost *measured by its population* as the reference level (``k`` times the
  median deviation of the population's other families from the fp32 consensus at that anchor) and a
  natural unit of the precision as the floor (:mod:`anpred.judge.scales`); a tensor that carries none
  of the fp32 consensus' signal (cosine <= 0, or nRMSE >= 1: no closer than an all-zero tensor) where
  the fp32 voters agree is flagged whatever its population does (the reduced model itself lost it);
- **implementation** (``verdict.implementation``, ``judged_against == "<p> population"``): against the
  element-wise consensus of its population (families counted as for fp32, :mod:`anpred.judge.consensus`),
  every member voting, with the outlier rule (factor ``population_k``) and origin trace-back of fp32
  voters (not their sustained-departure rule, see :class:`PopulationOracle`); its floor is the larger
  of the natural unit and sqrt(2) times the precision's own cost at the anchor (the population's
  median deviation from the fp32 consensus): independent kernels make their own rounding decisions,
  two independent realizations of the precision's error differ by sqrt(2) times it, and one that
  differs from its peers by more than that is not computing the same model.

A population of one member has no implementation verdict (a note says so), and its budget verdict
falls back to the measured per-precision constant (the basis of each cell says which).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig
from anpred.judge.consensus import Oracle
from anpred.judge.scales import floor_basis_of
from anpred.judge.struct import AnchorInfo, BackendInfo, OracleResult

__all__ = [
    "PopulationOracle",
    "cost_warnings",
    "expected_scales",
    "populations_of",
    "precision_costs",
    "program_of",
    "scheme_notes",
]

#: run-record entries (``versions()``) holding the sha256 of the reduced program a member ran:
#: ``<kind>_model_sha256`` (the shared ONNX models of :mod:`anpred.backends.lowp_models`: ``int8_model``,
#: ``fp16_model``) and ``<kind>_program_sha256`` (``pt2e_program``, :mod:`anpred.backends.executorch_lowp`)
_PROGRAM_KEY = re.compile(r"^(\w+_(?:model|program))_sha256$")


def program_of(versions: dict[str, Any] | None) -> str:
    """The reduced program a population member ran, from its run record's ``versions``:
    ``"<kind>:<first 12 hex digits of its sha256>"`` (e.g. ``pt2e_program:3f2a...``) of the first such
    entry in key order (:data:`_PROGRAM_KEY`), "" when none is recorded (older runs, ``openvino-bf16``
    which runs the fp32 model)."""
    for k in sorted(versions or {}):
        m = _PROGRAM_KEY.match(k)
        if m and versions[k]:
            return f"{m.group(1)}:{str(versions[k])[:12]}"
    return ""


def populations_of(backends: list[BackendInfo]) -> dict[str, list[BackendInfo]]:
    """Reduced-precision backends (non-voting, precision other than fp32) grouped by precision and
    program (:attr:`BackendInfo.program`), in the given order. A precision whose members ran one
    program is keyed by the precision (``{"int8": [...], "fp16": [...]}``); one whose members ran
    several has one population per program, keyed ``"<precision> (<program>)"`` (e.g.
    ``"int8 (int8_model:0a1b...)"`` and ``"int8 (pt2e_program:3f2a...)"``)."""
    groups: dict[tuple[str, str], list[BackendInfo]] = {}
    for b in backends:
        if not b.votes and b.precision not in ("fp32", "fp64"):
            groups.setdefault((b.precision, b.program), []).append(b)
    count: dict[str, int] = {}
    for p, _ in groups:
        count[p] = count.get(p, 0) + 1
    return {
        (p if count[p] == 1 else f"{p} ({prog or 'program not recorded'})"): members
        for (p, prog), members in groups.items()
    }


def scheme_notes(groups: dict[str, list[BackendInfo]]) -> list[str]:
    """One warning per precision whose members ran different programs (``groups``: :func:`populations_of`):
    they are judged as separate populations, each against its own program's cost."""
    per: dict[str, list[str]] = {}
    for key, members in groups.items():
        per.setdefault(members[0].precision, []).append(f"{key}: {', '.join(m.name for m in members)}")
    return [
        f"{p}: the run holds {len(keys)} different {p} programs (different quantization or conversion "
        f"schemes), judged as separate populations, never one against the other: {'; '.join(keys)}"
        for p, keys in per.items()
        if len(keys) > 1
    ]


class PopulationOracle:
    """The fp32 oracle and one oracle per precision population (module docstring).

    Args:
        anchors, backends, config, reference, seed, descendants: as :class:`Oracle`.
        steps: anchor -> int8 quantization step of the QDQ model (the int8 backends' ``quant_steps``).
    """

    def __init__(
        self,
        anchors: list[AnchorInfo],
        backends: list[BackendInfo],
        config: OracleConfig | None = None,
        reference: str | None = None,
        seed: int = 0,
        descendants: dict[str, set[str]] | None = None,
        steps: dict[str, float] | None = None,
    ):
        self.cfg = config or OracleConfig()
        self.main = Oracle(
            anchors, backends, self.cfg, reference=reference, seed=seed, descendants=descendants, steps=steps
        )
        self.groups = populations_of(backends)
        self.pops: dict[str, Oracle] = {}
        # the sustained-departure rule is the fp32 voters' (their peers differ by float rounding only):
        # within a population, implementations that share one kernel path are bit-identical at the first
        # anchors, which makes any other correct implementation an "infinite" departure there (seen on
        # openvino-int8: docs/oracle.md, 'Measurements: bit-identical population members'), so the
        # implementation verdict rests on the threshold alone
        pop_cfg = dataclasses.replace(self.cfg, sustained_anchors=0, reservoir=0)  # (plots: the fp32 oracle's)
        for p, members in self.groups.items():
            if len(members) >= 2:
                infos = [dataclasses.replace(b, votes=True) for b in members]
                self.pops[p] = Oracle(
                    anchors,
                    infos,
                    pop_cfg,
                    seed=seed,
                    descendants=descendants,
                    population=members[0].precision,
                    steps=steps,
                )

    @property
    def samples(self) -> int:
        return self.main.samples

    def add(
        self,
        tensors: dict[str, dict[str, np.ndarray]],
        unaligned: dict[tuple[str, str], str] | None = None,
        sample_id: str | None = None,
        absent: dict[str, str] | None = None,
    ) -> None:
        """Judge one sample (arguments: :meth:`Oracle.add`) in the fp32 oracle and in each population."""
        self.main.add(tensors, unaligned, sample_id=sample_id, absent=absent)
        for oracle in self.pops.values():
            names = set(oracle.backends)
            oracle.add(
                {a: {b: t for b, t in per.items() if b in names} for a, per in tensors.items()},
                {k: v for k, v in (unaligned or {}).items() if tuple(k)[1] in names},
                sample_id=sample_id,
                absent={b: r for b, r in (absent or {}).items() if b in names},
            )

    def finish(self) -> OracleResult:
        """The fp32 oracle's result with each population's implementation verdicts nested in the
        members' verdicts, its cells in ``population_cells`` and its consensus in ``populations``."""
        res = self.main.finish()
        for p, members in self.groups.items():
            if p not in self.pops:
                what = members[0].precision if p == members[0].precision else f"this {members[0].precision} program"
                res.notes.append(
                    f"{p}: only {members[0].name} computed in {what}: no population to compare its "
                    f"implementation with; its verdict against the fp32 consensus uses the constant "
                    f"{members[0].precision} floor (docs/oracle.md)"
                )
        res.notes.extend(scheme_notes(self.groups))
        for p, oracle in self.pops.items():
            oracle.costs = precision_costs(res, [m.name for m in self.groups[p]])
            r = oracle.finish()
            names = list(oracle.backends)
            for b, v in r.verdicts.items():
                v.judged_against = f"{p} population"
                v.population = names
                if b in res.verdicts:
                    res.verdicts[b].implementation = v
                    res.verdicts[b].population = names
            info: dict[str, Any] = {
                "members": names,
                "consensus": r.consensus,
                "notes": r.notes,
                "correlated": r.correlated,
                "unjudged_anchors": r.unjudged_anchors,
            }
            res.populations[p] = info
            res.population_cells[p] = r.cells
        res.scales = expected_scales(self.main, res)
        res.notes.extend(cost_warnings(res, self.cfg))
        return res


def cost_warnings(res: OracleResult, cfg: OracleConfig) -> list[str]:
    """A graded finding (a warning, never a flag): a reduced-precision member that is not flagged but
    loses at least ``cost_factor`` times what the other families of its population lose against the
    fp32 consensus (its budget cell's ``primary / peer_level``, where the peers are its population),
    at the anchor where that ratio is largest, among the anchors where its deviation is above one
    rounding to the precision's grid (the natural unit: where the peers are exact, no ratio means
    anything). Sets ``verdict.cost_ratio`` (``{"anchor", "ratio", "nrmse", "peers"}``) and appends
    the warning to ``verdict.warnings``; returns the warnings (one note each). The likely cause (the
    kernel note of the run's machine record) is added by :func:`anpred.judge.check.finish`."""
    out = []
    for b, v in res.verdicts.items():
        if v.votes or v.flagged or v.precision in ("fp32", "fp64"):
            continue
        best = None
        for c in res.cells:
            by_population = floor_basis_of(c.basis).startswith("population")
            if c.backend != b or not by_population or not c.peer_level or c.deviation:
                continue
            if not (c.primary > c.floor and c.primary == c.primary):
                continue
            r = c.primary / c.peer_level
            if best is None or r > best[0]:
                best = (r, c)
        if best is None or best[0] < cfg.cost_factor:
            continue
        r, c = best
        v.cost_ratio = {"anchor": c.anchor, "ratio": r, "nrmse": c.primary, "peers": c.peer_level}
        text = (
            f"{b}: loses {r:.2g}x what the other {v.precision} implementations lose against the fp32 consensus "
            f"at {c.anchor} (nRMSE {c.primary:.3g} against their median {c.peer_level:.3g}; >= cost_factor "
            f"{cfg.cost_factor:g}): a less accurate implementation of the same {v.precision} model, not flagged "
            f"(under {cfg.k_for(v.precision):g} x)"
        )
        v.warnings.append(text)
        out.append(text)
    return out


def precision_costs(res: OracleResult, members: list[str]) -> dict[str, dict[str, float]]:
    """anchor -> member -> the primary statistic of each of ``members`` against the fp32 consensus
    (``res``: the fp32 oracle's result); the precision's cost at an anchor for a member is the median
    of the *other* members' (:meth:`anpred.judge.consensus.Oracle.cost_for`), so that a faulty member
    does not raise its own floor."""
    per: dict[str, dict[str, float]] = {}
    for c in res.cells:
        if c.backend in members and c.primary == c.primary:
            per.setdefault(c.anchor, {})[c.backend] = c.primary
    return per


def expected_scales(main: Oracle, res: OracleResult) -> dict[str, dict[str, dict[str, Any]]]:
    """Per anchor, each precision's expected error (nRMSE), measured on the run: ``fp32`` the median
    of the fp32 voters' deviation from a float64 execution of the model (``onnx-reference-fp64``, when
    it ran: :attr:`Oracle.fp64_error`); each reduced precision the median of its population's
    deviation from the fp32 consensus (what the precision costs there), keyed as :func:`populations_of`
    keys the populations (one entry per program where a precision's members ran several)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    groups = populations_of(list(main.backends.values()))
    by = {(c.anchor, c.backend): c for c in res.cells}
    for a in main.anchors:
        per: dict[str, dict[str, Any]] = {}
        e64 = {b: v for (an, b), v in main.fp64_error.items() if an == a.name}
        if e64:
            per["fp32"] = {
                "expected": float(np.median(list(e64.values()))),
                "basis": f"median of {', '.join(sorted(e64))} against the float64 execution",
            }
        for p, members in groups.items():
            vals = [by[(a.name, m.name)].primary for m in members if (a.name, m.name) in by]
            vals = [v for v in vals if v == v]
            if vals:
                per[p] = {
                    "expected": float(np.median(vals)),
                    "basis": f"median of {', '.join(m.name for m in members if (a.name, m.name) in by)} "
                    "against the fp32 consensus",
                }
        if per:
            out[a.name] = per
    return out
