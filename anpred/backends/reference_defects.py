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
"""

from __future__ import annotations

__all__ = ["reference_defects", "probe_global_pool", "failure_reason", "PROBED_OPS"]

#: operators whose kernel is probed, at each input rank the model gives them
PROBED_OPS = ("GlobalMaxPool", "GlobalAveragePool")


def probe_global_pool(op_type: str, rank: int, dtype=None) -> tuple[list[int], list[int]]:
    """Run ``op_type`` (a global pooling op) of the installed ``onnx.reference`` on an input of shape
    ``[2, 3, 4, ...]`` (``rank`` >= 3 dims) of ``dtype`` (numpy, default float32; values ``arange``).
    Returns ``(the shape the evaluator gave, the shape the ONNX spec defines: [N, C, 1, ...])``.
    Raises whatever the evaluator raises."""
    import numpy as np
    from onnx import TensorProto, helper
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

    nodes = [n for n in model.graph.node if n.op_type in PROBED_OPS and n.domain in ("", "ai.onnx")]
    if not nodes:
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - ranks unknown: nothing probed
        return {}
    ranks = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    out = {}
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


_PROBES: dict[tuple[str, int], tuple[list[int], list[int]]] = {}


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
