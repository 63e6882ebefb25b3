"""Pre-run coverage below the operator name: the attribute, dtype and input limits a converter states,
asked of the converter itself (:mod:`anpred.backends.coverage`).

An operator table says whether a converter knows ``Reshape``; it does not say that onnx2torch refuses
``Reshape`` with ``allowzero=1`` (``onnx2torch/node_converters/reshape.py``: ``"allowzero=1" is not
implemented``) or ``Clip`` whose ``min``/``max`` are computed (``clip.py``: ``Dynamic value of min/max is
not implemented``). Two ways to learn such limits without a hand-kept table:

- :func:`onnx2torch_refusals` calls onnx2torch's own converter of every node (its registry,
  ``get_converter(...)(node, graph)``) on the model prepared as the ``torch`` backend prepares it
  (Constant nodes folded, control flow inlined, SAME pads made explicit): every
  ``NotImplementedError`` a converter raises is a refusal, with the converter's own words. No
  ``torch.fx`` graph is built; the cost is the converters' (weights copied into torch modules).
- :class:`NodeProbe` converts a one-node model built from each node (its attributes; its constant
  inputs as initializers; its other inputs as graph inputs of the node's inferred type and shape) with
  a converter that is a separate program or process (pnnx, :func:`anpred.backends.ncnn_probe.pnnx_probe`; onnx2tf
  in one warm worker, :func:`anpred.backends.tf_probe.onnx2tf_probe`), caching each answer by
  the node's content (:func:`node_signature`: attributes, dtypes, ranks, small constants) under
  ``<cache>/coverage-probe/<tool>/``: a node of the same signature is never probed twice, in this model
  or another, while the converter's version is the same.

Both return ``{op key: reason}`` in the coverage's format (:func:`anpred.onnx_io.model_ops` keys), the
reason naming the nodes (the first, and how many more).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["onnx2torch_refusals", "NodeProbe", "node_signature", "one_node_model", "grouped"]

#: constant inputs up to this many elements enter a node's signature with their values (shape targets,
#: axes, clip bounds: values a converter's decision depends on); larger ones (weights) with their
#: dtype and rank only
SIGNATURE_VALUE_ELEMENTS = 64
#: the most probes run at once (each a converter process of its own)
PROBE_WORKERS = 4


def grouped(refusals: list[tuple[str, str, str]]) -> dict[str, str]:
    """``[(op key, node name, reason)]`` as ``{op key: "reason (node 'a' and N more)"}``, the first
    node's reason per op key."""
    by: dict[str, list[tuple[str, str]]] = {}
    for key, node, why in refusals:
        by.setdefault(key, []).append((node, why))
    out = {}
    for key, items in by.items():
        node, why = items[0]
        more = f" and {len(items) - 1} more" if len(items) > 1 else ""
        out[key] = f"{why} (node {node!r}{more})"
    return out


def _op_key(node) -> str:
    dom = "" if node.domain in ("", "ai.onnx") else node.domain
    return f"{dom}::{node.op_type}" if dom else node.op_type


def onnx2torch_refusals(model) -> dict[str, str]:
    """``{op key: reason}`` for the nodes whose onnx2torch converter raises ``NotImplementedError`` on
    ``model`` (an ``onnx.ModelProto``; not modified), prepared as
    :meth:`anpred.backends.torch_onnx.TorchOnnxBackend._prepare_impl` prepares it. Nodes without a
    converter are left to the registry check (:meth:`~anpred.backends.torch_onnx.TorchOnnxBackend.unsupported_ops`).
    Another exception of a converter is not a stated limit and is not reported here (the conversion
    names it)."""
    import onnx

    from anpred.backends.torch_converters import import_onnx2torch
    from anpred.backends.convert import fold_constant_nodes, fold_identity_initializers
    from anpred.backends.onnx2torch_compat import onnx2torch_compat
    from anpred.backends.torch_converters import explicit_same_pads
    from passes.control_flow import inline_control_flow

    m = onnx.ModelProto()
    m.CopyFrom(model)
    fold_constant_nodes(m)
    fold_identity_initializers(m)
    inline_control_flow(m)
    explicit_same_pads(m)
    import_onnx2torch()
    onnx2torch_compat()
    from onnx2torch.converter import _remove_initializers_from_input
    from onnx2torch.node_converters.registry import get_converter
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.utils.safe_shape_inference import safe_shape_inference

    m = _remove_initializers_from_input(safe_shape_inference(m))
    opsets = {o.domain: o.version for o in m.opset_import}
    graph = OnnxGraph(m.graph)
    found = []
    for proto, node in zip(m.graph.node, graph.nodes.values()):
        try:
            conv = get_converter(
                domain=node.domain,
                operation_type=node.operation_type,
                version=opsets.get(node.domain, opsets.get("", 1)),
            )
        except NotImplementedError:
            continue  # no converter at all: the registry check names it
        try:
            conv(node, graph)
        except NotImplementedError as err:
            found.append((_op_key(proto), proto.name or proto.output[0], f"onnx2torch: {err}"))
        except Exception:  # noqa: BLE001 - a converter bug, not a stated limit: the conversion names it
            continue
    return grouped(found)


