"""Anchors from ExecuTorch's own intermediate-output capture (ETDump), without extra program outputs.

ExecuTorch's runtime logs, for every operator it executes outside a delegate, the tensor it wrote, when
the program is loaded with ``enable_etdump=True`` and a debug buffer
(``executorch.runtime.Runtime.load_program(..., debug_buffer_size=...)``); the devtools ``Inspector``
reads the ETDump and the debug buffer back as events keyed by the instruction that wrote them. An
XNNPACK partition logs only its own outputs (one ``DELEGATE_CALL``), so this capture serves programs
without a delegate (``executorch``, ``executorch-int8``, ``executorch-fp16``); the XNNPACK backends read
anchors as extra outputs (:mod:`anpred.backends.executorch`).

Which instruction writes an anchor is read off the program that has the anchors as outputs: its
execution plan's ``outputs`` are value indices, and the ``KernelCall`` whose out argument is that value
(or holds it in its output tensor list) writes it (:func:`output_writers`). The program **without** the
anchor outputs is the one run; the two programs must execute the same operators in the same order
(:func:`operator_sequence`, checked at lowering), so the instruction indices carry over. Where they do
not, or an anchor is not written by a kernel call, the backend falls back to extra outputs and says
why (``versions()['executorch_capture']``).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from anpred.errors import BackendError

__all__ = ["EtdumpProgram", "debug_buffer_bytes", "operator_sequence", "output_writers"]

#: bytes per element of ExecuTorch's ScalarType values (``executorch/exir/scalar_type.py``); unknown: 8
_ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 12: 1, 13: 1, 15: 2}


def _plan(et_program):
    return et_program.execution_plan[0]


def operator_sequence(et_program) -> list[str]:
    """The kernel names of the ``forward`` plan's instructions in execution order (``-`` for other
    instructions: moves, jumps, delegate calls)."""
    plan = _plan(et_program)
    out = []
    for ins in plan.chains[0].instructions:
        a = ins.instr_args
        out.append(plan.operators[a.op_index].name if hasattr(a, "op_index") else "-")
    return out


def output_writers(et_program) -> list[list[int | None] | None]:
    """Per program output, ``[instruction index, element index or None]`` of the kernel call that writes
    it (element: its position in an output tensor list), or None when no kernel call writes it."""
    plan = _plan(et_program)
    writes: dict[int, list[int | None]] = {}
    for i, ins in enumerate(plan.chains[0].instructions):
        a = ins.instr_args
        if not hasattr(a, "op_index") or not getattr(a, "args", None):
            continue
        out = a.args[-1]
        val = plan.values[out].val
        items = getattr(val, "items", None)
        if items is not None and type(val).__name__ == "TensorList":
            for k, item in enumerate(items):
                writes[item] = [i, k]
        else:
            writes[out] = [i, None]
    return [writes.get(v) for v in plan.outputs]


def debug_buffer_bytes(et_program) -> int:
    """Bytes every tensor value of the ``forward`` plan takes, plus 1 MiB: a debug buffer that holds
    each operator's output once."""
    total = 0
    for v in _plan(et_program).values:
        t = v.val
        if type(t).__name__ == "Tensor":
            total += math.prod(int(d) for d in t.sizes) * _ITEMSIZE.get(
                int(getattr(t.scalar_type, "value", t.scalar_type)), 8
            )
    return total + (1 << 20)


class EtdumpProgram:
    """The program without anchor outputs, run with ETDump; anchors read from the debug buffer.

    ``writers``: anchor name -> ``[instruction index, element or None]``; ``outputs``: the program's
    outputs (anchor names), returned as such."""

    def __init__(self, path: Path, writers: dict[str, list], outputs: list[str], buffer_bytes: int):
        self.path, self.writers, self.outputs, self.buffer_bytes = Path(path), writers, outputs, int(buffer_bytes)

    def run(self, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Anchor name -> array for one sample (program outputs and the anchors the ETDump holds).

        Raises:
            BackendError: an anchor's instruction logged no tensor (the debug buffer overflowed, or the
                runtime skipped it)."""
        import executorch.kernels.quantized  # noqa: F401 - quantized kernels (see executorch_lower.et_runtime)
        import torch
        from executorch.devtools import Inspector
        from executorch.runtime import Runtime

        prog = Runtime.get().load_program(str(self.path), enable_etdump=True, debug_buffer_size=self.buffer_bytes)
        outs = prog.load_method("forward").execute([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        res = {n: o.detach().numpy().copy() for n, o in zip(self.outputs, outs)}
        with tempfile.TemporaryDirectory() as tmp:
            etdp, buf = Path(tmp) / "run.etdp", Path(tmp) / "debug.bin"
            prog.write_etdump_result_to_file(str(etdp), str(buf))
            logged = self._logged(Inspector(etdump_path=str(etdp), debug_buffer_path=str(buf)))
        for name, (instr, elem) in self.writers.items():
            if name in res:
                continue
            data = logged.get(instr)
            if not data or (elem or 0) >= len(data):
                raise BackendError(
                    f"ETDump holds no tensor for anchor {name} (instruction {instr}; debug buffer "
                    f"{self.buffer_bytes} bytes)"
                )
            res[name] = np.array(data[elem or 0], copy=True)
        return res

    @staticmethod
    def _logged(inspector) -> dict[int, list[Any]]:
        """Instruction index -> the tensors it wrote, from the ``Execute`` block of an Inspector."""
        import torch

        logged: dict[int, list[Any]] = {}
        for block in inspector.event_blocks:
            if block.name != "Execute":
                continue
            for ev in block.events:
                iid = getattr(ev, "_instruction_id", None)
                if iid is None or not ev.debug_data or iid in logged:
                    continue
                logged[iid] = [
                    t.detach().clone().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
                    for t in _flat(ev.debug_data)
                ]
        return logged


def _flat(data) -> list[Any]:
    """An event's ``debug_data`` as one list of tensors: an operator that writes a tensor list
    (``split_with_sizes_copy``, ``unbind_copy``) logs it as one nested list, whose tensors may differ
    in shape (yolov5n's head splits ``(1, 3, 40, 40, 85)`` into 2, 2 and 81 channels)."""
    out: list[Any] = []
    for t in data:
        if isinstance(t, (list, tuple)):
            out.extend(_flat(t))
        else:
            out.append(t)
    return out
