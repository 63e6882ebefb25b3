"""The dashboard's data and site without a browser (cheap: synthetic history rows, no backend runs;
the real runs and the browser are tests/test_dashboard_browser.py): the history's schema-3 migration,
the regression rule (the same as ``anpred history --margin``), the trend anchor, campaigns ordered by
their configurations, a bisection's first bad version, relative links, the command and the server."""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from anpred.report.history import (
    DEFAULT_MARGIN,
    CampaignConfig,
    create,
    record_bisection,
    record_campaign,
    task_regressions,
    task_trend,
)


def _run(con, rid: int, model: str, verdicts: list[tuple], **kw) -> None:
    """One run: ``verdicts`` = ``(backend, flagged, origin_anchor, origin_stage, worst_anchor, worst, status,
    versions, culprit, culprit_op)``; ``kw``: ``inputs`` (its sha256), ``created``, ``cells`` = ``(backend,
    anchor, primary)``, ``tasks`` = ``(backend, metric, value)``, ``run_dir``, ``report``."""
    con.execute(
        "INSERT INTO runs (id, created, run_dir, model, model_sha256, machine, cpu, status, oracle, samples, "
        "inputs, inputs_sha256, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            rid,
            kw.get("created", f"2026-01-01T00:00:{rid:02d}"),
            kw.get("run_dir") or f"/nowhere/{rid}/run",
            model,
            "",
            "{}",
            "",
            "consistent",
            "consensus",
            2,
            "{}",
            kw.get("inputs", "A"),
            kw.get("report"),
        ),
    )
    for b, fl, oa, os_, wa, wp, st, vers, cul, cop in verdicts:
        con.execute(
            "INSERT INTO verdicts (run_id, backend, family, precision, versions, flagged, origin_anchor, "
            "origin_stage, worst_anchor, worst_primary, status, culprit, culprit_op) VALUES "
            "(?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (rid, b, "onnxruntime", "fp32", json.dumps({"python": "3.11", **vers}), fl, oa, os_, wa, wp, st, cul, cop),
        )
    con.executemany(
        "INSERT INTO cells (run_id, backend, anchor, stage, primary_stat, flagged, stats) VALUES (?,?,?,0,?,0,'{}')",
        [(rid, *c) for c in kw.get("cells", ())],
    )
    con.executemany("INSERT INTO tasks VALUES (?,?,'classify',?,?)", [(rid, *t) for t in kw.get("tasks", ())])


def _ok(b="ort", wa="anchor/01/b", wp=1e-7, vers=None):
    return (b, 0, None, None, wa, wp, "consistent", vers or {"onnxruntime": "1.32.0"}, None, None)


def _flagged(b="ort", oa="anchor/01/b", stage=1, wp=0.2, vers=None, cul=("n1", "Softplus")):
    return (b, 1, oa, stage, oa, wp, "flagged", vers or {"onnxruntime": "1.32.0"}, *cul)


@pytest.fixture()
def db(tmp_path):
    p = tmp_path / "h.sqlite"
    create(p)
    return p


