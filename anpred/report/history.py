"""Tracking verdicts over time in an SQLite database (stdlib ``sqlite3``).

Tables: ``runs`` (one row per ``anpred check``: time, run folder, model identity, machine, status,
input set identity: ``inputs`` JSON description and ``inputs_sha256`` over the samples' hashes),
``verdicts`` (per run and backend: versions, verdict, origin, worst statistic, threshold result) and
``cells`` (per run, backend and anchor: the primary statistic, the decision and all statistics as JSON)
and ``tasks`` (per run and backend: each task metric of ``report.task``, :mod:`anpred.task`; against
the labels as ``truth.<metric>``; added to schema 2 without a version change: an older database gains
the empty table when appended to). :func:`task_regressions` compares two runs' task metrics.
``anpred history DB`` reads the trend of each (model, backend); the change of the worst statistic is
given only against the previous run on the same inputs (other inputs: ``inputs!=``). A report with
status ``error`` is not appended (``anpred check`` says so). Schema 2 added the input columns; a
schema-1 database is migrated when appended to and read as is (inputs unknown).

Schema 3 (the dashboard, ``anpred dashboard``, docs/dashboard.md) adds ``runs.report`` (the HTML
report's path, where the writer knew it), ``verdicts.culprit`` / ``culprit_op`` (the operator the
drill-down named), and three tables: ``campaigns`` (one row per campaign output folder: name, file,
version axes, counts), ``campaign_runs`` (per campaign configuration: label, backend set, input set,
versions, its position in the campaign, state, report, and its run once judged) and ``bisections``
(each ``anpred campaign --bisect`` result: package, model label, backend, ``first_bad``,
``last_good``, origin stage and culprit). An older database is migrated (columns added, tables
created) when written to, and read as is (the new columns read as unknown).

The schema and the connections are in :mod:`anpred.report.history_schema`, the campaigns and bisections
in :mod:`anpred.report.history_campaigns`; both re-exported here.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

# the schema and the connections, re-exported here (SCHEMA_VERSION, columns, create, open_history)
from anpred.report.history_schema import SCHEMA_VERSION, columns, connect, create, open_history

# the campaigns and bisections, re-exported here
from anpred.report.history_campaigns import CampaignConfig, record_bisection, record_campaign

__all__ = [
    "SCHEMA_VERSION",
    "HIGHER_IS_BETTER",
    "DEFAULT_MARGIN",
    "columns",
    "create",
    "open_history",
    "model_identity",
    "append",
    "TrendRow",
    "has_run",
    "trend",
    "TaskRow",
    "task_trend",
    "task_regressions",
    "format_task_trend",
    "format_trend",
    "plot_trend",
    "CampaignConfig",
    "record_campaign",
    "record_bisection",
]

#: task metrics where higher is better (a drop is a regression); ``truth.*`` are against the labels
HIGHER_IS_BETTER = (
    "kept_fraction",
    "precision",
    "recall",
    "f1",
    "map50_vs_consensus",
    "top1_agreement",
    "top5_overlap",
    "iou",
    "truth.top1",
    "truth.map50",
)
#: default margin of a task-metric regression (absolute, in the metric's unit: 0.01 = one percentage
#: point of top-1, recall or mAP); ``anpred history --margin``
DEFAULT_MARGIN = 0.01


def model_identity(report) -> tuple[str, str]:
    """``(name, sha256)`` of the judged model from the report's model description."""
    m = report.model or {}
    name = m.get("name") or Path(str(m.get("path") or m.get("source") or m.get("source_path") or "model")).name
    return str(name), str(m.get("sha256") or "")


def _origin(v):
    """The verdict whose origin a history row records: the budget/main verdict when it is flagged,
    else a flagged implementation verdict (reduced precision), else the main one."""
    impl = getattr(v, "implementation", None)
    return impl if (not v.flagged and impl is not None and impl.flagged) else v


def _status(v) -> str:
    """``flagged (implementation)`` when only the implementation verdict flagged the backend."""
    impl = getattr(v, "implementation", None)
    if not v.flagged and impl is not None and impl.flagged:
        return "flagged (implementation)"
    return getattr(v, "status", None)


def _num(v):
    return None if v is None or (isinstance(v, float) and v != v) else float(v) if isinstance(v, (int, float)) else None


