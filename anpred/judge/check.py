"""``check_run``: judge a run folder (consensus oracle and/or threshold baseline) into a
:class:`anpred.judge.struct.CheckReport`.

Contract: ``check_run`` reads as its three steps: :func:`usable_backends` (open the run, the backend
table, what rules the run out, which backends' tensors fit the manifest) ->
:func:`anpred.judge.samples.judge_samples` (read, align and judge every sample) -> :func:`finish` (the
oracle's verdicts, the baseline, the alignment notes, what could not be judged and the status).

The report is truthy when every backend was judged everywhere and is consistent, serialised as JSON
(schema ``anpred.check/1``) by :meth:`CheckReport.to_dict` / read back by
:meth:`CheckReport.from_dict`; its ``status`` is ``consistent`` | ``flagged`` | ``incomplete`` |
``error`` (:mod:`anpred.judge.struct`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any

from anpred.defaults import OracleConfig, load_config
from anpred.errors import AnpredError, JudgeError
from anpred.judge.parts import OutputPart
from anpred.judge.samples import Judged, Judging, judge_samples, read_tensors, tensor_file
from anpred.judge.struct import ORACLES, BackendInfo, CheckReport, OracleResult, ThresholdResult

__all__ = ["check_or_raise", "check_run", "finish", "inputs_sha256", "precision_notes", "usable_backends"]


def check_run(
    run_dir: str | Path,
    *,
    oracle: str = "consensus",
    atol: float | None = None,
    rtol: float | None = None,
    reference: str | None = None,
    config: str | Path | OracleConfig | None = None,
    allow_incomplete: bool = False,
) -> CheckReport:
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
    run = usable_backends(
        run_dir,
        oracle=oracle,
        atol=atol,
        rtol=rtol,
        reference=reference,
        config=config,
        allow_incomplete=allow_incomplete,
    )
    if run.report.problems:
        return run.report
    return finish(run, judge_samples(run))


def usable_backends(
    run_dir: str | Path,
    *,
    oracle: str = "consensus",
    atol: float | None = None,
    rtol: float | None = None,
    reference: str | None = None,
    config: str | Path | OracleConfig | None = None,
    allow_incomplete: bool = False,
) -> Judging:
    """Open ``run_dir`` and decide which backends can be judged (arguments: :func:`check_run`).

    Returns:
        A :class:`Judging` whose ``report`` (status ``error`` until :func:`finish`) holds the backend
        table, the precision notes, and ``problems`` when the run cannot be judged at all (then no
        sample is read but the first of each backend).

    Raises:
        AnpredError, JudgeError: as :func:`check_run`.
    """
    from anpred.run import RunStore

    if oracle not in ORACLES:
        raise AnpredError(f"unknown oracle {oracle!r}; known: {', '.join(ORACLES)}")
    cfg = config if isinstance(config, OracleConfig) else load_config(config)
    atol = cfg.threshold_atol if atol is None else float(atol)
    rtol = cfg.threshold_rtol if rtol is None else float(rtol)
    if atol < 0 or rtol < 0:
        raise AnpredError("--atol and --rtol must be non-negative")
    store = RunStore.open(run_dir)
    table, usable = _backend_table(store, cfg)
    settings = {**cfg.to_dict(), "atol": atol, "rtol": rtol, "reference": reference}
    report = _new_report(run_dir, store, oracle, table, settings, allow_incomplete)
    if reference is not None and reference not in table:
        raise AnpredError(
            f"reference backend {reference!r} is not in this run; backends: {', '.join(table) or '(none)'}"
        )
    if reference is not None and reference not in usable:
        report.problems.append(
            f"reference backend {reference!r} is not usable ({report.unjudged_backends.get(reference)})"
        )
    report.problems.extend(_run_problems(store, usable, report.unjudged_backends))
    if not report.problems:
        _drop_mismatched(store, report, usable)
    return Judging(store=store, report=report, config=cfg, usable=usable, reference=reference, atol=atol, rtol=rtol)


def finish(run: Judging, judged: Judged) -> CheckReport:
    """Complete ``run.report`` from what judged the samples: alignment, the oracle's verdicts (judged
    parts join the anchor list), the baseline's results, what could not be judged, the status."""
    report = run.report
    report.alignment = judged.alignment.to_dict()
    if judged.oracle is not None:
        _take_oracle(report, judged.oracle.finish(), judged.parts)
    _alignment_notes(report, judged.alignment)
    if judged.threshold is not None:
        _take_threshold(report, judged.threshold.finish())
    report.incomplete = _incomplete(report)
    if report.problems:
        report.status = "error"
    elif report.flagged_backends:
        report.status = "flagged"
    else:
        report.status = "incomplete" if report.incomplete else "consistent"
    return report


