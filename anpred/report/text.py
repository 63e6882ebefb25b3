"""Terminal summary of a :class:`anpred.judge.CheckReport`: one line per backend (verdict, origin stage,
the largest primary statistic and its anchor, the highest ratio to threshold and its anchor), the statistics at each
origin, the propagation profile with the ratio between consecutive anchors, the threshold baseline, and everything that
could not be judged."""

from __future__ import annotations

MAX_GAP_LINES = 8  # per backend; the JSON report has them all


def _g(v, fmt=".2e") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, fmt)


VERDICT_WORDS = {
    "flagged": "FLAGGED",
    "consistent": "ok",
    "incomplete": "INCOMPLETE",
    "unjudged": "UNJUDGED",
    "reference": "reference",
}
_KIND_MARK = {
    "amplified": "^",
    "attenuated": "v",
    "stable": "",
    "appeared": "!",
    "vanished": "-",
    "clean": "",
    "introduced": "+",
}  # introduced: born in that stage (the drill-down's isolated stage replay)
#: the legend of every mark a propagation line can carry (:func:`propagation_line`)
PROPAGATION_LEGEND = (
    "^ amplified, v attenuated, ! appeared (zero before), - vanished (flagged before, under its "
    "threshold now), x? no ratio (zero before), * flagged"
)


def verdict_word(v) -> str:
    """``FLAGGED`` | ``ok`` | ``INCOMPLETE`` | ``UNJUDGED`` | ``reference`` for a BackendVerdict."""
    return VERDICT_WORDS.get(getattr(v, "status", ""), "FLAGGED" if v.flagged else "ok")


def propagation_line(report, backend: str, population: str | None = None) -> str:
    """``S(first) xR1 xR2 ...``: the primary statistic at the first judged anchor, then the ratio to the
    previous judged anchor at each next one (``^`` amplified, ``v`` attenuated, ``*`` flagged anchor).
    ``population`` (e.g. ``"int8"``): the profile of the backend's implementation verdict."""
    v = report.verdicts[backend]
    if population is not None:
        v = v.implementation
        if v is None:
            return "-"
    cells = report.cells if population is None else report.population_cells.get(population, [])
    if not v.steps and not v.judged_anchors:
        return "-"
    first = report.cell(v.steps[0].src, backend, population) if v.steps else None
    if first is None:  # a one-anchor profile (e.g. the origin is an output or a part of one)
        c = report.cell(v.profile_anchors[0], backend, population) if v.profile_anchors else None
        c = c or next((c for c in cells if c.backend == backend), None)
        return _g(c.primary) + ("*" if c is not None and c.flagged else "") if c is not None else "-"
    parts = [_g(first.primary, ".1e") + ("*" if first.flagged else "")]
    for s in v.steps:
        c = report.cell(s.dst, backend, population)
        r = "x?" if s.ratio is None else f"x{s.ratio:.3g}"
        parts.append(r + _KIND_MARK.get(s.kind, "") + ("*" if c is not None and c.flagged else ""))
    # flagged anchors the profile does not pass (parts of an output: the profile ends at the whole output)
    passed = {s.src for s in v.steps} | {s.dst for s in v.steps}
    off = [a for a in v.flagged_anchors if a not in passed]
    if off and v.steps:
        parts.append("(flagged at " + ", ".join(off) + ")")
    return " ".join(parts)


def _units_text(c) -> str:
    u = getattr(c, "units", None) or {}
    if not u:
        return ""
    return f"; {u['max']:.3g} max, {u['rms']:.3g} RMS in {u['unit']} ({u['size']:.3g})"


def _one_verdict(report, b: str, v, population: str | None) -> tuple[str, str]:
    """(``FLAGGED origin s3 anchor: measured 0.12, the population's cost 0.0086, threshold ...``, the
    basis of that cell) at the origin (flagged) or at the anchor closest to its threshold."""
    word = verdict_word(v)
    at = v.origin_anchor if v.flagged and v.origin_anchor else v.worst_anchor
    c = report.cell(at, b, population) if at else None
    if c is None:
        return word, ""
    what = "its peers' spread" if population else "the population's cost"
    exp = f"{what} {_g(c.peer_level)}" if c.peer_level is not None else "no peer"
    where = f"origin s{v.origin_stage} {at}" if v.flagged and v.origin_anchor else f"worst {at}"
    return (f"{word} {where}: measured {_g(c.primary)}, {exp}, threshold {_g(c.threshold)}{_units_text(c)}"), c.basis