def append(db: str | Path, report, report_html: str | Path | None = None) -> int:
    """Append one check report (a :class:`anpred.judge.CheckReport`) to ``db`` (created when missing);
    returns the new run id. One transaction: either all rows are written or none. ``report_html``:
    where its HTML report was written (absolute path stored; the dashboard links it), when known.

    Raises:
        AnpredError: ``db`` is not an anpred history database or cannot be written.
    """
    name, sha = model_identity(report)
    con = connect(db, create=True)
    try:
        with con:
            inputs = getattr(report, "inputs", {}) or {}
            cur = con.execute(
                "INSERT INTO runs (created, run_dir, model, model_sha256, machine, cpu, status, oracle, samples, "
                "inputs, inputs_sha256, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    report.created,
                    report.run_dir,
                    name,
                    sha,
                    json.dumps(report.machine),
                    report.machine.get("cpu", ""),
                    report.status,
                    report.oracle,
                    report.samples,
                    json.dumps(inputs.get("description", {})),
                    inputs.get("sha256"),
                    str(Path(report_html).absolute()) if report_html else None,
                ),
            )
            rid = cur.lastrowid
            for b, info in report.backends.items():
                v = report.verdicts.get(b)
                t = report.threshold.get(b)
                culprit = (getattr(v, "culprit", None) or {}) if v is not None else {}
                con.execute(
                    "INSERT INTO verdicts (run_id, backend, family, precision, versions, flagged, origin_anchor, "
                    "origin_stage, worst_anchor, worst_primary, propagation, threshold_passed, threshold_max_abs, "
                    "status, culprit, culprit_op) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        rid,
                        b,
                        info.get("family"),
                        info.get("precision"),
                        json.dumps(info.get("versions", {})),
                        None if v is None else int(v.any_flagged),
                        _origin(v).origin_anchor if v else None,
                        _origin(v).origin_stage if v else None,
                        v.worst_anchor if v else None,
                        _num(v.worst_primary) if v else None,
                        v.propagation if v else None,
                        None if t is None else int(t.passed),
                        _num(t.max_abs) if t else None,
                        _status(v) if v else ("unjudged" if b in report.unjudged_backends else None),
                        culprit.get("node"),
                        culprit.get("op_type"),
                    ),
                )
            task = getattr(report, "task", None) or {}
            tname = (task.get("task") or {}).get("task")
            rows = []
            for b, d in (task.get("backends") or {}).items():
                for k, val in (d.get("metrics") or {}).items():
                    if isinstance(val, (int, float)) and not isinstance(val, bool):
                        rows.append((rid, b, tname, k, _num(float(val))))
                for k, val in (d.get("truth") or {}).items():
                    if isinstance(val, (int, float)) and not isinstance(val, bool):
                        rows.append((rid, b, tname, f"truth.{k}", _num(float(val))))
            con.executemany("INSERT INTO tasks VALUES (?,?,?,?,?)", rows)
            stage = {a["name"]: a["stage"] for a in report.anchors}
            con.executemany(
                "INSERT INTO cells VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        rid,
                        c.backend,
                        c.anchor,
                        stage.get(c.anchor),
                        _num(c.primary),
                        int(c.flagged),
                        json.dumps(c.stats.to_dict()),
                    )
                    for c in report.cells
                ],
            )
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
    inputs_sha256: str | None = None
    inputs: dict[str, Any] | None = None
    verdict_status: str | None = None  # consistent | flagged | incomplete | unjudged | reference


def has_run(db: str | Path, run_dir: str) -> bool:
    """Whether the database holds a run of the run folder ``run_dir`` (False when the file does not
    exist): a campaign appends each configuration once, also when resumed."""
    if not Path(db).is_file():
        return False
    con = connect(db, create=False)
    try:
        return con.execute("SELECT 1 FROM runs WHERE run_dir = ? LIMIT 1", (str(run_dir),)).fetchone() is not None
    finally:
        con.close()


