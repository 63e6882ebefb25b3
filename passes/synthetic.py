"""Synthetic ONNX graphs of any size with skip connections, for tests and benchmarks of the passes.

``skip_chain_model(num_nodes, kind=...)`` builds ``x: float32[1, C, 8, 8]`` through residual blocks:

- ``kind="conv"`` (a ResNet-like CNN): ``y = Relu(Add(Conv(Relu(Conv(x))), x))`` (5 nodes), each
  convolution 3x3, C -> C, with its own weights (normal, std 0.005, so 10,000 nodes stay finite);
- ``kind="elementwise"`` (the least work per node for load/save, the hardest case for a pass written
  in Python): ``y = Mean(Relu(Add(Mul(x, a), b)), x)`` (4 nodes) with small shared initializers.

Every ``long_every``-th block also averages with the input of the block ``long_every`` blocks back (a
long skip, one ``Mean`` node, so values stay finite over thousands of blocks), so cuts between those points are 2
tensors wide and the single-tensor cuts are the long-skip outputs. The model passes ``onnx.checker`` and runs in ONNX
Runtime.
"""

from __future__ import annotations

__all__ = ["skip_chain_model"]


def skip_chain_model(
    num_nodes: int = 10_500, channels: int = 8, long_every: int = 8, seed: int = 0, kind: str = "conv"
):
    """Return an ``onnx.ModelProto`` (opset 17, IR 8) with at least ``num_nodes`` nodes.

    Raises:
        ValueError: unknown ``kind`` (``"conv"`` or ``"elementwise"``).
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if kind not in ("conv", "elementwise"):
        raise ValueError(f"unknown kind {kind!r}; known: conv, elementwise")
    rng = np.random.default_rng(seed)
    c = channels
    shape = [1, c, 8, 8]
    inits = []
    if kind == "elementwise":
        inits += [
            numpy_helper.from_array((1.0 + 0.01 * rng.standard_normal((1, c, 1, 1))).astype(np.float32), f"a{k}")
            for k in range(4)
        ]
        inits += [
            numpy_helper.from_array((0.01 * rng.standard_normal((1, c, 1, 1))).astype(np.float32), f"b{k}")
            for k in range(4)
        ]
    nodes = []
    x = "x"
    anchor_in = x
    blk = 0
    while len(nodes) < num_nodes:
        p = f"/layer{blk}"
        if kind == "conv":
            for j in (1, 2):
                inits.append(
                    numpy_helper.from_array(
                        (0.005 * rng.standard_normal((c, c, 3, 3))).astype(np.float32), f"layer{blk}.conv{j}.weight"
                    )
                )
                inits.append(
                    numpy_helper.from_array(
                        (0.01 * rng.standard_normal(c)).astype(np.float32), f"layer{blk}.conv{j}.bias"
                    )
                )
            nodes += [
                helper.make_node(
                    "Conv",
                    [x, f"layer{blk}.conv1.weight", f"layer{blk}.conv1.bias"],
                    [f"{p}/conv1/Conv_output_0"],
                    name=f"{p}/conv1/Conv",
                    kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1],
                ),
                helper.make_node(
                    "Relu", [f"{p}/conv1/Conv_output_0"], [f"{p}/relu1/Relu_output_0"], name=f"{p}/relu1/Relu"
                ),
                helper.make_node(
                    "Conv",
                    [f"{p}/relu1/Relu_output_0", f"layer{blk}.conv2.weight", f"layer{blk}.conv2.bias"],
                    [f"{p}/conv2/Conv_output_0"],
                    name=f"{p}/conv2/Conv",
                    kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1],
                ),
                helper.make_node("Add", [f"{p}/conv2/Conv_output_0", x], [f"{p}/Add_output_0"], name=f"{p}/Add"),
                helper.make_node("Relu", [f"{p}/Add_output_0"], [f"{p}/relu2/Relu_output_0"], name=f"{p}/relu2/Relu"),
            ]
            x = f"{p}/relu2/Relu_output_0"
        else:
            nodes += [
                helper.make_node("Mul", [x, f"a{blk % 4}"], [f"{p}/Mul_output_0"], name=f"{p}/Mul"),
                helper.make_node("Add", [f"{p}/Mul_output_0", f"b{blk % 4}"], [f"{p}/Bias_output_0"], name=f"{p}/Bias"),
                helper.make_node("Relu", [f"{p}/Bias_output_0"], [f"{p}/Relu_output_0"], name=f"{p}/Relu"),
                helper.make_node("Mean", [f"{p}/Relu_output_0", x], [f"{p}/Mean_output_0"], name=f"{p}/Mean"),
            ]
            x = f"{p}/Mean_output_0"
        blk += 1
        if blk % long_every == 0:
            nodes.append(helper.make_node("Mean", [x, anchor_in], [f"{p}/LongSkip_output_0"], name=f"{p}/LongSkip"))
            x = anchor_in = f"{p}/LongSkip_output_0"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="/output/Identity"))
    graph = helper.make_graph(
        nodes,
        f"skip_chain_{kind}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="anpred-synthetic")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
