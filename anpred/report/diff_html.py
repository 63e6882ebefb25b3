"""HTML page of ``anpred diff``: the two graphs' stages side by side, changed regions highlighted, and
(when two runs are compared) each stage's deviation and the first moved anchor.

One self-contained file (inline CSS, no scripts, no network). Node chips are coloured: grey =
matched and unchanged, amber = matched but changed, red = only in this graph (part of a fused,
split, inserted or removed region). Unchanged runs of nodes longer than 8 are collapsed.
"""

from __future__ import annotations

import html
from pathlib import Path

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}
th{background:#f3f3f3}.chip{display:inline-block;margin:1px;padding:1px 4px;border-radius:3px;font-size:11px}
.same{background:#eee;color:#666}.changed{background:#ffd27f}.only{background:#ff9b9b}
.moved{background:#ffb3b3}.ok{background:#d6f5d6}.small{font-size:12px;color:#555}
code{font-size:12px}
"""


def _chips(ops: list[str]) -> str:
    out, run = [], 0
    for item in ops:
        op, name, status = _split(item)
        if status == "same":
            run += 1
            if run > 8:
                continue
        else:
            if run > 8:
                out.append(f'<span class="chip same">… {run - 8} unchanged</span>')
            run = 0
        out.append(f'<span class="chip {status}" title="{html.escape(name)}">{html.escape(op)}</span>')
    if run > 8:
        out.append(f'<span class="chip same">… {run - 8} unchanged</span>')
    return "".join(out)


def _split(item: str) -> tuple[str, str, str]:
    op, rest = item.split(":", 1)
    name, status = rest.rsplit(":", 1)
    return op, name, status


def render_diff_html(graph=None, runs=None, title: str = "anpred diff") -> str:
    """Return the HTML page for a :class:`anpred.diff.GraphDiff` and/or a
    :class:`anpred.diff.RunDiff` (at least one must be given; ``runs.graph`` is used when
    ``graph`` is None)."""
    if graph is None and runs is not None:
        graph = runs.graph
    if graph is None and runs is None:
        raise ValueError("render_diff_html needs a graph diff or a run diff")
    e = html.escape
    P = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>"
        f"</head><body><h1>{e(title)}</h1>"
    ]
    dev = runs.stage_deviation if runs is not None else {}
    if runs is not None:
        P.extend(_run_summary(runs))
    if graph is not None:
        P.extend(_graph_sections(graph, dev))
    if runs is not None:
        P.extend(_run_tables(runs))
    P.append("</body></html>")
    return "".join(P)


def _run_summary(runs) -> list[str]:
    """The run diff's header: the runs, samples, backends and statistic, skipped backends, and the first
    anchor that moved beyond the noise floor (or that none did)."""
    e = html.escape
    P = []
    how = (
        "per-sample summaries (mean, std, rms): a lower bound of the nRMSE; the runs stored no tensors"
        if runs.mode == "stats"
        else "aligned tensors"
    )
    total = len(runs.anchors) * len(runs.backends)
    P.append(
        f"<p>Run A: <code>{e(runs.run_a)}</code><br>Run B: <code>{e(runs.run_b)}</code><br>"
        f"{len(runs.samples)} paired sample(s); backends: {e(', '.join(runs.backends))}; statistic "
        f"<b>{e(runs.statistic)}</b> of B against A, from {e(how)}.<br>Compared {runs.compared} of "
        f"{total} (anchor, backend) cells; {len(runs.unpaired_anchors)} anchor(s) of A and "
        f"{len(runs.unpaired_b)} of B unpaired.</p>"
    )
    for b, why in runs.skipped_backends.items():
        P.append(f"<p class='small'>Skipped {e(b)}: {e(why)}</p>")
    if runs.first_moved:
        f = runs.first_moved
        P.append(
            f"<p class='moved'>First anchor that moved beyond the noise floor: <b>{e(f['anchor'])}</b> "
            f"(stage {f['stage']}) on {e(f['backend'])}: {f['value']:.3g} &gt; {f['floor']:.3g}</p>"
        )
    else:
        P.append(
            f"<p class='ok'>No compared anchor moved beyond the noise floor ({runs.compared} cells "
            "compared; see below for those that were not).</p>"
        )
    return P


def _graph_sections(graph, dev: dict[str, float]) -> list[str]:
    """The graph diff: its counts, opset and input/output changes, the stage table (with the run diff's
    largest deviation per stage, ``dev``, when given), the matched but changed nodes and the anchor
    correspondence."""
    e = html.escape
    P = []
    P.append(
        f"<p>Graph A: <code>{e(graph.a.path)}</code> ({graph.a.num_nodes} nodes) &nbsp; Graph B: "
        f"<code>{e(graph.b.path)}</code> ({graph.b.num_nodes} nodes). Matched {graph.matched}; "
        f"changed {len(graph.changed)}; only in A {len(graph.only_a)}; only in B {len(graph.only_b)}.</p>"
    )
    if graph.opset:
        P.append(
            "<p class='small'>Opset imports: "
            + ", ".join(f"{e(c.what)} {e(str(c.a))} &rarr; {e(str(c.b))}" for c in graph.opset)
            + "</p>"
        )
    if graph.io:
        P.append("<p class='small'>Graph inputs/outputs: " + "<br>".join(e(c.describe()) for c in graph.io) + "</p>")
    P.append(
        "<p class='small'><span class='chip same'>matched</span><span class='chip changed'>changed"
        "</span><span class='chip only'>only in this graph</span></p>"
    )
    P.append(
        "<table><tr><th>stage</th><th>graph A</th><th>graph B</th><th>regions</th>"
        + ("<th>max deviation</th>" if dev else "")
        + "</tr>"
    )
    for st in graph.stages:
        regs = "<br>".join(f"<b>{e(graph.regions[k].kind)}</b>: {e(graph.regions[k].label)}" for k in st.regions[:20])
        if len(st.regions) > 20:
            regs += f"<br>… {len(st.regions) - 20} more"
        P.append(
            f"<tr><td>{'all' if st.index < 0 else st.index}</td><td>{_chips(st.a_ops)}</td>"
            f"<td>{_chips(st.b_ops)}</td><td class='small'>{regs}</td>"
        )
        if dev:
            v = dev.get(str(st.index))
            P.append(f"<td>{'' if v is None else f'{v:.3g}'}</td>")
        P.append("</tr>")
    P.append("</table>")
    if graph.changed:
        P.append("<h2>Matched but changed</h2><table><tr><th>A</th><th>B</th><th>op</th><th>changes</th></tr>")
        for m in graph.changed[:500]:
            P.append(
                f"<tr><td>{e(m.a)}</td><td>{e(m.b)}</td><td>{e(m.op_type)}</td><td class='small'>"
                + "<br>".join(e(c.describe()) for c in m.changes)
                + "</td></tr>"
            )
        P.append("</table>")
    if graph.anchors:
        P.append(
            "<h2>Anchor correspondence</h2><table><tr><th>anchor</th><th>A value</th><th>B value</th>"
            "<th>status</th><th>transform</th><th>reason</th></tr>"
        )
        for a in graph.anchors:
            P.append(
                f"<tr><td>{e(a.anchor)}</td><td>{e(str(a.a_value))}</td><td>{e(str(a.b_value))}</td>"
                f"<td>{e(a.status)}</td><td>{e(str(a.transform or ''))}</td>"
                f"<td class='small'>{e(a.reason)}</td></tr>"
            )
        P.append("</table>")
    return P


def _run_tables(runs) -> list[str]:
    """The run diff's tables: each anchor's worst value per backend against its floor, the cells not
    compared (with the reason) and the unpaired anchors of each run."""
    e = html.escape
    P = []
    P.append(
        f"<h2>Anchors ({e(runs.statistic)} of B against A, worst sample)</h2><table><tr><th>anchor</th>"
        "<th>stage</th>" + "".join(f"<th>{e(b)}</th>" for b in runs.backends) + "</tr>"
    )
    for a in runs.anchors:
        cells = {c.backend: c for c in a.cells}
        row = f"<tr><td>{e(a.anchor)}</td><td>{a.stage}</td>"
        for b in runs.backends:
            c = cells.get(b)
            row += (
                f"<td class='small' title='{e(a.missing.get(b, ''))}'>not compared</td>"
                if c is None
                else f"<td class='{'moved' if c.moved else 'ok'}'>{c.value:.3g} (floor {c.floor:.2g})</td>"
            )
        P.append(row + "</tr>")
    P.append("</table>")
    nc = runs.not_compared()
    if nc:
        P.append(f"<h2>Not compared ({len(nc)})</h2><table><tr><th>anchor</th><th>backend</th><th>reason</th></tr>")
        for anc, b, why in nc[:2000]:
            P.append(f"<tr><td>{e(anc)}</td><td>{e(b)}</td><td class='small'>{e(why)}</td></tr>")
        P.append("</table>" + (f"<p>… {len(nc) - 2000} more</p>" if len(nc) > 2000 else ""))
    for side, lst in (("A", runs.unpaired_anchors), ("B", runs.unpaired_b)):
        if lst:
            P.append(
                f"<h2>Unpaired anchors of run {side} ({len(lst)})</h2><p class='small'>No counterpart in "
                "the other run (neither by name nor through the structural correspondence): "
                + ", ".join(f"<code>{e(x)}</code>" for x in lst)
                + "</p>"
            )
    return P


def write_diff_html(path: str | Path, graph=None, runs=None, title: str = "anpred diff") -> None:
    """Write the page atomically with ordinary file permissions (0666 minus the umask).
    Raises OutputPathError when the folder is missing or unwritable."""
    import os

    from anpred.onnx_io import atomic_write_text

    atomic_write_text(Path(path), render_diff_html(graph, runs, title))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
