"""Pass infrastructure, after onnx_ir / torch.fx: ``call(model) -> PassResult(model, modified)``.

A pass validates its preconditions in ``requires``, does its work in ``call``, and checks its
postconditions in ``ensures``. :class:`PassManager` runs passes in order; a failure names the pass and
those that ran before it.

Declared contracts are enforced when a pass runs (``GraphPass.__call__``, hence also in
:class:`PassManager`), raising :class:`PassError`:

- ``in_place = True``: the pass edits its input and returns it (``result.model is model``);
- ``in_place = False``: the pass leaves its input untouched (it returns a new model, or the input
  itself when it changes nothing). Checked by a digest of the input before and after the call
  (:func:`model_digest`: every field, initializers by name and serialized size only, so it costs
  O(graph), not O(weights): docs/instrument.md, 'Measurements: graph walks').

An analysis that only reads the graph (the stage partition) is no pass: it returns a plan
(:class:`passes.partition.StagePartitioner`).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from dataclasses import dataclass, field
from typing import Any

from anpred.errors import AnpredError

__all__ = ["PassError", "PassResult", "GraphPass", "PassManager", "model_digest", "gc_paused"]


class PassError(AnpredError):
    """A pass failed or broke its declared contract; the message names the pass and the passes that
    ran before it."""


@dataclass
class PassResult:
    model: Any  # onnx.ModelProto
    modified: bool
    info: dict[str, Any] = field(default_factory=dict)


def _feed(h, fd, value) -> None:
    h.update(fd.name.encode())
    repeated = fd.is_repeated
    if fd.type == fd.TYPE_MESSAGE:
        for m in value if repeated else (value,):
            b = m.SerializeToString()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    else:
        h.update(repr(list(value) if repeated else value).encode())


def model_digest(model) -> dict[str, bytes]:
    """Per top-level part of ``model`` (a ``ModelProto``: ``graph.node``, ``graph.output``,
    ``metadata_props`` ...), a digest of its content. Initializers count by name and serialized
    size (their values are not read): adding, removing, renaming or resizing one is seen, an
    in-place edit of weight values (or a same-size reshape) is not; every other part is compared in
    full."""
    out: dict[str, bytes] = {}
    for fd, value in model.ListFields():
        if fd.name != "graph":
            h = hashlib.blake2b(digest_size=16)
            _feed(h, fd, value)
            out[fd.name] = h.digest()
            continue
        for gfd, gval in value.ListFields():
            h = hashlib.blake2b(digest_size=16)
            if gfd.name == "initializer":
                h.update("\0".join([t.name for t in gval]).encode())
                h.update(repr([t.ByteSize() for t in gval]).encode())
            else:
                _feed(h, gfd, gval)
            out[f"graph.{gfd.name}"] = h.digest()
    return out


class GraphPass:
    """Base class. Subclasses override :meth:`call`; ``requires``/``ensures`` are optional checks.

    ``in_place`` (class attribute) declares whether the pass edits its input (True, the default) or
    leaves it untouched (False); ``__call__`` enforces it (see the module docstring)."""

    in_place: bool = True

    @property
    def name(self) -> str:
        return type(self).__name__

    def requires(self, model) -> None:  # pragma: no cover - default no-op
        pass

    def ensures(self, model) -> None:  # pragma: no cover - default no-op
        pass

    def call(self, model) -> PassResult:
        raise NotImplementedError

    def __call__(self, model) -> PassResult:
        self.requires(model)
        before = None if self.in_place else model_digest(model)
        result = self.call(model)
        if self.in_place:
            if result.model is not model:
                raise PassError(f"{self.name} declares in_place=True but returned another model than its input")
        else:
            after = model_digest(model)
            if after != before:
                parts = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
                raise PassError(
                    f"{self.name} declares in_place=False but modified its input model ({', '.join(parts)})"
                )
        self.ensures(result.model)
        return result


class PassManager:
    """Run passes in order; ``modified`` is true if any pass modified the model."""

    def __init__(self, steps: list[GraphPass]):
        self.steps = list(steps)

    def __call__(self, model) -> PassResult:
        ran: list[str] = []
        modified = False
        info: dict[str, Any] = {}
        for p in self.steps:
            try:
                r = p(model)
            except AnpredError as err:
                raise type(err)(f"{p.name} failed (after {', '.join(ran) or 'no other pass'}): {err}") from err
            except Exception as err:
                raise PassError(f"{p.name} failed (after {', '.join(ran) or 'no other pass'}): {err}") from err
            model = r.model
            modified |= r.modified
            info[p.name] = r.info
            ran.append(p.name)
        return PassResult(model, modified, info)


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector for the block (re-enabled after it if it was on).

    The passes allocate tens of thousands of small lists/tuples per 10k-node graph and create no
    reference cycles (everything is freed by reference counting), but each allocation burst makes the
    collector walk every tracked object again (its share of the partition's time: docs/instrument.md,
    'Speed')."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
