"""The mapping columns of the converter backends (the ONNX graph converted into the other libraries)
and of any prepared backend.

- :func:`converter_entries`: static, read off the ONNX graph (nothing is converted). ``torch``
  (onnx2torch) names every submodule after its ONNX node, ``tf`` (onnx2tf) returns every anchor as a
  graph output: *exact*. Whether onnx2torch converts every node is a fact of the torch converter
  backend, not of this module: the caller passes that check (``checks={"torch": fn}``, ``fn(model)
  -> [unconvertible node, ...]``; ``anpred map`` passes onnx2torch's).
- :func:`prepared_entries`: prepare a backend on the anchored model and read what it captures; the
  caller passes the backend registry's ``backend_class`` (this package sits below the backends).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from anpred.manifest import AnchorManifest
from exporters.mapping.report import MappingError, make_entry
from exporters.mapping.scopes import load_onnx, mapping_index

__all__ = ["CONVERTER_BACKENDS", "ConverterCheck", "converter_entries", "prepared_entries"]

CONVERTER_BACKENDS = ("torch", "tf")

#: ``check(model) -> ["Op-version (node name)", ...]``: the nodes a converter cannot convert (empty when
#: it converts all); may raise ImportError when the converter is not installed
ConverterCheck = Callable[[Any], list[str]]


def _torch_reason(model, check: ConverterCheck | None) -> str:
    """Why no anchor maps onto the onnx2torch model ("" when every node converts or no check is
    given)."""
    if check is None:
        return ""
    try:
        missing = check(model)
    except ImportError as err:
        return f"onnx2torch is not importable: {err}"
    if missing:
        return f"onnx2torch has no converter for {len(missing)} node(s): {'; '.join(missing[:5])}" + (
            " ..." if len(missing) > 5 else ""
        )
    return ""


def converter_entries(
    manifest: AnchorManifest,
    onnx_model,
    backends=CONVERTER_BACKENDS,
    *,
    checks: Mapping[str, ConverterCheck] | None = None,
) -> dict[str, dict[str, dict]]:
    """Static mapping for the converter backends, read off the ONNX graph (nothing is converted).

    - ``torch`` (onnx2torch): every submodule is named after its ONNX node and records its ONNX
      output value names, so an anchor is *exact* (fetched by its ONNX value name, ONNX layout) when
      onnx2torch has a converter for every node (``checks["torch"]``, e.g. ``anpred map``'s, after
      the compatibility converters of :mod:`anpred.backends.onnx2torch_compat`; without a check the
      coverage is not verified); otherwise every anchor is unmapped, the reason naming the
      unconvertible nodes.
    - ``tf`` (onnx2tf): every anchor is a graph output of the anchored model and comes back under
      its name: *exact*. onnx2tf decides the layout of each 3-D/4-D/5-D output (mostly channels-last)
      while converting, so the transform (``{"permute": [0, 3, 1, 2]}``) is known only when the backend
      is prepared (``anpred map --backends tf``, :func:`prepared_entries`); a layout change is exact.

    Returns ``{backend: {anchor name: entry}}``.
    """
    model = load_onnx(onnx_model, manifest)
    g = mapping_index(model)
    known = set(g.producer) | set(g.graph_inputs) | {t.name for t in model.graph.initializer}
    checks = checks or {}
    out: dict[str, dict[str, dict]] = {}
    for b in backends:
        if b == "torch":
            why = _torch_reason(model, checks.get("torch"))
            ents = {}
            for a in manifest.anchors:
                if why:
                    ents[a.name] = make_entry("", "unmapped", why)
                elif a.value in g.producer:
                    node = g.nodes[g.producer[a.value]]
                    ents[a.name] = make_entry(
                        node.name or a.value,
                        "exact",
                        f"output {a.value!r} of the onnx2torch submodule converted from "
                        f"ONNX node {node.name or node.op_type!r} ({node.op_type}), ONNX layout",
                    )
                elif a.value in known:
                    ents[a.name] = make_entry(a.value, "exact", "graph input or initializer of the converted graph")
                else:
                    ents[a.name] = make_entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph")
            out[b] = ents
        elif b == "tf":
            out[b] = {
                a.name: (
                    make_entry(
                        a.name if a.kind != "output" else a.value,
                        "exact",
                        "graph output of the onnx2tf model, fetched by name; "
                        "its layout (channels-last "
                        "for most 3-5-D tensors) is recorded when the backend is prepared "
                        "(anpred map --backends tf)",
                    )
                    if a.value in known
                    else make_entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph")
                )
                for a in manifest.anchors
            }
        else:
            raise MappingError(
                f"no static mapping for backend {b!r}; known: {', '.join(CONVERTER_BACKENDS)} "
                "(others: prepare them, anpred map --backends)"
            )
    return out


def prepared_entries(
    backend: str,
    model_path,
    manifest: AnchorManifest,
    options: dict | None = None,
    workdir=None,
    *,
    backend_class: Callable[[str], type],
) -> dict[str, dict[str, Any]]:
    """Prepare ``backend`` (any registry name: converters are converted, native models rebuilt) on the
    anchored model at ``model_path`` and turn its :meth:`~anpred.backends.base.Backend.anchor_info` into
    mapping entries (``missing`` -> ``unmapped`` with the backend's reason; a layout change keeps
    its ``transform``). ``backend_class``: the registry's lookup (``anpred.backends.backend_class``).

    Raises:
        MappingError: the backend cannot be prepared (the message carries the backend's reason).
    """
    import copy
    import tempfile

    from anpred.errors import BackendError

    man = copy.deepcopy(manifest)  # the backend may write its own mapping into it
    with tempfile.TemporaryDirectory(prefix="anpred-map-") as tmp:
        try:
            with backend_class(backend)(options) as be:
                be.prepare(model_path, man, Path(workdir) if workdir else Path(tmp))
                info = be.anchor_info()
        except BackendError as err:
            raise MappingError(f"backend {backend!r} cannot be prepared: {err}") from err
    out = {}
    for a in manifest.anchors:
        cap = info.get(a.name)
        if cap is None or cap.status == "missing":
            out[a.name] = make_entry(
                cap.target or "" if cap else "",
                "unmapped",
                cap.reason if cap and cap.reason else "not captured by the prepared backend",
            )
        else:
            out[a.name] = make_entry(
                cap.target or a.value, cap.status, cap.reason or "captured by the prepared backend", cap.transform
            )
    return out
