"""The ground truth of an injected fault (result type of :mod:`passes.faults`), stored as JSON in the
variant's ``metadata_props["anpred.fault"]`` and read back by the evaluation."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FaultTruth"]


@dataclass
class FaultTruth:
    """Ground truth of an injected fault. ``stage`` is the manifest stage holding the node (None
    without a manifest); ``value`` is the tensor whose values change first."""

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
