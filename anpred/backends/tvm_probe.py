"""TVM's Relax ONNX frontend asked node by node: the pre-run coverage below the operator name
(:mod:`anpred.backends.converter_probe`).

TVM's table (``onnx_frontend._get_convert_map``) says whether the frontend has a converter for an
operator; the converter itself states further limits on attributes, dtypes and inputs (``RoiAlign only
supports avg and max modes``, ``GroupNormalization-18 currently only supports float32 inputs``,
``Type ... for scale is currently unsupported`` for computed Resize scales, ``KeyError: 'num_heads'`` on
the standard ``Attention``, ``no value in Constant`` for a ``Constant`` holding ``value_float``).
:func:`tvm_probe` converts a one-node model of each node with ``from_onnx`` in this process (a few
milliseconds a node; answers cached by node content) and counts
as a refusal an error the frontend's Python code raises (:data:`REFUSING`, ``tvm.error.OpError``); an
error of TVM's C++ checks is not counted (it may depend on the rest of the graph: the run says it).
"""

from __future__ import annotations

import contextlib
import io
import threading
import warnings
from pathlib import Path

__all__ = ["REFUSING", "TVM_PROBE_BUDGET_S", "tvm_probe"]

#: seconds of probes per model in the pre-run coverage (answers cached by node content: a model seen
#: before costs none); a conversion takes a few milliseconds, so the budget binds only on huge graphs
TVM_PROBE_BUDGET_S = 30.0
#: the exceptions of the frontend's Python converters that are refusals of the node
REFUSING = (NotImplementedError, ValueError, KeyError, TypeError, AttributeError, IndexError, AssertionError)
_LOCK = threading.Lock()  # one conversion at a time: the frontend is not known to be thread-safe


def _tvm_convert(path: Path, scratch: Path) -> str:
    """``""`` when TVM's frontend converts the one-node model at ``path``, else its refusal
    (``"<error type>: <first line>"``)."""
    import onnx
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(str(path))
    with _LOCK, warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            from_onnx(model)
        except (tvm.error.OpError, *REFUSING) as err:
            first = str(err).strip().splitlines()[0][:240] if str(err).strip() else ""
            return f"the Relax ONNX frontend refuses it alone: {type(err).__name__}: {first}"
        except Exception:  # noqa: BLE001 - TVM's C++ checks: not a stated limit, left to the run
            return ""
    return ""


def tvm_probe():
    """The TVM :class:`~anpred.backends.converter_probe.NodeProbe` of the pre-run coverage."""
    import tvm

    from anpred.backends.converter_probe import NodeProbe

    return NodeProbe(
        "tvm", f"tvm {tvm.__version__} anpred.tvm_probe/1", _tvm_convert, TVM_PROBE_BUDGET_S, constants=True
    )
