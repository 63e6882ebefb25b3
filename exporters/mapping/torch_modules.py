"""PyTorch side of the mapping (backend ``torch-native``, captured with forward hooks, see
docs/native-mapping.md).

Targets: ``model.4`` (forward output of ``model.4``, one tensor), ``model.2.m.0:input`` (the single
tensor passed to ``model.2.m.0``), ``:output[k]`` (the k-th tensor leaf of the root module's output, in
``torch.utils._pytree`` order, which is the ONNX graph-output order). ``@n`` after a path selects the
n-th call (0-based) of a module called more than once. A value *leaves* module M when a consumer (or
the graph output) lies outside M; it is then M's forward output. TorchScript folds BatchNorm into the
Conv and names the result after the Conv: that value is the BatchNorm module's output
(``equivalent``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exporters.mapping.report import MappingError, make_entry
from exporters.mapping.scopes import fill_unscoped, parse_list, prefix_len
from passes.exporter import CLASS_KEY, SCOPE_KEY
from passes.graph import GraphIndex

__all__ = ["parse_torch_target", "shape_matches", "map_torch"]

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


def _resolve_dynamo_scope(
    entries: list[str], classes: list[str], modules: dict[str, Any], export_class: dict[str, str]
) -> list[str]:
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


def _torch_stacks(
    g: GraphIndex, exporter: str, modules: dict[str, Any], export_class: dict[str, str] | None = None
) -> list[list[str]]:
    stacks: list[list[str] | None] = []
    export_class = {} if export_class is None else export_class
    for n in g.nodes:
        if exporter == "torch.onnx.dynamo":
            md = {p.key: p.value for p in n.metadata_props}
            if SCOPE_KEY in md:
                scopes = parse_list(md[SCOPE_KEY])
                classes = parse_list(md.get(CLASS_KEY, "[]"))
                classes = classes[1:-1] if len(classes) == len(scopes) else []
                # entries: '' (root), module paths (full or relative)..., and last the FX op name
                pairs = [(s, classes[i] if classes else "") for i, s in enumerate(scopes[1:-1]) if s]
                stacks.append(
                    _resolve_dynamo_scope([p[0] for p in pairs], [p[1] for p in pairs], modules, export_class)
                )
            else:
                stacks.append(None)
        else:  # TorchScript: /model.2/cv1/conv/Conv
            parts = [p for p in n.name.split("/") if p]
            if n.name.startswith("/") and len(parts) >= 1:
                stacks.append(_resolve_torchscript_scope(parts[:-1], modules))
            else:
                stacks.append(None)
    return fill_unscoped(g, stacks)


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
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise MappingError(
            f"probing {type(module).__name__} on the example inputs failed: {type(err).__name__}: {first}"
        ) from err
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


class _TorchPairing:
    """What pairing anchors with a module's hooks needs: the module's paths (shared instances apart),
    the exporter's scope stack of every ONNX node, the probe's per-call shapes, and the note on an
    example input whose shape differs from the ONNX input's."""

    def __init__(self, manifest, module, g: GraphIndex, exporter: str, example_inputs, notes: list[str]):
        import torch

        self.torch, self.module, self.g, self.exporter = torch, module, g, exporter
        # every path, shared instances included (ultralytics' Conv modules share one SiLU instance: the
        # default named_modules() lists it once); a shared instance cannot be a hook target
        self.modules = modules = dict(module.named_modules(remove_duplicate=False))
        uses: dict[int, list[str]] = {}
        for pth, mod in modules.items():
            uses.setdefault(id(mod), []).append(pth)
        self.shared = {p: ps for ps in uses.values() if len(ps) > 1 for p in ps}
        export_class: dict[str, str] = {}
        self.stacks = _torch_stacks(g, exporter, modules, export_class)
        self.scoped = {m for s in self.stacks for m in s}
        self.root = root = type(module).__name__
        self.input_note = input_note = ""
        for spec, x in zip(manifest.model.get("inputs", []), example_inputs or ()):
            shp = tuple(getattr(x, "shape", ()))
            if not shape_matches(shp, spec.get("shape")):
                self.input_note = input_note = (
                    f"the factory's example input has shape {list(shp)} but the ONNX "
                    f"input {spec['name']!r} is {spec.get('shape')}"
                )
                notes.append(input_note + ": shapes of the native tensors may differ")
                break
        try:
            self.probe = _probe_torch(module, example_inputs) if example_inputs is not None else None
        except MappingError as err:
            raise MappingError(f"{err}" + (f" ({input_note})" if input_note else "")) from err.__cause__
        self.orig_outputs = [o["name"] for o in manifest.model.get("outputs", [])] or None
        self.output_order = self.orig_outputs or [b.value for b in manifest.anchors if b.kind == "output"]

        # classes the export recorded vs the native module's (dynamo only): a different model
        wrong_class = {
            p: (type(modules[p]).__name__, c)
            for p, c in export_class.items()
            if p in modules and type(modules[p]).__name__ != c
        }
        if wrong_class:  # another architecture: tensors at equal paths and shapes would still differ
            ex = ", ".join(f"{p!r} is {n} (export: {c})" for p, (n, c) in list(wrong_class.items())[:3])
            raise MappingError(
                f"the native {root} is not the exported model: {len(wrong_class)} module(s) have "
                f"another class than the export recorded ({ex}); was it exported from another "
                "factory or with other arguments?"
            )
        self.origs = set(self.output_order)
        self.leaving_cache: dict[str, list[str]] = {}

    @staticmethod
    def split_call(path: str) -> tuple[str, int]:
        m = _CALL.fullmatch(path)
        return m.group(1), int(m.group(2) or 0)

    def probed(self, table: dict[str, list], path: str):
        """(known, shape) of a module call's single tensor; known False without a probe."""
        if self.probe is None:
            return False, None  # unknown: assume a single tensor, verified when the backend prepares
        base, call = self.split_call(path)
        calls = table.get(base) or []
        return True, (calls[call] if call < len(calls) else None)

    def folded_bn(self, conv_path: str) -> str | None:
        """A BatchNorm registered right after ``conv_path`` in its parent that no ONNX node carries."""
        base, _ = self.split_call(conv_path)
        parent, _, leaf = base.rpartition(".")
        pmod = self.modules.get(parent) if parent else self.module
        if pmod is None:
            return None
        names = [n for n, _ in pmod.named_children()]
        if leaf not in names:
            return None
        i = names.index(leaf)
        for nxt in names[i + 1 : i + 2]:
            cand = f"{parent}.{nxt}" if parent else nxt
            if (
                isinstance(self.modules.get(cand), self.torch.nn.modules.batchnorm._BatchNorm)
                and cand not in self.scoped
            ):
                return cand
        return None

    def leaving_values(self, base: str) -> list[str]:
        """Values leaving module ``base`` (one per call), in topological order of their producers."""
        g, stacks = self.g, self.stacks
        if base not in self.leaving_cache:
            vals = []
            for i, n in enumerate(g.nodes):
                if base not in stacks[i]:
                    continue
                for o in n.output:
                    if o and (o in self.origs or any(base not in stacks[c] for c in g.consumers.get(o, []))):
                        vals.append(o)
            self.leaving_cache[base] = vals
        return self.leaving_cache[base]

    def check(self, entry: dict[str, Any], shape, ashape) -> dict[str, Any]:
        """Turn an exact/equivalent entry whose probed native shape differs from the ONNX shape into an
        unmapped one that says so."""
        if shape is None or shape_matches(shape, ashape):
            return entry
        why = (
            f"shape mismatch: {entry['target']} gives {list(shape)} in the native {self.root}, the ONNX value "
            f"has {list(ashape)}"
        )
        return make_entry(entry["target"], "unmapped", why + (f" ({self.input_note})" if self.input_note else ""))

    def pair(self, a) -> tuple[dict[str, Any], bool]:
        """``(entry, rejected for its shape)`` of anchor ``a``: the output of a module the value leaves,
        else the input of a module it enters, else a tensor of the root module's output."""
        g, v = self.g, a.value
        if v not in g.producer:
            return make_entry(
                "",
                "unmapped",
                f"value {v!r} has no producer node in the ONNX graph "
                "(a graph input or a constant): nothing to capture natively",
            ), False
        pi = g.producer[v]
        node = g.nodes[pi]
        S = self.stacks[pi]
        cons = [self.stacks[c] for c in g.consumers.get(v, [])]
        is_output = (v in self.orig_outputs) if self.orig_outputs else a.kind == "output"
        if is_output:
            cons.append([])
        # instrumentation-only outputs do not count as consumers
        j = min((prefix_len(S, c) for c in cons), default=len(S))
        entry = self.module_output(a, node, S[j:])
        if entry is not None and entry["status"] != "unmapped":
            return entry, False
        if entry is not None and entry["reason"].startswith("shape mismatch"):
            return entry, True
        entry = self.module_input(a, S, entry)
        if entry is not None and entry["status"] == "exact":
            return entry, False
        if entry is not None and entry["reason"].startswith("shape mismatch"):
            return entry, True
        if is_output:
            return self.root_output(a)
        where = S[-1] if S else "the root module"
        return entry if entry is not None else make_entry(
            "",
            "unmapped",
            f"value {v!r} ({node.op_type}) is internal to the forward of module {where!r}: "
            "neither a module output nor a module input, so no forward hook can observe it",
        ), False

    def module_output(self, a, node, leaves: list[str]) -> dict[str, Any] | None:
        """The entry of ``a`` as the forward output of one of the modules its value ``leaves``
        (outermost first); the last refusal, or None, when none is a target."""
        v, probe, root, shared = a.value, self.probe, self.root, self.shared
        entry = None
        for path in leaves:
            base, _ = self.split_call(path)
            if base not in self.modules:
                entry = make_entry(path, "unmapped", f"module {base!r} named by the exporter does not exist in {root}")
                continue
            if base in shared:
                entry = make_entry(
                    path,
                    "unmapped",
                    f"module {base!r} is one instance shared by "
                    f"{len(shared[base])} paths ({', '.join(shared[base][:3])} ...): "
                    "a forward hook cannot tell its calls apart",
                )
                continue
            known, shape = self.probed(probe.out_shape if probe else {}, path)
            if known and shape is None:
                continue  # returns several tensors (or none): not a target itself
            mod = self.modules[base]
            if node.op_type == "Conv" and isinstance(mod, self.torch.nn.modules.conv._ConvNd):
                bn = self.folded_bn(path)
                if bn is not None:
                    bshape = self.probed(probe.out_shape if probe else {}, bn)[1]
                    return self.check(
                        make_entry(
                            bn,
                            "equivalent",
                            f"BatchNorm {bn!r} was folded into Conv {base!r} by the exporter; "
                            f"the ONNX value {v!r} equals the output of {bn!r}",
                        ),
                        bshape,
                        a.shape,
                    )
            calls = len(probe.out_shape.get(base, [])) if probe is not None else 1
            if calls > 1 and "@" not in path and self.exporter == "torch.onnx.dynamo":
                leaving = self.leaving_values(base)
                if len(leaving) != calls or v not in leaving:
                    entry = make_entry(
                        path,
                        "unmapped",
                        f"module {base!r} is called {calls} times and the ONNX "
                        f"graph shows {len(leaving)} outputs of it: cannot tell which call "
                        f"produced {v!r}",
                    )
                    continue
                path = f"{base}@{leaving.index(v)}"
                shape = self.probed(probe.out_shape, path)[1]
            return self.check(
                make_entry(path, "exact", f"forward output of {path} ({type(mod).__name__})"), shape, a.shape
            )
        return entry

    def module_input(self, a, S: list[str], entry: dict[str, Any] | None) -> dict[str, Any] | None:
        """The entry of ``a`` as the single tensor input of a module its value enters (``S``: the
        producer's scope stack); ``entry`` (the refusal so far) when none is a target."""
        probe = self.probe
        for c_idx in self.g.consumers.get(a.value, []):
            Sc = self.stacks[c_idx]
            k = prefix_len(S, Sc)
            for path in Sc[k:]:
                base, _ = self.split_call(path)
                if base not in self.modules or base in self.shared:
                    continue
                known, shape = self.probed(probe.in_shape if probe else {}, path)
                if known and shape is None:
                    continue
                entry = self.check(
                    make_entry(
                        f"{path}:input",
                        "exact",
                        f"the single tensor input of {base} ({type(self.modules[base]).__name__})",
                    ),
                    shape,
                    a.shape,
                )
                break
            if entry is not None and (entry["status"] == "exact" or entry["reason"].startswith("shape mismatch")):
                break
        return entry

    def root_output(self, a) -> tuple[dict[str, Any], bool]:
        """``(entry, rejected for its shape)`` of graph output ``a`` as a tensor of the root module's output."""
        v, probe, orig_outputs, root = a.value, self.probe, self.orig_outputs, self.root
        k = self.output_order.index(v)
        if probe is not None and orig_outputs is not None and len(probe.leaves) != len(orig_outputs):
            return make_entry(
                f":output[{k}]",
                "unmapped",
                f"{root} returns {len(probe.leaves)} tensors but the ONNX graph has "
                f"{len(orig_outputs)} outputs: cannot pair output {v!r}",
            ), False
        e = self.check(
            make_entry(f":output[{k}]", "exact", f"tensor {k} of {root}'s output"),
            probe.leaves[k] if probe is not None else None,
            a.shape,
        )
        return e, e["status"] == "unmapped"


