"""The one-shot pipeline (``anpred test`` / ``anpred.test``) end to end on real runtimes: an ``.onnx``
path holding a real OpenVINO defect (flagged, exit 1), a PyTorch factory and a Keras factory
(exported, mapped onto the native model, consistent), a zoo name, the demo's pipeline at reduced size (trained PP-OCRv4
on rendered pages, every default backend), and user errors (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import re

import onnx
import pytest

import pipeline_factories as pf
from anpred.cli import main as cli

from isa_reasons import FP32_BOUND


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("pipeline")


@pytest.mark.isa_independent(FP32_BOUND)
def test_onnx_path_flags_openvino_softplus(root):
    rc, out, err, folder = pf.softplus_cli(root)
    assert rc == 1, (out, err)
    # the report folder: anchored model + manifest, run store, JSON, HTML, test.json; no partial folder left
    for f in ("anchored.onnx", "anchored.anchors.json", "run/run.json", "report.json", "report.html", "test.json"):
        assert (folder / f).is_file(), f
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]
    rep = json.loads((folder / "report.json").read_text())
    assert rep["schema"] == "anpred.check/1" and rep["status"] == "flagged"
    assert rep["flagged_backends"] == ["openvino"]
    man = json.loads((folder / "anchored.anchors.json").read_text())
    origin = rep["verdicts"]["openvino"]["origin_anchor"]
    assert next(a for a in man["anchors"] if a["name"] == origin)["value"] == "sp"  # the Softplus output
    for b in ("ort", "onnx-reference", "torch"):
        assert not rep["verdicts"][b]["flagged"] and rep["verdicts"][b]["worst_primary"] < 1e-5
    assert rep["samples"] == 3  # seeded crops of ultralytics' photographs (image input)
    run = json.loads((folder / "run" / "run.json").read_text())
    assert run["model"]["path"] == str(folder / "anchored.onnx") and run["model"]["name"] == "softplus"
    assert run["inputs"]["distribution"] == "images"
    stored = onnx.load(str(folder / "anchored.onnx"), load_external_data=False)
    assert any(p.key == "anpred.manifest" for p in stored.metadata_props)
    # printed: the verdict table, the report's path, where each backend stands
    assert "-> FLAGGED" in out and f"report: {folder / 'report.html'}" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("openvino ") and "FLAGGED at" in ln)
    assert origin in line
    test_json = json.loads((folder / "test.json").read_text())
    assert test_json["status"] == "flagged" and set(test_json["seconds"]) >= {"instrument", "run", "check", "total"}
    assert test_json["details"]["inputs"] == {"kind": "generated", "spec": "random:images:seed=0:n=3"}


@pytest.mark.isa_independent(FP32_BOUND)
def test_factory_is_exported_mapped_and_consistent(root):
    rc, out, err, folder = pf.cli_run(
        "factory",
        root,
        ["pipeline_factories:small_cnn", "--backends", "ort,openvino,torch-native", "--stages", "6", "--samples", "2"],
    )
    assert rc == 0, (out, err)
    exported = onnx.load(str(folder / "exported.onnx"), load_external_data=False)
    origin = json.loads(next(p.value for p in exported.metadata_props if p.key == "anpred.origin"))
    assert origin["framework"] == "torch" and origin["factory"] == "pipeline_factories:small_cnn"
    man = json.loads((folder / "anchored.anchors.json").read_text())
    assert man["model"]["origin"]["factory"] == "pipeline_factories:small_cnn"
    mapped = [a["native"]["torch-native"] for a in man["anchors"]]
    assert len(mapped) >= 4 and all(m["status"] in ("exact", "equivalent") for m in mapped)
    rep = json.loads((folder / "report.json").read_text())
    assert rep["status"] == "consistent" and rep["samples"] == 2
    v = rep["verdicts"]["torch-native"]
    assert v["judged_anchors"] == len(mapped) and 0 < v["worst_primary"] < 1e-5  # eager vs ONNX runtimes: fp32 noise
    assert json.loads((folder / "mapping.json").read_text())["summary"]["torch-native"]["unmapped"] == 0
    assert "-> CONSISTENT" in out


def test_default_backends_follow_the_origin():
    from anpred.pipeline import default_backends

    pops = [
        "ort-fp16",
        "ort-fp16-noopt",
        "openvino-fp16",
        "torch-fp16",
        "ort-int8",
        "ort-int8-noopt",
        "openvino-int8",
        "onnx-reference-int8",
    ]
    fp32 = ["ort", "openvino", "torch", "tf", "tvm", "mnn", "ncnn", "litert"]  # eight families (issue 18): --all
    quick = ["ort", "openvino", "torch", "mnn", "ncnn"]  # the default (issue 35): the five cheapest, measured
    assert default_backends("onnx", all_backends=True) == fp32 + ["onnx-reference-fp64"] + pops
    assert default_backends("torch", all_backends=True) == fp32 + ["onnx-reference-fp64", "torch-native"] + pops
    assert default_backends("onnx") == quick and default_backends("torch") == quick + ["torch-native"]
    assert default_backends("onnx", ("fp16", "int8")) == quick + pops
    assert "tf-native" in default_backends("tf") and "torch-native" not in default_backends("tf")


@pytest.mark.kernels  # openvino-int8, ort-int8 and ort-fp16 bounded: int8/fp16 kernels' arithmetic
@pytest.mark.slow  # the default backends and both populations on PP-OCRv4 (about 70 s cold)
def test_demo_pipeline_reduced(root):
    """The demo's PP-OCRv4 part at 96x128 on two rendered pages, the default backends and both precision
    populations (``--precision fp16,int8``)."""
    from anpred.pipeline import QUICK_FP32, default_backends, demo, format_standing

    res = demo(
        root / "demo", models_=("ppocr-det",), ppocr_hw=(96, 128), samples=2, quiet=True, precision=("fp16", "int8")
    )
    (r,) = res.results
    assert r.backends == default_backends("onnx", ("fp16", "int8")), r.backends
    # every default backend runs; OpenVINO's low-precision transformation throws on PP-OCRv4's QDQ model
    # as written (OpenVINO 2026.4.1), and openvino-int8 compiles it with the constants' fake quantization
    # folded (docs/backends-converters.md), which its versions say
    assert {b: st for b, st in r.statuses.items() if st != "ok"} == {}, r.reasons
    assert "openvino_folded_fake_quantization" in r.report.backends["openvino-int8"]["versions"]
    assert r.report.samples == 2 and r.report.model["name"] == "ppocr-det"
    assert r.details["inputs"]["sources"] == ["rendered page seed 0", "rendered page seed 1"]
    assert r.details["fixed_dims"] == ["x[0]=1", "x[2]=96", "x[3]=128"]  # dynamic ONNX input made static
    for b in QUICK_FP32:  # fp32 voters agree to fp32 noise
        v = r.verdicts[b]
        assert not v.flagged and v.judged_anchors >= 5 and v.worst_primary < 1e-4, (b, v.worst_primary)
    for b in ("ort-fp16", "ort-int8"):  # judged against the consensus, at least at the first anchors
        assert r.verdicts[b].judged_anchors >= 5 and r.verdicts[b].worst_primary > 1e-4
    assert res.exit_code == r.exit_code and bool(res) == (r.status == "consistent")
    table = format_standing(res.results)
    assert all(b in table for b in r.backends)
    demo_json = json.loads((root / "demo" / "demo.json").read_text())
    assert demo_json["models"][0]["model"] == "ppocr-det"
    assert demo_json["models"][0]["standing"]["ort"].startswith("consistent")
    # regression: "max nRMSE" is the largest cell of report.json, not the cell nearest its threshold
    rep = json.loads((r.out / "report.json").read_text())
    for b, word in r.standing().items():
        if word.startswith("consistent ("):
            biggest = max(c["primary"] for c in rep["cells"] if c["backend"] == b)
            assert f"max nRMSE {biggest:.1e})" in word, (b, word, biggest)
    text = r.format_text()
    int8 = max(rep["cells"], key=lambda c: c["primary"] if c["backend"] == "ort-int8" else -1)
    line = next(ln for ln in text.splitlines() if ln.startswith("ort-int8 "))
    assert f"{int8['primary']:.2e} {int8['anchor'][:25]}" in line, (line, int8)
    # regression: ort-fp16 read back as fp16 (PP-OCR keeps its weights in Constant nodes)
    run = json.loads((r.out / "run" / "run.json").read_text())
    fp16 = run["backends"]["ort-fp16"]
    assert fp16["precision"] == "fp16" and r.verdicts["ort-fp16"].precision == "fp16", fp16
    # regression: provenance names the final folder, not the deleted partial one
    inputs = r.out / "run" / "inputs"
    assert run["inputs"]["path"] == str(inputs) and len(list(inputs.iterdir())) == 2
    assert run["model"]["path"] == str(r.out / "anchored.onnx") and rep["run_dir"] == str(r.out / "run")
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    for f in ("demo.json", "ppocr-det/test.json", "ppocr-det/report.json", "ppocr-det/run/run.json"):
        assert ".partial-" not in (root / "demo" / f).read_text(), f  # no path into a deleted build folder
    # a second demo in the same folder: refused without overwrite, replaces the first with it
    from anpred.errors import OutputPathError

    with pytest.raises(OutputPathError, match="already holds a demo"):
        demo(root / "demo", models_=("ppocr-det",), ppocr_hw=(32, 32), samples=1, quiet=True)
    again = demo(
        root / "demo",
        models_=("ppocr-det",),
        ppocr_hw=(32, 32),
        samples=1,
        quiet=True,
        backends="ort,onnx-reference",
        overwrite=True,
        allow_incomplete=True,
    )
    # the two named backends, then the witnesses that complete three voting families and the arbiter
    assert again.results[0].backends[:2] == ["ort", "onnx-reference"]
    assert again.results[0].backends[-1] == "onnx-reference-fp64" and len(again.results[0].backends) == 4
    assert json.loads((root / "demo" / "demo.json").read_text())["models"][0]["backends"] == again.results[0].backends
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_demo_doclaynet_inputs_record_their_real_sources(tmp_path):
    """Regression: test.json named the demo's deleted temporary PNG files as the DocLayNet sources."""
    import models
    from anpred.pipeline.demos import demo_doclaynet_images as _demo_doclaynet_images
    from anpred.pipeline.samples import zoo_samples as _zoo_samples

    folder = _demo_doclaynet_images(tmp_path, 4)
    zm = models.get("yolov8n-doclaynet")
    sources = _zoo_samples(zm, 4, str(folder), tmp_path / "npz", "images")
    assert sources == [
        "rendered page seed 0",
        "ultralytics/assets/bus.jpg",
        "ultralytics/assets/zidane.jpg",
        "rendered page seed 1",
    ]
    assert len(list((tmp_path / "npz").glob("*.npz"))) == 4


