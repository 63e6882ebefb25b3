"""Campaigns and version bisections in the history database (schema 3's ``campaigns``,
``campaign_runs`` and ``bisections`` tables, :mod:`anpred.report.history_schema`), as ``anpred
campaign`` writes them and the dashboard (docs/dashboard.md) reads them.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError
from anpred.report.history_schema import connect


@dataclass
class CampaignConfig:
    """One configuration of a campaign, as :func:`record_campaign` stores it (``campaign_runs``).

    position: its index in the campaign's order (the dashboard orders a campaign's runs by it: the
        runtime versions of an axis in the campaign's order); state: ``complete`` | ``failed``;
    reason: why it failed; report: its HTML report's path; run_dir: the run folder its report names
        (the key of its row in ``runs``; None when it failed).
    """

    config_id: str
    position: int
    label: str
    backend_set: str
    inputs: str
    versions: dict[str, str]
    state: str
    reason: str = ""
    report: str | None = None
    run_dir: str | None = None


def record_campaign(
    db: str | Path, name: str, folder: str | Path, file: str, axes: list[dict[str, Any]], configs: list[CampaignConfig]
) -> int:
    """Record (insert or update) the campaign ``name`` written to ``folder`` and its configurations;
    each complete configuration is tied to its run (``runs.run_dir == run_dir``, the latest such run).
    ``axes``: ``[{"package", "versions", "backends"}]``. Returns the campaign's id.

    Raises:
        AnpredError: ``db`` cannot be written or is not an anpred history database.
    """
    import time

    con = connect(db, create=True)
    try:
        with con:
            con.execute(
                "INSERT INTO campaigns (name, folder, file, updated, axes, configurations, complete, failed) "
                "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (name, folder) DO UPDATE SET file = excluded.file, "
                "updated = excluded.updated, axes = excluded.axes, configurations = excluded.configurations, "
                "complete = excluded.complete, failed = excluded.failed",
                (
                    name,
                    str(Path(folder).absolute()),
                    str(file),
                    time.strftime("%Y-%m-%dT%H:%M:%S"),
                    json.dumps(axes),
                    len(configs),
                    sum(c.state == "complete" for c in configs),
                    sum(c.state != "complete" for c in configs),
                ),
            )
            cid = con.execute(
                "SELECT id FROM campaigns WHERE name = ? AND folder = ?", (name, str(Path(folder).absolute()))
            ).fetchone()[0]
            for c in configs:
                run = None
                if c.run_dir is not None:
                    row = con.execute("SELECT max(id) FROM runs WHERE run_dir = ?", (str(c.run_dir),)).fetchone()
                    run = row[0] if row else None
                con.execute(
                    "INSERT OR REPLACE INTO campaign_runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        cid,
                        c.config_id,
                        c.position,
                        c.label,
                        c.backend_set,
                        c.inputs,
                        json.dumps(c.versions),
                        c.state,
                        c.reason,
                        str(Path(c.report).absolute()) if c.report else None,
                        run,
                    ),
                )
    except sqlite3.DatabaseError as err:
        raise AnpredError(f"cannot write history {db}: {err}") from err
    finally:
        con.close()
    return cid


def record_bisection(db: str | Path, result: dict[str, Any], campaign: str, folder: str | Path) -> int:
    """Record one version bisection (:func:`anpred.campaign.bisect.bisect_versions`'s result) of the
    campaign named ``campaign`` whose probes went to ``folder``; returns its id.

    Raises:
        AnpredError: ``db`` cannot be written or is not an anpred history database.
    """
    import time

    culprit = result.get("culprit") or {}
    con = connect(db, create=True)
    try:
        with con:
            cur = con.execute(
                "INSERT INTO bisections (created, campaign, folder, package, model, backend, good, bad, first_bad, "
                "last_good, standing_good, standing_first_bad, origin_stage, origin_anchor, culprit, culprit_op, "
                "report, probes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    time.strftime("%Y-%m-%dT%H:%M:%S"),
                    campaign,
                    str(Path(folder).absolute()),
                    result.get("package"),
                    result.get("model"),
                    result.get("backend"),
                    (result.get("candidates") or [None])[0],
                    (result.get("candidates") or [None])[-1],
                    result.get("first_bad"),
                    result.get("last_good"),
                    result.get("standing_good"),
                    result.get("standing_first_bad"),
                    result.get("origin_stage"),
                    result.get("origin_anchor"),
                    culprit.get("node"),
                    culprit.get("op_type"),
                    result.get("report"),
                    json.dumps(result.get("probes") or []),
                ),
            )
            return cur.lastrowid
    except sqlite3.DatabaseError as err:
        raise AnpredError(f"cannot write history {db}: {err}") from err
    finally:
        con.close()
