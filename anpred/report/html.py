"""HTML report with embedded plots (matplotlib, Agg, base64 PNG): a heatmap backend x anchor of the
primary statistic (grey hatched: not judged), the propagation profile per backend with the ratio
between consecutive anchors, per flagged anchor the error histogram and the value distributions side
by side, the verdict table, and every (anchor, backend, sample) that could not be judged. One
self-contained file."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

MAX_DETAIL = 12  # flagged (anchor, backend) pairs with histogram plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _log(v: float) -> float:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return np.nan
    return math.log10(max(v, 1e-16)) if math.isfinite(v) else 3.0


def _heatmap(report, primary: str) -> str:
    import matplotlib.pyplot as plt

    anchors = [a["name"] for a in report.anchors]
    backends = list(report.verdicts)
    m = np.full((len(backends), len(anchors)), np.nan)
    flagged = []
    for c in report.cells:
        if c.backend in backends and c.anchor in anchors:
            i, j = backends.index(c.backend), anchors.index(c.anchor)
            m[i, j] = _log(c.primary)
            if c.flagged:
                flagged.append((i, j))
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(anchors) + 3), 0.5 * len(backends) + 2.5))
    im = ax.imshow(m, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(backends)), backends)
    ax.set_xticks(range(len(anchors)), [a[-28:] for a in anchors], rotation=75, fontsize=7)
    for i, j in flagged:
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
    for i, b in enumerate(backends):
        v = report.verdicts[b]
        for j, a in enumerate(anchors):
            if a in v.unjudged or a in v.partial:
                ax.add_patch(
                    plt.Rectangle(
                        (j - 0.5, i - 0.5),
                        1,
                        1,
                        fill=False,
                        hatch="xx",
                        edgecolor="0.5" if a in v.unjudged else "orange",
                        lw=0.5,
                    )
                )
    fig.colorbar(im, ax=ax, label=f"log10 {primary} vs consensus")
    ax.set_title(
        f"{primary} per backend and anchor (red: flagged; hatched grey: not judged, orange: part of the samples)"
    )
    return _png(fig)


def _profiles(report, primary: str) -> str:
    import matplotlib.pyplot as plt

    anchors = [a["name"] for a in report.anchors]
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(anchors) + 3), 4))
    for b in report.verdicts:
        xs, ys, fl = [], [], []
        for j, a in enumerate(anchors):
            c = report.cell(a, b)
            if c is not None and c.primary is not None and not math.isnan(c.primary):
                xs.append(j)
                ys.append(max(c.primary, 1e-16) if math.isfinite(c.primary) else 1e3)
                if c.flagged:
                    fl.append((j, ys[-1]))
        if xs:
            (line,) = ax.plot(xs, ys, marker="o", ms=3, label=b)
            if fl:
                ax.scatter(*zip(*fl), s=60, facecolors="none", edgecolors=line.get_color(), linewidths=2)
    floors = [report.cell(a, next(iter(report.verdicts))) for a in anchors] if report.verdicts else []
    fx = [j for j, c in enumerate(floors) if c is not None]
    if fx:
        ax.plot(fx, [floors[j].floor for j in fx], "k--", lw=1, label="fp32 noise floor" if floors[fx[0]] else "floor")
    ax.set_yscale("log")
    ax.set_xticks(range(len(anchors)), [a[-28:] for a in anchors], rotation=75, fontsize=7)
    ax.set_ylabel(primary)
    ax.set_title("propagation profile (circles: flagged)")
    ax.legend(fontsize=7)
    return _png(fig)


def _detail(report, anchor: str, backend: str) -> str | None:
    import matplotlib.pyplot as plt

    d = report.plot_data.get((anchor, backend))
    if not d or d.get("err") is None or len(d["err"]) == 0:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
    a1.hist(d["err"], bins=60, color="tab:red")
    a1.set_title(f"error x - consensus ({backend})", fontsize=9)
    a1.set_yscale("log")
    lo, hi = float(min(d["x"].min(), d["c"].min())), float(max(d["x"].max(), d["c"].max()))
    bins = np.linspace(lo, hi if hi > lo else lo + 1, 60)
    a2.hist(d["c"], bins=bins, alpha=0.6, label="consensus")
    a2.hist(d["x"], bins=bins, alpha=0.6, label=backend)
    a2.set_yscale("log")
    a2.legend(fontsize=8)
    a2.set_title(f"value distributions at {anchor[-40:]}", fontsize=9)
    return _png(fig)


def _largest(report, backend: str) -> str:
    """The largest primary statistic of ``backend`` and its anchor (``CheckReport.largest_primary``)."""
    lp = report.largest_primary(backend) if hasattr(report, "largest_primary") else None
    return "-" if lp is None else f"{_fmt(lp[1])} ({html.escape(lp[0])})"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return html.escape(str(v))


def _units(c) -> str:
    u = getattr(c, "units", None) or {}
    if not u:
        return "-"
    return f"{u['max']:.3g} max / {u['rms']:.3g} RMS in {html.escape(u['unit'])} ({u['size']:.3g})"


def _populations(report, primary: str) -> list[str]:
    """Per reduced-precision backend: its two verdicts and, per anchor, the measured error, the
    expected-error scale (budget: the population's cost; implementation: the peers' spread), the
    threshold, the natural units and the basis."""
    from anpred.report.text import verdict_word

    e = html.escape
    rows = [(b, v) for b, v in report.verdicts.items() if not v.votes and v.precision != "fp64"]
    if not rows:
        return []
    out = [
        "<h2>Reduced precision: budget and implementation verdicts</h2>",
        "<p><b>budget</b>: against the fp32 consensus; expected = the median deviation of the other families of "
        "its precision population (what the precision costs, measured on this run). <b>implementation</b>: "
        "against the element-wise consensus of its population; expected = the peers' spread. Floors: one "
        "rounding in the precision's natural unit; for the implementation verdict also sqrt(2) x the "
        "precision's cost at the anchor (docs/oracle.md); each cell's basis is in the last columns.</p>",
    ]
    for b, v in rows:
        impl = v.implementation
        pop = ", ".join(v.population) if v.population else "none (only member: no implementation verdict)"
        out.append(
            f"<h3>{e(b)} ({e(v.precision)}), population: {e(pop)}</h3><p>budget: <b>{e(verdict_word(v))}</b>"
            + (f" (origin {e(v.origin_anchor or '-')})" if v.flagged else "")
            + (
                f"; implementation: <b>{e(verdict_word(impl))}</b>"
                + (f" (origin {e(impl.origin_anchor or '-')})" if impl.flagged else "")
                if impl
                else ""
            )
            + "</p>"
        )
        out.append(
            f"<table><tr><th>anchor</th><th>budget {e(primary)}</th><th>population's cost</th><th>threshold</th>"
            "<th>natural units</th><th>verdict</th><th>impl. " + e(primary) + "</th><th>peers' spread</th>"
            "<th>threshold</th><th>natural units</th><th>verdict</th><th>basis (budget)</th>"
            "<th>basis (implementation)</th></tr>"
        )
        for a in report.anchors:
            c = report.cell(a["name"], b)
            ic = report.cell(a["name"], b, v.precision) if impl else None
            if c is None and ic is None:
                continue
            flag = (c is not None and c.flagged) or (ic is not None and ic.flagged)
            cols = []
            for x in (c, ic):
                cols += (
                    ["-"] * 5
                    if x is None
                    else [
                        _fmt(x.primary),
                        _fmt(x.peer_level),
                        _fmt(x.threshold),
                        _units(x),
                        "FLAGGED" if x.flagged else "ok",
                    ]
                )
            out.append(
                f"<tr class='{'flag' if flag else ''}'><td>{e(a['name'])}</td>"
                + "".join(f"<td>{x}</td>" for x in cols)
                + f"<td>{e(c.basis if c is not None else '')}</td>"
                f"<td>{e(ic.basis if ic is not None else '')}</td></tr>"
            )
        out.append("</table>")
    for p, info in (getattr(report, "populations", None) or {}).items():
        out.extend(f"<p class='small'><b>{e(p)} population</b>: {e(n)}</p>" for n in info.get("notes", []))
    return out


def _scales(report) -> list[str]:
    scales = getattr(report, "scales", None) or {}
    precs = [p for p in ("fp32", "fp16", "bf16", "int8") if any(p in v for v in scales.values())]
    # a precision whose members ran several programs: one column per program's population (populations_of)
    precs += sorted({k for v in scales.values() for k in v} - set(precs))
    if not precs:
        return []
    e = html.escape
    out = [
        "<h2>Expected error per anchor and precision</h2><p>nRMSE measured on this run: fp32 = the voters' "
        "median against a float64 execution of the model; a reduced precision = its population's median "
        "against the fp32 consensus (what the precision costs there).</p><table><tr><th>anchor</th>"
        + "".join(f"<th>{p}</th>" for p in precs)
        + "</tr>"
    ]
    for a, per in scales.items():
        out.append(
            f"<tr><td>{e(a)}</td>"
            + "".join(
                f"<td title='{e(per[p]['basis'])}'>{_fmt(per[p]['expected'])}</td>" if p in per else "<td>-</td>"
                for p in precs
            )
            + "</tr>"
        )
    out.append("</table>")
    return out


def _task(report) -> list[str]:
    """The task's cost (``report.task``) first: per backend the headline and every metric."""
    t = getattr(report, "task", None) or {}
    if not t or not t.get("backends"):
        return []
    e = html.escape
    keys = sorted({k for d in t["backends"].values() for k in d["metrics"]})
    tkeys = sorted({k for d in t["backends"].values() for k in (d.get("truth") or {})})
    out = [
        f"<h2>What it costs the task ({e(str(t.get('task', {}).get('task')))}, {t.get('samples')} samples)</h2>"
        "<p>Each backend's task results against the consensus' results"
        + (f", and against {t.get('labels')} labels" if t.get("labels") else "")
        + ".</p>",
        "<table><tr><th>backend</th><th>precision</th><th>headline</th>"
        + "".join(f"<th>{e(k)}</th>" for k in keys)
        + "".join(f"<th>labels: {e(k)}</th>" for k in tkeys)
        + "</tr>",
    ]
    for b, d in t["backends"].items():
        out.append(
            f"<tr><td>{e(b)}</td><td>{e(str(d.get('precision', '')))}</td><td><b>{e(d['headline'])}</b></td>"
            + "".join(f"<td>{_fmt(d['metrics'].get(k))}</td>" for k in keys)
            + "".join(f"<td>{_fmt((d.get('truth') or {}).get(k))}</td>" for k in tkeys)
            + "</tr>"
        )
    out.append("</table>")
    return out


