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
    notes: list[str] = field(default_factory=list)  # warnings about the pairing (input shapes, classes)

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
        lines += [f"warning: {n}" for n in self.notes]
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
        from passes.anchor_nodes import is_anchor_node as _is_anchor_node

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


def _resolve_dynamo_scope(entries: list[str], classes: list[str], modules: dict[str, Any],
                          export_class: dict[str, str]) -> list[str]:
    """``pkg.torch.onnx.name_scopes`` entries (root and FX op removed) -> full module paths.

    The exporter writes some entries as full paths (``model.2.cv1``) and others relative to the
    enclosing scope (``conv`` under ``model.2.cv1``): an entry is resolved against the enclosing
    modules, innermost first, then as a full path; among candidates that exist, the one whose class
    matches ``pkg.torch.onnx.class_hierarchy`` (``classes``, same positions) wins. The class the export
    recorded is kept in ``export_class[path]`` (class ``__name__``)."""
    chain: list[str] = []
    for k, e in enumerate(entries):
        want = classes[k].rsplit(".", 1)[-1] if k < len(classes) and classes[k] else None
        cands = [f"{b}.{e}" for b in reversed(chain)] + [e]
        present = [c for c in cands if c in modules]
        found = next((c for c in present if want is None or type(modules[c]).__name__ == want), None)
        if found is None:
            if present:
                found = present[0]
            elif not chain or any(e.startswith(c.split("@")[0] + ".") for c in chain):
                found = e  # a full path the native module lacks
            else:
                found = f"{chain[-1]}.{e}"
        if want is not None:
            export_class.setdefault(found, want)
        chain.append(found)
    return chain


def _torch_stacks(g: _Graph, exporter: str, modules: dict[str, Any],
                  export_class: dict[str, str] | None = None) -> list[list[str]]:
    stacks: list[list[str] | None] = []
    export_class = {} if export_class is None else export_class
    for n in g.nodes:
        if exporter == "torch.onnx.dynamo":
            md = {p.key: p.value for p in n.metadata_props}
            if SCOPE_KEY in md:
                scopes = _parse_list(md[SCOPE_KEY])
                classes = _parse_list(md.get(CLASS_KEY, "[]"))
                classes = classes[1:-1] if len(classes) == len(scopes) else []
                # entries: '' (root), module paths (full or relative)..., and last the FX op name
                pairs = [(s, classes[i] if classes else "") for i, s in enumerate(scopes[1:-1]) if s]
                stacks.append(_resolve_dynamo_scope([p[0] for p in pairs], [p[1] for p in pairs], modules,
                                                    export_class))
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


@dataclass
class _Probe:
    """One forward pass of the native module with hooks. Per module path, one entry per call: the
    shape of its single tensor output / single tensor input, or None when it returns/takes several
    (or none). ``leaves``: shapes of the root output's tensor leaves (pytree order)."""

    out_shape: dict[str, list[tuple | None]]
    in_shape: dict[str, list[tuple | None]]
    leaves: list[tuple]