def _tensor_digest(t) -> dict[str, Any]:
    from onnx import numpy_helper

    arr = numpy_helper.to_array(t)
    if arr.size > SIGNATURE_VALUE_ELEMENTS:  # weights: what they hold does not decide a conversion
        return {"dtype": str(arr.dtype), "rank": arr.ndim}
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "values": hashlib.sha256(arr.tobytes()).hexdigest()[:16]}


def node_signature(node, inputs: list[dict[str, Any]], opset: dict[str, int]) -> str:
    """The content key of one node for a probe: op type, domain, opset, every attribute (serialized),
    and per input its kind (constant or not), dtype and rank, with the shape and values of small
    constants (:data:`SIGNATURE_VALUE_ELEMENTS`). sha256 hex. Shapes of the other inputs are not in it: a
    converter's support follows the attributes, dtypes and ranks (a Conv of 16 or of 64 channels converts
    alike), so the answer for one node serves every node of the same signature."""
    attrs = sorted((a.name, hashlib.sha256(a.SerializeToString()).hexdigest()[:16]) for a in node.attribute)
    body = {
        "op": node.op_type,
        "domain": node.domain,
        "opset": opset.get(node.domain, opset.get("", 0)),
        "attrs": attrs,
        "inputs": inputs,
        "outputs": len(node.output),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def one_node_model(model, node, types: dict[str, tuple[int, Any]], consts: dict[str, Any]):
    """``(model, signature inputs)``: a model of ``node`` alone, its constant inputs (``consts``:
    value name -> TensorProto) as initializers, its other inputs as graph inputs typed from ``types``
    (value -> (elem type, shape)), its outputs typed likewise (float when unknown); None when an input's
    type or shape is not static (a probe needs concrete shapes)."""
    import onnx
    from onnx import helper

    ins, inits, sig = [], [], []
    for v in node.input:
        if not v:
            sig.append({"kind": "absent"})
            continue
        if v in consts:
            t = onnx.TensorProto()
            t.CopyFrom(consts[v])
            t.name = v
            inits.append(t)
            sig.append({"kind": "constant", **_tensor_digest(t)})
            continue
        elem, shape = types.get(v, (0, None))
        if not elem or shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
            return None, None
        if v not in {i.name for i in ins}:
            ins.append(helper.make_tensor_value_info(v, elem, list(shape)))
        sig.append({"kind": "input", "elem": elem, "rank": len(shape)})
    outs = []
    for v in node.output:
        if v:
            elem, shape = types.get(v, (0, None))
            outs.append(helper.make_tensor_value_info(v, elem or onnx.TensorProto.FLOAT, shape))
    n = onnx.NodeProto()
    n.CopyFrom(node)
    g = helper.make_graph([n], "probe", ins, outs, inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return m, sig


class NodeProbe:
    """Probe a converter program on one-node models, cached by node content (module docstring).

    Args:
        tool: the cache folder's name (e.g. ``"pnnx"``).
        version: the converter's version (part of every key: another version is probed anew).
        convert: ``(onnx model path, scratch folder) -> "" | reason | None``: runs the converter on one
            one-node model; "" when it converts, else the converter's decisive line; None when it gave
            no answer (out of time: counted in :attr:`unprobed`, not cached).
        budget_s: the most seconds of probing per model; nodes not probed within it are counted in
            :attr:`unprobed` (never refused).
        constants: probe ``Constant`` nodes too (a converter that refuses some of their attributes,
            e.g. TVM's ``value_float``); else they are the constant inputs of the others.
    """

    def __init__(
        self,
        tool: str,
        version: str,
        convert: Callable[[Path, Path], str | None],
        budget_s: float,
        constants: bool = False,
    ):
        self.tool, self.version, self.convert, self.budget_s = tool, version, convert, budget_s
        self.constants = constants
        self.unprobed = 0
        self.probed = 0
        self.cached = 0

    def _folder(self) -> Path:
        from anpred.cache import cache_root

        return cache_root() / "coverage-probe" / self.tool

    def refusals(self, model) -> dict[str, str]:
        """``{op key: reason}`` of the nodes of ``model`` (weights loaded) the converter refuses alone.
        Uncached signatures are probed in parallel (:data:`PROBE_WORKERS` at most), within
        :attr:`budget_s`."""
        import tempfile
        from concurrent.futures import ThreadPoolExecutor

        from anpred.onnx_io import atomic_write_text, save_model

        folder = self._folder()
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        nodes = self._keyed(model)  # [(node, key, one-node model)]
        answers: dict[str, str] = {}
        for _, key, _ in nodes:
            f = folder / f"{key}.json"
            if key not in answers and f.is_file():
                try:
                    answers[key] = json.loads(f.read_text())["refused"]
                    self.cached += 1
                except (OSError, ValueError, KeyError):
                    pass
        todo = list({key: (n, one) for n, key, one in nodes if key not in answers}.items())
        workers = max(1, min(PROBE_WORKERS, os.cpu_count() or 1))
        with tempfile.TemporaryDirectory(prefix="anpred-probe-") as tmp, ThreadPoolExecutor(workers) as pool:
            for i in range(0, len(todo), workers):
                if time.perf_counter() - t0 > self.budget_s:
                    self.unprobed += len(todo) - i
                    break
                batch = todo[i : i + workers]
                paths = []
                for key, (_, one) in batch:
                    paths.append(Path(tmp) / f"{key[:16]}.onnx")
                    save_model(one, paths[-1])
                for (key, (n, _)), why in zip(batch, pool.map(lambda q: self.convert(q, Path(tmp)), paths)):
                    if why is None:  # no answer (the converter ran out of the budget): not refused, not cached
                        self.unprobed += 1
                        continue
                    answers[key] = why
                    self.probed += 1
                    atomic_write_text(
                        folder / f"{key}.json",
                        json.dumps({"refused": why, "op": n.op_type, "tool": self.tool, "version": self.version}),
                    )
        found = [
            (_op_key(n), n.name or n.output[0], f"{self.tool}: {answers[key]}")
            for n, key, _ in nodes
            if answers.get(key)
        ]
        return grouped(found)

    def _keyed(self, model) -> list[tuple[Any, str, Any]]:
        """``[(node, content key, one-node model)]`` for the nodes of ``model`` a probe can ask: not
        ``Constant``, every input static and none computed from constants or shapes (folded in the
        model: alone it would be a graph input the converter may refuse for that reason only), and not
        every input a constant (a node of constants only is folded in the model, where alone a converter
        may keep it as an expression it cannot lower: pnnx's ``pnnx.Expression`` for a ``Cast`` of a
        ``Constant``, which ncnn does not know)."""
        from passes.graph import build_index
        from passes.shapes import infer_value_types

        types = infer_value_types(model)
        index = build_index(model.graph)
        consts = {t.name: t for t in model.graph.initializer}
        for n in model.graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                consts[n.output[0]] = n.attribute[0].t
        opset = {o.domain: o.version for o in model.opset_import}
        out = []
        for n in model.graph.node:
            if (n.op_type == "Constant" and not self.constants) or any(
                v and v not in consts and not index.is_data(v) for v in n.input
            ):
                continue
            if n.op_type != "Constant" and any(n.input) and all(v in consts for v in n.input if v):
                continue  # constants only: folded in the model
            one, sig = one_node_model(model, n, types, consts)
            if one is not None:
                out.append(
                    (n, hashlib.sha256(f"{self.version}\0{node_signature(n, sig, opset)}".encode()).hexdigest(), one)
                )
        return out
