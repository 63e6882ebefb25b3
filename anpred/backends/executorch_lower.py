"""Lowering an exported program to an ExecuTorch ``.pte``, what ran where, and running it.

Flows (:func:`lower`):

* ``portable``: ``to_edge_transform_and_lower`` without a partitioner: every operator runs on
  ExecuTorch's own CPU kernels. The wheel's runtime (``executorch.extension.pybindings._C``) links
  ``libexecutorch_kernels_optimized``: the operators it has an optimized kernel for (``opt_<op>_out``
  symbols: add, mul, linear, bmm, native_layer_norm ... read from the library itself,
  :func:`optimized_ops`) run those, every other one the portable kernel; quantize/dequantize run
  ``libexecutorch_kernels_quantized``.
* ``xnnpack``: with ``XnnpackPartitioner()``: the partitions XNNPACK takes run in its delegate, what it
  leaves runs as in ``portable``.

The lowering report (:func:`delegation_report`, from ExecuTorch's own
``executorch.devtools.backend_debug.get_delegation_info``): partitions (delegated subgraphs), operators
delegated and left outside by type, and the kernel library of each operator left outside. A lowering
failure is a :class:`~anpred.errors.BackendError` naming the operator being lowered when it failed
(the innermost ``torch.fx.Node`` of the traceback, :func:`failing_node`).

Programs are cached (:mod:`anpred.cache`, kind ``executorch``) by the caller's key.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.backends.executorch_etdump import debug_buffer_bytes, operator_sequence, output_writers
from anpred.errors import BackendError

__all__ = [
    "EtProgram",
    "Lowered",
    "cached_lowering",
    "delegation_report",
    "et_runtime",
    "et_versions",
    "failing_node",
    "kernel_library_of",
    "lower",
    "optimized_ops",
    "summary",
]


@dataclass
class Lowered:
    """A lowered program: ``pte`` (bytes) and its report (:func:`delegation_report` keys)."""

    pte: bytes
    report: dict[str, Any] = field(default_factory=dict)


def et_versions() -> dict[str, str]:
    """Versions an ExecuTorch result depends on: executorch, torch, torchao (PT2E quantizer)."""
    import importlib.metadata as md

    import torch

    out = {"executorch": md.version("executorch"), "torch": torch.__version__}
    try:
        out["torchao"] = md.version("torchao")
    except md.PackageNotFoundError:
        pass
    return out


@functools.lru_cache(maxsize=1)
def optimized_ops() -> frozenset[str]:
    """ATen operator names (``add``, ``linear`` ...) that the installed runtime's optimized kernel
    library implements, read from the ``opt_<op>_out`` symbols of ``libexecutorch_kernels_optimized.so``
    (empty when the wheel has none)."""
    import executorch  # a namespace package: no __file__

    lib = Path(next(iter(executorch.__path__))) / "lib" / "libexecutorch_kernels_optimized.so"
    if not lib.is_file():
        return frozenset()
    names = re.findall(rb"\d+opt_([a-z0-9_]+?)_out", lib.read_bytes())
    return frozenset(n.decode() for n in names)


def _kernel_library(op: str) -> str:
    """``optimized``/``portable``/``quantized`` for an edge operator type as the delegation report
    names it (``aten_convolution_default``, ``quantized_decomposed_quantize_per_tensor_default``)."""
    if op.startswith("quantized_decomposed"):
        return "quantized"
    base = re.sub(r"^aten_", "", op)
    base = re.sub(r"_(default|tensor|scalar|vec|int|dim|self|out|intlist|using_ints|tensor_mode)$", "", base)
    base = re.sub(r"_copy$", "", base)
    return "optimized" if base in optimized_ops() else "portable"


def kernel_library_of(instruction: str) -> str:
    """``optimized``/``portable``/``quantized`` for a kernel as the execution plan names it
    (``aten::add.out``, ``aten::convolution.out``, ``quantized_decomposed::quantize_per_tensor.out``)."""
    if instruction.startswith("quantized_decomposed"):
        return "quantized"
    base = re.sub(r"_copy$", "", instruction.split("::")[-1].split(".")[0])
    return "optimized" if base in optimized_ops() else "portable"


def delegation_report(edge_manager) -> dict[str, Any]:
    """What ran where in a lowered ``EdgeProgramManager`` (``forward``): ``partitions`` (delegated
    subgraphs), ``delegated_ops``/``outside_ops`` (edge operator type -> count; getitem left out),
    ``outside_kernels`` (operator type -> ``optimized``/``portable``/``quantized``)."""
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge_manager.exported_program().graph_module)
    inside, outside = {}, {}
    for op, b in info.delegation_by_operator.items():
        if op == "getitem":
            continue
        if b.delegated:
            inside[op] = b.delegated
        if b.non_delegated:
            outside[op] = b.non_delegated
    return {
        "partitions": info.num_delegated_subgraphs,
        "delegated_ops": dict(sorted(inside.items())),
        "outside_ops": dict(sorted(outside.items())),
        "outside_kernels": {op: _kernel_library(op) for op in sorted(outside)},
    }


def failing_node(tb) -> str:
    """The innermost ``torch.fx.Node`` held in a local variable of the frames of traceback ``tb``, as
    ``<op target> (node <name>)``; "" when none (the failure is not inside an operator's lowering)."""
    import torch.fx

    found = ""
    while tb is not None:
        for v in tb.tb_frame.f_locals.values():
            if isinstance(v, torch.fx.Node) and v.op == "call_function":
                found = f"{getattr(v.target, '__name__', v.target)} (node {v.name})"
                break
        tb = tb.tb_next
    return found


def lower(program, flow: str, what: str) -> Lowered:
    """Lower ``program`` (``torch.export.ExportedProgram``) with ``flow`` (``portable``/``xnnpack``,
    module docstring) and serialize it.

    Raises:
        BackendError: the lowering failed; the message names the operator it was lowering.
    """
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    partitioner = []
    if flow == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    elif flow != "portable":
        raise BackendError(f"unknown ExecuTorch flow {flow!r} (portable, xnnpack)")
    quantized = any("quantized_decomposed" in str(n.target) for n in program.graph.nodes)
    if quantized:
        import executorch.kernels.quantized  # noqa: F401 - the out variants of quantize/dequantize
    try:
        # the quantized portable program keeps quantize/dequantize as ExecuTorch custom ops, which the
        # edge dialect's ATen validity check does not know
        edge = to_edge_transform_and_lower(
            program, partitioner=partitioner, compile_config=EdgeCompileConfig(_check_ir_validity=not quantized)
        )
        report = delegation_report(edge)
        et = edge.to_executorch()
        pte = et.buffer
    except Exception as err:
        where = failing_node(err.__traceback__)
        text = " ".join(str(err).split())[:300]
        raise BackendError(
            f"ExecuTorch {flow} lowering of {what} failed"
            + (f" at operator {where}" if where else "")
            + f": {type(err).__name__}: {text}"
        ) from err
    # what the ETDump capture needs (anpred.backends.executorch_etdump)
    report["instructions"] = operator_sequence(et.executorch_program)
    report["output_writers"] = output_writers(et.executorch_program)
    report["debug_buffer_bytes"] = debug_buffer_bytes(et.executorch_program)
    return Lowered(pte, report)


def et_runtime():
    """ExecuTorch's runtime (``executorch.runtime.Runtime``) with the quantized kernel library
    registered: the pybindings' runtime has quantize/dequantize kernels only once
    ``executorch.kernels.quantized`` is imported (a program from the cache, loaded in a fresh process,
    otherwise fails with ``Missing operator: quantized_decomposed::dequantize_per_tensor.out``). At
    first load on x86 its cpuinfo prints ``Failed to open midr file ...`` on stderr (an ARM register it
    probes): harmless."""
    import executorch.kernels.quantized  # noqa: F401 - registers the quantized kernels
    from executorch.runtime import Runtime

    return Runtime.get()


class EtProgram:
    """A ``.pte`` loaded in ExecuTorch's runtime: ``run(list of numpy arrays) -> list of numpy arrays``
    (``forward``)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        runtime = et_runtime()
        try:
            self.method = runtime.load_program(str(self.path)).load_method("forward")
        except Exception as err:
            raise BackendError(f"ExecuTorch runtime cannot load {self.path.name}: {type(err).__name__}: {err}") from err

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        import torch

        outs = self.method.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        return [o.detach().numpy().copy() if isinstance(o, torch.Tensor) else np.asarray(o) for o in outs]


def cached_lowering(key: str, build) -> tuple[Path, dict[str, Any]]:
    """The cached ``(model.pte path, report)`` under key ``key`` (kind ``executorch``); ``build()``
    returns a :class:`Lowered` (plus extra report entries) when it is not cached yet."""
    from anpred.cache import cached_dir

    def fill(tmp: Path) -> None:
        low = build()
        (tmp / "model.pte").write_bytes(low.pte)
        (tmp / "report.json").write_text(json.dumps(low.report, indent=1, default=str))

    d = cached_dir("executorch", key, fill)
    return d / "model.pte", json.loads((d / "report.json").read_text())


def summary(report: dict[str, Any]) -> dict[str, str]:
    """The lowering report as ``versions()`` strings: ``executorch_partitions``,
    ``executorch_delegated_ops``, ``executorch_outside_ops`` (``op:count@kernels``),
    ``executorch_capture`` and ``executorch_observer`` (JSON)."""
    out = {
        "executorch_partitions": str(report.get("partitions", 0)),
        "executorch_delegated_ops": ",".join(f"{k}:{v}" for k, v in report.get("delegated_ops", {}).items()),
        "executorch_outside_ops": ",".join(
            f"{k}:{v}@{report.get('outside_kernels', {}).get(k, '?')}" for k, v in report.get("outside_ops", {}).items()
        ),
    }
    # the capture and the observer effect, without their per-anchor details (instruction of each anchor,
    # outputs compared): versions() is stored with every history entry
    if "capture" in report:
        out["executorch_capture"] = json.dumps(
            {k: v for k, v in report["capture"].items() if k != "writers"}, sort_keys=True
        )
    if "observer" in report:
        out["executorch_observer"] = json.dumps(
            {k: v for k, v in report["observer"].items() if k != "outputs_compared"}, sort_keys=True
        )
    return out
