"""The anchor manifest: which tensors of a model are anchors, and what is known about each.

Serialised as JSON (schema ``anpred.manifest/1``) next to the anchored model and inside the model's
``metadata_props`` under the key ``anpred.manifest``. Pure data: it never holds framework handles.

Shapes use ONNX conventions: a list whose entries are ints (static) or strings (symbolic, e.g.
``"batch"``) or ``None`` (unknown). ``dtype`` is a numpy dtype name (``"float32"``, ``"float16"``,
``"int64"`` ...). ``layout`` is ``"NCHW"``, ``"NHWC"``, ``"NCW"``, ``"NCDHW"`` ... or ``"unknown"``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

SCHEMA = "anpred.manifest/1"
METADATA_KEY = "anpred.manifest"


@dataclass
class Anchor:
    """One named intermediate (or output) tensor exposed for comparison.

    Attributes:
        name: the anchor's stable name (see :mod:`anpred.naming`), e.g. ``anchor/03/model.4``.
        value: the ONNX value name of the tensor in the anchored graph.
        stage: index (0-based) of the stage that produces this tensor (its producer node lies in
            that stage's slice of the topological order; a graph input gives 0); original outputs
            carry the index of the last stage. A boundary tensor closes the stage that produces it,
            and a skip tensor read further on is listed in the ``boundary`` of every later stage
            whose closing cut it crosses (see :class:`Stage`).
        order: position of the producer node in the topological order (for localization order).
        producer: name of the producing ONNX node ("" for a graph input).
        op_type: the producer's operator type.
        shape: ONNX shape (ints, symbolic strings, or None).
        dtype: numpy dtype name of the tensor.
        layout: layout hint, ``NCHW``/``NHWC``/``unknown`` ...
        scope: source scope when known (torch module path, Keras layer name), else "".
        kind: ``boundary`` (chosen by the partition), ``explicit`` (asked with ``--anchor``) or
            ``output`` (an original graph output).
        native: per backend, how the anchor maps onto that backend's native graph (filled by
            ``exporters.mapping``): ``{"torch-native": {"target": "model.4", "status": "exact",
            "transform": None}}``.
        alignment: per backend, a pinned alignment rule overriding inference, e.g.
            ``{"tf": {"permute": [0, 3, 1, 2]}}``.
    """

    name: str
    value: str
    stage: int
    order: int
    producer: str
    op_type: str
    shape: list[Any]
    dtype: str
    layout: str = "unknown"
    scope: str = ""
    kind: str = "boundary"
    native: dict[str, dict[str, Any]] = field(default_factory=dict)
    alignment: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Stage:
    """A contiguous slice ``[first, last]`` (inclusive) of the topological node order.

    One type for the stage of a partition plan (:class:`passes.plan.Partition`) and of the
    manifest: ``boundary`` names the tensors crossing the cut that closes the stage, as ONNX value
    names in a plan and as anchor names in a manifest."""

    index: int
    first: int
    last: int
    num_nodes: int
    cost: float
    boundary: list[str]  # tensors closing this stage: anchor names (manifest) / value names (plan)


@dataclass
class AnchorManifest:
    """All anchors of one instrumented model, in topological order, plus the stage partition."""

    anchors: list[Anchor]
    stages: list[Stage] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)  # source path, sha256, opset, producer, io
    partition: dict[str, Any] = field(default_factory=dict)  # options used: stages, max_cut_width...
    schema: str = SCHEMA

    # ---- access -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return [a.name for a in self.anchors]

    def __getitem__(self, name: str) -> Anchor:
        for a in self.anchors:
            if a.name == name:
                return a
        raise KeyError(f"no anchor named {name!r}; known: {', '.join(self.names()) or '(none)'}")

    def by_value(self) -> dict[str, Anchor]:
        return {a.value: a for a in self.anchors}

    def counts(self) -> str:
        """``"2 stages, 1 anchor + 1 output"``: the stage, inner-anchor and output-anchor counts, each
        noun singular for a count of 1 (as the CLI and ``anpred test`` print them)."""
        inner = sum(a.kind != "output" for a in self.anchors)
        outs = len(self.anchors) - inner

        def n(k: int, noun: str) -> str:
            return f"{k} {noun}" if k == 1 else f"{k} {noun}s"

        return f"{n(len(self.stages), 'stage')}, {n(inner, 'anchor')} + {n(outs, 'output')}"

    # ---- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AnchorManifest":
        schema = d.get("schema")
        if schema != SCHEMA:
            raise AnpredError(f"unsupported anchor manifest schema {schema!r} (expected {SCHEMA!r})")
        try:
            return cls(
                anchors=[Anchor(**a) for a in d["anchors"]],
                stages=[Stage(**s) for s in d.get("stages", [])],
                model=d.get("model", {}),
                partition=d.get("partition", {}),
                schema=schema,
            )
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed anchor manifest: {err}") from err

    @classmethod
    def from_json(cls, text: str) -> "AnchorManifest":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise AnpredError(f"anchor manifest is not valid JSON: {err}") from err
        return cls.from_dict(d)

    def save(self, path: str | Path) -> None:
        from anpred.onnx_io import atomic_write_text

        atomic_write_text(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "AnchorManifest":
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise AnpredError(f"cannot read anchor manifest {path}: {err.strerror}") from err
        return cls.from_json(text)

    # ---- in-model storage ---------------------------------------------------------------------
    def to_model(self, model) -> None:
        """Store (replace) this manifest in ``model.metadata_props`` under ``anpred.manifest``."""
        props = [p for p in model.metadata_props if p.key != METADATA_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(props)
        entry = model.metadata_props.add()
        entry.key = METADATA_KEY
        entry.value = self.to_json(indent=None)

    @classmethod
    def from_model(cls, model) -> "AnchorManifest | None":
        """Read the manifest stored in an ONNX ``ModelProto``; None when there is none."""
        for p in model.metadata_props:
            if p.key == METADATA_KEY:
                return cls.from_json(p.value)
        return None
