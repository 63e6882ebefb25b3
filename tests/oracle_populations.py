"""Synthetic populations for the oracle's tests (tests/test_oracle_*.py): a true tensor per anchor plus
relative fp32-like noise per backend, faults added from an anchor on, judged by anpred.judge.Oracle.
"""

import numpy as np

from anpred.judge import AnchorInfo, BackendInfo, Oracle

ANCHORS = [
    AnchorInfo("anchor/00/a", 0),
    AnchorInfo("anchor/01/b", 1),
    AnchorInfo("anchor/02/c", 2),
    AnchorInfo("output/y", 3, kind="output"),
]
FP32 = ["ort", "ort-noopt", "openvino", "onnx-reference", "torch"]


def backend_infos(names):
    return [BackendInfo.make(n) for n in names]


def population(names, faults=None, n=8, noise=3e-7, seed=0):
    """Yield samples {anchor: {backend: x}}: a true tensor per anchor plus relative fp32-like noise per
    backend; ``faults[backend] = (anchor index, fn(true, rng) -> deviation)`` adds a deviation from that
    anchor on (carried forward, scaled by ``gain`` per later anchor)."""
    rng = np.random.default_rng(seed)
    faults = faults or {}
    for _ in range(n):
        sample = {}
        carried = {b: None for b in names}
        for i, a in enumerate(ANCHORS):
            true = rng.standard_normal(512)
            sample[a.name] = {}
            for b in names:
                x = true * (1 + noise * rng.standard_normal(512))
                if b in faults:
                    at, fn, gain = faults[b]
                    if i == at:
                        carried[b] = fn(true, rng)
                    elif i > at and carried[b] is not None:
                        carried[b] = carried[b] * gain
                    if carried[b] is not None:
                        x = x + carried[b]
                sample[a.name][b] = x
        yield sample


def judged(names, faults=None, config=None, reference=None, **kw):
    o = Oracle(ANCHORS, backend_infos(names), config, reference=reference)
    for s in population(names, faults, **kw):
        o.add(s)
    return o.finish()


def shared_deviation(names, scale, identical=True, seed=3):
    """Samples where openvino and tf share one deviation (``scale`` x noise from anchor 1 on): tf a copy
    of openvino's tensor (``identical``) or with fp32-level noise of its own."""
    for s in population(names, {"openvino": (1, lambda t, r: scale * r.standard_normal(t.shape), 1.0)}, seed=seed):
        for a in s:
            if identical:
                s[a]["tf"] = s[a]["openvino"].copy()
            else:
                s[a]["tf"] = s[a]["openvino"] * (1 + 3e-7 * np.random.default_rng(7).standard_normal(512))
        yield s