def _probe_torch(module, example_inputs) -> "_Probe":
    """Run ``module`` once on ``example_inputs`` (no grad) with forward (pre-)hooks on every submodule.

    Raises:
        MappingError: the forward pass fails (the message names the module class and the error)."""
    import torch
    from torch.utils._pytree import tree_leaves

    out_shape: dict[str, list[tuple | None]] = {}
    in_shape: dict[str, list[tuple | None]] = {}
    handles = []
    for name, sub in module.named_modules():
        if not name:
            continue

        def pre(mod, args, kwargs, _n=name):
            leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            in_shape.setdefault(_n, []).append(tuple(leaves[0].shape) if len(leaves) == 1 else None)

        def post(mod, args, kwargs, output, _n=name):
            out_shape.setdefault(_n, []).append(tuple(output.shape) if isinstance(output, torch.Tensor) else None)

        handles.append(sub.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(sub.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            out = module(*[torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in example_inputs])
    except Exception as err:
        raise MappingError(f"probing {type(module).__name__} on the example inputs failed: "
                           f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}") from err
    finally:
        for h in handles:
            h.remove()
    leaves = [tuple(x.shape) for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
    return _Probe(out_shape, in_shape, leaves)


def shape_matches(native, onnx_shape) -> bool:
    """Whether a native tensor shape fits the anchor's ONNX shape (``None``/symbolic/<=0 dims match
    anything; an empty or missing ONNX shape matches any shape)."""
    if not onnx_shape:
        return True
    if native is None or len(native) != len(onnx_shape):
        return False
    return all(not isinstance(d, int) or d <= 0 or int(n) == d for n, d in zip(native, onnx_shape))


def _map_torch(manifest, module, g: _Graph, exporter: str, example_inputs,
               notes: list[str] | None = None) -> dict[str, dict[str, Any]]:
    import torch

    if not isinstance(module, torch.nn.Module):
        raise MappingError(f"framework 'torch' needs a torch.nn.Module, got {type(module).__name__}")
    notes = [] if notes is None else notes
    # every path, shared instances included (ultralytics' Conv modules share one SiLU instance: the
    # default named_modules() lists it once); a shared instance cannot be a hook target
    modules = dict(module.named_modules(remove_duplicate=False))
    uses: dict[int, list[str]] = {}
    for pth, mod in modules.items():
        uses.setdefault(id(mod), []).append(pth)
    shared = {p: ps for ps in uses.values() if len(ps) > 1 for p in ps}
    export_class: dict[str, str] = {}
    stacks = _torch_stacks(g, exporter, modules, export_class)
    scoped = {m for s in stacks for m in s}
    root = type(module).__name__
    input_note = ""
    for spec, x in zip(manifest.model.get("inputs", []), example_inputs or ()):
        shp = tuple(getattr(x, "shape", ()))
        if not shape_matches(shp, spec.get("shape")):
            input_note = (f"the factory's example input has shape {list(shp)} but the ONNX input "
                          f"{spec['name']!r} is {spec.get('shape')}")
            notes.append(input_note + ": shapes of the native tensors may differ")
            break
    try:
        probe = _probe_torch(module, example_inputs) if example_inputs is not None else None
    except MappingError as err:
        raise MappingError(f"{err}" + (f" ({input_note})" if input_note else "")) from err.__cause__
    orig_outputs = [o["name"] for o in manifest.model.get("outputs", [])] or None

    # classes the export recorded vs the native module's (dynamo only): a different model
    wrong_class = {p: (type(modules[p]).__name__, c) for p, c in export_class.items()
                   if p in modules and type(modules[p]).__name__ != c}
    if wrong_class:  # another architecture: tensors at equal paths and shapes would still differ
        ex = ", ".join(f"{p!r} is {n} (export: {c})" for p, (n, c) in list(wrong_class.items())[:3])
        raise MappingError(f"the native {root} is not the exported model: {len(wrong_class)} module(s) have "
                           f"another class than the export recorded ({ex}); was it exported from another "
                           "factory or with other arguments?")

    def split_call(path: str) -> tuple[str, int]:
        m = _CALL.fullmatch(path)
        return m.group(1), int(m.group(2) or 0)

    def probed(table: dict[str, list], path: str):
        """(known, shape) of a module call's single tensor; known False without a probe."""
        if probe is None:
            return False, None  # unknown: assume a single tensor, verified when the backend prepares
        base, call = split_call(path)
        calls = table.get(base) or []
        return True, (calls[call] if call < len(calls) else None)

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

    def check(entry: dict[str, Any], shape, ashape) -> dict[str, Any]:
        """Turn an exact/equivalent entry whose probed native shape differs from the ONNX shape into an
        unmapped one that says so."""
        if shape is None or shape_matches(shape, ashape):
            return entry
        why = (f"shape mismatch: {entry['target']} gives {list(shape)} in the native {root}, the ONNX value "
               f"has {list(ashape)}")
        return _entry(entry["target"], "unmapped", why + (f" ({input_note})" if input_note else ""))

    out: dict[str, dict[str, Any]] = {}
    shape_rejected = 0
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
                entry = _entry(path, "unmapped", f"module {base!r} named by the exporter does not exist in {root}")
                continue
            if base in shared:
                entry = _entry(path, "unmapped", f"module {base!r} is one instance shared by {len(shared[base])} paths "
                               f"({', '.join(shared[base][:3])} ...): a forward hook cannot tell its calls apart")
                continue
            known, shape = probed(probe.out_shape if probe else {}, path)
            if known and shape is None:
                continue  # returns several tensors (or none): not a target itself
            mod = modules[base]
            if node.op_type == "Conv" and isinstance(mod, torch.nn.modules.conv._ConvNd):
                bn = folded_bn(path)
                if bn is not None:
                    bshape = probed(probe.out_shape if probe else {}, bn)[1]
                    entry = check(_entry(bn, "equivalent",
                                         f"BatchNorm {bn!r} was folded into Conv {base!r} by the exporter; the ONNX "
                                         f"value {v!r} equals the output of {bn!r}"), bshape, a.shape)
                    break
            calls = len(probe.out_shape.get(base, [])) if probe is not None else 1
            if calls > 1 and "@" not in path and exporter == "torch.onnx.dynamo":
                leaving = leaving_values(base)
                if len(leaving) != calls or v not in leaving:
                    entry = _entry(path, "unmapped", f"module {base!r} is called {calls} times and the ONNX graph "
                                   f"shows {len(leaving)} outputs of it: cannot tell which call produced {v!r}")
                    continue
                path = f"{base}@{leaving.index(v)}"
                shape = probed(probe.out_shape, path)[1]
            entry = check(_entry(path, "exact", f"forward output of {path} ({type(mod).__name__})"), shape, a.shape)
            break
        if entry is not None and entry["status"] != "unmapped":
            out[a.name] = entry
            continue
        if entry is not None and entry["reason"].startswith("shape mismatch"):
            out[a.name] = entry
            shape_rejected += 1
            continue
        # the input of a module the value enters
        for c_idx in g.consumers.get(v, []):
            Sc = stacks[c_idx]
            k = _prefix_len(S, Sc)
            for path in Sc[k:]:
                base, _ = split_call(path)
                if base not in modules or base in shared:
                    continue
                known, shape = probed(probe.in_shape if probe else {}, path)
                if known and shape is None:
                    continue
                entry = check(_entry(f"{path}:input", "exact",
                                     f"the single tensor input of {base} ({type(modules[base]).__name__})"),
                              shape, a.shape)
                break
            if entry is not None and (entry["status"] == "exact" or entry["reason"].startswith("shape mismatch")):
                break
        if entry is not None and entry["status"] == "exact":
            out[a.name] = entry
            continue
        if entry is not None and entry["reason"].startswith("shape mismatch"):
            out[a.name] = entry
            shape_rejected += 1
            continue
        if is_output:
            order = orig_outputs or [b.value for b in manifest.anchors if b.kind == "output"]
            k = order.index(v)
            if probe is not None and orig_outputs is not None and len(probe.leaves) != len(orig_outputs):
                out[a.name] = _entry(f":output[{k}]", "unmapped",
                                     f"{root} returns {len(probe.leaves)} tensors but the ONNX graph has "
                                     f"{len(orig_outputs)} outputs: cannot pair output {v!r}")
            else:
                e = check(_entry(f":output[{k}]", "exact", f"tensor {k} of {root}'s output"),
                          probe.leaves[k] if probe is not None else None, a.shape)
                shape_rejected += e["status"] == "unmapped"
                out[a.name] = e
            continue
        where = S[-1] if S else "the root module"
        out[a.name] = entry if entry is not None else _entry(
            "", "unmapped", f"value {v!r} ({node.op_type}) is internal to the forward of module {where!r}: "
            "neither a module output nor a module input, so no forward hook can observe it")
    mapped = sum(e["status"] != "unmapped" for e in out.values())
    if not mapped and shape_rejected:
        first = next(e["reason"] for e in out.values() if e["reason"].startswith(("shape mismatch", "module")))
        raise MappingError(f"the native {root} does not match the ONNX graph: none of {len(out)} anchors maps "
                           f"({shape_rejected} shape mismatch(es)); "
                           f"first: {first}" + (f"; {input_note}" if input_note and input_note not in first else "")
                           + "; was it exported from another factory or with other arguments?")
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
# Converter backends (the ONNX graph converted into the other libraries)
# ---------------------------------------------------------------------------------------------------
CONVERTER_BACKENDS = ("torch", "tf")


def converter_entries(manifest: AnchorManifest, onnx_model, backends=CONVERTER_BACKENDS) -> dict[str, dict[str, dict]]:
    """Static mapping for the converter backends, read off the ONNX graph (nothing is converted).

    - ``torch`` (onnx2torch): every submodule is named after its ONNX node and records its ONNX
      output value names, so an anchor is *exact* (fetched by its ONNX value name, ONNX layout) when
      onnx2torch has a converter for every node (:func:`anpred.convert.onnx2torch_unsupported`, after
      the compatibility converters of :func:`anpred.convert.onnx2torch_compat`); otherwise every
      anchor is unmapped, the reason naming the unconvertible nodes.
    - ``tf`` (onnx2tf): every anchor is a graph output of the anchored model and comes back under
      its name: *exact*. onnx2tf decides the layout of each 3-D/4-D/5-D output (mostly channels-last)
      while converting, so the transform (``{"permute": [0, 3, 1, 2]}``) is known only when the backend
      is prepared (``anpred map --backends tf``, :func:`prepared_entries`); a layout change is exact.

    Returns ``{backend: {anchor name: entry}}``.
    """
    model = _load_onnx(onnx_model, manifest)
    g = _Graph(model)
    known = set(g.producer) | set(g.inputs) | {t.name for t in model.graph.initializer}
    out: dict[str, dict[str, dict]] = {}
    for b in backends:
        if b == "torch":
            missing: list[str] = []
            why = ""
            try:
                import onnx

                from anpred.compat import import_onnx2torch
                from anpred.convert import fold_constant_nodes, onnx2torch_compat, onnx2torch_unsupported

                import_onnx2torch()
                onnx2torch_compat()
                clean = onnx.ModelProto()
                clean.CopyFrom(model)
                fold_constant_nodes(clean)
                missing = onnx2torch_unsupported(clean)
            except ImportError as err:
                why = f"onnx2torch is not importable: {err}"
            if missing:
                why = (f"onnx2torch has no converter for {len(missing)} node(s): {'; '.join(missing[:5])}"
                       + (" ..." if len(missing) > 5 else ""))
            ents = {}
            for a in manifest.anchors:
                if why:
                    ents[a.name] = _entry("", "unmapped", why)
                elif a.value in g.producer:
                    node = g.nodes[g.producer[a.value]]
                    ents[a.name] = _entry(node.name or a.value, "exact",
                                          f"output {a.value!r} of the onnx2torch submodule converted from ONNX node "
                                          f"{node.name or node.op_type!r} ({node.op_type}), ONNX layout")
                elif a.value in known:
                    ents[a.name] = _entry(a.value, "exact", "graph input or initializer of the converted graph")
                else:
                    ents[a.name] = _entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph")
            out[b] = ents
        elif b == "tf":
            out[b] = {a.name: (_entry(a.name if a.kind != "output" else a.value, "exact",
                                      "graph output of the onnx2tf model, fetched by name; its layout (channels-last "
                                      "for most 3-5-D tensors) is recorded when the backend is prepared "
                                      "(anpred map --backends tf)")
                               if a.value in known else
                               _entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph"))
                      for a in manifest.anchors}
        else:
            raise MappingError(f"no static mapping for backend {b!r}; known: {', '.join(CONVERTER_BACKENDS)} "
                               "(others: prepare them, anpred map --backends)")
    return out


def prepared_entries(backend: str, model_path, manifest: AnchorManifest, options: dict | None = None,
                     workdir=None) -> dict[str, dict[str, Any]]:
    """Prepare ``backend`` (any registry name: converters are converted, native models rebuilt) on the
    anchored model at ``model_path`` and turn its :meth:`~anpred.backends.base.Backend.anchor_info` into
    mapping entries (``missing`` -> ``unmapped`` with the backend's reason; a layout change keeps
    its ``transform``).

    Raises:
        MappingError: the backend cannot be prepared (the message carries the backend's reason).
    """
    import copy
    import tempfile

    from anpred.backends import backend_class
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
            out[a.name] = _entry(cap.target or "" if cap else "", "unmapped",
                                 cap.reason if cap and cap.reason else "not captured by the prepared backend")
        else:
            out[a.name] = _entry(cap.target or a.value, cap.status,
                                 cap.reason or "captured by the prepared backend", cap.transform)
    return out


# ---------------------------------------------------------------------------------------------------
def _entry(target: str, status: str, reason: str, transform: dict | None = None) -> dict[str, Any]:
    return {"target": target, "status": status, "transform": transform, "reason": reason}


def map_anchors(manifest: AnchorManifest, native_model, framework: str, *, onnx_model=None,
                example_inputs: tuple | None = None, write: bool = True,
                converters: tuple[str, ...] = ()) -> "MappingReport":
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
            (:func:`converter_entries`) are added to the report (not written to the manifest).

    Returns:
        :class:`MappingReport` with the native backend's column, the ``ort`` reference column and the
        ``converters`` columns.

    Raises:
        MappingError: unknown framework, wrong native model type, no ONNX graph.
    """
    if framework not in BACKEND_OF:
        raise MappingError(f"unknown framework {framework!r}; known: {', '.join(BACKEND_OF)}")
    model = _load_onnx(onnx_model, manifest)
    g = _Graph(model)
    exporter = detect_exporter(model)
    backend = BACKEND_OF[framework]
    notes: list[str] = []
    if framework == "torch":
        if exporter not in ("torch.onnx.dynamo", "torch.onnx.torchscript"):
            raise MappingError(f"the ONNX model was not exported from PyTorch (exporter {exporter!r}); "
                               "module scopes are unknown")
        entries = _map_torch(manifest, native_model, g, exporter, example_inputs, notes)
    else:
        if exporter != "tf2onnx":
            raise MappingError(f"the ONNX model was not exported by tf2onnx (exporter {exporter!r}); "
                               "Keras layer names are unknown")
        entries = _map_keras(manifest, native_model, g)
    report = MappingReport(framework=framework, exporter=exporter, notes=notes)
    report.entries[backend] = entries
    all_values = set(g.producer) | set(g.inputs)
    report.entries["ort"] = {
        a.name: (_entry(a.value, "exact", "ONNX value") if a.value in all_values
                 else _entry("", "unmapped", f"value {a.value!r} is not in the ONNX graph"))
        for a in manifest.anchors}
    if converters:
        report.entries.update(converter_entries(manifest, model, converters))
    if write:
        for a in manifest.anchors:
            a.native[backend] = dict(entries[a.name])
    return report


__all__ = ["MappingReport", "MappingError", "map_anchors", "detect_exporter", "parse_torch_target", "BACKEND_OF",
           "converter_entries", "prepared_entries", "shape_matches", "CONVERTER_BACKENDS"]
