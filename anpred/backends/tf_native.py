"""``tf-native``: the original Keras model in TensorFlow, anchors captured as layer outputs.

The model is rebuilt in this process from the factory recorded at export
(``manifest.model["origin"]["factory"]``, returning ``(model, example_inputs)``) or from
``options["factory"]``/``options["factory_kwargs"]``. The anchors mapped by :mod:`exporters.mapping`
(``anchor.native["tf-native"]``, computed here when absent) become the outputs of one multi-output
``keras.Model(model.inputs, [layer.output, ...])`` that runs in inference mode (``training=False``).
Returned arrays are in Keras layout (NHWC for 4-D tensors: transform ``{"permute": [0, 3, 1, 2]}`` to
reach the ONNX NCHW value, reported by :meth:`anchor_info`). ONNX inputs are fed as they are when their
shape equals the Keras input's, or permuted from NCHW to NHWC when the export made them NCHW.

Options: ``factory``, ``factory_kwargs``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anpred.backends.base import AnchorCapture, Backend
from anpred.backends.torch_native import origin_factory
from anpred.errors import BackendError, InputError
from anpred.manifest import AnchorManifest
from anpred.tensorfile import c_contiguous

BACKEND = "tf-native"


class TfNativeBackend(Backend):
    """TensorFlow/Keras on the CPU, the model rebuilt from its factory; anchors as layer outputs."""

    name = "tf-native"
    family = "tensorflow"
    precision = "fp32"

    def _versions_impl(self):
        import keras
        import tensorflow as tf

        return {"tensorflow": tf.__version__, "keras": keras.__version__}

    def _prepare_impl(self, model_path: Path, manifest: AnchorManifest, workdir: Path) -> None:
        import keras

        from exporters import ExportError, load_factory
        from exporters.mapping import MappingError, map_anchors

        spec, kwargs = origin_factory(manifest, self.options, self.name, model_path)
        try:
            model, _example = load_factory(spec, kwargs)
        except ExportError as err:
            raise BackendError(f"{self.name}: {err}") from err
        if not isinstance(model, keras.Model):
            raise BackendError(f"{self.name}: factory {spec!r} returned {type(model).__name__}, not a keras.Model")
        if any(BACKEND not in a.native for a in manifest.anchors):
            try:
                map_anchors(manifest, model, "tf", onnx_model=model_path)
            except MappingError as err:
                raise BackendError(f"{self.name}: {err}") from err
        self._info: dict[str, AnchorCapture] = {}
        layers: list[str] = []
        self._order: list[tuple[str, int]] = []
        for a in manifest.anchors:
            e = a.native[BACKEND]
            cap = AnchorCapture(
                status=e["status"],
                layout="NHWC" if (e.get("transform") or {}).get("permute") else a.layout,
                transform=e.get("transform"),
                target=e.get("target") or None,
                reason=e.get("reason", ""),
            )
            if e["status"] == "unmapped":
                cap.status = "missing"
            else:
                try:
                    model.get_layer(e["target"])
                except ValueError:
                    cap.status, cap.reason = "missing", f"Keras layer {e['target']!r} does not exist in {model.name!r}"
                else:
                    if e["target"] not in layers:
                        layers.append(e["target"])
                    self._order.append((a.name, layers.index(e["target"])))
            self._info[a.name] = cap
        try:
            self.capture = keras.Model(
                model.inputs, [model.get_layer(n).output for n in layers], name=f"{model.name}_anchors"
            )
        except Exception as err:
            raise BackendError(
                f"{self.name}: cannot build a multi-output model over layers {layers[:5]}...: "
                f"{type(err).__name__}: {err}"
            ) from err
        self._model_inputs = [(getattr(i, "name", f"input_{k}"), tuple(i.shape)) for k, i in enumerate(model.inputs)]
        self._onnx_inputs = [i["name"] for i in manifest.model.get("inputs", [])]

    def _feed(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = self._onnx_inputs or list(inputs)
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"{self.name}: missing input(s) {', '.join(missing)}; model inputs: {', '.join(names)}")
        feed = []
        for n, (kname, kshape) in zip(names, self._model_inputs):
            x = np.asarray(inputs[n])
            fits = len(kshape) == x.ndim and all(k is None or k == s for k, s in zip(kshape, x.shape))
            if not fits and x.ndim == 4:
                xt = np.transpose(x, (0, 2, 3, 1))
                if all(k is None or k == s for k, s in zip(kshape, xt.shape)):
                    x = xt
                    fits = True
            if not fits:
                raise InputError(
                    f"{self.name}: input {n!r} has shape {x.shape}; Keras input {kname!r} expects {kshape}"
                )
            feed.append(c_contiguous(x))
        return feed

    def _run_impl(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = self._feed(inputs)
        outs = self.capture(feed, training=False)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        arrays = [np.asarray(o) for o in outs]
        return {name: arrays[i] for name, i in self._order}

    def anchor_info(self) -> dict[str, AnchorCapture]:
        return dict(self._info)

    def close(self) -> None:
        self.capture = None
