"""Re-judge the kept run folders of an ``anpred conformance --keep-runs`` output with the code on the
path: the oracle only (the backends' stored tensors are reused), so that two versions of the oracle are
scored on the very same runs against ONNX's expected outputs.

    .venv/bin/anpred conformance -o /tmp/conf --keep-runs
    PYTHONPATH=$PWD .venv/bin/python benchmarks/rejudge_conformance.py /tmp/conf OUT.json
    # another version: a worktree of it first on the path
    PYTHONPATH=/path/to/worktree .venv/bin/python benchmarks/rejudge_conformance.py /tmp/conf OLD.json

Prints the command's summary (matrix, counts, the oracle's recall and false alarms); writes the records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    from anpred.conformance.cases import default_folder, load_case
    from anpred.conformance.runner import case_record, judge_case
    from anpred.conformance.score import format_summary, summarize

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the folder of an `anpred conformance --keep-runs` run")
    ap.add_argument("records", help="JSON file to write the re-judged records to")
    ap.add_argument("--cases", default=None, help="the cases' folder (default: the installed node suite)")
    args = ap.parse_args(argv)
    out, root = Path(args.out), Path(args.cases) if args.cases else default_folder()
    recs = []
    for rd in sorted((out / "runs").iterdir()):
        old = json.loads((out / "cases" / f"{rd.name}.json").read_text())
        case = load_case(root / rd.name)
        recs.append(case_record(case, judge_case(rd, case), old.get("bound", {}), old.get("seconds", 0)))
    backends = sorted({b for r in recs for b in r.get("backends", {})})
    print(format_summary(summarize(recs, backends), recs, backends))
    Path(args.records).write_text(json.dumps(recs, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
