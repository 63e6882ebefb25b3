"""Networks built per operator class: the classes converters lack or
mishandle, each with seeded random weights, for ``tests/test_converter_coverage.py`` and
``benchmarks/coverage.py`` (:data:`NETWORKS`, :func:`build`, :func:`feeds`).

- :func:`recurrent_net`: LSTM/GRU/RNN forward, reverse, bidirectional, with and without initial
  states (graph inputs and initializers), peepholes, clip, ``input_forget``, ``linear_before_reset``
  0/1, non-default activations (opset 14);
- :func:`torch_recurrent_net`: conv + LSTM(h0, c0) + bi-GRU + 2-layer RNN exported from torch (the
  voice-activity layout: states as graph inputs);
- :func:`misc_net`: GlobalMaxPool, GlobalLpPool, LpPool, MaxPool/AveragePool with ``SAME_*``,
  ``ceil_mode=1``, ``count_include_pad`` 0/1; 18 graph outputs with TF-style names, an Identity
  duplicate, a graph-input passthrough, a constant output; uint8/int64/int32 inputs; If (computed and
  constant condition) and Loop (constant trip count, scan output) (opset 17).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = [
    "NETWORKS",
    "build",
    "feeds",
    "misc_net",
    "recurrent_net",
    "rnn_node",
    "torch_recurrent_net",
    "RECURRENT_OUTPUTS",
]

RECURRENT_OUTPUTS = [f"{n}.{o}" for n in ("lstm_f", "lstm_b", "lstm_r") for o in ("Y", "Y_h", "Y_c")] + [
    f"{n}.{o}" for n in ("gru_r", "gru_b", "gru_f", "rnn_f", "rnn_b", "rnn_r") for o in ("Y", "Y_h")
]


def rnn_node(op, name, x, F, H, direction, rng, states=(), lbr=None, P=False, B=2, **attrs):
    """One recurrent node with seeded weights: (node, initializers, [outputs]).

    The parameters mirror the ONNX RNN/LSTM/GRU schema (an external schema: tests/test_layout.py
    allows this signature its length): ``op`` the operator, ``x`` input ``X``, ``F`` its input size
    (``W``'s last dimension), ``H`` attribute ``hidden_size``, ``direction`` attribute ``direction``,
    ``states`` inputs ``initial_h``/``initial_c`` (graph input names, or ``"init"``: seeded
    initializers of batch ``B``), ``P`` input ``P`` (LSTM peepholes), ``lbr`` attribute
    ``linear_before_reset`` (GRU), ``attrs`` the other attributes (``clip``, ``activations``,
    ``input_forget``...); ``name`` prefixes the node's values and ``rng`` (``numpy.random.Generator``)
    draws the float32 weights.
    """
    from onnx import helper, numpy_helper

    D = 2 if direction == "bidirectional" else 1
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (D, G * H, F)).astype(np.float32), f"{name}.W"),
        numpy_helper.from_array(rng.normal(0, 0.5, (D, G * H, H)).astype(np.float32), f"{name}.R"),
        numpy_helper.from_array(rng.normal(0, 0.5, (D, 2 * G * H)).astype(np.float32), f"{name}.B"),
    ]
    ins = [x, f"{name}.W", f"{name}.R", f"{name}.B", ""]
    for s in states:  # "h0"/"c0" graph inputs, or "init" for initializer states
        if s == "init":
            for k in ["h", "c"] if op == "LSTM" else ["h"]:
                inits.append(numpy_helper.from_array(rng.normal(0, 1, (D, B, H)).astype(np.float32), f"{name}.{k}0"))
                ins.append(f"{name}.{k}0")
        else:
            ins.append(s)
    if P:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (D, 3 * H)).astype(np.float32), f"{name}.P"))
        ins += [""] * (7 - len(ins)) + [f"{name}.P"]
    outs = [f"{name}.Y", f"{name}.Y_h"] + ([f"{name}.Y_c"] if op == "LSTM" else [])
    if lbr is not None:
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, ins, outs, name=name, hidden_size=H, direction=direction, **attrs)
    return node, inits, outs


def recurrent_net():
    """x (3, 2, 4), h0/c0 (1, 2, 3) -> nine recurrent nodes (LSTM x3, GRU x3, RNN x3) covering every
    direction, initial states as inputs/initializers/absent, peepholes + clip, input_forget,
    linear_before_reset 0/1, non-default activations; one chain (bi-LSTM Y -> GRU). Opset 17."""
    import onnx
    from onnx import TensorProto as TP, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []

    def add(*a, **k):
        n, i, o = rnn_node(*a, rng=rng, **k)
        nodes.append(n)
        inits.extend(i)
        outs.extend(o)

    add("LSTM", "lstm_f", "x", 4, 3, "forward", states=("h0", "c0"), P=True, clip=0.7)
    add("LSTM", "lstm_b", "x", 4, 3, "bidirectional")
    add("LSTM", "lstm_r", "x", 4, 3, "reverse", states=("init",), input_forget=1)
    nodes += [
        helper.make_node("Transpose", ["lstm_b.Y"], ["lstm_b.t"], name="chain_t", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["lstm_b.t", "chain_shape"], ["chain"], name="chain_r"),
    ]
    inits.append(numpy_helper.from_array(np.array([3, 2, 6], np.int64), "chain_shape"))
    add("GRU", "gru_r", "chain", 6, 3, "reverse", states=("h0",), lbr=0)
    add(
        "GRU",
        "gru_b",
        "x",
        4,
        3,
        "bidirectional",
        states=("init",),
        lbr=1,
        activations=["Sigmoid", "Relu", "HardSigmoid", "Tanh"],
        activation_alpha=[0.3],
        activation_beta=[0.4],
        clip=1.0,
    )
    add("GRU", "gru_f", "x", 4, 3, "forward", lbr=1)
    add("RNN", "rnn_f", "x", 4, 3, "forward", states=("h0",), activations=["Relu"])
    add("RNN", "rnn_b", "x", 4, 3, "bidirectional")
    add("RNN", "rnn_r", "x", 4, 3, "reverse", states=("init",))
    g = helper.make_graph(
        nodes,
        "recurrent",
        [
            helper.make_tensor_value_info("x", TP.FLOAT, [3, 2, 4]),
            helper.make_tensor_value_info("h0", TP.FLOAT, [1, 2, 3]),
            helper.make_tensor_value_info("c0", TP.FLOAT, [1, 2, 3]),
        ],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs],
        inits,
    )
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    return m


def torch_recurrent_net(path: Path):
    """A torch model in the voice-activity layout, exported with the TorchScript exporter (opset 17):
    x (2, 2, 7) -> Conv1d -> permute -> LSTM with (h0, c0) graph inputs -> batch-first bi-GRU ->
    2-layer ReLU RNN -> Linear -> sigmoid; outputs the probabilities and every final state."""
    import onnx
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(2, 6, 3, padding=1)
            self.lstm = torch.nn.LSTM(6, 5)
            self.gru = torch.nn.GRU(5, 4, batch_first=True, bidirectional=True)
            self.rnn = torch.nn.RNN(8, 3, nonlinearity="relu", num_layers=2)
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x, h0, c0):
            f = torch.relu(self.conv(x)).permute(2, 0, 1)
            y, (h, c) = self.lstm(f, (h0, c0))
            g, hg = self.gru(y.transpose(0, 1))
            r, hr = self.rnn(g.transpose(0, 1))
            return torch.sigmoid(self.fc(r)), h, c, hg, hr

    args = (torch.randn(2, 2, 7), torch.randn(1, 2, 5), torch.randn(1, 2, 5))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "batch_size other than 1 ... define the initial states as inputs"
        torch.onnx.export(
            Net().eval(),
            args,
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x", "h0", "c0"],
            output_names=["prob", "h", "c", "hg", "hr"],
        )
    return onnx.load(str(path))


def _misc_initializers(rng) -> list:
    """The initializers of :func:`misc_net` (weights drawn from ``rng`` in this order)."""
    from onnx import numpy_helper

    arr = numpy_helper.from_array
    inits = [
        arr(rng.normal(0, 0.02, (4, 3, 3, 3)).astype(np.float32), "w1"),
        arr(rng.normal(0, 0.3, (2, 4, 1, 1)).astype(np.float32), "w_cls"),
        arr(rng.normal(0, 1, (10, 6)).astype(np.float32), "emb"),
        arr(rng.normal(0, 0.5, (6, 5)).astype(np.float32), "wt"),
        arr(np.array(0.01, np.float32), "scale"),
        arr(np.arange(6, dtype=np.float32).reshape(1, 6), "const_a"),
        arr(rng.normal(0, 0.5, (4, 4)).astype(np.float32), "wv"),
        arr(np.array(0, np.float32), "zero"),
        arr(np.array(3, np.int64), "M"),
        arr(np.array(True), "true"),
        arr(np.array([True]), "const_cond"),
    ]
    return inits


def _misc_pools() -> list:
    """The pooling nodes of :func:`misc_net` on ``fr`` (each its own graph output): global max and Lp,
    Lp, max and average pooling with SAME_UPPER/SAME_LOWER padding, ceil mode, count_include_pad and
    asymmetric pads."""
    from onnx import helper

    N = helper.make_node
    return [
        N("GlobalMaxPool", ["fr"], ["gmp"], name="gmp"),
        N("GlobalLpPool", ["fr"], ["glp"], name="glp", p=2),
        N("LpPool", ["fr"], ["lp"], name="lp", kernel_shape=[2, 2], strides=[2, 2], p=2),
        N("MaxPool", ["fr"], ["mp_su"], name="mp_su", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
        N("MaxPool", ["fr"], ["mp_sl"], name="mp_sl", kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
        N("MaxPool", ["fr"], ["mp_ceil"], name="mp_ceil", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        N("AveragePool", ["fr"], ["ap_su"], name="ap_su", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
        N(
            "AveragePool",
            ["fr"],
            ["ap_sl1"],
            name="ap_sl1",
            kernel_shape=[2, 2],
            strides=[2, 2],
            auto_pad="SAME_LOWER",
            count_include_pad=1,
        ),
        N(
            "AveragePool",
            ["fr"],
            ["ap_ceil0"],
            name="ap_ceil0",
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            ceil_mode=1,
        ),
        N(
            "AveragePool",
            ["fr"],
            ["ap_ceil1"],
            name="ap_ceil1",
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            ceil_mode=1,
            count_include_pad=1,
        ),
        N("AveragePool", ["fr"], ["ap_asym"], name="ap_asym", kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0]),
    ]


def _misc_subgraphs() -> tuple:
    """``(then, else, constant then, constant else, loop body)`` graphs of :func:`misc_net`'s two ``If``
    and its ``Loop`` (over the outer values ``a`` and ``wv``)."""
    from onnx import TensorProto as TP, helper

    N = helper.make_node
    then_g = helper.make_graph(
        [N("MatMul", ["a", "wv"], ["t_out"], name="then_mm")],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TP.FLOAT, [2, 4])],
    )
    else_g = helper.make_graph(
        [N("Neg", ["a"], ["e_neg"], name="else_neg"), N("Relu", ["e_neg"], ["e_out"], name="else_relu")],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TP.FLOAT, [2, 4])],
    )
    const_then = helper.make_graph(
        [N("Sigmoid", ["a"], ["ct_out"], name="cthen_sig")],
        "cthen",
        [],
        [helper.make_tensor_value_info("ct_out", TP.FLOAT, [2, 4])],
    )
    const_else = helper.make_graph(
        [N("Tanh", ["a"], ["ce_out"], name="celse_tanh")],
        "celse",
        [],
        [helper.make_tensor_value_info("ce_out", TP.FLOAT, [2, 4])],
    )
    body = helper.make_graph(
        [
            N("MatMul", ["v_in", "wv"], ["mm"], name="body_mm"),
            N("Tanh", ["mm"], ["v_out"], name="body_tanh"),
            N("ReduceMax", ["v_out"], ["row_max"], name="body_max", axes=[1], keepdims=0),
            N("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TP.INT64, []),
            helper.make_tensor_value_info("cond_in", TP.BOOL, []),
            helper.make_tensor_value_info("v_in", TP.FLOAT, [2, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TP.BOOL, []),
            helper.make_tensor_value_info("v_out", TP.FLOAT, [2, 4]),
            helper.make_tensor_value_info("row_max", TP.FLOAT, [2]),
        ],
    )
    return then_g, else_g, const_then, const_else, body


def misc_net():
    """Pooling, multi-output heads, integer inputs and control flow in one opset-17 graph (one
    conversion per converter). Inputs: img uint8 (1, 3, 9, 10), tok int64 (1, 7), cnt int32 (1, 5),
    v float32 (2, 4). 18 graph outputs."""
    import onnx
    from onnx import TensorProto as TP, helper

    rng = np.random.default_rng(0)
    N = helper.make_node
    inits = _misc_initializers(rng)
    pools = _misc_pools()
    then_g, else_g, const_then, const_else, body = _misc_subgraphs()
    nodes = [
        N("Cast", ["img"], ["imgf"], name="cast_img", to=TP.FLOAT),
        N("Conv", ["imgf", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        N("Relu", ["c1"], ["fr"], name="relu1"),
        *pools,
        N("Conv", ["fr", "w_cls"], ["head/cls:0"], name="cls"),
        N("Sigmoid", ["head/cls:0"], ["cls_s"], name="cls_sig"),
        N("Identity", ["cls_s"], ["cls_s_copy"], name="cls_copy"),
        N("Gather", ["emb", "tok"], ["e"], name="embed", axis=0),
        N("MatMul", ["e", "wt"], ["et"], name="proj"),
        N("ReduceMean", ["et"], ["em"], name="pool_tokens", axes=[1], keepdims=0),
        N("Cast", ["cnt"], ["cntf"], name="cast_cnt", to=TP.FLOAT),
        N("Mul", ["cntf", "scale"], ["cnts"], name="scale_cnt"),
        N("Add", ["em", "cnts"], ["tokens:0"], name="add_cnt"),
        N("Identity", ["tok"], ["tok_copy"], name="tok_copy"),
        N("Relu", ["const_a"], ["const_out"], name="const_relu"),
        N("Relu", ["v"], ["a"], name="relu_v"),
        N("ReduceMean", ["v"], ["s"], name="mean_v", keepdims=1),
        N("Greater", ["s", "zero"], ["c"], name="gt"),
        N("If", ["c"], ["y_if"], name="if", then_branch=then_g, else_branch=else_g),
        N("If", ["const_cond"], ["y_const_if"], name="const_if", then_branch=const_then, else_branch=const_else),
        N("Loop", ["M", "true", "y_if"], ["y_loop", "loop_scan"], name="loop", body=body),
    ]
    outs = [p.output[0] for p in pools] + [
        "head/cls:0",
        "cls_s",
        "cls_s_copy",
        "tokens:0",
        "tok_copy",
        "const_out",
        "y_const_if",
        "y_loop",
        "loop_scan",
    ]
    g = helper.make_graph(
        nodes,
        "misc",
        [
            helper.make_tensor_value_info("img", TP.UINT8, [1, 3, 9, 10]),
            helper.make_tensor_value_info("tok", TP.INT64, [1, 7]),
            helper.make_tensor_value_info("cnt", TP.INT32, [1, 5]),
            helper.make_tensor_value_info("v", TP.FLOAT, [2, 4]),
        ],
        [
            helper.make_tensor_value_info(
                o, TP.FLOAT if o != "tok_copy" else TP.INT64, {"y_loop": [2, 4], "loop_scan": [3, 2]}.get(o)
            )
            for o in outs
        ],
        inits,
    )
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    return m


def feeds(path: Path, seed: int, v_sign: float = 1.0) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input: floats N(0, 1) (``v``: |N(0,1)| * v_sign so that the If
    takes the branch chosen), uint8 over 0..255, int64 token ids 0..9, int32 -50..49."""
    import onnx

    rng = np.random.default_rng(seed)
    m = onnx.load(str(path), load_external_data=False)
    out = {}
    for i in m.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        et = i.type.tensor_type.elem_type
        if et == onnx.TensorProto.UINT8:
            out[i.name] = rng.integers(0, 256, shape).astype(np.uint8)
        elif et == onnx.TensorProto.INT64:
            out[i.name] = rng.integers(0, 10, shape).astype(np.int64)
        elif et == onnx.TensorProto.INT32:
            out[i.name] = rng.integers(-50, 50, shape).astype(np.int32)
        elif i.name == "v":
            out[i.name] = (np.abs(rng.normal(0, 1, shape)) * v_sign).astype(np.float32)
        else:
            out[i.name] = rng.normal(0, 1, shape).astype(np.float32)
    return out


#: name -> builder of the ONNX model (``torch_recurrent_net`` writes to the path it is given)
NETWORKS = {"recurrent": recurrent_net, "torch-recurrent": torch_recurrent_net, "misc": misc_net}


def build(name: str, path: str | Path) -> Path:
    """Write network ``name`` (:data:`NETWORKS`) to ``path`` and, beside it, ``<stem>.inputs.npz``
    with two samples of :func:`feeds` (``If`` taking each branch once). Returns the model path.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    import onnx

    if name not in NETWORKS:
        raise KeyError(f"unknown operator-class network {name!r}; known: {', '.join(NETWORKS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    m = NETWORKS[name](path) if name == "torch-recurrent" else NETWORKS[name]()
    onnx.save(m, str(path))
    samples = [feeds(path, 1, +1.0), feeds(path, 2, -1.0)]
    np.savez(path.with_suffix(".inputs.npz"), **{k: np.stack([s[k] for s in samples]) for k in samples[0]})
    return path