def check_or_raise(run_dir: str | Path, **kw) -> CheckReport:
    """:func:`check_run`, raising :class:`JudgeError` (with ``.report``) when the run cannot be judged."""
    rep = check_run(run_dir, **kw)
    if rep.status == "error":
        err = JudgeError(f"{run_dir}: cannot be judged: " + "; ".join(rep.problems))
        err.report = rep
        raise err
    return rep


# ------------------------------------------------------------------------------------------------
# usable backends
def _backend_table(store, config: OracleConfig) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per backend of the run its row of ``report.backends``, and the backends whose run status is ok."""
    table, usable = {}, []
    coverage = store.meta.get("coverage") or {}  # pre-run coverage (anpred.backends.coverage), newer runs
    for name, st in store.statuses().items():
        info = BackendInfo.make(name, st.family, st.precision, config, requested=st.precision_requested or None)
        table[name] = {
            "family": info.family,
            "precision": info.precision,
            "precision_requested": info.requested,
            "votes": info.votes,
            "status": st.status,
            "reason": st.reason,
            "versions": st.versions,
            "samples": st.samples,
        }
        if name in coverage:
            table[name]["coverage"] = {k: coverage[name].get(k) for k in ("basis", "ops", "error")}
        if st.status == "ok":
            usable.append(name)
    return table, usable


def _new_report(
    run_dir, store, oracle: str, table: dict[str, dict[str, Any]], settings: dict[str, Any], allow_incomplete: bool
) -> CheckReport:
    """The report before any sample is judged (status ``error``): run identity, anchors, backend table,
    configuration (``settings``: the oracle configuration with the threshold baseline's atol, rtol and
    reference), the backends that did not run, the precision notes."""
    manifest = store.manifest
    unjudged = {
        name: f"run status {row['status']}" + (f": {row['reason']}" if row["reason"] else "")
        for name, row in table.items()
        if row["status"] != "ok"
    }
    report = CheckReport(
        run_dir=str(run_dir),
        status="error",
        oracle=oracle,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        model=dict(store.meta.get("model") or manifest.model),
        machine=store.meta.get("machine", {}),
        anchors=[
            {
                "name": a.name,
                "stage": a.stage,
                "kind": a.kind,
                "op_type": a.op_type,
                "dtype": a.dtype,
                "producer": a.producer,
                "value": a.value,
            }
            for a in manifest.anchors
        ],
        backends=table,
        config=settings,
        unjudged_backends=unjudged,
        allow_incomplete=bool(allow_incomplete),
        inputs=_inputs_identity(store),
    )
    report.notes.extend(precision_notes(table, report.machine))
    report.notes.extend(observer_notes(table))
    report.notes.extend(
        f"{b}: the installed library has known defects this model reaches, which explain a "
        f"deviation here: {row['versions']['reference_defects']}"
        for b, row in table.items()
        if (row.get("versions") or {}).get("reference_defects")
    )
    report.notes.extend(
        f"{b}: known defects of the installed library that this model reaches were worked around "
        f"by exact rewrites of the model it ran (its other values are judged as usual): "
        f"{row['versions']['reference_workarounds']}"
        for b, row in table.items()
        if (row.get("versions") or {}).get("reference_workarounds")
    )
    return report


def observer_notes(table: dict[str, dict[str, Any]]) -> list[str]:
    """One note per ExecuTorch backend (its record's ``versions["executorch_observer"]``,
    :func:`anpred.backends.executorch.observer_effect`): the delegate's partitions with and without the
    anchors' extra outputs, and whether those outputs changed the model's own outputs (the observer
    effect: bit-identical, or the largest absolute difference, in the outputs' units)."""
    notes = []
    for b, row in table.items():
        raw = (row.get("versions") or {}).get("executorch_observer")
        if not raw or row.get("status", "ok") != "ok":
            continue
        try:
            obs = json.loads(raw)
        except (TypeError, ValueError):
            continue
        parts = (
            f"{obs.get('partitions_with_anchors', '?')} delegate partition(s) with the anchors' extra outputs, "
            f"{obs.get('partitions_without_anchors', '?')} without"
        )
        effect = (
            "the model's outputs bit-identical with and without them"
            if obs.get("bit_identical")
            else f"the extra outputs change the model's outputs by up to {obs.get('max_abs_diff', float('nan')):.3g} "
            "(absolute; the observer effect: its anchors are judged on the program with them)"
        )
        notes.append(f"observer effect: {b}: {parts}; {effect}")
    return notes


def precision_notes(table: dict[str, dict[str, Any]], machine: dict[str, Any]) -> list[str]:
    """One note per backend that computed in another precision than it was asked for (it is judged as
    what it computed), and per int8 backend whose integer kernels may saturate on this CPU
    (:func:`anpred.machine.kernel_isa`)."""
    from anpred.machine import kernel_isa

    notes = []
    flags = machine.get("cpu_flags") or []
    for b, row in table.items():
        if row.get("status", "ok") != "ok":
            continue  # it computed nothing: its read-back precision says nothing
        asked, got = row.get("precision_requested"), row.get("precision")
        if asked and got and asked != got:
            why = ""
            if asked == "bf16" and flags and kernel_isa(flags)["bf16"] == "none":
                why = " (this CPU has no bf16 instructions: neither avx512_bf16 nor amx_bf16)"
            notes.append(f"precision: {b} was asked for {asked} but computed in {got}{why}; judged as {got}")
        kernel = (row.get("versions") or {}).get("mlas_u8s8_kernel")
        if kernel in ("avx512-core", "avx2", "sse"):
            notes.append(
                f"kernels: {b} ran ONNX Runtime's {kernel} u8s8 kernels (no VNNI/AMX on this CPU): pairs of "
                "u8 x s8 products are summed in saturating int16, "
                "so its int8 results differ from a VNNI CPU's"
            )
    return notes


def _run_problems(store, usable: list[str], unjudged: dict[str, str]) -> list[str]:
    """What rules the whole run out: stats mode, no anchors, no samples, fewer than two usable backends."""
    problems = []
    mode = store.meta.get("mode", "tensors")
    if mode != "tensors":
        problems.append(
            f"run mode {mode!r} stores only per-backend summaries; the consensus needs the tensors "
            "(element-wise median), so re-run with mode 'tensors'"
        )
    if not store.manifest.anchors:
        problems.append("the run's manifest has no anchors")
    if not store.sample_ids:
        problems.append("the run has no samples")
    if len(usable) < 2:
        problems.append(
            f"fewer than two usable backends ({', '.join(usable) or 'none'}); "
            + ("; ".join(f"{b}: {r}" for b, r in unjudged.items()) or "nothing was run")
        )
    return problems


def _drop_mismatched(store, report: CheckReport, usable: list[str]) -> None:
    """Remove from ``usable`` (into ``report.unjudged_backends``) the backends whose stored tensors
    (first stored sample) do not match the run's manifest or are missing; note stored anchors the
    manifest does not know; a problem when fewer than two remain."""
    names = set(store.manifest.names())
    unjudged = report.unjudged_backends
    for b in list(usable):
        first = next((sid for sid in store.sample_ids if tensor_file(store, b, sid).exists()), store.sample_ids[0])
        keys = set(read_tensors(store, b, first))
        foreign = sorted(keys - names)
        if keys and not (keys & names):
            unjudged[b] = (
                f"its tensors do not match the run's manifest (none of its {len(keys)} anchors is in "
                f"manifest.json, e.g. {foreign[0]!r}): mismatched manifests"
            )
            usable.remove(b)
        elif foreign:
            report.notes.append(
                f"{b}: {len(foreign)} stored anchor(s) not in the run's manifest ignored "
                f"(e.g. {foreign[0]!r}): mismatched manifests?"
            )
        elif not keys and (
            store.meta["backends"].get(b, {}).get("status") != "ok" or not tensor_file(store, b, first).exists()
        ):
            unjudged[b] = "no tensors stored for any sample"
            usable.remove(b)
        # (an empty file while it ran every sample: it returned no value, a missing output where the
        # voting families agree, anpred.judge.deviations; not a gap)
    if len(usable) < 2:
        report.problems.append(
            f"fewer than two usable backends after reading the tensors ({', '.join(usable) or 'none'})"
        )


def inputs_sha256(sample_digests) -> str:
    """The input set's identity (the history's dataset key): SHA-256 over the samples' digests
    (:func:`anpred.run.store.sample_sha256`, else their ids) in run order."""
    h = hashlib.sha256()
    for d in sample_digests:
        h.update(str(d).encode())
    return h.hexdigest()


def _inputs_identity(store) -> dict[str, Any]:
    samples = store.meta.get("samples", [])
    return {
        "description": store.meta.get("inputs", {}),
        "samples": len(samples),
        "sha256": inputs_sha256(s.get("sha256", s.get("id", "")) for s in samples),
    }


# ------------------------------------------------------------------------------------------------
# finish
def _take_oracle(report: CheckReport, res: OracleResult, parts: list[OutputPart]) -> None:
    """The consensus oracle's result into ``report``; judged parts join the anchor list just before
    their output; a problem when no (anchor, backend) could be judged."""
    report.verdicts, report.cells, report.consensus = res.verdicts, res.cells, res.consensus
    report.unjudged_anchors, report.plot_data = res.unjudged_anchors, res.plot_data
    report.correlated = res.correlated
    report.independence = res.independence
    report.splits = res.splits
    report.populations, report.population_cells = res.populations, res.population_cells
    report.scales = res.scales
    cost_causes(report, res)
    report.notes.extend(res.notes)
    judged_parts = {c.anchor for c in res.cells} & {p.name for p in parts}
    if judged_parts:
        report.anchors = _with_part_rows(report.anchors, parts, judged_parts)
    if not report.cells:
        report.problems.append(
            "no (anchor, backend) pair could be judged: "
            + (
                "; ".join(f"{a}: {w}" for a, w in list(res.unjudged_anchors.items())[:3])
                or "anchors missing in all backends"
            )
        )


def cost_causes(report: CheckReport, res: OracleResult) -> None:
    """Append the likely cause to each cost warning of a reduced-precision member:
    ONNX Runtime's u8s8 kernels without VNNI/AMX sum pairs of products in saturating int16 (the run
    record's ``versions["mlas_u8s8_kernel"]``, :func:`anpred.machine.kernel_isa`)."""
    for b, v in res.verdicts.items():
        if not v.warnings:
            continue
        kernel = ((report.backends.get(b) or {}).get("versions") or {}).get("mlas_u8s8_kernel")
        if kernel not in ("avx512-core", "avx2", "sse"):
            continue
        cause = (
            f"; likely cause: ONNX Runtime's {kernel} u8s8 kernels on this CPU (no VNNI/AMX) sum pairs of "
            "u8 x s8 products in saturating int16 (quantize_static(reduce_range=True) is the documented remedy)"
        )
        for i, w in enumerate(v.warnings):
            if w in res.notes:
                res.notes[res.notes.index(w)] = w + cause
            v.warnings[i] = w + cause


def _with_part_rows(rows: list[dict[str, Any]], parts: list[OutputPart], judged: set[str]) -> list[dict[str, Any]]:
    """``report.anchors`` rows with a row for each judged part just before its output's row."""
    parts_of: dict[str, list[OutputPart]] = {}
    for p in parts:
        parts_of.setdefault(p.output, []).append(p)
    out = []
    for row in rows:
        out.extend(
            {
                "name": p.name,
                "stage": row["stage"],
                "kind": "part",
                "op_type": "Concat",
                "dtype": row["dtype"],
                "producer": row.get("producer"),
                "value": p.value,
                "part_of": row["name"],
                "index": p.name[len(row["name"]) :],
                "shape": list(p.shape),
            }
            for p in parts_of.get(row["name"], [])
            if p.name in judged
        )
        out.append(row)
    return out


def _take_threshold(report: CheckReport, results: dict[str, ThresholdResult]) -> None:
    report.threshold = results
    if not any(t.total_elements for t in results.values()):
        report.problems.append("threshold baseline: no output anchor present in both the reference and another backend")


def _alignment_notes(report: CheckReport, rep) -> None:
    """Put what the aligner decided that a reader must see into ``report``: warnings, every segment
    order found by the data (a note per anchor and backend, counted first), and the unaligned reason
    of every (anchor, backend) the oracle could not judge because of it (those reach ``verdicts[b].unjudged``
    through the oracle)."""
    from anpred.align import describe_rule

    report.notes.extend(f"alignment warning: {w}" for w in rep.warnings)
    segs = rep.segments_by_data
    if segs:
        report.notes.append(
            f"alignment: {len(segs)} segment order(s) found by the data (a port's concatenation "
            "order, or a real channel-order defect; pin the rule or 'exclude' in manifest.json "
            "to decide)"
        )
    for d in segs:
        report.notes.append(
            f"alignment: {d.backend} at {d.anchor}: {describe_rule(d.rule)} found by the data "
            f"(normalised error {d.runner_up:.3g} -> {d.error:.3g})"
        )
    for d in rep.alignments:
        if d.layout_check:
            report.notes.append(f"alignment: {d.backend} at {d.anchor}: {d.layout_check}")
    # the unaligned reasons reach the verdicts through the oracle (Oracle.add(unaligned=...))


def _incomplete(report: CheckReport) -> list[str]:
    """One line per thing that could not be judged (``incomplete`` in :mod:`anpred.judge.struct`)."""
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
