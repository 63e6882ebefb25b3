"""Tracking verdicts over time in an SQLite database (stdlib ``sqlite3``).

Tables: ``runs`` (one row per ``anpred check``: time, run folder, model identity, machine, status),
``verdicts`` (per run and backend: versions, verdict, origin, worst statistic, threshold result) and
``cells`` (per run, backend and anchor: the primary statistic, the decision and all statistics as JSON).
``anpred history DB`` reads the trend of each (model, backend).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT, run_dir TEXT, model TEXT, model_sha256 TEXT,
  machine TEXT, cpu TEXT, status TEXT, oracle TEXT, samples INTEGER);
CREATE TABLE IF NOT EXISTS verdicts (
  run_id INTEGER REFERENCES runs(id), backend TEXT, family TEXT, precision TEXT, versions TEXT,
  flagged INTEGER, origin_anchor TEXT, origin_stage INTEGER, worst_anchor TEXT, worst_primary REAL,
  propagation TEXT, threshold_passed INTEGER, threshold_max_abs REAL);
CREATE TABLE IF NOT EXISTS cells (
  run_id INTEGER REFERENCES runs(id), backend TEXT, anchor TEXT, stage INTEGER, primary_stat REAL,
  flagged INTEGER, stats TEXT);
CREATE INDEX IF NOT EXISTS verdicts_backend ON verdicts(backend);
"""


def model_identity(report) -> tuple[str, str]:
    """``(name, sha256)`` of the judged model from the report's model description."""
    m = report.model or {}
    name = m.get("name") or Path(str(m.get("path") or m.get("source") or m.get("source_path") or "model")).name
    return str(name), str(m.get("sha256") or "")


def _connect(db: str | Path, create: bool) -> sqlite3.Connection:
    p = Path(db)
    if not create and not p.is_file():
        raise AnpredError(f"{p}: no such history database")
    if create and not p.parent.is_dir():
        raise AnpredError(f"{p}: folder {p.parent} does not exist")
    try:
        con = sqlite3.connect(str(p))
        if create:
            con.executescript(_DDL)
            con.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        ver = con.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    except sqlite3.DatabaseError as err:
        raise AnpredError(f"{p} is not an anpred history database: {err}") from err
    if ver is None or ver[0] != str(SCHEMA_VERSION):
        con.close()
        raise AnpredError(f"{p}: history schema {ver[0] if ver else None!r} (expected {SCHEMA_VERSION})")
    return con


def _num(v):
    return None if v is None or (isinstance(v, float) and v != v) else float(v) if isinstance(v, (int, float)) else None


def append(db: str | Path, report) -> int:
    """Append one check report (a :class:`anpred.check.CheckReport`) to ``db`` (created when missing);
    returns the new run id. One transaction: either all rows are written or none.

    Raises:
        AnpredError: ``db`` is not an anpred history database or cannot be written.
    """
    name, sha = model_identity(report)
    con = _connect(db, create=True)
    try:
        with con:
            cur = con.execute(
                "INSERT INTO runs (created, run_dir, model, model_sha256, machine, cpu, status, oracle, samples) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (report.created, report.run_dir, name, sha, json.dumps(report.machine), report.machine.get("cpu", ""),
                 report.status, report.oracle, report.samples))
            rid = cur.lastrowid
            for b, info in report.backends.items():
                v = report.verdicts.get(b)
                t = report.threshold.get(b)
                con.execute(
                    "INSERT INTO verdicts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (rid, b, info.get("family"), info.get("precision"), json.dumps(info.get("versions", {})),
                     None if v is None else int(v.flagged), v.origin_anchor if v else None,
                     v.origin_stage if v else None, v.worst_anchor if v else None,
                     _num(v.worst_primary) if v else None, v.propagation if v else None,
                     None if t is None else int(t.passed), _num(t.max_abs) if t else None))
            stage = {a["name"]: a["stage"] for a in report.anchors}
            con.executemany("INSERT INTO cells VALUES (?,?,?,?,?,?,?)",
                            [(rid, c.backend, c.anchor, stage.get(c.anchor), _num(c.primary), int(c.flagged),
                              json.dumps(c.stats.to_dict())) for c in report.cells])
    except sqlite3.DatabaseError as err:
        raise AnpredError(f"cannot write history {db}: {err}") from err
    finally:
        con.close()
    return rid


