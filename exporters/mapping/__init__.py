"""Map the anchors of an instrumented ONNX model onto the native model it was exported from (the
MAP step) and onto the converter backends. See :mod:`exporters.mapping.mapper` for the walk and
:mod:`exporters.mapping.report` for the entries.

Layout: ``report`` (result types), ``scopes`` (the anchored ONNX graph's index and scope stacks),
``torch_modules`` (torch-native), ``keras_layers`` (tf-native), ``converters`` (converter and prepared
backends' columns), ``mapper`` (:func:`map_anchors`). The package imports only the shared core of
``anpred``, :mod:`passes` and :mod:`exporters`: what it needs from higher steps (a backend registry,
a converter's coverage check) the caller passes.
"""

from exporters.mapping.converters import CONVERTER_BACKENDS, ConverterCheck, converter_entries, prepared_entries
from exporters.mapping.keras_layers import map_keras
from exporters.mapping.mapper import BACKEND_OF, map_anchors
from exporters.mapping.report import STATUSES, MappingError, MappingReport, make_entry
from exporters.mapping.scopes import load_onnx, mapping_index
from exporters.mapping.torch_modules import map_torch, parse_torch_target, shape_matches

__all__ = [
    "MappingReport",
    "MappingError",
    "STATUSES",
    "make_entry",
    "map_anchors",
    "BACKEND_OF",
    "parse_torch_target",
    "shape_matches",
    "map_torch",
    "map_keras",
    "converter_entries",
    "prepared_entries",
    "ConverterCheck",
    "CONVERTER_BACKENDS",
    "load_onnx",
    "mapping_index",
]
