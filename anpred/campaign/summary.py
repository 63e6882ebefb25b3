"""The campaign summary: ``OUT/campaign.json`` (every configuration's record, the version changes,
Ray's resources, timings), ``OUT/summary.txt`` (the table :func:`format_table` prints) and
``OUT/index.html`` (models x backends per backend set, input set and runtime version: verdict,
origin stage, task impact, culprit operator, linked to each configuration's report; then per
runtime version what changed)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

__all__ = ["write_summary", "format_table", "version_changes", "cell_text", "SUMMARY_SCHEMA"]

SUMMARY_SCHEMA = "anpred.campaign/1"


def cell_text(row: dict[str, Any] | None) -> str:
    """One backend in one configuration, short: ``ok``, ``FLAGGED s3 (Softplus)``, ``failed: ...``;
    the task headline after `` | `` when there is one."""
    if row is None:
        return "-"
    if row.get("run") not in (None, "ok"):
        text = f"{row['run']}: {row.get('reason', '')}"[:60]
    elif row.get("flagged"):
        where = f" s{row['origin_stage']}" if row.get("origin_stage") is not None else ""
        text = f"FLAGGED{where}" + (f" ({row['culprit_op']})" if row.get("culprit_op") else "")
    else:
        text = {"consistent": "ok"}.get(row.get("verdict", ""), row.get("verdict", "?"))
    if row.get("task"):
        text += f" | {row['task']}"
    return text


def _config_name(rec: dict[str, Any]) -> str:
    vers = " ".join(f"{p} {v}" for p, v in (rec.get("versions") or {}).items())
    return " / ".join(x for x in (rec.get("label"), rec.get("backend_set"), rec.get("inputs"), vers) if x)


def format_table(records: list[dict[str, Any]]) -> str:
    """One line per configuration and backend: configuration, state, backend, standing."""
    rows = [["configuration", "backend", "standing"]]
    for rec in records:
        name = _config_name(rec)
        if rec.get("state") != "complete":
            rows.append([name, "-", f"FAILED ({rec.get('step')}): {rec.get('reason', '')}"[:120]])
            continue
        for b, row in rec.get("backends", {}).items():
            rows.append([name, b, cell_text(row)[:120]])
            name = ""
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def version_changes(campaign, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, backend set, input set) and runtime package, between consecutive versions (the
    campaign's order): each backend whose standing changed. A list of
    ``{"model", "backend_set", "inputs", "package", "from", "to", "backend", "before", "after"}``."""
    out = []
    done = {r["id"]: r for r in records if r.get("state") == "complete"}
    for axis in campaign.axes:
        groups: dict[tuple, dict[str, dict]] = {}
        for c in campaign.configurations:
            if axis.package in c.versions and c.id in done:
                rest = tuple(sorted((p, v) for p, v in c.versions.items() if p != axis.package))
                groups.setdefault((c.label, c.backend_set, c.inputs_name, rest), {})[c.versions[axis.package]] = done[c.id]
        for (label, bset, inp, _), by_ver in groups.items():
            vers = [v for v in axis.versions if v in by_ver]
            for a, b in zip(vers, vers[1:]):
                for backend in by_ver[b].get("backends", {}):
                    before = cell_text(by_ver[a]["backends"].get(backend))
                    after = cell_text(by_ver[b]["backends"].get(backend))
                    if before.split(" | ")[0] != after.split(" | ")[0]:
                        out.append({"model": label, "backend_set": bset, "inputs": inp, "package": axis.package,
                                    "from": a, "to": b, "backend": backend, "before": before, "after": after})
    return out


def write_summary(campaign, result, db: Path) -> dict[str, Any]:
    """Write ``campaign.json``, ``summary.txt`` and ``index.html`` in ``result.out``; returns the JSON."""
    from anpred.onnx_io import atomic_write_text, to_json

    out = Path(result.out)
    changes = version_changes(campaign, result.records)
    summary = {"schema": SUMMARY_SCHEMA, "name": campaign.name, "file": str(campaign.path),
               "configurations": len(campaign.configurations), "complete": sum(
                   r.get("state") == "complete" for r in result.records),
               "failed": [{"id": r["id"], "step": r.get("step"), "reason": r.get("reason")} for r in result.failed],
               "ran": result.ran, "skipped": result.skipped, "seconds": round(result.seconds, 2),
               "ray": {k: (str(v) if k == "address" else v) for k, v in result.ray.items()}, "history": str(db),
               "version_changes": changes, "records": result.records}
    atomic_write_text(out / "campaign.json", to_json(summary, indent=1))
    text = format_table(result.records)
    if changes:
        text += "\n\nper runtime version, what changed:\n" + "\n".join(
            f"  {c['model']} / {c['backend_set']} / {c['inputs']}: {c['package']} {c['from']} -> {c['to']}: "
            f"{c['backend']} {c['before']} -> {c['after']}" for c in changes)
    atomic_write_text(out / "summary.txt", text + "\n")
    atomic_write_text(out / "index.html", _html(campaign, result, changes))
    return summary


def _html(campaign, result, changes) -> str:
    e = html.escape
    parts = [f"<!doctype html><meta charset=utf-8><title>campaign {e(campaign.name)}</title>",
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.25em .5em;font-size:90%}.f{background:#fdd}.x{background:#eee}"
             ".ok{background:#efe}</style>",
             f"<h1>Campaign {e(campaign.name)}</h1>",
             f"<p>{len(result.records)} of {len(campaign.configurations)} configurations recorded; "
             f"{sum(r.get('state') == 'complete' for r in result.records)} complete, {len(result.failed)} failed; "
             f"{len(result.ran)} run now, {len(result.skipped)} found complete; {result.seconds:.0f} s.</p>"]
    backends: list[str] = []
    for r in result.records:
        backends += [b for b in r.get("backends", {}) if b not in backends]
    parts.append("<h2>Models &times; backends</h2><table><tr><th>configuration</th>" +
                 "".join(f"<th>{e(b)}</th>" for b in backends) + "</tr>")
    for r in result.records:
        link = Path("configs") / r["id"] / "report.html" if r.get("state") == "complete" else None
        name = e(_config_name(r))
        head = f"<a href='{e(str(link))}'>{name}</a>" if link else name
        if r.get("state") != "complete":
            parts.append(f"<tr><td>{head}</td><td class=x colspan={len(backends)}>FAILED ({e(str(r.get('step')))}): "
                         f"{e(str(r.get('reason', '')))}</td></tr>")
            continue
        cells = []
        for b in backends:
            row = r["backends"].get(b)
            cls = "x" if row is None else "f" if row.get("flagged") or row.get("run") != "ok" else "ok"
            cells.append(f"<td class={cls}>{e(cell_text(row))}</td>")
        parts.append(f"<tr><td>{head}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    if campaign.axes:
        parts.append("<h2>Per runtime version: what changed</h2>")
        if changes:
            parts.append("<table><tr><th>model / set / inputs</th><th>package</th><th>from</th><th>to</th>"
                         "<th>backend</th><th>before</th><th>after</th></tr>")
            for c in changes:
                parts.append("<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in (
                    f"{c['model']} / {c['backend_set']} / {c['inputs']}", c["package"], c["from"], c["to"],
                    c["backend"], c["before"], c["after"])) + "</tr>")
            parts.append("</table>")
        else:
            parts.append("<p>No backend's standing changed between consecutive versions.</p>")
    return "\n".join(parts)
