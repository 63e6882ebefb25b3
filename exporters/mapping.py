"""Map the anchors of an instrumented ONNX model back onto the native graph it was exported from.

Result per anchor and native backend (``anchor.native[backend]``, docs/DESIGN.md)::

    {"target": str, "status": "exact" | "equivalent" | "unmapped", "transform": dict | None,
     "reason": str}

``exact``: the anchor's ONNX value *is* a tensor the native program computes at a point it exposes
(a module's/layer's forward output or input), possibly in another memory layout (``transform``, e.g.
``{"permute": [0, 3, 1, 2]}`` from a Keras NHWC tensor to the ONNX NCHW value).
``equivalent``: the ONNX value equals a native tensor only mathematically because the exporter merged
operators under another name (TorchScript folds BatchNorm into the Conv and names the result after
the Conv: the value is the BatchNorm module's output). ``unmapped``: no native tensor can be observed
(a value internal to a module's forward, a nested model's layer); ``reason`` names the module/layer.

PyTorch targets (backend ``torch-native``, captured with forward hooks, see docs/native-mapping.md):
``model.4`` (forward output of ``model.4``, one tensor), ``model.2.m.0:input`` (the single tensor
passed to ``model.2.m.0``), ``:output[k]`` (the k-th tensor leaf of the root module's output, in
``torch.utils._pytree`` order, which is the ONNX graph-output order). ``@n`` after a path selects the
n-th call (0-based) of a module called more than once.

Keras targets (backend ``tf-native``): a top-level layer name; its output is captured by a
multi-output ``keras.Model``.

Which module a value belongs to comes from the exporter: dynamo exports carry
``pkg.torch.onnx.name_scopes`` on every node, TorchScript exports carry ``/a/b/Op`` node names, tf2onnx
node names read ``<model>[_k]/<layer>[_k]/<op>``. A value *leaves* module M when a consumer (or the
graph output) lies outside M; it is then M's forward output. All graph walks are iterative.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError
from anpred.manifest import AnchorManifest

BACKEND_OF = {"torch": "torch-native", "tf": "tf-native"}
STATUSES = ("exact", "equivalent", "unmapped")
SCOPE_KEY = "pkg.torch.onnx.name_scopes"
CLASS_KEY = "pkg.torch.onnx.class_hierarchy"


class MappingError(AnpredError):
    """The mapping cannot be computed at all (unknown framework, no ONNX graph, not a native model)."""


@dataclass
class MappingReport:
    """Per backend, the mapping entry of every anchor (``entries[backend][anchor] = native dict``).

    ``ort`` is included as the reference column: an anchor is exact there when its value is a graph
    output of the anchored model."""

    framework: str
    exporter: str
    entries: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def counts(self, backend: str) -> dict[str, int]:
        c = {s: 0 for s in STATUSES}
        for e in self.entries.get(backend, {}).values():
            c[e["status"]] += 1
        return c

    def exact_fraction(self, backend: str) -> float:
        n = len(self.entries.get(backend, {}))
        return self.counts(backend)["exact"] / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = {b: {**self.counts(b), "exact_fraction": self.exact_fraction(b)} for b in self.entries}
        return d

    def format_text(self, verbose: bool = True) -> str:
        lines = [f"anchor mapping ({self.framework}, exporter {self.exporter or 'unknown'})"]
        for b, ents in self.entries.items():
            c = self.counts(b)
            lines.append(f"{b}: {c['exact']} exact, {c['equivalent']} equivalent, {c['unmapped']} unmapped "
                         f"of {len(ents)} ({100 * self.exact_fraction(b):.1f}% exact)")
            if verbose:
                for name, e in ents.items():
                    if e["status"] != "exact" or e.get("transform"):
                        t = f" transform={json.dumps(e['transform'])}" if e.get("transform") else ""
                        lines.append(f"  {e['status']:<10} {name} -> {e['target'] or '-'}{t}: {e['reason']}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# ONNX graph helpers
# ---------------------------------------------------------------------------------------------------
def _load_onnx(onnx_model, manifest: AnchorManifest):
    from anpred.onnx_io import load_model

    if onnx_model is None:
        src = manifest.model.get("path") or manifest.model.get("anchored") or manifest.model.get("source")
        if not src:
            raise MappingError("map_anchors needs the anchored ONNX model (onnx_model=) to read the exporter's scopes")
        onnx_model = src
    if isinstance(onnx_model, (str, Path)):
        return load_model(onnx_model)
    return onnx_model


class _Graph:
    """Producer/consumer index of an ONNX graph (top-level graph only)."""

    def __init__(self, model):
        from passes.partition import _is_anchor_node

        g = model.graph
        # the instrumentation's Identity nodes (anchor -> graph output) are not part of the model
        self.nodes = [n for n in g.node if not _is_anchor_node(n)]
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for o in n.output:
                if o:
                    self.producer[o] = i
            for v in n.input:
                if v:
                    self.consumers.setdefault(v, []).append(i)
        self.outputs = [o.name for o in g.output if o.name in self.producer or o.name in {i.name for i in g.input}]
        inits = {t.name for t in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in inits]


def detect_exporter(model) -> str:
    """``torch.onnx.dynamo`` | ``torch.onnx.torchscript`` | ``tf2onnx`` | ``unknown``, from the graph."""
    for p in model.metadata_props:
        if p.key == "anpred.origin":
            try:
                return json.loads(p.value).get("exporter", "unknown")
            except json.JSONDecodeError:
                pass
    if any(p.key == SCOPE_KEY for n in model.graph.node for p in n.metadata_props):
        return "torch.onnx.dynamo"
    if model.producer_name == "tf2onnx":
        return "tf2onnx"
    if model.producer_name == "pytorch":
        return "torch.onnx.torchscript"
    return "unknown"


def _parse_list(text: str) -> list[str]:
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        try:
            v = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else []


def _fill_unscoped(g: _Graph, stacks: list[list[str] | None]) -> list[list[str]]:
    """Nodes the exporter's optimizer created carry no scope: give them the longest common prefix of
    their scoped neighbours' stacks (iterative sweeps; root when nothing is known)."""
    for _ in range(4):
        changed = False
        for i, n in enumerate(g.nodes):
            if stacks[i] is not None:
                continue
            neigh = [stacks[g.producer[v]] for v in n.input if v in g.producer and stacks[g.producer[v]] is not None]
            for o in n.output:
                neigh += [stacks[c] for c in g.consumers.get(o, []) if stacks[c] is not None]
            if neigh:
                stacks[i] = _common_prefix(neigh)
                changed = True
        if not changed:
            break
    return [s if s is not None else [] for s in stacks]


