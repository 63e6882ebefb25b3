"""Shape inference for alignment: which rules can map a backend tensor's shape onto the canonical shape.

Works on shapes only (no values): :func:`fit_rule` checks one known rule (a pin, a reported transform, a
layout hint) against a backend shape, adding a batch of 1 / squeezing it or a final reshape over size-1
dims where needed; :func:`shape_candidates` proposes every rule that fits when nothing is known, most
plausible first and one per distinct effect (the layout permutations with a batch of 1 added or
squeezed, else any permutation of the non-1 dims, else an order-preserving reshape). When several
candidates remain, the aligner lets the data decide (:mod:`anpred.align.aligner`).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np

from anpred.align.rules import apply_rule, layout_permutation

__all__ = ["fit_rule", "shape_candidates"]


def fit_rule(rule: dict[str, Any], shape: tuple[int, ...], cs: tuple[int, ...]):
    """Check ``rule`` on a backend tensor of shape ``shape`` against the canonical shape ``cs`` (adding a
    batch of 1 / squeezing it, or a final reshape over size-1 dims when needed). Returns
    ``(rule, note)`` or None."""
    shape = tuple(shape)
    variants = [(rule, "")]
    p = rule.get("permute")
    if p is not None and "view" not in rule:
        if len(p) == len(shape) + 1:
            variants.append(({**rule, "view": [1, *shape]}, "batch of 1 added"))
        elif len(p) == len(shape) - 1 and shape and shape[0] == 1:
            variants.append(({**rule, "view": list(shape[1:])}, "batch of 1 squeezed"))
    for r, note in variants:
        out = _result_shape(r, shape, cs)
        if out is None:
            continue
        if out == cs:
            return r, note
        if _squeeze(out) == _squeeze(cs) and not r.get("reshape"):
            return {**r, "reshape": True}, (note + "; " if note else "") + f"reshape {list(out)} -> {list(cs)}"
    return None


def shape_candidates(bshape, cs, lay_b, lay_c) -> list[dict[str, Any]]:
    """Candidate rules mapping ``bshape`` to ``cs``, most plausible first (distinct effects); ``lay_b``,
    ``lay_c``: the backend's and the canonical layout when known (their permutation is tried first)."""
    bshape, cs = tuple(bshape), tuple(cs)
    n = len(cs)
    cands: list[dict[str, Any]] = []
    seen: set = set()

    def add(rule):
        key = _effect_key(rule, bshape, cs)
        if key is None or key in seen:
            return
        seen.add(key)
        cands.append(rule)

    # 1. layout permutations over the same rank (batch of 1 added/squeezed)
    perms: list[list[int]] = []
    hint = None
    if lay_b and lay_c:
        hint = layout_permutation(str(lay_b).upper(), str(lay_c).upper())
    if hint:
        perms.append(hint)
    perms.append(list(range(n)))
    if n >= 3:
        perms.append([0, n - 1, *range(1, n - 1)])  # channels-last -> channels-first
        perms.append([0, *range(2, n), 1])  # channels-first -> channels-last
    views: list[list[int] | None] = [None]
    if len(bshape) == n - 1:
        views = [[1, *bshape]]
    elif len(bshape) == n + 1 and bshape[0] == 1:
        views = [list(bshape[1:])]
    elif len(bshape) != n:
        views = []
    for v in views:
        for p in perms:
            r: dict[str, Any] = {}
            if v is not None:
                r["view"] = v
            if p != list(range(n)):
                r["permute"] = p
            fitted = fit_rule(r, bshape, cs)
            if fitted is not None:
                add(fitted[0])
    if cands:
        return cands
    # 2. any permutation of the non-1 dims, then reshape
    bn = [d for d in bshape if d != 1]
    cn = [d for d in cs if d != 1]
    if sorted(bn) == sorted(cn) and len(bn) <= 5:
        for p in itertools.permutations(range(len(bn))):
            if [bn[i] for i in p] == cn:
                r = {}
                if list(p) != list(range(len(bn))):
                    if list(bshape) != bn:
                        r["view"] = bn
                    r["permute"] = list(p)
                r["reshape"] = True
                add(r)
        if cands:
            return cands
    # 3. flatten (same element count, C order), or a channels-last view then permute
    if math.prod(bshape) == math.prod(cs):
        add({"reshape": True})
        if n >= 3:
            cl = [cs[0], *cs[2:], cs[1]]
            add({"view": cl, "permute": [0, n - 1, *range(1, n - 1)]})
    return cands


def _squeeze(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _result_shape(rule: dict[str, Any], shape: tuple[int, ...], cs: tuple[int, ...]) -> tuple[int, ...] | None:
    s = tuple(shape)
    if "view" in rule:
        if math.prod(rule["view"]) != math.prod(s):
            return None
        s = tuple(rule["view"])
    if "permute" in rule:
        p = rule["permute"]
        if len(p) != len(s):
            return None
        s = tuple(s[i] for i in p)
    if rule.get("reshape"):
        if math.prod(s) != math.prod(cs):
            return None
        s = tuple(cs)
    if "segments" in rule:
        seg = rule["segments"]
        if seg["axis"] >= len(s) or sum(n for _, n in seg["order"]) != s[seg["axis"]]:
            return None
    return s


def _effect_key(rule: dict[str, Any], bshape: tuple[int, ...], cs: tuple[int, ...]):
    """Where each canonical element comes from, as a hashable key (distinguishes candidate effects)."""
    size = math.prod(bshape)
    if size > 1 << 22:
        # large tensors: compare on a small probe of the same structure is not possible; use the rule
        return json.dumps(rule, sort_keys=True)
    try:
        a = apply_rule(rule, np.arange(size, dtype=np.float64).reshape(bshape), cs)
    except ValueError:
        return None
    if a.shape != tuple(cs):
        return None
    return a.tobytes()
