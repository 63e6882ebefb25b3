"""Which backends run: the ones under test (subjects), the witnesses added to reach a consensus, and
the default backends skipped with their reason.

The consensus is the median of at least three voting fp32 families (docs/oracle.md); with fewer, one
backend is the reference and is not judged. So when the backends under test give fewer than three
voting fp32 families, :func:`plan_backends` adds *witnesses*: installed independent families that
can take the model (pre-run coverage, :mod:`anpred.backends.coverage`), the cheapest first by what they
cost on this machine (:mod:`anpred.pipeline.costs`: measured on earlier runs and recorded), and the
float64 arbiter (``onnx-reference-fp64``) where it runs. Witnesses are judged like any backend, but
their verdicts are about the witness, not the subjects: a flagged or failed witness does not change
the status (:func:`apply_roles`; the report's backend table says ``role``).

A default backend (not named by the user) that is not installed, or whose operator table lacks an
operator of the model, is skipped with its reason and does not change the status; a named backend
always counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import BackendError
from anpred.pipeline.choices import ALL_FP32, ARBITER_BACKEND
from anpred.pipeline.progress import log

__all__ = [
    "WITNESS_CANDIDATES",
    "ARBITER",
    "MIN_FAMILIES",
    "BackendPlan",
    "not_installed",
    "plan_backends",
    "apply_roles",
    "refused_by_all",
    "takes_model",
]

#: the backends a witness is chosen from: one per independent fp32 family
WITNESS_CANDIDATES: tuple[str, ...] = ALL_FP32 + ("onnx-reference",)
#: the float64 execution: never votes, arbitrates where a majority of the voters shares one error
ARBITER = ARBITER_BACKEND
#: voting fp32 families a consensus median needs (the oracle's ``min_voters``, anpred/defaults.py)
MIN_FAMILIES = 3


@dataclass
class BackendPlan:
    """The backends of a test: ``subjects`` (named, or the defaults that can run), ``witnesses``
    (roles ``witness`` and ``arbiter``, in run order), ``skipped`` (default or candidate backend ->
    reason), ``why`` (why witnesses were added, or why none was), ``costs`` (backend -> the estimate
    that ordered the candidates, :func:`anpred.pipeline.costs.estimate`)."""

    subjects: list[str]
    witnesses: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    why: str = ""
    costs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Every backend to run: the subjects, then the witnesses."""
        return list(self.subjects) + [b for b in self.witnesses if b not in self.subjects]

    def to_dict(self) -> dict[str, Any]:
        return {
            "subjects": list(self.subjects),
            "witnesses": dict(self.witnesses),
            "skipped": dict(self.skipped),
            "why": self.why,
            "costs": dict(self.costs),
        }


def _voting_families(names: list[str], rows: dict[str, dict[str, Any]]) -> list[str]:
    """The fp32 families of ``names`` that vote (:meth:`anpred.judge.struct.BackendInfo.make`)."""
    from anpred.judge.struct import BackendInfo

    fams: list[str] = []
    for b in names:
        row = rows.get(b) or {}
        info = BackendInfo.make(b, row.get("family"), row.get("precision"))
        if info.votes and info.family not in fams:
            fams.append(info.family)
    return fams


def not_installed(names: list[str]) -> dict[str, str]:
    """``{backend: reason}`` for the backends of ``names`` whose libraries are not installed
    (:func:`anpred.backends.backend_table`; the reason names the extra that brings them)."""
    from anpred.backends import backend_table

    rows = {r["name"]: r for r in backend_table()}
    return {
        b: rows.get(b, {}).get("reason") or "not installed"
        for b in names
        if not rows.get(b, {}).get("installed", False)
    }


