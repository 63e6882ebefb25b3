"""List every backend: its family (one consensus vote per family), the precision it is asked for,
the libraries it needs with their installed versions, whether it can run here, and whether
``anpred test`` runs it by default.

Examples:
  anpred backends
  anpred backends --json
"""

from __future__ import annotations

HELP = "list every backend: family, precision, library versions, installed, default"


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def main(args) -> int:
    import json

    from anpred.backends import backend_table
    from anpred.pipeline.choices import ONNX_BACKENDS, NATIVE_BACKEND

    defaults = set(ONNX_BACKENDS) | set(NATIVE_BACKEND.values())
    rows = backend_table()
    for r in rows:
        r["default"] = r["name"] in defaults
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'BACKEND':<22}{'FAMILY':<21}{'PREC':<6}{'INSTALLED':<10}{'DEFAULT':<8}LIBRARIES")
    for r in rows:
        libs = ", ".join(f"{d} {v or '-'}" for d, v in r["packages"].items())
        print(f"{r['name']:<22}{r['family']:<21}{r['precision']:<6}{'yes' if r['installed'] else 'NO':<10}"
              f"{'yes' if r['default'] else '':<8}{libs}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return 0
