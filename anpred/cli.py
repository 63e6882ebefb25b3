"""Command-line entry points: ``anpred <subcommand>`` and ``anpred-instrument``.

Each subcommand lives in ``anpred/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``main(args) -> int``; heavy imports happen inside ``main``. Exit status
(:data:`EXIT_CODES`): 0 success / all judged and consistent, 1 a backend flagged or the verdict
incomplete (check/test; see ``anpred check --help``), 2 bad input (an :class:`AnpredError`), 3 internal
error (an unexpected exception: one line, the traceback with ``-v`` or ``ANPRED_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    "backends": "backends",
    "campaign": "campaign",
    "dashboard": "dashboard",
    "conformance": "conformance",
    "findings": "findings",
}


EXIT_CODES = {
    0: "success; check/test: every backend judged everywhere and consistent",
    1: "check/test: a backend flagged, or the verdict incomplete (something could not be judged; "
    "0 instead with 'check --allow-incomplete')",
    2: "bad input (unreadable model/run/config, bad option): one line on stderr",
    3: "internal error (a bug): one line on stderr; rerun with -v (or ANPRED_DEBUG=1) for the traceback",
}
EPILOG = "exit status:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())


def _module(name: str):
    return importlib.import_module(f"anpred.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anpred",
        description="Anchor-based precision testing of deep learning libraries: instrument a model "
        "with stage anchors, run it on several runtimes, align the anchors, judge each backend "
        "against the consensus and localize where a deviation is born.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbose(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _module(name)
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=(mod.__doc__ or mod.HELP).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=EPILOG,
        )
        mod.add_arguments(p)
        add_verbose(p, argparse.SUPPRESS)
        p.set_defaults(_main=mod.main)
    return parser


def add_verbose(parser: argparse.ArgumentParser, default=False) -> None:
    """``-v/--verbose`` (before or after the subcommand): an internal error prints its traceback, as
    ``ANPRED_DEBUG=1`` does (:func:`anpred.options.add_verbose`)."""
    from anpred.options import add_verbose as add

    add(parser, default)


def _dispatch(main, args) -> int:
    try:
        return int(main(args) or 0)
    except AnpredError as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"anpred: error: {msg}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as err:
        from anpred.errors import Terminated

        if isinstance(err, Terminated):
            print(
                f"anpred: {err}; nothing half-written was left (a campaign keeps its finished configurations)",
                file=sys.stderr,
            )
            return 143  # 128 + SIGTERM
        print("anpred: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - a bug must not exit 1 ("flagged")
        if getattr(args, "verbose", False) or os.environ.get("ANPRED_DEBUG"):
            import traceback

            traceback.print_exc()
        msg = (str(err).splitlines() or [""])[0][:300]
        print(
            f"anpred: internal error: {type(err).__name__}: {msg} (a bug; rerun with -v or ANPRED_DEBUG=1 "
            "for the traceback)",
            file=sys.stderr,
        )
        return 3


def main(argv: list[str] | None = None, *, stream_hooks=None) -> int:
    """``anpred ARGS``: the exit code of the command. ``stream_hooks``: testing hooks of a streamed
    run (:class:`anpred.pipeline.stream_hooks.StreamHooks`), injected by a test that runs the command
    line in a process of its own; the ``anpred`` command itself has none."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    args.stream_hooks = stream_hooks
    return _dispatch(args._main, args)


def instrument_main(argv: list[str] | None = None) -> int:
    """``anpred-instrument``: the same as ``anpred instrument``."""
    mod = _module("instrument")
    p = argparse.ArgumentParser(
        prog="anpred-instrument",
        description=(mod.__doc__ or mod.HELP).strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mod.add_arguments(p)
    add_verbose(p)
    args = p.parse_args(argv)
    return _dispatch(mod.main, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
