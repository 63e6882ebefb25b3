"""The dashboard in a real browser: headless Chromium (Debian package ``chromium``; .ci/run installs
it) loads a site built over a history made here from two real ``anpred test`` runs of one model
(openvino's verdict changes from ok to FLAGGED: its Softplus defect, drilled down to the operator)
plus synthetic task-metric rows (a drop beyond the margin and one within it). The page loads without
a console message or a script error, the grid holds exactly the expected cells with their verdicts,
the regressions are marked, every link resolves to a file, and the screenshot is not blank."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from urllib.parse import unquote

import numpy as np
import pytest

from dashboard_runs import net_runs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")


class _Grid(HTMLParser):
    """The rendered DOM: the grid's column heads, per row the model and per cell its classes, texts
    and links; every ``href`` of the page; the ``<body>`` attributes."""

    def __init__(self):
        super().__init__()
        self.heads, self.rows, self.hrefs, self.body = [], [], [], {}
        self.changes: list[list[str]] = []
        self._in, self._cell, self._th, self._ch, self._text, self._lab = None, None, False, None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "table" and a.get("id") in ("grid", "changes-table"):
            self._in = a["id"]
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
            if self._cell is not None:
                self._cell["links"].append(a["href"])
        if self._in == "grid":
            if tag == "tr":
                self.rows.append({"model": None, "cells": []})
            elif tag == "th":
                self._th, self._text = True, ""
            elif tag == "td":
                self._cell = {"class": a.get("class", ""), "text": "", "label": "", "links": [], "marks": []}
            elif tag == "span" and self._cell is not None and "mk" in a.get("class", ""):
                self._cell["marks"].append(a["class"])
            elif tag == "span" and self._cell is not None and a.get("class") == "lab":
                self._lab = True
        elif self._in == "changes-table":
            if tag == "tr":
                self._ch = []
            elif tag == "td":
                self._text = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self._in = None
        if self._in == "grid":
            if tag == "th" and self._th:
                self._th = False
                if self.rows and self.rows[-1]["model"] is None and self.rows[-1]["cells"] == [] and len(self.rows) > 1:
                    self.rows[-1]["model"] = self._text.strip()
                elif len(self.rows) == 1:
                    self.heads.append(self._text.strip())
            elif tag == "td" and self._cell is not None:
                self.rows[-1]["cells"].append(self._cell)
                self._cell = None
        elif self._in == "changes-table":
            if tag == "td" and self._ch is not None:
                self._ch.append(self._text.strip())
            elif tag == "tr" and self._ch:
                self.changes.append(self._ch)
                self._ch = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data + " "
            if self._lab:
                self._cell["label"] += data
                self._lab = False
        if self._text is not None:
            self._text += data


def _chromium(args, tmp_path):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
           "--v=0", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The history (two real runs, then synthetic task rows) and the site built over it."""
    from anpred.cli import main
    from anpred.history import append
    from anpred.report.json import read_json

    root = tmp_path_factory.mktemp("dash")
    runs = net_runs(root)
    db = runs["db"]
    # synthetic task metrics, on a copy of the real report: model "clf", ort's top-1 against the labels
    rep = read_json(runs["bad"] / "report.json")
    rep.model = {**rep.model, "name": "clf"}
    for top1 in (0.90, 0.80, 0.795):  # -0.10: a regression; -0.005: within the default margin 0.01
        rep.task = {"task": {"task": "classify"}, "backends": {"ort": {"truth": {"top1": top1}}}}
        append(db, rep, report_html=runs["bad"] / "report.html")
    assert main(["dashboard", str(db), "-o", str(root / "site")]) == 0
    return root / "site"