def map_torch(
    manifest, module, g: GraphIndex, exporter: str, example_inputs, notes: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per anchor of ``manifest``, its ``torch-native`` entry on ``module`` (``g``: the anchored
    graph's :func:`~exporters.mapping.scopes.mapping_index`; ``notes`` collects pairing warnings).

    Raises:
        MappingError: not a module, another architecture than the export, a failing probe, no anchor
            mapping at all because of shape mismatches."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise MappingError(f"framework 'torch' needs a torch.nn.Module, got {type(module).__name__}")
    pairing = _TorchPairing(manifest, module, g, exporter, example_inputs, [] if notes is None else notes)
    out: dict[str, dict[str, Any]] = {}
    shape_rejected = 0
    for a in manifest.anchors:
        out[a.name], rejected = pairing.pair(a)
        shape_rejected += rejected
    mapped = sum(e["status"] != "unmapped" for e in out.values())
    if not mapped and shape_rejected:
        first = next(e["reason"] for e in out.values() if e["reason"].startswith(("shape mismatch", "module")))
        input_note = pairing.input_note
        raise MappingError(
            f"the native {pairing.root} does not match the ONNX graph: none of {len(out)} anchors "
            f"maps ({shape_rejected} shape mismatch(es)); "
            f"first: {first}"
            + (f"; {input_note}" if input_note and input_note not in first else "")
            + "; was it exported from another factory or with other arguments?"
        )
    return out
