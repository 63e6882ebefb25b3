"""Which tests must also hold on an AVX2-only CPU (issue 32), read from the test sources with ``ast``.

The suite is written on a CPU with AVX-512, VNNI and bf16; users' and reviewers' CPUs often have AVX2
only, and the runtimes pick their kernels by cpuid (int8 pairs summed in saturating int16, bf16
compiled to fp32, other summation orders). A test that runs a runtime, a converter or a backend and
asserts a numeric bound on what it computed must therefore say which kind it is:

- ``@pytest.mark.kernels``: its expectation touches kernel arithmetic; ``.ci/run`` runs these tests
  again under an emulated AMD EPYC-Rome (AVX2, F16C; no AVX-512, VNNI or bf16:
  ``scripts/emulated_cpu.sh``), and fails when one fails there;
- ``@pytest.mark.isa_independent("reason")``: the bound holds on every x86-64 CPU, and the reason says
  why (a runtime compared with itself, a bound on float64 arithmetic done here, ...): a string, a
  module constant, or one of ``tests/isa_reasons.py``'s shared reasons imported by name.

Either can be given to a test, its class, or its whole module (``pytestmark``). What counts:

- *runs a runtime*: the test, a function of its module it calls, or a fixture it requests (its own
  module's or ``conftest.py``'s) refers to a name imported from one of :data:`RUNTIME_MODULES`
  (imports inside functions and ``pytest.importorskip("...")`` count);
- *asserts a numeric bound*: an ``assert`` (or a ``numpy.testing.assert_*`` call) with an order
  comparison (``<``, ``<=``, ``>``, ``>=``) involving a float literal or an UPPER_CASE constant, or any
  order comparison one side of which names a measure (:data:`MEASURE_WORDS`: ``nrmse <= tol``,
  ``row["ulps"] < 4``, ``err > 0``) or reduces an array (:data:`REDUCTIONS`: ``np.abs(a - b).max() <= step``)
  outside a ``len(...)``; a tolerance (``pytest.approx``, ``np.allclose``, ``np.isclose``,
  ``assert_allclose``, ``assert_array_almost_equal``, ``rtol=``/``atol=``) or an exact equality of arrays
  (``np.array_equal``, ``assert_array_equal``: bit-identity depends on the kernels too), in the test or a
  function of its module it calls; ``(a == b).all()`` counts as an exact equality of arrays. Not seen (a
  limit of reading the source): an order comparison of two lowercase names neither of which names a
  measure (``assert a < b``), equality of strings that quote a computed value, ``pytest.fail`` under an
  ``if``, ``unittest``'s ``self.assert*`` and helpers reached through a class or another module's function
  that is not a test helper module.

*Runs a runtime* also counts: ``import anpred`` (the API's ``test``/``check``), ``sys.executable`` (a test
that starts ``python -m anpred ...`` or a worker), and a helper module of the tests (``tests/<name>.py``:
``run_models``, ``check_runs``, another test module) that imports a runtime itself or through another one.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
REASONS = TESTS / "isa_reasons.py"  # the reasons shared by many modules
# libraries and project modules that run a runtime, a converter or a backend (or export a model with one)
RUNTIME_MODULES = (
    "onnxruntime",
    "openvino",
    "torch",
    "tensorflow",
    "keras",
    "tvm",
    "MNN",
    "ncnn",
    "pnnx",
    "ai_edge_litert",
    "tflite_runtime",
    "onnx2tf",
    "onnx2torch",
    "tf2onnx",
    "onnxconverter_common",
    "onnx.reference",
    "anpred.backends",
    "anpred.run",
    "anpred.pipeline",
    "anpred.task",
    "anpred.campaign",
    "anpred.drill",
    "anpred.cli",
    "anpred.commands",
    "anpred.conformance",
    "models",
    "exporters",
)
# ``import anpred`` / ``from anpred import test``: the Python API's test and check run the backends
RUNTIME_API = "anpred"
TOLERANCE_CALLS = frozenset(
    {
        "approx",
        "allclose",
        "isclose",
        "assert_allclose",
        "assert_array_almost_equal",
        "assert_almost_equal",
        "assert_array_max_ulp",
        "assert_array_almost_equal_nulp",
        "assert_close",
        "assert_array_less",
        # exact equality of computed arrays: bit-identity depends on the kernels too
        "array_equal",
        "assert_array_equal",
    }
)
TOLERANCE_KEYWORDS = frozenset({"rtol", "atol", "rel", "abs"})
MARKERS = ("kernels", "isa_independent")
# words that name a measure of computed values in an order comparison (``nrmse < tol``, ``r["ulps"] <= 4``)
MEASURE_WORDS = re.compile(r"(?i)(rmse|err|ulp|snr|sqnr|cos|ratio|dist|diff|delta|tol|mae|max_abs|deviat|drift)")
# reductions of an array whose result an order comparison bounds (``np.abs(a - b).max() < 1e-6``)
REDUCTIONS = frozenset(
    {"max", "amax", "nanmax", "mean", "nanmean", "norm", "abs", "std", "sqrt", "median", "percentile", "quantile"}
)


def _is_runtime(module: str) -> bool:
    """A module of :data:`RUNTIME_MODULES`, the API package itself, or one of the tests' own helper modules
    (``tests/<name>.py``, imported as ``name`` or ``tests.name``: ``run_models``, ``check_runs``, another
    test module) that imports one of them, directly or through another helper module."""
    if module == RUNTIME_API or any(module == m or module.startswith(m + ".") for m in RUNTIME_MODULES):
        return True
    return _helper_runs_a_runtime(module.removeprefix("tests."))


_HELPERS: dict[Path, bool] = {}
_FOLDERS = [TESTS]  # where the tests' helper modules are looked for (the folders of the modules read)


def _helper_runs_a_runtime(name: str) -> bool:
    paths = [f / f"{name}.py" for f in _FOLDERS if "." not in name and (f / f"{name}.py").is_file()]
    if not paths:
        return False
    path = paths[0]
    if path not in _HELPERS:
        _HELPERS[path] = False  # an import cycle between helpers sees nothing new
        tree = ast.parse(path.read_text(), str(path))
        _HELPERS[path] = any(
            _runtime_imports(n) or _starts_python(n)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom, ast.Attribute))
        )
    return _HELPERS[path]


def _starts_python(node: ast.AST) -> bool:
    """``sys.executable``: a test that starts Python (``python -m anpred ...``, a worker) runs what it runs."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "executable"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _runtime_imports(node: ast.AST) -> set[str]:
    """Names bound by runtime imports directly in ``node``'s body (not nested functions)."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names if _is_runtime(a.name)}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names |= {
                a.asname or a.name for a in n.names if _is_runtime(n.module) or _is_runtime(f"{n.module}.{a.name}")
            }
    return names


def _imports_runtime_inline(fn: ast.AST) -> bool:
    for n in ast.walk(fn):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and _runtime_imports(n):
            return True
        if _starts_python(n):
            return True
        if (
            isinstance(n, ast.Call)
            and getattr(n.func, "attr", getattr(n.func, "id", "")) == "importorskip"
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and _is_runtime(str(n.args[0].value))
        ):
            return True
    return False


def _names_a_measure(node: ast.AST) -> bool:
    """Whether ``node`` holds a measure of computed values: a name, attribute or string key from
    :data:`MEASURE_WORDS` (``nrmse``, ``r.error``, ``row["ulps"]``) or a reduction of an array
    (:data:`REDUCTIONS`: ``np.abs(a - b).max()``)."""
    counted = {
        id(c)
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "len"
        for c in ast.walk(n)
    }  # a count (``len(errors) >= 3``) is not a measure
    keys = {id(n.slice) for n in ast.walk(node) if isinstance(n, ast.Subscript)}  # ``row["ulps"]``, not "--atol"
    for s in ast.walk(node):
        if id(s) in counted:
            continue
        word = (
            s.id
            if isinstance(s, ast.Name)
            else s.attr
            if isinstance(s, ast.Attribute)
            else s.value
            if isinstance(s, ast.Constant) and isinstance(s.value, str) and id(s) in keys
            else None
        )
        if word is not None and MEASURE_WORDS.search(word):
            return True
        if isinstance(s, ast.Call) and getattr(s.func, "attr", getattr(s.func, "id", "")) in REDUCTIONS:
            return True
    return False


def _is_bound(expr: ast.AST) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for o in n.ops):
            for s in ast.walk(n):
                if isinstance(s, ast.Constant) and isinstance(s.value, float):
                    return True
                if isinstance(s, ast.Name) and len(s.id) > 1 and s.id.isupper():
                    return True
            # against an integer literal or a lowercase variable: a bound when a side measures computed values
            if _names_a_measure(n):
                return True
        if isinstance(n, ast.Call):
            if getattr(n.func, "attr", getattr(n.func, "id", "")) in TOLERANCE_CALLS:
                return True
            # ``(a == b).all()``: an exact equality of arrays, element by element
            if (
                getattr(n.func, "attr", "") in ("all", "any")
                and isinstance(n.func, ast.Attribute)
                and any(isinstance(c, ast.Compare) for c in ast.walk(n.func.value))
            ):
                return True
            if any(k.arg in TOLERANCE_KEYWORDS for k in n.keywords):
                return True
    return False


def _own_bounds(fn: ast.AST) -> list[int]:
    lines = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Assert) and _is_bound(n.test):
            lines.append(n.lineno)
        elif (
            isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "attr", "").startswith("assert_")
            and _is_bound(n.value)
        ):
            lines.append(n.lineno)
    return lines


def _marks(decorators: list[ast.expr], strings: dict[str, str]) -> dict[str, str | None]:
    """``{marker: first string argument or None}`` of the ``pytest.mark.<marker>`` among ``decorators``
    (or a ``pytestmark`` value's elements); a name argument is looked up in the module's ``strings``."""
    out = {}
    for d in decorators:
        call = d if isinstance(d, ast.Call) else None
        target = call.func if call else d
        if isinstance(target, ast.Attribute) and target.attr in MARKERS:
            arg = call.args[0] if call and call.args else None
            if isinstance(arg, ast.Name):
                out[target.attr] = strings.get(arg.id)
            else:
                out[target.attr] = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    return out


def _strings(tree: ast.Module) -> dict[str, str]:
    """The module-level string constants of ``tree``: name -> value."""
    return {
        t.id: stmt.value.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
        for t in stmt.targets
        if isinstance(t, ast.Name)
    }


def _is_fixture(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if getattr(target, "attr", getattr(target, "id", "")) == "fixture":
            return True
    return False


@dataclass
class _Module:
    """One parsed test module: its functions (``Class.name`` for methods), fixtures, runtime names and
    markers given to the whole module or to a class."""

    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    fixtures: dict[str, ast.FunctionDef] = field(default_factory=dict)
    runtime_names: set[str] = field(default_factory=set)
    module_marks: dict[str, str | None] = field(default_factory=dict)
    class_marks: dict[str, dict[str, str | None]] = field(default_factory=dict)
    fn_marks: dict[str, dict[str, str | None]] = field(default_factory=dict)


def _parse(path: Path) -> _Module:
    tree = ast.parse(path.read_text(), str(path))
    m = _Module(
        runtime_names={
            n for stmt in tree.body if isinstance(stmt, (ast.Import, ast.ImportFrom)) for n in _runtime_imports(stmt)
        }
    )
    strings = _strings(tree)
    for stmt in tree.body:  # the shared reasons (tests/isa_reasons.py)
        if isinstance(stmt, ast.ImportFrom) and stmt.module == REASONS.stem and REASONS.is_file():
            shared = _strings(ast.parse(REASONS.read_text()))
            strings.update({a.asname or a.name: shared[a.name] for a in stmt.names if a.name in shared})
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            m.functions[stmt.name] = stmt
            m.fn_marks[stmt.name] = _marks(stmt.decorator_list, strings)
            if _is_fixture(stmt):
                m.fixtures[stmt.name] = stmt
        elif isinstance(stmt, ast.ClassDef):
            m.class_marks[stmt.name] = _marks(stmt.decorator_list, strings)
            for f in stmt.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    m.functions[f"{stmt.name}.{f.name}"] = f
                    m.fn_marks[f"{stmt.name}.{f.name}"] = _marks(f.decorator_list, strings)
        elif isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in stmt.targets):
            values = stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
            m.module_marks = _marks(values, strings)
    return m


class _Uses:
    """Memoized "runs a runtime" / "asserts a bound" over a module's call graph, its fixtures and
    conftest's fixtures."""

    def __init__(self, module: _Module, conftest: _Module):
        self.m, self.conftest = module, conftest
        self.memo: dict[tuple[int, str], tuple[bool, list[int]]] = {}

    def _callees(self, fn: ast.AST, scope: _Module) -> list[str]:
        return [
            n.func.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in scope.functions
        ]

    def of(self, name: str, scope: _Module) -> tuple[bool, list[int]]:
        """``(runs a runtime, lines of numeric bounds)`` of ``scope``'s function ``name``."""
        key = (id(scope), name)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = (False, [])  # a recursion sees nothing new
        fn = scope.functions[name]
        runtime = _imports_runtime_inline(fn) or any(
            isinstance(n, ast.Name) and n.id in scope.runtime_names for n in ast.walk(fn)
        )
        bounds = _own_bounds(fn)
        for callee in self._callees(fn, scope):
            r, b = self.of(callee, scope)
            runtime, bounds = runtime or r, bounds + b
        for arg in fn.args.args:
            for fixtures in (scope.fixtures, self.conftest.fixtures):
                if arg.arg in fixtures and arg.arg != name:
                    runtime = runtime or self.of(arg.arg, scope if fixtures is scope.fixtures else self.conftest)[0]
        self.memo[key] = (runtime, bounds)
        return self.memo[key]


def unmarked(paths: list[Path], conftest: Path) -> list[str]:
    """``"file::test: bound at line N"`` for each test that runs a runtime and asserts a numeric bound
    without ``kernels`` or an ``isa_independent`` with a reason."""
    _FOLDERS[:] = sorted({p.parent for p in paths}) or [TESTS]
    cf = _parse(conftest) if conftest.is_file() else _Module()
    out = []
    for path in paths:
        m = _parse(path)
        uses = _Uses(m, cf)
        for name, fn in m.functions.items():
            if not fn.name.startswith("test_") or name in m.fixtures:
                continue
            marks = {**m.module_marks, **m.class_marks.get(name.split(".")[0], {}), **m.fn_marks[name]}
            if "kernels" in marks or (marks.get("isa_independent") or "").strip():
                continue
            runtime, bounds = uses.of(name, m)
            if runtime and bounds:
                out.append(f"{path.name}::{name}: bound at line {min(bounds)}")
    return out


def test_every_test_bounding_a_runtime_result_says_whether_it_depends_on_the_cpu():
    """Mark it ``@pytest.mark.kernels`` (and make it pass under ``scripts/emulated_cpu.sh``'s python:
    docs/run.md) or ``@pytest.mark.isa_independent("why the bound holds on every x86-64 CPU")``."""
    left = unmarked(sorted(TESTS.glob("test_*.py")), TESTS / "conftest.py")
    assert not left, (
        "these tests run a runtime and assert a numeric bound without saying whether it depends on the CPU:\n"
        + "\n".join(left)
        + "\nmark each `@pytest.mark.kernels` (it must then pass under .venv/bin/python-emu, docs/run.md, 'The"
        " emulated AVX2-only CPU') or `@pytest.mark.isa_independent(REASON)` (a reason of tests/isa_reasons.py,"
        " or your own sentence)"
    )


def test_the_check_sees_an_unmarked_test(tmp_path):
    """The rule can fail: a runtime through a module helper, a conftest fixture or an inline import,
    a bound by constant, float literal, tolerance, a measure against an integer or a reduction against a
    variable (a count is not a bound); a helper module of the tests that imports a runtime, ``sys.executable``,
    the API package; ``assert_close`` and ``(a == b).all()``; markers on the test, its class or its module; an
    ``isa_independent`` without a reason does not count."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef sess():\n    import onnxruntime\n    return onnxruntime\n"
    )
    (tmp_path / "test_a.py").write_text('''
import numpy as np
import pytest
from anpred.run import run_model

BAR = 2

def _run(x):
    return run_model(x)

def test_helper():
    assert _run(1) <= BAR

def test_fixture(sess):
    np.testing.assert_allclose(sess.run(), 1)

def test_inline():
    import openvino
    assert openvino.x() < 0.5

def test_no_runtime():
    assert np.float32(1) < 2.0

def test_no_bound():
    assert _run(1) == 3

@pytest.mark.kernels
def test_marked():
    assert _run(1) <= BAR

@pytest.mark.isa_independent("")
def test_no_reason():
    assert _run(1) <= BAR

@pytest.mark.isa_independent("compares ONNX Runtime with itself")
def test_reason():
    assert _run(1) <= BAR

@pytest.mark.kernels
class TestClass:
    def test_in_class(self):
        assert _run(1) == pytest.approx(2)

def test_exact():
    np.testing.assert_array_equal(_run(1), np.ones(3))

def test_measure_against_int():
    nrmse = _run(1)
    assert nrmse <= 4

def test_reduction_against_name():
    got, step = _run(1), 2
    assert np.abs(got - 1).max() <= step

def test_count_is_not_a_measure():
    errors = _run(1)
    assert len(errors) >= 3

def test_helper_module(tmp_path):
    from case_helpers import build
    assert build() < 0.5

def test_helper_module_without_runtime():
    from plain_helpers import build
    assert build() < 0.5

def test_subprocess():
    import subprocess, sys
    out = subprocess.run([sys.executable, "-m", "anpred", "test"], capture_output=True)
    assert (np.frombuffer(out.stdout) == 1).all()

def test_api_assert_close():
    import anpred
    torch_testing.assert_close(anpred.test("m.onnx"), 1)

def test_cli_option_set():
    flat = _run(1)
    assert {"--atol", "--rtol"} <= set(flat)
''')
    (tmp_path / "case_helpers.py").write_text(
        "from anpred.run import run_model\n\ndef build():\n    return run_model()\n"
    )
    (tmp_path / "plain_helpers.py").write_text("import numpy as np\n\ndef build():\n    return np.float32(0)\n")
    (tmp_path / "test_b.py").write_text(
        "import pytest\nimport torch\n\npytestmark = [pytest.mark.kernels]\n\n\ndef test_m():\n"
        "    assert torch.ones(1).item() > 0.5\n"
    )
    got = unmarked([tmp_path / "test_a.py", tmp_path / "test_b.py"], tmp_path / "conftest.py")
    assert got == [
        "test_a.py::test_helper: bound at line 12",
        "test_a.py::test_fixture: bound at line 15",
        "test_a.py::test_inline: bound at line 19",
        "test_a.py::test_no_reason: bound at line 33",
        "test_a.py::test_exact: bound at line 45",
        "test_a.py::test_measure_against_int: bound at line 49",
        "test_a.py::test_reduction_against_name: bound at line 53",
        "test_a.py::test_helper_module: bound at line 61",
        "test_a.py::test_subprocess: bound at line 70",
        "test_a.py::test_api_assert_close: bound at line 74",
    ]


def test_the_markers_are_registered_and_ci_runs_the_kernels_subset_emulated():
    """pytest knows both markers (``--strict-markers`` would refuse a typo), and ``.ci/run`` runs
    ``-m "kernels and not slow"`` with the emulated CPU's python."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {m.split(":")[0].split("(")[0].strip() for m in cfg["markers"]}
    assert {"kernels", "isa_independent", "slow"} <= registered
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/emulated_cpu.sh" in ci
    assert '.venv/bin/python-emu -m pytest -q -m "kernels and not slow"' in ci
