"""Exporters (torch dynamo/TorchScript, Keras via tf2onnx) and the ``anpred map`` command, on real
exports run in ONNX Runtime."""

import json

import numpy as np
import onnx
import pytest

from exporters import ExportError, load_factory, read_origin

from isa_reasons import FP32_BOUND
from ort_session import ort_outputs


def small_torch(seed: int = 0):
    """Factory: a Conv-BN-SiLU block, example input 1x3x16x16 (importable as test_exporters:small_torch)."""
    import torch

    torch.manual_seed(seed)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.SiLU(), torch.nn.Conv2d(8, 4, 1)
    )
    with torch.no_grad():
        m[1].running_mean.uniform_(-0.2, 0.2)
        m[1].running_var.uniform_(0.5, 1.5)
    return m.eval(), (torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(seed)),)


def raising_factory(size: int = 4):
    """Factory that fails (importable as test_exporters:raising_factory): bad input for ``anpred map``."""
    raise ValueError(f"no weights for size {size}")


def _torch_classes():
    """Modules whose source lives in this file (the exporters name a submodule by its forward's source)."""
    import torch

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    class Nested(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = torch.nn.Conv2d(3, 3, 1)
            self.body = torch.nn.Sequential(torch.nn.ReLU(), DataDependent())

        def forward(self, x):
            return self.body(self.pre(x))

    class NumpyTanh(torch.nn.Module):
        def forward(self, x):
            return torch.from_numpy(np.tanh(x.detach().numpy()))

    class WithNumpy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)
            self.squash = NumpyTanh()

        def forward(self, x):
            return self.squash(self.conv(x))

    return DataDependent, Nested, WithNumpy


@pytest.mark.isa_independent(FP32_BOUND)
@pytest.mark.parametrize("dynamo", [True, False])
def test_export_torch_matches_eager_and_records_origin(tmp_path, dynamo):
    import torch

    from exporters.torch_export import export_torch

    m, ex = small_torch()
    r = export_torch(
        m, ex, tmp_path / "m.onnx", dynamo=dynamo, factory="test_exporters:small_torch", factory_kwargs={"seed": 0}
    )
    assert r.framework == "torch" and r.exporter.endswith("dynamo" if dynamo else "torchscript")
    assert r.opset == (20 if dynamo else 17) and r.versions["torch"].startswith("2.")
    model = onnx.load(str(r.path))
    assert not list(tmp_path.glob("*.data"))  # weights inside the file
    assert (
        read_origin(model)
        == r.origin
        == {
            "framework": "torch",
            "exporter": r.exporter,
            "opset": r.opset,
            "factory": "test_exporters:small_torch",
            "kwargs": {"seed": 0},
        }
    )
    (got,) = ort_outputs(r.path, {model.graph.input[0].name: ex[0].numpy()}, quiet=True).values()
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

    DataDependent, _, _ = _torch_classes()
    with pytest.raises(ExportError, match="DataDependent"):
        export_torch(DataDependent(), (torch.rand(2),), tmp_path / "bad.onnx", cache=False)
    assert not (tmp_path / "bad.onnx").exists()
    with pytest.raises(ExportError, match="torch.nn.Module"):
        export_torch(object(), (), tmp_path / "bad.onnx")
    with pytest.raises(ExportError, match="opset >= 18"):
        export_torch(torch.nn.ReLU(), (torch.rand(2),), tmp_path / "bad.onnx", opset=13)


@pytest.mark.isa_independent(FP32_BOUND)
def test_export_keras_matches_keras(tmp_path):
    from test_native import keras_cnn

    from exporters.tf_export import export_keras

    m, ex = keras_cnn()
    r = export_keras(m, tmp_path / "k.onnx", factory="test_native:keras_cnn")
    assert r.exporter == "tf2onnx" and r.opset == 17 and read_origin(onnx.load(str(r.path)))["factory"]
    model = onnx.load(str(r.path))
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 32, 32, 3]  # NHWC kept
    (got,) = ort_outputs(r.path, {model.graph.input[0].name: ex[0]}, quiet=True).values()
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


def test_dynamo_error_names_the_failing_nested_submodule(tmp_path):
    """The dynamo exporter's error names the submodule whose forward failed ('body.1', nested in a
    Sequential), its source line and torch.export's real error, not only the root class and torch's
    "Failed to export the model with torch.export" banner."""
    import torch

    from exporters.torch_export import export_torch

    _, Nested, _ = _torch_classes()
    with pytest.raises(ExportError) as info:
        export_torch(Nested(), (torch.rand(1, 3, 4, 4),), tmp_path / "bad.onnx", cache=False)
    msg = str(info.value)
    assert "Nested" in msg and "submodule 'body.1' (DataDependent)" in msg, msg
    assert "x.sum() > 0" in msg and "test_exporters.py:" in msg, msg
    assert "data-dependent" in msg and "Failed to export the model" not in msg, msg
    assert "\n" not in msg and not (tmp_path / "bad.onnx").exists()


