"""The dashboard over a campaign's history with two runtime versions (slow: a campaign on the embedded
Ray and a bisection's drill-down): ONNX Runtime 1.20.1 and 1.21.0 (installed from the wheels
scripts/setup.sh downloads, as tests/test_campaign.py does) on the AveragePool CNN that 1.21.0
computes wrong. ``anpred dashboard`` over the campaign's history shows ort's cell changed (ok ->
FLAGGED at stage 1, the first bad version the bisection found and the culprit operator), the other
cells unchanged, and links each run's report; the campaign's own ``index.html`` is the same page,
restricted to the campaign, with its configurations and what changed per runtime version."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

WHEELS = Path(__file__).resolve().parent.parent / ".venv" / "anpred-wheels"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_dashboard_over_a_campaign_with_two_onnxruntime_releases(tmp_path):
    from pipeline_factories import avgpool_net_onnx

    from anpred.campaign import load_campaign, run_campaign
    from anpred.campaign.bisect import BisectRequest, bisect_versions
    from anpred.cli import main
    from anpred.dashboard import collect
    from anpred.dashboard.site import SiteOptions, payload

    if not all(any(WHEELS.glob(f"onnxruntime-{v}-*.whl")) for v in ("1.20.1", "1.21.0")):
        pytest.skip("scripts/setup.sh downloads the onnxruntime 1.20.1 and 1.21.0 wheels into .venv/anpred-wheels")
    avgpool_net_onnx(tmp_path / "avgpool_net.onnx")
    (tmp_path / "c.toml").write_text(
        '[campaign]\nname = "nightly"\n[defaults]\nsamples = 2\nstages = 3\n'
        '[[models]]\nmodel = "avgpool_net.onnx"\nname = "net"\n'
        '[backend_sets]\nfp32 = ["ort", "openvino", "onnx-reference"]\n'
        f'[[versions]]\npackage = "onnxruntime"\nbackends = ["ort"]\nversions = ["1.20.1", "1.21.0"]\n'
        f'find_links = "{WHEELS}"\n'
    )
    campaign = load_campaign(tmp_path / "c.toml")
    out = tmp_path / "out"
    res = run_campaign(campaign, out, num_cpus=2, progress=False)
    assert [r["state"] for r in res.records] == ["complete", "complete"]
    # the bisection in the campaign's folder: its probes are the campaign's configurations (not run again);
    # the first deviating release is run once more with the drill-down
    b = bisect_versions(
        campaign,
        out,
        BisectRequest(
            package="onnxruntime",
            model="net",
            backend="ort",
            good="1.20.1",
            bad="1.21.0",
            versions=["1.20.1", "1.21.0"],
        ),
        num_cpus=2,
        progress=False,
    )
    assert b["first_bad"] == "1.21.0" and b["culprit"] == {"node": "avgpool", "op_type": "AveragePool"}

    db = out / "history.sqlite"
    site = tmp_path / "site"
    assert main(["dashboard", str(db), "-o", str(site)]) == 0
    hist = collect([db])
    by = {s.backend: s for s in hist.series}
    assert sorted(by) == ["onnx-reference", "openvino", "ort"] and {s.model for s in hist.series} == {"avgpool_net"}
    ort = by["ort"]
    assert [p.versions["onnxruntime"] for p in ort.points] == ["1.20.1", "1.21.0", "1.21.0"]  # the last: the drill run
    assert [p.standing for p in ort.points] == ["ok", "FLAGGED", "FLAGGED"]
    assert [(e["kind"], e["text"]) for e in ort.events] == [("regression", "ok -> FLAGGED at stage 1")]
    assert ort.points[-1].culprit == ("avgpool", "AveragePool")
    assert by["openvino"].events == [] and by["onnx-reference"].events == []
    data = payload(hist, site, SiteOptions())
    (ev,) = next(c for c in data["cells"] if data["backends"][c["b"]][0] == "ort")["x"]
    assert ev["fb"] == "onnxruntime 1.21.0 (bisected; last as before: 1.20.1, stage 1)"
    assert ev["cu"] == "avgpool (AveragePool)"
    links = [unquote(r[1]) for r in data["runs"] if r[1]]
    assert len(links) == len(data["runs"])
    assert all(link and (site / link).resolve().is_file() for link in links), links
    assert {(site / link).resolve().parent.parent for link in links} == {(out / "configs").resolve()}

    # the campaign's index.html: the same page, the campaign's two configurations only, by their labels
    page = (out / "index.html").read_text()
    assert "id=anpred-data" in page and "Campaign nightly" in page
    camp = collect([db], campaign="nightly", campaign_folder=out)
    assert {s.model for s in camp.series} == {"net"} and [len(s.points) for s in camp.series] == [2, 2, 2]
    if CHROMIUM is not None:
        dom = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={tmp_path / 'p'}",
                "--dump-dom",
                (out / "index.html").as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert 'data-errors="0"' in dom and 'data-cells="3"' in dom
        assert "onnxruntime 1.20.1 -&gt; 1.21.0" not in dom  # the version-change table lists from/to apart
        assert "<td>1.20.1</td><td>1.21.0</td><td>ort</td><td>ok</td>" in dom
        assert dom.count("class=\"mk rg\"") == 1  # one cell marked: ort
