"""The ground truth of an injected fault (result type of :mod:`passes.faults`), stored as JSON in the
variant's ``metadata_props["anpred.fault"]`` and read back by the evaluation; and the error the fault
passes raise (:class:`FaultError`, re-exported by :mod:`passes.faults`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from anpred.errors import AnpredError

__all__ = ["FaultError", "FaultTruth"]


class FaultError(AnpredError):
    """The fault cannot be injected where asked (no applicable node, unknown kind or node, a magnitude
    out of range, an unsupported quantization)."""


@dataclass
class FaultTruth:
    """Ground truth of an injected fault. ``stage`` is the manifest stage holding the node (None
    without a manifest, or when the node reaches no anchor): on the anchored model the stage whose
    node range holds it, on a converted model (QDQ, float16: nodes inserted) the first stage whose
    anchors it is an ancestor of. ``value`` is the tensor whose values change first; ``op_type`` is
    the node's type before injection."""

    kind: str
    magnitude: float
    node: str
    op_type: str
    value: str
    stage: int | None
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FaultTruth":
        return cls(**d)
