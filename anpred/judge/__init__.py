"""The judge step: a run folder's aligned tensors -> verdicts (``anpred check``, ``docs/oracle.md``).

Modules (each with its contract in its docstring):

- :mod:`anpred.judge.struct`: the result types (``BackendInfo``, ``AnchorInfo``, ``Cell``, ``Step``,
  ``BackendVerdict``, ``ThresholdResult``, ``OracleResult``, ``CheckReport``), apart from the algorithms;
- :mod:`anpred.judge.stats`: error statistics (``error_stats``, ``Reference``) and the JSON float encoding;
- :mod:`anpred.judge.accumulate`: per (anchor, backend) streaming accumulators;
- :mod:`anpred.judge.consensus`: the consensus population-deviation oracle (``Oracle``);
- :mod:`anpred.judge.verdict`: the flagging rules of a cell and a backend's verdict;
- :mod:`anpred.judge.localize`: origin tracing, sustained departures, propagation, the run's data flow;
- :mod:`anpred.judge.threshold`: the Polygraphy-style threshold baseline (``ThresholdCheck``);
- :mod:`anpred.judge.parts`: parts of concatenated outputs judged on their own;
- :mod:`anpred.judge.samples`: reading, aligning and judging a run's samples one at a time;
- :mod:`anpred.judge.check`: ``check_run`` = usable backends -> judge samples -> finish.
"""

from anpred.judge.accumulate import Accumulator, Reservoir
from anpred.judge.check import check_or_raise, check_run, finish, precision_notes, usable_backends
from anpred.judge.consensus import Oracle, median_of
from anpred.judge.localize import DataFlow, Localizer, anchor_descendants, run_dataflow
from anpred.judge.parts import MAX_PARTS, OutputPart, add_part_views, output_parts
from anpred.judge.samples import Judged, Judging, judge_samples, judged_anchors, read_tensors, tensor_file
from anpred.judge.stats import (
    DTYPE_ALIASES,
    Comparison,
    ErrorStats,
    Reference,
    canonical_dtype,
    error_stats,
    from_json_float,
    json_float,
    ulp,
    ulp_dtype,
)
from anpred.judge.struct import (
    ORACLES,
    SCHEMA,
    AnchorInfo,
    BackendInfo,
    BackendVerdict,
    Cell,
    CheckReport,
    OracleResult,
    Step,
    ThresholdResult,
)
from anpred.judge.threshold import ThresholdCheck
from anpred.judge.verdict import backend_verdict, gap_text, judge_cell

__all__ = [
    "DTYPE_ALIASES",
    "MAX_PARTS",
    "ORACLES",
    "SCHEMA",
    "Accumulator",
    "AnchorInfo",
    "BackendInfo",
    "BackendVerdict",
    "Cell",
    "CheckReport",
    "Comparison",
    "DataFlow",
    "ErrorStats",
    "Judged",
    "Judging",
    "Localizer",
    "Oracle",
    "OracleResult",
    "OutputPart",
    "Reference",
    "Reservoir",
    "Step",
    "ThresholdCheck",
    "ThresholdResult",
    "add_part_views",
    "anchor_descendants",
    "backend_verdict",
    "canonical_dtype",
    "check_or_raise",
    "check_run",
    "error_stats",
    "finish",
    "from_json_float",
    "gap_text",
    "judge_cell",
    "judge_samples",
    "judged_anchors",
    "json_float",
    "median_of",
    "output_parts",
    "precision_notes",
    "read_tensors",
    "run_dataflow",
    "tensor_file",
    "ulp",
    "ulp_dtype",
    "usable_backends",
]
