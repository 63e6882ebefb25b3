"""The judge's result types: what is judged and what was decided, apart from the algorithms.

Description of what is judged: :class:`BackendInfo` (family, precision, vote), :class:`AnchorInfo`
(an anchor or a part of an output, in manifest order), defined in :mod:`anpred.judge.judged`.
Results: :class:`Cell` (one backend at one anchor), :class:`Step` (propagation between two judged anchors),
:class:`BackendVerdict` (per backend: status, origin, propagation), :class:`ThresholdResult` (the threshold
baseline), :class:`OracleResult` (everything :class:`anpred.judge.consensus.Oracle` decided) and
:class:`CheckReport` (the verdict on one run folder, schema ``anpred.check/1``).

Contract: plain dataclasses; each serialisable one has ``to_dict`` (JSON-ready: non-finite floats as
strings, :func:`anpred.judge.stats.json_float`) and ``from_dict`` (its inverse). The algorithms that
fill them live in :mod:`anpred.judge.consensus`, :mod:`anpred.judge.localize`,
:mod:`anpred.judge.threshold` and :mod:`anpred.judge.check`.

``CheckReport.status`` is

- ``consistent``: every backend judged at every anchor on every sample, nothing flagged (exit 0);
- ``flagged``: a backend flagged by the selected oracle(s) (exit 1), whatever else could not be judged;
- ``incomplete``: nothing flagged, but something could not be judged (a backend that did not run or
  whose tensors do not fit the manifest, an anchor missing or unaligned in a backend, samples
  missing): ``report.incomplete`` lists each gap (exit 1, or 0 with ``allow_incomplete``);
- ``error``: nothing could be judged (fewer than two usable backends, no anchor in common ...;
  ``report.problems`` says what and why; exit 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anpred.defaults import ORACLES
from anpred.errors import AnpredError
from anpred.judge.judged import AnchorInfo, BackendInfo  # what is judged, re-exported here
from anpred.judge.stats import ErrorStats, from_json_float, json_float
from anpred.onnx_io import json_safe

__all__ = [
    "ORACLES",
    "SCHEMA",
    "AnchorInfo",
    "BackendInfo",
    "BackendVerdict",
    "Cell",
    "CheckReport",
    "OracleResult",
    "Step",
    "ThresholdResult",
]

#: schema of :meth:`CheckReport.to_dict`
SCHEMA = "anpred.check/1"


# ------------------------------------------------------------------------------------------------
# results
@dataclass
class Cell:
    """The verdict of one backend at one anchor, over the whole population of inputs.

    ``stats`` are pooled over samples (nRMSE, SNR and cosine from pooled sums; max_abs, max_ulp maxima;
    mean_abs, mean_signed over all elements; wasserstein the mean of per-sample values). ``per_sample``
    holds the primary statistic's median, 90th percentile and maximum over samples. ``primary`` is the
    pooled primary statistic; ``peer_level`` the median of peers' (None: no peers), ``threshold``
    ``max(k * peer_level, floor)`` (the floor alone without peers). ``range_ratio``: for a part of an
    output only, ``max_abs / max |consensus|`` over the samples (unitless; the part range rule).
    ``basis``: which term set the threshold (``threshold_by``: the peers or the floor, with both
    values), then where the floor and the peers come from (:func:`anpred.judge.scales.threshold_basis`:
    the population measured on the run, a natural unit of the precision, or a documented constant). ``units``: the
    deviation in the natural unit of the precision (``{"unit": "int8 step"|"float16 ULP"|...,
    "size": ..., "max": ..., "rms": ...}``; empty for fp32). ``suppressed``: positions where the
    consensus is a decided NaN/Inf and the backend is not; ``undecided``: positions the families tied on.
    """

    anchor: str
    backend: str
    samples: int
    stats: ErrorStats
    primary: float
    per_sample: dict[str, float]
    floor: float
    peer_level: float | None
    threshold: float
    nonfinite: int
    flagged: bool
    reason: str = ""
    range_ratio: float | None = None
    basis: str = ""
    units: dict[str, Any] = field(default_factory=dict)
    suppressed: int = 0
    # which term set ``threshold``: "peers" (k x peer_level) or "floor" ("" in reports written before)
    threshold_by: str = ""
    undecided: int = 0
    # "" for a cell judged on its values; "shape" (the backend returned another shape than the one the
    # voting families agree on) or "missing" (it returned no value for a graph output they agree on):
    # flagged deviations without statistics (anpred.judge.deviations)
    deviation: str = ""
    # the wrong-tail finding at this cell (anpred.judge.verdict: a graded finding, a warning, not a flag)
    tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stats"] = self.stats.to_dict()
        d["units"] = {k: (json_float(v) if isinstance(v, float) else v) for k, v in self.units.items()}
        for k in ("primary", "floor", "peer_level", "threshold", "range_ratio"):
            d[k] = json_float(d[k])
        d["per_sample"] = {k: json_float(v) for k, v in self.per_sample.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cell":
        d = dict(d)
        d["stats"] = ErrorStats.from_dict(d["stats"])
        for k in ("primary", "floor", "peer_level", "threshold", "range_ratio"):
            if k in d:
                d[k] = from_json_float(d[k])
        d["per_sample"] = {k: from_json_float(v) for k, v in d["per_sample"].items()}
        d["units"] = {
            k: (from_json_float(v) if k in ("size", "max", "rms") else v) for k, v in d.get("units", {}).items()
        }
        return cls(**d)


@dataclass
class Step:
    """Propagation from one judged anchor to the next: ``ratio = S(to) / S(from)`` (None when S(from)
    is 0), ``kind`` amplified | attenuated | stable | appeared | vanished | clean, or introduced (set by the
    drill-down: the isolated stage replay finds the deviation born in the stage of ``to``)."""

    src: str
    dst: str
    ratio: float | None
    kind: str


@dataclass
class BackendVerdict:
    """Per backend: verdict, origin, worst anchor and propagation (rules: :mod:`anpred.judge.verdict`,
    :mod:`anpred.judge.localize`).

    ``status``: ``flagged`` (some anchor flagged), ``incomplete`` (nothing flagged, but some anchor
    could not be judged or was judged on fewer samples than the run has), ``unjudged`` (no anchor
    judged), ``consistent`` (every anchor judged on every sample, nothing flagged). ``unjudged``:
    anchor -> reason; ``partial``: anchor -> which samples are missing and why; ``reference_at``:
    anchors where this backend *was* the consensus (fewer than ``min_voters`` families; not a gap).
    ``samples``: samples in which it was judged at one anchor at least.

    Propagation (flagged backends): with the run's data flow known, ``steps`` follow
    ``profile_anchors`` = the origin plus the judged anchors that are data-flow descendants of it, in
    topological order (``profile_basis == "dataflow"``); without it, all judged anchors in manifest
    order (``"manifest"``, which interleaves parallel branches). Unflagged backends: manifest order."""

    backend: str
    family: str
    precision: str
    votes: bool
    flagged: bool
    origin_anchor: str | None = None
    origin_stage: int | None = None
    first_flagged_anchor: str | None = None
    origin_traced: str = ""  # how the origin was found from the first flagged anchor (empty: it is that anchor)
    worst_anchor: str | None = None
    worst_primary: float | None = None
    worst_ratio_to_threshold: float | None = None
    flagged_anchors: list[str] = field(default_factory=list)
    output_flagged: bool = False
    propagation: str = "none"  # none | amplified | attenuated | stable | masked
    non_monotonic: bool = False
    steps: list[Step] = field(default_factory=list)
    judged_anchors: int = 0
    unjudged: dict[str, str] = field(default_factory=dict)  # anchor -> reason
    status: str = "consistent"  # consistent | flagged | incomplete | unjudged | reference
    partial: dict[str, str] = field(default_factory=dict)  # anchor -> missing samples and why
    reference_at: list[str] = field(default_factory=list)
    samples: int = 0
    profile_anchors: list[str] = field(default_factory=list)  # anchors ``steps`` follow, in order
    profile_basis: str = "manifest"  # dataflow | manifest
    # the precision asked for when the backend computed in another one (``precision``, which it is judged as)
    precision_requested: str = ""
    # what this verdict judged the backend against: "fp32 consensus" (every backend's main verdict: for
    # a reduced-precision backend its *budget* verdict) or "<precision> population" (an implementation
    # verdict, nested in ``implementation``)
    judged_against: str = "fp32 consensus"
    # reduced-precision backends whose population had another member: the verdict against that
    # population's own consensus (does it compute the reduced model as its peers do?); None otherwise
    implementation: "BackendVerdict | None" = None
    # the members of the population it was judged in (implementation verdicts), run order
    population: list[str] = field(default_factory=list)
    # flagged fp32 backends drilled down (anpred.drill, ``--drill``): the operator whose output first
    # departs from its peers in the origin stage replayed alone, and its standalone repro
    # (``{"node", "op_type", "stage", "local_nrmse", "peers_nrmse", "repro", "reproduced", "scope", ...}``)
    culprit: dict[str, Any] | None = None
    # the isolated stage replay's role of each stage exit anchor (anpred.drill): introduced | amplified |
    # carried | clean; a propagation step into an ``introduced`` anchor has kind ``introduced``
    stage_roles: dict[str, str] = field(default_factory=dict)
    # graded findings that do not flag (anpred.judge.populations.cost_warnings): a reduced-precision
    # member losing a multiple of its population's cost, with the likely cause where the run knows it
    warnings: list[str] = field(default_factory=list)
    # {"anchor", "ratio", "nrmse", "peers"}: its largest cost ratio to its population (None: below
    # OracleConfig.cost_factor, or not a reduced-precision member)
    cost_ratio: dict[str, Any] | None = None

    @property
    def any_flagged(self) -> bool:
        """Flagged by this verdict or by its implementation verdict."""
        return self.flagged or bool(self.implementation is not None and self.implementation.flagged)

    @property
    def complete(self) -> bool:
        """Every anchor judged on every sample (``reference_at`` anchors excepted)."""
        return not self.unjudged and not self.partial and self.judged_anchors > 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("worst_primary", "worst_ratio_to_threshold"):
            d[k] = json_float(d[k])
        d["steps"] = [{**asdict(s), "ratio": json_float(s.ratio)} for s in self.steps]
        d["implementation"] = self.implementation.to_dict() if self.implementation is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BackendVerdict":
        d = dict(d)
        d["steps"] = [Step(**{**s, "ratio": from_json_float(s["ratio"])}) for s in d.get("steps", [])]
        if d.get("implementation") is not None:
            d["implementation"] = cls.from_dict(d["implementation"])
        for k in ("worst_primary", "worst_ratio_to_threshold"):
            d[k] = from_json_float(d[k])
        return cls(**d)


@dataclass
class ThresholdResult:
    """Polygraphy-style element-wise check of one backend's final outputs against one reference.

    An element fails when ``|x - r| > atol`` *and* ``|x - r| / |r| > rtol`` (Polygraphy's ``simple``
    compare function, ``check_error_stat="elemwise"``); NaN/Inf where the reference is finite fail.
    """

    backend: str
    reference: str
    atol: float
    rtol: float
    passed: bool
    failed_elements: int
    total_elements: int
    max_abs: float
    max_rel: float
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_abs"], d["max_rel"] = json_float(self.max_abs), json_float(self.max_rel)
        d["outputs"] = {k: {kk: json_float(vv) for kk, vv in v.items()} for k, v in self.outputs.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ThresholdResult":
        d = dict(d)
        d["max_abs"], d["max_rel"] = from_json_float(d["max_abs"]), from_json_float(d["max_rel"])
        d["outputs"] = {k: {kk: from_json_float(vv) for kk, vv in v.items()} for k, v in d["outputs"].items()}
        return cls(**d)


@dataclass
class OracleResult:
    """Everything the oracle decided. ``correlated``: one entry per group of families merged into one
    vote somewhere (``families``, ``backends``, ``anchors``: anchor -> samples merged, ``differ``:
    anchors where they were judged apart). ``plot_data[(anchor, backend)]`` holds reservoirs ``err``,
    ``x``, ``c`` (float64 1-D) for the HTML report; it is not serialised."""

    cells: list[Cell]
    verdicts: dict[str, BackendVerdict]
    consensus: dict[str, Any]
    unjudged_anchors: dict[str, str]
    notes: list[str]
    correlated: list[dict[str, Any]] = field(default_factory=list)
    # error correlation of each pair of voting families (anpred.judge.independence.PairDistances.summary)
    independence: dict[str, Any] = field(default_factory=dict)
    samples: int = 0
    plot_data: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    # precision -> {"members", "consensus", "notes", "correlated"} of each population oracle
    populations: dict[str, dict[str, Any]] = field(default_factory=dict)
    # precision -> the cells of its population oracle (implementation verdicts), manifest order
    population_cells: dict[str, list[Cell]] = field(default_factory=dict)
    # anchor -> precision -> {"expected": nRMSE, "basis": text}: each precision's expected error there,
    # measured on the run (anpred.judge.populations.expected_scales)
    scales: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # split votes between camps of families (anpred.judge.camps.SplitLog.summary): anchor, camps,
    # decided_for (None: a tie), basis (float64 | count | tie), samples
    splits: list[dict[str, Any]] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# the verdict on a run folder
@dataclass
class CheckReport:
    """The verdict on one run folder.

    Attributes:
        status: ``consistent`` | ``flagged`` | ``incomplete`` | ``error`` (module docstring).
        incomplete: what could not be judged, one line each (empty when everything was judged).
        allow_incomplete: ``incomplete`` exits 0 instead of 1 (``--allow-incomplete``).
        correlated: groups of backends merged into one consensus vote (bit-identical tensors) and where.
        inputs: the input set's identity: ``description`` (run.json ``inputs``), ``samples`` and
            ``sha256`` (of the samples' sha256 in run order: equal for the same inputs).
        oracle: ``consensus`` | ``threshold`` | ``both``.
        verdicts: per backend, the consensus oracle's verdict (origin, propagation ...).
        cells: per (anchor, backend) statistics and decision, in manifest order.
        threshold: per backend, the threshold baseline on the final outputs.
        consensus: per anchor, how the consensus was formed (``median:<families>`` / ``reference:<b>``).
        backends: per backend, family, precision, votes, run status, versions, reason.
        unjudged_backends: backend -> why it was not judged at all.
        unjudged_anchors: anchor -> why no backend could be judged there.
        problems: fatal reasons when ``status == "error"``; notes: everything else worth saying.
        plot_data: reservoirs for the HTML plots (not serialised).
    """

    run_dir: str
    status: str
    oracle: str
    samples: int = 0
    created: str = ""
    model: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    anchors: list[dict[str, Any]] = field(default_factory=list)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, BackendVerdict] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    threshold: dict[str, ThresholdResult] = field(default_factory=dict)
    consensus: dict[str, list[str]] = field(default_factory=dict)
    unjudged_backends: dict[str, str] = field(default_factory=dict)
    unjudged_anchors: dict[str, str] = field(default_factory=dict)
    alignment: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    allow_incomplete: bool = False
    correlated: list[dict[str, Any]] = field(default_factory=list)
    independence: dict[str, Any] = field(default_factory=dict)
    # split votes between camps of families (OracleResult.splits, anpred.judge.camps)
    splits: list[dict[str, Any]] = field(default_factory=list)
    populations: dict[str, dict[str, Any]] = field(default_factory=dict)
    population_cells: dict[str, list[Cell]] = field(default_factory=dict)
    scales: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # the drill-down (anpred.drill, ``--drill``): isolated stage replay profiles and culprits
    drill: dict[str, Any] = field(default_factory=dict)
    # what the deviations cost the task (anpred.task.task_impact, ``--task``): per backend the task
    # metrics against the consensus (and the labels)
    task: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA
    plot_data: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.status == "consistent"

    @property
    def consistent(self) -> bool:
        return self.status == "consistent"

    @property
    def flagged_backends(self) -> list[str]:
        """Backends under test flagged by the selected oracle(s), in run order (a witness's flag,
        ``backends[b]["role"]`` ``witness`` or ``arbiter``, is about the witness:
        :attr:`flagged_witnesses`)."""
        return [b for b in self._flagged() if not self.is_witness(b)]

    @property
    def flagged_witnesses(self) -> list[str]:
        """Witnesses (added to reach a consensus, :mod:`anpred.pipeline.witnesses`) flagged, in run order."""
        return [b for b in self._flagged() if self.is_witness(b)]

    def is_witness(self, backend: str) -> bool:
        """Whether ``backend`` ran as a witness or the arbiter, not as a backend under test."""
        return (self.backends.get(backend) or {}).get("role") in ("witness", "arbiter")

    def _flagged(self) -> list[str]:
        out = []
        for b in self.backends:
            v = self.verdicts.get(b)
            t = self.threshold.get(b)
            if (self.oracle in ("consensus", "both") and v is not None and v.any_flagged) or (
                self.oracle in ("threshold", "both") and t is not None and not t.passed
            ):
                out.append(b)
        return out

    def cell(self, anchor: str, backend: str, population: str | None = None) -> Cell | None:
        """The cell of ``backend`` at ``anchor``: its main verdict's (fp32 consensus), or with
        ``population`` (e.g. ``"int8"``) its implementation verdict's."""
        for c in self.cells if population is None else self.population_cells.get(population, []):
            if c.anchor == anchor and c.backend == backend:
                return c
        return None

    def largest_primary(self, backend: str) -> tuple[str, float] | None:
        """``(anchor, value)`` of the largest primary statistic (pooled nRMSE by default, unitless)
        among ``backend``'s judged cells; None when none was judged. This is the true worst
        statistic; ``BackendVerdict.worst_anchor`` / ``worst_primary`` are the cell with the highest
        ratio to its threshold (``worst_ratio_to_threshold``), which is not always the largest."""
        best = None
        for c in self.cells:
            if c.backend != backend or c.primary is None:
                continue
            key = c.primary if not math.isnan(c.primary) else math.inf
            if best is None or key > best[0]:
                best = (key, c.anchor, c.primary)
        return None if best is None else (best[1], best[2])

    @property
    def exit_code(self) -> int:
        """CLI exit status: 0 consistent, 1 flagged, 1 incomplete (0 with ``allow_incomplete``), 2 error."""
        return {"consistent": 0, "flagged": 1, "incomplete": 0 if self.allow_incomplete else 1}.get(self.status, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "run_dir": self.run_dir,
            "status": self.status,
            "oracle": self.oracle,
            "samples": self.samples,
            "created": self.created,
            "model": self.model,
            "machine": self.machine,
            "inputs": self.inputs,
            "anchors": self.anchors,
            "backends": self.backends,
            "config": self.config,
            "flagged_backends": self.flagged_backends,
            "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
            "cells": [c.to_dict() for c in self.cells],
            "threshold": {k: v.to_dict() for k, v in self.threshold.items()},
            "consensus": self.consensus,
            "unjudged_backends": self.unjudged_backends,
            "unjudged_anchors": self.unjudged_anchors,
            "alignment": self.alignment,
            "problems": self.problems,
            "notes": self.notes,
            "incomplete": self.incomplete,
            "allow_incomplete": self.allow_incomplete,
            "correlated": self.correlated,
            "independence": self.independence,
            "splits": json_safe(self.splits),
            "populations": self.populations,
            "population_cells": {p: [c.to_dict() for c in cs] for p, cs in self.population_cells.items()},
            "scales": {
                a: {p: {**v, "expected": json_float(v["expected"])} for p, v in per.items()}
                for a, per in self.scales.items()
            },
            "drill": json_safe(self.drill),
            "task": json_safe(self.task),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckReport":
        """Read a report written by :meth:`to_dict`. Raises AnpredError on another schema."""
        if d.get("schema") != SCHEMA:
            raise AnpredError(f"unsupported check report schema {d.get('schema')!r} (expected {SCHEMA!r})")
        try:
            return cls(
                run_dir=d["run_dir"],
                status=d["status"],
                oracle=d["oracle"],
                samples=d.get("samples", 0),
                created=d.get("created", ""),
                model=d.get("model", {}),
                machine=d.get("machine", {}),
                inputs=d.get("inputs", {}),
                anchors=d.get("anchors", []),
                backends=d.get("backends", {}),
                config=d.get("config", {}),
                verdicts={k: BackendVerdict.from_dict(v) for k, v in d.get("verdicts", {}).items()},
                cells=[Cell.from_dict(c) for c in d.get("cells", [])],
                threshold={k: ThresholdResult.from_dict(v) for k, v in d.get("threshold", {}).items()},
                consensus=d.get("consensus", {}),
                unjudged_backends=d.get("unjudged_backends", {}),
                unjudged_anchors=d.get("unjudged_anchors", {}),
                alignment=d.get("alignment", {}),
                problems=d.get("problems", []),
                notes=d.get("notes", []),
                incomplete=d.get("incomplete", []),
                allow_incomplete=bool(d.get("allow_incomplete", False)),
                correlated=d.get("correlated", []),
                independence=d.get("independence", {}),
                splits=d.get("splits", []),
                populations=d.get("populations", {}),
                population_cells={
                    p: [Cell.from_dict(c) for c in cs] for p, cs in d.get("population_cells", {}).items()
                },
                scales={
                    a: {p: {**v, "expected": from_json_float(v["expected"])} for p, v in per.items()}
                    for a, per in d.get("scales", {}).items()
                },
                drill=d.get("drill", {}),
                task=d.get("task", {}),
            )
        except (KeyError, TypeError) as err:
            raise AnpredError(f"malformed check report: {err}") from err

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)
