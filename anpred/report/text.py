"""Terminal summary of a check report: one line per backend (verdict, origin stage, worst anchor, key
statistics), then the threshold baseline and what could not be judged."""

from __future__ import annotations


def _g(v, fmt=".2e") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, fmt)


def format_text(report) -> str:
    """The terminal summary of ``report`` (a :class:`anpred.check.CheckReport`) as one string."""
    lines = []
    model = report.model.get("name") or report.model.get("path") or report.model.get("source") or ""
    lines.append(f"anpred check {report.run_dir}  model {model}  samples {report.samples}  "
                 f"oracle {report.oracle}  -> {report.status.upper()}")
    if report.problems:
        lines.append("cannot be judged:")
        lines.extend(f"  - {p}" for p in report.problems)
    primary = report.config.get("primary", "nrmse")
    if report.verdicts:
        lines.append("")
        lines.append(f"{'backend':<16}{'family':<16}{'prec':<6}{'verdict':<10}{'origin':<28}"
                     f"{'worst anchor':<28}{'worst ' + primary:>12} {'x thr':>9}{'propagation':>14}")
        for b, v in report.verdicts.items():
            verdict = "FLAGGED" if v.flagged else ("ok" if v.judged_anchors else "unjudged")
            origin = f"s{v.origin_stage} {v.origin_anchor}" if v.origin_anchor else "-"
            prop = v.propagation + ("*" if v.non_monotonic else "")
            lines.append(f"{b:<16}{v.family:<16}{v.precision:<6}{verdict:<10}{origin[:27]:<28}"
                         f"{(v.worst_anchor or '-')[:27]:<28}{_g(v.worst_primary):>12}"
                         f" {_g(v.worst_ratio_to_threshold, '.2f'):>9}{prop:>14}")
        if any(v.non_monotonic for v in report.verdicts.values()):
            lines.append("  * non-monotonic propagation (amplified and attenuated after the origin)")
        for b, v in report.verdicts.items():
            if v.flagged and v.origin_anchor:
                c = report.cell(v.origin_anchor, b)
                if c is not None:
                    s = c.stats
                    lines.append(f"  {b} at origin {v.origin_anchor}: {c.reason}; max_abs {_g(s.max_abs)} "
                                 f"mean_signed {_g(s.mean_signed)} snr {_g(s.snr_db, '.1f')} dB cosine "
                                 f"{_g(s.cosine, '.6f')} W1 {_g(s.wasserstein)} max_ulp {_g(s.max_ulp, '.3g')} "
                                 f"nan {s.nan} inf {s.inf}")
    if report.threshold:
        lines.append("")
        any_ref = next(iter(report.threshold.values())).reference
        lines.append(f"threshold baseline vs {any_ref} (atol {report.config.get('atol')}, rtol {report.config.get('rtol')}):")
        for b, t in report.threshold.items():
            lines.append(f"  {b:<16}{'pass' if t.passed else 'FAIL':<6} {t.failed_elements}/{t.total_elements} "
                         f"elements out of tolerance, max abs {_g(t.max_abs)}, max rel {_g(t.max_rel)}")
    for b, why in report.unjudged_backends.items():
        lines.append(f"not judged: {b}: {why}")
    for n in report.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