def test_dashboard_renders_the_grid_marks_regressions_and_links(site, tmp_path):
    page = site / "index.html"
    res = _chromium(["--dump-dom", page.as_uri()], tmp_path)
    consoles = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    assert consoles == [], consoles  # no console message at all: no error, no warning
    dom = _Grid()
    dom.feed(res.stdout)
    assert dom.body.get("data-errors") == "0" and dom.body.get("data-cells") == "6"
    # the grid: 2 models x 3 backends, each cell the latest verdict
    assert dom.heads[1:] == ["onnx-reference", "openvino", "ort"]
    grid = {r["model"]: dict(zip(dom.heads[1:], r["cells"])) for r in dom.rows[1:]}
    assert sorted(grid) == ["clf", "net"]
    label = {m: {b: c["label"] for b, c in row.items()} for m, row in grid.items()}
    assert label["net"]["openvino"].startswith("FLAGGED s")
    assert {b: x.split()[0] for b, x in label["net"].items()} == {"onnx-reference": "ok", "openvino": "FLAGGED", "ort": "ok"}
    assert {b: x.split()[0] for b, x in label["clf"].items()} == {"onnx-reference": "ok", "openvino": "FLAGGED", "ort": "ok"}
    assert "Softplus" in grid["net"]["openvino"]["text"]  # the culprit operator the drill-down named
    assert "st1" in grid["net"]["openvino"]["class"] and "st0" in grid["net"]["ort"]["class"]
    # the regressions: net/openvino (verdict) and clf/ort (top-1 -0.10); nothing else marked
    marked = {(m, b) for m, row in grid.items() for b, c in row.items() if any("rg" in k for k in c["marks"])}
    assert marked == {("net", "openvino"), ("clf", "ort")}
    rows = {(r[0], r[1], r[2]): r for r in dom.changes}
    assert set(rows) == {("net", "openvino", "regression"), ("clf", "ort", "regression")}
    assert re.match(r"ok -> FLAGGED at stage \d", rows[("net", "openvino", "regression")][3])
    assert rows[("net", "openvino", "regression")][6] == "softplus (Softplus)"
    assert rows[("clf", "ort", "regression")][3] == "truth.top1 0.9 -> 0.8 (-0.1 > margin 0.01)"
    # every link resolves (relative to the site); each cell links to its own run's report
    assert dom.hrefs and all(not h.startswith(("http:", "https:", "/")) for h in dom.hrefs)
    assert all((site / unquote(h)).resolve().is_file() for h in dom.hrefs), dom.hrefs
    net_links = {b: (site / unquote(c["links"][0])).resolve() for b, c in grid["net"].items()}
    assert set(net_links.values()) == {(site.parent / "bad" / "out" / "report.html").resolve()}

    shot = tmp_path / "dashboard.png"
    _chromium([f"--screenshot={shot}", "--window-size=1100,700", page.as_uri()], tmp_path)
    from PIL import Image

    with Image.open(shot) as im:
        px = np.asarray(im.convert("RGB"), dtype=np.int16)
    assert px.shape[:2] == (700, 1100)
    nonwhite = (px.min(axis=2) < 200).mean()
    red = ((px[..., 0] > 150) & (px[..., 1] < 90) & (px[..., 2] < 90)).sum()  # flagged labels, regression marks
    assert nonwhite > 0.02, f"page looks blank ({nonwhite:.3%} non-white pixels)"
    assert red > 50, f"no flagged cell or regression mark drawn ({red} red pixels)"


def test_filters_narrow_the_grid(site, tmp_path):
    """The filters run in the browser: the same page opened with a backend chosen (a script
    appended to a copy sets the select as a user would) holds one column."""
    page = (site / "index.html").read_text()
    probe = site / "filtered.html"
    probe.write_text(page.replace("</body>", "<script>var s=document.getElementById('f-backend');s.value='openvino';"
                                  "s.dispatchEvent(new Event('change'));document.body.setAttribute('data-cells',"
                                  "document.querySelectorAll('#grid td.c:not(.none)').length);</script></body>"))
    dom = _Grid()
    dom.feed(_chromium(["--dump-dom", probe.as_uri()], tmp_path).stdout)
    assert dom.heads[1:] == ["openvino"] and dom.body.get("data-cells") == "2"
    assert dom.body.get("data-errors") == "0"
