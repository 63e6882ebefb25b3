"""Command-line entry points: ``anpred <subcommand>`` and ``anpred-instrument``.

Each subcommand lives in ``anpred/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``main(args) -> int``; heavy imports happen inside ``main``. Exit status:
0 success / all consistent, 1 a backend flagged (check/test), 2 bad input (an :class:`AnpredError`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from anpred.errors import AnpredError

# Explicit registry (STYLE.md habit 7): subcommand -> module under anpred.commands.
COMMANDS: dict[str, str] = {
    "instrument": "instrument",
    "run": "run",
    "map": "map",
    "align": "align",
    "check": "check",
    "history": "history",
    "diff": "diff",
    "test": "test",
    "zoo": "zoo",
}


def _module(name: str):
    return importlib.import_module(f"anpred.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anpred",
        description="Anchor-based precision testing of deep learning libraries: instrument a model "
        "with stage anchors, run it on several runtimes, align the anchors, judge each backend "
        "against the consensus and localize where a deviation is born.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _module(name)
        p = sub.add_parser(name, help=mod.HELP, description=(mod.__doc__ or mod.HELP).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def _dispatch(main, args) -> int:
    try:
        return int(main(args) or 0)
    except AnpredError as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"anpred: error: {msg}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("anpred: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    return _dispatch(args._main, args)


def instrument_main(argv: list[str] | None = None) -> int:
    """``anpred-instrument``: the same as ``anpred instrument``."""
    mod = _module("instrument")
    p = argparse.ArgumentParser(prog="anpred-instrument", description=(mod.__doc__ or mod.HELP).strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(p)
    args = p.parse_args(argv)
    return _dispatch(mod.main, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