# ~7 s: a zoo model through the CLI: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
@pytest.mark.isa_independent(FP32_BOUND)
def test_zoo_name_cli(root):
    rc, out, err, folder = pf.cli_run(
        "zoo", root, ["yolov8n", "--imgsz", "160", "--backends", "ort,openvino", "-n", "1"]
    )
    assert rc == 0, (out, err)
    t = json.loads((folder / "test.json").read_text())
    assert t["model"] == "yolov8n" and t["backends"][:2] == ["ort", "openvino"] and t["status"] == "consistent"
    # two runtimes named: both judged, against a consensus the witnesses complete (issue 35)
    plan = t["details"]["backends"]
    assert plan["subjects"] == ["ort", "openvino"] and t["backends"][2:] == list(plan["witnesses"])
    assert t["standing"]["ort"].startswith("consistent") and t["standing"]["openvino"].startswith("consistent")
    assert t["details"]["inputs"]["sources"] == ["ultralytics/assets/bus.jpg"]
    run = json.loads((folder / "run" / "run.json").read_text())
    assert run["inputs"]["path"] == str(folder / "run" / "inputs") and (folder / "run" / "inputs").is_dir()
    assert run["inputs"]["sources"] == ["ultralytics/assets/bus.jpg"]
    assert [(x["source"], x["stored"]) for x in run["samples"]] == [
        ("ultralytics/assets/bus.jpg", str(folder / "run" / "inputs" / "s0000.safetensors"))
    ]
    assert (folder / "run" / "inputs" / "s0000.safetensors").is_file()
    rep = json.loads((folder / "report.json").read_text())
    assert rep["samples"] == 1 and rep["model"]["name"] == "yolov8n"
    assert 0 < rep["verdicts"]["openvino"]["worst_primary"] < 1e-4  # seeded YOLOv8n at 160 px: fp32 noise
    biggest = max(c["primary"] for c in rep["cells"] if c["backend"] == "openvino")
    assert re.search(rf"^openvino\s+consistent \(max nRMSE {biggest:.1e}\)$", out, re.M), out


