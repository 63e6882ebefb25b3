"""ONNX Runtime backends on the CPU execution provider: ``ort`` (default graph optimizations) and
``ort-noopt`` (``ORT_DISABLE_ALL``). Anchors are graph outputs of the anchored model (added by the
instrumentation pass), so they are fetched by output name; arrays come back in ONNX layout and in the
dtype the graph declares.

Options: ``threads`` (intra-op threads, default 0 = ONNX Runtime's choice).
"""

from __future__ import annotations

import os

from pathlib import Path

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest


def output_anchor_map(
    output_names: list[str], manifest: AnchorManifest
) -> tuple[dict[str, str], dict[str, AnchorCapture]]:
    """Map the model's output names to anchors: returns ``({output name: anchor name}, captures)``.

    The instrumentation pass exposes an inner anchor as ``Identity(value) -> <anchor name>`` (graph
    output named like the anchor); original outputs keep their value name. So an anchor is fetched
    from the output named ``anchor.name``, else from the output named ``anchor.value`` (hand-made or
    older anchored models); otherwise it is ``missing`` with the reason.
    """
    outs = set(output_names)
    fetch, info = {}, {}
    for a in manifest.anchors:
        src = a.name if a.name in outs else a.value if a.value in outs else None
        if src is not None:
            fetch[src] = a.name
            info[a.name] = AnchorCapture(status="exact", layout=a.layout, target=src)
        else:
            info[a.name] = AnchorCapture(
                status="missing",
                layout=a.layout,
                target=a.value,
                reason=f"neither {a.name!r} nor {a.value!r} is an output of the model this backend ran",
            )
    return fetch, info


class NamedOutputsMixin:
    """For backends whose session runs the anchored ONNX graph itself and returns graph outputs by
    name (ONNX Runtime, the reference evaluator): ``_bind_outputs`` maps the session's output names to
    anchors once (:func:`output_anchor_map`); ``_run_impl`` fetches exactly those outputs."""

    def _bind_outputs(self, output_names: list[str], manifest: AnchorManifest) -> None:
        self._fetch, self._info = output_anchor_map(list(output_names), manifest)
        self._names = list(self._fetch)

    def _run_impl(self, inputs):
        outs = self.sess.run(self._names, inputs)
        return {self._fetch[n]: np.asarray(v) for n, v in zip(self._names, outs)}

    def anchor_info(self):
        return dict(self._info)


class OrtBackend(NamedOutputsMixin, Backend):
    """ONNX Runtime, CPUExecutionProvider, ``ORT_ENABLE_ALL`` graph optimizations.

    Options: ``threads`` (``intra_op_num_threads``; 0: ONNX Runtime's default, one per physical core);
    ``spinning``: whether the thread pool spin-waits for work between operators
    (``session.intra_op.allow_spinning``/``inter_op``). Default: ONNX Runtime's (spin), except where
    the process shares its cores with a streamed run's judge (``ANPRED_THREAD_SPINNING=0``, set by
    :class:`anpred.run.driver.WorkerPool` with ``direct_io=False``): there a waiting thread sleeps, as
    ncnn's OpenMP block time 0, and the judge gets the core it would burn. Alone, spinning is the
    faster, so it stays the default elsewhere (docs/run.md, 'Measurements: ONNX Runtime spinning').
    """

    threads_option = True  # (the ``threads`` option)

    name = "ort"
    family = "onnxruntime"
    precision = "fp32"
    opt_level = "ORT_ENABLE_ALL"
    coverage_basis = "ONNX Runtime's registered operator schemas"

    @classmethod
    def unsupported_ops(cls, model) -> dict[str, str]:
        """Operators whose (domain, type) ONNX Runtime has no schema for
        (``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema``: ai.onnx, ai.onnx.ml,
        com.microsoft ...), or whose first schema version is newer than the model's opset of that
        domain. A schema without a CPU kernel for the model's types is not seen here."""
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        from anpred.onnx_io import model_ops

        since: dict[tuple[str, str], int] = {}
        for sch in C.get_all_operator_schema():
            k = (sch.domain, sch.name)
            since[k] = min(since.get(k, sch.since_version), sch.since_version)
        out = {}
        for key, (domain, op, version) in model_ops(model).items():
            first = since.get((domain, op))
            if first is None:
                out[key] = f"no ONNX Runtime schema for {op!r} in domain {domain or 'ai.onnx'!r}"
            elif version and first > version:
                out[key] = f"ONNX Runtime has {op!r} from opset {first}, the model imports opset {version}"
        return out

    def _versions_impl(self):
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__}

    def _session(self, model: "str | bytes"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.opt_level)
        so.intra_op_num_threads = int(self.options.get("threads", 0))
        spin = self.options.get("spinning", os.environ.get("ANPRED_THREAD_SPINNING", "1") != "0")
        if not spin:  # (class docstring)
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        so.log_severity_level = 3
        try:
            return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own Fail/NotImplemented/InvalidGraph types
            kind = type(err).__name__
            raise BackendError(f"{self.name}: onnxruntime cannot load the model ({kind}: {err})") from err

    def _model_for_session(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> "str | bytes":
        return str(model_path)

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        self.sess = self._session(self._model_for_session(model_path, manifest, workdir))
        self._bind_outputs([o.name for o in self.sess.get_outputs()], manifest)

    def close(self):
        self.sess = None


class OrtNoOptBackend(OrtBackend):
    """ONNX Runtime with all graph optimizations disabled (``ORT_DISABLE_ALL``): the kernels run the
    graph as written (no fusion, no constant folding)."""

    name = "ort-noopt"
    opt_level = "ORT_DISABLE_ALL"
