"""The campaign summary: ``OUT/campaign.json`` (every configuration's record, the version changes,
Ray's resources, timings), ``OUT/summary.txt`` (the table :func:`format_table` prints) and
``OUT/index.html``: the dashboard's page (:mod:`anpred.dashboard`, the same design as ``anpred
dashboard``) over the campaign's runs in its history database: models (a row per backend set where
the campaign has several) x backends, each cell the latest configuration's verdict (origin stage, culprit operator) with
its trend over the campaign's configurations (the runtime versions of a version axis in the campaign's order), the
changes marked and every cell linked to its report; above the grid the campaign's configurations (state, standing,
failures with their reason) and, per runtime version, what changed. The campaign and its
configurations are recorded in the history (:func:`anpred.report.history.record_campaign`), so ``anpred
dashboard`` over several campaigns' histories shows the same."""

from __future__ import annotations

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
                groups.setdefault((c.label, c.backend_set, c.inputs_name, rest), {})[c.versions[axis.package]] = done[
                    c.id
                ]
        for (label, bset, inp, _), by_ver in groups.items():
            vers = [v for v in axis.versions if v in by_ver]
            for a, b in zip(vers, vers[1:]):
                for backend in by_ver[b].get("backends", {}):
                    before = cell_text(by_ver[a]["backends"].get(backend))
                    after = cell_text(by_ver[b]["backends"].get(backend))
                    if before.split(" | ")[0] != after.split(" | ")[0]:
                        out.append(
                            {
                                "model": label,
                                "backend_set": bset,
                                "inputs": inp,
                                "package": axis.package,
                                "from": a,
                                "to": b,
                                "backend": backend,
                                "before": before,
                                "after": after,
                            }
                        )
    return out


def write_summary(campaign, result, db: Path) -> dict[str, Any]:
    """Write ``campaign.json``, ``summary.txt`` and ``index.html`` in ``result.out``; returns the JSON."""
    from anpred.onnx_io import atomic_write_text, to_json

    out = Path(result.out)
    changes = version_changes(campaign, result.records)
    summary = {
        "schema": SUMMARY_SCHEMA,
        "name": campaign.name,
        "file": str(campaign.path),
        "configurations": len(campaign.configurations),
        "complete": sum(r.get("state") == "complete" for r in result.records),
        "failed": [{"id": r["id"], "step": r.get("step"), "reason": r.get("reason")} for r in result.failed],
        "ran": result.ran,
        "skipped": result.skipped,
        "seconds": round(result.seconds, 2),
        "ray": {k: (str(v) if k == "address" else v) for k, v in result.ray.items()},
        "history": str(db),
        "version_changes": changes,
        "records": result.records,
    }
    atomic_write_text(out / "campaign.json", to_json(summary, indent=1))
    text = format_table(result.records)
    if changes:
        text += "\n\nper runtime version, what changed:\n" + "\n".join(
            f"  {c['model']} / {c['backend_set']} / {c['inputs']}: {c['package']} {c['from']} -> {c['to']}: "
            f"{c['backend']} {c['before']} -> {c['after']}"
            for c in changes
        )
    atomic_write_text(out / "summary.txt", text + "\n")
    _index(campaign, result, db, changes)
    return summary


def _configs(campaign, result) -> list:
    """The campaign's configurations as the history records them (:class:`anpred.report.history.CampaignConfig`),
    in the campaign's order; a complete one names its run folder (from its ``report.json``)."""
    import json

    from anpred.report.history import CampaignConfig

    recs = {r["id"]: r for r in result.records}
    out = []
    for pos, c in enumerate(campaign.configurations):
        r = recs.get(c.id)
        if r is None:
            continue
        run_dir = None
        if r.get("state") == "complete":
            try:
                run_dir = json.loads((Path(r["folder"]) / "report.json").read_text()).get("run_dir")
            except (OSError, ValueError):
                run_dir = None
        out.append(
            CampaignConfig(
                config_id=c.id,
                position=pos,
                label=c.label,
                backend_set=c.backend_set,
                inputs=c.inputs_name,
                versions=dict(c.versions),
                state=r.get("state", "failed"),
                reason=f"{r.get('step')}: {r.get('reason', '')}" if r.get("state") != "complete" else "",
                report=r.get("report_html") if r.get("state") == "complete" else None,
                run_dir=run_dir,
            )
        )
    return out


def _index(campaign, result, db: Path, changes) -> None:
    """``OUT/index.html``: the campaign recorded in its history, then the dashboard's page over its
    runs (module docstring)."""
    from anpred.dashboard import SiteOptions, collect, write_site
    from anpred.report.history import record_campaign

    out = Path(result.out)
    axes = [{"package": a.package, "versions": list(a.versions), "backends": list(a.backends)} for a in campaign.axes]
    record_campaign(db, campaign.name, out, str(campaign.path), axes, _configs(campaign, result))
    configs = []
    for r in result.records:
        ok = r.get("state") == "complete"
        standing = "; ".join(f"{b} {cell_text(row)}" for b, row in r.get("backends", {}).items()) if ok else ""
        configs.append(
            {
                "name": _config_name(r),
                "state": r.get("state", "failed"),
                "standing": standing,
                "step": r.get("step"),
                "reason": r.get("reason", ""),
                "report": r.get("report_html") if ok else None,
            }
        )
    counts = (
        f"{len(result.records)} of {len(campaign.configurations)} configurations recorded; "
        f"{sum(r.get('state') == 'complete' for r in result.records)} complete, {len(result.failed)} failed; "
        f"{len(result.ran)} run now, {len(result.skipped)} found complete; {result.seconds:.0f} s; history {db}"
    )
    view = {"name": campaign.name, "counts": counts, "configs": configs, "changes": changes, "axes": axes}
    hist = collect([db], campaign=campaign.name, campaign_folder=out)
    write_site(hist, out, SiteOptions(title=f"Campaign {campaign.name}", campaign=view))
