"""The findings ledger: distinct defects of the libraries ANPRED runs, generated from committed results.

A findings folder (``benchmarks/results/findings/`` in this repository) holds:

- ``*.conformance.json``: results of ``anpred conformance`` (:func:`anpred.conformance.suite.write_results`);
- ``repros/<case>/``: one case per defect in ONNX's backend-test layout (the one-node model, its
  inputs and the suite's expected outputs; tiny), written by :func:`extract`;
- ``confirm.json``: the repros re-run (``anpred conformance`` on ``repros/``, :func:`confirm`): a
  defect is *confirmed* when its library deviates again on its repro;
- ``notes.json``: what a person found out about a defect, by ``"<library>|<operator>"`` (every defect
  of that operator in that library) and by defect id (its fields win): ``tracker`` (the library's
  public issue tracker: ``"title (#number)"`` or ``"not found"``, with the ``query`` searched),
  ``first_bad`` (the first bad release, from a version bisection of the repro,
  ``benchmarks/bisect_findings.py``, results in ``bisect/``; ``bisect``: its command),
  ``cause`` (one line, where known).

:func:`render` writes ``docs/findings.md`` from those files alone (``anpred findings FOLDER -o
docs/findings.md``). Defects are deduplicated by **library, operator and attribute class**
(:func:`attribute_class`: the node's string attribute values and 0/1 flags, the names of its other
attributes, its input count): the ``_example``/``_random`` variants of one case are one defect. A library is
the backend's, except that a deviation ``tf`` and ``litert`` share on a case is onnx2tf's (their
common converter). Pairs where the float64 execution deviates from the expected output too (the
suite's value disputed, or the tolerance too tight for float32) are listed apart, not as defects.
**Numeric defects** (values outside the suite's tolerance, NaN/Inf where a number is expected) are
counted apart from **wrong shapes/dtypes** and from **converter failures** (a conversion or
preparation that does not happen: ``failed``/``unsupported``), which are counted by library and reason.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

__all__ = ["LIBRARIES", "attribute_class", "defects_of", "extract", "confirm", "render", "library_of"]

#: backend -> the library a deviation of it is charged to
LIBRARIES = {
    "ort": "onnxruntime",
    "openvino": "openvino",
    "torch": "onnx2torch/torch",
    "tf": "onnx2tf/tensorflow",
    "litert": "onnx2tf/litert",
    "tvm": "tvm (relax frontend)",
    "mnn": "MNN",
    "ncnn": "pnnx/ncnn",
    "onnx-reference": "onnx (reference evaluator)",
}
_SHARED = {frozenset({"tf", "litert"}): "onnx2tf"}
_VERSION_KEYS = {
    "onnxruntime": "onnxruntime",
    "openvino": "openvino",
    "onnx2torch/torch": "onnx2torch",
    "onnx2tf/tensorflow": "onnx2tf",
    "onnx2tf/litert": "onnx2tf",
    "onnx2tf": "onnx2tf",
    "tvm (relax frontend)": "tvm",
    "MNN": "MNN",
    "pnnx/ncnn": "ncnn",
    "onnx (reference evaluator)": "onnx",
}


def attribute_class(model_path: str | Path) -> str:
    """The attribute class of a one-node (or few-node) model: per node ``op/<n>in(attr=value, ...)``
    with the values of string attributes and of 0/1 integer flags (``ceil_mode``, ``keepdims``,
    ``align_corners`` ...: each selects another code path), the other attributes by name (an axis,
    whatever its value, a size, a list: the same code path at another value), and the number of
    inputs given."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    parts = []
    for n in m.graph.node:
        attrs = []
        for a in sorted(n.attribute, key=lambda a: a.name):
            if a.type == onnx.AttributeProto.STRING:
                attrs.append(f"{a.name}={a.s.decode(errors='replace')}")
            elif a.type == onnx.AttributeProto.INT and a.i in (0, 1) and not a.name.endswith("axis"):
                # a flag (ceil_mode, keepdims ...): it selects a behaviour; an axis is a position
                attrs.append(f"{a.name}={a.i}")
            else:
                attrs.append(a.name)
        parts.append(f"{n.op_type}/{sum(1 for i in n.input if i)}in({','.join(attrs)})")
    return "; ".join(parts[:3]) + (" ..." if len(parts) > 3 else "")


