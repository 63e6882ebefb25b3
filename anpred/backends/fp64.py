"""``onnx-reference-fp64``: a float64 copy of the anchored model on ``onnx.reference.ReferenceEvaluator``.

The numerically faithful execution the oracle measures each anchor's expected error against: every
float32/float16/bfloat16 tensor of the model (weights, constants, graph input/output and value_info
types, floating dtype attributes) is widened to float64 by :func:`passes.float64.model_to_float64`
and the copy runs on the reference evaluator's numpy kernels, which compute in their inputs' dtype.
Operators the ONNX spec does not allow in double (e.g. ``QuantizeLinear`` before opset 19,
``DequantizeLinear`` outputs), operators without an ONNX schema and operators onnx.reference computes
in float32 only (``AffineGrid``) make ``prepare`` raise :class:`~anpred.errors.BackendError` naming
them; slots the spec types ``tensor(float)`` (``Resize`` ``scales``) keep float32 through a Cast.

The copy is cached with :mod:`anpred.cache` (``backend-onnx-reference-fp64/<key>``, key: the model
file's content, onnx and numpy versions, :data:`FORMAT`), with the conversion report beside it.

Inputs: floating samples (float16, float32, bfloat16) are cast to float64 on the way in (exact).
Anchors come back as float64 whatever the ONNX graph declares (float32, float16); each capture's
reason says so. :mod:`anpred.align` turns every tensor into float64 before comparing
(``anpred.align.rules.apply_rule``), so these need no cast rule; the run record's ``dtypes`` say
``float64``.

The known defects of the evaluator that ``onnx-reference`` works around
(:func:`anpred.backends.reference_defects.work_around`) are worked around in the float64 copy too
(``reference_workarounds`` in the versions; option ``workarounds=False`` runs the library as it is):
the basis must compute what the spec defines.
Family ``onnx-reference-fp64`` (its own; it does not vote: the oracle uses it as the float64 basis),
precision ``fp64``. Speed: the reference evaluator in float64 runs at about the speed of its float32
runs (numpy kernels; see tests/test_fp16_models.py for a measurement).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from anpred.backends.base import Backend
from anpred.backends.ort import NamedOutputsMixin
from anpred.backends.reference_defects import (
    failure_reason,
    inference_batchnorm_kernel,
    reference_defects,
    summarize,
    work_around,
)
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest

FORMAT = "anpred.fp64/1"


def to_float64_feed(x: np.ndarray) -> np.ndarray:
    """A sample array for the float64 copy: floating data (float16/32/64, ``ml_dtypes`` bfloat16, or
    bfloat16 stored as 2-byte void) as float64, anything else unchanged."""
    a = np.asarray(x)
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        import ml_dtypes

        a = a.view(ml_dtypes.bfloat16)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        return a.astype(np.float64)
    return a


class ReferenceFp64Backend(NamedOutputsMixin, Backend):
    """The reference evaluator on a float64 copy of the model (module docstring)."""

    name = "onnx-reference-fp64"
    family = "onnx-reference-fp64"
    precision = "fp64"
    coverage_basis = "onnx.reference.ops, as for onnx-reference (the float64 copy runs on the same evaluator)"

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        """The operators the reference evaluator cannot run
        (:meth:`anpred.backends.reference.ReferenceBackend.unsupported_ops`): the float64 copy runs on
        it, so none of those runs here either. What the copy itself refuses (an operator the spec does
        not allow in double) is known only when it is made (``prepare``)."""
        from anpred.backends.reference import ReferenceBackend

        return ReferenceBackend.unsupported_ops(model)

    def _versions_impl(self):
        import onnx

        v = {"onnx": onnx.__version__, "numpy": np.__version__}
        if getattr(self, "defects", None):
            v["reference_defects"] = summarize(self.defects)
        if getattr(self, "workarounds", None):
            v["reference_workarounds"] = summarize(self.workarounds)
        return v

    def versions(self):
        v = super().versions()
        rep = getattr(self, "report", None)
        if rep:
            v["fp64_conversion"] = (
                f"widened_tensors:{rep['widened_tensors']},widened_values:{rep['widened_values']},"
                f"dtype_attributes:{rep['dtype_attributes']},"
                f"float32_casts:{len(rep['casts_inserted'])}"
            )
        return v

    def _convert(self, model_path: Path, out: Path) -> None:
        from passes.float64 import model_to_float64
        from anpred.onnx_io import load_model, save_model

        copy, report = model_to_float64(load_model(model_path, load_external=True))
        save_model(copy, out / "model.onnx")
        (out / "report.json").write_text(json.dumps(report, indent=1))

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        from onnx.reference import ReferenceEvaluator

        from anpred.cache import cache_key, cached_dir
        from anpred.onnx_io import load_model

        import onnx

        key = cache_key(self.name, Path(model_path), {"onnx": onnx.__version__, "numpy": np.__version__}, FORMAT)
        try:
            d = cached_dir(f"backend-{self.name}", key, lambda tmp: self._convert(Path(model_path), tmp))
        except BackendError:
            raise
        except Exception as err:  # protobuf/numpy errors of a malformed model
            raise BackendError(
                f"{self.name}: float64 conversion failed ({type(err).__name__}: {str(err)[:500]})"
            ) from err
        self.converted_path = d / "model.onnx"
        self.report = json.loads((d / "report.json").read_text())
        model = load_model(self.converted_path, load_external=True)
        #: known defects of the evaluator worked around in the copy it runs (as ``onnx-reference``'s): the
        #: float64 basis must compute what the spec defines
        self.workarounds = work_around(model) if self.options.get("workarounds", True) else {}
        kernels = (
            [inference_batchnorm_kernel()]
            if any("_batchnorm_test_mode" in w for w in self.workarounds.values())
            else []
        )
        #: known defects of the installed evaluator this model still reaches (:mod:`anpred.backends.reference_defects`)
        self.defects = {k: v for k, v in reference_defects(model).items() if k not in self.workarounds}
        try:
            self.sess = ReferenceEvaluator(model, new_ops=kernels or None)
        except Exception as err:  # noqa: BLE001 - the evaluator raises many types for unknown ops
            raise BackendError(
                f"{self.name}: onnx-reference cannot load the float64 copy ({type(err).__name__}: {err})"
            ) from err
        self._bind_outputs(list(self.sess.output_names), manifest)
        for out, anchor in self._fetch.items():
            declared = manifest[anchor].dtype
            if declared and declared != "float64" and declared.startswith(("float", "bfloat")):
                self._info[
                    anchor
                ].reason = (
                    f"computed on a float64 copy of the model; returned as float64, the ONNX graph declares {declared}"
                )

    def _run_impl(self, inputs):
        try:
            outs = self.sess.run(self._names, {k: to_float64_feed(v) for k, v in inputs.items()})
        except Exception as err:
            if self.defects:
                raise BackendError(failure_reason(self.name, self.defects, err)) from err
            raise
        return {self._fetch[n]: np.asarray(v) for n, v in zip(self._names, outs)}
