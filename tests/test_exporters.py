"""Exporters (torch dynamo/TorchScript, Keras via tf2onnx) and the ``anpred map`` command, on real
exports run in ONNX Runtime."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from exporters import ExportError, load_factory, read_origin


def small_torch(seed: int = 0):
    """Factory: a Conv-BN-SiLU block, example input 1x3x16x16 (importable as test_exporters:small_torch)."""
    import torch

    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.SiLU(),
                            torch.nn.Conv2d(8, 4, 1))
    with torch.no_grad():
        m[1].running_mean.uniform_(-0.2, 0.2)
        m[1].running_var.uniform_(0.5, 1.5)
    return m.eval(), (torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(seed)),)


def _ort(path, feed):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return s.run(None, feed)


@pytest.mark.parametrize("dynamo", [True, False])
def test_export_torch_matches_eager_and_records_origin(tmp_path, dynamo):
    import torch

    from exporters.torch_export import export_torch

    m, ex = small_torch()
    r = export_torch(m, ex, tmp_path / "m.onnx", dynamo=dynamo, factory="test_exporters:small_torch",
                     factory_kwargs={"seed": 0})
    assert r.framework == "torch" and r.exporter.endswith("dynamo" if dynamo else "torchscript")
    assert r.opset == (20 if dynamo else 17) and r.versions["torch"].startswith("2.")
    model = onnx.load(str(r.path))
    assert not list(tmp_path.glob("*.data"))  # weights inside the file
    assert read_origin(model) == r.origin == {"framework": "torch", "exporter": r.exporter, "opset": r.opset,
                                              "factory": "test_exporters:small_torch", "kwargs": {"seed": 0}}
    (got,) = _ort(r.path, {model.graph.input[0].name: ex[0].numpy()})
    with torch.no_grad():
        want = m(*ex).numpy()
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-5, f"ORT vs eager max relative error {err:.2e}"
    again = export_torch(m, ex, tmp_path / "m2.onnx", dynamo=dynamo)
    assert again.cached and again.seconds == 0.0
    assert onnx.load(str(again.path)).graph == model.graph


def test_export_torch_bad_module_names_it(tmp_path):
    import torch

    from exporters.torch_export import export_torch

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(ExportError, match="DataDependent"):
        export_torch(DataDependent(), (torch.rand(2),), tmp_path / "bad.onnx", cache=False)
    assert not (tmp_path / "bad.onnx").exists()
    with pytest.raises(ExportError, match="torch.nn.Module"):
        export_torch(object(), (), tmp_path / "bad.onnx")
    with pytest.raises(ExportError, match="opset >= 18"):
        export_torch(torch.nn.ReLU(), (torch.rand(2),), tmp_path / "bad.onnx", opset=13)


def test_export_keras_matches_keras(tmp_path):
    from test_native import keras_cnn

    from exporters.tf_export import export_keras

    m, ex = keras_cnn()
    r = export_keras(m, tmp_path / "k.onnx", factory="test_native:keras_cnn")
    assert r.exporter == "tf2onnx" and r.opset == 17 and read_origin(onnx.load(str(r.path)))["factory"]
    model = onnx.load(str(r.path))
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 32, 32, 3]  # NHWC kept
    (got,) = _ort(r.path, {model.graph.input[0].name: ex[0]})
    want = np.asarray(m(ex[0], training=False))
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-5, f"ORT vs Keras max relative error {err:.2e}"
    with pytest.raises(ExportError, match="keras.Model"):
        export_keras("not a model", tmp_path / "x.onnx")


def test_load_factory_errors():
    with pytest.raises(ExportError, match="module:function"):
        load_factory("nocolon")
    with pytest.raises(ExportError, match="cannot import module 'no_such_mod'"):
        load_factory("no_such_mod:f")
    with pytest.raises(ExportError, match="no callable 'nope'"):
        load_factory("test_exporters:nope")
    m, ex = load_factory("test_exporters:small_torch", {"seed": 1})
    assert tuple(ex[0].shape) == (1, 3, 16, 16)


def test_map_cli_reports_and_writes(tmp_path, capsys):
    from anpred.cli import main
    from anpred.instrument import instrument_model
    from anpred.manifest import AnchorManifest
    from exporters.torch_export import export_torch

    m, ex = small_torch()
    r = export_torch(m, ex, tmp_path / "m.onnx", factory="test_exporters:small_torch")
    am, man = instrument_model(onnx.load(str(r.path)), stages=3, source_path=str(r.path))
    man.to_model(am)
    onnx.save(am, str(tmp_path / "a.onnx"))
    assert main(["map", str(tmp_path / "a.onnx"), "--write", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    n = len(man.anchors)
    assert f"torch-native: {n} exact, 0 equivalent, 0 unmapped of {n}" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["summary"]["torch-native"]["exact_fraction"] == 1.0
    stored = AnchorManifest.from_model(onnx.load(str(tmp_path / "a.onnx")))
    assert all(a.native["torch-native"]["status"] == "exact" for a in stored.anchors)
    # bad input: no manifest, unknown factory -> exit 2 with one clear line
    assert main(["map", str(r.path)]) == 2
    assert "no anchor manifest" in capsys.readouterr().err
    assert main(["map", str(tmp_path / "a.onnx"), "--factory", "no_such_mod:f"]) == 2
    assert "cannot import module 'no_such_mod'" in capsys.readouterr().err
