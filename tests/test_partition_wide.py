"""Stages cut inside long recurrent or unrolled blocks (issue 34, item 7): a CRNN-like network (a CNN,
then two unrolled recurrent layers: a loop of LSTMCell/GRUCell steps exported by torch.onnx.export, one
bidirectional layer and one on top) and a Scan/Loop-free stack of transformer-like layers that all read
the same shared tensors. Neither block has a cut of the usual width (4): every step's output stays alive
until the final Stack, every layer reads the shared tensors. The partition must cut inside them with
wider cuts, say so in the manifest, and the anchored model must run and be judged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from anpred.instrument import instrument_model
from isa_reasons import NOT_A_KERNEL_VALUE


def crnn_onnx(path, cell: str, steps: int = 8, hidden: int = 16):
    """A CNN over a 1x8x(4*steps) image, its columns as a sequence of ``steps``, a bidirectional
    recurrent layer of ``cell`` ("lstm"/"gru") cells unrolled step by step, a second layer on top, a
    Linear per step and a Stack: the structure of a CRNN text recogniser."""
    import torch
    from torch import nn

    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.cnn = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d((4, 2)),
            )
            c = nn.LSTMCell if cell == "lstm" else nn.GRUCell
            self.fw, self.bw, self.top = c(16, hidden), c(16, hidden), c(2 * hidden, hidden)
            self.fc = nn.Linear(hidden, 11)

        def step(self, c, x, state):
            if cell == "lstm":
                hh, cc = c(x, state)
                return hh, (hh, cc)
            hh = c(x, state)
            return hh, hh

        def forward(self, img):
            seq = self.cnn(img).flatten(1, 2).permute(2, 0, 1)  # [steps, 1, 16]
            z = torch.zeros(1, hidden)
            zero = (z, z) if cell == "lstm" else z
            s, fw = zero, []
            for t in range(steps):
                y, s = self.step(self.fw, seq[t], s)
                fw.append(y)
            s, bw = zero, [None] * steps
            for t in reversed(range(steps)):
                y, s = self.step(self.bw, seq[t], s)
                bw[t] = y
            s, out = zero, []
            for t in range(steps):
                y, s = self.step(self.top, torch.cat([fw[t], bw[t]], 1), s)
                out.append(self.fc(y))
            return torch.stack(out, 0)

    torch.manual_seed(0)
    torch.onnx.export(
        CRNN().eval(),
        (torch.rand(1, 1, 8, 4 * steps),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["img"],
        output_names=["logits"],
    )
    return onnx.load(str(path))


def shared_stack(layers: int = 8, d: int = 16, s: int = 6, shared: int = 4):
    """x[1, s, d] and src[1, s, d] -> ``shared`` tensors computed once from src (a memory, gates) ->
    ``layers`` layers, each: attention of the stream over the memory, a gated residual, a feed-forward
    block and a residual with every shared gate: ``1 + shared`` tensors cross between any two layers."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def w(name, *shape):
        inits.append(nh.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name))
        return name

    def op(t, ins, out, **kw):
        nodes.append(h.make_node(t, ins, [out], name=out, **kw))
        return out

    gates = [
        op(
            ["Tanh", "Sigmoid", "Relu", "Softsign"][g % 4],
            [op("MatMul", ["src", w(f"wg{g}", d, d)], f"pre{g}")],
            f"shared{g}",
        )
        for g in range(shared)
    ]
    mem = gates[0]
    x = "x"
    for i in range(layers):
        q = op("MatMul", [x, w(f"l{i}.wq", d, d)], f"l{i}.q")
        k = op("MatMul", [mem, w(f"l{i}.wk", d, d)], f"l{i}.k")
        kt = op("Transpose", [k], f"l{i}.kt", perm=[0, 2, 1])
        att = op("Softmax", [op("MatMul", [q, kt], f"l{i}.scores")], f"l{i}.att", axis=-1)
        a = op("MatMul", [att, op("MatMul", [mem, w(f"l{i}.wv", d, d)], f"l{i}.v")], f"l{i}.ctx")
        x = op("Add", [x, op("Mul", [a, gates[1 % shared]], f"l{i}.gated")], f"l{i}.res1")
        hidden = op("Relu", [op("MatMul", [x, w(f"l{i}.w1", d, d)], f"l{i}.ff1")], f"l{i}.act")
        f = op("MatMul", [hidden, w(f"l{i}.w2", d, d)], f"l{i}.ff2")
        for g in gates[2:]:
            f = op("Add", [f, op("Mul", [f, g], f"l{i}.{g}.mul")], f"l{i}.{g}.add")
        x = op("Add", [x, f], f"l{i}.out")
    g = h.make_graph(
        nodes,
        "shared_stack",
        [h.make_tensor_value_info("x", T.FLOAT, [1, s, d]), h.make_tensor_value_info("src", T.FLOAT, [1, s, d])],
        [h.make_tensor_value_info(x, T.FLOAT, [1, s, d])],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _stage_shares(man):
    total = sum(st.num_nodes for st in man.stages)
    return [st.num_nodes / total for st in man.stages]


def test_shared_stack_is_cut_between_layers_with_wide_cuts():
    m = shared_stack()
    am, man = instrument_model(m, stages=8)
    p = man.partition
    # 1 stream + 4 shared tensors cross between layers: cuts of 5 tensors (6 inside a layer), stated
    widths = [c["width"] for c in p["wide_cuts"]]
    assert len(man.stages) == 8 and len(widths) >= 6 and min(widths) == 5 and max(widths) <= 6
    assert max(_stage_shares(man)) < 0.3
    assert any(
        f"{len(widths)} wide cut(s) of 5..{max(widths)} tensors (more than --max-cut-width 4" in n for n in p["notes"]
    )
    inner = {a.value for a in man.anchors if a.kind == "boundary"}
    assert {"shared0", "shared1", "shared2", "shared3"} <= inner and any(v.endswith(".out") for v in inner)
    # without wide cuts (the width they would need is 5): the stack stays one stage, as before
    am0, man0 = instrument_model(m, stages=8, max_cut_width=4, wide_cut_width=4)
    assert not man0.partition["wide_cuts"] and max(_stage_shares(man0)) > 0.85


@pytest.mark.isa_independent(NOT_A_KERNEL_VALUE)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_unrolled_recurrent_layers_are_cut_inside(cell, tmp_path):
    m = crnn_onnx(tmp_path / f"crnn-{cell}.onnx", cell)
    am, man = instrument_model(m)  # the automatic number of stages
    rec = [a for a in man.anchors if a.kind == "boundary" and a.producer.startswith(("/fw", "/bw", "/top"))]
    assert rec, [a.producer for a in man.anchors]  # anchors inside the recurrent layers
    assert man.partition["wide_cuts"] and max(c["width"] for c in man.partition["wide_cuts"]) > 4
    note = next(n for n in man.partition["notes"] if "no cut of width <= 4 inside" in n)
    assert "wide cut(s)" in note
    nodes = sum(st.num_nodes for st in man.stages)
    assert max(st.num_nodes for st in man.stages) < 0.6 * nodes
    # before: every anchor in the CNN, the last stage holding the recurrent layers
    _, man0 = instrument_model(m, wide_cut_width=4)
    assert max(st.num_nodes for st in man0.stages) > 0.9 * nodes


def test_crnn_with_wide_cuts_runs_and_is_judged(tmp_path):
    """The anchored CRNN (LSTM cells) runs on ort, openvino and the reference evaluator; every anchor,
    the wide cuts' too, is judged: consistent."""
    from anpred.judge import check_run
    from anpred.onnx_io import save_model
    from anpred.run import run_model

    m = crnn_onnx(tmp_path / "crnn.onnx", "lstm")
    am, man = instrument_model(m)
    save_model(am, tmp_path / "anchored.onnx")
    rng = np.random.default_rng(0)
    (tmp_path / "inputs").mkdir()
    for i in range(2):
        np.savez(tmp_path / "inputs" / f"{i:04d}.npz", img=rng.random((1, 1, 8, 32), dtype=np.float32))
    store = run_model(
        tmp_path / "anchored.onnx",
        ["ort", "openvino", "onnx-reference"],
        tmp_path / "inputs",
        tmp_path / "run",
        progress=False,
        timeout_s=300,
    )
    rep = check_run(store.root)
    assert rep.flagged_backends == [] and not rep.problems
    for b in ("ort", "openvino", "onnx-reference"):
        v = rep.verdicts[b]
        # every anchor judged (an output may be judged in parts too: at least one cell per anchor)
        assert v.status in ("consistent", "reference") and not v.unjudged and v.judged_anchors >= len(man.anchors)
    judged = {c.anchor for c in rep.cells}
    wide = [a.name for a in man.anchors if a.kind == "boundary" and a.producer.startswith(("/fw", "/bw", "/top"))]
    assert wide and set(wide) <= judged
