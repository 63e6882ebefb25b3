"""Benchmark: structural diff of two ~10k-node graphs (``anpred.diff.diff_models``).

Graph A: a synthetic residual CNN of N blocks (Conv -> Sigmoid -> Mul [SiLU] -> Conv -> Add), built
with onnx.helper, small tensors (8 channels, 8x8) so ONNX Runtime can optimise it quickly. Graph B:
the same model after ONNX Runtime's offline optimisation (ORT_ENABLE_EXTENDED: SiLU -> QuickGelu
fusions), i.e. a real tool's rewrite. Also times A vs A with every node renamed (names useless:
structure tiers only), and networkx's VF2 isomorphism on the same graphs for comparison.

With ``--yolo MODEL.onnx`` (e.g. a dynamo export of YOLOv8n) it also measures matching without any
name on a real graph: MODEL vs its ORT_ENABLE_EXTENDED copy with every node, value and initializer
name scrambled (pairs found against the surviving nodes).

Usage: python benchmarks/bench_diff.py [--blocks 2000] [--skip-networkx] [--yolo MODEL.onnx]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(blocks: int, ch: int = 8, hw: int = 8) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for b in range(blocks):
        w1, w2 = f"w{b}a", f"w{b}b"
        inits += [
            numpy_helper.from_array(rng.standard_normal((ch, ch, 3, 3)).astype(np.float32) * 0.05, w1),
            numpy_helper.from_array(rng.standard_normal((ch, ch, 1, 1)).astype(np.float32) * 0.05, w2),
        ]
        nodes += [
            helper.make_node("Conv", [x, w1], [f"c{b}"], name=f"conv{b}a", pads=[1, 1, 1, 1]),
            helper.make_node("Sigmoid", [f"c{b}"], [f"s{b}"], name=f"sig{b}"),
            helper.make_node("Mul", [f"c{b}", f"s{b}"], [f"m{b}"], name=f"silu{b}"),
            helper.make_node("Conv", [f"m{b}", w2], [f"d{b}"], name=f"conv{b}b"),
            helper.make_node("Add", [x, f"d{b}"], [f"r{b}"], name=f"add{b}"),
        ]
        x = f"r{b}"
    g = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ch, hw, hw])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, ch, hw, hw])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def real_graph(path: Path) -> None:
    """MODEL vs its ORT_ENABLE_EXTENDED copy with all names scrambled: pairs found by structure."""
    import onnxruntime as ort

    from anpred.diff import diff_models

    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(Path(d) / "ext.onnx")
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        b = onnx.load(str(Path(d) / "ext.onnx"))
    a = onnx.load(str(path))
    keep = {i.name for i in b.graph.input} | {o.name for o in b.graph.output}
    ren: dict[str, str] = {}

    def r(v):
        return v if not v or v in keep else ren.setdefault(v, f"v{len(ren)}")

    for t in b.graph.initializer:
        t.name = r(t.name)
    for k, n in enumerate(b.graph.node):
        n.name = f"n{k}"
        n.input[:] = [r(x) for x in n.input]
        n.output[:] = [r(x) for x in n.output]
    del b.graph.value_info[:]
    fused = sum(n.domain == "com.microsoft" for n in b.graph.node)
    t = time.perf_counter()
    dd = diff_models(a, b)
    print(
        f"{path.name} ({len(a.graph.node)} nodes) vs its ORT-extended copy, all names scrambled: "
        f"{time.perf_counter() - t:.2f} s  matched {dd.matched} of {len(b.graph.node) - fused} surviving "
        f"nodes {dd.match_counts}; regions {dd.region_counts()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=2000)
    ap.add_argument("--skip-networkx", action="store_true", help="skip the (minutes long) networkx runs")
    ap.add_argument("--yolo", metavar="MODEL", help="also measure name-free matching on this real model")
    args = ap.parse_args()
    if args.yolo:
        real_graph(Path(args.yolo))
    import onnxruntime as ort

    from anpred.diff import diff_models

    a = build(args.blocks)
    with tempfile.TemporaryDirectory() as d:
        pa, pb = Path(d) / "a.onnx", Path(d) / "b.onnx"
        onnx.save(a, str(pa))
        t = time.perf_counter()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(pb)
        ort.InferenceSession(str(pa), so, providers=["CPUExecutionProvider"])
        t_ort = time.perf_counter() - t
        b = onnx.load(str(pb))
    print(f"A: {len(a.graph.node)} nodes; B (ORT extended, {t_ort:.1f} s): {len(b.graph.node)} nodes")
    t = time.perf_counter()
    d = diff_models(a, b)
    print(
        f"A vs ORT-optimised B: {time.perf_counter() - t:.2f} s  matched {d.matched} {d.match_counts}; "
        f"fusions {d.fusions()}"
    )
    r = copy.deepcopy(a)
    for i, n in enumerate(r.graph.node):
        n.name = f"renamed_{i}"
        for j, o in enumerate(n.output):
            if o not in {x.name for x in r.graph.output}:
                pass
    t = time.perf_counter()
    d = diff_models(a, r)
    print(f"A vs A with all nodes renamed: {time.perf_counter() - t:.2f} s  matched {d.matched} {d.match_counts}")
    # A vs B with every node and value renamed: only structure can match
    s = copy.deepcopy(b)
    ren = {}
    for i, n in enumerate(s.graph.node):
        n.name = f"n{i}"
        for j, o in enumerate(n.output):
            if o != s.graph.output[0].name:
                ren[o] = f"v{i}_{j}"
    for n in s.graph.node:
        n.input[:] = [ren.get(v, v) for v in n.input]
        n.output[:] = [ren.get(v, v) for v in n.output]
    t = time.perf_counter()
    d = diff_models(a, s)
    wrong = sum(1 for m in d.changed if m.op_type != "Conv" and any(c.kind == "rewired" for c in m.changes))
    print(
        f"A vs B with all node and value names changed: {time.perf_counter() - t:.2f} s  matched {d.matched} "
        f"{d.match_counts}; fusions {d.fusions()}; rewired pairs {wrong}"
    )
    if args.skip_networkx:
        return
    # networkx VF2 for comparison (exact isomorphism only; cannot express a diff)
    import networkx as nx

    def nxg(m):
        G = nx.DiGraph()
        prod = {o: i for i, n in enumerate(m.graph.node) for o in n.output}
        for i, n in enumerate(m.graph.node):
            G.add_node(i, op=n.op_type)
            for v in n.input:
                if v in prod:
                    G.add_edge(prod[v], i)
        return G

    ga, gr = nxg(a), nxg(r)
    t = time.perf_counter()
    gm = nx.algorithms.isomorphism.DiGraphMatcher(ga, gr, node_match=lambda x, y: x["op"] == y["op"])
    iso = gm.is_isomorphic()
    print(f"networkx VF2 A vs renamed A (isomorphic={iso}): {time.perf_counter() - t:.2f} s")
    small = build(6)
    small_b = onnx.load_from_string(small.SerializeToString())
    small_b.graph.node.remove(small_b.graph.node[-1])
    t = time.perf_counter()
    ged = nx.graph_edit_distance(nxg(small), nxg(small_b), node_match=lambda x, y: x["op"] == y["op"], timeout=20)
    print(f"networkx graph_edit_distance on 30 vs 29 nodes: {ged} in {time.perf_counter() - t:.1f} s (timeout 20 s)")


if __name__ == "__main__":
    main()