def test_regression_rule_is_anpred_history_s(db):
    """Verdict changes against the previous run on the same inputs (worse: regression, better: fix);
    a task metric that fell by more than the margin, exactly where ``anpred history``'s own
    :func:`task_regressions` says so for the latest run at every step; other inputs not compared."""
    from anpred.dashboard.data import collect

    con = sqlite3.connect(db)
    with con:
        plan = [
            ("A", [_ok()], 0.90),
            ("A", [_ok()], 0.85),
            ("A", [_flagged()], 0.845),
            ("B", [_flagged()], 0.2),
            ("B", [_ok()], 0.2),
            ("A", [_ok()], 0.845),
        ]
        for k, (ins, ver, top1) in enumerate(plan, 1):
            _run(
                con,
                k,
                "m",
                ver,
                inputs=ins,
                created=f"2026-01-0{k}T00:00:00",
                cells=[("ort", "anchor/01/b", 1e-7 * k)],
                tasks=[("ort", "truth.top1", top1), ("ort", "unrelated_lower_is_better", 5.0 * k)],
            )
    con.close()
    hist = collect([db])
    (s,) = hist.series
    got = [(e["point"] + 1, e["against"] + 1, e["kind"], e["what"], e["text"]) for e in s.events]
    assert got == [
        (2, 1, "regression", "task", "truth.top1 0.9 -> 0.85 (-0.05 > margin 0.01)"),
        (3, 2, "regression", "verdict", "ok -> FLAGGED at stage 1"),
        (5, 4, "fix", "verdict", "FLAGGED -> ok"),
        (6, 3, "fix", "verdict", "FLAGGED -> ok"),
    ]
    assert hist.margin == DEFAULT_MARGIN
    rows = task_trend(db)
    for k in range(1, 7):  # anpred history's rule on the history as it stood after run k
        theirs = {(r["run"], r["against"], r["metric"]) for r in task_regressions([r for r in rows if r.run_id <= k])}
        ours = {
            (e["point"] + 1, e["against"] + 1, "truth.top1")
            for e in s.events
            if e["what"] == "task" and e["point"] + 1 == k
        }
        assert ours == theirs, k
    # a wider margin: the 0.05 drop is no longer a regression
    assert [e["what"] for e in collect([db], margin=0.06).series[0].events] == ["verdict"] * 3


def test_trend_anchor_and_origin_stage(db):
    """The sparkline's statistic: nRMSE at the origin anchor of the latest flagged run, read for every
    run from the cells table (None where a run did not judge it)."""
    from anpred.dashboard.data import collect

    con = sqlite3.connect(db)
    with con:
        _run(
            con, 1, "m", [_ok(wa="output/y", wp=3e-7)], cells=[("ort", "anchor/02/c", 2e-7), ("ort", "output/y", 3e-7)]
        )
        _run(
            con,
            2,
            "m",
            [_flagged(oa="anchor/02/c", stage=2, wp=0.3)],
            cells=[("ort", "anchor/02/c", 0.3), ("ort", "output/y", 0.01)],
        )
        _run(con, 3, "m", [_ok(wa="output/y", wp=4e-7)], cells=[("ort", "output/y", 4e-7)])
    con.close()
    (s,) = collect([db]).series
    assert s.anchor == "anchor/02/c"
    assert [p.nrmse for p in s.points] == [2e-7, 0.3, None]
    assert [p.standing for p in s.points] == ["ok", "FLAGGED", "ok"] and s.points[1].culprit == ("n1", "Softplus")