def _common_prefix(stacks: list[list[str]]) -> list[str]:
    out: list[str] = []
    for parts in zip(*stacks):
        if all(p == parts[0] for p in parts):
            out.append(parts[0])
        else:
            break
    return out


def _prefix_len(a: list[str], b: list[str]) -> int:
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k


# ---------------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------------
_CALL = re.compile(r"^(.*?)(?:@(\d+))?$")


def parse_torch_target(target: str) -> tuple[str, int, str, int | None]:
    """``"model.4@1:input"`` -> ``("model.4", 1, "input", None)``; ``":output[3]"`` -> ``("", 0,
    "output", 3)``; ``"model.4"`` -> ``("model.4", 0, "output", None)``."""
    path, _, which = target.partition(":")
    leaf = None
    m = re.fullmatch(r"(input|output)(?:\[(\d+)\])?", which or "output")
    if not m:
        raise MappingError(f"malformed torch target {target!r}")
    which = m.group(1)
    if m.group(2) is not None:
        leaf = int(m.group(2))
    pm = _CALL.fullmatch(path)
    return pm.group(1), int(pm.group(2) or 0), which, leaf


def _torch_stacks(g: _Graph, exporter: str, modules: dict[str, Any]) -> list[list[str]]:
    stacks: list[list[str] | None] = []
    for n in g.nodes:
        if exporter == "torch.onnx.dynamo":
            md = {p.key: p.value for p in n.metadata_props}
            if SCOPE_KEY in md:
                scopes = _parse_list(md[SCOPE_KEY])
                # entries: '' (root), module paths..., and last the FX op name
                stacks.append([s for s in scopes[1:-1] if s])
            else:
                stacks.append(None)
        else:  # TorchScript: /model.2/cv1/conv/Conv
            parts = [p for p in n.name.split("/") if p]
            if n.name.startswith("/") and len(parts) >= 1:
                stacks.append(_resolve_torchscript_scope(parts[:-1], modules))
            else:
                stacks.append(None)
    return _fill_unscoped(g, stacks)


