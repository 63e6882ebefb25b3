"""``--model-explorer`` on the command line, without Model Explorer's packages (the export needs
neither): a bad export folder is refused before any work, an export that fails after the judging
keeps the history entry, and ``index.json``'s command is shell-quoted. Uses the real drilled run of
tests/dashboard_runs.py."""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3

from dashboard_runs import net_runs


def _rows(db) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    finally:
        con.close()


def test_bad_export_folder_is_refused_first_and_a_failed_export_keeps_the_history(tmp_path_factory, tmp_path, capsys):
    from anpred.cli import main

    runs = net_runs(tmp_path_factory.mktemp("dash"))
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    db, html = tmp_path / "h.sqlite", tmp_path / "r.html"
    rc = main(
        [
            "check",
            str(runs["bad"] / "run"),
            "--model-explorer",
            str(afile),
            "--history",
            str(db),
            "--report",
            str(html),
            "-q",
        ]
    )
    assert rc == 2 and f"--model-explorer {afile}: exists and is not a folder" in capsys.readouterr().err
    assert not db.exists() and not html.exists()  # refused before any work: nothing judged, nothing half-written
    rc = main(["check", str(runs["bad"] / "run"), "--model-explorer", str(afile / "sub"), "-q"])
    assert rc == 2 and f"{afile} is not a folder" in capsys.readouterr().err
    # anpred test: OUT/model-explorer checked before the run
    out = tmp_path / "t"
    (out).mkdir()
    (out / "model-explorer").write_text("x")
    rc = main(["test", str(runs["bad"].parent / "net.onnx"), "--model-explorer", "-o", str(out), "-q"])
    assert rc == 2 and "model-explorer: exists and is not a folder" in capsys.readouterr().err

    # the export fails after the judging (the run folder lost its model): the verdict is in the history
    run = tmp_path / "run"
    shutil.copytree(runs["bad"] / "run", run)
    (run / "model.onnx").unlink()
    rc = main(["check", str(run), "--model-explorer", str(tmp_path / "me"), "--history", str(db), "-q"])
    assert rc == 2 and "cannot read the anchored model" in capsys.readouterr().err
    assert _rows(db) == 1


def test_index_command_is_shell_quoted(tmp_path_factory, tmp_path):
    """A folder with a space and a quote in its name: ``index.json``'s command splits back (POSIX shell
    rules, :func:`shlex.split`) into exactly the program, the model and the node-data files."""
    from anpred.report.model_explorer import export_report_folder

    runs = net_runs(tmp_path_factory.mktemp("dash"))
    out = tmp_path / "it's a folder"
    index = export_report_folder(runs["bad"], out)
    argv = shlex.split(index["command"])
    files = ",".join(str(out.absolute() / f) for f in sorted(index["files"]))
    assert argv == [
        "model-explorer",
        str(out.absolute() / "anchored.annotated.onnx"),
        "--extensions=model_explorer_onnx",
        f"--node_data_paths={files}",
    ]
    assert json.loads((out / "index.json").read_text())["command"] == index["command"]
