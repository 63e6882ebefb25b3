"""The oracle's notes and the correlated-families record: what the verdicts rest on, what could not be
judged, which families were counted as one vote (:class:`anpred.judge.consensus.Oracle`, its
``finish``). Functions of the oracle ``o`` after its last sample."""

from __future__ import annotations

from typing import Any

from anpred.judge.struct import Cell
from anpred.judge.verdict import gap_text

__all__ = ["basis_notes", "correlated", "correlated_notes", "independence_line", "merged_pairs", "unjudged_anchors"]


def basis_notes(o, verdicts, consensus: dict[str, list[str]]) -> list[str]:
    """Notes on what the verdicts rest on: the manifest order (data flow unknown), a reference."""
    notes = []
    if o.descendants is None and any(v.flagged for v in verdicts.values()):
        notes.append(
            "propagation follows the manifest order (the run's data flow is unknown): parallel "
            "branches interleave there, so ratios and non-monotonic marks may mix branches"
        )
    ref_modes = sorted({m for ms in consensus.values() for m in ms if m.startswith("reference:")})
    if ref_modes:
        notes.append(
            "fewer than %d voting families at some anchors: consensus = %s (the reference is not judged "
            "there; verdicts rest on the noise floor and fewer peers)" % (o.cfg.min_voters, ", ".join(ref_modes))
        )
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
            how = (
                "errors against the float64 execution correlated"
                if c.get("basis") == "float64"
                else "three-cornered hat"
            )
            tol = (
                f"error-correlated ({how}, rho {min(r):.2f}-{max(r):.2f} >= correlated_rho "
                f"{cfg.correlated_rho:g}) or bit-identical"
            )
        differ = (
            f"; judged apart at {', '.join(c['differ'][:4])}{' ...' if len(c['differ']) > 4 else ''}"
            if c["differ"]
            else ""
        )
        notes.append(
            f"correlated backends: {' and '.join(c['backends'])} (families {', '.join(c['families'])}) "
            f"gave {tol} tensors at {len(c['anchors'])} of {n_all} anchors (in {min(c['anchors'].values())}"
            f"-{max(c['anchors'].values())} of {o.samples} samples each): counted as one consensus vote "
            f"there (shared kernels){differ}"
        )
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
        differ = [
            a.name for a in o.anchors if a.name not in anchors and sum(1 for b in members if (a.name, b) in o.acc) >= 2
        ]
        rho = {a: r for a in anchors if (r := o.families.rho_merged[a].get(g)) is not None}
        by_truth = any((a, g) in o.families.truth_merged for a in anchors)
        out.append(
            {
                "families": fams,
                "backends": members,
                "anchors": anchors,
                "differ": differ,
                "kind": "error-correlated" if rho else "bit-identical",
                "rho": rho,
                "basis": "float64" if by_truth else ("three-cornered hat" if rho else "identical"),
            }
        )
    return out


def merged_pairs(correlated_groups: list[dict[str, Any]]) -> dict[str, int]:
    """``{"a|b": anchors}``: each pair of families the oracle counted as one vote (a group of
    :func:`correlated`, pairs named in sorted order) and at how many anchors it did."""
    out: dict[str, int] = {}
    for c in correlated_groups:
        fams = sorted(c["families"])
        for i, a in enumerate(fams):
            for b in fams[i + 1 :]:
                out[f"{a}|{b}"] = max(out.get(f"{a}|{b}", 0), len(c["anchors"]))
    return out


def independence_line(independence: dict[str, Any], correlated_groups: list[dict[str, Any]], threshold: float) -> str:
    """One line on the voting families' error correlation (``independence``: the oracle's
    :meth:`anpred.judge.independence.PairDistances.summary`; ``correlated_groups``: :func:`correlated`):
    the pairs the oracle merged into one vote and at how many anchors, then the pairs at or above
    ``threshold`` (``correlated_rho``) it did not merge (a merge also needs the nearest-corner guard
    and enough votes left, docs/oracle.md), each with the number of anchors its median rho was
    measured at; with neither, the highest pair. "" when no pair was measured or merged."""
    pairs = independence.get("pairs") or {}
    merged = merged_pairs(correlated_groups)
    if not pairs and not merged:
        return ""

    def n_anchors(n: int) -> str:
        return f"{n} {'anchor' if n == 1 else 'anchors'}"

    def pair(p: str, v: dict[str, Any]) -> str:
        return f"{p.replace('|', '~')} {v['rho_median']:.2f} from {n_anchors(v['anchors'])}"

    items = [f"{p.replace('|', '~')} merged into one vote at {n_anchors(m)}" for p, m in sorted(merged.items())]
    top = sorted(pairs.items(), key=lambda kv: -kv[1]["rho_median"])
    items += [pair(p, v) + ", not merged" for p, v in top if v["rho_median"] >= threshold and p not in merged]
    if not items:
        items = [f"no pair at or above it; highest {pair(*top[0])}"]
    return (
        f"independence (error correlation of the voting families, three-cornered hat; a pair at rho >= "
        f"{threshold:g} is a candidate to merge into one vote): "
        + "; ".join(items)
        + f" (rho: median over the anchors where a pair was measured apart; {len(pairs)} pairs measured)"
    )
