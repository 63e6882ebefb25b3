"""Small real models for the pipeline tests (helpers, not tests).

- :func:`small_cnn`: a factory (``pipeline_factories:small_cnn``) returning a seeded PyTorch CNN and
  its example input, the form ``anpred test module:function`` takes.
- :func:`small_keras`: a factory (``pipeline_factories:small_keras``) returning a seeded Keras CNN
  and its example input (NCHW), for the Keras path (tf2onnx export, ``tf-native``).
- :func:`softplus_onnx`: an ONNX CNN whose Softplus sees inputs around -15, where OpenVINO 2026.4.1's
  CPU Softplus is wrong (docs/oracle.md: 0 or -1.9e-6 instead of 3e-7..2e-9), so a real run flags
  openvino and the HTML report has detail plots.
- :func:`avgpool_net_onnx`: an ONNX CNN (opset 19) whose AveragePool has count_include_pad=1 and
  padding at the end of H and W only, which ONNX Runtime 1.21.0 to 1.24.4 compute wrong (the last
  row and column divided by 6 instead of 9; right in 1.20.1 and from 1.25.0 on): the campaign's
  version bisection test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def small_cnn(width: int = 8, seed: int = 0):
    """Factory: ``(torch.nn.Module in eval mode, (float32 tensor (1, 3, 32, 32),))``. Conv-BN-ReLU,
    a stride-2 Conv-SiLU, a residual block, global pooling and a linear head (10 outputs)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv2d(c, c, 3, padding=1)
            self.bn = nn.BatchNorm2d(c)
            self.act = nn.ReLU()

        def forward(self, x):
            return x + self.act(self.bn(self.conv(x)))

    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
            self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.SiLU())
            self.block = Block(2 * width)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.head = nn.Linear(2 * width, 10)

        def forward(self, x):
            x = self.block(self.down(self.stem(x)))
            return self.head(torch.flatten(self.pool(x), 1))

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN()
        for m in model.modules():  # non-trivial BatchNorm statistics
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
        x = torch.rand(1, 3, 32, 32)
    return model.eval(), (x,)


def small_keras(imgsz: int = 32, seed: int = 0):
    """Factory: ``(keras.Model, (float32 array (1, 3, imgsz, imgsz),))``, a seeded Keras CNN on an
    NCHW input (batch fixed to 1): Permute to NHWC, Conv-BN-ReLU, a stride-2 Conv (swish), global
    average pooling and a Dense head (10 outputs). BatchNorm statistics are set to non-trivial seeded
    values; the example input is seeded uniform in [0, 1)."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input(shape=(3, imgsz, imgsz), batch_size=1, name="images")
    x = keras.layers.Permute((2, 3, 1), name="to_nhwc")(inp)
    x = keras.layers.Conv2D(8, 3, padding="same", name="stem_conv")(x)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="swish", name="down")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    out = keras.layers.Dense(10, name="head")(x)
    model = keras.Model(inp, out, name="small_keras")
    rng = np.random.default_rng(seed)
    bn = model.get_layer("stem_bn")
    gamma, beta, mean, var = bn.get_weights()
    bn.set_weights(
        [
            gamma,
            beta,
            rng.uniform(-0.2, 0.2, mean.shape).astype(np.float32),
            rng.uniform(0.5, 1.5, var.shape).astype(np.float32),
        ]
    )
    x0 = rng.random((1, 3, imgsz, imgsz), dtype=np.float32)
    return model, (x0,)


def softplus_onnx(path: Path, bias: float = -15.0, name: str = "softplus_cnn") -> Path:
    """Write the Softplus CNN (input ``x`` float32 (1, 3, 16, 16), output ``y`` (1, 4, 16, 16), opset
    17, graph ``name``): conv -> relu -> conv (bias ``bias``: -15 puts the Softplus inputs around -15,
    where OpenVINO 2026.4.1's CPU Softplus is wrong; 0 around 0) -> Softplus -> conv -> relu -> conv.
    The weights are seeded: the same for every ``bias``. Returns ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name, x, y, cin, cout, bias=0.0, scale=None):
        w = (rng.standard_normal((cout, cin, 3, 3)) * (scale or 1.0 / np.sqrt(cin * 9))).astype(np.float32)
        b = (bias + 0.05 * rng.standard_normal(cout)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        nodes.append(
            helper.make_node(
                "Conv", [x, f"{name}.w", f"{name}.b"], [y], name=name, kernel_shape=[3, 3], pads=[1, 1, 1, 1]
            )
        )

    conv("c0", "x", "t0", 3, 8)
    nodes.append(helper.make_node("Relu", ["t0"], ["r0"], name="relu0"))
    conv("c1", "r0", "t1", 8, 8, bias=bias, scale=0.3)
    nodes.append(helper.make_node("Softplus", ["t1"], ["sp"], name="softplus"))
    conv("c2", "sp", "t2", 8, 8)
    nodes.append(helper.make_node("Relu", ["t2"], ["r2"], name="relu2"))
    conv("c3", "r2", "y", 8, 4)
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


_CLI_RUNS: dict[str, tuple[int, str, str, Path]] = {}


def avgpool_net_onnx(path: Path) -> Path:
    """Write the AveragePool CNN (input ``x`` float32 (1, 3, 16, 16), output ``y`` (1, 4, 8, 8)):
    conv -> relu -> AveragePool(3x3, stride 2, pads [0, 0, 1, 1], count_include_pad=1) -> conv ->
    relu, opset 19. Returns ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((4, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    w2 = (rng.standard_normal((4, 4, 3, 3)) / np.sqrt(36)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "AveragePool",
            ["r1"],
            ["p"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[0, 0, 1, 1],
            count_include_pad=1,
            name="avgpool",
        ),
        helper.make_node("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["y"], name="relu2"),
    ]
    g = helper.make_graph(
        nodes,
        "avgpool_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=8)
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


def cli_run(key: str, root: Path, argv: list[str]) -> tuple[int, str, str, Path]:
    """Run ``anpred test ARGV -o root/key`` in this process once per session (shared by the test
    files); returns ``(exit status, stdout, stderr, out folder)``."""
    import contextlib
    import io

    from anpred.cli import main

    if key not in _CLI_RUNS:
        out = Path(root) / key
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            rc = main(["test", *argv, "-o", str(out), "--quiet"])
        _CLI_RUNS[key] = (rc, so.getvalue(), se.getvalue(), out)
    return _CLI_RUNS[key]


def softplus_cli(root: Path) -> tuple[int, str, str, Path]:
    """``anpred test softplus.onnx`` on ort, openvino, onnx-reference and torch (7 stages)."""
    model = softplus_onnx(Path(root) / "softplus.onnx")
    return cli_run("softplus", root, [str(model), "--backends", "ort,openvino,onnx-reference,torch", "--stages", "7"])
