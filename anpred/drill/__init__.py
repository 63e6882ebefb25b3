"""The DRILL step: from the origin stage to the operator.

- :mod:`anpred.drill.graphs`: stage cuts, the side-by-side replay model, exposing a stage's inner
  tensors, one operator alone (:class:`onnx.utils.Extractor`, :func:`onnx.compose.add_prefix_graph`);
- :mod:`anpred.drill.feed`: a run's consensus tensors, sample by sample (what the replays are fed);
- :mod:`anpred.drill.drill`: :func:`drill_run` (isolated stage replay: local vs carried error per
  stage; the drill-down of each flagged backend);
- :mod:`anpred.drill.repro`: the search inside a stage and the standalone, verified repro.
"""

from anpred.drill.drill import DrillConfig, drill_run

__all__ = ["DrillConfig", "drill_run"]
