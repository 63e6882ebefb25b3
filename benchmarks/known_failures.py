"""Anchors for the oracle's score: ANPRED's deviating pairs against the node tests ONNX Runtime and
OpenVINO list as known failures (issue 38, deliverable 4).

ONNX Runtime skips the node tests of ``onnxruntime/test/testdata/onnx_backend_test_series_filters.jsonc``
(regular expressions matched against ``<case>_cpu``, the CPU execution provider's lists); OpenVINO
marks the node tests of ``src/frontends/onnx/tests/tests_python/test_backend.py`` xfail/skip (case
names, each with its ticket). Neither file is kept in this repository: give their entries as text
files (one regular expression, or one ``<case> <ticket>`` line, per line; ``//`` comments and JSON
punctuation are ignored) read from those repositories, and the results of an ``anpred conformance``
run. For each library the script prints, on the cases the run holds:

- **listed and deviating**: ANPRED's deviating (or failing) pair is a known failure;
- **deviating, not listed**: candidate new defects;
- **listed, matching**: listed as failing, but ANPRED finds the current release within the suite's
  tolerance on that case (fixed since, or failing only elsewhere: another device or data type).

    .venv/bin/python benchmarks/known_failures.py RESULTS.conformance.json \\
        --ort ORT_FILTERS.txt --openvino OPENVINO_XFAIL.txt --source-ort "microsoft/onnxruntime@<commit>" \\
        --source-openvino "openvinotoolkit/openvino@<commit>" > comparison.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def _patterns(path: Path) -> list[tuple[re.Pattern, str]]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("//")[0].strip().strip(",").strip('"')
        if not line or line in "{}[]":
            continue
        name, _, ticket = line.partition(" ")
        pat = name if name.startswith("^") else "^" + re.escape(name) + "$"
        out.append((re.compile(pat), ticket.strip()))
    return out


def _listed(case: str, pats: list[tuple[re.Pattern, str]]) -> str | None:
    for p, ticket in pats:
        if p.search(case) or p.search(case + "_cpu"):
            return ticket or p.pattern
    return None


def compare(records: list[dict], backend: str, pats: list[tuple[re.Pattern, str]]) -> dict[str, list[str]]:
    """The three groups (module docstring) for ``backend`` on the cases of ``records``."""
    groups: dict[str, list[str]] = {
        "listed_deviating": [],
        "listed_failing": [],
        "deviating_not_listed": [],
        "listed_matching": [],
    }
    for r in records:
        row = r.get("backends", {}).get(backend)
        if row is None:
            continue
        hit = _listed(r["case"], pats)
        truth = row["truth"]
        if hit is not None and truth == "deviates":
            groups["listed_deviating"].append(f"{r['case']} ({hit})")
        elif hit is not None and truth in ("failed", "unsupported"):
            groups["listed_failing"].append(f"{r['case']} ({hit})")
        elif hit is None and truth == "deviates":
            groups["deviating_not_listed"].append(f"{r['case']}: {row.get('reason', '')[:90]}")
        elif hit is not None and truth == "matches":
            groups["listed_matching"].append(f"{r['case']} ({hit})")
    return groups


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="conformance.json of anpred conformance")
    p.add_argument("--ort", type=Path, help="ONNX Runtime's filter entries (text)")
    p.add_argument("--openvino", type=Path, help="OpenVINO's xfail entries (text)")
    p.add_argument("--source-ort", default="", help="where the ORT entries were read (repository@commit)")
    p.add_argument("--source-openvino", default="", help="where the OpenVINO entries were read")
    a = p.parse_args(argv)
    doc = json.loads(a.results.read_text())
    records = doc["records"]
    lines = [
        "# Known failures of ONNX Runtime and OpenVINO against ANPRED's conformance run",
        "",
        f"Run: {len(records)} cases of {doc['plan'].get('folder', '?')} "
        f"({doc['plan'].get('dtype', '?')}); versions: "
        + "; ".join(
            f"{b} {v.get('onnxruntime') or v.get('openvino')}"
            for b, v in doc.get("versions", {}).items()
            if b in ("ort", "openvino")
        ),
        "",
    ]
    for backend, path, src in (("ort", a.ort, a.source_ort), ("openvino", a.openvino, a.source_openvino)):
        if path is None:
            continue
        g = compare(records, backend, _patterns(path))
        lines += [f"## {backend} (list: {src})", ""]
        for key, title in (
            ("listed_deviating", "listed, and ANPRED finds it deviating"),
            ("listed_failing", "listed, and ANPRED finds it failing (no output)"),
            ("deviating_not_listed", "deviating, not listed (candidate new defects)"),
            ("listed_matching", "listed, but ANPRED finds it matching"),
        ):
            items = g[key]
            lines.append(f"- **{title}**: {len(items)}" + (": " + "; ".join(items) if items else ""))
        lines.append("")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