def library_of(backends: set[str], b: str) -> str:
    """The library a deviation of ``b`` on a case is charged to, given the set of deviating backends."""
    for pair, lib in _SHARED.items():
        if b in pair and pair <= backends:
            return lib
    return LIBRARIES.get(b, b)


def _kind(reason: str) -> str:
    """``shape``, ``dtype`` or ``numeric`` from a ground-truth reason (``<output>: `` may lead it)."""
    if re.search(r"(^|: )shape \[", reason) or "no output of the expected shape" in reason:
        return "shape"
    if re.search(r"(^|: )dtype ", reason):
        return "dtype"
    return "numeric"


def defects_of(results: list[dict[str, Any]], case_root: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Distinct defects (module docstring) from conformance results (the documents of
    ``conformance.json``); ``case_root``: case name -> its folder (for the attribute class).
    Returns ``{defect id: {"library", "op", "class", "kind", "backends", "cases", "error", "versions",
    "example"}}``; disputed pairs go under the id ``"disputed"``."""
    out: dict[str, dict[str, Any]] = {}
    disputed: list[str] = []
    for doc in results:
        versions = doc.get("versions", {})
        for r in doc["records"]:
            rows = r.get("backends", {})
            dev = {b for b, row in rows.items() if row["truth"] == "deviates"}
            if not dev:
                continue
            fp64 = rows.get("onnx-reference-fp64", {}).get("truth")
            if fp64 == "deviates":
                disputed.append(f"{r['case']} ({', '.join(sorted(dev))})")
                continue
            if r["case"] not in case_root:
                continue
            cls = attribute_class(case_root[r["case"]] / "model.onnx")
            for b in sorted(dev - {"onnx-reference-fp64"}):
                lib = library_of(dev, b)
                kind = _kind(rows[b].get("reason", ""))
                key = re.sub(r"[^A-Za-z0-9]+", "-", f"{lib}-{r['op']}-{cls}").strip("-").lower()[:120]
                d = out.setdefault(
                    key,
                    {
                        "id": key,
                        "library": lib,
                        "op": r["op"],
                        "class": cls,
                        "kind": kind,
                        "backends": [],
                        "cases": [],
                        "error": rows[b].get("reason", ""),
                        "versions": {},
                        "example": r["case"],
                        "excess": 0.0,
                        "shared": [],
                    },
                )
                # other libraries deviating on the same case: a deviation many share may be the spec's
                for other in sorted({library_of(dev, o) for o in dev - {b, "onnx-reference-fp64"}} - {lib}):
                    if other not in d["shared"]:
                        d["shared"].append(other)
                if b not in d["backends"]:
                    d["backends"].append(b)
                if r["case"] not in d["cases"]:
                    d["cases"].append(r["case"])
                vk = _VERSION_KEYS.get(lib, "")
                for name, v in (versions.get(b) or {}).items():
                    if vk and name.lower() == vk.lower():
                        d["versions"][name] = v
                ex = _excess(rows[b])
                if ex > d["excess"]:
                    d.update(excess=ex, error=rows[b].get("reason", ""), example=r["case"])
    if disputed:
        out["disputed"] = {"id": "disputed", "cases": disputed}
    return out


def _excess(row: dict[str, Any]) -> float:
    worst = 0.0
    for o in (row.get("outputs") or {}).values():
        v = o.get("max_excess", 0.0)
        v = float("inf") if v in ("inf", "nan") else float(v)
        worst = max(worst, v)
    return worst


def extract(results_files: list[Path], folder: Path, case_roots: list[Path]) -> dict[str, dict[str, Any]]:
    """Derive the defects from ``results_files`` and write ``folder/defects.json`` and each defect's
    repro case (``folder/repros/<case>``, copied from the first of ``case_roots`` holding it)."""
    results = [json.loads(Path(f).read_text()) for f in results_files]
    where: dict[str, Path] = {}
    for doc in results:
        for r in doc["records"]:
            for root in case_roots:
                if (Path(root) / r["case"] / "model.onnx").is_file():
                    where[r["case"]] = Path(root) / r["case"]
                    break
    defects = defects_of(results, where)
    repros = folder / "repros"
    repros.mkdir(parents=True, exist_ok=True)
    for d in defects.values():
        if d["id"] == "disputed":
            continue
        src, dst = where[d["example"]], repros / d["example"]
        if not dst.exists():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("test_data_set_[1-9]*"))
    (folder / "defects.json").write_text(json.dumps(defects, indent=1, default=str))
    return defects


def confirm(folder: Path, backends: list[str], ray: bool = False) -> dict[str, Any]:
    """Re-run every repro of ``folder/repros`` on ``backends`` (``anpred conformance``, a fresh output
    folder) and write ``folder/confirm.json``: per defect, whether its backends deviate again."""
    import tempfile

    from anpred.conformance.suite import ConformanceOptions, run_conformance

    defects = json.loads((folder / "defects.json").read_text())
    with tempfile.TemporaryDirectory(prefix="anpred-confirm-") as tmp:
        res = run_conformance(
            folder / "repros",
            Path(tmp) / "out",
            ConformanceOptions(backends=backends, dtype="all", ray=ray, progress=True),
        )
    rec = {r["case"]: r for r in res["records"]}
    out = {}
    for key, d in defects.items():
        if key == "disputed":
            continue
        rows = (rec.get(d["example"]) or {}).get("backends", {})
        again = [b for b in d["backends"] if rows.get(b, {}).get("truth") == "deviates"]
        out[key] = {
            "case": d["example"],
            "confirmed": bool(again) and len(again) == len(d["backends"]),
            "deviating_again": again,
            "error": next((rows[b].get("reason", "") for b in again), ""),
            "versions": {b: rows.get(b, {}).get("versions", {}) for b in d["backends"]},
        }
    doc = {"backends": backends, "defects": out}
    (folder / "confirm.json").write_text(json.dumps(doc, indent=1))
    return doc


def _reason_class(reason: str) -> str:
    """A failure reason without what is particular to the case (names, numbers, paths), cut short."""
    r = re.sub(r"^(prepare|sample \S+): ", "", reason)
    r = re.sub(r"test_[A-Za-z0-9_]+(\.onnx)?", "<case>", r)
    r = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", r)
    r = re.sub(r"\d+(\.\d+)?", "N", r)
    return r[:110]


def _failures(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per library: failed/unsupported pairs and their most frequent reason classes."""
    out: dict[str, dict[str, Any]] = {}
    for doc in results:
        for r in doc["records"]:
            for b, row in r.get("backends", {}).items():
                if row["truth"] not in ("failed", "unsupported") or b == "onnx-reference-fp64":
                    continue
                lib = LIBRARIES.get(b, b)
                d = out.setdefault(lib, {"pairs": 0, "unsupported": 0, "failed": 0, "reasons": {}})
                d["pairs"] += 1
                d[row["truth"]] += 1
                rc = _reason_class(row.get("reason", ""))
                d["reasons"][rc] = d["reasons"].get(rc, 0) + 1
    return out


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(folder: Path) -> str:
    """``docs/findings.md`` from the files of ``folder`` (module docstring) alone."""
    folder = Path(folder)
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("*.conformance.json"))]
    defects = json.loads((folder / "defects.json").read_text())
    conf = json.loads((folder / "confirm.json").read_text())["defects"] if (folder / "confirm.json").is_file() else {}
    notes = json.loads((folder / "notes.json").read_text()) if (folder / "notes.json").is_file() else {}
    items = [d for k, d in defects.items() if k != "disputed"]
    numeric = sorted((d for d in items if d["kind"] == "numeric"), key=lambda d: (d["library"], d["op"], d["class"]))
    other = sorted((d for d in items if d["kind"] != "numeric"), key=lambda d: (d["library"], d["op"]))
    confirmed = [d for d in numeric if conf.get(d["id"], {}).get("confirmed")]
    lines = [
        "# Findings ledger",
        "",
        "Generated by `anpred findings benchmarks/results/findings -o docs/findings.md` from the committed files "
        "of that folder (module `anpred.conformance.findings`): the conformance results (`*.conformance.json`), "
        "the repro of each defect (`repros/<case>/`, ONNX's backend-test layout: re-run with `anpred conformance "
        "benchmarks/results/findings/repros --cases <case> --backends <backend> -o OUT`), their re-run "
        "(`confirm.json`) and the notes (`notes.json`: tracker search, first bad release, "
        "cause). The first bad releases come from `benchmarks/bisect_findings.py` (each release of the "
        "package installed apart and run on the repro against the expected outputs; results and commands in "
        "`bisect/*.json`, method in docs/conformance.md, *Version bisection of the ledger*). "
        "Do not edit by hand.",
        "",
        "Sources: "
        + "; ".join(
            f"{d['plan'].get('folder', '?')} ({len(d['records'])} cases, {', '.join(d['plan'].get('backends', []))})"
            for d in results
        ),
        "",
        f"**{len(numeric)} distinct numeric defects** ({len(confirmed)} confirmed by re-running their repro; "
        f"{sum(1 for d in numeric if '+' not in d['op'])} on single-operator cases, the others on a function's "
        "expanded body, where the operator at fault is not isolated), "
        f"{len(other)} wrong shapes/dtypes, converter failures counted apart below; "
        f"{sum(1 for d in numeric if not d.get('shared'))} of the numeric defects are this library's alone "
        "on their cases (*also deviating there* lists the other libraries that deviate on the same case: a "
        "deviation several independent libraries share may be the spec's or the suite's, see ONNX Runtime's and "
        "OpenVINO's lists in docs/conformance.md). A defect is one (library, operator, attribute class); *spec* "
        "is the suite's expected output, and the float64 execution (onnx-reference-fp64) "
        "matched it on every case listed.",
        "",
    ]
    lines += _defect_table("Numeric defects", numeric, conf, notes)
    lines += _defect_table("Wrong shapes and dtypes", other, conf, notes)
    lines += _failure_section(_failures(results))
    disputed = defects.get("disputed", {}).get("cases", [])
    if disputed:
        lines += [
            "## Disputed cases (the float64 execution deviates from the expected output too)",
            "",
            "Not counted as defects of a library: " + "; ".join(disputed[:60]) + (" ..." if len(disputed) > 60 else ""),
            "",
        ]
    return "\n".join(lines) + "\n"


