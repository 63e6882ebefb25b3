"""``onnx-reference``: the ONNX reference implementation (``onnx.reference.ReferenceEvaluator``,
numpy kernels). It is *not* a gold reference (it has had precision bugs of its own) and votes in the
consensus like any other backend. Slow: about 1 s per YOLOv8n sample at 320x320 on one core.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anpred.backends.base import Backend
from anpred.backends.ort import NamedOutputsMixin
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest


class ReferenceBackend(NamedOutputsMixin, Backend):
    name = "onnx-reference"
    family = "onnx-reference"
    precision = "fp32"

    def _versions_impl(self):
        import onnx

        return {"onnx": onnx.__version__, "numpy": np.__version__}

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        from anpred.onnx_io import load_model
        from onnx.reference import ReferenceEvaluator

        model = load_model(model_path, load_external=True)
        try:
            self.sess = ReferenceEvaluator(model)
        except Exception as err:  # noqa: BLE001 - the evaluator raises many types for unknown ops
            raise BackendError(f"onnx-reference cannot load the model ({type(err).__name__}: {err})") from err
        self._bind_outputs(list(self.sess.output_names), manifest)