def _drill(report) -> list[str]:
    """The drill-down section (``report.drill``): per flagged backend the path stage -> subgraph ->
    operator and its repro, then the local and carried profiles of every replayed backend."""
    d = getattr(report, "drill", None) or {}
    if not d:
        return []
    e = html.escape
    out = [
        f"<h2>Drill-down</h2><p>{d.get('samples')} samples, {d.get('runs')} replay runs, {d.get('seconds')} s. "
        "Each stage replayed alone from the consensus tensors at its entry (local error) beside the normal "
        "run (carried error); inside the stage where a flagged backend's error is introduced, the first "
        "operator whose output departs from the peers, and its standalone repro.</p>"
    ]
    for b, c in (d.get("culprits") or {}).items():
        steps = " &rarr; ".join(
            [f"stage {e(str(c.get('stage')))} ({c.get('stage_nodes')} operators)"]
            + [
                f"round {p['round']} ({e(p.get('where', ''))}): {p['exposed']} tensors exposed, "
                "first departing "
                f"<code>{e(p['first'])}</code> ({e(p['op_type'])})"
                for p in c.get("path", [])
            ]
            + [f"<b>{e(c['op_type'])} <code>{e(c['node'])}</code></b>"]
        )
        scope = c.get("scope")
        if scope == "subgraph":  # grown from the culprit (anpred.drill.grow): the operators it kept
            scope = f"subgraph of {len(c.get('repro_nodes') or [])} operators: {', '.join(c.get('repro_nodes') or [])}"
        rep = (
            f"repro <code>{e(str(c['repro']))}</code> (re-run, reproduced; scope {e(str(scope))}; "
            f"{'flagged' if c.get('flagged_in_repro') else 'departs, below the floor'} there)"
            if c.get("reproduced")
            else "unconfirmed: no standalone repro reproduced it"
        )
        out.append(
            f"<p class='flag'><b>{e(b)}</b>: {steps}; local nRMSE {_fmt(c.get('local_nrmse'))} vs peers "
            f"{_fmt(c.get('peers_nrmse'))}; {rep}</p>"
        )
    for b, m in (d.get("neighbours") or {}).items():  # a neighbour's value returned (anpred.drill.neighbours)
        from anpred.report.text import neighbour_line

        out.append(f"<p class='flag'>{e(neighbour_line(b, m))}</p>")
    stages = d.get("stages") or {}
    if stages:
        out.append(
            "<table><tr><th>backend</th>"
            + "".join(
                f"<th>s{p['stage']} {e(p['anchor'])}<br>local / carried</th>" for p in next(iter(stages.values()))
            )
            + "</tr>"
        )
        for b, prof in stages.items():
            out.append(
                f"<tr><td>{e(b)}</td>"
                + "".join(
                    f"<td class='{'flag' if p['role'] == 'introduced' else ''}'>"
                    f"{_fmt(p['local'])} / {_fmt(p['carried'])} ({e(p['role'])})</td>"
                    for p in prof
                )
                + "</tr>"
            )
        out.append("</table>")
    out.extend(f"<p class='small'>{e(n)}</p>" for n in d.get("notes") or [])
    return out


