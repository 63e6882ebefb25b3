"""Pass infrastructure, after onnx_ir / torch.fx: ``call(model) -> PassResult(model, modified)``.

A pass validates its preconditions in ``requires``, does its work in ``call``, and checks its
postconditions in ``ensures``. :class:`PassManager` runs passes in order; a failure names the pass and
those that ran before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anpred.errors import AnpredError


class PassError(AnpredError):
    """A pass failed; the message names the pass and the passes that ran before it."""


@dataclass
class PassResult:
    model: Any  # onnx.ModelProto
    modified: bool
    info: dict[str, Any] = field(default_factory=dict)


class GraphPass:
    """Base class. Subclasses override :meth:`call`; ``requires``/``ensures`` are optional checks."""

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
        result = self.call(model)
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
