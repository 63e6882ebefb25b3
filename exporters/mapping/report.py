"""The mapping's result types: one entry per anchor and backend, the per-backend report, the error.

An entry (``anchor.native[backend]``, docs/DESIGN.md)::

    {"target": str, "status": "exact" | "equivalent" | "unmapped", "transform": dict | None,
     "reason": str}

``exact``: the anchor's ONNX value *is* a tensor the native program computes at a point it exposes
(possibly in another memory layout, ``transform``); ``equivalent``: equal only mathematically (an
exporter merged operators under another name); ``unmapped``: no native tensor can be observed
(``reason`` says why).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from anpred.errors import AnpredError

__all__ = ["STATUSES", "MappingError", "MappingReport", "make_entry"]

STATUSES = ("exact", "equivalent", "unmapped")


class MappingError(AnpredError):
    """The mapping cannot be computed at all (unknown framework, no ONNX graph, not a native model)."""


@dataclass
class MappingReport:
    """Per backend, the mapping entry of every anchor (``entries[backend][anchor] = native dict``).

    ``ort`` is included as the reference column: an anchor is exact there when its value is a graph
    output of the anchored model."""

    framework: str
    exporter: str
    entries: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # warnings about the pairing (input shapes, classes)

    def counts(self, backend: str) -> dict[str, int]:
        c = {s: 0 for s in STATUSES}
        for e in self.entries.get(backend, {}).values():
            c[e["status"]] += 1
        return c

    def exact_fraction(self, backend: str) -> float:
        n = len(self.entries.get(backend, {}))
        return self.counts(backend)["exact"] / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = {b: {**self.counts(b), "exact_fraction": self.exact_fraction(b)} for b in self.entries}
        return d

    def format_text(self, verbose: bool = True) -> str:
        lines = [f"anchor mapping ({self.framework}, exporter {self.exporter or 'unknown'})"]
        lines += [f"warning: {n}" for n in self.notes]
        for b, ents in self.entries.items():
            c = self.counts(b)
            lines.append(
                f"{b}: {c['exact']} exact, {c['equivalent']} equivalent, {c['unmapped']} unmapped "
                f"of {len(ents)} ({100 * self.exact_fraction(b):.1f}% exact)"
            )
            if verbose:
                for name, e in ents.items():
                    if e["status"] != "exact" or e.get("transform"):
                        t = f" transform={json.dumps(e['transform'])}" if e.get("transform") else ""
                        lines.append(f"  {e['status']:<10} {name} -> {e['target'] or '-'}{t}: {e['reason']}")
        return "\n".join(lines)


def make_entry(target: str, status: str, reason: str, transform: dict | None = None) -> dict[str, Any]:
    """One mapping entry (see the module docstring)."""
    return {"target": target, "status": status, "transform": transform, "reason": reason}
