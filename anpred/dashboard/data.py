"""What the dashboard shows, read from one or more history databases (:mod:`anpred.report.history`).

:func:`collect` reads every run, verdict, task metric, campaign configuration and bisection and
returns :class:`Series` per (model, configuration, backend), where a configuration is the backend
set (the backends of the run: the consensus each verdict is judged against) and the input set
(:func:`_group`): the runs of that backend on that model in that configuration in time order
(a campaign's runs at the time of its first run, in the campaign's order of configurations: the
runtime versions of a version axis in the order the campaign lists them), each a :class:`Point`.

The regression rule (docs/dashboard.md) compares each point with the previous point of its series
on the same inputs (``inputs_sha256``), as ``anpred history`` does:

- a **verdict change**: the standing (``ok``, ``FLAGGED``, ``INCOMPLETE``, ``NOT JUDGED``) differs;
  a regression when the new one is worse (ok < incomplete / not judged < flagged), a fix when better;
- a **task-metric drop**: a higher-is-better metric (:data:`anpred.report.history.HIGHER_IS_BETTER`) fell by
  more than ``margin`` (absolute; default :data:`anpred.report.history.DEFAULT_MARGIN`, the same rule and
  default as ``anpred history --margin``).

The trend statistic is the nRMSE against the consensus at the series' *origin anchor*: the origin
anchor of its latest flagged point, else the anchor where its latest point deviated most (the
``worst_anchor``), read for every point from the ``cells`` table (unitless; None where that point
did not judge the anchor).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.report.history import DEFAULT_MARGIN, HIGHER_IS_BETTER, columns, open_history

__all__ = ["Point", "Series", "History", "collect", "package_names", "STANDINGS", "SEVERITY"]

#: verdict words of a point (the cell's colour), and their severity for the regression rule
STANDINGS = ("ok", "FLAGGED", "INCOMPLETE", "NOT JUDGED")
SEVERITY = {"ok": 0, "INCOMPLETE": 1, "NOT JUDGED": 1, "FLAGGED": 2}


@dataclass
class Point:
    """One run of one backend on one model.

    run: index into :attr:`History.runs`; standing: one of :data:`STANDINGS`; nrmse: at the series'
    anchor (unitless, None: not judged there); worst: the largest nRMSE of the run (any anchor);
    versions: the backend's package versions (:func:`_versions`: run facts left out);
    task: higher-is-better task metrics (``metric -> value``); culprit: ``(node, op_type)`` the
    drill-down named, or None.
    """

    run: int
    standing: str
    origin_anchor: str | None
    origin_stage: int | None
    worst_anchor: str | None
    worst: float | None
    versions: dict[str, str]
    precision: str | None
    task: dict[str, float] = field(default_factory=dict)
    culprit: tuple[str, str] | None = None
    nrmse: float | None = None


@dataclass
class Series:
    """The points of one (model, configuration, backend), oldest first (:func:`_group`), with their
    regressions (``{"point", "kind": regression | fix | change, "what": verdict | task, "text", ...}``).
    config: the configuration's label (backend set, input set); row: the grid's row label (the model,
    with the configuration where the model has several); sets: the campaigns' names of its backend set."""

    model: str
    backend: str
    family: str | None
    precision: str | None
    config: str = ""
    row: str = ""
    sets: tuple[str, ...] = ()
    points: list[Point] = field(default_factory=list)
    anchor: str | None = None
    metric: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    bisections: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class History:
    """Everything :func:`collect` read. ``runs``: per run ``{"db", "id", "created", "model",
    "inputs", "report" (absolute path or None), "campaign" (name or None), "label", "config"}``."""

    runs: list[dict[str, Any]]
    series: list[Series]
    campaigns: list[dict[str, Any]]
    bisections: list[dict[str, Any]]
    margin: float
    databases: list[str]


def _fnum(x) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def _standing(flagged, status) -> str:
    if flagged:
        return "FLAGGED"
    if status == "incomplete":
        return "INCOMPLETE"
    if flagged is None or status in ("unjudged", "failed"):
        return "NOT JUDGED"
    return "ok"