def _resolve_torchscript_scope(segments: list[str], modules: dict[str, Any]) -> list[str]:
    """TorchScript scope segments -> module paths. A segment is a child name relative to one of the
    enclosing modules (``/model.22/cv2.0/cv2.0.0/conv``: ``cv2.0.0`` is relative to ``model.22``), and
    the k-th repeated call of a module gets ``_k`` (``/model.9/m_1``): returned as ``model.9.m@1``."""
    chain: list[str] = []
    for seg in segments:
        found = None
        for base in [c.split("@")[0] for c in reversed(chain)] + [""]:
            cand = f"{base}.{seg}" if base else seg
            if cand in modules:
                found = cand
                break
            m = re.fullmatch(r"(.*)_(\d+)", seg)
            if m:
                cand = f"{base}.{m.group(1)}" if base else m.group(1)
                if cand in modules:
                    found = f"{cand}@{m.group(2)}"
                    break
        if found is None:  # keep the exporter's name; mapping reports it as unknown
            found = f"{chain[-1].split('@')[0]}.{seg}" if chain else seg
        chain.append(found)
    return chain


def _probe_torch(module, example_inputs) -> tuple[dict[str, list[bool]], dict[str, list[bool]], int | None]:
    """Run ``module`` once with hooks; per module path and call: does it return one tensor / take one
    tensor input. Also the number of tensor leaves of the root output."""
    import torch
    from torch.utils._pytree import tree_leaves

    out_single: dict[str, list[bool]] = {}
    in_single: dict[str, list[bool]] = {}
    handles = []
    for name, sub in module.named_modules():
        if not name:
            continue

        def pre(mod, args, kwargs, _n=name):
            leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            in_single.setdefault(_n, []).append(len(leaves) == 1)

        def post(mod, args, kwargs, output, _n=name):
            out_single.setdefault(_n, []).append(isinstance(output, torch.Tensor))

        handles.append(sub.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(sub.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            out = module(*example_inputs)
    finally:
        for h in handles:
            h.remove()
    nleaves = len([x for x in tree_leaves(out) if isinstance(x, torch.Tensor)])
    return out_single, in_single, nleaves


def _map_torch(manifest, module, g: _Graph, exporter: str, example_inputs) -> dict[str, dict[str, Any]]:
    import torch

    if not isinstance(module, torch.nn.Module):
        raise MappingError(f"framework 'torch' needs a torch.nn.Module, got {type(module).__name__}")
    modules = dict(module.named_modules())
    stacks = _torch_stacks(g, exporter, modules)
    scoped = {m for s in stacks for m in s}
    probe = _probe_torch(module, example_inputs) if example_inputs is not None else None
    out_single, in_single, nleaves = probe if probe else ({}, {}, None)
    orig_outputs = [o["name"] for o in manifest.model.get("outputs", [])] or None

    def split_call(path: str) -> tuple[str, int]:
        m = _CALL.fullmatch(path)
        return m.group(1), int(m.group(2) or 0)

    def single(table: dict[str, list[bool]], path: str) -> bool | None:
        base, call = split_call(path)
        calls = table.get(base)
        if probe is None:
            return None  # unknown: assume a single tensor, verified when the backend prepares
        return bool(calls) and call < len(calls) and calls[call]

    def folded_bn(conv_path: str) -> str | None:
        """A BatchNorm registered right after ``conv_path`` in its parent that no ONNX node carries."""
        base, _ = split_call(conv_path)
        parent, _, leaf = base.rpartition(".")
        pmod = modules.get(parent) if parent else module
        if pmod is None:
            return None
        names = [n for n, _ in pmod.named_children()]
        if leaf not in names:
            return None
        i = names.index(leaf)
        for nxt in names[i + 1:i + 2]:
            cand = f"{parent}.{nxt}" if parent else nxt
            if isinstance(modules.get(cand), torch.nn.modules.batchnorm._BatchNorm) and cand not in scoped:
                return cand
        return None

    origs = set(orig_outputs or [b.value for b in manifest.anchors if b.kind == "output"])
    leaving_cache: dict[str, list[str]] = {}

    def leaving_values(base: str) -> list[str]:
        """Values leaving module ``base`` (one per call), in topological order of their producers."""
        if base not in leaving_cache:
            vals = []
            for i, n in enumerate(g.nodes):
                if base not in stacks[i]:
                    continue
                for o in n.output:
                    if o and (o in origs or any(base not in stacks[c] for c in g.consumers.get(o, []))):
                        vals.append(o)
            leaving_cache[base] = vals
        return leaving_cache[base]

    out: dict[str, dict[str, Any]] = {}
    for a in manifest.anchors:
        v = a.value
        if v not in g.producer:
            out[a.name] = _entry("", "unmapped", f"value {v!r} has no producer node in the ONNX graph "
                                 "(a graph input or a constant): nothing to capture natively")
            continue
        pi = g.producer[v]
        node = g.nodes[pi]
        S = stacks[pi]
        cons = [stacks[c] for c in g.consumers.get(v, [])]
        is_output = (v in orig_outputs) if orig_outputs else a.kind == "output"
        if is_output:
            cons.append([])
        # instrumentation-only outputs do not count as consumers
        j = min((_prefix_len(S, c) for c in cons), default=len(S))
        entry = None
        for path in S[j:]:  # modules the value leaves, outermost first
            base, _ = split_call(path)
            if base not in modules:
                entry = _entry(path, "unmapped", f"module {base!r} named by the exporter does not exist in "
                               f"{type(module).__name__}")
                continue
            s = single(out_single, path)
            if s is False:
                continue
            mod = modules[base]
            if node.op_type == "Conv" and isinstance(mod, torch.nn.modules.conv._ConvNd):
                bn = folded_bn(path)
                if bn is not None:
                    entry = _entry(bn, "equivalent",
                                   f"BatchNorm {bn!r} was folded into Conv {base!r} by the exporter; the ONNX "
                                   f"value {v!r} equals the output of {bn!r}")
                    break
            calls = len(out_single.get(base, [])) if probe is not None else 1
            if calls > 1 and "@" not in path and exporter == "torch.onnx.dynamo":
                leaving = leaving_values(base)
                if len(leaving) != calls or v not in leaving:
                    entry = _entry(path, "unmapped", f"module {base!r} is called {calls} times and the ONNX graph "
                                   f"shows {len(leaving)} outputs of it: cannot tell which call produced {v!r}")
                    continue
                path = f"{base}@{leaving.index(v)}"
            entry = _entry(path, "exact", f"forward output of {path} ({type(mod).__name__})")
            break
        if entry is not None and entry["status"] != "unmapped":
            out[a.name] = entry
            continue
        # the input of a module the value enters
        for c_idx in g.consumers.get(v, []):
            Sc = stacks[c_idx]
            k = _prefix_len(S, Sc)
            for path in Sc[k:]:
                base, _ = split_call(path)
                if base in modules and single(in_single, path) is not False:
                    entry = _entry(f"{path}:input", "exact",
                                   f"the single tensor input of {base} ({type(modules[base]).__name__})")
                    break
            if entry is not None and entry["status"] == "exact":
                break
        if entry is not None and entry["status"] == "exact":
            out[a.name] = entry
            continue
        if is_output:
            order = orig_outputs or [b.value for b in manifest.anchors if b.kind == "output"]
            k = order.index(v)
            if nleaves is not None and orig_outputs is not None and nleaves != len(orig_outputs):
                out[a.name] = _entry(f":output[{k}]", "unmapped",
                                     f"{type(module).__name__} returns {nleaves} tensors but the ONNX graph has "
                                     f"{len(orig_outputs)} outputs: cannot pair output {v!r}")
            else:
                out[a.name] = _entry(f":output[{k}]", "exact", f"tensor {k} of {type(module).__name__}'s output")
            continue
        where = S[-1] if S else "the root module"
        out[a.name] = entry if entry is not None else _entry(
            "", "unmapped", f"value {v!r} ({node.op_type}) is internal to the forward of module {where!r}: "
            "neither a module output nor a module input, so no forward hook can observe it")
    return out


# ---------------------------------------------------------------------------------------------------
# Keras
# ---------------------------------------------------------------------------------------------------
def _keras_layer_resolver(model, g: _Graph):
    names = {l.name for l in model.layers}
    first = {n.name.split("/")[0] for n in g.nodes if "/" in n.name}
    suffix = ""
    for f in first:
        m = re.fullmatch(re.escape(model.name) + r"(_\d+)?", f)
        if m:
            suffix = m.group(1) or ""
            break

    def resolve(node_name: str) -> str | None:
        parts = node_name.split("/")
        if len(parts) < 3:
            return None
        seg = parts[1]
        if suffix and seg.endswith(suffix) and seg[: -len(suffix)] in names:
            return seg[: -len(suffix)]
        if seg in names:
            return seg
        m = re.fullmatch(r"(.*)_\d+", seg)
        if m and m.group(1) in names:
            return m.group(1)
        return None

    return resolve


def _map_keras(manifest, model, g: _Graph) -> dict[str, dict[str, Any]]:
    try:
        import keras
    except ImportError as err:  # pragma: no cover
        raise MappingError("framework 'tf' needs keras") from err
    if not isinstance(model, keras.Model):
        raise MappingError(f"framework 'tf' needs a keras.Model, got {type(model).__name__}")
    resolve = _keras_layer_resolver(model, g)
    layers = [resolve(n.name) for n in g.nodes]
    orig_outputs = [o["name"] for o in manifest.model.get("outputs", [])] or None
    out: dict[str, dict[str, Any]] = {}
    for a in manifest.anchors:
        v = a.value
        if v not in g.producer:
            out[a.name] = _entry("", "unmapped", f"value {v!r} has no producer node (graph input or constant)")
            continue
        pi = g.producer[v]
        node = g.nodes[pi]
        L = layers[pi]
        if node.op_type == "Transpose" and node.input[0] in g.inputs:
            inp = node.input[0]
            perm = next((list(at.ints) for at in node.attribute if at.name == "perm"), None)
            in_layers = {l.name for l in model.layers if type(l).__name__ == "InputLayer"}
            tgt = inp if inp in in_layers else inp.split(":")[0]
            if tgt in in_layers and perm:
                out[a.name] = _entry(tgt, "exact", f"the model input {tgt!r} (Keras layout), transposed by tf2onnx "
                                     f"with perm {perm}", {"permute": perm})
            else:
                out[a.name] = _entry("", "unmapped", f"value {v!r} transposes graph input {inp!r}, which is no Keras "
                                     f"InputLayer of {model.name!r}")
            continue
        if L is None:
            seg = node.name.split("/")
            hint = f"layer path {'/'.join(seg[1:-1])!r} is not a top-level layer of {model.name!r} (nested model?)" \
                if len(seg) > 3 else f"node {node.name!r} carries no Keras layer name"
            out[a.name] = _entry("", "unmapped", f"value {v!r} ({node.op_type}): {hint}")
            continue
        leaves = (v in orig_outputs) if orig_outputs else a.kind == "output"
        leaves = leaves or any(layers[c] != L for c in g.consumers.get(v, []))
        if not leaves:
            out[a.name] = _entry("", "unmapped", f"value {v!r} ({node.op_type}) is internal to Keras layer {L!r} "
                                 "(not its output): a layer exposes only its output")
            continue
        layer = model.get_layer(L)
        try:
            nshape = list(layer.output.shape)
        except (AttributeError, ValueError):
            out[a.name] = _entry(L, "unmapped", f"Keras layer {L!r} has no single symbolic output")
            continue
        ashape = list(a.shape or [])
        transform = None
        fmt = getattr(layer, "data_format", None) or keras.config.image_data_format()
        if len(nshape) == 4 and len(ashape) == 4 and fmt == "channels_last":
            transform = {"permute": [0, 3, 1, 2]}
            cmp = [nshape[i] for i in (0, 3, 1, 2)]
        else:
            cmp = nshape
        ok = len(cmp) == len(ashape) and all(
            x is None or y is None or isinstance(y, str) or int(x) == int(y) for x, y in zip(cmp, ashape))
        if not ok:
            out[a.name] = _entry(L, "unmapped", f"Keras layer {L!r} output shape {nshape} does not match the ONNX "
                                 f"value {v!r} shape {ashape}")
            continue
        why = f"output of Keras layer {L!r} ({type(layer).__name__})"
        if transform:
            why += ", NHWC in Keras"
        out[a.name] = _entry(L, "exact", why, transform)
    return out


# ---------------------------------------------------------------------------------------------------
def _entry(target: str, status: str, reason: str, transform: dict | None = None) -> dict[str, Any]:
    return {"target": target, "status": status, "transform": transform, "reason": reason}


def map_anchors(manifest: AnchorManifest, native_model, framework: str, *, onnx_model=None,
                example_inputs: tuple | None = None, write: bool = True) -> "MappingReport":
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

    Returns:
        :class:`MappingReport` with the native backend's column and the ``ort`` reference column.

    Raises:
        MappingError: unknown framework, wrong native model type, no ONNX graph.
    """
    if framework not in BACKEND_OF:
        raise MappingError(f"unknown framework {framework!r}; known: {', '.join(BACKEND_OF)}")
    model = _load_onnx(onnx_model, manifest)
    g = _Graph(model)
    exporter = detect_exporter(model)
    backend = BACKEND_OF[framework]
    if framework == "torch":
        if exporter not in ("torch.onnx.dynamo", "torch.onnx.torchscript"):
            raise MappingError(f"the ONNX model was not exported from PyTorch (exporter {exporter!r}); "
                               "module scopes are unknown")
        entries = _map_torch(manifest, native_model, g, exporter, example_inputs)
    else:
        if exporter != "tf2onnx":
            raise MappingError(f"the ONNX model was not exported by tf2onnx (exporter {exporter!r}); "
                               "Keras layer names are unknown")
        entries = _map_keras(manifest, native_model, g)
    report = MappingReport(framework=framework, exporter=exporter)
    report.entries[backend] = entries
    all_values = set(g.producer) | set(g.inputs)
    report.entries["ort"] = {
        a.name: (_entry(a.value, "exact", "ONNX value") if a.value in all_values
                 else _entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph"))
        for a in manifest.anchors}
    if write:
        for a in manifest.anchors:
            a.native[backend] = dict(entries[a.name])
    return report


__all__ = ["MappingReport", "MappingError", "map_anchors", "detect_exporter", "parse_torch_target", "BACKEND_OF"]