def _verdict_table(report, primary: str) -> list[str]:
    """The verdict table (a witness marked with its role), the witnesses' lines and the notes of
    what the machine changed (precision computed != asked, int8 kernel family)."""
    from anpred.report.text import verdict_word, witness_lines

    e = html.escape
    parts: list[str] = []
    if not report.verdicts:
        return parts
    parts.append(
        "<h2>Verdicts</h2><table><tr><th>backend</th><th>family</th><th>precision</th><th>votes</th>"
        "<th>verdict</th><th>anchors judged</th><th>origin stage</th><th>origin anchor</th>"
        f"<th>max {e(primary)} (anchor)</th><th>most deviant anchor (highest &times; threshold)</th>"
        f"<th>its {e(primary)}</th><th>&times; threshold</th><th>propagation</th><th>flagged anchors</th>"
        "</tr>"
    )
    for b, v in report.verdicts.items():
        cls = "flag" if v.any_flagged else ("ok" if v.status in ("consistent", "reference") else "gap")
        word = {"ok": "consistent"}.get(verdict_word(v), verdict_word(v))
        if v.implementation is not None:
            word += f"; implementation: {verdict_word(v.implementation)}"
        judged = f"{v.judged_anchors} / {len(report.anchors)}" + (
            f" ({len(v.partial)} on part of the samples)" if v.partial else ""
        )
        role = (report.backends.get(b) or {}).get("role")
        shown = b + (f" ({role})" if role in ("witness", "arbiter") else "")
        parts.append(
            f"<tr class='{cls}'><td>{e(shown)}</td><td>{e(v.family)}</td><td>{e(v.precision)}"
            + (f" ({e(v.precision_requested)} asked)" if getattr(v, "precision_requested", "") else "")
            + "</td>"
            f"<td>{'yes' if v.votes else 'no'}</td><td>{e(word)}</td><td>{e(judged)}</td>"
            f"<td>{_fmt(v.origin_stage)}</td><td>{_fmt(v.origin_anchor)}</td>"
            f"<td>{_largest(report, b)}</td><td>{_fmt(v.worst_anchor)}</td>"
            f"<td>{_fmt(v.worst_primary)}</td><td>{_fmt(v.worst_ratio_to_threshold)}</td>"
            f"<td>{e(v.propagation)}{' (non-monotonic)' if v.non_monotonic else ''}</td>"
            f"<td>{len(v.flagged_anchors)}</td></tr>"
        )
    parts.append("</table>")
    parts.extend(f"<p class='small'>{e(line.strip())}</p>" for line in witness_lines(report))
    for n in report.notes:  # what the machine changed: precision computed != asked, int8 kernel family
        if n.startswith(("precision: ", "kernels: ")):
            parts.append(f"<p class='small'><b>{e(n.split(':', 1)[0])}</b>: {e(n.split(':', 1)[1].strip())}</p>")
    for b, v in report.verdicts.items():
        if v.flagged and getattr(v, "origin_traced", ""):
            parts.append(f"<p class='small'>{e(b)}: origin {e(v.origin_traced)}.</p>")
    return parts


