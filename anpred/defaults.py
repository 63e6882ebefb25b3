"""The one registry of oracle defaults: noise floors and outlier factor ``k`` per dtype, families.

Every number the oracle uses to decide lives here (no per-test magic numbers). They can be
overridden by a TOML or JSON config file (``anpred check --config F``), e.g.::

    # anpred.toml
    [oracle]
    primary = "nrmse"
    min_voters = 3
    [oracle.k]
    fp32 = 10.0
    [oracle.floor]
    fp32 = 1e-5
    [oracle.depth_growth]
    fp32 = 0.5

Noise floor of the primary statistic (nRMSE against the consensus) for a backend of precision ``p``
at an anchor of stage ``s`` (0-based; outputs carry the last stage)::

    floor(p, s) = floor[p] * sqrt(1 + depth_growth[p] * s)

(rounding errors of independent operations add in quadrature, so the clean spread grows like the
square root of depth).

Every floor is **measured** (``benchmarks/noise_floor.py``, numbers in ``docs/oracle.md``): clean runs
of the zoo's yolov8n and yolov5n (320x320, seeded, BN-calibrated; 2 photographs + 20 random inputs),
the trained yolov8n-doclaynet (1024x1024) and PP-OCRv4 det (320x320; 2 + 6 inputs each), judged with
the default oracle; per precision the largest stage-0 need ``S / sqrt(1 + s)`` over every (model,
anchor, backend) cell, diagnosed defects left out (listed in the script). ``floor = 4 x need``,
rounded up to one significant digit: 4 because the four models' needs already spread about that much,
so the margin over the worst measured model is of the order of that spread. The needs, per precision
and model, and the margins: docs/oracle.md, 'Defaults, measured'.

int8's floor is above 1 (an nRMSE of 1 is the error of a zero output): ORT's static QDQ int8
(``quantize_static``, as ``ort-int8`` builds it) deviates by tenths of the signal already at the
first anchor of these models, so a dtype-level floor cannot tell its rounding from a defect. These constants are the
**fallback** of a reduced precision with no population on the run (one member): where several
implementations computed the same reduced model, its budget and implementation verdicts take their
scale from the run (:mod:`anpred.judge.populations`, :mod:`anpred.judge.scales`, ``docs/oracle.md``).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")

# Statistics the oracle can use as its primary statistic (all "larger is worse").
PRIMARY_STATISTICS = ("nrmse", "mean_abs", "max_abs", "wasserstein")

#: the oracles ``check_run`` can apply (``--oracle``; :mod:`anpred.options` checks it without importing
#: the judge)
ORACLES = ("consensus", "threshold", "both")

# Kernel families: one consensus vote each (DESIGN.md). Backends not listed use their
# BackendStatus.family, else their own name.
FAMILIES: dict[str, str] = {
    "ort": "onnxruntime",
    "ort-noopt": "onnxruntime",
    "ort-fp16": "onnxruntime",
    "ort-int8": "onnxruntime",
    "openvino": "openvino",
    "openvino-bf16": "openvino",
    "torch": "torch",
    "torch-native": "torch",
    "tf": "tensorflow",
    "tf-native": "tensorflow",
    "onnx-reference": "onnx-reference",
    "onnx-reference-fp64": "onnx-reference-fp64",
    # reduced-precision population members: families as for fp32
    "ort-int8-noopt": "onnxruntime",
    "ort-fp16-noopt": "onnxruntime",
    "openvino-int8": "openvino",
    "openvino-fp16": "openvino",
    "onnx-reference-int8": "onnx-reference",
    "onnx-reference-fp16": "onnx-reference",
    "torch-fp16": "torch",
}

# Families that run another family's conversion of the ONNX graph: in the count that decides a split
# between camps (anpred.judge.camps.decide) they are one unit with it, since the conversion fixes the
# graph's semantics for both (a converter's wrong rule is bit-identical in both). Structural, not a
# measurement: litert runs the tf backend's onnx2tf SavedModel (anpred/backends/litert.py). Not the
# ExecuTorch backends: from an ONNX model they lower the torch backend's onnx2torch module, but from a
# native PyTorch model they share no conversion (the module is the specification), and the count does
# not see the origin. Kernel sharing is measured, not declared (anpred.judge.independence).
CONVERSION_UNITS: dict[str, str] = {"litert": "tensorflow"}

# Reduced-precision variants: judged against the consensus, never voting.
REDUCED_PRECISION: dict[str, str] = {
    "ort-fp16": "fp16",
    "ort-int8": "int8",
    "openvino-bf16": "bf16",
    # population members: the precision of their population
    "ort-int8-noopt": "int8",
    "openvino-int8": "int8",
    "onnx-reference-int8": "int8",
    "ort-fp16-noopt": "fp16",
    "openvino-fp16": "fp16",
    "onnx-reference-fp16": "fp16",
    "torch-fp16": "fp16",
}

# Order in which a fallback reference is chosen when fewer than min_voters families vote.
REFERENCE_PRIORITY = (
    "onnx-reference",
    "ort-noopt",
    "ort",
    "torch-native",
    "torch",
    "openvino",
    "tf-native",
    "tf",
    # within a precision population with fewer than min_voters families: the members
    # that compute the reduced graph as the ONNX specification writes it (float QDQ /
    # float16 arithmetic per operation), not an optimized kernel library's fusions
    "onnx-reference-int8",
    "ort-int8-noopt",
    "onnx-reference-fp16",
    "ort-fp16-noopt",
)

#: Memory bounds of a run (:mod:`anpred.run.limits`, docs/run.md "Memory bounds"): the share of the
#: memory available when a run starts (the smaller of MemAvailable and the room under the process's
#: cgroup limit) that one backend worker's process tree, and the run's processes together, may hold
#: (RSS) by default. Not a verdict threshold: it decides only when a runaway worker is stopped. The
#: rest is left to the machine's other processes and the page cache the run's tensor files go
#: through. Source and sensitivity (the workers' peaks, the memory at which a smaller share would
#: stop one): docs/run.md, 'Memory bounds'.
MEMORY_BOUND_SHARE = 0.8
#: Seconds between two samples of the workers' RSS by the driver (:class:`anpred.run.limits.MemoryWatch`):
#: a worker can grow past its bound for at most this long before it is killed; short, since one sample
#: of a worker's process tree costs the driver little (overshoot and cost: docs/run.md, 'Memory bounds').
MEMORY_POLL_S = 0.2
#: Seconds of onnx2tf probes per model in the pre-run coverage of ``tf`` and ``litert``
#: (:mod:`anpred.backends.tf_probe`), the probe worker's start (TensorFlow's import) and a whole-model
#: check included; nodes not probed within it are not refused (the run finds their failures). Not a
#: verdict threshold: it bounds what the coverage may cost, as the pnnx budget does. Source and
#: sensitivity (what the worker's start and one node cost, how much of a model a smaller budget probes):
#: docs/backends-converters.md, 'Measurements: onnx2tf probe budget'.
ONNX2TF_PROBE_BUDGET_S = 30.0


@dataclass
class OracleConfig:
    """Decision parameters of the population-deviation oracle (see ``docs/oracle.md``).

    Attributes:
        primary: the primary statistic (one of :data:`PRIMARY_STATISTICS`), pooled over the inputs.
        k: per precision, the outlier factor: flagged needs ``stat > k * median(peers' stat)``.
        floor: per precision, the noise floor of the primary statistic at stage 0 (dimensionless for
            nRMSE/W1).
        depth_growth: per precision, ``floor(p, s) = floor[p] * sqrt(1 + depth_growth[p] * s)``.
        min_voters: fewest voting families for an element-wise median consensus; below it the
            consensus is one named reference backend.
        propagation_band: ratios of consecutive anchors' statistics within ``[1/band, band]`` are
            "stable"; above "amplified", below "attenuated".
        origin_k, origin_floor_fraction: localization of a *flagged* backend (never whether it is
            flagged). From its first flagged anchor the origin is traced back along the data flow to
            the earliest anchor from which the backend *departs* from its peers without a break:
            ``stat > origin_k * median(peers' stat)`` and ``stat > origin_floor_fraction * floor``.
            ``origin_k = 4`` leaves about a factor 2 over the largest ratio clean fp32 backends reach
            (docs/oracle.md, 'Verdict', has the figure; at the parts of outputs far more where a part is
            nearly all 0, where the part range rule decides instead); the floor fraction keeps
            bit-identical peers (median 0) from making any nonzero difference a departure.
        sustained_anchors: a voting backend that departs from its peers (the rule above) at this many
            judged anchors in a row along the data flow (each the next anchor downstream of the
            previous) is flagged at each of them, even below the floor: one anchor at 4x its peers
            can be noise, a run of them is an error carried through the network. 0 turns it off.
            Measured: no clean fp32 backend departs at even one anchor in the reference evaluation
            (docs/evaluation.md).
        signal_lost: flag a backend of any precision at an anchor where its pooled cosine similarity with
            the consensus is <= 0 while the consensus is nonzero (and its peers are more than ``k`` times
            closer): the tensor carries none of the consensus' signal, e.g. all zeros (nRMSE exactly 1,
            cosine 0). Needed because int8's floor (2) lies above the nRMSE of a zero tensor: ort-int8
            zeroes the class probabilities of every YOLO in the zoo (the output Concat is quantized
            with one scale for boxes in pixels and probabilities), while clean cells keep a clearly
            positive cosine (the lowest clean values: docs/oracle.md, 'Verdict').
        split_outputs: judge each part of a concatenated output on its own as well (:mod:`anpred.judge.parts`):
            an output that packs quantities of different scales (YOLO's boxes in pixels and class
            probabilities in 0..1) hides a change confined to its small-valued part in the whole
            tensor's nRMSE. Parts get their output's stage, floor and peers, and are flagged only where
            their largest deviation also exceeds ``floor x`` their largest |consensus| (the part range
            rule, no parameter: docs/oracle.md).
        part_min_scale: scale guard of those parts: a part is judged on its own only when its largest
            |consensus| over the samples is at least this fraction of its output's (dimensionless).
            Parts below it are negligible next to the rest of the tensor and are judged only as part of
            it. Source and sensitivity (docs/oracle.md, 'Verdict'): the class probabilities of
            random-weight YOLOv8n on photographs lie below it, where ONNX Runtime's Sigmoid, accurate in
            absolute terms, is many times its peers in relative terms; saturated or trained class parts
            on ordinary inputs lie above it.
        population_k: per reduced precision, the outlier factor of the *implementation* verdict (a
            member of a precision population against the median of its peers' deviation from the
            population's consensus; docs/oracle.md), the same 10 as ``k``: above the largest fp16 ratio
            to the peers' median on clean zoo runs (``benchmarks/population_eval.py``); int8 ratios are
            unbounded (peers that agree bit-exactly), and there the implementation floor, the
            precision's own cost at the anchor, keeps clean runs unflagged (figures: docs/oracle.md,
            'Precision populations').
        reservoir: values kept per (anchor, backend) for the HTML histograms (uniform reservoir).
        threshold_atol, threshold_rtol: defaults of the threshold baseline (Polygraphy's 1e-5/1e-5).
        correlated_nrmse: two voting backends of different families whose aligned tensors differ by at
            most this nRMSE (``||x_i - x_j|| / ||x_j||``; 0 = bit-identical) at every anchor and sample
            where both are judged (and where some other voter differs from them) are correlated (shared
            kernels): they are merged into one vote (:mod:`anpred.judge.consensus`).
        correlated_rho: two voting families whose pooled error correlation at an anchor (against the
            float64 execution where it ran, else the three-cornered hat over the family votes within a
            camp, :mod:`anpred.judge.independence`) is at least this are merged into one vote there
            (partly shared kernels or conversion); 1 turns it off. Default and sensitivity:
            docs/oracle.md "Independence".
        ulp_quantile: the quantile over a tensor's elements of ``|x - c| / ulp(c)`` (the error relative
            to each element's magnitude, in ULPs) that the wrong-tail warning judges
            (``ErrorStats.ulp_q``, pooled as the largest over samples). 0.99: a tail of 1 % of the
            elements is seen; the largest value alone (``max_ulp``) is one element's cancellation.
        cost_factor: a reduced-precision member that loses at least this many times the median of
            what its population's other families lose against the fp32 consensus (and is not flagged)
            gets a warning with the factor and the likely cause (docs/oracle.md "A
            reduced-precision implementation that costs a multiple of its peers'").
        ulp_floor: a cell of an fp32 voter carries the wrong-tail warning (a graded finding, never a
            flag) only where its ``ulp_q`` exceeds ``k`` x its peers' median *and* this (ULPs).
            Measured: docs/oracle.md "Wrong tails" (largest clean value and sensitivity).
        conversion_units: family -> the family whose conversion of the ONNX graph it runs
            (:data:`CONVERSION_UNITS`): one unit with it in the count that decides a split between
            camps (docs/oracle.md "Consensus", its decision of a split).
    """

    primary: str = "nrmse"
    k: dict[str, float] = field(default_factory=lambda: {"fp32": 10.0, "fp16": 10.0, "bf16": 10.0, "int8": 10.0})
    floor: dict[str, float] = field(
        default_factory=lambda: {
            # 4 x the largest measured clean need S/sqrt(1+s) over the zoo (module docstring; the needs:
            # docs/oracle.md, 'Defaults, measured')
            "fp32": 2e-5,
            "fp16": 0.03,
            "bf16": 0.3,
            "int8": 2.0,
        }
    )
    depth_growth: dict[str, float] = field(default_factory=lambda: {p: 1.0 for p in PRECISIONS})
    min_voters: int = 3
    propagation_band: float = 2.0
    origin_k: float = 4.0
    origin_floor_fraction: float = 0.1
    sustained_anchors: int = 3
    signal_lost: bool = True
    split_outputs: bool = True
    part_min_scale: float = 1e-4
    population_k: dict[str, float] = field(default_factory=lambda: {"fp16": 10.0, "bf16": 10.0, "int8": 10.0})
    reservoir: int = 4096
    threshold_atol: float = 1e-5
    threshold_rtol: float = 1e-5
    correlated_nrmse: float = 0.0
    correlated_rho: float = 0.8
    ulp_quantile: float = 0.99
    ulp_floor: float = 1024.0
    cost_factor: float = 2.0
    families: dict[str, str] = field(default_factory=lambda: dict(FAMILIES))
    conversion_units: dict[str, str] = field(default_factory=lambda: dict(CONVERSION_UNITS))
    reduced_precision: dict[str, str] = field(default_factory=lambda: dict(REDUCED_PRECISION))
    reference_priority: list[str] = field(default_factory=lambda: list(REFERENCE_PRIORITY))

    def floor_at(self, precision: str, stage: int) -> float:
        """Noise floor for ``precision`` (fp32/fp16/bf16/int8) at ``stage`` (>= 0)."""
        p = precision if precision in self.floor else "fp32"
        return self.floor[p] * math.sqrt(1.0 + self.depth_growth.get(p, 1.0) * max(0, stage))

    def k_for(self, precision: str, population: bool = False) -> float:
        """The outlier factor for ``precision``: ``k``, or with ``population`` (an implementation
        verdict within a precision population) ``population_k`` (falling back to ``k``)."""
        if population and precision in self.population_k:
            return self.population_k[precision]
        return self.k.get(precision, self.k["fp32"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> "OracleConfig":
        """Check every value's type and range; returns ``self``.

        Raises:
            AnpredError: naming the key, the value given and what is expected (e.g.
                ``oracle config min_voters must be an integer >= 2, got 'abc'``).
        """
        if self.primary not in PRIMARY_STATISTICS:
            raise AnpredError(f"unknown primary statistic {self.primary!r}; known: {', '.join(PRIMARY_STATISTICS)}")
        for key, lo, strict in (
            ("k", 1.0, False),
            ("floor", 0.0, True),
            ("depth_growth", 0.0, False),
            ("population_k", 1.0, False),
        ):
            table = getattr(self, key)
            if not isinstance(table, dict):
                raise AnpredError(f"oracle config {key!r} must be a table/object of precision -> number, got {table!r}")
            for p, v in table.items():
                if p not in PRECISIONS:
                    raise AnpredError(f"oracle config {key}.{p}: unknown precision; known: {', '.join(PRECISIONS)}")
                _number(f"{key}.{p}", v, lo, strict)
            if "fp32" not in table and key != "population_k":
                raise AnpredError(f"oracle config {key} needs an fp32 entry (the fallback of other precisions)")
        _integer("min_voters", self.min_voters, 2)
        _number("propagation_band", self.propagation_band, 1.0, True)
        _number("origin_k", self.origin_k, 1.0, False)
        _number("origin_floor_fraction", self.origin_floor_fraction, 0.0, True)
        if self.origin_floor_fraction > 1:
            raise AnpredError(f"oracle config origin_floor_fraction must be <= 1, got {self.origin_floor_fraction!r}")
        for key in ("split_outputs", "signal_lost"):
            if not isinstance(getattr(self, key), bool):
                raise AnpredError(f"oracle config {key} must be true or false, got {getattr(self, key)!r}")
        _number("part_min_scale", self.part_min_scale, 0.0, False)
        if self.part_min_scale > 1:
            raise AnpredError(f"oracle config part_min_scale must be <= 1, got {self.part_min_scale!r}")
        _integer("reservoir", self.reservoir, 0)
        _integer("sustained_anchors", self.sustained_anchors, 0)
        if self.sustained_anchors == 1:
            raise AnpredError("oracle config sustained_anchors must be 0 (off) or >= 2, got 1")
        _number("threshold_atol", self.threshold_atol, 0.0, False)
        _number("threshold_rtol", self.threshold_rtol, 0.0, False)
        _number("correlated_nrmse", self.correlated_nrmse, 0.0, False)
        _number("correlated_rho", self.correlated_rho, 0.0, True)
        _number("ulp_quantile", self.ulp_quantile, 0.0, True)
        if self.ulp_quantile > 1:
            raise AnpredError(f"oracle config ulp_quantile must be in (0, 1], got {self.ulp_quantile!r}")
        _number("ulp_floor", self.ulp_floor, 0.0, False)
        _number("cost_factor", self.cost_factor, 1.0, True)
        if self.correlated_rho > 1:
            raise AnpredError(f"oracle config correlated_rho must be in (0, 1] (1 = off), got {self.correlated_rho!r}")
        for key in ("families", "reduced_precision", "conversion_units"):
            table = getattr(self, key)
            if not isinstance(table, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in table.items()
            ):
                raise AnpredError(f"oracle config {key!r} must map backend names to non-empty strings, got {table!r}")
        for b, p in self.reduced_precision.items():
            if p not in PRECISIONS:
                raise AnpredError(
                    f"oracle config reduced_precision.{b}: unknown precision {p!r}; known: {', '.join(PRECISIONS)}"
                )
        if not isinstance(self.reference_priority, list) or not all(
            isinstance(b, str) for b in self.reference_priority
        ):
            raise AnpredError(
                f"oracle config reference_priority must be a list of backend names, got {self.reference_priority!r}"
            )
        return self

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OracleConfig":
        """Defaults updated by ``d`` (dict-valued fields are merged key by key), then validated.

        Raises:
            AnpredError: unknown key (the message lists the known ones), a value of the wrong type or
            out of range (:meth:`validate`), an unknown precision.
        """
        cfg = cls()
        known = set(asdict(cfg))
        for key, val in d.items():
            if key not in known:
                raise AnpredError(f"unknown oracle config key {key!r}; known: {', '.join(sorted(known))}")
            cur = getattr(cfg, key)
            if isinstance(cur, dict):
                if not isinstance(val, dict):
                    raise AnpredError(f"oracle config {key!r} must be a table/object, got {val!r}")
                merged = dict(cur)
                merged.update(val)
                setattr(cfg, key, merged)
            elif isinstance(cur, list):
                if not isinstance(val, list):
                    raise AnpredError(f"oracle config {key!r} must be a list, got {val!r}")
                setattr(cfg, key, list(val))
            else:
                setattr(cfg, key, val)
        # ints given where floats are expected are fine (TOML ``k = 10``): normalise after the checks
        cfg.validate()
        for key in ("k", "floor", "depth_growth", "population_k"):
            setattr(cfg, key, {p: float(v) for p, v in getattr(cfg, key).items()})
        for key in (
            "propagation_band",
            "threshold_atol",
            "threshold_rtol",
            "correlated_nrmse",
            "correlated_rho",
            "origin_k",
            "origin_floor_fraction",
            "part_min_scale",
            "ulp_quantile",
            "ulp_floor",
            "cost_factor",
        ):
            setattr(cfg, key, float(getattr(cfg, key)))
        return cfg


def _number(key: str, v: Any, lo: float, strict: bool) -> None:
    """A finite real number (not a bool) ``> lo`` (strict) or ``>= lo``; else AnpredError."""
    ok = (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > lo if strict else v >= lo)
    )
    if not ok:
        raise AnpredError(f"oracle config {key} must be a finite number {'>' if strict else '>='} {lo:g}, got {v!r}")


def _integer(key: str, v: Any, lo: int) -> None:
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
        raise AnpredError(f"oracle config {key} must be an integer >= {lo}, got {v!r}")


def load_config(path: str | Path | None) -> OracleConfig:
    """The defaults, overridden by a TOML (``.toml``) or JSON file; its ``[oracle]`` table (or the whole
    file when there is none). ``None`` gives the defaults.

    Raises:
        AnpredError: unreadable or malformed file, unknown keys or values.
    """
    if path is None:
        return OracleConfig()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise AnpredError(f"cannot read config {p}: {err.strerror or err}") from err
    try:
        if p.suffix.lower() == ".toml":
            from anpred.compat import toml_reader

            data = toml_reader().loads(text)
        else:
            data = json.loads(text)
    except (ValueError, json.JSONDecodeError) as err:
        kind = "TOML" if p.suffix.lower() == ".toml" else "JSON"
        raise AnpredError(f"config {p} is not valid {kind}: {err}") from err
    if not isinstance(data, dict):
        raise AnpredError(f"config {p}: expected a table/object at the top")
    data = copy.deepcopy(data.get("oracle", data))
    if not isinstance(data, dict):
        raise AnpredError(f"config {p}: [oracle] must be a table/object, got {data!r}")
    return OracleConfig.from_dict(data)
