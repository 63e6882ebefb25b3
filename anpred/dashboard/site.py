"""The dashboard site: one self-contained ``index.html`` (its style, script and data inline; nothing
fetched from the network) over :class:`anpred.dashboard.data.History`.

The data travel as JSON in a ``<script type="application/json">`` block, compact per cell (docs/dashboard.md
"Size"): the run indices of its points, the nRMSE as ``round(100 * log10(nRMSE))`` (1 % resolution:
the sparkline's), the task metric times 10^4, the standings as one character each, the version set
of each point as an index into a table of version strings. The page's script (``static/app.js``,
vanilla JavaScript) draws the grid, the sparklines, the filters and the list of changes.

Links to reports are relative to the site folder (``os.path.relpath``), so a site written beside
its reports (a campaign's ``OUT/index.html``) keeps working when the folder is moved or served.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anpred.dashboard.data import STANDINGS, History, Series

__all__ = ["SiteOptions", "payload", "read_data", "render", "write_site", "STATIC"]

STATIC = Path(__file__).resolve().parent / "static"
_CODE = {s: str(i) for i, s in enumerate(STANDINGS)}


@dataclass
class SiteOptions:
    """title: the page's heading; campaign: the campaign view's extra section (``{"name", "configs":
    [{"name", "state", "reason", "report"}], "changes": [...], "counts": str}``; None: the plain
    dashboard); generated: the time stamp shown (default: now)."""

    title: str = "ANPRED dashboard"
    campaign: dict[str, Any] | None = None
    generated: str | None = None


def _rel(path: str | None, site: Path) -> str | None:
    """``path`` as a URL relative to the folder ``site`` (percent-encoded: a ``#`` or a space in a
    folder name stays part of the path)."""
    from urllib.parse import quote

    if not path:
        return None
    try:
        return quote(Path(os.path.relpath(path, site)).as_posix())
    except ValueError:  # another drive (Windows): the absolute file URI
        return Path(path).absolute().as_uri()


def _vkey(versions: dict[str, str]) -> str:
    return " · ".join(f"{k} {v}" for k, v in sorted(versions.items()))


def _log100(x: float | None) -> int | None:
    if x is None:
        return None
    return int(round(100 * math.log10(max(x, 1e-30)))) if math.isfinite(x) else None


def _rle(values: list) -> list[list]:
    """``[[index, value], ...]`` where ``values`` changes (run-length: versions, origin stages and
    culprits repeat over consecutive runs)."""
    out: list[list] = []
    for i, v in enumerate(values):
        if not out or out[-1][1] != v:
            out.append([i, v])
    return out


def _cell(s: Series, mi: int, bi: int, vers: dict[str, int]) -> dict[str, Any]:
    """One cell's compact record (docs/dashboard.md "Size"; its runs ``r`` are added by
    :func:`payload`): ``vr``, ``or``, ``cr`` run-length coded; ``w`` (the largest nRMSE anywhere)
    only where the anchor's is missing, else its latest value ``wl``."""
    pts = s.points
    d: dict[str, Any] = {"m": mi, "b": bi, "a": s.anchor, "p": pts[-1].precision or ""}
    d["e"] = [_log100(p.nrmse) for p in pts]
    if all(x is None for x in d["e"]):
        d["w"] = [_log100(p.worst) for p in pts]
    d["wl"] = _log100(pts[-1].worst)
    d["s"] = "".join(_CODE[p.standing] for p in pts)
    d["vr"] = _rle([vers.setdefault(_vkey(p.versions), len(vers)) for p in pts])
    orig = [-1 if p.origin_stage is None or p.standing != "FLAGGED" else p.origin_stage for p in pts]
    if any(x >= 0 for x in orig):
        d["or"] = _rle(orig)
    cul = [f"{p.culprit[0]} ({p.culprit[1]})" if p.culprit else None for p in pts]
    if any(cul):
        d["cr"] = _rle(cul)
    if s.metric is not None:
        d["k"] = s.metric
        d["t"] = [None if s.metric not in p.task else int(round(1e4 * p.task[s.metric])) for p in pts]
    ev = []
    for e in s.events:
        p, q = pts[e["point"]], pts[e["against"]]
        item = {"p": e["point"], "q": e["against"], "k": e["kind"], "x": e["what"], "t": e["text"]}
        if p.culprit and e["what"] == "verdict" and p.standing == "FLAGGED":
            item["cu"] = f"{p.culprit[0]} ({p.culprit[1]})"
        fb = _first_bad(s, q.versions, p.versions)
        if fb:
            item["fb"] = fb["text"]
            if "cu" not in item and fb.get("culprit"):
                item["cu"] = fb["culprit"]
        ev.append(item)
    if ev:
        d["x"] = ev
    if s.bisections:
        d["bi"] = [_bisection_text(b) for b in s.bisections]
    return d


def _bisection_text(b: dict[str, Any]) -> dict[str, Any]:
    cul = f"{b['culprit']} ({b['culprit_op']})" if b.get("culprit") else None
    where = f", stage {b['origin_stage']}" if b.get("origin_stage") is not None else ""
    return {
        "text": f"{b['package']} {b['first_bad']} (bisected; last as before: {b['last_good']}{where})",
        "package": b["package"],
        "first_bad": b["first_bad"],
        "last_good": b["last_good"],
        "culprit": cul,
    }