def write_html(report, path: str | Path) -> None:
    """Write the HTML report of ``report`` to ``path`` (atomically; plots embedded as base64 PNG).
    Raises OutputPathError when ``path`` cannot be written."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from anpred.onnx_io import atomic_write_text
    from anpred.report.text import format_text

    primary = report.config.get("primary", "nrmse")
    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>anpred check {e(report.run_dir)}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px}.flag{background:#fdd}.ok{background:#dfd}"
        ".gap{background:#ffe9b3}"
        "pre{background:#f6f6f6;padding:8px;font-size:12px}</style></head><body>",
        f"<h1>anpred check: {e(report.status.upper())}</h1>",
        f"<p>run <code>{e(report.run_dir)}</code>, {report.samples} samples, oracle <b>{e(report.oracle)}</b>, "
        f"primary statistic <b>{e(primary)}</b>, schema {e(report.schema)}</p>",
    ]
    parts.extend(_task(report))
    if report.problems:
        parts.append(
            "<h2>Could not be judged</h2><ul>" + "".join(f"<li>{e(p)}</li>" for p in report.problems) + "</ul>"
        )
    gaps = getattr(report, "incomplete", []) or []
    if gaps:
        note = " (exit 0: --allow-incomplete)" if getattr(report, "allow_incomplete", False) else ""
        parts.append(
            f"<h2 class='gap'>Not judged ({len(gaps)}): the verdict is incomplete{e(note)}</h2><ul>"
            + "".join(f"<li>{e(g)}</li>" for g in gaps)
            + "</ul>"
        )
    parts.extend(_independence(report))
    parts.extend(_verdict_table(report, primary))
    parts.extend(_drill(report))
    parts.extend(_populations(report, primary))
    parts.extend(_scales(report))
    if report.threshold:
        parts.append(
            "<h2>Threshold baseline (final outputs)</h2><table><tr><th>backend</th><th>reference</th>"
            "<th>atol</th><th>rtol</th><th>result</th><th>failed / total</th><th>max abs</th><th>max rel</th>"
            "</tr>"
        )
        for b, t in report.threshold.items():
            parts.append(
                f"<tr class='{'ok' if t.passed else 'flag'}'><td>{e(b)}</td><td>{e(t.reference)}</td>"
                f"<td>{t.atol:g}</td><td>{t.rtol:g}</td><td>{'pass' if t.passed else 'FAIL'}</td>"
                f"<td>{t.failed_elements} / {t.total_elements}</td><td>{_fmt(t.max_abs)}</td>"
                f"<td>{_fmt(t.max_rel)}</td></tr>"
            )
        parts.append("</table>")
    if report.cells:
        parts.extend(_cell_sections(report, primary))
    parts.append(f"<h2>Summary</h2><pre>{e(format_text(report))}</pre></body></html>")
    atomic_write_text(Path(path), "\n".join(parts))


def _independence(report) -> list[str]:
    """The correlated backends counted as one consensus vote, and the error correlation of each pair of
    voting families (with where the pair was merged)."""
    e = html.escape
    parts = []
    for c in getattr(report, "correlated", []) or []:
        how = (
            "bit-identical or error-correlated tensors (three-cornered hat rho "
            f"{min(c['rho'].values()):.2f}-{max(c['rho'].values()):.2f})"
            if c.get("rho")
            else "bit-identical tensors"
        )
        parts.append(
            f"<p>Correlated backends: <b>{e(' + '.join(c['backends']))}</b> gave {e(how)} at "
            f"{len(c['anchors'])} of {len(report.anchors)} anchors and were counted as one consensus "
            "vote there" + (f" (judged apart at {e(', '.join(c['differ']))})" if c.get("differ") else "") + ".</p>"
        )
    pairs = (getattr(report, "independence", None) or {}).get("pairs") or {}
    if pairs:
        from anpred.judge.oracle_notes import merged_pairs

        merged = merged_pairs(getattr(report, "correlated", []) or [])
        parts.append(
            "<h2>Independence of the voting families</h2>"
            "<p>Error correlation rho of each pair (three-cornered "
            "hat over the family votes, median over the anchors where the pair was measured; a pair at "
            f"rho &ge; {e(str(report.config.get('correlated_rho')))} is a candidate to merge into one "
            "vote, merged where the nearest-corner guard passes and enough votes remain)</p><table><tr>"
            "<th>pair</th><th>rho (median)</th><th>rho (max)</th><th>anchors measured</th>"
            "<th>merged into one vote at</th></tr>"
            + "".join(
                f"<tr><td>{e(p.replace('|', ' ~ '))}</td><td>{v['rho_median']:.3f}</td>"
                f"<td>{v['rho_max']:.3f}</td><td>{v['anchors']}</td>"
                f"<td>{merged.get(p, 0)} anchors</td></tr>"
                for p, v in pairs.items()
            )
            + "</table>"
        )
    return parts


def _cell_sections(report, primary: str) -> list[str]:
    """The sections over the judged cells: the heatmap, the propagation profiles and steps, the flagged
    anchors' detail plots (at most :data:`MAX_DETAIL`) and the table of all cells."""
    from anpred.report.text import PROPAGATION_LEGEND, propagation_line

    e = html.escape
    parts = []
    parts.append(f"<h2>Heatmap</h2><img src='{_heatmap(report, primary)}'>")
    parts.append(f"<h2>Propagation profile</h2><img src='{_profiles(report, primary)}'>")
    parts.append(
        f"<p>{e(primary)} at the first judged anchor, then the ratio to the previous judged anchor "
        f"({e(PROPAGATION_LEGEND)}):</p><table><tr><th>backend</th><th>profile</th></tr>"
        + "".join(
            f"<tr><td>{e(b)}</td><td><code>{e(propagation_line(report, b))}</code></td></tr>" for b in report.verdicts
        )
        + "".join(
            f"<tr><td>{e(b)} (implementation, {e(v.precision)} population)</td><td><code>"
            f"{e(propagation_line(report, b, v.precision))}</code></td></tr>"
            for b, v in report.verdicts.items()
            if v.implementation is not None
        )
        + "</table>"
    )
    steps = [(b, s) for b, v in report.verdicts.items() for s in v.steps if v.flagged]
    if steps:
        parts.append(
            "<h3>Steps of flagged backends</h3><table><tr><th>backend</th><th>from</th><th>to</th>"
            "<th>ratio</th><th>kind</th></tr>"
            + "".join(
                f"<tr><td>{e(b)}</td><td>{e(s.src)}</td><td>{e(s.dst)}</td><td>{_fmt(s.ratio)}</td>"
                f"<td>{e(s.kind)}</td></tr>"
                for b, s in steps
            )
            + "</table>"
        )
    flagged = [c for c in report.cells if c.flagged]
    if flagged:
        parts.append("<h2>Flagged anchors</h2>")
        for c in flagged[:MAX_DETAIL]:
            img = _detail(report, c.anchor, c.backend)
            parts.append(f"<h3>{e(c.backend)} at {e(c.anchor)}</h3><p>{e(c.reason)}</p>")
            if img:
                parts.append(f"<img src='{img}'>")
        if len(flagged) > MAX_DETAIL:
            parts.append(f"<p>{len(flagged) - MAX_DETAIL} more flagged cells not plotted (see the table).</p>")
    parts.append(
        "<h2>All cells</h2><table><tr><th>anchor</th><th>backend</th><th>samples</th>"
        f"<th>{e(primary)}</th><th>p90/sample</th><th>peers' median</th><th>floor</th><th>threshold</th>"
        "<th>max abs</th><th>SNR dB</th><th>cosine</th><th>W1</th><th>max ULP</th><th>NaN/Inf</th>"
        "<th>verdict</th></tr>"
    )
    for c in report.cells:
        s = c.stats
        parts.append(
            f"<tr class='{'flag' if c.flagged else ''}'><td>{e(c.anchor)}</td><td>{e(c.backend)}</td>"
            f"<td>{c.samples}</td><td>{_fmt(c.primary)}</td><td>{_fmt(c.per_sample.get('p90'))}</td>"
            f"<td>{_fmt(c.peer_level)}</td><td>{_fmt(c.floor)}</td><td>{_fmt(c.threshold)}</td>"
            f"<td>{_fmt(s.max_abs)}</td><td>{_fmt(s.snr_db)}</td><td>{_fmt(s.cosine)}</td>"
            f"<td>{_fmt(s.wasserstein)}</td><td>{_fmt(s.max_ulp)}</td><td>{s.nan}/{s.inf}</td>"
            f"<td>{'FLAGGED' if c.flagged else 'ok'}</td></tr>"
        )
    parts.append("</table>")
    return parts
