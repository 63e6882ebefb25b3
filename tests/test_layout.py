"""The layout's rules (docs/DESIGN.md, issue 16), read from the sources with ``ast``: every import
statement counts, also those inside functions.

- no import cycle between modules, nor between packages (a module of a subpackage stands for it:
  ``anpred.backends.torch_native`` -> ``anpred.backends``);
- ``passes/`` and ``exporters/`` import from ``anpred/`` only the shared core;
- no module imports another module's private name (``from m import _x``);
- no module over 700 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("anpred", "passes", "exporters", "models")
CORE = {"anpred.errors", "anpred.manifest", "anpred.naming", "anpred.onnx_io", "anpred.cache", "anpred.folders",
        "anpred.compat", "anpred.machine", "anpred.defaults"}
MAX_LINES = 700


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for top in TOPS:
        for p in (root / top).rglob("*.py"):
            name = ".".join(p.relative_to(root).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = p
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> tuple[str | None, bool]:
    """The longest known module prefix of ``name`` and whether ``name`` goes beyond it (an attribute)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        c = ".".join(parts[:k])
        if c in mods:
            return c, k < len(parts)
    return None, False


def import_graph(root: Path):
    """``(mods, edges, private)`` of the sources under ``root``: module -> path, module -> imported
    modules, and the private imports across modules."""
    mods = _modules(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for m, path in mods.items():
        pkg = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                targets = [(f"{base}.{a.name}", a.name) for a in node.names] + [(base, None)]
            else:
                continue
            for full, name in targets:
                if full.split(".")[0] not in TOPS:
                    continue
                target, attr = _resolve(full, mods)
                if target is None or target == m:
                    continue
                edges[m].add(target)
                if name and attr and name.startswith("_") and not name.startswith("__"):
                    private.append(f"{m} imports {target}.{name}")
    return mods, edges, private


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_no_import_cycle_between_modules(graph):
    _, edges, _ = graph
    g = nx.DiGraph([(a, b) for a, bs in edges.items() for b in bs])
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert cycles == [], cycles


def test_no_import_cycle_between_packages(graph):
    mods, edges, _ = graph

    def unit(m: str) -> str:
        parts = m.split(".")
        if len(parts) >= 3:
            return ".".join(parts[:2])
        return m if parts[0] == "anpred" or mods[m].name == "__init__.py" else parts[0]

    g = nx.DiGraph([(unit(a), unit(b)) for a, bs in edges.items() for b in bs if unit(a) != unit(b)])
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert cycles == [], cycles


def test_passes_and_exporters_import_only_the_shared_core(graph):
    _, edges, _ = graph
    upward = {a: sorted(b for b in bs if b.startswith("anpred") and b not in CORE)
              for a, bs in edges.items() if a.split(".")[0] in ("passes", "exporters")}
    assert {a: bs for a, bs in upward.items() if bs} == {}


def test_no_private_name_imported_across_modules(graph):
    assert graph[2] == []


def test_no_module_over_700_lines(graph):
    mods = graph[0]
    long = {m: n for m, p in mods.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path):
    """The rules above can fail: a cycle through an import inside a function, and a private import."""
    pkg = tmp_path / "anpred"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from anpred.b import _g\n    return _g\n")
    (pkg / "b.py").write_text("from anpred import a\n\n\ndef _g():\n    return a\n")
    _, edges, private = import_graph(tmp_path)
    g = nx.DiGraph([(a, b) for a, bs in edges.items() for b in bs])
    assert [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1] == [["anpred.a", "anpred.b"]]
    assert private == ["anpred.a imports anpred.b._g"]