def test_campaign_order_and_bisection_first_bad(db, tmp_path):
    """A campaign's runs follow its configurations (the runtime versions of its axis in order), not
    the time each was judged; a bisection of the campaign's model label names the first bad version
    and the culprit on the change between the two releases, and the site links each run's report."""
    from anpred.dashboard import SiteOptions, collect, write_site
    from anpred.dashboard.site import payload

    reports = tmp_path / "out" / "configs"
    for cid in ("a", "b"):
        (reports / cid).mkdir(parents=True)
        (reports / cid / "report.html").write_text("<html>report</html>")
    con = sqlite3.connect(db)
    with con:  # 1.21.0's configuration was judged first
        _run(
            con,
            1,
            "avgpool_net",
            [_flagged(vers={"onnxruntime": "1.21.0"}, cul=(None, None))],
            created="2026-01-01T10:05",
            run_dir="/w/b/run",
        )
        _run(
            con, 2, "avgpool_net", [_ok(vers={"onnxruntime": "1.20.1"})], created="2026-01-01T10:09", run_dir="/w/a/run"
        )
    con.close()
    cfg = dict(label="net", backend_set="fp32", inputs="default", state="complete")
    record_campaign(
        db,
        "nightly",
        tmp_path / "out",
        "c.toml",
        [{"package": "onnxruntime", "versions": ["1.20.1", "1.21.0"], "backends": ["ort"]}],
        [
            CampaignConfig(
                "a",
                0,
                versions={"onnxruntime": "1.20.1"},
                report=str(reports / "a" / "report.html"),
                run_dir="/w/a/run",
                **cfg,
            ),
            CampaignConfig(
                "b",
                1,
                versions={"onnxruntime": "1.21.0"},
                report=str(reports / "b" / "report.html"),
                run_dir="/w/b/run",
                **cfg,
            ),
        ],
    )
    record_bisection(
        db,
        {
            "package": "onnxruntime",
            "model": "net",
            "backend": "ort",
            "candidates": ["1.20.1", "1.21.0"],
            "first_bad": "1.21.0",
            "last_good": "1.20.1",
            "origin_stage": 1,
            "culprit": {"node": "avgpool", "op_type": "AveragePool"},
        },
        "nightly",
        tmp_path / "bisect",
    )
    hist = collect([db], campaign="nightly")
    (s,) = hist.series
    assert [p.versions for p in s.points] == [{"onnxruntime": "1.20.1"}, {"onnxruntime": "1.21.0"}]
    assert [(e["kind"], e["text"]) for e in s.events] == [("regression", "ok -> FLAGGED at stage 1")]
    site = tmp_path / "out"
    data = payload(hist, site, SiteOptions())
    (cell,) = data["cells"]
    (ev,) = cell["x"]
    assert ev["fb"] == "onnxruntime 1.21.0 (bisected; last as before: 1.20.1, stage 1)"
    assert ev["cu"] == "avgpool (AveragePool)"
    assert [data["runs"][i][1] for i in data["mr"][0]] == ["configs/a/report.html", "configs/b/report.html"]
    page = write_site(hist, site, SiteOptions(title="t"))
    text = page.read_text()
    blob = re.search(r"<script type='application/json' id=anpred-data>(.*?)</script>", text, re.S).group(1)
    assert json.loads(blob.replace("<\\/", "</"))["cells"] == data["cells"]
    # self-contained: nothing loaded from elsewhere
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", text) and "http://" not in text
    from anpred.errors import AnpredError

    with pytest.raises(AnpredError, match=r"no campaign 'other' in .*campaigns there: nightly"):
        collect([db], campaign="other")


