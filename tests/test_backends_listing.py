"""``anpred backends`` (issue 18, deliverable 3, first part): every registered backend with its family,
the precision asked for, the installed versions of the libraries it needs, and whether it can run."""

from __future__ import annotations

import json


def test_every_registered_backend_listed_with_installed_versions():
    import onnx
    import onnxruntime
    import openvino

    from anpred.backends import REGISTRY, backend_table

    rows = {r["name"]: r for r in backend_table()}
    assert list(rows) == list(REGISTRY)
    assert rows["ort"]["packages"] == {"onnxruntime": onnxruntime.__version__} and rows["ort"]["installed"]
    assert rows["openvino-int8"]["family"] == "openvino" and rows["openvino-int8"]["precision"] == "int8"
    assert openvino.__version__.startswith(rows["openvino"]["packages"]["openvino"])  # 2026.4.1 vs 2026.4.1-<build>
    assert rows["onnx-reference-fp64"]["packages"]["onnx"] == onnx.__version__
    assert rows["torch-fp16"]["precision"] == "fp16" and "onnxconverter-common" in rows["torch-fp16"]["packages"]


def test_a_missing_library_is_named(monkeypatch):
    from anpred import backends

    monkeypatch.setitem(backends.FAMILY_PACKAGES, "openvino", ("openvino", "no_such_package_anpred"))
    rows = {r["name"]: r for r in backends.backend_table()}
    assert not rows["openvino"]["installed"]
    assert rows["openvino"]["reason"] == (
        "not installed: no_such_package_anpred (the 'openvino' extra: bash "
        "scripts/setup.sh openvino, or pip install \"anpred[openvino]\" and its "
        "--no-deps companions in requirements-nodeps.txt)"
    )
    assert rows["ort"]["installed"]


def test_cli_lists_defaults(capsys):
    from anpred.cli import main
    from anpred.pipeline.choices import ONNX_BACKENDS

    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows if r["default"]} == set(ONNX_BACKENDS) | {"torch-native", "tf-native"}
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["BACKEND", "FAMILY", "PREC", "INSTALLED", "DEFAULT", "LIBRARIES"]