# ~10 s: a Keras export and its mapping: out of the default run's time budget; CI's slow run keeps it
@pytest.mark.slow
@pytest.mark.isa_independent(FP32_BOUND)
def test_keras_factory_is_exported_mapped_and_consistent(root):
    rc, out, err, folder = pf.cli_run(
        "keras",
        root,
        ["pipeline_factories:small_keras", "--backends", "ort,tf-native", "--stages", "4", "--samples", "1"],
    )
    assert rc == 0, (out, err)
    exported = onnx.load(str(folder / "exported.onnx"), load_external_data=False)
    origin = json.loads(next(p.value for p in exported.metadata_props if p.key == "anpred.origin"))
    assert origin["framework"] == "tf" and origin["factory"] == "pipeline_factories:small_keras"
    man = json.loads((folder / "anchored.anchors.json").read_text())
    mapped = [a["native"]["tf-native"] for a in man["anchors"]]
    assert len(mapped) >= 3 and all(m["status"] in ("exact", "equivalent") for m in mapped)
    rep = json.loads((folder / "report.json").read_text())
    v = rep["verdicts"]["tf-native"]
    assert rep["status"] == "consistent" and v["judged_anchors"] == len(mapped) and 0 < v["worst_primary"] < 1e-5
    t = json.loads((folder / "test.json").read_text())  # regression: the export's final path, not the partial one
    assert t["details"]["subject"]["onnx"] == str(folder / "exported.onnx")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["yolov99"], "unknown model 'yolov99'"),
        (["{tmp}/missing.onnx"], "no such file"),
        (["{tmp}/garbage.onnx"], "not a readable ONNX model"),
        (["nosuchmodule:factory"], "cannot import module 'nosuchmodule'"),
        (["{tmp}/softplus.onnx", "--backends", "ort,cuda"], "unknown backend 'cuda'"),
        (["{tmp}/softplus.onnx", "--inputs", "{tmp}/nothing-here"], "no such file or folder"),
        (["demo", "--inputs", "x"], "--inputs does not apply to the demo"),
        # backends are checked for every demo model before any work (torch-native: DocLayNet yes, PP-OCR no)
        (
            ["demo", "--backends", "ort,openvino,torch-native", "-n", "1"],
            "backend torch-native needs a model of PyTorch origin; ppocr-det: it is a shipped ONNX model",
        ),
        (["demo", "--backends", "ort"], "one backend (ort) cannot be judged"),
        (["{tmp}/softplus.onnx", "--backends", "ort"], "one backend (ort) cannot be judged"),
        (["{tmp}/softplus.onnx", "--backends", "ort,,openvino"], "empty entry in the backend list 'ort,,openvino'"),
        (["{tmp}/softplus.onnx", "--backends", "ort,torch-native"], "softplus: it is a .onnx without a native factory"),
        (
            ["yolov8n", "--backends", "ort,tf-native"],
            "yolov8n: it is of PyTorch origin: its native framework is torch (use torch-native)",
        ),
        (
            ["pipeline_factories:small_keras", "--backends", "ort,torch-native"],
            "small_keras: it is of Keras origin: its native framework is tf (use tf-native)",
        ),
    ],
)
def test_user_errors_one_line_exit_2_nothing_written(tmp_path, capsys, argv, message):
    (tmp_path / "garbage.onnx").write_bytes(b"\x08\x07 this is not a protobuf model \xff\xfe" * 10)
    pf.softplus_onnx(tmp_path / "softplus.onnx")
    out = tmp_path / "out"
    rc = cli(["test", *[a.format(tmp=tmp_path) for a in argv], "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("anpred: error: ") and message in lines[0], err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_out_folder_holding_something_else_is_left_alone(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc = cli(["test", str(pf.softplus_onnx(tmp_path / "m.onnx")), "-o", str(out), "--backends", "ort,openvino"])
    assert rc == 2 and "is not an anpred test folder" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_model_with_external_weights_in_another_folder(tmp_path):
    """Regression: a user model whose weights live in an external-data file beside it (another
    folder than the report) failed in the pipeline (runtimes refuse weight paths outside the model's
    folder); the report folder now carries a streamed copy of the weights."""
    import onnx

    import anpred
    from pipeline_factories import softplus_onnx

    src = tmp_path / "user"
    src.mkdir()
    plain = softplus_onnx(tmp_path / "plain.onnx")
    m = onnx.load(plain)
    onnx.save_model(
        m,
        src / "model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    assert (src / "model.onnx.data").stat().st_size > 0
    res = anpred.test(
        str(src / "model.onnx"),
        out=tmp_path / "report",
        backends=["ort", "onnx-reference"],
        samples=1,
        quiet=True,
        allow_incomplete=True,
        witnesses=False,
    )
    data = list((tmp_path / "report").glob("anchored.onnx*.data"))
    assert data and data[0].read_bytes() == (src / "model.onnx.data").read_bytes()
    assert res.statuses == {"ort": "ok", "onnx-reference": "ok"}, res.statuses
    onnx.checker.check_model(str(src / "model.onnx"), full_check=True)  # the user's model is untouched