def test_migration_from_schema_2(tmp_path):
    """A schema-2 database is read as is (no report, no culprit) and migrated when written to."""
    from anpred.dashboard.data import collect

    old = tmp_path / "old.sqlite"
    con = sqlite3.connect(old)
    con.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('schema', '2');
        CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT, run_dir TEXT, model TEXT,
          model_sha256 TEXT, machine TEXT, cpu TEXT, status TEXT, oracle TEXT, samples INTEGER, inputs TEXT,
          inputs_sha256 TEXT);
        CREATE TABLE verdicts (run_id INTEGER, backend TEXT, family TEXT, precision TEXT, versions TEXT,
          flagged INTEGER, origin_anchor TEXT, origin_stage INTEGER, worst_anchor TEXT, worst_primary REAL,
          propagation TEXT, threshold_passed INTEGER, threshold_max_abs REAL, status TEXT);
        CREATE TABLE cells (run_id INTEGER, backend TEXT, anchor TEXT, stage INTEGER, primary_stat REAL,
          flagged INTEGER, stats TEXT);
        INSERT INTO runs VALUES (1, 't', 'r', 'm', '', '{}', '', 'flagged', 'consensus', 2, '{}', 'abc');
        INSERT INTO verdicts VALUES (1, 'ort', 'onnxruntime', 'fp32', '{}', 1, 'a', 1, 'a', 0.5, 'none', NULL, NULL,
          'flagged');
    """)
    con.commit()
    con.close()
    (s,) = collect([old]).series
    assert s.points[0].standing == "FLAGGED" and s.points[0].culprit is None
    create(old)
    con = sqlite3.connect(old)
    assert con.execute("SELECT value FROM meta").fetchone()[0] == "3"
    assert {"culprit", "culprit_op"} <= {r[1] for r in con.execute("PRAGMA table_info(verdicts)")}
    assert "report" in {r[1] for r in con.execute("PRAGMA table_info(runs)")}
    assert {"campaigns", "campaign_runs", "bisections", "tasks"} <= {
        r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    con.close()
    (s,) = collect([old]).series
    assert s.points[0].origin_stage == 1


def test_command_and_loopback_server(db, tmp_path, capsys):
    from anpred.cli import main
    from anpred.dashboard.serve import serve_in_thread

    con = sqlite3.connect(db)
    with con:
        _run(con, 1, "m", [_ok()])
    con.close()
    assert main(["dashboard", str(db), "-o", str(tmp_path / "site")]) == 0
    assert "dashboard: " in capsys.readouterr().out
    assert main(["dashboard", str(tmp_path / "missing.sqlite"), "-o", str(tmp_path / "s2")]) == 2
    assert "no such history database" in capsys.readouterr().err
    assert main(["dashboard", str(db), "-o", str(tmp_path / "s3"), "--margin", "-1"]) == 2
    server, url = serve_in_thread(tmp_path / "site")
    try:
        assert url.startswith("http://127.0.0.1:") and server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and b"anpred-data" in r.read()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url.replace("index.html", "nothing.html"), timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert Path(tmp_path / "site" / "index.html").is_file()


def test_two_backend_sets_of_a_campaign_are_two_series(db, tmp_path):
    """A campaign with two backend sets (docs/campaigns.md: fp32 and lowp) runs each model with both:
    same label, inputs and versions, but each set forms its own consensus. ort consistent in fp32 and
    FLAGGED in lowp is no regression (the two are not compared): one row per set, each cell the latest
    verdict of its own set; a change within a set is still found."""
    from anpred.dashboard import SiteOptions, collect
    from anpred.dashboard.site import payload

    fp32 = lambda: [_ok("ort"), _ok("openvino"), _ok("onnx-reference")]  # noqa: E731
    lowp = lambda ort: [ort, _ok("openvino"), _ok("torch")]  # noqa: E731
    plan = [
        ("a1", "fp32", fp32()),
        ("b1", "lowp", lowp(_flagged("ort"))),
        ("a2", "fp32", fp32()),
        ("b2", "lowp", lowp(_flagged("ort"))),
        ("a3", "fp32", fp32()),
        ("b3", "lowp", lowp(_ok("ort"))),
    ]
    con = sqlite3.connect(db)
    with con:
        for k, (_, _, verdicts) in enumerate(plan, 1):
            _run(con, k, "net", verdicts, run_dir=f"/w/{k}/run")
    con.close()
    record_campaign(
        db,
        "nightly",
        tmp_path / "out",
        "c.toml",
        [],
        [
            CampaignConfig(
                cid,
                pos,
                label="net",
                backend_set=bset,
                inputs="default",
                state="complete",
                versions={"onnxruntime": "1.32.0"},
                run_dir=f"/w/{pos + 1}/run",
            )
            for pos, (cid, bset, _) in enumerate(plan)
        ],
    )
    record_bisection(
        db,
        {
            "package": "onnxruntime",
            "model": "net",
            "backend": "ort",
            "candidates": ["1.31.0", "1.32.0"],
            "first_bad": "1.32.0",
            "last_good": "1.31.0",
        },
        "nightly",
        tmp_path / "out",
    )
    for hist in (collect([db], campaign="nightly"), collect([db])):
        # the bisection probed the model's first configuration holding ort: the fp32 set
        assert [(s.config, s.backend) for s in hist.series if s.bisections] == [("fp32", "ort")]
        # one change only: lowp's ort fixed in its last run (fp32 against lowp would alternate ok/FLAGGED)
        assert [(s.backend, e["text"]) for s in hist.series for e in s.events] == [("ort", "FLAGGED -> ok")]
        by = {(s.config, s.backend): s for s in hist.series}
        assert sorted(by) == [
            ("fp32", "onnx-reference"),
            ("fp32", "openvino"),
            ("fp32", "ort"),
            ("lowp", "openvino"),
            ("lowp", "ort"),
            ("lowp", "torch"),
        ]
        assert [p.standing for p in by[("fp32", "ort")].points] == ["ok", "ok", "ok"]
        assert [p.standing for p in by[("lowp", "ort")].points] == ["FLAGGED", "FLAGGED", "ok"]
        assert by[("fp32", "ort")].events == []
        assert [(e["kind"], e["text"]) for e in by[("lowp", "ort")].events] == [("fix", "FLAGGED -> ok")]
        assert all(s.events == [] for k, s in by.items() if k != ("lowp", "ort"))
        data = payload(hist, tmp_path, SiteOptions())
        assert data["models"] == ["net · fp32", "net · lowp"] and data["nmodels"] == 1
        latest = {(data["models"][c["m"]], data["backends"][c["b"]][0]): c["s"][-1] for c in data["cells"]}
        assert latest[("net · fp32", "ort")] == "0" and latest[("net · lowp", "ort")] == "0"
        assert len(latest) == 6


def test_unknown_campaign_is_an_error_and_an_empty_history_a_note(db, tmp_path, capsys):
    """``--campaign NAME`` that the history does not record: exit 2, naming the campaigns there (a
    history without campaigns says so); a history with no run: the site is written, with a note."""
    from anpred.cli import main

    assert main(["dashboard", str(db), "-o", str(tmp_path / "s0")]) == 0
    err = capsys.readouterr().err
    assert f"{db} hold(s) no run: the grid is empty" in err
    assert "This history holds no run" in (tmp_path / "s0" / "index.html").read_text()
    assert main(["dashboard", str(db), "-o", str(tmp_path / "s1"), "--campaign", "nightly"]) == 2
    err = capsys.readouterr().err
    assert "no campaign 'nightly' in " in err and "it records no campaign" in err
    record_campaign(db, "weekly", tmp_path / "w", "w.toml", [], [])
    record_campaign(db, "nightly-2", tmp_path / "n", "n.toml", [], [])
    assert main(["dashboard", str(db), "-o", str(tmp_path / "s2"), "--campaign", "nightly"]) == 2
    err = capsys.readouterr().err
    assert "no campaign 'nightly' in " in err and "campaigns there: nightly-2, weekly" in err
    assert not (tmp_path / "s2").exists()  # nothing written
    assert main(["dashboard", str(db), "-o", str(tmp_path / "s3"), "--campaign", "weekly"]) == 0
    assert "no run of campaign 'weekly'" in capsys.readouterr().err


def test_serve_reaches_the_reports_beside_the_site(db, tmp_path):
    """The usual layout: the site next to the run folders (``site/`` and ``runs/<k>/report.html``).
    ``--serve`` serves their common parent with the site as the start page, so the page's relative
    link (``../runs/1/report.html``) answers with the report; a path out of that folder (a symbolic
    link) is refused."""
    from urllib.parse import urljoin

    from anpred.dashboard import collect, write_site
    from anpred.dashboard.serve import serve_in_thread

    home = tmp_path / "home"
    (home / "runs" / "1").mkdir(parents=True)
    (home / "runs" / "1" / "report.html").write_text("<html>the report of run 1</html>")
    (tmp_path / "secret.txt").write_text("outside")
    (home / "escape").symlink_to(tmp_path / "secret.txt")
    con = sqlite3.connect(db)
    with con:
        _run(con, 1, "m", [_ok()], run_dir=str(home / "runs" / "1" / "run"))
    con.close()
    write_site(collect([db]), home / "site")
    from anpred.dashboard.site import read_data

    (link,) = [r[1] for r in read_data(home / "site" / "index.html")["runs"]]
    assert link == "../runs/1/report.html"
    server, url = serve_in_thread(home / "site")
    try:
        assert url == f"http://127.0.0.1:{server.server_address[1]}/site/index.html"
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and b"anpred-data" in r.read()
        with urllib.request.urlopen(urljoin(url, link), timeout=30) as r:
            assert r.status == 200 and r.read() == b"<html>the report of run 1</html>"
        for bad in ("escape", "../secret.txt", "%2e%2e/secret.txt"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urljoin(url, "/" + bad), timeout=30)
            assert err.value.code == 404, bad
    finally:
        server.shutdown()
        server.server_close()
