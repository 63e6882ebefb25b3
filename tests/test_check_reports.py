"""anpred check's reports on real runs (tests/check_runs.py): the text, JSON round trip and HTML reports,
the CLI, and the history database (its inputs, a run skipped).
"""

from __future__ import annotations

import json

import numpy as np

from anpred.judge import CheckReport, check_run
from anpred.run import RunStore

from check_runs import copy_run


# ---- reports and history ---------------------------------------------------------------------------
def test_reports_cli_and_history(tmp_path, avgpool_run, capsys):
    from anpred.cli import main
    from anpred.report.history import trend

    run, _ = avgpool_run
    js, html, db, png = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "h.db", tmp_path / "t.png"
    code = main(["check", str(run), "--oracle", "both", "--json", str(js), "--report", str(html), "--history", str(db)])
    out = capsys.readouterr().out
    assert code == 1 and "openvino" in out and "FLAGGED" in out and "threshold baseline" in out
    rep = CheckReport.from_dict(json.loads(js.read_text()))
    assert rep.flagged_backends == ["openvino"] or rep.flagged_backends[0] == "openvino"
    assert rep.verdicts["openvino"].origin_anchor and rep.cells[0].stats.n > 0
    text = html.read_text()
    assert text.count("data:image/png;base64,") >= 3 and "Heatmap" in text and "Verdicts" in text
    assert (
        main(["check", str(run), "--history", str(db), "-q", "--oracle", "threshold", "--atol", "1", "--rtol", "1"])
        == 0
    )
    rows = trend(db)
    ov = [r for r in rows if r.backend == "openvino"]
    assert len(ov) == 2 and ov[0].flagged is True and ov[1].threshold_passed is True
    assert ov[0].versions.get("openvino", "").startswith("2026")
    assert main(["history", str(db), "--plot", str(png)]) == 0
    assert "avgpool_cnn" in capsys.readouterr().out and png.stat().st_size > 1000
    assert main(["history", str(tmp_path / "nope.db")]) == 2


def test_history_records_inputs_and_says_when_a_run_is_skipped(tmp_path, avgpool_run, softplus_run, capsys):
    """Regression (review): history skipped errored runs silently and did not record the input set."""
    import sqlite3

    from anpred.backends.base import BackendStatus
    from anpred.cli import main
    from anpred.report.history import SCHEMA_VERSION, format_trend, trend

    run, _ = avgpool_run
    db = tmp_path / "h.db"
    assert main(["check", str(run), "-q", "--history", str(db)]) == 1
    rows = trend(db)
    sha = CheckReport.from_dict(json.loads(json.dumps(check_run(run).to_dict()))).inputs["sha256"]
    assert {r.inputs_sha256 for r in rows} == {sha} and len(sha) == 64
    assert rows[0].inputs == json.loads((run / "run.json").read_text())["inputs"]  # run.json's description
    # another input set: same model, the change column says the inputs differ instead of a ratio
    run2 = copy_run(run, tmp_path / "run2")
    meta = json.loads((run2 / "run.json").read_text())
    meta["samples"][0]["sha256"] = "0" * 64
    (run2 / "run.json").write_text(json.dumps(meta))
    assert main(["check", str(run2), "-q", "--history", str(db)]) == 1
    table = format_trend(trend(db))
    assert "inputs!=" in table and sha[:8] in table
    # a run that cannot be judged is not appended, and the user is told
    sp, man = softplus_run
    s = RunStore.create(tmp_path / "one", man)
    s.add_sample("s0000", {"x": np.zeros((1, 3, 16, 16), np.float32)})
    s.write_anchors("ort", "s0000", RunStore.open(sp).read_anchors("ort", "s0000"))
    s.set_status(BackendStatus(name="ort", family="onnxruntime", status="ok"))
    capsys.readouterr()
    assert main(["check", str(tmp_path / "one"), "-q", "--history", str(db)]) == 2
    assert "not appended: the run could not be judged" in capsys.readouterr().err
    assert len({r.run_id for r in trend(db)}) == 2
    # a schema-1 database is read as is and migrated when appended to
    old = tmp_path / "old.db"
    con = sqlite3.connect(old)
    con.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('schema', '1');
        CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT, run_dir TEXT, model TEXT,
          model_sha256 TEXT, machine TEXT, cpu TEXT, status TEXT, oracle TEXT, samples INTEGER);
        CREATE TABLE verdicts (run_id INTEGER, backend TEXT, family TEXT, precision TEXT, versions TEXT,
          flagged INTEGER, origin_anchor TEXT, origin_stage INTEGER, worst_anchor TEXT, worst_primary REAL,
          propagation TEXT, threshold_passed INTEGER, threshold_max_abs REAL);
        CREATE TABLE cells (run_id INTEGER, backend TEXT, anchor TEXT, stage INTEGER, primary_stat REAL,
          flagged INTEGER, stats TEXT);
        INSERT INTO runs VALUES (1, 't', 'r', 'm', '', '{}', '', 'consistent', 'consensus', 2);
        INSERT INTO verdicts VALUES (1, 'ort', 'onnxruntime', 'fp32', '{}', 0, NULL, NULL, NULL, 1e-7, 'none',
          NULL, NULL);
    """)
    con.commit()
    con.close()
    assert [r.inputs_sha256 for r in trend(old)] == [None]
    assert main(["check", str(run), "-q", "--history", str(old)]) == 1
    con = sqlite3.connect(old)
    assert con.execute("SELECT value FROM meta").fetchone()[0] == str(SCHEMA_VERSION)
    con.close()
    assert [r.inputs_sha256 for r in trend(old)][-1] == sha


def test_html_verdict_table_shows_the_largest_nrmse(softplus_run, tmp_path):
    """Regression: the HTML verdict table labelled the nRMSE of the cell with the highest ratio to its
    threshold as the "worst nRMSE"; it now shows the largest nRMSE with its anchor, separately."""
    from anpred.judge import check_run
    from anpred.report import write_html

    rep = check_run(softplus_run[0])
    anchor, value = rep.largest_primary("openvino")
    cells = [c.primary for c in rep.cells if c.backend == "openvino" and c.primary is not None]
    assert value == max(cells)
    out = tmp_path / "r.html"
    write_html(rep, out)
    page = out.read_text()
    assert "max nrmse (anchor)" in page.lower()
    assert f"({anchor})" in page