def plan_backends(
    names: list[str],
    explicit: bool,
    model_path: Path,
    samples: int,
    *,
    witnesses: bool = True,
    min_families: int = MIN_FAMILIES,
    quiet: bool = True,
) -> BackendPlan:
    """The backends to run on the anchored model at ``model_path`` (``names``: the named backends when
    ``explicit``, else the defaults) with ``samples`` samples; see the module docstring.
    ``witnesses`` False: none added (a run of fewer than three families judges against a reference);
    ``min_families``: the oracle's ``min_voters`` (:class:`anpred.defaults.OracleConfig`).

    Raises:
        BackendError: the pre-run coverage refuses the model on every backend under test (named, or
            the installed defaults): nothing would be judged (:func:`refused_by_all`)."""
    from anpred.backends import backend_table
    from anpred.backends.coverage import precheck, refusal

    rows = {r["name"]: r for r in backend_table()}
    plan = BackendPlan(subjects=list(names))
    if not explicit:
        for b in list(plan.subjects):
            if not rows.get(b, {}).get("installed", False):
                plan.skipped[b] = rows.get(b, {}).get("reason") or "not installed"
                plan.subjects.remove(b)
    need = min_families - len(_voting_families(plan.subjects, rows))
    cands = _candidates(plan, rows, model_path, samples) if witnesses and need > 0 else []
    # the pre-run coverage of the default backends and of the cheapest candidates (cached by model)
    ask = (
        list(plan.subjects)
        + (cands[: need + 1] if need > 0 else [])
        + ([ARBITER] if ARBITER in plan.costs and need > 0 else [])
    )
    cov = precheck(model_path, {b: b for b in ask}) if ask else {}
    refused = {b: cov[b] for b in plan.subjects if (cov.get(b) or {}).get("ops")}
    if plan.subjects and len(refused) == len(plan.subjects):
        raise BackendError(refused_by_all(refused, explicit))
    for b in [] if explicit else list(refused):  # a named backend counts: the run says why it did not run
        plan.skipped[b] = refusal(cov[b])
        plan.subjects.remove(b)
    # ... but gives no vote: the families that will vote are those of the subjects the coverage takes
    families = _voting_families([b for b in plan.subjects if b not in refused], rows)
    need = min_families - len(families)
    if need <= 0 or not witnesses:
        plan.why = f"the backends under test give {len(families)} voting fp32 families ({', '.join(families)})" + (
            "" if need <= 0 else "; witnesses off (--no-witnesses): one of them is the reference"
        )
        plan.costs = {}
        return plan
    # (candidates asked for now where the coverage left fewer families than the defaults gave)
    cands = [b for b in cands or _candidates(plan, rows, model_path, samples) if rows[b]["family"] not in families]
    _choose(plan, cands, cov, need, families, model_path)
    log(f"witnesses: {', '.join(f'{b} ({r})' for b, r in plan.witnesses.items()) or 'none'}: {plan.why}", quiet)
    return plan


def refused_by_all(refused: dict[str, dict[str, Any]], explicit: bool, limit: int = 4) -> str:
    """The one-line error when the pre-run coverage (:func:`anpred.backends.coverage.precheck` rows,
    ``refused``: backend -> row) refuses the model on every backend under test: the operators, each
    with the backends that lack it and why (the first ``limit`` operators)."""
    per_op: dict[str, list[str]] = {}
    for b, row in refused.items():
        for op, why in (row.get("ops") or {}).items():
            per_op.setdefault(op, []).append(f"{b}: {why}" if why else b)
    items = [f"{op} ({'; '.join(whys)})" for op, whys in list(per_op.items())[:limit]]
    more = f" and {len(per_op) - limit} more" if len(per_op) > limit else ""
    which = "named" if explicit else "under test (the installed defaults)"
    return (
        f"the pre-run coverage refuses the model on every backend {which} ({', '.join(refused)}): "
        f"{len(per_op)} operator(s) they lack: {', '.join(items)}{more}; nothing was run or written"
    )


def takes_model(row: dict[str, Any] | None) -> bool:
    """Whether a pre-run coverage row says the backend takes the model: it was asked (an operator
    table, ``basis``, or its converter node by node, ``node_basis``), the check did not fail, and
    nothing is refused. A backend asked neither way (its support known only once it converts) is not
    claimed to take the model."""
    return bool(row) and bool(row.get("basis") or row.get("node_basis")) and not row.get("error") and not row.get("ops")


def _candidates(plan: BackendPlan, rows: dict[str, dict], model_path: Path, samples: int) -> list[str]:
    """The installed witness candidates of families other than the subjects', cheapest first by their
    estimated seconds on this model (:func:`anpred.pipeline.costs.estimate`, into ``plan.costs``; the
    arbiter's estimate too where it is installed)."""
    from anpred.onnx_io import load_model, sha256_file
    from anpred.pipeline.costs import estimate, model_size

    families = {rows.get(b, {}).get("family") for b in plan.subjects}
    sha, size = sha256_file(model_path), model_size(load_model(model_path, load_external=False))
    cands = [
        b
        for b in WITNESS_CANDIDATES
        if b not in plan.subjects and rows.get(b, {}).get("installed", False) and rows[b].get("family") not in families
    ]
    for b in cands:
        plan.costs[b] = estimate(b, sha, size, samples)
    cands.sort(key=lambda b: (plan.costs[b]["seconds"] is None, plan.costs[b]["seconds"] or 0.0))
    if rows.get(ARBITER, {}).get("installed") and ARBITER not in plan.subjects:
        plan.costs[ARBITER] = estimate(ARBITER, sha, size, samples)
    return cands


