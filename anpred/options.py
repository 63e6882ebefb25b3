"""Option groups: each set of options defined once, shared by the commands and the Python API.

Each group is a dataclass with ``add_arguments(parser)`` (its command-line options, one definition
for every command that has them) and ``from_args(args)``; functions take the groups, not their
fields (the pattern of Polygraphy's ``tools/args``):

- :class:`JudgeOptions`: how a run is judged (``anpred check``, ``anpred test``, :func:`anpred.test`):
  oracle, config, atol, rtol, reference, allow_incomplete, drill, task, labels;
- :class:`RunOptions`: which backends run and how (backends, witnesses, precision populations,
  ``--all``, timeout, side by side);
- :class:`ModelOptions`: how MODEL becomes the graph under test (size, seed, factory kwargs, bound
  inputs, stages, cut width);
- :class:`InputOptions`: the samples (inputs, samples, input shapes);
- :class:`StreamOptions`: a dataset streamed in chunks (``--stream``);
- :class:`OutputOptions`: the report folder, the history, progress and tracebacks;
- :func:`add_timeout` (a backend's time limit), :func:`add_memory_bound` (a backend worker's memory
  bound): one definition each for ``anpred run``, ``anpred test`` and ``anpred campaign``.

:class:`TestOptions` holds one of each for :func:`anpred.pipeline.test`; :meth:`TestOptions.make`
also takes the groups' fields by name (``anpred.test(m, backends=[...], samples=2)``), each routed to
its group, so a field has one name everywhere.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

# ORACLES: the oracles of ``--oracle`` (:func:`anpred.judge.check_run`), in the shared defaults so that
# validating them imports nothing of the judge
from anpred.defaults import ORACLES
from anpred.errors import AnpredError, InputError

__all__ = [
    "JudgeOptions",
    "RunOptions",
    "ModelOptions",
    "InputOptions",
    "StreamOptions",
    "OutputOptions",
    "TestOptions",
    "add_verbose",
    "add_timeout",
    "add_memory_bound",
    "MEMORY_BOUND_DETAIL",
    "PRECISIONS",
    "ORACLES",
    "parse_input_shapes",
]

#: the reduced precisions whose population ``--precision`` adds (``anpred.pipeline.choices.POPULATIONS``)
PRECISIONS = ("fp16", "int8")


@dataclass
class JudgeOptions:
    """How a run is judged (:func:`anpred.judge.check_run`; docs/oracle.md).

    Attributes:
        oracle: ``consensus`` | ``threshold`` | ``both``.
        config: a TOML/JSON file overriding :mod:`anpred.defaults` (or an OracleConfig).
        atol, rtol: the threshold baseline's tolerances (None: the config's, 1e-5 each).
        reference: the threshold baseline's reference, and the consensus where fewer than three
            families vote (None: the config's priority list).
        allow_incomplete: an ``incomplete`` verdict exits 0.
        drill: drill each flagged fp32 backend down to the operator (:mod:`anpred.drill`).
        task: ``detect`` | ``classify`` | ``dense`` | ``module:function`` | an adapter | ``none``
            (None: the zoo entry's task); labels: ground truth for the task.
    """

    oracle: str = "consensus"
    config: Any = None
    atol: float | None = None
    rtol: float | None = None
    reference: str | None = None
    allow_incomplete: bool = False
    drill: bool = False
    task: Any = None
    labels: Any = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, task_help: str = "") -> None:
        """The judge options of ``anpred check`` and ``anpred test``."""
        g = parser.add_argument_group("judge options")
        g.add_argument(
            "--oracle",
            choices=("consensus", "threshold", "both"),
            default="consensus",
            help="consensus (default), threshold baseline, or both side by side",
        )
        g.add_argument("--atol", type=float, default=None, help="threshold baseline absolute tolerance (1e-5)")
        g.add_argument("--rtol", type=float, default=None, help="threshold baseline relative tolerance (1e-5)")
        g.add_argument(
            "--reference",
            default=None,
            metavar="BACKEND",
            help="reference backend (threshold baseline; consensus with fewer than 3 voting families)",
        )
        g.add_argument("--config", metavar="F", default=None, help="TOML/JSON file overriding the oracle defaults")
        g.add_argument(
            "--allow-incomplete",
            action="store_true",
            help="exit 0 when nothing is flagged even if something could not be judged (the report "
            "still says INCOMPLETE and lists the gaps)",
        )
        g.add_argument(
            "--drill",
            action="store_true",
            help="replay each stage alone from the consensus (local vs carried error) and drill each "
            "flagged backend down to the operator, with a standalone repro (<run>/drill/repro/<backend>)",
        )
        g.add_argument(
            "--task",
            default=None,
            metavar="TASK",
            help=task_help
            or "task metrics of every backend against the consensus: detect | classify | "
            "dense | module:function (a user adapter)",
        )
        g.add_argument(
            "--labels",
            default=None,
            metavar="FILE",
            help="ground truth for --task: class indices (.json list or mapping, .txt, or 'folders') or "
            "COCO JSON (detect); each backend's accuracy and its delta to the consensus",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "JudgeOptions":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def check_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`anpred.judge.check_run`."""
        return {
            "oracle": self.oracle,
            "atol": self.atol,
            "rtol": self.rtol,
            "reference": self.reference,
            "config": self.config,
            "allow_incomplete": self.allow_incomplete,
        }

    def validate(self) -> None:
        """Raises AnpredError: an unknown oracle, a negative tolerance, ``drill`` with the threshold
        oracle alone, a bad config file (read now: nothing runs before it is known good)."""
        if self.oracle not in ORACLES:
            raise AnpredError(f"unknown oracle {self.oracle!r}; known: {', '.join(ORACLES)}")
        if (self.atol is not None and self.atol < 0) or (self.rtol is not None and self.rtol < 0):
            raise AnpredError("--atol and --rtol must be non-negative")
        if self.drill and self.oracle == "threshold":
            raise AnpredError(
                "--drill needs the consensus oracle (--oracle consensus or both): the drill-down "
                "judges every replay against the consensus of the backends"
            )
        if self.config is not None and isinstance(self.config, (str, os.PathLike)):
            from anpred.defaults import load_config

            load_config(self.config)


@dataclass
class RunOptions:
    """Which backends run and how.

    Attributes:
        backends: the backends under test (a list or ``"a,b"``; None: the defaults,
            :func:`anpred.pipeline.choices.default_backends`). Named backends always count: one
            that cannot run makes the verdict incomplete; a default one that is not installed or
            cannot take the model is skipped with its reason.
        witnesses: where the backends give fewer than three voting fp32 families, add installed
            independent families as witnesses, the cheapest first (:mod:`anpred.pipeline.witnesses`);
            False: today's behaviour (a two-family run judges against one reference backend).
        precision: reduced precisions whose population joins the defaults (``fp16``, ``int8``).
        all_backends: every family and both populations (the full default set).
        timeout_s: per backend limit in seconds (prepare + all samples).
        side_by_side: the backends run at once, each in its own worker, the cores divided among
            them (:func:`anpred.run.spec.split_threads`).
        also: backends run beside the defaults and treated as defaults (skipped where they cannot
            run; the demo's int8 population); ignored with ``backends``.
    """

    backends: Any = None
    witnesses: bool = True
    precision: tuple[str, ...] = ()
    all_backends: bool = False
    timeout_s: float = 600.0
    side_by_side: bool = False
    also: tuple[str, ...] = ()

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("run options")
        g.add_argument(
            "--backends",
            "-b",
            metavar="LIST",
            default=None,
            help="comma-separated backends under test (default: the quick set, `anpred backends` "
            "marks it; a default backend not installed or unable to take the model is skipped)",
        )
        g.add_argument(
            "--precision",
            metavar="LIST",
            default=None,
            help="add the reduced-precision populations to the defaults: fp16, int8 or fp16,int8 "
            "(one converted model each, several implementations)",
        )
        g.add_argument(
            "--all",
            dest="all_backends",
            action="store_true",
            help="every fp32 family and both precision populations (the full set; slow)",
        )
        g.add_argument(
            "--no-witnesses",
            dest="witnesses",
            action="store_false",
            help="do not add witness families when the backends give fewer than three voting fp32 "
            "families (then one of them is the reference and is not judged)",
        )
        add_timeout(g)
        g.add_argument(
            "--side-by-side",
            action="store_true",
            help="the backends run at once (with --stream: those of a chunk), each in its own worker, the "
            "cores divided among them (a backend's threads: cores // backends, at least 1; default: one "
            "after the other, each with its library's default threads; docs/run.md, docs/task.md)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunOptions":
        prec = tuple(p.strip() for p in (args.precision or "").split(",") if p.strip())
        return cls(
            backends=args.backends,
            witnesses=args.witnesses,
            precision=prec,
            all_backends=args.all_backends,
            timeout_s=args.timeout_s,
            side_by_side=args.side_by_side,
        )

    def validate(self) -> None:
        """Raises AnpredError: an unknown precision, ``--precision``/``--all`` with a backend list,
        a timeout that is not positive."""
        if isinstance(self.precision, str):
            self.precision = tuple(p.strip() for p in self.precision.split(",") if p.strip())
        bad = [p for p in self.precision if p not in PRECISIONS]
        if bad:
            raise AnpredError(f"unknown precision {', '.join(bad)} for --precision; known: {', '.join(PRECISIONS)}")
        if self.backends is not None and (self.precision or self.all_backends):
            raise AnpredError(
                "--precision and --all choose the default backends; with --backends name every backend instead"
            )
        if not self.timeout_s or self.timeout_s <= 0:
            raise AnpredError(f"timeout must be positive (got {self.timeout_s})")


@dataclass
class ModelOptions:
    """How MODEL becomes the graph under test.

    Attributes:
        imgsz: input size (int or (H, W)) of resizable zoo models and of the spatial axes of dynamic
            image inputs that no given input or ``input_shapes`` fixes (default: the zoo size, else 640).
        seed: seed of generated inputs, of seeded zoo weights and of a zoo model's rendered pages.
        factory_kwargs: keyword arguments of a factory ``module:function``.
        bind: configuration inputs bound to constants (:func:`passes.bind_inputs.parse_bindings`).
        stages: number of stages K (None: about 8); max_cut_width: most tensors per stage boundary.
    """

    imgsz: Any = None
    seed: int = 0
    factory_kwargs: dict[str, Any] | None = None
    bind: Any = None
    stages: int | None = None
    max_cut_width: int = 4


@dataclass
class InputOptions:
    """The samples.

    Attributes:
        inputs: a folder or file of images / ``.npy`` / ``.npz``, or ``random:...``
            (:mod:`anpred.inputs`); None: the zoo model's real samples, photographs, or seeded arrays.
        samples: number of generated samples (default 3).
        input_shapes: ``{input name: shape}`` or ``"NAME:1x45,NAME2:1x3x64x64"``: the dynamic
            dimensions fixed without given inputs (:func:`anpred.pipeline.shapes.parse_input_shapes`).
    """

    inputs: str | None = None
    samples: int | None = None
    input_shapes: Any = None


@dataclass
class StreamOptions:
    """A dataset streamed in chunks (:mod:`anpred.pipeline.stream`): ``chunk`` samples per chunk
    (None: :func:`anpred.pipeline.stream.auto_chunk`), the ``keep`` most deviating samples kept per
    backend, intermediate anchors judged on ``positions`` sampled positions (None: 65536; 0: all),
    ``resume`` an interrupted run from its checkpoint. ``hooks``: testing hooks injected by a test
    (:class:`anpred.pipeline.stream_hooks.StreamHooks`; None: none; no command-line option sets them)."""

    chunk: int | None = None
    keep: int = 4
    positions: int | None = None
    resume: bool = False
    hooks: Any = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("stream options")
        g.add_argument(
            "--stream",
            action="store_true",
            help="run --inputs (a folder, 1000+ inputs) as a dataset: chunks judged as they come, memory "
            "flat, only the most deviating samples kept on disk",
        )
        g.add_argument(
            "--chunk",
            type=int,
            default=None,
            metavar="N",
            help="samples per chunk with --stream (default: 1 GiB of anchor tensors, at most 64; where "
            "anchors are sampled, the chunks after the first hold 4x as many, at most 64)",
        )
        g.add_argument(
            "--keep", type=int, default=4, metavar="K", help="most deviating samples kept per backend with --stream (4)"
        )
        g.add_argument(
            "--positions",
            type=int,
            default=None,
            metavar="K",
            help="with --stream: judge each intermediate anchor of more than K elements on K sampled "
            "positions, stored so by the workers (default 65536; 0: every element; docs/task.md)",
        )
        g.add_argument(
            "--resume",
            action="store_true",
            help="with --stream: continue the interrupted streamed run of the same command from its "
            "checkpoint (.<out name>.stream beside -o), skipping the samples it had judged",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "StreamOptions | None":
        """None without ``--stream`` (its options are then refused)."""
        if not args.stream:
            if args.resume:
                raise AnpredError("--resume continues an interrupted streamed run: it needs --stream")
            return None
        # (stream_hooks: set by anpred.cli.main's caller, a test, never by an option)
        return cls(
            chunk=args.chunk,
            keep=int(args.keep),
            positions=args.positions,
            resume=bool(args.resume),
            hooks=getattr(args, "stream_hooks", None),
        )


@dataclass
class OutputOptions:
    """Where the verdict goes: ``history`` (a SQLite database the verdict is appended to),
    ``overwrite`` (replace an earlier test in the report folder once the new one is complete),
    ``quiet`` (no progress on stderr)."""

    history: Any = None
    overwrite: bool = False
    quiet: bool = False

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, quiet_help: str, explorer_into: str | None = None) -> None:
        """``--history DB``, ``--model-explorer`` and ``-q/--quiet`` of ``anpred check`` and ``anpred test``.

        ``quiet_help``: what ``-q`` silences in this command (progress only, or everything but errors).
        ``explorer_into``: where the Model Explorer export goes when ``--model-explorer`` is a flag (a
        folder named by the command, e.g. ``OUT/model-explorer``); None: the option takes the folder
        (``--model-explorer DIR``)."""
        parser.add_argument(
            "--history", metavar="DB", default=None, help="append the verdict to this SQLite history database"
        )
        explorer = "export per-node data for Model Explorer (and Netron metadata) into {} (docs/dashboard.md)"
        if explorer_into is None:
            parser.add_argument("--model-explorer", metavar="DIR", default=None, help=explorer.format("DIR"))
        else:
            parser.add_argument("--model-explorer", action="store_true", help=explorer.format(explorer_into))
        parser.add_argument("-q", "--quiet", action="store_true", help=quiet_help)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "OutputOptions":
        """``overwrite``: False where the command has no ``--overwrite`` (``anpred check``)."""
        return cls(history=args.history, overwrite=bool(getattr(args, "overwrite", False)), quiet=args.quiet)


def add_timeout(parser: Any) -> None:
    """``--timeout S`` (``args.timeout_s``): seconds a backend may take to prepare and run all samples,
    :attr:`RunOptions.timeout_s` and :attr:`anpred.run.spec.RunSettings.timeout_s` (``anpred run``,
    ``anpred test``). ``parser``: a parser or an argument group."""
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds per backend for preparing and running (default 600)",
    )


#: what ``--memory-bound`` does in a command that runs backends here (``anpred run``, ``anpred test``)
MEMORY_BOUND_DETAIL = (
    "; one that passes it is stopped and 'failed' (default: 80%% of the memory available at the start; docs/run.md)"
)


def add_memory_bound(parser: Any, detail: str = MEMORY_BOUND_DETAIL) -> None:
    """``--memory-bound GIB`` (``args.memory_bound``, a float or None): the resident memory each backend
    worker may hold (:class:`anpred.run.limits.RunGuards`; the command checks it with
    :func:`anpred.run.limits.parse_gib`). ``detail``: what follows in the help (the command's default
    and where the bound comes from; ``%%`` for a percent sign)."""
    parser.add_argument(
        "--memory-bound",
        type=float,
        default=None,
        metavar="GIB",
        help="GiB of resident memory each backend worker may hold" + detail,
    )


def add_verbose(parser: argparse.ArgumentParser, default: Any = False) -> None:
    """``-v/--verbose``: an internal error prints its traceback (as ``ANPRED_DEBUG=1`` does).
    ``default`` ``argparse.SUPPRESS`` on a subcommand keeps a ``-v`` given before it."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="print the traceback of an internal error (as ANPRED_DEBUG=1)",
    )


_GROUPS = {
    "judge": JudgeOptions,
    "run": RunOptions,
    "build": ModelOptions,
    "feed": InputOptions,
    "output": OutputOptions,
}


@dataclass
class TestOptions:
    """The options of one :func:`anpred.pipeline.test`, one group each (``stream`` None: not streamed)."""

    judge: JudgeOptions = field(default_factory=JudgeOptions)
    run: RunOptions = field(default_factory=RunOptions)
    build: ModelOptions = field(default_factory=ModelOptions)
    feed: InputOptions = field(default_factory=InputOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    stream: StreamOptions | None = None

    __test__ = False  # not a pytest test class

    @classmethod
    def make(cls, **options: Any) -> "TestOptions":
        """Groups by name (``judge=JudgeOptions(...)``, ``stream=StreamOptions(...)`` or
        ``stream=True``) and the groups' fields by name (``backends=...``, ``samples=3``,
        ``timeout_s=60``), each into its group; a field given with its group overrides the group's.

        Raises:
            AnpredError: a name that is neither a group nor a field of one.
        """
        opts = cls()
        for name in _GROUPS:
            if isinstance(options.get(name), _GROUPS[name]):
                setattr(opts, name, replace(options.pop(name)))
        stream = options.pop("stream", None)
        if isinstance(stream, StreamOptions):
            opts.stream = replace(stream)
        elif stream:
            opts.stream = StreamOptions()
        for key, value in options.items():
            owner = next((g for g in _GROUPS if key in {f.name for f in fields(_GROUPS[g])}), None)
            if owner is None and key in {f.name for f in fields(StreamOptions)}:
                if opts.stream is None:
                    if key == "resume" and value:
                        raise AnpredError("--resume continues an interrupted streamed run: it needs --stream")
                    continue  # a stream field without a stream: ignored, as the CLI's defaults are
                setattr(opts.stream, key, value)
                continue
            if owner is None:
                known = sorted({f.name for g in _GROUPS.values() for f in fields(g)} | set(_GROUPS) | {"stream"})
                raise AnpredError(f"unknown test option {key!r}; known: {', '.join(known)}")
            setattr(getattr(opts, owner), key, value)
        return opts

    @property
    def backends(self) -> Any:
        return self.run.backends


def parse_input_shapes(value: Any) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` from ``"NAME:1x45,NAME2:1x3x64x64"`` or a mapping of name -> sequence.

    Raises:
        InputError: an entry without ``NAME:`` or with a dimension that is not a positive integer.
    """
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    else:
        items = []
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, dims = part.rpartition(":")
            if not sep or not name:
                raise InputError(f"--input-shapes entry {part!r} is not NAME:DIMS (e.g. ids:1x45)")
            items.append((name, dims.lower().split("x")))
    out: dict[str, tuple[int, ...]] = {}
    for name, dims in items:
        try:
            shape = tuple(int(d) for d in dims)
        except (TypeError, ValueError) as err:
            raise InputError(f"--input-shapes {name}: {dims!r} is not a shape like 1x45") from err
        if any(d < 1 for d in shape):
            raise InputError(f"--input-shapes {name}: dimensions must be positive, got {'x'.join(map(str, shape))}")
        out[name] = shape
    if not out:
        raise InputError("--input-shapes is empty (give NAME:1x45,...)")
    return out