@functools.lru_cache(maxsize=1)
def package_names() -> frozenset[str]:
    """The names (canonical, PEP 503: :func:`packaging.utils.canonicalize_name`) that a backend's
    ``versions`` record may use for a package: the import names the backends declare
    (:data:`anpred.backends.FAMILY_PACKAGES`, :data:`~anpred.backends.BACKEND_PACKAGES`), their
    distributions, and every distribution :mod:`importlib.metadata` knows here."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    from anpred.backends import BACKEND_PACKAGES, FAMILY_PACKAGES

    declared = {p for ps in (*FAMILY_PACKAGES.values(), *BACKEND_PACKAGES.values()) for p in ps}
    dists = metadata.packages_distributions()  # import name -> distributions
    names = declared | {d for p in declared for d in dists.get(p, ())}
    names |= {d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"]}
    return frozenset(canonicalize_name(n) for n in names)


@functools.lru_cache(maxsize=2**16)  # distinct texts: per backend, version set and model (its run facts)
def _versions(text: str | None) -> dict[str, str]:
    """A verdict row's library versions: only the packages' (:func:`package_names`; ``python``, the
    ``<package> from`` folders and the run facts a backend records beside its versions, such as
    ``openvino_runtime_precisions``, ``ort_optimized_ops`` or ``fp16_model_sha256``, left out: they
    are not versions, and they change with the model, not with a release). Parsed once per distinct
    text (a history repeats few version sets many times): the dict is shared, read only."""
    from packaging.utils import canonicalize_name

    try:
        d = json.loads(text or "{}")
    except ValueError:
        return {}
    known = package_names()
    if not isinstance(d, dict):
        return {}
    return {k: str(v) for k, v in d.items() if k != "python" and canonicalize_name(k) in known}


def _report_path(report: str | None, run_dir: str | None) -> str | None:
    """The run's HTML report when it exists: the recorded path, else ``report.html`` beside the run
    folder (``anpred test``'s layout: ``OUT/run`` and ``OUT/report.html``) or inside it."""
    cands = [report] if report else []
    if run_dir:
        cands += [str(Path(run_dir).parent / "report.html"), str(Path(run_dir) / "report.html")]
    return next((c for c in cands if c and os.path.isfile(c)), None)


def _table(con: sqlite3.Connection, name: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None


def _read_campaigns(con, db: str, campaign: str | None, folder: str | None) -> tuple[list[dict], dict[int, dict]]:
    """The campaigns of ``db`` (only ``campaign`` when given, written to ``folder`` when given) and,
    per run id, its configuration."""
    if not _table(con, "campaigns"):
        return [], {}
    out, by_run = [], {}
    for cid, name, camp_folder, file, axes, n, ok, failed in con.execute(
        "SELECT id, name, folder, file, axes, configurations, complete, failed FROM campaigns ORDER BY id"
    ):
        if (campaign is not None and name != campaign) or (folder is not None and folder != camp_folder):
            continue
        rows = con.execute(
            "SELECT config_id, position, label, backend_set, inputs, versions, state, reason, report, "
            "run_id FROM campaign_runs WHERE campaign_id = ? ORDER BY position",
            (cid,),
        ).fetchall()
        configs = []
        for cfg, pos, label, bset, inputs, vers, state, reason, report, run in rows:
            c = {
                "id": cfg,
                "position": pos,
                "label": label,
                "backend_set": bset,
                "inputs": inputs,
                "versions": json.loads(vers or "{}"),
                "state": state,
                "reason": reason or "",
                "report": report if report and os.path.isfile(report) else None,
                "run": run,
            }
            configs.append(c)
            if run is not None:
                by_run[run] = {"campaign": name, "campaign_key": (name, camp_folder), **c}
        out.append(
            {
                "db": db,
                "name": name,
                "folder": camp_folder,
                "file": file,
                "axes": json.loads(axes or "[]"),
                "configurations": n,
                "complete": ok,
                "failed": failed,
                "configs": configs,
            }
        )
    return out, by_run


def _campaign_names(db: str) -> list[str]:
    """The names of the campaigns recorded in ``db`` (none before schema 3)."""
    con = open_history(db)
    try:
        return [n for (n,) in con.execute("SELECT DISTINCT name FROM campaigns")] if _table(con, "campaigns") else []
    finally:
        con.close()


def _read_bisections(con, db: str) -> list[dict[str, Any]]:
    if not _table(con, "bisections"):
        return []
    keys = (
        "created",
        "campaign",
        "folder",
        "package",
        "model",
        "backend",
        "good",
        "bad",
        "first_bad",
        "last_good",
        "standing_good",
        "standing_first_bad",
        "origin_stage",
        "origin_anchor",
        "culprit",
        "culprit_op",
        "report",
    )
    rows = con.execute(f"SELECT {', '.join(keys)} FROM bisections ORDER BY id").fetchall()
    return [{"db": db, **dict(zip(keys, r))} for r in rows]


def _read_db(
    db: str, campaign: tuple[str | None, str | None], runs: list[dict], raw: list[tuple]
) -> tuple[list[dict], list[dict]]:
    """Append ``db``'s runs to ``runs`` and its points to ``raw`` (``(backend, family, precision,
    Point)``, grouped into series by :func:`_group`); returns its campaigns and bisections. Only the
    runs of the campaign ``(name, folder)`` when a name is given."""
    con = open_history(db)
    try:
        camps, by_run = _read_campaigns(con, db, *campaign)
        rcols, vcols = columns(con, "runs"), columns(con, "verdicts")
        opt = lambda cols, c: c if c in cols else "NULL"  # noqa: E731 - a column an older schema lacks
        index: dict[int, int] = {}
        for rid, created, run_dir, model, ins, report in con.execute(
            f"SELECT id, created, run_dir, model, {opt(rcols, 'inputs_sha256')}, {opt(rcols, 'report')} "
            "FROM runs ORDER BY id"
        ):
            if campaign[0] is not None and rid not in by_run:
                continue
            cfg = by_run.get(rid) or {}
            index[rid] = len(runs)
            if campaign[0] is not None and cfg.get("label"):  # a campaign's view: its models by their labels
                model = cfg["label"]
            runs.append(
                {
                    "db": db,
                    "id": rid,
                    "created": created or "",
                    "model": model,
                    "inputs": ins,
                    "report": _report_path(report or cfg.get("report"), run_dir),
                    "campaign": cfg.get("campaign"),
                    "label": cfg.get("label"),
                    "config": cfg.get("id"),
                    "position": cfg.get("position", 0),
                    "campaign_key": cfg.get("campaign_key"),
                    "backend_set": cfg.get("backend_set"),
                    "inputs_name": cfg.get("inputs"),
                    "backends": (),
                }
            )
        task: dict[tuple[int, str], dict[str, float]] = {}
        if _table(con, "tasks"):
            for rid, b, metric, value in con.execute("SELECT run_id, backend, metric, value FROM tasks"):
                if rid in index and metric in HIGHER_IS_BETTER and _fnum(value) is not None:
                    task.setdefault((rid, b), {})[metric] = float(value)
        q = (
            "SELECT run_id, backend, family, precision, versions, flagged, origin_anchor, origin_stage, worst_anchor, "
            f"worst_primary, {opt(vcols, 'status')}, {opt(vcols, 'culprit')}, {opt(vcols, 'culprit_op')} "
            "FROM verdicts ORDER BY run_id"
        )
        for rid, b, fam, prec, vers, fl, oa, os_, wa, wp, st, cul, cop in con.execute(q):
            if rid not in index:
                continue
            i = index[rid]
            runs[i]["backends"] += (b,)
            raw.append(
                (
                    b,
                    fam,
                    prec,
                    Point(
                        i,
                        _standing(fl, st),
                        oa,
                        os_,
                        wa,
                        _fnum(wp),
                        _versions(vers),
                        prec,
                        task.get((rid, b), {}),
                        (cul, cop or "") if cul else None,
                    ),
                )
            )
        return camps, _read_bisections(con, db)
    finally:
        con.close()


def _group(runs: list[dict], raw: list[tuple]) -> dict[tuple, Series]:
    """The series (module docstring): one per (model, configuration, backend), where a run's
    configuration is its backend set (the backends that ran: they form the consensus every verdict is
    judged against) and its input set (a campaign's ``inputs`` name; a run without one, such as a
    bisection's drill-down run, takes the name of the configuration judged on the same
    ``inputs_sha256``). The row label names the configuration (a campaign's backend set name, else
    the backends joined by ``+``; the input set where the model has several) only where the model
    has several configurations."""
    for r in runs:
        r["backends"] = tuple(sorted(set(r["backends"])))
    named: dict[tuple, str] = {}  # (model, backends, inputs_sha256) -> the input set's name
    for r in runs:
        if r["inputs_name"]:
            named.setdefault((r["model"], r["backends"], r["inputs"]), r["inputs_name"])
    sets: dict[tuple, set[str]] = {}  # (model, backends, input set) -> the campaign's names of the set
    for r in runs:
        r["inputs_name"] = r["inputs_name"] or named.get((r["model"], r["backends"], r["inputs"]))
        names = sets.setdefault((r["model"], r["backends"], r["inputs_name"]), set())
        if r["backend_set"]:
            names.add(r["backend_set"])
    labels: dict[tuple, str] = {}
    for (model, bset, ins), names in sets.items():
        labels[(model, bset, ins)] = "/".join(sorted(names)) or "+".join(bset)
    for key, lab in list(labels.items()):  # the same name for two backend sets (a set edited between campaigns)
        if sum(1 for k, x in labels.items() if k[0] == key[0] and k[2] == key[2] and x == lab) > 1:
            labels[key] = f"{lab} ({'+'.join(key[1])})"
    for (model, bset, ins), lab in list(labels.items()):
        if len({k[2] for k in labels if k[0] == model}) > 1:
            labels[(model, bset, ins)] = f"{lab} · inputs {ins or '-'}"
    several = {m for m in {k[0] for k in labels} if sum(1 for k in labels if k[0] == m) > 1}
    groups: dict[tuple, Series] = {}
    for b, fam, prec, p in raw:
        r = runs[p.run]
        ckey = (r["model"], r["backends"], r["inputs_name"])
        s = groups.get((*ckey, b))
        if s is None:
            conf = labels[ckey]
            row = f"{r['model']} · {conf}" if r["model"] in several else r["model"]
            s = groups[(*ckey, b)] = Series(
                r["model"], b, fam, prec, config=conf, row=row, sets=tuple(sorted(sets[ckey]))
            )
        s.points.append(p)
    return groups


def _choose_anchors(series: list[Series]) -> None:
    """Each series' anchor: the origin anchor of its latest flagged point, else its latest point's
    worst anchor (module docstring)."""
    for s in series:
        flagged = [p for p in s.points if p.standing == "FLAGGED" and p.origin_anchor]
        s.anchor = flagged[-1].origin_anchor if flagged else (s.points[-1].worst_anchor if s.points else None)


def _anchor_values(db: str, runs: list[dict], series: list[Series]) -> None:
    """Every point's nRMSE at its series' anchor, for the points of ``db``: one join in SQLite through
    a temporary table (fast at millions of cells)."""
    want, at = [], {}
    for s in series:
        if s.anchor is None:
            continue
        for p in s.points:
            r = runs[p.run]
            if r["db"] == db:
                want.append((r["id"], s.backend, s.anchor))
                at[(r["id"], s.backend)] = p
    if not want:
        return
    con = open_history(db)
    try:
        con.execute("CREATE TEMP TABLE pick (run_id INTEGER, backend TEXT, anchor TEXT)")
        con.executemany("INSERT INTO pick VALUES (?,?,?)", want)
        # indexed here, so SQLite scans ``cells`` once and probes this (not the other way round)
        con.execute("CREATE INDEX temp.pick_key ON pick (run_id, backend, anchor)")
        for rid, b, v in con.execute(
            "SELECT p.run_id, p.backend, c.primary_stat FROM pick p JOIN cells c ON "
            "c.run_id = p.run_id AND c.backend = p.backend AND c.anchor = p.anchor"
        ):
            at[(rid, b)].nrmse = _fnum(v)
    finally:
        con.close()


def _order(runs: list[dict], groups: dict) -> None:
    """Points in time order: a campaign's runs at the time of its first run, in its order (each
    run's place: ``runs[i]["rank"]``)."""
    first: dict[tuple, str] = {}
    for r in runs:
        if r["campaign_key"] is not None:
            k = (r["db"], r["campaign_key"])
            first[k] = min(first.get(k, r["created"]), r["created"])

    def key(i: int):
        r = runs[i]
        if r["campaign_key"] is None:
            return (r["created"], 0, r["db"], r["id"])
        return (first[(r["db"], r["campaign_key"])], 1 + (r["position"] or 0), r["db"], r["id"])

    order = sorted(range(len(runs)), key=key)
    rank = {i: k for k, i in enumerate(order)}
    for i, k in rank.items():
        runs[i]["rank"] = k
    for s in groups.values():
        s.points.sort(key=lambda p: rank[p.run])


def _events(s: Series, runs: list[dict], margin: float) -> None:
    """The regression rule (module docstring) over ``s.points``."""
    last_on: dict[Any, int] = {}
    for k, p in enumerate(s.points):
        ins = runs[p.run]["inputs"]
        j = last_on.get(ins)
        last_on[ins] = k
        if j is None:
            continue
        q = s.points[j]
        if q.standing != p.standing:
            d = SEVERITY[p.standing] - SEVERITY[q.standing]
            kind = "regression" if d > 0 else "fix" if d < 0 else "change"
            where = f" at stage {p.origin_stage}" if p.standing == "FLAGGED" and p.origin_stage is not None else ""
            s.events.append(
                {
                    "point": k,
                    "against": j,
                    "kind": kind,
                    "what": "verdict",
                    "text": f"{q.standing} -> {p.standing}{where}",
                }
            )
        for m, v in p.task.items():
            b = q.task.get(m)
            if b is not None and b - v > margin:
                s.events.append(
                    {
                        "point": k,
                        "against": j,
                        "kind": "regression",
                        "what": "task",
                        "text": f"{m} {b:.4g} -> {v:.4g} (-{b - v:.4g} > margin {margin:g})",
                    }
                )


def _bisected_set(b: dict[str, Any], by_id: dict[tuple, dict], campaigns: list[dict]) -> str | None:
    """The backend set a bisection probed: the first configuration (in its campaign's order) of its
    model label whose run holds its backend (:func:`anpred.campaign.bisect.bisect_versions`' base);
    None when its campaign is not in the history read."""
    for c in campaigns:
        if c["name"] != b.get("campaign"):
            continue
        for cfg in sorted(c["configs"], key=lambda x: x["position"] or 0):
            r = by_id.get((c["db"], cfg["run"]))
            if cfg["label"] == b["model"] and r is not None and b["backend"] in r["backends"]:
                return cfg["backend_set"]
    return None


def _attach_bisections(series: list[Series], runs: list[dict], bisections: list[dict], campaigns: list[dict]) -> None:
    """A bisection names a campaign's model label: tied to the series of the models its runs carry
    that label (the label itself when no run does), in the backend set it probed (:func:`_bisected_set`;
    every set when that is unknown)."""
    models: dict[str, set[str]] = {}
    for r in runs:
        if r["label"]:
            models.setdefault(r["label"], set()).add(r["model"])
    by_id = {(r["db"], r["id"]): r for r in runs}
    for b in bisections:
        if not b.get("first_bad"):
            continue
        names = models.get(b["model"], {b["model"]})
        bset = _bisected_set(b, by_id, campaigns)
        for s in series:
            if s.model in names and s.backend == b["backend"] and (bset is None or not s.sets or bset in s.sets):
                s.bisections.append(b)


def collect(
    dbs: list[str | Path],
    *,
    margin: float = DEFAULT_MARGIN,
    campaign: str | None = None,
    campaign_folder: str | Path | None = None,
) -> History:
    """Read the history databases ``dbs`` (module docstring). ``campaign``: only that campaign's runs,
    its models named by their labels in the campaign (``campaign_folder``: only the campaign written
    to that output folder).

    Raises:
        AnpredError: a database is missing or not an anpred history database; ``margin`` < 0; no
            campaign ``campaign`` in the databases (the message names those there).
    """
    from anpred.errors import AnpredError

    if margin < 0 or not math.isfinite(margin):
        raise AnpredError(f"--margin must be a finite number >= 0 (got {margin:g})")
    runs: list[dict] = []
    raw: list[tuple] = []
    camps, bis = [], []
    for db in dbs:
        folder = str(Path(campaign_folder).absolute()) if campaign_folder is not None else None
        c, b = _read_db(str(db), (campaign, folder), runs, raw)
        camps += c
        bis += b
    if campaign is not None and not camps:
        names = sorted({n for db in dbs for n in _campaign_names(str(db))})
        raise AnpredError(
            f"no campaign {campaign!r} in {', '.join(str(d) for d in dbs)}; "
            + (f"campaigns there: {', '.join(names)}" if names else "it records no campaign")
        )
    groups = _group(runs, raw)
    _order(runs, groups)
    series = sorted(groups.values(), key=lambda s: (s.row, s.backend))
    _choose_anchors(series)
    for db in dict.fromkeys(str(d) for d in dbs):
        _anchor_values(db, runs, series)
    for s in series:
        _events(s, runs, margin)
        have = {m for p in s.points for m in p.task}
        metrics = [m for m in HIGHER_IS_BETTER if m in have]
        truth = [m for m in metrics if m.startswith("truth.")]
        s.metric = (truth or metrics or [None])[0]
    _attach_bisections(series, runs, bis, camps)
    return History(runs, series, camps, bis, margin, [str(d) for d in dbs])
