"""The error drawn on the graph: a report's per-node data for Google's Model Explorer
(``ai-edge-model-explorer`` with its ONNX adapter ``model-explorer-onnx``; optional,
``requirements-explorer.txt``) and the same numbers as metadata for Netron.

:func:`export_model_explorer` writes, into a folder (default ``<report folder>/model-explorer``):

- ``anchored.annotated.onnx``: a copy of the anchored model (only when its files weigh at most
  ``annotate_max_bytes``; default :data:`ANNOTATE_MAX_BYTES`) where every node has a unique,
  non-empty name (the node ids Model Explorer's ONNX adapter uses, so the overlay's keys match
  exactly) and each node the report speaks of carries ``metadata_props`` (``anpred.<backend>.nrmse``,
  ``anpred.<backend>.verdict``, ``anpred.<backend>.local`` / ``carried``, ``anpred.culprit``):
  what Netron shows in a node's properties; the model's own ``metadata_props`` gain
  ``anpred.verdicts`` (one line per backend);
- per judged backend, in Model Explorer's node-data format (``ModelNodeData``: graph id ->
  ``GraphNodeData`` with ``results`` keyed by node id; ``model_explorer/node_data_builder.py``):
  ``<backend>.nrmse.json``: the primary statistic (nRMSE vs the consensus, unitless) at each anchor,
  on the node producing the anchored tensor, its background the verdict there (red: flagged, dark
  red: the origin, green: consistent), the culprit node (drill-down) in magenta with its local nRMSE;
  ``<backend>.verdict.json``: the same nodes coded 0 consistent, 1 flagged (carried), 2 origin,
  3 culprit, coloured by ``thresholds`` (Model Explorer's legend);
- per drilled backend (``--drill``): ``<backend>.local.json`` and ``<backend>.carried.json``: every
  node of each stage with the stage's local error (the stage replayed alone from the consensus) and
  carried error (the normal run) at its exit anchor, on a white-to-red ``gradient``;
- ``index.json``: the files, the graph id, the culprit node per backend and the command that opens
  them: ``model-explorer anchored.annotated.onnx --extensions=model_explorer_onnx --node_data_paths=a.json,b.json``.

A node's stage is the first stage whose exit anchors depend on it (walking back from each stage's
exits in stage order). A culprit inside an ``If``/``Loop`` body is drawn on the node holding the body.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = [
    "export_model_explorer",
    "export_report_folder",
    "check_export_folder",
    "ANNOTATE_MAX_BYTES",
    "VERDICT_CODES",
]

#: the annotated copy is written only up to this size of the anchored model's files (bytes): it is a
#: second copy of the weights; above it the overlay is keyed by the anchored model's own node names
ANNOTATE_MAX_BYTES = 256 * 2**20
#: the codes of ``<backend>.verdict.json`` and their colours
VERDICT_CODES = {
    0: ("consistent", "#b7e4c0"),
    1: ("flagged (carried)", "#f4a3a3"),
    2: ("origin", "#d62728"),
    3: ("culprit", "#ff00ff"),
}
_BG = {"ok": "#b7e4c0", "flagged": "#f4a3a3", "origin": "#d62728", "culprit": "#ff00ff"}


def check_export_folder(out: str | Path) -> Path:
    """``out`` (absolute) when the export can be written there: an existing folder, or a path whose
    nearest existing ancestor is a writable folder (checked before a run is judged, so a bad
    ``--model-explorer DIR`` costs nothing and loses nothing).

    Raises:
        OutputPathError: ``out`` exists and is not a folder; an ancestor is a file; the folder it
            would be created in is not writable.
    """
    from anpred.errors import OutputPathError

    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"--model-explorer {out}: exists and is not a folder")
    base = next(p for p in (out, *out.parents) if p.exists())
    if not base.is_dir():
        raise OutputPathError(f"--model-explorer {out}: {base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputPathError(f"--model-explorer {out}: {base} is not writable")
    return out


def _finite(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _unique_names(model) -> dict[int, str]:
    """Give every node of the main graph a unique non-empty name (in place); returns index -> name.
    Named nodes keep their names (the first of duplicates keeps it; later ones get ``#<k>``)."""
    used: set[str] = set()
    out = {}
    for i, n in enumerate(model.graph.node):
        name = n.name or f"anpred/node/{i}/{n.op_type}"
        k = 1
        base = name
        while name in used:
            name = f"{base}#{k}"
            k += 1
        n.name = name
        used.add(name)
        out[i] = name
    return out


def _stages(model, anchors: list[dict[str, Any]]) -> dict[str, int]:
    """Node name -> stage (module docstring); the anchors' Identity copies get their anchor's stage."""
    producer = {v: n for n in model.graph.node for v in n.output if v}
    by_stage: dict[int, list[str]] = {}
    for a in anchors:
        by_stage.setdefault(int(a["stage"]), []).append(a.get("value") or "")
    stage: dict[str, int] = {}
    for k in sorted(by_stage):
        todo = [producer[v] for v in by_stage[k] if v in producer]
        while todo:
            n = todo.pop()
            if n.name in stage:
                continue
            stage[n.name] = k
            todo += [producer[i] for i in n.input if i in producer and producer[i].name not in stage]
    for a in anchors:
        for n in model.graph.node:
            if n.op_type == "Identity" and a["name"] in n.output:
                stage.setdefault(n.name, int(a["stage"]))
    return stage


def _anchor_nodes(model, anchors: list[dict[str, Any]]) -> dict[str, str]:
    """Anchor name -> the node producing its tensor (by output value; the graph input's anchors have none)."""
    producer = {v: n.name for n in model.graph.node for v in n.output if v}
    return {a["name"]: producer[a["value"]] for a in anchors if a.get("value") in producer}


def _culprit_node(model, culprit: dict[str, Any] | None) -> str | None:
    """The main-graph node of a drill-down culprit: the node itself, or the node holding its body."""
    if not culprit:
        return None
    names = {n.name for n in model.graph.node}
    for key in ("node", "body_of"):
        if culprit.get(key) in names:
            return culprit[key]
    out = culprit.get("output")
    return next((n.name for n in model.graph.node if out and out in n.output), None)


def _graph_data(name: str, results: dict[str, dict[str, Any]], **extra) -> dict[str, Any]:
    return {"name": name, "results": results, **extra}


def _backend_files(report, b: str, ctx: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{file name: GraphNodeData}`` of backend ``b`` (module docstring)."""
    v = report.verdicts.get(b)
    node_of, culprit = ctx["anchor_nodes"], ctx["culprits"].get(b)
    nrmse, code = {}, {}
    origin = getattr(v, "origin_anchor", None) if v is not None and v.flagged else None
    for c in report.cells:
        if c.backend != b or c.anchor not in node_of or _finite(c.primary) is None:
            continue
        kind = "origin" if c.anchor == origin else "flagged" if c.flagged else "ok"
        nrmse[node_of[c.anchor]] = {"value": _finite(c.primary), "bgColor": _BG[kind]}
        code[node_of[c.anchor]] = {"value": {"ok": 0, "flagged": 1, "origin": 2}[kind]}
    if culprit is not None:
        local = _finite((v.culprit or {}).get("local_nrmse")) if v is not None and v.culprit else None
        nrmse[culprit] = {
            "value": local if local is not None else 0.0,
            "bgColor": _BG["culprit"],
            "textColor": "#ffffff",
        }
        code[culprit] = {"value": 3}
    thresholds = [{"value": k, "bgColor": col} for k, (_, col) in VERDICT_CODES.items()]
    files = {
        f"{b}.nrmse.json": _graph_data(f"{b}: nRMSE vs consensus", nrmse),
        f"{b}.verdict.json": _graph_data(
            f"{b}: verdict (0 ok, 1 flagged, 2 origin, 3 culprit)", code, thresholds=thresholds
        ),
    }
    prof = (getattr(report, "drill", None) or {}).get("stages", {}).get(b)
    if prof:
        grad = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#d62728"}]
        for kind in ("local", "carried"):
            res = {}
            for p in prof:
                val = _finite(p.get(kind))
                if val is None:
                    continue
                for node, k in ctx["stages"].items():
                    if k == p["stage"]:
                        res[node] = {"value": val}
            if culprit is not None and kind == "local":
                res[culprit] = {
                    "value": res.get(culprit, {}).get("value", 0.0),
                    "bgColor": _BG["culprit"],
                    "textColor": "#ffffff",
                }
            files[f"{b}.{kind}.json"] = _graph_data(f"{b}: {kind} error per stage (nRMSE)", res, gradient=grad)
    return files


def _annotate(model, report, ctx: dict[str, Any], files: dict[str, dict[str, Any]]) -> None:
    """Node and model ``metadata_props`` with the numbers of ``files`` (Netron shows them)."""
    props: dict[str, dict[str, str]] = {}
    for fname, gd in files.items():
        b, kind = fname[:-5].rsplit(".", 1)
        for node, r in gd["results"].items():
            props.setdefault(node, {})[f"anpred.{b}.{kind}"] = (
                f"{r['value']:.4g}" if kind != "verdict" else VERDICT_CODES[int(r["value"])][0]
            )
    for b, node in ctx["culprits"].items():
        props.setdefault(node, {})["anpred.culprit"] = f"{b}: the drill-down's culprit"
    for n in model.graph.node:
        for k, val in sorted(props.get(n.name, {}).items()):
            e = n.metadata_props.add()
            e.key, e.value = k, val
    lines = []
    for b, v in report.verdicts.items():
        where = f" at {v.origin_anchor} (stage {v.origin_stage})" if v.flagged else ""
        cul = f", culprit {ctx['culprits'][b]}" if b in ctx["culprits"] else ""
        lines.append(
            f"{b}: {v.status}{where}, largest nRMSE {v.worst_primary:.3g}{cul}"
            if _finite(v.worst_primary) is not None
            else f"{b}: {v.status}{where}{cul}"
        )
    e = model.metadata_props.add()
    e.key, e.value = "anpred.verdicts", "\n".join(lines)


def _model_bytes(path: Path, model) -> int:
    """The anchored model's file plus the external data files its initializers name (bytes);
    ``model`` loaded without its external data."""
    from onnx import TensorProto

    locs = {
        e.value
        for t in model.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    return path.stat().st_size + sum(
        (path.parent / loc).stat().st_size for loc in locs if (path.parent / loc).is_file()
    )


def export_model_explorer(
    report, model_path: str | Path, out: str | Path, *, annotate_max_bytes: int = ANNOTATE_MAX_BYTES
) -> dict[str, Any]:
    """Write the node data of ``report`` (a :class:`anpred.judge.CheckReport`) for the anchored model
    ``model_path`` into the folder ``out`` (module docstring); returns ``index.json``'s content:
    ``{"model", "graph", "files", "culprits": {backend: node}, "annotated", "command", "note"}``.

    Raises:
        AnpredError: the model cannot be read, or ``out`` cannot be written.
    """
    import onnx

    from anpred.onnx_io import atomic_write_text

    model_path = Path(model_path).absolute()
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - onnx raises DecodeError, OSError ...
        raise AnpredError(f"cannot read the anchored model {model_path}: {err}") from err
    annotate = _model_bytes(model_path, model) <= annotate_max_bytes
    note = ""
    if annotate:
        model = onnx.load(str(model_path))  # with its external data: the copy is self-contained
        _unique_names(model)
        if not model.graph.name:
            model.graph.name = "main"
    else:
        names = [n.name for n in model.graph.node]
        if "" in names or len(set(names)) != len(names):
            note = (
                "the anchored model has unnamed or duplicate node names and is too large for an annotated copy "
                f"(> {annotate_max_bytes} bytes): those nodes carry no node data"
            )
    culprits = {}
    for b, v in report.verdicts.items():
        node = _culprit_node(model, getattr(v, "culprit", None))
        if node is not None:
            culprits[b] = node
    ctx = {
        "anchor_nodes": _anchor_nodes(model, report.anchors),
        "stages": _stages(model, report.anchors),
        "culprits": culprits,
    }
    gid = model.graph.name or "<main>"
    files: dict[str, dict[str, Any]] = {}
    for b in report.verdicts:
        files.update(_backend_files(report, b, ctx))
    out = Path(out).absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AnpredError(f"cannot create {out}: {err}") from err
    for fname, gd in files.items():
        atomic_write_text(out / fname, json.dumps({gid: gd}, indent=1))
    target = model_path
    if annotate:
        _annotate(model, report, ctx, files)
        target = out / "anchored.annotated.onnx"
        from anpred.onnx_io import atomic_write_bytes

        atomic_write_bytes(target, model.SerializeToString())
    index = {
        "model": str(target),
        "graph": gid,
        "files": sorted(files),
        "culprits": culprits,
        "annotated": annotate,
        "note": note,
        # shell-quoted: a folder name with a space or a quote still opens
        "command": shlex.join(
            [
                "model-explorer",
                str(target),
                "--extensions=model_explorer_onnx",
                "--node_data_paths=" + ",".join(str(out / f) for f in sorted(files)),
            ]
        ),
    }
    atomic_write_text(out / "index.json", json.dumps(index, indent=1))
    return index


def export_report_folder(folder: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """:func:`export_model_explorer` for a report folder of ``anpred test`` (``report.json`` and the
    anchored model ``anchored.onnx``, else the run's ``model.onnx``) or a run folder judged by
    ``anpred check`` (give its report with :func:`export_model_explorer`); ``out`` defaults to
    ``<folder>/model-explorer``.

    Raises:
        AnpredError: no ``report.json`` or no anchored model in ``folder``.
    """
    from anpred.report.json import read_json

    folder = Path(folder)
    report = read_json(folder / "report.json")
    cands = [folder / "anchored.onnx", Path(report.run_dir) / "model.onnx", folder / "run" / "model.onnx"]
    model = next((c for c in cands if c.is_file()), None)
    if model is None:
        raise AnpredError(f"{folder}: no anchored model (anchored.onnx or run/model.onnx)")
    return export_model_explorer(report, model, out if out is not None else folder / "model-explorer")