def trend(db: str | Path, model: str | None = None) -> list[TrendRow]:
    """All (run, backend) rows of ``db`` in time order, optionally for one model name.
    Raises AnpredError when ``db`` is missing or not a history database."""
    con = connect(db, create=False)
    try:
        cols = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
        extra = "r.inputs_sha256, r.inputs, v.status" if "inputs_sha256" in cols else "NULL, NULL, NULL"
        rows = _select(
            con,
            "SELECT r.id, r.created, r.model, v.backend, v.versions, v.flagged, v.origin_anchor, "
            f"v.worst_primary, v.threshold_passed, r.status, {extra} FROM runs r JOIN verdicts v "
            "ON v.run_id = r.id",
            model,
            "r.id, v.backend",
        )
    finally:
        con.close()
    return [
        TrendRow(
            r[0],
            r[1],
            r[2],
            r[3],
            json.loads(r[4] or "{}"),
            None if r[5] is None else bool(r[5]),
            r[6],
            r[7],
            None if r[8] is None else bool(r[8]),
            r[9],
            r[10],
            json.loads(r[11]) if r[11] else None,
            r[12],
        )
        for r in rows
    ]


def _select(con, query: str, model: str | None, order: str) -> list[tuple]:
    """``query`` (over ``runs r`` joined with another table), for one model name when given, ordered."""
    if model is not None:
        return con.execute(f"{query} WHERE r.model = ? ORDER BY {order}", (model,)).fetchall()
    return con.execute(f"{query} ORDER BY {order}").fetchall()


@dataclass
class TaskRow:
    """One task metric of one backend in one run."""

    run_id: int
    created: str
    model: str
    inputs_sha256: str | None
    backend: str
    task: str
    metric: str
    value: float | None


def task_trend(db: str | Path, model: str | None = None) -> list[TaskRow]:
    """Every task metric of ``db`` (run order). An older database without the ``tasks`` table has none.
    Raises AnpredError when ``db`` is missing or not a history database."""
    con = connect(db, create=False)
    try:
        if not con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='tasks'").fetchone():
            return []
        rows = _select(
            con,
            "SELECT r.id, r.created, r.model, r.inputs_sha256, t.backend, t.task, t.metric, t.value "
            "FROM runs r JOIN tasks t ON t.run_id = r.id",
            model,
            "r.id, t.backend, t.metric",
        )
    finally:
        con.close()
    return [TaskRow(*r) for r in rows]


def task_regressions(
    rows: list[TaskRow], since: int | None = None, margin: float = DEFAULT_MARGIN
) -> list[dict[str, Any]]:
    """Task metrics (:data:`HIGHER_IS_BETTER`) that dropped by more than ``margin`` (absolute).

    Each model's latest run is compared with run ``since`` (a run id) when given, else with the
    previous run of that model on the same inputs (``inputs_sha256``). Returns one dict per drop:
    ``{"model", "backend", "metric", "before", "after", "drop", "run", "against"}``.

    Raises:
        AnpredError: ``since`` names no run of the model(s) in ``rows``.
    """
    by_run: dict[int, list[TaskRow]] = {}
    for r in rows:
        by_run.setdefault(r.run_id, []).append(r)
    models: dict[str, list[int]] = {}
    for rid, rs in by_run.items():
        models.setdefault(rs[0].model, []).append(rid)
    out = []
    for model, rids in models.items():
        last = max(rids)
        if since is not None:
            if since not in by_run or by_run[since][0].model != model:
                if len(models) == 1:
                    raise AnpredError(f"run {since} has no task metrics of model {model!r} in this history")
                continue
            ref = since
            if by_run[ref][0].inputs_sha256 != by_run[last][0].inputs_sha256:
                import sys

                print(
                    f"history: run {last} and run {ref} of {model} ran on different inputs: their task "
                    "metrics are compared anyway",
                    file=sys.stderr,
                )
        else:
            same = [r for r in rids if r < last and by_run[r][0].inputs_sha256 == by_run[last][0].inputs_sha256]
            if not same:
                continue
            ref = max(same)
        before = {(r.backend, r.metric): r.value for r in by_run[ref]}
        for r in by_run[last]:
            if r.metric not in HIGHER_IS_BETTER or r.value is None:
                continue
            b = before.get((r.backend, r.metric))
            if b is not None and b - r.value > margin:
                out.append(
                    {
                        "model": model,
                        "backend": r.backend,
                        "metric": r.metric,
                        "before": b,
                        "after": r.value,
                        "drop": b - r.value,
                        "run": last,
                        "against": ref,
                    }
                )
    return out


