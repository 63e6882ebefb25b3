"""Cases in ONNX's backend-test layout and the suite's own tolerance.

Layout (``onnx/backend/test/data/<kind>/``, as ``onnx.backend.test.loader`` reads it)::

    FOLDER/<case>/model.onnx
    FOLDER/<case>/test_data_set_<n>/input_<i>.pb    (TensorProto; SequenceProto/OptionalProto too)
    FOLDER/<case>/test_data_set_<n>/output_<i>.pb   (the expected outputs)
    FOLDER/<case>/data.json                          (optional: {"rtol": r, "atol": a})

The default folder is ONNX's node conformance suite (1,765 single-operator cases of onnx 1.22.0)
extracted by ``scripts/setup.sh`` into the virtual environment (:func:`default_folder`); any folder in
the same layout (a runtime's own test data) is taken as well.

Tolerance: ONNX's runner compares each output with ``numpy.testing.assert_allclose(out, ref, rtol,
atol)`` (``onnx/backend/test/runner/__init__.py``, ``Runner.assert_similar_outputs``), with the case's
``rtol``/``atol`` from the loader (``onnx/backend/test/loader/__init__.py``: defaults ``rtol = 1e-3``,
``atol = 1e-7``, a case's ``data.json`` overriding them; the node cases generated in Python carry the
same defaults, ``onnx/backend/test/case/node/__init__.py``), and ``rtol`` at least ``2**-6`` (two
bfloat16 ULPs) for bfloat16 outputs. :func:`suite_tolerance` reads those numbers from the installed
onnx package's loader (not copied here), so the judgment follows the suite.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from anpred.errors import InputError

__all__ = ["Case", "default_folder", "find_cases", "load_case", "suite_tolerance", "DATA_SUBDIR"]

#: where scripts/setup.sh extracts the node cases, relative to the virtual environment (``sys.prefix``)
DATA_SUBDIR = Path("share") / "anpred" / "onnx-1.22.0" / "node"


@dataclass
class Case:
    """One case: ``name`` (its folder's name), ``folder``, ``model`` (path), ``inputs`` ({graph input
    name: array}, the first data set), ``expected`` (list of arrays in graph-output order), ``outputs``
    (graph output names), ``op`` (operator types of the graph's nodes, joined by ``+``), ``opset``
    (default domain), ``rtol``/``atol`` (the suite's), ``kinds`` (what is not a tensor among inputs and
    outputs, e.g. ``sequence``: such cases are not run)."""

    name: str
    folder: Path
    model: Path
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    expected: list[np.ndarray] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    op: str = ""
    opset: int = 0
    rtol: float = 1e-3
    atol: float = 1e-7
    kinds: list[str] = field(default_factory=list)

    @property
    def float32(self) -> bool:
        """Every input and expected output a float32 tensor (the suite's float cases)."""
        arrays = list(self.inputs.values()) + list(self.expected)
        return not self.kinds and bool(arrays) and all(a.dtype == np.float32 for a in arrays)

    def dtypes(self) -> str:
        ins = sorted({str(a.dtype) for a in self.inputs.values()})
        outs = sorted({str(a.dtype) for a in self.expected})
        return f"{'/'.join(ins) or '-'} -> {'/'.join(outs) or '-'}"


def default_folder() -> Path:
    """The node cases extracted by ``scripts/setup.sh`` into this environment:
    ``sys.prefix / DATA_SUBDIR``."""
    return Path(sys.prefix) / DATA_SUBDIR


def find_cases(folder: str | Path | None = None, patterns: list[str] | None = None) -> list[Path]:
    """Case folders (holding ``model.onnx``) of ``folder`` (default :func:`default_folder`), sorted by
    name, those matching one of the shell ``patterns`` (``test_conv*``) when given.

    Raises:
        InputError: the folder does not exist or holds no case (the message says how to get the suite).
    """
    root = Path(folder) if folder is not None else default_folder()
    if not root.is_dir():
        hint = (
            " (the ONNX node cases are installed by scripts/setup.sh from the onnx 1.22.0 sdist on PyPI)"
            if folder is None
            else ""
        )
        raise InputError(f"conformance: no case folder {root}{hint}")
    found = sorted(p for p in root.iterdir() if (p / "model.onnx").is_file())
    if patterns:
        found = [p for p in found if any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)]
    if not found:
        raise InputError(
            f"conformance: no case (<case>/model.onnx) in {root}"
            + (f" matching {', '.join(patterns)}" if patterns else "")
        )
    return found


def suite_tolerance(folder: Path) -> tuple[float, float]:
    """``(rtol, atol)`` of the case in ``folder`` as ONNX's loader gives it: the loader's defaults,
    overridden by the case's ``data.json`` (read by ``onnx.backend.test.loader.load_model_tests`` on
    a one-case view of the folder)."""
    import tempfile

    from onnx.backend.test.loader import load_model_tests

    with tempfile.TemporaryDirectory(prefix="anpred-tol-") as tmp:
        kind = Path(tmp) / "cases"  # a kind other than "node" (which the loader generates in Python)
        kind.mkdir()
        (kind / folder.name).symlink_to(folder.resolve(), target_is_directory=True)
        cases = load_model_tests(data_dir=tmp, kind="cases")
    return float(cases[0].rtol), float(cases[0].atol)


def _read_tensor(path: Path) -> np.ndarray:
    """A ``.pb`` TensorProto as a numpy array."""
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def load_case(folder: str | Path) -> Case:
    """Read the case in ``folder`` (its first data set; the tolerance of :func:`suite_tolerance`).

    Raises:
        InputError: no ``model.onnx`` or no ``test_data_set_*``; ModelLoadError: unreadable model.
    """
    from anpred.onnx_io import load_model

    folder = Path(folder)
    if not (folder / "model.onnx").is_file():
        raise InputError(f"conformance: {folder} has no model.onnx")
    sets = sorted(folder.glob("test_data_set_*"))
    if not sets:
        raise InputError(f"conformance: {folder} has no test_data_set_*")
    model = load_model(folder / "model.onnx")
    inits = {t.name for t in model.graph.initializer}
    in_names = [vi.name for vi in model.graph.input if vi.name not in inits]
    case = Case(
        name=folder.name,
        folder=folder,
        model=folder / "model.onnx",
        outputs=[o.name for o in model.graph.output],
        op="+".join(dict.fromkeys(n.op_type for n in model.graph.node)),
        opset=next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0),
    )
    number = lambda p: int(p.stem.split("_")[-1])  # noqa: E731 - input_10 after input_9
    in_kinds = [vi.type.WhichOneof("value") for vi in model.graph.input if vi.name not in inits]
    out_kinds = [vi.type.WhichOneof("value") for vi in model.graph.output]
    case.kinds = [f"input {n} {k}" for n, k in zip(in_names, in_kinds) if k != "tensor_type"] + [
        f"output {o} {k}" for o, k in zip(case.outputs, out_kinds) if k != "tensor_type"
    ]
    if case.kinds:  # a sequence/optional/map: read by the onnx runner as another proto; not run here
        return case
    for name, p in zip(in_names, sorted(sets[0].glob("input_*.pb"), key=number)):
        case.inputs[name] = _read_tensor(p)
    case.expected = [_read_tensor(p) for p in sorted(sets[0].glob("output_*.pb"), key=number)]
    case.rtol, case.atol = suite_tolerance(folder)
    return case
