"""Map the anchors of an instrumented ONNX model back onto the native graph it was exported from.

Result per anchor and native backend: ``anchor.native[backend]``, an entry of
:mod:`exporters.mapping.report` (``exact`` / ``equivalent`` / ``unmapped``). The native side is
:mod:`exporters.mapping.torch_modules` (``torch-native``: module paths, forward hooks) or
:mod:`exporters.mapping.keras_layers` (``tf-native``: top-level layers); ``ort`` is the reference
column (an anchor is exact there when its value is in the ONNX graph); the converter backends' columns
come from :mod:`exporters.mapping.converters`.

Which module a value belongs to comes from the exporter (:func:`passes.exporter.detect_exporter`,
given the ``anpred.origin`` record the exporters store): dynamo exports carry
``pkg.torch.onnx.name_scopes`` on every node, TorchScript exports carry ``/a/b/Op`` node names, tf2onnx
node names read ``<model>[_k]/<layer>[_k]/<op>``. The ONNX graph is read through the one graph index
(:func:`passes.graph.build_index`, anchor Identities left out). All graph walks are iterative.
"""

from __future__ import annotations

from collections.abc import Mapping

from anpred.manifest import AnchorManifest
from exporters import read_origin
from exporters.mapping.converters import ConverterCheck, converter_entries
from exporters.mapping.keras_layers import map_keras
from exporters.mapping.report import MappingError, MappingReport, make_entry
from exporters.mapping.scopes import load_onnx, mapping_index
from exporters.mapping.torch_modules import map_torch
from passes.exporter import detect_exporter

__all__ = ["BACKEND_OF", "map_anchors"]

BACKEND_OF = {"torch": "torch-native", "tf": "tf-native"}


def map_anchors(
    manifest: AnchorManifest,
    native_model,
    framework: str,
    *,
    onnx_model=None,
    example_inputs: tuple | None = None,
    write: bool = True,
    converters: tuple[str, ...] = (),
    converter_checks: Mapping[str, ConverterCheck] | None = None,
) -> MappingReport:
    """Map every anchor of ``manifest`` onto ``native_model`` and (``write=True``) store the result in
    ``anchor.native[backend]`` (backend ``torch-native`` for ``framework="torch"``, ``tf-native``
    for ``"tf"``).

    Args:
        manifest: the anchor manifest of the instrumented model.
        native_model: the ``torch.nn.Module`` / ``keras.Model`` the ONNX model was exported from.
        framework: ``"torch"`` or ``"tf"``.
        onnx_model: the anchored (or original) ONNX model, ``ModelProto`` or path; default the path in
            ``manifest.model``. Only its graph is read.
        example_inputs: torch only: positional inputs to probe which modules return/take a single tensor
            (one forward pass); without them single tensors are assumed.

        converters: converter backends (``"torch"``, ``"tf"``) whose static columns
            (:func:`~exporters.mapping.converters.converter_entries`) are added to the report (not
            written to the manifest).
        converter_checks: per converter backend, the check of which nodes it cannot convert
            (``checks`` of :func:`~exporters.mapping.converters.converter_entries`).

    Returns:
        :class:`MappingReport` with the native backend's column, the ``ort`` reference column and the
        ``converters`` columns.

    Raises:
        MappingError: unknown framework, wrong native model type, no ONNX graph.
        GraphError: the ONNX graph is malformed (:func:`passes.graph.build_index`).
    """
    if framework not in BACKEND_OF:
        raise MappingError(f"unknown framework {framework!r}; known: {', '.join(BACKEND_OF)}")
    model = load_onnx(onnx_model, manifest)
    g = mapping_index(model)
    exporter = detect_exporter(model, g, origin=read_origin(model))
    backend = BACKEND_OF[framework]
    notes: list[str] = []
    if framework == "torch":
        if exporter not in ("torch.onnx.dynamo", "torch.onnx.torchscript"):
            raise MappingError(
                f"the ONNX model was not exported from PyTorch (exporter {exporter!r}); module scopes are unknown"
            )
        entries = map_torch(manifest, native_model, g, exporter, example_inputs, notes)
    else:
        if exporter != "tf2onnx":
            raise MappingError(
                f"the ONNX model was not exported by tf2onnx (exporter {exporter!r}); Keras layer names are unknown"
            )
        entries = map_keras(manifest, native_model, g)
    report = MappingReport(framework=framework, exporter=exporter, notes=notes)
    report.entries[backend] = entries
    all_values = set(g.producer) | set(g.graph_inputs)
    report.entries["ort"] = {
        a.name: (
            make_entry(a.value, "exact", "ONNX value")
            if a.value in all_values
            else make_entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph")
        )
        for a in manifest.anchors
    }
    if converters:
        report.entries.update(converter_entries(manifest, model, converters, checks=converter_checks))
    if write:
        for a in manifest.anchors:
            a.native[backend] = dict(entries[a.name])
    return report