def _first_bad(s: Series, before: dict[str, str], after: dict[str, str]) -> dict[str, Any] | None:
    """The bisection of ``s`` whose package changed version between two points (before -> after)."""
    for b in s.bisections:
        pkg = b["package"]
        if pkg in before and pkg in after and before[pkg] != after[pkg]:
            return _bisection_text(b)
    return None


def payload(hist: History, site: Path, opts: SiteOptions) -> dict[str, Any]:
    """The page's data (module docstring). ``site``: the folder the links are relative to. Runs are
    numbered in time order; ``models``: the grid's rows (a model, with its configuration where it has
    several: :attr:`Series.row`); ``mr``: per row the runs of its cells (most cells share them)."""
    models = sorted({s.row or s.model for s in hist.series})  # the grid's rows: model, configuration
    backends = sorted({(s.backend, s.family or "") for s in hist.series})
    bnames = [b[0] for b in backends]
    precs: dict[str, set[str]] = {}
    for s in hist.series:
        precs.setdefault(s.backend, set()).update(p.precision or "" for p in s.points)
    used = sorted({p.run for s in hist.series for p in s.points}, key=lambda i: hist.runs[i]["rank"])
    num = {i: k for k, i in enumerate(used)}
    by_model: dict[str, list[int]] = {}
    for s in hist.series:
        row = s.row or s.model
        by_model[row] = sorted(set(by_model.get(row, [])) | {num[p.run] for p in s.points})
    vers: dict[str, int] = {}
    cells = []
    for s in hist.series:
        c = _cell(s, models.index(s.row or s.model), bnames.index(s.backend), vers)
        own = [num[p.run] for p in s.points]
        if own != by_model[s.row or s.model]:
            c["r"] = own
        cells.append(c)
    runs = []
    for i in used:
        r = hist.runs[i]
        runs.append(
            [
                r["created"][:19],
                _rel(r["report"], site),
                (r["inputs"] or "")[:8] or None,
                r["campaign"],
                r["label"],
                r["id"],
            ]
        )
    camp = None
    if opts.campaign is not None:
        camp = dict(opts.campaign)
        camp["configs"] = [{**c, "report": _rel(c.get("report"), site)} for c in camp.get("configs", [])]
    return {
        "schema": "anpred.dashboard/1",
        "title": opts.title,
        "generated": opts.generated or time.strftime("%Y-%m-%dT%H:%M:%S"),
        "margin": hist.margin,
        "databases": [_rel(d, site) for d in hist.databases],
        "models": models,
        "nmodels": len({s.model for s in hist.series}),
        "backends": [[b, fam, "/".join(sorted(precs[b])) or ""] for b, fam in backends],
        "runs": runs,
        "mr": [by_model[m] for m in models],
        "vers": list(vers),
        "cells": cells,
        "campaign": camp,
    }


def render(data: dict[str, Any]) -> str:
    """The HTML page holding ``data`` (the style and the script inlined from :data:`STATIC`)."""
    css = (STATIC / "style.css").read_text()
    js = (STATIC / "app.js").read_text()
    # "</" inside the JSON would end the script element early
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    title = html.escape(data.get("title") or "ANPRED dashboard")
    return (
        f"<!doctype html>\n<html lang=en><head><meta charset=utf-8>\n"
        f"<meta name=viewport content='width=device-width, initial-scale=1'>\n<title>{title}</title>\n"
        "<script>window.__anpredErrors=[];addEventListener('error',function(e){__anpredErrors.push(String("
        "e.message||e))});</script>\n"
        f"<style>\n{css}</style>\n</head>\n<body>\n<header><h1>{title}</h1><div id=summary></div></header>\n"
        "<noscript>This page draws its grid with JavaScript; without it, summary.txt / campaign.json (a campaign) "
        "or <code>anpred history DB</code> show the same.</noscript>\n"
        "<section id=campaign hidden></section>\n<section id=filters></section>\n"
        "<section id=gridwrap><table id=grid></table></section>\n<section id=detail hidden></section>\n"
        "<section id=changes></section>\n"
        f"<script type='application/json' id=anpred-data>{blob}</script>\n<script>\n{js}</script>\n"
        "</body></html>\n"
    )


def read_data(page: str | Path) -> dict[str, Any]:
    """The data block of a page :func:`render` wrote (:func:`payload`'s dict).

    Raises:
        AnpredError: ``page`` cannot be read or holds no dashboard data.
    """
    import re

    from anpred.errors import AnpredError

    try:
        text = Path(page).read_text(encoding="utf-8")
    except OSError as err:
        raise AnpredError(f"cannot read {page}: {err}") from err
    m = re.search(r"<script type='application/json' id=anpred-data>(.*?)</script>", text, re.DOTALL)
    try:
        return json.loads(m.group(1).replace("<\\/", "</")) if m else {}
    except ValueError as err:
        raise AnpredError(f"{page}: its dashboard data are not JSON: {err}") from err


def write_site(hist: History, out: str | Path, opts: SiteOptions | None = None) -> Path:
    """Write ``out/index.html`` (``out`` created) over ``hist``; returns its path.

    Raises:
        OutputPathError: ``out`` exists and is not a folder, or cannot be written.
    """
    from anpred.errors import OutputPathError
    from anpred.onnx_io import atomic_write_text

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create {out}: {err}") from err
    page = render(payload(hist, out.absolute(), opts or SiteOptions()))
    atomic_write_text(out / "index.html", page)
    return out / "index.html"