def _choose(
    plan: BackendPlan, cands: list[str], cov: dict[str, dict], need: int, families: list[str], model_path: Path
) -> None:
    """Take the ``need`` cheapest candidates that can take the model (asking the coverage of those not
    asked yet), then the arbiter where it can; sets ``plan.witnesses`` and ``plan.why``."""
    from anpred.backends.coverage import precheck, refusal

    chosen: list[str] = []
    unknown: list[str] = []  # no operator table: taken, but not claimed to take the model
    for b in cands:
        if len(chosen) == need:
            break
        row = cov.get(b) or precheck(model_path, {b: b})[b]
        if row.get("ops"):
            plan.skipped[b] = f"witness candidate: {refusal(row)}"
            continue
        chosen.append(b)
        if not takes_model(row):
            unknown.append(b)
    for b in chosen:
        plan.witnesses[b] = "witness"
    if ARBITER in plan.costs:
        row = cov.get(ARBITER) or {}
        if row.get("ops"):
            plan.skipped[ARBITER] = f"arbiter: {refusal(row)}"
        else:
            plan.witnesses[ARBITER] = "arbiter"

    def cost(b: str) -> str:
        c = plan.costs[b]
        return f"{b} ~{c['seconds']:.1f} s ({c['basis']})" if c["seconds"] is not None else f"{b} (never measured)"

    have = f"{len(families)} voting fp32 famil{'y' if len(families) == 1 else 'ies'}" + (
        f" ({', '.join(families)})" if families else ""
    )
    takes = (
        ""
        if len(unknown) == len(chosen)
        else (f" that take{'' if len(chosen) - len(unknown) > 1 else 's'} the model (pre-run coverage)")
    )
    plan.why = (
        f"the backends under test give {have}; a consensus needs {len(families) + need}: "
        + (
            f"{', '.join(chosen)} added as witness{'es' if len(chosen) > 1 else ''}, the cheapest installed "
            f"independent famil{'ies' if len(chosen) > 1 else 'y'}{takes} by measured cost "
            f"({'; '.join(cost(b) for b in chosen)})"
            + (
                f" ({', '.join(unknown)}: no operator table, whether it takes the model is known once it runs)"
                if unknown
                else ""
            )
            if chosen
            else "no installed independent family can take the model"
        )
        + (f"; {ARBITER} added as the float64 arbiter" if ARBITER in plan.witnesses else "")
    )
    if len(chosen) < need:
        plan.why += f" (only {len(chosen)} of {need} witnesses found)"


def _voted(report, plan: BackendPlan) -> str:
    """Where each witness voted: the anchors whose consensus median counted its family
    (``report.consensus``: ``median:<families>``), or why it did not vote."""
    out = []
    n = len(report.consensus)
    for b, role in plan.witnesses.items():
        row = report.backends.get(b) or {}
        if role == "arbiter" or not row.get("votes", False):
            out.append(f"{b} arbitrates (never votes)" if role == "arbiter" else f"{b} does not vote")
            continue
        fam = row.get("family", b)
        k = sum(
            1
            for modes in report.consensus.values()
            for m in modes
            if str(m).startswith("median:") and fam in str(m)[len("median:") :].replace("+", ",").split(",")
        )
        out.append(
            f"{b} voted at {k} of {n} anchors"
            if row.get("status") == "ok"
            else f"{b} did not run ({row.get('status')})"
        )
    return ", ".join(out)


def apply_roles(report, plan: BackendPlan) -> None:
    """Mark the witnesses in ``report`` (a :class:`anpred.judge.CheckReport`): ``role`` in its backend
    table (``subject`` | ``witness`` | ``arbiter``), ``report.witnesses`` (why they were added, how
    each stands); a witness that did not run or could not be judged leaves the verdict's gaps (a note
    says so instead), and the status is decided again over the subjects (a flagged witness is about
    the witness: :attr:`anpred.judge.CheckReport.flagged_backends` leaves it out)."""
    if not plan.witnesses and not plan.skipped:
        return
    for b, row in report.backends.items():
        row["role"] = plan.witnesses.get(b, "subject")
    wit = set(plan.witnesses)
    keep, moved = [], []
    for line in report.incomplete:
        (moved if line.split(":", 1)[0] in wit else keep).append(line)
    report.incomplete = keep
    report.notes.extend(
        f"witness {line} (about the witness: the verdict of the backends under test does not depend on it)"
        for line in moved
    )
    if plan.witnesses:
        report.notes.append(
            f"witnesses: {plan.why}; {_voted(report, plan)}; judged like the others, but a "
            "witness's verdict is about the witness, not the backends under test"
        )
    report.notes.extend(f"skipped: {b}: {why}" for b, why in plan.skipped.items())
    if report.problems:
        report.status = "error"
    elif report.flagged_backends:
        report.status = "flagged"
    else:
        report.status = "incomplete" if report.incomplete else "consistent"
