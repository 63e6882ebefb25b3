"""Known defects of the installed ``onnx.reference`` evaluator that a model runs into, found by probing
the library itself (so the finding disappears when a fixed onnx is installed).

The backends on the evaluator (``onnx-reference`` and its population members, ``onnx-reference-fp64``)
stay faithful to the library: nothing here changes what they compute. :func:`reference_defects` is
called at ``prepare``; when a run then fails, the :class:`~anpred.errors.BackendError` names the
defects the model reaches (:func:`failure_reason`) beside the library's own error, and ``versions()``
lists them (``reference_defects``).

Probed (onnx 1.23.2, ``onnx/reference/ops/op_global_max_pool.py``): ``GlobalMaxPool`` reduces the axes
``range(ndim - 2, ndim)`` (the last two) instead of ``range(2, ndim)``, then appends ``ndim - 2`` unit
axes: right for a rank-4 input only. A rank-3 ``[N, C, L]`` input gives ``[N, 1]`` (the channel axis
reduced away) instead of ``[N, C, 1]``; a rank-5 ``[N, C, D, H, W]`` gives ``[N, C, D, 1, 1, 1]``
(D not reduced, rank 6). magika's ``GlobalMaxPool`` of ``[1, 512, 508]`` then made the following
``Squeeze(axes=[2])`` fail (``AxisError: axis 2 is out of bounds for array of dimension 2``).
``GlobalAveragePool`` is probed alike (right in onnx 1.23.2).

Also probed: ``BatchNormalization`` of opsets 9 to 13 with an explicit ``momentum`` attribute
(``op_batch_normalization.py`` ``BatchNormalization_9``): the evaluator then normalizes with
``mean * momentum + batch_mean * (1 - momentum)`` (and the variance alike), the batch statistics of the
input, where the operator (inference only in these opsets: one output) uses the given mean and
variance. Paddle2ONNX writes ``momentum`` on every BatchNormalization: on ppocr-cls (opset 11) the
evaluator's first BatchNormalization output is 0.10 nRMSE from ONNX Runtime's and the last anchor 0.32.
The run does not fail there; the values are the library's (and the consensus can flag them).
"""

from __future__ import annotations

__all__ = ["reference_defects", "probe_global_pool", "probe_batchnorm_momentum", "failure_reason", "summarize",
           "PROBED_OPS"]

#: operators whose kernel is probed, at each input rank the model gives them
PROBED_OPS = ("GlobalMaxPool", "GlobalAveragePool")


