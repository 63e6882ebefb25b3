"""Real runs for the dashboard and Model Explorer tests (helpers, not tests), made once per session.

:func:`net_runs`: ``anpred test net.onnx`` twice into one history database, on ort, openvino and
onnx-reference: first the Softplus CNN (:func:`pipeline_factories.softplus_onnx`) with its Softplus
inputs around 0 (every backend consistent), then the same graph with the Softplus inputs around
-15, where OpenVINO 2026.4.1's CPU Softplus is wrong
(docs/oracle.md), with the drill-down (culprit: the node ``softplus``) and its Model Explorer export
(``--model-explorer``: ``out/model-explorer/``). Both files are named
``net.onnx`` and take the same seeded inputs, so the history holds one model ``net`` whose openvino
verdict changes from ok to FLAGGED: a real regression.
"""

from __future__ import annotations

from pathlib import Path

from pipeline_factories import softplus_onnx

_RUNS: dict[str, dict[str, Path]] = {}


def net_runs(root: Path) -> dict[str, Path]:
    """The two runs (module docstring), once per session: ``{"db", "good", "bad"}`` (the history and
    the two report folders). Raises AssertionError when a run does not end as expected."""
    import contextlib
    import io

    from anpred.cli import main

    if "net" not in _RUNS:
        root = Path(root)
        db = root / "history.sqlite"
        out = {"db": db}
        for key, bias, rc_want, extra in (("good", 0.0, 0, []), ("bad", -15.0, 1, ["--drill", "--model-explorer"])):
            (root / key).mkdir(parents=True)
            model = softplus_onnx(root / key / "net.onnx", bias=bias, name="net")
            so, se = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                rc = main(
                    [
                        "test",
                        str(model),
                        "--backends",
                        "ort,openvino,onnx-reference",
                        "--stages",
                        "7",
                        "--samples",
                        "2",
                        "--history",
                        str(db),
                        "-o",
                        str(root / key / "out"),
                        "--quiet",
                        *extra,
                    ]
                )
            assert rc == rc_want, (key, rc, so.getvalue()[-2000:], se.getvalue()[-2000:])
            out[key] = root / key / "out"
        _RUNS["net"] = out
    return _RUNS["net"]
