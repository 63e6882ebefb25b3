"""``check_run``: judge a run folder (consensus oracle and/or threshold baseline) into a :class:`CheckReport`.

The report is a typed dataclass, truthy when every backend was judged everywhere and is consistent,
serialised as JSON (schema ``anpred.check/1``) by :meth:`CheckReport.to_dict` / read back by
:meth:`CheckReport.from_dict`. ``report.status`` is

- ``consistent``: every backend judged at every anchor on every sample, nothing flagged (exit 0);
- ``flagged``: a backend flagged by the selected oracle(s) (exit 1), whatever else could not be judged;
- ``incomplete``: nothing flagged, but something could not be judged (a backend that did not run or
  whose tensors do not fit the manifest, an anchor missing or unaligned in a backend, samples
  missing): ``report.incomplete`` lists each gap (exit 1, or 0 with ``allow_incomplete``);
- ``error``: nothing could be judged (fewer than two usable backends, no anchor in common ...;
  ``report.problems`` says what and why; exit 2).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anpred.defaults import OracleConfig, load_config
from anpred.errors import AnpredError, JudgeError
from anpred.oracle import AnchorInfo, BackendInfo, BackendVerdict, Cell, Oracle, ThresholdCheck, ThresholdResult

SCHEMA = "anpred.check/1"
ORACLES = ("consensus", "threshold", "both")


@dataclass
class CheckReport:
    """The verdict on one run folder.

    Attributes:
        status: ``consistent`` | ``flagged`` | ``incomplete`` | ``error`` (module docstring).
        incomplete: what could not be judged, one line each (empty when everything was judged).
        allow_incomplete: ``incomplete`` exits 0 instead of 1 (``--allow-incomplete``).
        correlated: groups of backends merged into one consensus vote (bit-identical tensors) and where.
        inputs: the input set's identity: ``description`` (run.json ``inputs``), ``samples`` and
            ``sha256`` (of the samples' sha256 in run order: equal for the same inputs).
        oracle: ``consensus`` | ``threshold`` | ``both``.
        verdicts: per backend, the consensus oracle's verdict (origin, propagation ...).
        cells: per (anchor, backend) statistics and decision, in manifest order.
        threshold: per backend, the threshold baseline on the final outputs.
        consensus: per anchor, how the consensus was formed (``median:<families>`` / ``reference:<b>``).
        backends: per backend, family, precision, votes, run status, versions, reason.
        unjudged_backends: backend -> why it was not judged at all.
        unjudged_anchors: anchor -> why no backend could be judged there.
        problems: fatal reasons when ``status == "error"``; notes: everything else worth saying.
        plot_data: reservoirs for the HTML plots (not serialised).
    """

    run_dir: str
    status: str
    oracle: str
    samples: int = 0
    created: str = ""
    model: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    anchors: list[dict[str, Any]] = field(default_factory=list)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, BackendVerdict] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    threshold: dict[str, ThresholdResult] = field(default_factory=dict)
    consensus: dict[str, list[str]] = field(default_factory=dict)
    unjudged_backends: dict[str, str] = field(default_factory=dict)
    unjudged_anchors: dict[str, str] = field(default_factory=dict)
    alignment: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    allow_incomplete: bool = False
    correlated: list[dict[str, Any]] = field(default_factory=list)
    schema: str = SCHEMA
    plot_data: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.status == "consistent"

    @property
    def consistent(self) -> bool:
        return self.status == "consistent"

    @property
    def flagged_backends(self) -> list[str]:
        """Backends flagged by the selected oracle(s), in run order."""
        out = []
        for b in self.backends:
            v = self.verdicts.get(b)
            t = self.threshold.get(b)
            if (self.oracle in ("consensus", "both") and v is not None and v.flagged) or \
               (self.oracle in ("threshold", "both") and t is not None and not t.passed):
                out.append(b)
        return out

    def cell(self, anchor: str, backend: str) -> Cell | None:
        for c in self.cells:
            if c.anchor == anchor and c.backend == backend:
                return c
        return None

    def largest_primary(self, backend: str) -> tuple[str, float] | None:
        """``(anchor, value)`` of the largest primary statistic (pooled nRMSE by default, unitless)
        among ``backend``'s judged cells; None when none was judged. This is the true worst
        statistic; ``BackendVerdict.worst_anchor`` / ``worst_primary`` are the cell with the highest
        ratio to its threshold (``worst_ratio_to_threshold``), which is not always the largest."""
        import math

        best = None
        for c in self.cells:
            if c.backend != backend or c.primary is None:
                continue
            key = c.primary if not math.isnan(c.primary) else math.inf
            if best is None or key > best[0]:
                best = (key, c.anchor, c.primary)
        return None if best is None else (best[1], best[2])

    @property
    def exit_code(self) -> int:
        """CLI exit status: 0 consistent, 1 flagged, 1 incomplete (0 with ``allow_incomplete``), 2 error."""
        return {"consistent": 0, "flagged": 1, "incomplete": 0 if self.allow_incomplete else 1}.get(self.status, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "run_dir": self.run_dir, "status": self.status, "oracle": self.oracle,
            "samples": self.samples, "created": self.created, "model": self.model, "machine": self.machine,
            "inputs": self.inputs,
            "anchors": self.anchors, "backends": self.backends, "config": self.config,
            "flagged_backends": self.flagged_backends,
            "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
            "cells": [c.to_dict() for c in self.cells],
            "threshold": {k: v.to_dict() for k, v in self.threshold.items()},
            "consensus": self.consensus, "unjudged_backends": self.unjudged_backends,
            "unjudged_anchors": self.unjudged_anchors, "alignment": self.alignment,
            "problems": self.problems, "notes": self.notes, "incomplete": self.incomplete,
            "allow_incomplete": self.allow_incomplete, "correlated": self.correlated,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckReport":
        """Read a report written by :meth:`to_dict`. Raises AnpredError on another schema."""
        if d.get("schema") != SCHEMA:
            raise AnpredError(f"unsupported check report schema {d.get('schema')!r} (expected {SCHEMA!r})")
        try:
            return cls(
                run_dir=d["run_dir"], status=d["status"], oracle=d["oracle"], samples=d.get("samples", 0),
                created=d.get("created", ""), model=d.get("model", {}), machine=d.get("machine", {}),
                inputs=d.get("inputs", {}),
                anchors=d.get("anchors", []), backends=d.get("backends", {}), config=d.get("config", {}),
                verdicts={k: BackendVerdict.from_dict(v) for k, v in d.get("verdicts", {}).items()},
                cells=[Cell.from_dict(c) for c in d.get("cells", [])],
                threshold={k: ThresholdResult.from_dict(v) for k, v in d.get("threshold", {}).items()},
                consensus=d.get("consensus", {}), unjudged_backends=d.get("unjudged_backends", {}),
                unjudged_anchors=d.get("unjudged_anchors", {}), alignment=d.get("alignment", {}),
                problems=d.get("problems", []), notes=d.get("notes", []), incomplete=d.get("incomplete", []),
                allow_incomplete=bool(d.get("allow_incomplete", False)), correlated=d.get("correlated", []))
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed check report: {err}") from err

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent)


# ------------------------------------------------------------------------------------------------
def _make_aligner(store, usable: list[str]):
    """Return ``(align(sample_id, raw) -> (tensors, unaligned), aligner)`` over
    :class:`anpred.align.Aligner`; ``unaligned`` is ``{(anchor, backend): reason}`` for the oracle.

    Raises:
        AnpredError: a manifest pin is malformed (``AlignmentError``).
    """
    from anpred.align import Aligner

    statuses = {k: v for k, v in store.statuses().items() if k in usable}
    aligner = Aligner(store.manifest, statuses)

    def align(sid, raw):
        res = aligner.align(sid, raw)
        un = {(a, b): str(why) for a, per in res.unaligned.items() for b, why in per.items()}
        return res.tensors, un

    return align, aligner


def _dataflow(store, manifest, report, cfg: OracleConfig) -> tuple[dict[str, set[str]] | None, list]:
    """From the ONNX model the run used (``RUN_DIR/model.onnx``, else the file ``run.json`` names as the
    model's ``path``): ``(descendants, parts)``. ``descendants``: anchor (and part) -> downstream anchors
    and parts, for localization and the propagation profile; None (with a note in ``report``:
    propagation then follows the manifest order) when no model is there or it does not match the
    manifest. ``parts``: the :class:`anpred.parts.OutputPart` of every concatenated output (none when
    ``cfg.split_outputs`` is off or the model is unknown)."""
    from anpred.oracle import anchor_descendants
    from anpred.onnx_io import load_model
    from anpred.parts import output_parts
    from passes.graph import build_index

    cands = [store.root / "model.onnx"]
    mp = (store.meta.get("model") or {}).get("path")
    if mp:
        cands.append(Path(mp))
    path = next((p for p in cands if p.is_file()), None)
    if path is None:
        report.notes.append("propagation: no model.onnx in the run folder (nor at the model's recorded path): "
                            "the data flow is unknown")
        return None, []
    values = {a.name: a.value for a in manifest.anchors}
    try:
        model = load_model(path, load_external=False)
        idx = build_index(model.graph)  # one index for the parts and the data flow
        parts: list = []
        if cfg.split_outputs:
            outs = {a.name: a.value for a in manifest.anchors if a.kind == "output"}
            found = output_parts(model, outs, skip_values=set(values.values()), index=idx)
            parts = [p for o in outs for p in found.get(o, [])]
        desc = anchor_descendants(model, {**values, **{p.name: p.value for p in parts}}, index=idx)
    except AnpredError as err:
        report.notes.append(f"propagation: cannot read the data flow from {path}: {err}")
        return None, []
    return desc, parts


def _alignment_notes(report: "CheckReport", rep) -> None:
    """Put what the aligner decided that a reader must see into ``report``: warnings, every segment
    order found by the data (a note per anchor and backend, counted first), and the unaligned reason
    of every (anchor, backend) the oracle could not judge because of it (those reach ``verdicts[b].unjudged``
    through the oracle)."""
    from anpred.align import describe_rule

    report.notes.extend(f"alignment warning: {w}" for w in rep.warnings)
    segs = rep.segments_by_data
    if segs:
        report.notes.append(f"alignment: {len(segs)} segment order(s) found by the data (a port's concatenation "
                            "order, or a real channel-order defect; pin the rule or 'exclude' in manifest.json to decide)")
    for d in segs:
        report.notes.append(f"alignment: {d.backend} at {d.anchor}: {describe_rule(d.rule)} found by the data "
                            f"(normalised error {d.runner_up:.3g} -> {d.error:.3g})")
    # the unaligned reasons reach the verdicts through the oracle (Oracle.add(unaligned=...))


def precision_notes(table: dict[str, dict[str, Any]], machine: dict[str, Any]) -> list[str]:
    """One note per backend that computed in another precision than it was asked for (it is judged as
    what it computed), and per int8 backend whose integer kernels may saturate on this CPU
    (:func:`anpred.machine.kernel_isa`)."""
    from anpred.machine import kernel_isa

    notes = []
    flags = machine.get("cpu_flags") or []
    for b, row in table.items():
        asked, got = row.get("precision_requested"), row.get("precision")
        if asked and got and asked != got:
            why = ""
            if asked == "bf16" and flags and kernel_isa(flags)["bf16"] == "none":
                why = " (this CPU has no bf16 instructions: neither avx512_bf16 nor amx_bf16)"
            notes.append(f"precision: {b} was asked for {asked} but computed in {got}{why}; judged as {got}")
        kernel = (row.get("versions") or {}).get("mlas_u8s8_kernel")
        if kernel in ("avx512-core", "avx2", "sse"):
            notes.append(f"kernels: {b} ran ONNX Runtime's {kernel} u8s8 kernels (no VNNI/AMX on this CPU): pairs of "
                         "u8 x s8 products are summed in saturating int16, so its int8 results differ from a VNNI CPU's")
    return notes


def _backend_table(store, config: OracleConfig) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, str]]:
    table, usable, unjudged = {}, [], {}
    for name, st in store.statuses().items():
        info = BackendInfo.make(name, st.family, st.precision, config, requested=st.precision_requested or None)
        table[name] = {"family": info.family, "precision": info.precision, "precision_requested": info.requested,
                       "votes": info.votes,
                       "status": st.status, "reason": st.reason, "versions": st.versions,
                       "samples": st.samples}
        if st.status == "ok":
            usable.append(name)
        else:
            unjudged[name] = f"run status {st.status}" + (f": {st.reason}" if st.reason else "")
    return table, usable, unjudged


def check_run(run_dir: str | Path, *, oracle: str = "consensus", atol: float | None = None,
              rtol: float | None = None, reference: str | None = None,
              config: str | Path | OracleConfig | None = None, allow_incomplete: bool = False) -> CheckReport:
    """Judge the run folder ``run_dir`` (see ``docs/oracle.md``).

    Args:
        run_dir: a folder written by ``anpred run`` (schema ``anpred.run/1``, mode ``tensors``).
        oracle: ``consensus`` (population-deviation oracle), ``threshold`` (element-wise atol/rtol on
            the final outputs against ``reference``) or ``both`` (a backend is flagged if either flags it).
        atol, rtol: threshold baseline tolerances (default 1e-5/1e-5 from the config).
        reference: backend used by the threshold baseline and as consensus when fewer than
            ``min_voters`` families vote (default: first usable in ``config.reference_priority``).
        config: an :class:`OracleConfig`, or a TOML/JSON file overriding :mod:`anpred.defaults`.
        allow_incomplete: an ``incomplete`` report exits 0 (:attr:`CheckReport.exit_code`).

    Returns:
        A :class:`CheckReport`; ``status == "error"`` (and ``problems``) when the run cannot be judged.

    Raises:
        AnpredError: ``run_dir`` is not a readable run folder, bad ``oracle``/``config``/``reference``.
        JudgeError: a stored tensor file is unreadable (truncated, or not a safetensors/.npz file).
    """
    from anpred.runstore import RunStore

    if oracle not in ORACLES:
        raise AnpredError(f"unknown oracle {oracle!r}; known: {', '.join(ORACLES)}")
    cfg = config if isinstance(config, OracleConfig) else load_config(config)
    atol = cfg.threshold_atol if atol is None else float(atol)
    rtol = cfg.threshold_rtol if rtol is None else float(rtol)
    if atol < 0 or rtol < 0:
        raise AnpredError("--atol and --rtol must be non-negative")
    store = RunStore.open(run_dir)
    manifest = store.manifest
    table, usable, unjudged = _backend_table(store, cfg)
    report = CheckReport(
        run_dir=str(run_dir), status="error", oracle=oracle,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        model=dict(store.meta.get("model") or manifest.model), machine=store.meta.get("machine", {}),
        anchors=[{"name": a.name, "stage": a.stage, "kind": a.kind, "op_type": a.op_type, "dtype": a.dtype,
                  "producer": a.producer} for a in manifest.anchors],
        backends=table, config={**cfg.to_dict(), "atol": atol, "rtol": rtol, "reference": reference},
        unjudged_backends=unjudged, allow_incomplete=bool(allow_incomplete), inputs=_inputs_identity(store))
    report.notes.extend(precision_notes(table, report.machine))
    if reference is not None and reference not in table:
        raise AnpredError(f"reference backend {reference!r} is not in this run; backends: {', '.join(table) or '(none)'}")
    if reference is not None and reference not in usable:
        report.problems.append(f"reference backend {reference!r} is not usable ({unjudged.get(reference)})")
    mode = store.meta.get("mode", "tensors")
    if mode != "tensors":
        report.problems.append(
            f"run mode {mode!r} stores only per-backend summaries; the consensus needs the tensors "
            "(element-wise median), so re-run with mode 'tensors'")
    if not manifest.anchors:
        report.problems.append("the run's manifest has no anchors")
    if not store.sample_ids:
        report.problems.append("the run has no samples")
    if len(usable) < 2:
        report.problems.append(f"fewer than two usable backends ({', '.join(usable) or 'none'}); "
                               + ("; ".join(f"{b}: {r}" for b, r in unjudged.items()) or "nothing was run"))
    if report.problems:
        return report

    names = set(manifest.names())
    # mismatched manifests: stored anchors that the run's manifest does not know
    for b in list(usable):
        first = next((sid for sid in store.sample_ids if _tensor_file(store, b, sid).exists()), store.sample_ids[0])
        keys = set(_read(store, b, first))
        foreign = sorted(keys - names)
        if keys and not (keys & names):
            unjudged[b] = (f"its tensors do not match the run's manifest (none of its {len(keys)} anchors is in "
                           f"manifest.json, e.g. {foreign[0]!r}): mismatched manifests")
            usable.remove(b)
        elif foreign:
            report.notes.append(f"{b}: {len(foreign)} stored anchor(s) not in the run's manifest ignored "
                                f"(e.g. {foreign[0]!r}): mismatched manifests?")
        elif not keys:
            unjudged[b] = "no tensors stored for any sample"
            usable.remove(b)
    if len(usable) < 2:
        report.problems.append(f"fewer than two usable backends after reading the tensors ({', '.join(usable) or 'none'})")
        return report

    descendants, parts = _dataflow(store, manifest, report, cfg) if oracle in ("consensus", "both") else (None, [])
    parts_of: dict[str, list] = {}
    for p in parts:
        parts_of.setdefault(p.output, []).append(p)
    anchors = []
    for a in manifest.anchors:  # parts just before their output (their values precede it in the data flow)
        anchors.extend(AnchorInfo(p.name, a.stage, "part", "Concat", a.dtype, part_of=a.name)
                       for p in parts_of.get(a.name, []))
        anchors.append(AnchorInfo(a.name, a.stage, a.kind, a.op_type, a.dtype))
    binfos = [BackendInfo.make(b, table[b]["family"], table[b]["precision"], cfg) for b in usable]
    orc = Oracle(anchors, binfos, cfg, reference=reference, descendants=descendants) \
        if oracle in ("consensus", "both") else None
    outputs = [a.name for a in manifest.anchors if a.kind == "output"] or \
        [a.name for a in manifest.anchors if a.stage == max(x.stage for x in manifest.anchors)]
    thr = None
    if oracle in ("threshold", "both"):
        ref = reference or next((b for b in cfg.reference_priority if b in usable), None) or \
            next((b.name for b in binfos if b.votes), usable[0])
        thr = ThresholdCheck(outputs, usable, ref, atol, rtol)
        report.notes.append(f"threshold baseline: element-wise |x-r| <= atol={atol:g} or |x-r|/|r| <= rtol={rtol:g} "
                            f"on {len(outputs)} output anchor(s) against {ref}")
    align, aligner = _make_aligner(store, usable)
    for sid in store.sample_ids:
        raw, absent = {}, {}
        for b in usable:
            t = _read(store, b, sid)
            if not t:
                absent[b] = "no tensors stored for this sample"
                continue
            raw[b] = {k: v for k, v in t.items() if k in names}
        tensors, unaligned = align(sid, raw)
        for p in parts:  # views into the aligned output; an unaligned output leaves its parts unjudged too
            per = tensors.get(p.output) or {}
            got = {b: v for b, v in ((b, p.take(t)) for b, t in per.items()) if v is not None}
            tensors[p.name] = got
            for (a, b), why in list(unaligned.items()):
                if a == p.output:
                    unaligned[(p.name, b)] = why
        if orc is not None:
            orc.add(tensors, unaligned, sample_id=sid, absent=absent)
        if thr is not None:
            thr.add(tensors)
        report.samples += 1
    align_rep = aligner.report()
    report.alignment = align_rep.to_dict()
    if orc is not None:
        res = orc.finish()
        report.verdicts, report.cells, report.consensus = res.verdicts, res.cells, res.consensus
        report.unjudged_anchors, report.plot_data = res.unjudged_anchors, res.plot_data
        report.correlated = res.correlated
        report.notes.extend(res.notes)
        judged_parts = {c.anchor for c in res.cells} & {p.name for p in parts}
        if judged_parts:  # judged parts join the anchor list, just before their output
            rows = []
            for row in report.anchors:
                rows.extend({"name": p.name, "stage": row["stage"], "kind": "part", "op_type": "Concat",
                             "dtype": row["dtype"], "producer": row.get("producer"), "value": p.value, "part_of": row["name"],
                             "index": p.name[len(row["name"]):], "shape": list(p.shape)}
                            for p in parts_of.get(row["name"], []) if p.name in judged_parts)
                rows.append(row)
            report.anchors = rows
    _alignment_notes(report, align_rep)  # before the problems below quote the unjudged reasons
    if orc is not None:
        if not report.cells:
            report.problems.append("no (anchor, backend) pair could be judged: " +
                                   ("; ".join(f"{a}: {w}" for a, w in list(res.unjudged_anchors.items())[:3]) or
                                    "anchors missing in all backends"))
    if thr is not None:
        report.threshold = thr.finish()
        if not any(t.total_elements for t in report.threshold.values()):
            report.problems.append("threshold baseline: no output anchor present in both the reference and another backend")
    report.incomplete = _incomplete(report)
    if report.problems:
        report.status = "error"
    elif report.flagged_backends:
        report.status = "flagged"
    else:
        report.status = "incomplete" if report.incomplete else "consistent"
    return report


def _incomplete(report: CheckReport) -> list[str]:
    """One line per thing that could not be judged (see the module docstring)."""
    out = [f"{b}: not judged: {why}" for b, why in report.unjudged_backends.items()]
    for b, v in report.verdicts.items():
        if v.status == "unjudged":
            out.append(f"{b}: no anchor could be judged")
            continue
        for a, why in v.unjudged.items():
            out.append(f"{b}: {a} not judged: {why}")
        for a, why in v.partial.items():
            out.append(f"{b}: {a} {why}")
    for a, why in report.unjudged_anchors.items():
        out.append(f"{a}: no backend judged: {why}")
    if report.oracle in ("threshold", "both"):
        for b, t in report.threshold.items():
            if not t.total_elements and b not in report.unjudged_backends:
                out.append(f"{b}: threshold baseline compared no output element")
    return out


def _inputs_identity(store) -> dict[str, Any]:
    import hashlib

    h = hashlib.sha256()
    for s in store.meta.get("samples", []):
        h.update(str(s.get("sha256", s.get("id", ""))).encode())
    return {"description": store.meta.get("inputs", {}), "samples": len(store.meta.get("samples", [])),
            "sha256": h.hexdigest()}


def _tensor_file(store, backend: str, sample_id: str) -> Path:
    return store.anchor_file(backend, sample_id) or store.backend_dir(backend) / f"{sample_id}.safetensors"


def _read(store, backend: str, sample_id: str) -> dict[str, np.ndarray]:
    """``store.read_anchors`` with unreadable files turned into a :class:`JudgeError` (exit 2)."""
    import zipfile

    try:
        return store.read_anchors(backend, sample_id)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as err:
        path = _tensor_file(store, backend, sample_id)
        raise JudgeError(f"{path}: unreadable tensor file ({type(err).__name__}: {err}); re-run backend "
                         f"{backend!r} or delete the file to judge the run without that sample") from err


def check_or_raise(run_dir: str | Path, **kw) -> CheckReport:
    """:func:`check_run`, raising :class:`JudgeError` (with ``.report``) when the run cannot be judged."""
    rep = check_run(run_dir, **kw)
    if rep.status == "error":
        err = JudgeError(f"{run_dir}: cannot be judged: " + "; ".join(rep.problems))
        err.report = rep
        raise err
    return rep