def _defect_table(title: str, items: list[dict[str, Any]], conf: dict, notes: dict) -> list[str]:
    if not items:
        return []
    out = [
        f"## {title}",
        "",
        "| # | library (version) | operator / attribute class | cases | error against the spec | "
        "also deviating there | repro (re-run) | first bad release | tracker | cause |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, d in enumerate(items, 1):
        c = conf.get(d["id"], {})
        # a defect's own note (its first bad release, from a bisection of its repro) over its operator's
        n = {**notes.get(f"{d['library']}|{d['op']}", {}), **notes.get(d["id"], {})}
        ver = ", ".join(f"{k} {v}" for k, v in d["versions"].items()) or "?"
        rerun = "confirmed" if c.get("confirmed") else "not reproduced" if c else "not re-run"
        out.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in [
                    i,
                    f"{d['library']} ({ver})",
                    f"{d['op']}: `{d['class']}`",
                    f"{len(d['cases'])}: {', '.join(d['cases'][:3])}{' ...' if len(d['cases']) > 3 else ''}",
                    d["error"][:200],
                    ", ".join(d.get("shared", [])) or "-",
                    f"`repros/{d['example']}` ({rerun})",
                    n.get("first_bad", "not bisected"),
                    n.get("tracker", "not searched"),
                    n.get("cause", ""),
                ]
            )
            + " |"
        )
    return out + [""]


def _failure_section(fails: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "## Converter and runtime failures (no output: counted apart from the defects)",
        "",
        "| library | pairs | unsupported | failed | most frequent reasons (count) |",
        "|---|---|---|---|---|",
    ]
    for lib, d in sorted(fails.items(), key=lambda kv: -kv[1]["pairs"]):
        top = sorted(d["reasons"].items(), key=lambda kv: -kv[1])[:3]
        out.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in [lib, d["pairs"], d["unsupported"], d["failed"], "; ".join(f"{r} ({k})" for r, k in top)]
            )
            + " |"
        )
    return out + [""]
