"""Real runs for the dashboard and Model Explorer tests (helpers, not tests), made once per session.

:func:`net_runs`: ``anpred test net.onnx`` twice into one history database, on ort, openvino and
onnx-reference: first a CNN whose Softplus sees inputs around 0 (every backend consistent), then the
same graph with the Softplus inputs around -15, where OpenVINO 2026.4.1's CPU Softplus is wrong
(docs/oracle.md), with the drill-down (culprit: the node ``softplus``) and its Model Explorer export
(``--model-explorer``: ``out/model-explorer/``). Both files are named
``net.onnx`` and take the same seeded inputs, so the history holds one model ``net`` whose openvino
verdict changes from ok to FLAGGED: a real regression.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_RUNS: dict[str, dict[str, Path]] = {}


def net_onnx(path: Path, bias: float) -> Path:
    """conv -> relu -> conv (bias ``bias``) -> Softplus -> conv -> relu -> conv; input ``x`` float32
    (1, 3, 16, 16), output ``y`` (1, 4, 16, 16), opset 17. Returns ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name, x, y, cin, cout, b=0.0, scale=None):
        w = (rng.standard_normal((cout, cin, 3, 3)) * (scale or 1.0 / np.sqrt(cin * 9))).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"),
                      numpy_helper.from_array((b + 0.05 * rng.standard_normal(cout)).astype(np.float32), f"{name}.b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [y], name=name, kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))

    conv("c0", "x", "t0", 3, 8)
    nodes.append(helper.make_node("Relu", ["t0"], ["r0"], name="relu0"))
    conv("c1", "r0", "t1", 8, 8, b=bias, scale=0.3)
    nodes.append(helper.make_node("Softplus", ["t1"], ["sp"], name="softplus"))
    conv("c2", "sp", "t2", 8, 8)
    nodes.append(helper.make_node("Relu", ["t2"], ["r2"], name="relu2"))
    conv("c3", "r2", "y", 8, 4)
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def net_runs(root: Path) -> dict[str, Path]:
    """The two runs (module docstring), once per session: ``{"db", "good", "bad"}`` (the history and
    the two report folders). Raises AssertionError when a run does not end as expected."""
    import contextlib
    import io

    from anpred.cli import main

    if "net" not in _RUNS:
        root = Path(root)
        db = root / "history.sqlite"
        out = {"db": db}
        for key, bias, rc_want, extra in (("good", 0.0, 0, []), ("bad", -15.0, 1, ["--drill", "--model-explorer"])):
            (root / key).mkdir(parents=True)
            model = net_onnx(root / key / "net.onnx", bias)
            so, se = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                rc = main(["test", str(model), "--backends", "ort,openvino,onnx-reference", "--stages", "7",
                           "--samples", "2", "--history", str(db), "-o", str(root / key / "out"), "--quiet", *extra])
            assert rc == rc_want, (key, rc, so.getvalue()[-2000:], se.getvalue()[-2000:])
            out[key] = root / key / "out"
        _RUNS["net"] = out
    return _RUNS["net"]
