"""``onnx-reference``: the ONNX reference implementation (``onnx.reference.ReferenceEvaluator``,
numpy kernels). It is *not* a gold reference (it has had precision bugs of its own) and votes in the
consensus like any other backend. Slow (numpy kernels; docs/run.md, 'The default set is
chosen by measured cost').

Population members (:mod:`anpred.backends.lowp_models`):

- ``onnx-reference-int8``: the shared QDQ int8 model. The evaluator's QuantizeLinear rounds half to
  even and saturates in numpy, DequantizeLinear computes ``(x - zero_point) * scale`` in float32, and
  Conv/MatMul compute in float32 on the dequantized values (fake quantization, no integer kernels).
- ``onnx-reference-fp16``: the shared float16 model, every kernel in numpy on float16 arrays (numpy's
  float16 arithmetic: each operation rounded to float16).

onnx 1.23's evaluator implements DequantizeLinear from opset 19 on only (``No implementation for
operator 'DequantizeLinear' ... version 17``); for models of an older opset (``quantize_static`` keeps
the model's, e.g. 17) the evaluator is given its newest DequantizeLinear kernel under the old version
(:func:`reference_kernels`): versions 10 and 13 define the same formula ``y = (x - x_zero_point) *
x_scale`` for the types they allow (ONNX operator docs), the newer versions only add types and
attributes whose defaults keep it. ``reference_kernels`` in the versions records when this applies.

Known defects of the installed evaluator that the model reaches (:mod:`anpred.backends.reference_defects`,
probed on the library at ``prepare``: onnx 1.23.2's ``GlobalMaxPool`` of a rank-3 or rank-5 input, its
``BatchNormalization`` of opsets 9-13 with a ``momentum`` attribute, its LSTM/GRU/RNN kernels that
ignore ``activations``, ``clip``, ``input_forget``) are worked around by exact rewrites of the model it
runs (option ``workarounds``, default True; listed in ``versions()`` as ``reference_workarounds`` and in
the report's notes), and operators it has no kernel for at the model's opset (``GlobalLpPool`` at 17)
are decomposed. What no rewrite takes stays: a run that then fails raises a
:class:`~anpred.errors.BackendError` naming the defect beside the library's error, and ``versions()``
lists it as ``reference_defects``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anpred.backends.base import Backend
from anpred.backends.lowp_models import PopulationMember
from anpred.backends.ort import NamedOutputsMixin
from anpred.backends.reference_defects import (
    evaluator_lacks,
    failure_reason,
    inference_batchnorm_kernel,
    reference_defects,
    summarize,
    work_around,
)
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest


def reference_kernels(model) -> list:
    """Kernel classes (``new_ops``) the evaluator needs for ``model`` beyond its own: the newest
    DequantizeLinear kernel when the model's default-domain opset is below 19 and it has
    DequantizeLinear nodes (module docstring); else ``[]``."""
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset >= 19 or not any(
        n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx") for n in model.graph.node
    ):
        return []
    from onnx.reference.ops import op_dequantize_linear as dq

    versions = sorted(int(k.rsplit("_", 1)[1]) for k in vars(dq) if k.startswith("DequantizeLinear_"))
    newest = getattr(dq, f"DequantizeLinear_{versions[-1]}")
    return [type("DequantizeLinear", (newest,), {"op_domain": ""})]


class ReferenceBackend(NamedOutputsMixin, Backend):
    name = "onnx-reference"
    family = "onnx-reference"
    precision = "fp32"
    coverage_basis = "onnx.reference.ops (load_op: op classes, or the schema's function body)"

    @classmethod
    def unsupported_ops(cls, model, rewrite: bool = True) -> dict[str, str]:
        """The default-domain operators of ``model`` (sub-graphs included) that ``onnx.reference`` can
        neither load a kernel class for nor expand from the schema's function body
        (``onnx.reference.ops.load_op`` at the model's opset; context-dependent functions count as
        supported), nor run after the exact decompositions the backend applies
        (:func:`anpred.backends.reference_defects.work_around`, ``GlobalLpPool``; ``rewrite=False``:
        the library's own answer). In other domains: the operators the evaluator has no kernel for
        (a custom domain; :func:`anpred.backends.reference_defects.evaluator_lacks`); model-local
        functions are evaluated from their bodies."""
        from anpred.onnx_io import iter_graphs
        from passes.frontend_rewrites import DECOMPOSITIONS

        nested = {n.op_type for g in list(iter_graphs(model.graph))[1:] for n in g.node}
        out = {}
        for key, why in evaluator_lacks(model).items():
            if (
                rewrite
                and key in DECOMPOSITIONS
                and key not in nested
                and any(n.op_type == key for n in model.graph.node)
            ):
                continue  # decomposed in the main graph before the evaluator loads it (the run says when not)
            out[key] = why
        return out

    def _versions_impl(self):
        import onnx

        v = {"onnx": onnx.__version__, "numpy": np.__version__}
        if getattr(self, "_kernels", None):
            v["reference_kernels"] = ",".join(f"{k.__name__}<-{k.__mro__[1].__name__}" for k in self._kernels)
        if getattr(self, "defects", None):
            v["reference_defects"] = summarize(self.defects)
        if getattr(self, "workarounds", None):
            v["reference_workarounds"] = summarize(self.workarounds)
        return v

    def _model_file(self, model_path: Path, manifest: AnchorManifest) -> Path:
        """The model file the evaluator runs (population members: their shared one)."""
        return model_path

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        from anpred.onnx_io import load_model
        from onnx.reference import ReferenceEvaluator

        model = load_model(self._model_file(model_path, manifest), load_external=True)
        #: ``{node name: what was rewritten and why}``: known defects of the evaluator worked around
        self.workarounds = work_around(model) if self.options.get("workarounds", True) else {}
        self._kernels = reference_kernels(model)
        if any("_batchnorm_test_mode" in why for why in self.workarounds.values()):
            self._kernels.append(inference_batchnorm_kernel())
        #: ``{node name: reason}``: known defects of the installed evaluator this model still reaches
        self.defects = {k: v for k, v in reference_defects(model).items() if k not in self.workarounds}
        try:
            self.sess = ReferenceEvaluator(model, new_ops=self._kernels or None)
        except Exception as err:  # noqa: BLE001 - the evaluator raises many types for unknown ops
            raise BackendError(f"onnx-reference cannot load the model ({type(err).__name__}: {err})") from err
        self._bind_outputs(list(self.sess.output_names), manifest)
        self._returned_types(model)

    def _returned_types(self, model) -> None:
        """Population members: note anchors whose graph output dtype differs from the manifest's."""

    def _run_impl(self, inputs):
        try:
            return super()._run_impl(inputs)
        except Exception as err:
            if getattr(self, "defects", None):
                raise BackendError(failure_reason(self.name, self.defects, err)) from err
            raise


class _ReferencePopulationMember(PopulationMember):
    def _model_file(self, model_path: Path, manifest: AnchorManifest) -> Path:
        return self.population_model(model_path, manifest)

    def _returned_types(self, model) -> None:
        from anpred.onnx_io import elem_type_name

        types = {o.name: elem_type_name(o.type.tensor_type.elem_type) for o in model.graph.output}
        self.note_casts(self._info, {a: types[o] for o, a in self._fetch.items() if o in types})


class ReferenceInt8Backend(_ReferencePopulationMember, ReferenceBackend):
    """The reference evaluator on the shared QDQ int8 model (float arithmetic on dequantized values)."""

    name = "onnx-reference-int8"
    precision = "int8"
    population = "int8"


class ReferenceFp16Backend(_ReferencePopulationMember, ReferenceBackend):
    """The reference evaluator on the shared float16 model (numpy float16 arithmetic)."""

    name = "onnx-reference-fp16"
    precision = "fp16"
    population = "fp16"
