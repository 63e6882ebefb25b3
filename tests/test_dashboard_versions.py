"""The dashboard's library versions are package versions only, on REAL verdict rows: ``anpred test``
with ort, openvino, onnx-reference and ort-fp16 records beside each backend's package versions the run facts its
backend reports (OpenVINO's runtime precisions and build, the fp16 model's hash and converted
weights, ONNX Runtime's optimised ops and kernel precisions); the dashboard's filter, its version
ticks and its Changes table keep only the packages (the versions the installed metadata gives)."""

from __future__ import annotations

import json
import sqlite3
from importlib import metadata

from pipeline_factories import softplus_onnx


def test_versions_are_the_packages_not_the_run_facts(tmp_path, capsys):
    from packaging.utils import canonicalize_name

    from anpred.cli import main
    from anpred.dashboard import SiteOptions, collect
    from anpred.dashboard.data import package_names
    from anpred.dashboard.site import payload

    model = softplus_onnx(tmp_path / "net.onnx", bias=0.0, name="net")
    db = tmp_path / "h.sqlite"
    rc = main(
        [
            "test",
            str(model),
            "--backends",
            "ort,openvino,onnx-reference,ort-fp16",
            "--stages",
            "3",
            "--samples",
            "2",
            "--history",
            str(db),
            "-o",
            str(tmp_path / "out"),
            "-q",
        ]
    )
    assert rc == 0, capsys.readouterr().err[-2000:]
    con = sqlite3.connect(db)
    raw = {b: json.loads(v) for b, v in con.execute("SELECT backend, versions FROM verdicts")}
    con.close()
    assert sorted(raw) == ["onnx-reference", "openvino", "ort", "ort-fp16"]
    facts = {
        b: sorted(k for k in v if canonicalize_name(k) not in package_names() and k != "python") for b, v in raw.items()
    }
    assert facts["openvino"] and facts["ort-fp16"], facts  # the rows do carry run facts
    hist = collect([db])
    got = {s.backend: s.points[-1].versions for s in hist.series}
    ort, ov = metadata.version("onnxruntime"), metadata.version("openvino")
    assert got["ort"] == {"onnxruntime": ort}
    assert got["openvino"] == {"openvino": ov}
    assert got["onnx-reference"] == {"onnx": metadata.version("onnx"), "numpy": metadata.version("numpy")}
    assert got["ort-fp16"] == {"onnxruntime": ort}  # its fp16 model's facts left out
    # what the page offers in the library-version filter: "<package> <version>" items only
    items = {x for v in payload(hist, tmp_path, SiteOptions())["vers"] for x in v.split(" · ") if x}
    assert items == {
        f"onnxruntime {ort}",
        f"openvino {ov}",
        f"onnx {metadata.version('onnx')}",
        f"numpy {metadata.version('numpy')}",
    }