@pytest.mark.isa_independent(FP32_BOUND)
def test_torchscript_export_with_numpy_in_forward_is_refused(tmp_path):
    """TorchScript freezes a NumPy detour into a Constant (no graph input, output independent of the
    input, only TracerWarnings): refused with the submodule named. Dynamo traces the NumPy call as
    torch ops: that export is kept and computes the module."""
    import torch

    from exporters.torch_export import export_torch

    _, _, WithNumpy = _torch_classes()
    torch.manual_seed(0)
    m = WithNumpy().eval()
    x = torch.rand(1, 3, 5, 5)
    with pytest.raises(ExportError) as info:
        export_torch(m, (x,), tmp_path / "ts.onnx", dynamo=False, cache=False)
    msg = str(info.value)
    assert "no inputs" in msg and "submodule 'squash' (NumpyTanh)" in msg, msg
    assert "TracerWarning: Converting a tensor to a NumPy array" in msg, msg
    assert not (tmp_path / "ts.onnx").exists()
    r = export_torch(m, (x,), tmp_path / "dyn.onnx", dynamo=True, cache=False)
    model = onnx.load(str(r.path))
    (got,) = ort_outputs(r.path, {model.graph.input[0].name: x.numpy()}, quiet=True).values()
    x2 = torch.rand(1, 3, 5, 5)  # another input: a frozen trace would return the first result
    (got2,) = ort_outputs(r.path, {model.graph.input[0].name: x2.numpy()}, quiet=True).values()
    with torch.no_grad():
        want, want2 = m(x).numpy(), m(x2).numpy()
    assert np.abs(got - want).max() < 1e-6 and np.abs(got2 - want2).max() < 1e-6
    assert np.abs(want2 - want).max() > 0.05


def test_export_keras_unsupported_op_names_layer_and_op(tmp_path):
    """tf2onnx leaves TensorFlow's Svd / FFT2D in the default domain and only logs "not supported":
    every node is checked against the ONNX schema registry, the error names the Keras layer and op."""
    import keras
    import tensorflow as tf

    from exporters.tf_export import export_keras, unsupported_nodes

    inp = keras.Input((4, 4), batch_size=1, name="m")
    x = keras.layers.Dense(4, name="dense")(inp)
    s = keras.layers.Lambda(lambda t: tf.linalg.svd(t, compute_uv=False), name="singular_values")(x)
    f = keras.layers.Lambda(lambda t: tf.math.abs(tf.signal.fft2d(tf.cast(t, tf.complex64))), name="spectrum")(x)
    model = keras.Model(inp, [keras.layers.Dense(2, name="head")(s), f], name="svdnet")
    with pytest.raises(ExportError) as info:
        export_keras(model, tmp_path / "svd.onnx", cache=False)
    msg = str(info.value)
    assert "layer 'singular_values' -> ai.onnx:Svd" in msg and "layer 'spectrum' -> ai.onnx:FFT2D" in msg, msg
    assert not (tmp_path / "svd.onnx").exists()
    from test_native import keras_cnn

    good = export_keras(keras_cnn()[0], tmp_path / "k.onnx")
    assert unsupported_nodes(onnx.load(str(good.path))) == []


def test_factory_that_raises_is_one_clear_error(tmp_path, capsys):
    from anpred.cli import main

    with pytest.raises(
        ExportError,
        match=r"factory 'test_exporters:raising_factory' raised ValueError .*"
        r"no weights for size 3",
    ) as info:
        load_factory("test_exporters:raising_factory", {"size": 3})
    assert isinstance(info.value.__cause__, ValueError)
    m, ex = small_torch()
    from anpred.instrument import instrument_model
    from exporters.torch_export import export_torch

    r = export_torch(m, ex, tmp_path / "m.onnx", factory="test_exporters:small_torch")
    am, man = instrument_model(onnx.load(str(r.path)), stages=2, source_path=str(r.path))
    onnx.save(am, str(tmp_path / "a.onnx"))
    assert main(["map", str(tmp_path / "a.onnx"), "--factory", "test_exporters:raising_factory"]) == 2
    err = capsys.readouterr().err
    assert "raising_factory" in err and "no weights for size 4" in err and "Traceback" not in err


def test_an_edited_forward_is_exported_again(tmp_path, monkeypatch):
    """A reviewer's stale export: the factory's ``forward`` changed from GELU to SiLU between two runs
    (same classes, repr and weights) and the cached ONNX export still held the ``Gelu``."""
    import sys

    import torch

    from exporters.torch_export import export_torch

    src = (
        "import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n\n    def forward(self, x):\n"
        "        return torch.nn.functional.{act}(self.fc(x))\n"
    )
    monkeypatch.setenv("ANPRED_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    ops = []
    for i, act in enumerate(["gelu", "silu", "silu"]):
        folder = tmp_path / f"v{i}"
        folder.mkdir()
        (folder / "revnet.py").write_text(src.format(act=act))
        sys.modules.pop("revnet", None)
        monkeypatch.syspath_prepend(str(folder))
        import revnet

        torch.manual_seed(0)
        net = revnet.Net().eval()
        path = export_torch(net, (torch.ones(1, 4),), tmp_path / f"out{i}.onnx", dynamo=False).path
        ops.append({n.op_type for n in onnx.load(str(path)).graph.node})
        sys.path.remove(str(folder))
    assert "Gelu" in ops[0] or "Erf" in ops[0]
    assert not {"Gelu", "Erf"} & ops[1] and ({"Sigmoid", "Mul"} <= ops[1])
    assert ops[2] == ops[1]
