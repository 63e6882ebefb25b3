"""The matrix case x backend and the oracle's score against the ground truth.

From the per-case records of :mod:`anpred.conformance.runner`:

- **matrix**: each (case, backend) ``matches`` / ``deviates`` (the suite's test on the expected
  outputs) / ``unsupported`` / ``failed`` (the backend did not produce outputs: converter or runtime
  error, crash, timeout), with the reason;
- **score** of the consensus oracle on the pairs it judged whose ground truth is known: recall =
  flagged deviating pairs / deviating pairs; false alarms = flagged matching pairs (and their share
  of matching pairs); deviating pairs the oracle could not judge are counted apart (``unjudged``);
- **consensus wrong**: cases whose consensus (at some output) fails the suite's test itself; such a
  case is *saved* when no matching backend is flagged there in the end (the float64 arbiter cleared
  the flags of the accurate minority, :meth:`anpred.judge.consensus.Oracle._arbitrate`, or nothing
  was flagged), and *arbitrated* when the arbiter cleared at least one backend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["load_records", "summarize", "format_summary", "matrix_rows", "TRUTHS"]

TRUTHS = ("matches", "deviates", "random", "unsupported", "failed")


def load_records(out: str | Path) -> list[dict[str, Any]]:
    """The per-case records in ``out/cases`` (sorted by case), or the ``records`` of a results file."""
    p = Path(out)
    if p.is_file():
        return list(json.loads(p.read_text())["records"])
    return [json.loads(f.read_text()) for f in sorted((p / "cases").glob("*.json"))]


def summarize(records: list[dict[str, Any]], backends: list[str] | None = None) -> dict[str, Any]:
    """Counts per backend, the oracle's score and the consensus-wrong cases (module docstring)."""
    backends = backends or sorted({b for r in records for b in r.get("backends", {})})
    per = {b: {t: 0 for t in TRUTHS} for b in backends}
    score = {
        "deviating": 0,
        "flagged_deviating": 0,
        "unjudged_deviating": 0,
        "matching": 0,
        "flagged_matching": 0,
        "unjudged_matching": 0,
    }
    missed: list[str] = []
    alarms: list[str] = []
    wrong: list[dict[str, Any]] = []
    for r in records:
        rows = r.get("backends", {})
        for b, row in rows.items():
            if b not in per:
                continue
            per[b][row["truth"]] += 1
            if row["truth"] not in ("matches", "deviates"):
                continue
            key = "deviating" if row["truth"] == "deviates" else "matching"
            score[key] += 1
            if "flagged" not in row:
                score[f"unjudged_{key}"] += 1
            elif row["flagged"]:
                score[f"flagged_{key}"] += 1
                if key == "matching":
                    alarms.append(f"{r['case']}/{b}")
            elif key == "deviating":
                missed.append(f"{r['case']}/{b}")
        if r.get("consensus_wrong"):
            matching = [b for b, row in rows.items() if row["truth"] == "matches" and "flagged" in row]
            wrong.append(
                {
                    "case": r["case"],
                    "reason": r.get("consensus_reason", ""),
                    "matching": matching,
                    "flagged_matching": [b for b in matching if rows[b].get("flagged")],
                    "arbitrated": [b for b, row in rows.items() if row.get("arbitrated")],
                }
            )
    judged_dev = score["deviating"] - score["unjudged_deviating"]
    judged_match = score["matching"] - score["unjudged_matching"]
    score["recall"] = round(score["flagged_deviating"] / judged_dev, 4) if judged_dev else None
    score["false_alarm_rate"] = round(score["flagged_matching"] / judged_match, 4) if judged_match else None
    saved = [w for w in wrong if w["matching"] and not w["flagged_matching"]]
    return {
        "cases": len(records),
        "errors": sum(1 for r in records if r.get("error")),
        "backends": per,
        "score": score,
        "missed": missed,
        "false_alarms": alarms,
        "consensus_wrong": {
            "cases": len(wrong),
            "with_a_matching_backend": sum(1 for w in wrong if w["matching"]),
            "saved": len(saved),
            "arbitrated": sum(1 for w in wrong if w["arbitrated"]),
            "list": wrong,
        },
    }


def matrix_rows(records: list[dict[str, Any]], backends: list[str]) -> list[list[str]]:
    """The matrix as rows ``[case, cell per backend]``; a cell is the truth, ``!`` when the oracle
    flagged the pair, ``?`` when it could not judge it."""
    rows = []
    for r in records:
        cells = []
        for b in backends:
            row = r.get("backends", {}).get(b)
            if row is None:
                cells.append("-" if not r.get("error") else "error")
                continue
            mark = (
                ""
                if row["truth"] not in ("matches", "deviates")
                else ("!" if row.get("flagged") else "" if "flagged" in row else "?")
            )
            cells.append(row["truth"] + mark)
        rows.append([r["case"], *cells])
    return rows


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else f"{a}/0"


def format_summary(
    summary: dict[str, Any], records: list[dict[str, Any]], backends: list[str], matrix_limit: int = 40
) -> str:
    """The text the command prints: the matrix (up to ``matrix_limit`` cases), counts per backend,
    the oracle's score, the consensus-wrong cases."""
    lines = []
    if len(records) <= matrix_limit:
        width = max([len(r["case"]) for r in records] + [4])
        lines.append("case".ljust(width) + "  " + "  ".join(b[:12].ljust(12) for b in backends))
        for row in matrix_rows(records, backends):
            lines.append(row[0].ljust(width) + "  " + "  ".join(c[:12].ljust(12) for c in row[1:]))
        lines.append("(! flagged by the oracle, ? not judged by it)")
        lines.append("")
    lines.append(
        f"{summary['cases']} cases" + (f", {summary['errors']} not run (see the records)" if summary["errors"] else "")
    )
    lines.append("backend".ljust(22) + "".join(t.rjust(13) for t in TRUTHS))
    for b, c in summary["backends"].items():
        lines.append(b.ljust(22) + "".join(str(c[t]).rjust(13) for t in TRUTHS))
    s = summary["score"]
    judged_dev = s["deviating"] - s["unjudged_deviating"]
    judged_match = s["matching"] - s["unjudged_matching"]
    lines.append("")
    lines.append(
        f"oracle against the expected outputs: recall {_pct(s['flagged_deviating'], judged_dev)} of the "
        f"deviating pairs it judged ({s['unjudged_deviating']} deviating pair(s) not judged); false alarms "
        f"{_pct(s['flagged_matching'], judged_match)} of the matching pairs"
    )
    cw = summary["consensus_wrong"]
    lines.append(
        f"consensus wrong (fails the suite's test) in {cw['cases']} case(s); {cw['with_a_matching_backend']} "
        f"with a backend that matches; saved (no matching backend flagged) {cw['saved']}; the float64 "
        f"arbiter cleared a backend in {cw['arbitrated']}"
    )
    for w in cw["list"][:12]:
        lines.append(
            f"  {w['case']}: {w['reason'][:100]}; matching {','.join(w['matching']) or '-'}; "
            f"flagged among them {','.join(w['flagged_matching']) or '-'}"
        )
    return "\n".join(lines)
