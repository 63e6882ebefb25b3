"""The reference evaluation: ANPRED's consensus oracle vs threshold baselines on injected faults
(beside the benchmarks that use it: ``benchmarks/oracle_eval.py``, ``benchmarks/clean_holdout.py``,
``benchmarks/noise_floor.py``; they and the tests import it as ``evaluation`` with ``benchmarks/`` on
``sys.path``).

For one zoo model (issue 7 items 3-4, issue 10 items 3-4):

1. :func:`~.clean.prepare_model` instruments the model, writes the samples (real inputs: photos or rendered
   document pages; plus seeded uniform random inputs) and runs the clean backends (``ort``,
   ``openvino``, ``torch``, ``tf``, ``onnx-reference``) and the reduced-precision ones (``ort-fp16``,
   ``ort-int8``, ``openvino-bf16``) **once** with :func:`anpred.run.run_model` into ``clean/``.
2. :func:`~.clean.clean_summary` judges that run (:func:`anpred.judge.check_run`, consensus oracle), the
   threshold baseline at every tolerance, and the end-result detections of every backend against the
   detections of the clean consensus output.
3. :func:`~.configuration.run_configuration` injects one fault (:func:`passes.faults.inject_fault`) into the anchored
   model, builds a run folder whose clean backends' ``tensors/<label>`` are *symbolic links* to the clean
   run (nothing clean is recomputed), runs only the faulty variant with ONNX Runtime in this process as
   backend ``fault`` (its own family, so its vote cannot hide inside a clean family) and judges the
   folder with ``check_run``; the threshold baseline compares the faulty output with the reference's
   stored output; detections are decoded and matched (:mod:`models.detect`). ``kind=None`` is the
   null configuration (the clean model in the fault slot).
4. :func:`~.summary.summarize` turns the :class:`~.results.ConfigResult` list into rates.

Definitions (per model):

- detection: ANPRED flags ``fault`` (``BackendVerdict.flagged``); a baseline at tolerance ``t`` flags it
  when some output element has ``|x - r| > t`` and ``|x - r| / |r| > t`` against the reference
  ``r`` (:class:`anpred.judge.ThresholdCheck`, atol = rtol = t).
- false alarm: a clean fp32 backend flagged, on the all-clean configurations (the clean run and the
  null configuration) and among the clean backends of every faulty configuration. The baseline's
  verdicts on clean backends do not depend on the configuration (same reference, same tensors).
- localization: over detected faults, ``origin_stage == truth.stage`` (top-1) and ``|origin -
  truth| <= 1`` (within one stage).
- injected size: pooled nRMSE ``sqrt(sum ||f - o||^2 / sum ||o||^2)`` of the faulty backend ``f``
  against the clean ``ort`` tensors ``o`` (same kernels), at the injection stage's anchors (maximum)
  and at the outputs: the fault's true effect, independent of any oracle.
- detections: :func:`models.detect.decode` (conf 0.25, class-aware NMS IoU 0.45) of each output,
  matched one-to-one (IoU >= 0.5, same class) with the detections of the clean consensus output (the
  element-wise median of the clean fp32 backends' aligned outputs); ``changed`` = unmatched on either
  side, summed over samples.

Performance: the judge is single-threaded numpy; set ``OPENBLAS_NUM_THREADS=1`` before numpy is
imported on a loaded machine (``benchmarks/oracle_eval.py`` does): multi-threaded OpenBLAS dot products
on ~1e5-element vectors were measured 10-150x slower under contention.

Modules: :mod:`.grid` (defaults, checks, the configuration grid), :mod:`.results` (the typed results),
:mod:`.measures` (detections, nRMSE, critical tolerance), :mod:`.clean` (the clean run, prepared and
judged), :mod:`.configuration` (one fault configuration), :mod:`.summary` (rates, bars, results.json).
"""

from anpred.errors import AnpredError

from .clean import clean_summary, prepare_model
from .configuration import build_config_run, link_run, run_configuration, run_fault_backend
from .grid import (
    CLEAN_BACKENDS,
    DEFAULT_MAGNITUDES,
    EVAL_SCHEMA,
    FAULT_FAMILY,
    FAULT_LABEL,
    LOWP_BACKENDS,
    NATIVE_TORCH,
    TOLERANCES,
    EvaluationError,
    check_stages,
    configurations,
    default_backends,
    magnitude_problem,
    validate_magnitudes,
)
from .results import CleanSummary, ConfigResult, ModelSetup
from .summary import bars, save_results, summarize

# AnpredError: the base of EvaluationError, re-exported for callers that catch either
__all__ = [
    "CLEAN_BACKENDS",
    "LOWP_BACKENDS",
    "TOLERANCES",
    "FAULT_LABEL",
    "FAULT_FAMILY",
    "DEFAULT_MAGNITUDES",
    "EVAL_SCHEMA",
    "NATIVE_TORCH",
    "EvaluationError",
    "AnpredError",
    "magnitude_problem",
    "validate_magnitudes",
    "check_stages",
    "default_backends",
    "configurations",
    "ModelSetup",
    "CleanSummary",
    "ConfigResult",
    "prepare_model",
    "clean_summary",
    "build_config_run",
    "link_run",
    "run_fault_backend",
    "run_configuration",
    "summarize",
    "bars",
    "save_results",
]
