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
from isa_reasons import NOT_A_KERNEL_VALUE

from dashboard_runs import net_runs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)"
)


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
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The history (two real runs, then synthetic task rows) and the site built over it."""
    from anpred.cli import main
    from anpred.report.history import append
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


# ~19 s with its site: headless Chromium: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
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
    assert {b: x.split()[0] for b, x in label["net"].items()} == {
        "onnx-reference": "ok",
        "openvino": "FLAGGED",
        "ort": "ok",
    }
    assert {b: x.split()[0] for b, x in label["clf"].items()} == {
        "onnx-reference": "ok",
        "openvino": "FLAGGED",
        "ort": "ok",
    }
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
    bad = net_runs(site.parent)["bad"]  # the session's runs (made by whichever test asked first)
    assert set(net_links.values()) == {(bad / "report.html").resolve()}

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
    probe.write_text(
        page.replace(
            "</body>",
            "<script>var s=document.getElementById('f-backend');s.value='openvino';"
            "s.dispatchEvent(new Event('change'));document.body.setAttribute('data-cells',"
            "document.querySelectorAll('#grid td.c:not(.none)').length);</script></body>",
        )
    )
    dom = _Grid()
    dom.feed(_chromium(["--dump-dom", probe.as_uri()], tmp_path).stdout)
    assert dom.heads[1:] == ["openvino"] and dom.body.get("data-cells") == "2"
    assert dom.body.get("data-errors") == "0"


class _Cdp:
    """Headless Chromium driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``:
    JSON messages, each ended by a NUL byte, on file descriptors 3 and 4; no extra package): what a
    page does after it loaded (an intersection observer's callbacks, a click) is awaited in real time,
    where ``--dump-dom`` would read the DOM at an arbitrary moment."""

    def __init__(self, profile):
        import os

        to_chrome, self._w = os.pipe()
        self._r, from_chrome = os.pipe()

        def fds():  # the child's descriptors 3 (reads our commands) and 4 (writes the answers); they
            # survive the exec as inheritable copies (close_fds=False: Python's other descriptors are
            # not inheritable, so nothing else leaks)
            a, b = os.dup(to_chrome), os.dup(from_chrome)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--window-size=1200,800",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            close_fds=False,
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._id, self._buf, self.session = 0, b"", None

    def send(self, method, **params):
        import json
        import os

        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 16)
                assert chunk, "chromium closed the pipe"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            ans = json.loads(raw)
            if ans.get("id") == self._id:
                assert "error" not in ans, ans
                return ans["result"]

    def open(self, url):
        target = self.send("Target.createTarget", url=url)["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def eval(self, expression):
        """``expression``'s value (a promise awaited; JSON-serialisable values); evaluated again while
        the page is still replacing the first empty document (its context destroyed)."""
        import time

        for _ in range(200):
            try:
                res = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
                break
            except AssertionError as err:
                if "context was destroyed" not in str(err) and "Cannot find default execution context" not in str(err):
                    raise
                time.sleep(0.05)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        return res["result"].get("value")

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def test_lazy_sparklines_and_detail_view_on_hundreds_of_cells(tmp_path):
    """A synthetic history of 12 models x 40 backends x 2 runs (480 cells, more than the 400 drawn at
    once): the others wait until in view; scrolling the grid to its far corner draws the last one (its
    nRMSE line), and clicking it opens the detail view with its 2 runs (newest first). Driven through
    the DevTools protocol (:class:`_Cdp`): the observer's callbacks come in rendering updates, awaited."""
    import json
    import sqlite3

    from anpred.cli import main
    from anpred.report.history import create

    db = tmp_path / "h.sqlite"
    create(db)
    con = sqlite3.connect(db)
    with con:
        for rid in (1, 2):
            for m in range(12):
                run = (rid - 1) * 12 + m + 1
                con.execute(
                    "INSERT INTO runs (id, created, run_dir, model, status, inputs_sha256) VALUES (?,?,?,?,?,?)",
                    (run, f"2026-01-0{rid}T00:00:{m:02d}", f"/nowhere/{run}/run", f"m{m:02d}", "consistent", "A"),
                )
                for b in range(40):
                    con.execute(
                        "INSERT INTO verdicts (run_id, backend, family, precision, versions, flagged, "
                        "worst_anchor, worst_primary, status) VALUES (?,?,?,?,?,?,?,?,?)",
                        (
                            run,
                            f"b{b:02d}",
                            "onnxruntime",
                            "fp32",
                            json.dumps({"onnxruntime": f"1.{rid}.0"}),
                            0,
                            "output/y",
                            1e-7 * rid,
                            "consistent",
                        ),
                    )
                    con.execute(
                        "INSERT INTO cells (run_id, backend, anchor, stage, primary_stat, flagged, stats) "
                        "VALUES (?,?,'output/y',0,?,0,'{}')",
                        (run, f"b{b:02d}", 1e-7 * rid * (1 + b)),
                    )
    con.close()
    assert main(["dashboard", str(db), "-o", str(tmp_path / "site")]) == 0
    cdp = _Cdp(tmp_path / "profile")
    try:
        cdp.open((tmp_path / "site" / "index.html").as_uri())
        wait = """new Promise(function (ok) { (function poll(k) {
            if (%s || k > 600) ok(k); else setTimeout(function () { poll(k + 1); }, 25); })(0); })"""
        assert cdp.eval(wait % "document.body && document.body.hasAttribute('data-paint-ms')") <= 600
        assert cdp.eval("[document.body.dataset.cells, document.body.dataset.errors]") == ["480", "0"]
        # 400 drawn at once, the 80 others when in view (those already in view are drawn by now)
        assert 0 < cdp.eval("document.querySelectorAll('#grid .spw.lazy').length") <= 80
        before = cdp.eval("document.querySelectorAll('#grid .spw.lazy').length")
        assert cdp.eval(
            "var last = document.querySelector('#grid .spw[data-cell=\\'479\\']'); "
            "last.classList.contains('lazy') && !last.querySelector('svg')"
        )
        # scroll the grid to its far corner (m11 / b39) as a user would
        cdp.eval(
            "var w = document.getElementById('gridwrap'); w.scrollTop = w.scrollHeight; w.scrollLeft = w.scrollWidth; 0"
        )
        assert cdp.eval(wait % "document.querySelector('#grid .spw[data-cell=\\'479\\'] svg')") <= 600
        last = "document.querySelector('#grid .spw[data-cell=\\'479\\']')"
        assert cdp.eval(last + ".querySelectorAll('svg path.le').length") == 1  # its nRMSE line
        assert cdp.eval("document.querySelectorAll('#grid .spw.lazy').length") < before
        cdp.eval(last + ".click(); 0")
        assert cdp.eval("document.getElementById('detail').hidden") is False
        assert cdp.eval("document.querySelector('#detail h2').firstChild.textContent") == "m11 / b39 "
        rows = cdp.eval(
            "Array.from(document.querySelectorAll('#detail table.pts tbody tr'))"
            ".map(function (r) { return r.children[2].textContent; })"
        )
        assert rows == ["onnxruntime 1.2.0", "onnxruntime 1.1.0"]  # its 2 runs, newest first
        assert cdp.eval("window.__anpredErrors.length") == 0
    finally:
        cdp.close()
