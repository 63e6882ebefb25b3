"""Conformance at scale: ONNX's backend-test cases through every backend, judged against the expected
outputs (the suite's tolerance) and by the consensus oracle; the oracle's score against that ground
truth (``anpred conformance``, docs/conformance.md).

Modules: :mod:`~anpred.conformance.cases` (the layout, the suite's tolerance), :mod:`~anpred.conformance.truth`
(ground truth), :mod:`~anpred.conformance.runner` (warm workers, the two judgments, one record per
case), :mod:`~anpred.conformance.score` (matrix and score), :mod:`~anpred.conformance.suite` (the
command's driver: batches on Ray, resume).
"""