def probe_batchnorm_momentum(opset: int) -> float:
    """max |y - y_spec| of the installed ``onnx.reference`` ``BatchNormalization`` at ``opset`` with
    ``momentum=0.9``, on ``x`` = arange(24) as [1, 2, 3, 4], mean 0, var 1, scale 1, bias 0, epsilon 0
    (the spec's inference output is ``x`` itself); 0.0 when it computes the spec's formula."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inits = [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in
             (("s", [1, 1]), ("b", [0, 0]), ("m", [0, 0]), ("v", [1, 1]))]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.0, momentum=0.9)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    y = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])).run(None, {"x": x})[0]
    return float(np.abs(np.asarray(y, np.float64) - x).max())


def probe_global_pool(op_type: str, rank: int, dtype=None) -> tuple[list[int], list[int]]:
    """Run ``op_type`` (a global pooling op) of the installed ``onnx.reference`` on an input of shape
    ``[2, 3, 4, ...]`` (``rank`` >= 3 dims) of ``dtype`` (numpy, default float32; values ``arange``).
    Returns ``(the shape the evaluator gave, the shape the ONNX spec defines: [N, C, 1, ...])``.
    Raises whatever the evaluator raises."""
    import numpy as np
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    dtype = np.dtype(dtype or np.float32)
    shape = [2 + i for i in range(rank)]
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    return list(np.shape(y)), shape[:2] + [1] * (rank - 2)


def reference_defects(model) -> dict[str, str]:
    """``{node name: reason}`` for the nodes of ``model``'s main graph (``onnx.ModelProto``) whose
    operator (:data:`PROBED_OPS`) the installed ``onnx.reference`` computes wrongly at the input rank
    the model gives it (ONNX shape inference; nodes of unknown rank are not probed). Empty when
    nothing is known wrong. Probe results are cached per (op, rank) for the process."""
    import onnx

    out = _batchnorm_defects(model)
    nodes = [n for n in model.graph.node if n.op_type in PROBED_OPS and n.domain in ("", "ai.onnx")]
    if not nodes:
        return out
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - ranks unknown: nothing probed
        return out
    ranks = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    for k, n in enumerate(nodes):
        r = ranks.get(n.input[0])
        if r is None or r < 3:
            continue
        got, want = _probe(n.op_type, r)
        if got != want:
            out[n.name or f"{n.op_type}#{k}"] = (
                f"onnx.reference {onnx.__version__} {n.op_type} on a rank-{r} input returns shape {got} where the "
                f"ONNX spec gives {want} (probed on a {[2 + i for i in range(r)]} input; its kernel reduces the "
                "last two axes, not all spatial axes: right for rank 4 only)")
    return out


def _batchnorm_defects(model) -> dict[str, str]:
    """The BatchNormalization nodes with a ``momentum`` attribute, at a default-domain opset 9 to 13,
    when the installed evaluator's kernel there departs from the spec (:func:`probe_batchnorm_momentum`)."""
    import onnx

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    nodes = [n for n in model.graph.node if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")
             and any(a.name == "momentum" for a in n.attribute)]
    if not nodes or not 9 <= opset <= 13:
        return {}
    if ("BatchNormalization", opset) not in _PROBES:
        try:
            _PROBES["BatchNormalization", opset] = probe_batchnorm_momentum(opset)
        except Exception:  # noqa: BLE001 - no verdict
            _PROBES["BatchNormalization", opset] = 0.0
    dev = _PROBES["BatchNormalization", opset]
    if not dev:
        return {}
    why = (f"onnx.reference {onnx.__version__} BatchNormalization (opset {opset}) with a momentum attribute "
           "normalizes with the running mean/variance blended with the input's batch statistics "
           f"(mean * momentum + batch_mean * (1 - momentum)), not the given mean/variance (probe: off by {dev:.3g})")
    return {n.name or f"BatchNormalization#{k}": why for k, n in enumerate(nodes)}


_PROBES: dict[tuple[str, int], object] = {}


def _probe(op_type: str, rank: int) -> tuple[list, list]:
    if (op_type, rank) not in _PROBES:
        try:
            _PROBES[op_type, rank] = probe_global_pool(op_type, rank)
        except Exception as err:  # noqa: BLE001 - a failing kernel is a defect too
            _PROBES[op_type, rank] = ([f"{type(err).__name__}: {err}"], [2, 3] + [1] * (rank - 2))
    return _PROBES[op_type, rank]


def failure_reason(backend: str, defects: dict[str, str], err: BaseException) -> str:
    """The message of the BackendError a run failure becomes when ``defects`` (from
    :func:`reference_defects`) is not empty: the library's error, then the known defects by node."""
    listed = "; ".join(f"node {name!r}: {why}" for name, why in list(defects.items())[:4])
    more = f" (+{len(defects) - 4} more)" if len(defects) > 4 else ""
    return (f"{backend}: {type(err).__name__}: {str(err)[:300]} -- the model reaches a known defect of the "
            f"installed onnx.reference: {listed}{more}")


def summarize(defects: dict[str, str]) -> str:
    """One line for ``versions()``: each distinct reason once, with the number of nodes and the first
    three node names."""
    by: dict[str, list[str]] = {}
    for node, why in defects.items():
        by.setdefault(why, []).append(node)
    return "; ".join(f"{why} [{len(ns)} node(s): {', '.join(ns[:3])}{' ...' if len(ns) > 3 else ''}]"
                     for why, ns in by.items())
