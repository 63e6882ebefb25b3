"""The light install (issue 35, deliverable 4): the core declares no runtime, each runtime family has its
extra, every --no-deps companion names an extra, ``anpred backends`` says which extra brings a missing
backend, heavy libraries are imported lazily, and no file of the project points outside it. Needs
nothing beyond the light core (``scripts/ci-light.sh`` runs it in a fresh ``.[ort,openvino]`` venv)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEAVY = (
    "torch",
    "tensorflow",
    "tvm",
    "MNN",
    "ncnn",
    "ai_edge_litert",
    "ray",
    "ultralytics",
    "openvino",
    "onnxruntime",
    "scipy",
    "sklearn",
    "onnx2tf",
    "onnx2torch",
)


def _pyproject() -> dict:
    from anpred.compat import toml_reader

    return toml_reader().loads((ROOT / "pyproject.toml").read_text())


def test_core_dependencies_hold_no_runtime_and_every_family_has_its_extra():
    from anpred.backends import FAMILY_EXTRA, FAMILY_PACKAGES

    proj = _pyproject()["project"]
    core = " ".join(proj["dependencies"]).lower()
    for pkg in ("torch", "tensorflow", "onnxruntime", "openvino", "apache-tvm", "mnn", "ncnn", "ray", "litert"):
        assert pkg not in core, pkg
    extras = proj["optional-dependencies"]
    assert {"ort", "openvino", "torch", "tf", "tvm", "mnn", "ncnn", "litert", "campaign", "zoo", "all"} <= set(extras)
    for family in FAMILY_PACKAGES:
        if family.startswith("onnx-reference"):  # numpy and onnx: the core
            assert family not in FAMILY_EXTRA
        else:
            assert FAMILY_EXTRA[family] in extras, family
    everything = set(re.findall(r"anpred\[([^\]]+)\]", extras["all"][0])[0].split(","))
    assert everything == set(extras) - {"all"}
    assert proj["requires-python"] == ">=3.10,<3.13"


def test_every_no_deps_companion_names_an_extra_and_setup_installs_them():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    lines = [ln for ln in (ROOT / "requirements-nodeps.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) >= 10
    for ln in lines:
        m = re.fullmatch(r"(\S+==\S+)\s+# extra: (\w+)", ln)
        assert m and m.group(2) in extras, ln
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "pipq --no-deps -r requirements-nodeps.txt" in setup and "# extra: $extra" in setup


def test_no_file_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # an installed copy without git: the files at hand
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    bad = []
    for name in tracked:
        p = ROOT / name
        if p.suffix in (".png", ".onnx", ".npz", ".npy", ".jpg", ".pkl") or not p.is_file():
            continue
        text = p.read_text(errors="replace")
        if "../shared" in text or "/work/wt" in text or "/work/main" in text:
            bad.append(name)
    assert [b for b in bad if b != "tests/test_light.py"] == []


def test_backends_listing_names_the_extra_of_a_missing_backend():
    from anpred.backends import backend_table

    rows = backend_table()
    for r in rows:
        assert "extra" in r
        if not r["installed"] and r["reason"].startswith("not installed") and r["extra"]:
            assert f"scripts/setup.sh {r['extra']}" in r["reason"] and f'anpred[{r["extra"]}]' in r["reason"], r
    fams = {r["name"]: r["extra"] for r in rows}
    assert fams["ort"] == "ort" and fams["torch-native"] == "torch" and fams["litert"] == "litert"
    assert fams["onnx-reference"] is None and fams["onnx-reference-fp64"] is None


def test_the_cli_and_the_pipeline_import_no_runtime():
    code = (
        "import sys, anpred.cli, anpred.pipeline, anpred.judge, anpred.report, anpred.options;"
        "anpred.cli.build_parser();"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_backends_listing_finds_packages_without_top_level_names(monkeypatch):
    """Python 3.10's ``packages_distributions`` reads only ``top_level.txt`` (numpy's and onnx's wheels
    have none): the core's reference evaluator must still be listed as installed, with its versions
    (regression: on 3.10 it was "not installed", so ``-b ort,openvino`` got no witness)."""
    from importlib import metadata

    import numpy
    import onnx

    from anpred.backends import backend_table

    monkeypatch.setattr(metadata, "packages_distributions", lambda: {})
    rows = {r["name"]: r for r in backend_table()}
    assert rows["onnx-reference"]["installed"], rows["onnx-reference"]
    assert rows["onnx-reference"]["packages"] == {"onnx": onnx.__version__, "numpy": numpy.__version__}
    assert rows["onnx-reference-fp64"]["installed"]
