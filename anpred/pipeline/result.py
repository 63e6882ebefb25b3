"""The typed results of the one-shot pipeline, apart from the steps that fill them:
:class:`TestResult` (one model: the :class:`anpred.judge.CheckReport` plus where everything was
written; ``test.json``, schema :data:`TEST_SCHEMA`), :class:`DemoResult` (one TestResult per demo
model) and :func:`format_standing` (where each backend stands, one column per model)."""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = ["TEST_SCHEMA", "TestResult", "DemoResult", "format_standing"]

TEST_SCHEMA = "anpred.test/1"


@dataclass
class TestResult:
    """The typed verdict of :func:`anpred.pipeline.test`: the :class:`anpred.judge.CheckReport` plus where everything
    was written. Truthy when every judged backend is consistent (like the report).

    Attributes:
        model: the subject's label; ``out``: the report folder; ``report``: the CheckReport.
        anchored, manifest, run_dir, report_json, report_html: paths inside ``out``.
        backends: the backends run, in order; ``statuses``: backend -> run status (``ok`` | ``failed``
            | ``unsupported`` | ``crashed`` | ``timeout``); ``reasons``: backend -> why not ok.
        mapping: native backend -> counts ``{"exact", "equivalent", "unmapped"}``.
        seconds: wall time per phase (``resolve``, ``instrument``, ``map``, ``run``, ``check``,
            ``report``, ``total``), seconds.
        details: what was tested: ``subject`` (label, kind, ONNX file, origin, export), ``inputs``
            (kind, spec or image sources, preprocessing), ``fixed_dims``, ``native_left_out``.
    """

    model: str
    out: Path
    report: Any
    anchored: Path
    manifest: Path
    run_dir: Path
    report_json: Path
    report_html: Path
    backends: list[str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    mapping: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    __test__ = False  # not a pytest test class

    def __bool__(self) -> bool:
        return bool(self.report)

    @property
    def status(self) -> str:
        """``consistent`` | ``flagged`` | ``incomplete`` | ``error`` (see :class:`anpred.judge.CheckReport`)."""
        return self.report.status

    @property
    def consistent(self) -> bool:
        return self.report.status == "consistent"

    @property
    def flagged_backends(self) -> list[str]:
        return self.report.flagged_backends

    @property
    def verdicts(self):
        return self.report.verdicts

    @property
    def exit_code(self) -> int:
        """0 consistent, 1 flagged or incomplete (0 with ``allow_incomplete``), 2 could not be judged."""
        return self.report.exit_code

    def standing(self) -> dict[str, str]:
        """Backend -> one word and a detail: ``consistent (max nRMSE X)`` (X: the largest pooled nRMSE
        over the judged anchors, :meth:`anpred.judge.CheckReport.largest_primary`), ``FLAGGED at <origin anchor>``,
        ``consensus (reference)``, ``unjudged``, or the run status (``failed: <reason>``); a witness's
        is prefixed ``witness:`` (the arbiter's ``arbiter:``): it is about the witness
        (:mod:`anpred.pipeline.witnesses`)."""
        out = {}
        for b in self.backends:
            st = self.statuses.get(b, "?")
            v = self.report.verdicts.get(b)
            if st != "ok":
                out[b] = f"{st}: {self.reasons.get(b, '')}".strip().rstrip(":")
            elif v is None:
                out[b] = "unjudged: " + self.report.unjudged_backends.get(b, "no verdict")
            elif v.flagged:
                out[b] = f"FLAGGED at {v.origin_anchor} ({v.propagation})"
            elif v.implementation is not None and v.implementation.flagged:
                out[b] = (
                    f"FLAGGED (implementation, against the {v.precision} population) at "
                    f"{v.implementation.origin_anchor} ({v.implementation.propagation})"
                )
            elif v.judged_anchors:
                big = self.report.largest_primary(b)
                prim = self.report.config.get("primary", "nrmse")
                prim = "nRMSE" if prim == "nrmse" else prim
                out[b] = f"consistent (max {prim} {big[1]:.1e})" if big is not None else "consistent"
                if v.unjudged:
                    out[b] += f", {len(v.unjudged)} anchor(s) not judged"
            else:
                out[b] = (
                    "unjudged (used as the consensus reference)"
                    if any(f"reference:{b}" in str(c) for c in self.report.consensus.values())
                    else "unjudged"
                )
            role = (self.report.backends.get(b) or {}).get("role")
            if role in ("witness", "arbiter"):
                out[b] = f"{role}: {out[b]}"
        return out

    def format_text(self) -> str:
        """The verdict table (:func:`anpred.report.format_text`) and the report's path."""
        from anpred.report import format_text

        return format_text(self.report) + f"\n\nreport: {self.report_html}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TEST_SCHEMA,
            "model": self.model,
            "out": str(self.out),
            "status": self.status,
            "flagged_backends": self.flagged_backends,
            "backends": self.backends,
            "statuses": self.statuses,
            "reasons": self.reasons,
            "standing": self.standing(),
            "mapping": self.mapping,
            "seconds": self.seconds,
            "details": self.details,
            "files": {
                k: str(getattr(self, k)) for k in ("anchored", "manifest", "run_dir", "report_json", "report_html")
            },
        }


@dataclass
class DemoResult:
    """The demo's verdicts, one :class:`TestResult` per model; truthy when all are consistent."""

    results: list[TestResult]
    out: Path
    seconds: float = 0.0
    __test__ = False

    def __bool__(self) -> bool:
        return all(bool(r) for r in self.results)

    @property
    def exit_code(self) -> int:
        return max((r.exit_code for r in self.results), default=2)

    @property
    def status(self) -> str:
        """The worst of the models' statuses: error > flagged > incomplete > consistent."""
        statuses = {r.status for r in self.results}
        return next((s for s in ("error", "flagged", "incomplete") if s in statuses), "consistent")


#: characters of a backend's standing in the table (the full reason is in the report and run.json)
STANDING_WIDTH = 100
# the coverage's refusal, "not run: the pre-run coverage found N operator(s) ... (how it asked): OPS": the
# operators first (anpred.backends.coverage.refusal)
_REFUSAL = re.compile(
    r"not run: the (?:pre-run coverage found \d+ operator\(s\) or input\(s\) it refuses \(.*?\)"
    r"|model uses \d+ operator\(s\) missing from its .*? \(pre-run coverage\)): "
)


def standing_cell(backend: str, standing: str) -> str:
    """``standing`` shortened to :data:`STANDING_WIDTH` with what a reader acts on first: the refused
    operators of a coverage refusal, a failure's reason without the exception class and the backend's
    own name repeated (``failed: prepare: pnnx could not lower ...``)."""
    text = _REFUSAL.sub("refused by the pre-run coverage: ", standing)
    text = re.sub(r"\b(BackendError|AnpredError|RuntimeError): ", "", text).replace(f": {backend}: ", ": ")
    return text if len(text) <= STANDING_WIDTH else text[: STANDING_WIDTH - 3] + "..."


def format_standing(results: Iterable[TestResult]) -> str:
    """Where each backend stands, one row per backend and one column per model."""
    results = list(results)
    backends: list[str] = []
    for r in results:
        backends += [b for b in r.backends if b not in backends]
    rows = [["backend"] + [r.model for r in results]]
    for b in backends:
        rows.append([b] + [standing_cell(b, r.standing().get(b) or "-") for r in results])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