def _scale_lines(report) -> list[str]:
    """Each anchor's expected error per precision, measured on the run (``report.scales``)."""
    scales = getattr(report, "scales", None) or {}
    precs = [p for p in ("fp32", "fp16", "bf16", "int8") if any(p in v for v in scales.values())]
    # a precision whose members ran several programs: one column per program's population (populations_of)
    precs += sorted({k for v in scales.values() for k in v} - set(precs))
    if not precs:
        return []
    w = max(len(a) for a in scales) + 2
    out = [
        "",
        "expected error per anchor and precision (nRMSE measured on this run; fp32: the voters against a "
        "float64 execution; reduced precisions: the population's median against the fp32 consensus):",
        "  " + f"{'anchor':<{w}}" + "".join(f"{p:>{max(10, len(p) + 2)}}" for p in precs),
    ]
    for a, per in scales.items():
        out.append(
            "  "
            + f"{a:<{w}}"
            + "".join(f"{_g(per[p]['expected'], '.2e') if p in per else '-':>{max(10, len(p) + 2)}}" for p in precs)
        )
    return out


def _population_lines(report) -> list[str]:
    """Both verdicts of every reduced-precision backend (budget vs the fp32 consensus, implementation
    vs its own population), with the measured error, the expected-error scale and the threshold at
    the origin (flagged) or at the anchor closest to its threshold."""
    rows = [(b, v) for b, v in report.verdicts.items() if not v.votes and v.precision != "fp64"]
    if not rows:
        return []
    out = [
        "",
        "reduced precision: budget = against the fp32 consensus (reference level: the population's cost, "
        "the median deviation of its other families); implementation = against the population's own "
        "consensus (reference level: its peers' spread)",
    ]
    for b, v in rows:
        pop = ", ".join(v.population) if v.population else "none (only member)"
        out.append(f"  {b} ({v.precision}, population: {pop})")
        line, basis = _one_verdict(report, b, v, None)
        out.append(f"    budget:         {line}")
        if basis:
            out.append(f"      basis: {basis}")
        if v.implementation is not None:
            line, basis = _one_verdict(report, b, v.implementation, v.precision)
            out.append(f"    implementation: {line}")
            if basis:
                out.append(f"      basis: {basis}")
            out.append(f"      profile: {propagation_line(report, b, v.precision)}")
    for p, info in (getattr(report, "populations", None) or {}).items():
        out.extend(f"  {p} population note: {n}" for n in info.get("notes", []))
    return out


def task_lines(report) -> list[str]:
    """The task's cost first (``report.task``, :mod:`anpred.task`): one line per backend with the
    headline number (run order), and the accuracy against the labels when there are any."""
    t = getattr(report, "task", None) or {}
    if not t or not t.get("backends"):
        return []
    desc = t.get("task", {})
    lines = [
        f"task ({desc.get('task')}, {t.get('samples')} samples; each backend against the consensus' results"
        + (f"; accuracy against {t.get('labels')} labels" if t.get("labels") else "")
        + "):"
    ]
    for b, d in t["backends"].items():
        tr = d.get("truth") or {}
        acc = ""
        if tr:
            key = "top1" if "top1" in tr else "map50"
            v = tr.get(key)
            acc = (f"; {key} {v:.4f}" if v is not None else f"; {key} -") + (
                f" ({tr['delta_to_consensus']:+.4f} vs the consensus)"
                if tr.get("delta_to_consensus") is not None
                else ""
            )
        lines.append(f"  {b}: {d['headline']}{acc}")
    ct = t.get("consensus_truth") or {}
    if ct:
        key = "top1" if "top1" in ct else "map50"
        lines.append(
            f"  consensus: {key} {ct.get(key) if ct.get(key) is None else round(ct[key], 4)} "
            f"on {ct.get('labelled')} labelled samples"
        )
    return lines


