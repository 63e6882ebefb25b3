"""The HTML report opens and renders in a real browser: headless Chromium (Debian package
``chromium``; .ci/run installs it) loads a real report (a run in which OpenVINO's Softplus defect is
flagged), the rendered DOM holds the verdict table and the embedded plots, and the screenshot shows
them (not a blank or broken page)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

import pipeline_factories as pf

from isa_reasons import NOT_A_KERNEL_VALUE

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)"
)


class _Dom(HTMLParser):
    """Tables as lists of rows (cell texts) and the ``src`` of every ``<img>``."""

    def __init__(self):
        super().__init__()
        self.tables, self.images, self._cell = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "img":
            self.images.append(dict(attrs).get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _chromium(args, tmp_path):
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rc, out, err, folder = pf.softplus_cli(tmp_path_factory.mktemp("browser"))
    assert rc == 1, (out, err)
    return folder / "report.html"


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
def test_report_renders_in_headless_chromium(report, tmp_path):
    dom = _Dom()
    dom.feed(_chromium(["--dump-dom", report.as_uri()], tmp_path).stdout)
    # the verdict table: one row per backend, openvino flagged
    verdicts = next(t for t in dom.tables if t and t[0][:1] == ["backend"] and "verdict" in t[0])
    col = verdicts[0].index("verdict")
    rows = {r[0]: r[col] for r in verdicts[1:]}
    assert rows == {"ort": "consistent", "openvino": "FLAGGED", "onnx-reference": "consistent", "torch": "consistent"}
    # the plots: heatmap, propagation profile, and the flagged anchor's histograms, embedded PNGs
    pngs = [s for s in dom.images if s.startswith("data:image/png;base64,") and len(s) > 2000]
    assert len(pngs) >= 3 and len(pngs) == len(dom.images)

    shot = tmp_path / "report.png"
    _chromium([f"--screenshot={shot}", "--window-size=1280,1400", report.as_uri()], tmp_path)
    from PIL import Image

    with Image.open(shot) as im:
        px = np.asarray(im.convert("RGB"), dtype=np.int16)
    assert px.shape[:2] == (1400, 1280)
    nonwhite = (px.min(axis=2) < 200).mean()
    colourful = (px.max(axis=2) - px.min(axis=2) > 80).sum()  # the heatmap's viridis, the red/green rows
    assert nonwhite > 0.03, f"page looks blank ({nonwhite:.3%} non-white pixels)"
    assert colourful > 20000, f"plots not rendered ({colourful} coloured pixels)"
