"""The oracle's notes and the correlated-families record: what the verdicts rest on, what could not be
judged, which families were counted as one vote (:class:`anpred.judge.consensus.Oracle`, its
``finish``). Functions of the oracle ``o`` after its last sample."""

from __future__ import annotations

from typing import Any

from anpred.judge.struct import Cell
from anpred.judge.verdict import gap_text

__all__ = ["basis_notes", "correlated", "correlated_notes", "unjudged_anchors"]


def basis_notes(o, verdicts, consensus: dict[str, list[str]]) -> list[str]:
    """Notes on what the verdicts rest on: the manifest order (data flow unknown), a reference."""
    notes = []
    if o.descendants is None and any(v.flagged for v in verdicts.values()):
        notes.append("propagation follows the manifest order (the run's data flow is unknown): parallel "
                     "branches interleave there, so ratios and non-monotonic marks may mix branches")
    ref_modes = sorted({m for ms in consensus.values() for m in ms if m.startswith("reference:")})
    if ref_modes:
        notes.append("fewer than %d voting families at some anchors: consensus = %s (the reference is not judged "
                     "there; verdicts rest on the noise floor and fewer peers)"
                     % (o.cfg.min_voters, ", ".join(ref_modes)))
    return notes


def unjudged_anchors(o, cells: dict[tuple[str, str], Cell], notes: list[str]) -> dict[str, str]:
    """Anchors no backend could be judged at -> why; a note per anchor with gaps (appended to ``notes``)."""
    unjudged_anchors: dict[str, str] = {}
    for a in o.anchors:
        gaps = o.anchor_gaps.get(a.name)
        if not gaps or a.part_of:
            continue
        text = gap_text(gaps, o.samples)
        if not any(k[0] == a.name for k in cells):
            unjudged_anchors[a.name] = text
            notes.append(f"anchor {a.name} could not be judged: {text}")
        else:
            notes.append(f"anchor {a.name} could not be judged in some samples: {text}")
    return unjudged_anchors


def correlated_notes(o, correlated: list[dict[str, Any]]) -> list[str]:
    cfg, notes = o.cfg, []
    for c in correlated:
        n_all = len(o.anchors)
        tol = "bit-identical" if cfg.correlated_nrmse <= 0 else f"within nRMSE {cfg.correlated_nrmse:g}"
        if c.get("rho"):
            r = list(c["rho"].values())
            how = ("errors against the float64 execution correlated" if c.get("basis") == "float64"
                   else "three-cornered hat")
            tol = (f"error-correlated ({how}, rho {min(r):.2f}-{max(r):.2f} >= correlated_rho "
                   f"{cfg.correlated_rho:g}) or bit-identical")
        differ = f"; judged apart at {', '.join(c['differ'][:4])}{' ...' if len(c['differ']) > 4 else ''}" \
            if c["differ"] else ""
        notes.append(f"correlated backends: {' and '.join(c['backends'])} (families {', '.join(c['families'])}) "
                     f"gave {tol} tensors at {len(c['anchors'])} of {n_all} anchors (in {min(c['anchors'].values())}"
                     f"-{max(c['anchors'].values())} of {o.samples} samples each): counted as one consensus vote "
                     f"there (shared kernels){differ}")
    return notes


def correlated(o) -> list[dict[str, Any]]:
    groups: dict[frozenset, dict[str, int]] = {}
    for a in o.anchors:
        for g, n in o.families.merged[a.name].items():
            groups.setdefault(g, {})[a.name] = n
    out = []
    for g, anchors in groups.items():
        fams = sorted(g)
        members = [b for b, i in o.backends.items() if i.votes and i.family in g]
        differ = [a.name for a in o.anchors if a.name not in anchors and
                  sum(1 for b in members if (a.name, b) in o.acc) >= 2]
        rho = {a: r for a in anchors if (r := o.families.rho_merged[a].get(g)) is not None}
        by_truth = any((a, g) in o.families.truth_merged for a in anchors)
        out.append({"families": fams, "backends": members, "anchors": anchors, "differ": differ,
                    "kind": "error-correlated" if rho else "bit-identical", "rho": rho,
                    "basis": "float64" if by_truth else ("three-cornered hat" if rho else "identical")})
    return out