def format_task_trend(rows: list[TaskRow]) -> str:
    """One line per (model, backend, metric): its value in each run, oldest first."""
    if not rows:
        return "(no task metrics)"
    groups: dict[tuple[str, str, str], list[TaskRow]] = {}
    for r in rows:
        groups.setdefault((r.model, r.backend, r.metric), []).append(r)
    wb = max([16] + [len(b) + 1 for _, b, _ in groups])  # backend names in full (executorch-xnnpack-int8)
    out = [f"{'model':<22}{'backend':<{wb}}{'metric':<22}values by run (run id: value)"]
    for (m, b, k), rs in groups.items():
        vals = "  ".join(f"{r.run_id}: {'-' if r.value is None else f'{r.value:.4g}'}" for r in rs)
        out.append(f"{m[:21]:<22}{b:<{wb}}{k[:21]:<22}{vals}")
    return "\n".join(out)


def format_trend(rows: list[TrendRow]) -> str:
    """A table per (model, backend): one line per run with the inputs' identity (first 8 hex digits of
    ``inputs_sha256``), verdict, worst statistic, its change against the previous run on the same
    inputs (``inputs!=`` when the inputs changed), origin and versions."""
    if not rows:
        return "(no entries)"
    wb = max([16] + [len(r.backend) + 1 for r in rows])
    out = [
        f"{'model':<22}{'backend':<{wb}}{'run':>5}  {'created':<26}{'inputs':<9}{'verdict':<9}{'worst':>11}"
        f"{'change':>10}  {'origin':<30}versions"
    ]
    groups: dict[tuple[str, str], list[TrendRow]] = {}
    for r in rows:
        groups.setdefault((r.model, r.backend), []).append(r)
    for (m, b), rs in groups.items():
        prev: TrendRow | None = None
        for r in rs:
            verdict = "-" if r.flagged is None else ("FLAGGED" if r.flagged else "ok")
            if not r.flagged and r.verdict_status in ("incomplete", "unjudged"):
                verdict = r.verdict_status.upper()[:8]
            w = "-" if r.worst_primary is None else f"{r.worst_primary:.3e}"
            if prev is None or prev.worst_primary in (None, 0) or r.worst_primary is None:
                ch = ""
            elif prev.inputs_sha256 != r.inputs_sha256:
                ch = "inputs!="
            else:
                ch = f"x{r.worst_primary / prev.worst_primary:.2f}"
            vers = ",".join(f"{k}={v}" for k, v in r.versions.items() if k != "python")
            ins = (r.inputs_sha256 or "?")[:8]
            out.append(
                f"{m[:21]:<22}{b:<{wb}}{r.run_id:>5}  {r.created:<26}{ins:<9}{verdict:<9}{w:>11}{ch:>10}  "
                f"{(r.origin_anchor or '-')[:29]:<30}{vers}"
            )
            prev = r
    return "\n".join(out)


def plot_trend(rows: list[TrendRow], path: str | Path, task_rows: list[TaskRow] | None = None) -> None:
    """Plot the worst primary statistic per (model, backend) over runs (log scale; crosses: flagged)
    and, given ``task_rows``, each higher-is-better task metric per (model, backend) in a second panel,
    to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from anpred.onnx_io import atomic_write_bytes
    import io

    tasks = [r for r in (task_rows or []) if r.metric in HIGHER_IS_BETTER and r.value is not None]
    fig, axes = plt.subplots(2 if tasks else 1, 1, figsize=(8, 7 if tasks else 4), squeeze=False)
    ax = axes[0][0]
    if tasks:
        tg: dict[tuple[str, str, str], list[TaskRow]] = {}
        for r in tasks:
            tg.setdefault((r.model, r.backend, r.metric), []).append(r)
        t_ax = axes[1][0]
        for (m, b, k), rs in tg.items():
            t_ax.plot([r.run_id for r in rs], [r.value for r in rs], marker="o", label=f"{m}/{b} {k}")
        t_ax.set_xlabel("run id")
        t_ax.set_ylabel("task metric")
        t_ax.legend(fontsize=6)
    groups: dict[tuple[str, str], list[TrendRow]] = {}
    for r in rows:
        if r.worst_primary is not None:
            groups.setdefault((r.model, r.backend), []).append(r)
    for (m, b), rs in groups.items():
        (line,) = ax.plot(
            [r.run_id for r in rs], [max(r.worst_primary, 1e-16) for r in rs], marker="o", label=f"{m}/{b}"
        )
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