def culprit_line(b: str, c: dict) -> str:
    """One line naming a drilled backend's culprit operator and its repro."""
    scope = c.get("scope")
    if scope == "subgraph":  # grown from the culprit (anpred.drill.grow): the operators it kept
        scope = f"subgraph of {len(c.get('repro_nodes') or [])} operators: {', '.join(c.get('repro_nodes') or [])}"
    rep = (
        f"repro {c['repro']} (re-run: reproduced, {scope}; "
        f"{'flagged' if c.get('flagged_in_repro') else 'departs, below the floor'} there)"
        if c.get("reproduced")
        else "unconfirmed: no standalone repro reproduced it"
    )
    inside = f" inside {c['body_of']}" if c.get("body_of") else ""
    return (
        f"culprit {b}: {c['op_type']} '{c['node']}'{inside} in stage {c.get('stage')} (output {c.get('output')}): "
        f"local nRMSE {_g(c.get('local_nrmse'), '.3g')} vs peers {_g(c.get('peers_nrmse'), '.3g')}; {rep}"
    )


def neighbour_line(b: str, m: dict) -> str:
    """One line saying that a backend returned a neighbouring node's value for an anchor
    (:mod:`anpred.drill.neighbours`): ``mnn returns Relu(x) for anchor x ...``."""
    x = m["anchor"]
    what = f"{m['op_type']}(x)" if m["side"] == "downstream" and m["distance"] == 1 else f"the value of {m['op_type']}"
    where = {"downstream": "after", "upstream": "before", "beside": "beside"}[m["side"]]
    return (
        f"{b} returns {what} for anchor x = {x}: its tensor there equals the output of {m['op_type']} "
        f"'{m['node']}' ({m['distance']} node(s) {where} {m['producer_op']} '{m['producer']}', which computes x; "
        f"{m['statistic']} {_g(m['to_neighbour'], '.2g')} against it, threshold {_g(m['threshold'], '.2g')}, "
        f"against the consensus {_g(m['to_consensus'], '.2g')}): the backend fused or moved that operator, the "
        "anchor's own value is not observable there"
    )


def drill_lines(report) -> list[str]:
    """The drill-down's lines (``report.drill``, :mod:`anpred.drill`): culprits first, then per
    backend the local (stage replayed alone from the consensus) and carried error of each stage."""
    d = getattr(report, "drill", None) or {}
    if not d:
        return []
    lines = ["", f"drill-down ({d.get('samples')} samples, {d.get('runs')} replay runs, {d.get('seconds')} s):"]
    for b, c in (d.get("culprits") or {}).items():
        lines.append("  " + culprit_line(b, c))
    for b, v in report.verdicts.items():
        if v.flagged and v.votes and b not in (d.get("culprits") or {}) and b in (d.get("stages") or {}):
            lines.append(
                f"  culprit {b}: none found"
                + (
                    " (see the notes)"
                    if b not in (d.get("neighbours") or {})
                    else ": its tensor is a neighbouring node's value, below"
                )
            )
    for b, m in (d.get("neighbours") or {}).items():
        lines.append("  " + neighbour_line(b, m))
    stages = d.get("stages") or {}
    if stages:
        lines.append(
            "  stage replay (local: the stage alone from the consensus; carried: the normal run; "
            "I introduced, A amplified, c carried, . clean; + in a propagation profile: introduced there):"
        )
        for b, prof in stages.items():
            cells = " ".join(
                f"s{p['stage']}:{_g(p['local'], '.1e')}/{_g(p['carried'], '.1e')}"
                f"{ {'introduced': 'I', 'amplified': 'A', 'carried': 'c'}.get(p['role'], '.') }"
                for p in prof
            )
            lines.append(f"    {b:<16}{cells}")
    lines.extend(f"  {n}" for n in d.get("notes") or [])
    return lines


def _is_witness(report, b: str) -> bool:
    return (report.backends.get(b) or {}).get("role") in ("witness", "arbiter")


