"""Pre-run coverage: which backends are known not to run a model, and why, before anything runs.

Each backend class answers :meth:`anpred.backends.base.Backend.unsupported_ops` from its library's own
table (a converter's registry, a frontend's convert map, an operator folder), without converting or
compiling the model, and :meth:`~anpred.backends.base.Backend.refused_nodes` below the operator name: the
attribute, dtype and input limits its converter states, asked of the converter itself node by node
(:mod:`anpred.backends.converter_probe`: onnx2torch's converters called on each node; pnnx, TVM's
frontend and onnx2tf (:mod:`anpred.backends.tf_probe`) run on a one-node model of each node, cached by
the node's content) or the backend's own input rule (ncnn:
float32 and integer inputs only). :func:`precheck` asks every backend of a run in one child process
(``python -m anpred.backends.coverage``), so that the libraries are imported there and not in the
driver, and a library that crashes on import costs only the check (its backend is then "unknown").

The run driver (:func:`anpred.run.run_model`) records the answer in ``run.json`` (``meta["coverage"]``),
prints it before the backends run, and does not start a backend with a known unsupported operator: its
status is ``unsupported`` with the operators and the table named in the reason (the report lists it
with the backends that did not run).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["unsupported_by", "precheck", "format_coverage", "refusal"]

FORMAT = "anpred.coverage/1"


def unsupported_by(model_path: str | Path, names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """In this process: ``{label: {"backend", "basis", "ops": {op key: reason}, "error", "node_basis",
    "nodes"}}`` for ``names`` (``{label: registry name}``) on the ONNX model at ``model_path`` (read with
    its weights). ``basis`` is the backend's :attr:`~anpred.backends.base.Backend.coverage_basis` ("" when
    it has no table: its support is known only after converting); ``ops`` holds the table's missing
    operators and the refusals :meth:`~anpred.backends.base.Backend.refused_nodes` found (their keys
    listed in ``nodes``, their source in ``node_basis``); ``error`` is the reason the check itself
    failed ("" otherwise: an unknown backend, a library that does not import)."""
    from anpred.backends import backend_class

    from anpred.onnx_io import load_model

    # with the weights: some tables are asked by converting the graph (OpenVINO's frontend)
    model = load_model(model_path, load_external=True)
    out: dict[str, dict[str, Any]] = {}
    for label, name in names.items():
        row: dict[str, Any] = {"backend": name, "basis": "", "ops": {}, "error": "", "node_basis": "", "nodes": []}
        try:
            cls = backend_class(name)
            row["basis"] = cls.coverage_basis
            row["ops"] = dict(cls.unsupported_ops(model)) if cls.coverage_basis else {}
            row["node_basis"] = cls.node_basis
            if cls.node_basis:  # attribute, dtype and input limits, asked of the converter (converter_probe)
                for key, why in cls.refused_nodes(model).items():
                    if key not in row["ops"]:
                        row["ops"][key] = why
                        row["nodes"].append(key)
        except Exception as err:  # a library that fails to import: the run will say more
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
        out[label] = row
    return out


def _cache_key(model_sha: str, name: str) -> str | None:
    """The cache key of one backend's answer: the model file's sha256, the backend name, the code the
    answers depend on (:func:`_sources`), and the installed versions of every package a backend needs
    (:data:`anpred.backends.FAMILY_PACKAGES`, :data:`~anpred.backends.BACKEND_PACKAGES`); None for an
    unknown backend."""
    from anpred.backends import REGISTRY
    from anpred.cache import cache_key

    if name not in REGISTRY:
        return None
    return cache_key(FORMAT, model_sha, name, _sources(), _versions())


@functools.lru_cache(maxsize=1)
def _sources() -> str:
    """One digest of the code the tables' answers depend on: every module of ``anpred.backends``,
    ``passes`` (graph fixes before conversion), ``anpred/backends/convert.py``,
    ``anpred/backends/onnx2torch_compat.py``, ``anpred/compat.py``,
    ``anpred/onnx_io.py`` (sha256 of their contents, in name order)."""
    import hashlib
    import importlib.util

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [here.parent / f for f in ("convert.py", "compat.py", "onnx_io.py")]
    spec = importlib.util.find_spec("passes")
    if spec is not None and spec.submodule_search_locations:
        files += sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.py"))
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, list[str]]:
    from importlib import metadata

    from anpred.backends import BACKEND_PACKAGES, FAMILY_PACKAGES

    dists = metadata.packages_distributions()
    pkgs = sorted({p for ps in [*FAMILY_PACKAGES.values(), *BACKEND_PACKAGES.values()] for p in ps})
    return {p: [metadata.version(d) for d in dists.get(p, [])] for p in pkgs}


def precheck(model_path: str | Path, names: dict[str, str], timeout_s: float = 300) -> dict[str, dict[str, Any]]:
    """:func:`unsupported_by` in a child process (the backends' libraries are imported there), each
    backend's answer cached under ``<cache>/coverage/`` (:func:`_cache_key`: a model asked again
    with the same libraries and code costs no child process).
    When the child fails or passes ``timeout_s`` seconds, every backend's row has ``error`` set and no
    ops (nothing is refused on a failed check; such rows are not cached). Never raises for a model the
    driver could load."""
    from anpred.cache import cache_root
    from anpred.onnx_io import atomic_write_text, sha256_file

    sha = sha256_file(model_path)
    folder = cache_root() / "coverage"
    keys = {label: _cache_key(sha, name) for label, name in names.items()}
    out: dict[str, dict[str, Any]] = {}
    for label, key in keys.items():
        f = folder / f"{key}.json"
        if key and f.is_file():
            try:
                out[label] = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                pass
    todo = {label: name for label, name in names.items() if label not in out}
    if todo:
        fresh = _precheck_child(model_path, todo, timeout_s)
        folder.mkdir(parents=True, exist_ok=True)
        for label, row in fresh.items():
            if keys[label] and not row.get("error"):
                atomic_write_text(folder / f"{keys[label]}.json", json.dumps(row))
        out.update(fresh)
    return {label: out[label] for label in names}


def _precheck_child(model_path: str | Path, names: dict[str, str], timeout_s: float) -> dict[str, dict[str, Any]]:
    cmd = [sys.executable, "-m", "anpred.backends.coverage", str(model_path), json.dumps(names)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if last:
                return json.loads(last[-1])
        why = (
            f"the coverage check exited with status {proc.returncode}: "
            + (proc.stderr.strip().splitlines() or ["no message"])[-1][:300]
        )
    except subprocess.TimeoutExpired:
        why = f"the coverage check took more than {timeout_s:g} s"
    except (OSError, json.JSONDecodeError) as err:
        why = f"the coverage check failed: {err}"
    return {label: {"backend": name, "basis": "", "ops": {}, "error": why} for label, name in names.items()}


def format_coverage(coverage: dict[str, dict[str, Any]], limit: int = 6) -> list[str]:
    """Text lines for the backends with known unsupported operators (none when every backend can
    run the model as far as its table knows): ``"<label>: cannot run the model: Op (reason); ...
    [table]"``."""
    lines = []
    for label, row in coverage.items():
        ops = row.get("ops") or {}
        if not ops:
            continue
        items = [f"{op} ({why})" if why else op for op, why in list(ops.items())[:limit]]
        more = f" and {len(ops) - limit} more" if len(ops) > limit else ""
        lines.append(f"{label}: cannot run the model: {'; '.join(items)}{more} [{_bases(row)}]")
    return lines


def _bases(row: dict[str, Any]) -> str:
    """What a row's refusals come from: the operator table, the converter asked node by node, or both."""
    nodes = set(row.get("nodes") or [])
    parts = []
    if set(row.get("ops") or {}) - nodes:
        parts.append(row.get("basis") or "no table")
    if nodes:
        parts.append(row.get("node_basis") or "the converter")
    return "; ".join(parts) or row.get("basis") or "no table"


def refusal(row: dict[str, Any]) -> str:
    """The ``unsupported`` status reason of a backend not started because of ``row``'s operators."""
    ops = row.get("ops") or {}
    nodes = set(row.get("nodes") or [])
    listed = "; ".join(f"{op}: {why}" if why else op for op, why in ops.items())
    if not nodes:
        return (
            f"not run: the model uses {len(ops)} operator(s) missing from its "
            f"{row.get('basis') or 'table'} (pre-run coverage): {listed}"
        )
    return (
        f"not run: the pre-run coverage found {len(ops)} operator(s) or input(s) it refuses ({_bases(row)}): {listed}"
    )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        raise SystemExit("usage: python -m anpred.backends.coverage MODEL.onnx '{\"label\": \"backend\"}'")
    result = unsupported_by(argv[0], json.loads(argv[1]))
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
