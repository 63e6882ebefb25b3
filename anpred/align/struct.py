"""Result types of the alignment step, apart from the algorithms that fill them.

* :class:`AlignmentDecision` -- how one backend's anchor is aligned (taken once, reused per sample);
* :class:`UnalignedEntry` -- an anchor a backend's tensor could not be aligned for, and why;
* :class:`AlignmentReport` -- every non-identity alignment and every unaligned anchor of a run, with its
  JSON form (schema :data:`SCHEMA`, ``to_dict``/``from_dict``) and its plain-text form (``format_text``);
* :class:`AlignedSample` -- one sample after alignment (float64 tensors in the canonical ONNX shape).

:class:`anpred.align.aligner.Aligner` fills them; ``anpred check`` and ``anpred align`` read them.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anpred.align.rules import describe_rule, is_identity
from anpred.errors import AnpredError
from anpred.onnx_io import json_safe

__all__ = ["SCHEMA", "AlignmentDecision", "UnalignedEntry", "AlignmentReport", "AlignedSample"]

#: schema of :meth:`AlignmentReport.to_dict` (``anpred align --json``, ``check`` reports).
SCHEMA = "anpred.alignment/1"


@dataclass
class AlignmentDecision:
    """How one backend's anchor is aligned (taken once, reused for later samples).

    Attributes:
        anchor, backend: what it is for.
        rule: the rule applied (:mod:`anpred.align.rules`); ``{}`` is the identity.
        source: ``manifest`` | ``capture`` | ``native`` | ``layout`` | ``shape`` | ``data``.
        detail: one line saying why.
        backend_shape, canonical_shape, backend_dtype: as seen when decided.
        error: normalised error of the chosen candidate against the consensus when data decided.
        runner_up: normalised error of the best other candidate (data decisions).
        margin: ``runner_up / error`` (None when ``error`` is 0: an exact match).
        candidates: for data decisions, ``[{"rule": ..., "error": ...}]``.
        samples: samples aligned with this decision.
        layout_check: where a converter's reported rule does not match the ONNX-layout backends but
            another candidate does (the rule still stands: a defect or a mislabelled layout), which.
    """

    anchor: str
    backend: str
    rule: dict[str, Any]
    source: str
    detail: str = ""
    backend_shape: list[int] = field(default_factory=list)
    canonical_shape: list[int] = field(default_factory=list)
    backend_dtype: str = ""
    error: float | None = None
    runner_up: float | None = None
    margin: float | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    #: a converter's reported rule checked against the ONNX-layout backends (Aligner._check_converter):
    #: "" when it matches or nothing decides, else which other candidate matches them
    layout_check: str = ""

    @property
    def identity(self) -> bool:
        return is_identity(self.rule)


@dataclass
class UnalignedEntry:
    """An anchor that could not be aligned for a backend (excluded from the verdict for that sample).

    ``reason`` carries the shapes; ``samples`` counts the samples it was unaligned on and
    ``first_sample`` names the first."""

    anchor: str
    backend: str
    reason: str
    backend_shape: list[int] = field(default_factory=list)
    canonical_shape: list[Any] = field(default_factory=list)
    backend_dtype: str = ""
    samples: int = 0
    first_sample: str = ""


@dataclass
class AlignmentReport:
    """Every non-identity (or data-decided) alignment and every unaligned anchor of a run.

    ``identity``: backend -> number of anchors aligned as they are. ``settings``: the thresholds.
    ``warnings``: things the user should fix (e.g. a manifest pin naming an unknown backend)."""

    alignments: list[AlignmentDecision] = field(default_factory=list)
    unaligned: list[UnalignedEntry] = field(default_factory=list)
    identity: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self), nan=None)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AlignmentReport":
        if d.get("schema") != SCHEMA:
            raise AnpredError(f"unsupported alignment report schema {d.get('schema')!r} (expected {SCHEMA!r})")
        try:
            return cls(
                alignments=[AlignmentDecision(**a) for a in d.get("alignments", [])],
                unaligned=[UnalignedEntry(**u) for u in d.get("unaligned", [])],
                identity=dict(d.get("identity", {})),
                samples=int(d.get("samples", 0)),
                settings=dict(d.get("settings", {})),
                warnings=list(d.get("warnings", [])),
                schema=d["schema"],
            )
        except TypeError as err:
            raise AnpredError(f"malformed alignment report: {err}") from err

    def by_source(self) -> dict[str, int]:
        return dict(Counter(a.source for a in self.alignments))

    @property
    def segments_by_data(self) -> list[AlignmentDecision]:
        """Alignments whose segment (channel/head) order was found from the data, not from a known
        rule: a port's concatenation order, or a real channel-order defect the data cannot tell apart."""
        return [a for a in self.alignments if a.source == "data" and "segments" in a.rule]

    def format_text(self, max_anchors: int | None = None) -> str:
        """A plain-text report: warnings, alignments grouped by (backend, rule, source), then unaligned
        anchors. Every anchor is listed unless ``max_anchors`` caps each group."""
        lines = [f"alignment over {self.samples} sample(s)"]
        lines.extend(f"warning: {w}" for w in self.warnings)
        nseg = len(self.segments_by_data)
        if nseg:
            lines.append(f"segment order found by the data (check these: a port's order or a real defect): {nseg}")
        for b, n in sorted(self.identity.items()):
            lines.append(f"  {b}: {n} anchor(s) as they are")
        groups: dict[tuple[str, str, str], list[AlignmentDecision]] = {}
        for a in self.alignments:
            groups.setdefault((a.backend, describe_rule(a.rule), a.source), []).append(a)
        if groups:
            lines.append("alignments applied (backend: rule [how decided] anchors):")
        cap = max_anchors if max_anchors is not None else None
        for (b, desc, src), items in groups.items():
            names = ", ".join(i.anchor for i in items[:cap]) + (" ..." if cap is not None and len(items) > cap else "")
            how = src
            if src == "data":
                how = "data: " + "; ".join(
                    f"{i.anchor} error {i.error:.3g} vs runner-up {_fmt(i.runner_up)} (margin "
                    f"{_fmt(i.margin, 'exact')})"
                    for i in items[:cap]
                )
            lines.append(f"  {b}: {desc} [{how}] ({len(items)}) {names}")
            for i in items[:cap]:
                if i.detail and src not in ("capture", "layout"):
                    lines.append(f"      {i.anchor}: {i.detail}")
        if self.unaligned:
            lines.append(f"unaligned (excluded from the verdict) ({len(self.unaligned)}):")
            for u in self.unaligned:
                lines.append(f"  {u.backend}: {u.anchor}: {u.reason} [{u.samples} sample(s), first {u.first_sample}]")
        else:
            lines.append("unaligned: none")
        return "\n".join(lines)


def _fmt(v: float | None, none: str = "-") -> str:
    return none if v is None else f"{v:.3g}"


@dataclass
class AlignedSample:
    """One sample after alignment.

    ``tensors``: ``{anchor: {backend: float64 array in the canonical ONNX shape}}`` (only aligned
    ones); ``unaligned``: ``{anchor: {backend: reason with shapes}}``; ``decisions``: the decision used
    per ``(anchor, backend)``."""

    sample_id: str
    tensors: dict[str, dict[str, np.ndarray]]
    unaligned: dict[str, dict[str, str]]
    decisions: dict[tuple[str, str], AlignmentDecision] = field(default_factory=dict)