def witness_lines(report) -> list[str]:
    """The witnesses of the verdict table (``(w)``: added to reach a consensus of independent
    families, :mod:`anpred.pipeline.witnesses`), and those flagged: about the witness, not the
    backends under test."""
    wit = [b for b in report.backends if _is_witness(report, b)]
    if not wit:
        return []
    out = [
        "  (w): witness, added to reach a consensus ("
        + ", ".join(
            f"{b}{' = the float64 arbiter' if report.backends[b].get('role') == 'arbiter' else ''}" for b in wit
        )
        + "): judged too, but its verdict is about the witness; the status is the backends' under test"
    ]
    flagged = getattr(report, "flagged_witnesses", [])
    if flagged:
        out.append(
            f"  witness(es) flagged: {', '.join(flagged)} (a deviation of the witness's library, not of the "
            "backends under test)"
        )
    return out


def format_text(report) -> str:
    """The terminal summary of ``report`` (a :class:`anpred.judge.CheckReport`) as one string."""
    lines = []
    model = report.model.get("name") or report.model.get("path") or report.model.get("source") or ""
    lines.append(
        f"anpred check {report.run_dir}  model {model}  samples {report.samples}  "
        f"oracle {report.oracle}  -> {report.status.upper()}"
    )
    lines.extend(task_lines(report))
    if report.problems:
        lines.append("cannot be judged:")
        lines.extend(f"  - {p}" for p in report.problems)
    primary = report.config.get("primary", "nrmse")
    w = max([16] + [len(b) + 6 for b in report.verdicts])  # the backend column (" (w)": a witness)
    fw = max([16] + [len(v.family) + 2 for v in report.verdicts.values()])  # the family column
    if report.verdicts:
        lines.append("")
        lines.append(
            f"{'backend':<{w}}{'family':<{fw}}{'prec':<6}{'verdict':<11}{'judged':>9} {'origin':<28}"
            f"{'max ' + primary:>10} {'at anchor':<26}{'max x thr':>9} {'at anchor':<26}{'propagation':>11}"
        )
        n_anchors = len(report.anchors)
        for b, v in report.verdicts.items():
            shown = b + (" (w)" if _is_witness(report, b) else "")
            origin = f"s{v.origin_stage} {v.origin_anchor}" if v.origin_anchor else "-"
            prop = v.propagation + ("*" if v.non_monotonic else "")
            judged = f"{v.judged_anchors}/{n_anchors}" + ("~" if v.partial else "")
            big = report.largest_primary(b) if hasattr(report, "largest_primary") else None
            big_a, big_v = big if big is not None else ("-", None)
            prec = v.precision + ("*" if getattr(v, "precision_requested", "") else "")
            impl = v.implementation is not None and v.implementation.flagged
            word = ("FLAGGED" + ("+i" if v.flagged else ":i")) if impl else verdict_word(v)
            lines.append(
                f"{shown:<{w}}{v.family:<{fw}}{prec:<6}{word:<11}{judged:>9} {origin[:27]:<28}"
                f"{_g(big_v):>10} {big_a[:25]:<26}{_g(v.worst_ratio_to_threshold, '.2f'):>9} "
                f"{(v.worst_anchor or '-')[:25]:<26}{prop:>11}"
            )
        if any(v.implementation is not None and v.implementation.flagged for v in report.verdicts.values()):
            lines.append(
                "  FLAGGED:i: flagged by its implementation verdict only (against its precision population); "
                "FLAGGED+i: by both verdicts"
            )
        lines.extend(witness_lines(report))
        lines.append(
            "  judged: anchors judged / anchors (~: some judged on fewer samples than the run has); "
            f"max {primary}: the largest {primary} over judged anchors; max x thr: the highest ratio of "
            f"{primary} to its anchor's threshold (flagged above 1)"
        )
        for b, v in report.verdicts.items():
            if getattr(v, "precision_requested", ""):
                lines.append(
                    f"  {v.precision}*: {b} was asked for {v.precision_requested} but computed in "
                    f"{v.precision}, and is judged as {v.precision}"
                )
        lines.extend(_population_lines(report))
        lines.extend(_scale_lines(report))
        if any(v.non_monotonic for v in report.verdicts.values()):
            lines.append("  * non-monotonic propagation (amplified and attenuated after the origin)")
        lines.extend(_origin_lines(report))
        lines.append("")
        lines.append(
            f"propagation ({primary} at the first judged anchor, "
            f"then the ratio to the previous judged anchor; {PROPAGATION_LEGEND}):"
        )
        for b in report.verdicts:
            lines.append(f"  {b:<{w}}{propagation_line(report, b)}")
    lines.extend(drill_lines(report))
    if report.threshold:
        lines.append("")
        any_ref = next(iter(report.threshold.values())).reference
        lines.append(
            f"threshold baseline vs {any_ref} (atol {report.config.get('atol')}, rtol {report.config.get('rtol')}):"
        )
        for b, t in report.threshold.items():
            lines.append(
                f"  {b:<16}{'pass' if t.passed else 'FAIL':<6} {t.failed_elements}/{t.total_elements} "
                f"elements out of tolerance, max abs {_g(t.max_abs)}, max rel {_g(t.max_rel)}"
            )
    for c in getattr(report, "correlated", []) or []:
        lines.append(
            f"correlated: {' + '.join(c['backends'])} merged into one consensus vote at "
            f"{len(c['anchors'])} of {len(report.anchors)} anchors ("
            + (
                f"bit-identical or error-correlated, rho {min(c['rho'].values()):.2f}-{max(c['rho'].values()):.2f}"
                if c.get("rho")
                else "bit-identical tensors"
            )
            + ")"
        )
    from anpred.judge.oracle_notes import independence_line

    indep = independence_line(
        getattr(report, "independence", None) or {},
        getattr(report, "correlated", []) or [],
        float(report.config.get("correlated_rho", 0.8)),
    )
    if indep:
        lines.append(indep)
    lines.extend(_gap_lines(report))
    for n in report.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _origin_lines(report) -> list[str]:
    """For each flagged verdict (the implementation verdicts too): its origin anchor's reason and
    statistics (a wrong shape or missing output: the reason alone)."""
    lines = []
    for b, v, pop in [(b, v, None) for b, v in report.verdicts.items()] + [
        (b, v.implementation, v.precision) for b, v in report.verdicts.items() if v.implementation is not None
    ]:
        if v.flagged and v.origin_anchor:
            c = report.cell(v.origin_anchor, b, pop)
            if pop:
                b = f"{b} (implementation, {pop} population)"
            if c is not None and getattr(c, "deviation", ""):  # a wrong shape or missing output: no statistics
                lines.append(f"  {b} at origin {v.origin_anchor}: {c.reason}")
            elif c is not None:
                s = c.stats
                why = c.reason or getattr(v, "origin_traced", "")
                lines.append(
                    f"  {b} at origin {v.origin_anchor}: {why}; max_abs {_g(s.max_abs)} "
                    f"mean_signed {_g(s.mean_signed)} snr {_g(s.snr_db, '.1f')} dB cosine "
                    f"{_g(s.cosine, '.6f')} W1 {_g(s.wasserstein)} max_ulp {_g(s.max_ulp, '.3g')} "
                    f"nan {s.nan} inf {s.inf}"
                )
    return lines


def _gap_lines(report) -> list[str]:
    """What was not judged (the verdict is incomplete there), at most :data:`MAX_GAP_LINES` per backend."""
    lines = []
    gaps = getattr(report, "incomplete", []) or []
    if gaps:
        lines.append("")
        lines.append(f"NOT JUDGED ({len(gaps)}): the verdict is incomplete for these")
        per: dict[str, int] = {}
        hidden = 0
        for g in gaps:
            key = g.split(":", 1)[0]
            per[key] = per.get(key, 0) + 1
            if per[key] > MAX_GAP_LINES:
                hidden += 1
                continue
            lines.append(f"  - {g}")
        if hidden:
            lines.append(f"  ... {hidden} more (see the JSON report's 'incomplete')")
    return lines