@dataclass
class TrendRow:
    """One (run, backend) entry of a trend: time, versions, verdict, worst primary statistic."""

    run_id: int
    created: str
    model: str
    backend: str
    versions: dict[str, Any]
    flagged: bool | None
    origin_anchor: str | None
    worst_primary: float | None
    threshold_passed: bool | None
    status: str


def trend(db: str | Path, model: str | None = None) -> list[TrendRow]:
    """All (run, backend) rows of ``db`` in time order, optionally for one model name.
    Raises AnpredError when ``db`` is missing or not a history database."""
    con = _connect(db, create=False)
    try:
        q = ("SELECT r.id, r.created, r.model, v.backend, v.versions, v.flagged, v.origin_anchor, v.worst_primary, "
             "v.threshold_passed, r.status FROM runs r JOIN verdicts v ON v.run_id = r.id")
        args: tuple = ()
        if model is not None:
            q += " WHERE r.model = ?"
            args = (model,)
        rows = con.execute(q + " ORDER BY r.id, v.backend", args).fetchall()
    finally:
        con.close()
    return [TrendRow(r[0], r[1], r[2], r[3], json.loads(r[4] or "{}"), None if r[5] is None else bool(r[5]), r[6],
                     r[7], None if r[8] is None else bool(r[8]), r[9]) for r in rows]


def format_trend(rows: list[TrendRow]) -> str:
    """A table per (model, backend): one line per run with versions, verdict and worst statistic,
    and the change of the worst statistic against the previous run."""
    if not rows:
        return "(no entries)"
    out = [f"{'model':<22}{'backend':<16}{'run':>5}  {'created':<26}{'verdict':<9}{'worst':>11}{'change':>9}  "
           f"{'origin':<30}versions"]
    groups: dict[tuple[str, str], list[TrendRow]] = {}
    for r in rows:
        groups.setdefault((r.model, r.backend), []).append(r)
    for (m, b), rs in groups.items():
        prev = None
        for r in rs:
            verdict = "-" if r.flagged is None else ("FLAGGED" if r.flagged else "ok")
            w = "-" if r.worst_primary is None else f"{r.worst_primary:.3e}"
            ch = "" if prev in (None, 0) or r.worst_primary is None else f"x{r.worst_primary / prev:.2f}"
            vers = ",".join(f"{k}={v}" for k, v in r.versions.items() if k != "python")
            out.append(f"{m[:21]:<22}{b:<16}{r.run_id:>5}  {r.created:<26}{verdict:<9}{w:>11}{ch:>9}  "
                       f"{(r.origin_anchor or '-')[:29]:<30}{vers}")
            prev = r.worst_primary
    return "\n".join(out)


def plot_trend(rows: list[TrendRow], path: str | Path) -> None:
    """Plot the worst primary statistic per (model, backend) over runs (log scale; crosses: flagged)
    to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from anpred.onnx_io import atomic_write_bytes
    import io

    fig, ax = plt.subplots(figsize=(8, 4))
    groups: dict[tuple[str, str], list[TrendRow]] = {}
    for r in rows:
        if r.worst_primary is not None:
            groups.setdefault((r.model, r.backend), []).append(r)
    for (m, b), rs in groups.items():
        line, = ax.plot([r.run_id for r in rs], [max(r.worst_primary, 1e-16) for r in rs], marker="o", label=f"{m}/{b}")
        fl = [(r.run_id, max(r.worst_primary, 1e-16)) for r in rs if r.flagged]
        if fl:
            ax.scatter(*zip(*fl), marker="x", s=80, color=line.get_color())
    ax.set_yscale("log")
    ax.set_xlabel("run id")
    ax.set_ylabel("worst primary statistic")
    ax.set_title("precision trend (x: flagged)")
    if groups:
        ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
