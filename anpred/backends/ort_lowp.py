"""Reduced-precision ONNX Runtime backends (judged against the consensus, they do not vote).

- ``ort-fp16``: the anchored model converted to float16 with onnxconverter-common's
  ``float16.convert_float_to_float16(keep_io_types=True)`` (weights and activations float16, graph
  inputs and outputs kept float32 through Cast nodes at the boundary: the anchors, being graph outputs,
  are computed in float16 and returned as float32, their dtype in the manifest).
- ``ort-int8``: static QDQ quantization with ``onnxruntime.quantization.quantize_static`` (activations
  uint8, weights int8, per-tensor, MinMax calibration) calibrated on the run's own inputs (the runner
  passes their input files as ``options["calibration"]``). Anchors stay graph outputs
  (DequantizeLinear outputs, float32).

Reduced precision is real (converted graphs), never emulated with Cast pairs (some runtimes fold lossy
Cast pairs away). Converted models are cached with :mod:`anpred.cache` (key: model content, converter
version, options, calibration data). An anchor whose dtype differs from the manifest's after
conversion is cast back and the capture says so.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from anpred.backends.ort import OrtBackend
from anpred.errors import BackendError
from anpred.manifest import AnchorManifest
from anpred.onnx_io import elem_type_name


class _LowpBase(OrtBackend):
    def _convert(self, model_path: Path, out: Path) -> None:
        raise NotImplementedError

    def _cache_parts(self) -> list:
        return []

    def _model_for_session(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> str:
        from anpred.cache import cache_key, cached_dir

        key = cache_key(self.name, model_path, self._versions_impl(), self._cache_parts())
        try:
            d = cached_dir(f"backend-{self.name}", key, lambda tmp: self._convert(model_path, tmp / "model.onnx"))
        except BackendError:
            raise
        except Exception as err:  # converter errors come in many types
            raise BackendError(f"{self.name}: conversion failed ({type(err).__name__}: {str(err)[:500]})") from err
        self.converted_path = d / "model.onnx"
        return str(self.converted_path)

    def _read_back(self) -> tuple[str, dict[str, str]]:
        """``(precision, details)`` read from the converted model file (see subclasses)."""
        return self.precision, {}

    def effective_precision(self) -> str:
        return getattr(self, "_effective", self.precision)

    def versions(self):
        return {**super().versions(), **getattr(self, "_precision_details", {})}

    def _prepare_impl(self, model_path, manifest, workdir):
        super()._prepare_impl(model_path, manifest, workdir)
        self._effective, self._precision_details = self._read_back()
        want = {out: manifest[anchor].dtype for out, anchor in self._fetch.items()}
        self._cast = {}
        for o in self.sess.get_outputs():
            got = _ORT_TYPES.get(o.type)
            if o.name in self._fetch and got and want.get(o.name) and got != want[o.name]:
                self._cast[o.name] = want[o.name]
                cap = self._info[self._fetch[o.name]]
                cap.reason = f"returned as {got} by the converted model, cast to {want[o.name]}"

    def _run_impl(self, inputs):
        outs = self.sess.run(self._names, inputs)
        return {self._fetch[n]: (np.asarray(v).astype(self._cast[n]) if n in self._cast else np.asarray(v))
                for n, v in zip(self._names, outs)}


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
              "tensor(bool)": "bool"}


class OrtFp16Backend(_LowpBase):
    name = "ort-fp16"
    family = "onnxruntime"
    precision = "fp16"

    def _versions_impl(self):
        import onnxconverter_common

        return {**super()._versions_impl(), "onnxconverter-common": onnxconverter_common.__version__}

    def _cache_parts(self):
        return ["value_info stripped"]

    def _read_back(self):
        """``fp16`` when the converted model's floating weights of rank >= 2 are all float16, else
        ``fp32``. Weights are initializers and the ``value`` tensors of ``Constant`` nodes (PP-OCR
        keeps its weights in Constant nodes), in the main graph and in subgraphs (walked
        iteratively). Details: ``converted_weights`` = counts of float16/float32 weight tensors."""
        import onnx

        m = onnx.load(str(self.converted_path), load_external_data=False)
        floats = (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT)
        kinds = []
        graphs = [m.graph]
        while graphs:
            g = graphs.pop()
            tensors = list(g.initializer)
            for node in g.node:
                for a in node.attribute:
                    if node.op_type == "Constant" and a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        tensors.append(a.t)
                    if a.type == onnx.AttributeProto.GRAPH:
                        graphs.append(a.g)
                    elif a.type == onnx.AttributeProto.GRAPHS:
                        graphs.extend(a.graphs)
            kinds += [t.data_type for t in tensors if len(t.dims) >= 2 and t.data_type in floats]
        n16 = sum(k == onnx.TensorProto.FLOAT16 for k in kinds)
        prec = "fp16" if kinds and n16 == len(kinds) else "fp32"
        return prec, {"converted_weights": f"float16:{n16},float32:{len(kinds) - n16}"}

    def _convert(self, model_path: Path, out: Path) -> None:
        from onnxconverter_common import float16

        from anpred.onnx_io import load_model, save_model

        model = load_model(model_path, load_external=True)
        # Stale value_info makes the converter type the Cast it puts after a blocked op (Resize) float16
        # while its output is float32 (ORT refuses to load the model); ORT re-infers shapes anyway.
        del model.graph.value_info[:]
        m16 = float16.convert_float_to_float16(model, keep_io_types=True)
        save_model(m16, out)


class _CalibrationReader:
    """``CalibrationDataReader`` over the run's input files (``.safetensors`` or ``.npz``; one sample at
    a time)."""

    def __init__(self, files: list[str]):
        self._it = iter(files)

    def get_next(self):
        f = next(self._it, None)
        if f is None:
            return None
        from anpred.tensorfile import read_array_file

        return read_array_file(f)


class OrtInt8Backend(_LowpBase):
    name = "ort-int8"
    family = "onnxruntime"
    precision = "int8"
    needs_calibration = True

    def _calibration(self) -> list[str]:
        files = list(self.options.get("calibration") or [])
        if not files:
            raise BackendError("ort-int8 needs calibration inputs (options['calibration']: .safetensors/.npz files of graph inputs); "
                               "the runner passes the run's inputs")
        return files

    def _read_back(self):
        """``int8`` when the converted model holds QuantizeLinear/DequantizeLinear pairs with 8-bit
        zero points, else ``fp32``; details: QDQ node count and the quantized element types."""
        import onnx

        m = onnx.load(str(self.converted_path), load_external_data=False)
        q = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
        dq = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
        inits = {t.name: t for t in m.graph.initializer}
        types = sorted({elem_type_name(inits[n.input[2]].data_type)
                        for n in q + dq if len(n.input) > 2 and n.input[2] in inits})
        prec = "int8" if q and dq and set(types) & {"int8", "uint8"} else "fp32"
        from anpred.machine import kernel_isa, machine_info

        # the kernel family MLAS dispatches u8s8 convolutions/GEMMs to on this CPU (not asked for: it
        # follows from cpuid; without VNNI/AMX, int16 intermediates can saturate)
        return prec, {"qdq_nodes": f"QuantizeLinear:{len(q)},DequantizeLinear:{len(dq)}",
                      "quantized_types": ",".join(types),
                      "mlas_u8s8_kernel": kernel_isa(machine_info()["cpu_flags"])["int8_u8s8"]}

    def _cache_parts(self):
        h = hashlib.sha256()
        for f in self._calibration():
            h.update(Path(f).read_bytes())
        return [h.hexdigest(), int(self.options.get("max_calibration", 32))]

    def _convert(self, model_path: Path, out: Path) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        reader = type("Reader", (_CalibrationReader, CalibrationDataReader), {})(
            self._calibration()[: int(self.options.get("max_calibration", 32))])
        logging.getLogger().setLevel(logging.ERROR)  # the quantizer warns per bias on the root logger
        quantize_static(str(model_path), str(out), reader, quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=False)
