"""List every backend: its family (one consensus vote per family), the precision it is asked for,
the libraries it needs with their installed versions, whether it can run here, and whether
``anpred test`` runs it by default.

With a model: the pre-run coverage of every installed backend on it (the operators its own table
lacks and the nodes or inputs its converter refuses when asked node by node,
:mod:`anpred.backends.coverage`; "?" where a backend has neither: only a run can tell).

Examples:
  anpred backends
  anpred backends --json
  anpred backends --model model.onnx
"""

from __future__ import annotations

HELP = "list every backend: family, precision, library versions, installed, default"


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--model",
        metavar="ONNX",
        default=None,
        help="also say, per installed backend, which operators of this model its table lacks",
    )


def main(args) -> int:
    import json

    from anpred.backends import backend_table
    from anpred.pipeline.choices import ONNX_BACKENDS, NATIVE_BACKEND

    defaults = set(ONNX_BACKENDS) | set(NATIVE_BACKEND.values())
    rows = backend_table()
    for r in rows:
        r["default"] = r["name"] in defaults
    if args.model:
        from pathlib import Path

        from anpred.backends.coverage import precheck
        from anpred.onnx_io import load_model

        load_model(Path(args.model), load_external=False)  # a clear error for a missing/malformed file
        cov = precheck(args.model, {r["name"]: r["name"] for r in rows if r["installed"]})
        for r in rows:
            c = cov.get(r["name"])
            r["coverage"] = (
                None if c is None else {k: c.get(k) for k in ("basis", "ops", "error", "node_basis", "nodes")}
            )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    wn = max([22] + [len(r["name"]) + 1 for r in rows])  # the longest name (executorch-xnnpack-int8-dynamic)
    print(
        f"{'BACKEND':<{wn}}{'FAMILY':<21}{'PREC':<6}{'INSTALLED':<10}{'DEFAULT':<8}"
        + ("MODEL  " if args.model else "")
        + "LIBRARIES"
    )
    for r in rows:
        libs = ", ".join(f"{d} {v or '-'}" for d, v in r["packages"].items())
        model = ""
        if args.model:
            c = r.get("coverage") or {}
            model = f"{'lacks' if c.get('ops') else 'ok' if c.get('basis') or c.get('node_basis') else '?':<7}"
        print(
            f"{r['name']:<{wn}}{r['family']:<21}{r['precision']:<6}{'yes' if r['installed'] else 'NO':<10}"
            f"{'yes' if r['default'] else '':<8}{model}{libs}" + (f"  ({r['reason']})" if r["reason"] else "")
        )
    if args.model:
        from anpred.backends.coverage import format_coverage

        lines = format_coverage({r["name"]: r["coverage"] for r in rows if r.get("coverage")})
        print(
            "\n".join(
                ["", f"pre-run coverage of {args.model}:"]
                + (lines or ["no table lacks an operator and no converter asked refuses a node"])
                + ["(?: no operator table and no converter asked; only a run can tell)"]
            )
        )
    return 0
