"""The task tests' digits case (tests/test_task_metrics.py, tests/test_task_stream.py): a small CNN trained
on the handwritten digits bundled with scikit-learn, exported to ONNX with its test inputs and labels, and
a degraded copy. ``digits`` (conftest.py, session scope) builds it once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FP32 = ["ort", "openvino", "torch", "onnx-reference"]
LOWP = ["ort-fp16", "openvino-fp16", "ort-int8", "openvino-int8"]
N_TRAIN, N_TEST = 1500, 60


def train_digits_cnn(seed: int = 0):
    """A 2-conv CNN trained 12 epochs on the first 1500 digits (8x8, scaled to [0, 1]); eval mode."""
    import torch
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 16, 10),
    )
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    xt, yt = torch.from_numpy(x[:N_TRAIN]), torch.from_numpy(y[:N_TRAIN])
    for _ in range(12):
        perm = torch.randperm(N_TRAIN)
        for i in range(0, N_TRAIN, 100):
            idx = perm[i : i + 100]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx]).backward()
            opt.step()
    return net.eval(), x, y


def build_digits(root: Path):
    """``(model.onnx, inputs folder, labels.txt, eager top-1 on the test digits, root)``, written under the
    folder ``root``; ``root/bad/digits.onnx`` is the degraded copy."""
    import torch

    net, x, y = train_digits_cnn()
    torch.onnx.export(
        net,
        (torch.from_numpy(x[:1]),),
        str(root / "digits.onnx"),
        input_names=["x"],
        output_names=["logits"],
        dynamo=False,
    )
    inp = root / "inputs"
    inp.mkdir()
    test = range(N_TRAIN, N_TRAIN + N_TEST)
    for i in test:
        np.savez(inp / f"{i:04d}.npz", x=x[i : i + 1])
    (root / "labels.txt").write_text("\n".join(str(int(y[i])) for i in test))
    with torch.no_grad():
        eager = float(
            (
                net(torch.from_numpy(x[N_TRAIN : N_TRAIN + N_TEST])).argmax(1).numpy() == y[N_TRAIN : N_TRAIN + N_TEST]
            ).mean()
        )
    # a degraded copy (the last layer's weights with noise): the same model name, a lower top-1
    bad = root / "bad"
    bad.mkdir()
    import onnx
    from onnx import numpy_helper as nh

    m = onnx.load(root / "digits.onnx")
    for t in m.graph.initializer:
        a = nh.to_array(t)
        if a.ndim == 2:  # the Linear layer's weight
            rng = np.random.default_rng(1)
            t.CopyFrom(nh.from_array((a + rng.standard_normal(a.shape).astype(np.float32) * 2 * a.std()), t.name))
    onnx.save(m, bad / "digits.onnx")
    return root / "digits.onnx", inp, root / "labels.txt", eager, root


def nice_allowed() -> bool:
    """Whether a thread here may raise its own nice value (probed in a thread of its own)."""
    import threading

    from anpred.pipeline.stream_inputs import lower_priority

    got = []
    th = threading.Thread(target=lambda: got.append(lower_priority()))
    th.start()
    th.join()
    return got[0] is not None
