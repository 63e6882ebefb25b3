"""The pnnx probe of ncnn's pre-run coverage (:class:`anpred.backends.converter_probe.NodeProbe`): pnnx
run on a one-node model of each node, refusing only for what pnnx states (``todo <op>``, a layer ncnn
does not know) or a crash that comes back with a consumer of the node's outputs
(docs/backends-converters.md, "Pre-run coverage")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from anpred.backends.ncnn_param import unknown_layers

#: seconds of pnnx probes per model in the pre-run coverage (what a probe costs: docs/backends-converters.md,
#: "Pre-run coverage"; answers are cached by node content, so a model seen before costs none)
PNNX_PROBE_BUDGET_S = 30.0


def _pnnx_convert(path: Path, tmp: Path) -> str:
    """pnnx on the one-node model at ``path`` (a probe, :class:`anpred.backends.converter_probe.NodeProbe`):
    a refusal pnnx states (``todo <op>``, a layer ncnn does not know) or a crash (a signal); "" otherwise,
    also when a node with other than float32 inputs is not asked (alone its integer inputs would be graph
    inputs, unlike in its model) and when pnnx fails alone without saying why (the node may convert in
    its model: not refused on that evidence)."""

    import onnx

    m = onnx.load(str(path))
    args = _float32_shapes(m)
    if args is None:
        # an integer or scalar tensor alone is not what pnnx sees in the model (indices, shapes): not
        # asked (the conversion of the whole model will say)
        return ""
    work = tmp / f"pnnx-{path.stem}"
    try:
        proc = _run_pnnx(m, work, args)
    except subprocess.TimeoutExpired:
        return "pnnx took more than 120 s on this node alone"
    log = proc.stdout + proc.stderr
    todo = sorted({mm.group(1) for mm in re.finditer(r"^todo (\S+)", log, re.M)})
    if proc.returncode < 0:
        # a node pnnx folds away (Identity) leaves an empty graph alone, which crashes it: asked again with
        # a consumer of its outputs, a crash that does not come back was the empty graph's, not the node's
        consumed = _with_consumers(m)
        try:
            again = _run_pnnx(consumed, tmp / f"pnnx-{path.stem}-consumed", args) if consumed is not None else proc
        except subprocess.TimeoutExpired:
            again = proc
        if again.returncode >= 0:
            return ""
        return f"pnnx crashed on this node alone (signal {-proc.returncode})"
    if todo:
        return f"pnnx cannot lower {', '.join(todo)} onto ncnn layers (todo)"
    if proc.returncode != 0 or not (work / "model.ncnn.param").is_file():
        return ""  # a failure alone that pnnx does not state: the node may convert in its model
    unknown = unknown_layers(work / "model.ncnn.param")
    if unknown:
        return f"ncnn does not know the layer type(s) {', '.join(unknown)} pnnx lowers it to"
    return ""


def converts_whole(model) -> bool:
    """Whether pnnx converts the whole ``model`` (its graph inputs float32 with static shapes; else not
    asked: False) to an ncnn graph: the check of a crash that a node's probe alone saw (a node that
    crashes pnnx alone may vanish in a fused pattern of its model)."""
    import tempfile

    args = _float32_shapes(model)
    if args is None:
        return False
    with tempfile.TemporaryDirectory(prefix="anpred-pnnx-whole-") as tmp:
        try:
            proc = _run_pnnx(model, Path(tmp) / "whole", args)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0 and (Path(tmp) / "whole" / "model.ncnn.param").is_file()


def _float32_shapes(model) -> list[str] | None:
    """pnnx's ``inputshape`` items (``[1,3,8,8]f32``) of ``model``'s graph inputs (initializers left
    out); None when one is not float32 or has no static shape of rank >= 1."""
    from anpred.onnx_io import elem_type_name

    inits = {t.name for t in model.graph.initializer}
    args = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        if elem_type_name(vi.type.tensor_type.elem_type) != "float32" or not dims or min(dims) <= 0:
            return None
        args.append("[" + ",".join(map(str, dims)) + "]f32")
    return args


def _run_pnnx(model, work: Path, args: list[str]):
    """pnnx on ``model`` (saved as ``work/model.onnx``, ``work`` emptied first) with the float32 input
    shapes ``args``: the finished process. Raises subprocess.TimeoutExpired past 120 s."""
    import shutil

    import onnx
    import pnnx

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    onnx.save(model, str(work / "model.onnx"))
    return subprocess.run(
        [pnnx.EXEC_PATH, "model.onnx", f"inputshape={','.join(args)}", "fp16=0", "device=cpu"],
        cwd=str(work),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _with_consumers(model):
    """A copy of the one-node ``model`` whose float32 outputs each feed a ``Neg`` that becomes the graph
    output (so that the node is not the whole graph); None when it has no float32 output."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    outs = [o for o in m.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    if not outs:
        return None
    for o in outs:
        new = f"{o.name}__anpred_consumer"
        m.graph.node.append(helper.make_node("Neg", [o.name], [new], name=new))
        o.name = new
    return m


def pnnx_probe():
    """The pnnx :class:`~anpred.backends.converter_probe.NodeProbe` of the pre-run coverage."""
    import importlib.metadata as md

    from anpred.backends.converter_probe import NodeProbe

    # the probe's own revision in the key: "ncnn_probe/2" asks a crash alone again with consumers (the
    # answers of the revision before are not reused)
    return NodeProbe(
        "pnnx",
        f"pnnx {md.version('pnnx')} ncnn {md.version('ncnn')} anpred.ncnn_probe/2",
        _pnnx_convert,
        PNNX_PROBE_BUDGET_S,
    )
