"""Anchor-level alignment: map every backend's anchor tensor onto the canonical representation.

The canonical representation of an anchor is the ONNX graph's: its shape (``anchor.shape``, symbolic
dims resolved per sample), its layout, compared in ``float64``. Backends hand back their own
representation (TensorFlow NHWC, a batch squeezed, a flattened view, float16/bfloat16, quantized int8)
and :class:`Aligner` reconciles them *before* the oracle, without ever hiding a real difference.

A decision is taken once per ``(anchor, backend)`` and reused for later samples, from, in order:

1. ``manifest`` -- a rule pinned in ``anchor.alignment[backend]`` (manual override);
2. ``capture`` -- ``statuses[backend].captures[anchor]["transform"]`` reported by the backend;
   ``onnx-graph`` -- a backend that returns the ONNX layout by construction (:func:`returns_onnx_layout`:
   ONNX Runtime, OpenVINO, the reference evaluator, onnx2torch, TVM, MNN, ncnn) is aligned by identity
   (a batch of 1 added or squeezed at most); another shape is a *wrong shape* (``wrong shape: ...``), a
   finding about the backend (:mod:`anpred.judge.deviations`), never "ambiguous";
3. ``native`` -- ``anchor.native[backend]["transform"]`` recorded by the native mapping;
4. ``layout`` -- the capture's ``layout`` against ``anchor.layout`` (``NHWC`` -> ``NCHW`` ...);
5. ``shape`` -- shape inference as the fallback: the layout permutations (identity, channels-last to
   channels-first and back, with a batch of 1 added or squeezed), else any permutation of the non-1
   dims, else an order-preserving reshape (flatten) with the same element count;
6. ``data`` -- when several candidates of step 5 fit the shape (``C == H == W``), the candidate
   closest to the consensus of the ONNX-layout backends (the others' only when none is there), if it
   is close (``error <= close_tol``) *and* decisively closer than the runner-up (``runner_up >=
   min_margin * error``); otherwise the anchor is *unaligned* for that backend on that sample
   (retried on the next one), never forced. The alignment is decided by the ONNX-layout backends
   first: a converter's reported layout (onnx2tf's NHWC) is checked against their consensus where
   the shape admits another candidate (:meth:`Aligner._check_converter`), never the reverse.

A manifest pin is the user's explicit instruction: if it does not fit the tensor, the anchor is
*unaligned* for that backend with the reason (never replaced by another rule); pins are validated
when the :class:`Aligner` is made, and pins naming an unknown backend are reported as warnings.

After the layout is fixed, a backend that runs a *native graph of its own* (``torch-native``,
``tf-native``, or an unregistered backend whose capture status is not ``exact``) and whose tensor is
far from the reference consensus is searched for a *segment permutation* (channels or concatenated
heads in another order) along the anchor's channel axis only. Backends that execute the ONNX graph
(``ort*``, ``openvino*``, ``onnx-reference``, ``torch`` via onnx2torch, ``tf`` via onnx2tf) compute the
same tensor by construction: a reordering there is a defect, so they are never searched, and neither
is an anchor under a manifest pin. A permutation is accepted only if every moved slice matches exactly
one consensus slice closely and decisively (same two thresholds, per slice), it consists of at most
``SEGMENT_MAX_BLOCKS`` contiguous blocks of substantial size, and the whole permuted tensor is close;
a wrong tensor matches nothing and stays as it is (different), so the oracle sees the real error. An
accepted segment order is recorded with ``source="data"`` and listed by
:attr:`AlignmentReport.segments_by_data` (``anpred check`` adds a note per anchor and backend).

Steps 1 to 5 are :func:`anpred.align.known_rules.decide_known`.
Distances are normalised errors (:func:`anpred.align.distance.normalized_error`), rules are those of
:mod:`anpred.align.rules`, shape candidates come from :mod:`anpred.align.shapes`, segment orders from
:func:`anpred.align.segments.find_segment_permutation`; the results are the types of
:mod:`anpred.align.struct`.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import numpy as np

from anpred.align.backend_info import (
    NATIVE_BACKENDS,
    ONNX_FAMILIES,
    ONNX_GRAPH_BACKENDS,
    anchor_capture,
    anchor_dtype,
    returns_onnx_layout,
)
from anpred.align.distance import normalized_error
from anpred.align.known_rules import Unaligned, decide_known, no_fit_reason
from anpred.align.rules import AlignmentError, apply_rule, describe_rule, validate_rule
from anpred.align.segments import SEGMENT_MAX_BLOCKS, channel_axis, find_segment_permutation
from anpred.align.struct import AlignedSample, AlignmentDecision, AlignmentReport, UnalignedEntry
from anpred.backends.base import BackendStatus
from anpred.errors import AnpredError
from anpred.manifest import Anchor, AnchorManifest

__all__ = ["Aligner"]


class Aligner:
    """Align backends' anchors onto the canonical ONNX representation (see the module docstring).

    Args:
        manifest: the anchor manifest of the run (canonical shapes, layouts, pins, native transforms).
        statuses: ``{backend: BackendStatus}`` (captures: per-anchor :class:`AnchorCapture` dicts with
            ``layout``/``transform``; ``precision``; ``family``; ``dtypes``).
        close_tol: a data-decided candidate (or segment) must have normalised error <= this (0.5);
            in ``(0, 1)``: at 1 the constant ``mean(m)`` would already "match".
        min_margin: ... and the runner-up must be at least this many times farther (4.0; finite, > 1).
        segment_search: look for channel/segment permutations (True); only ever in backends running a
            native graph of their own (``NATIVE_BACKENDS``, or an unregistered backend whose capture
            status is not ``exact``), never under a manifest pin, only along the anchor's channel axis
            (``C`` of its layout, else axis 1), with at most ``SEGMENT_MAX_BLOCKS`` blocks.
        max_segment_axis: longest axis searched for segment permutations (16384).

    Raises:
        AnpredError: thresholds out of range.
        AlignmentError: a manifest pin is malformed (at construction); a rule reported by a backend or
            the native mapping is malformed (when first used).
    """

    def __init__(
        self,
        manifest: AnchorManifest,
        statuses: dict[str, BackendStatus],
        *,
        close_tol: float = 0.5,
        min_margin: float = 4.0,
        segment_search: bool = True,
        max_segment_axis: int = 16384,
    ):
        if not (0 < close_tol < 1) or not (1 < min_margin < math.inf):
            raise AnpredError(
                f"alignment needs 0 < close_tol < 1 and a finite min_margin > 1 "
                f"(got close_tol={close_tol}, min_margin={min_margin})"
            )
        self.manifest = manifest
        self.statuses = dict(statuses)
        self.close_tol = float(close_tol)
        self.min_margin = float(min_margin)
        self.segment_search = bool(segment_search)
        self.max_segment_axis = int(max_segment_axis)
        self._anchors = {a.name: a for a in manifest.anchors}
        self._decisions: dict[tuple[str, str], AlignmentDecision] = {}
        self._unaligned: dict[tuple[str, str], UnalignedEntry] = {}
        self._samples = 0
        self._pins, self.warnings = self._read_pins()
        self._notes: dict[tuple[str, str], str] = {}  # known rules that did not fit, for data decisions

    # ---- public --------------------------------------------------------------------------------
    def align(self, sample_id: str, tensors: dict[str, dict[str, np.ndarray]]) -> AlignedSample:
        """Align one sample.

        Args:
            sample_id: the sample's id (recorded with unaligned entries).
            tensors: ``{backend: {anchor: array as the backend returned it}}``.

        Returns:
            :class:`AlignedSample` (float64 arrays in the canonical shape; unaligned reasons).
        """
        self._samples += 1
        out_t: dict[str, dict[str, np.ndarray]] = {}
        out_u: dict[str, dict[str, str]] = {}
        used: dict[tuple[str, str], AlignmentDecision] = {}
        by_anchor: dict[str, dict[str, np.ndarray]] = {}
        for b, anchors in tensors.items():
            for name, arr in anchors.items():
                by_anchor.setdefault(name, {})[b] = arr
        for name in self._anchor_order(by_anchor):
            anchor = self._anchors.get(name)
            raw = by_anchor.get(name, {})
            if anchor is None:
                for b, x in raw.items():
                    self._mark(out_u, name, b, sample_id, "anchor not in the manifest", x, None)
                continue
            aligned, unal = self._align_anchor(anchor, raw, sample_id, used)
            if aligned:
                out_t[name] = aligned
            for b, (reason, x, cs) in unal.items():
                self._mark(out_u, name, b, sample_id, reason, x, cs)
        # anchors a backend reported missing
        for b, st in self.statuses.items():
            if b not in tensors:
                continue
            for name, cap in (st.captures or {}).items():
                c = anchor_capture(cap)
                if c.status == "missing" and name not in tensors[b]:
                    self._mark(out_u, name, b, sample_id, f"not captured: {c.reason or 'missing'}", None, None)
        return AlignedSample(sample_id, out_t, out_u, used)

    def _read_pins(self) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
        """Validate every manifest pin now (before any work); warn about pins for unknown backends."""
        from anpred.backends import REGISTRY

        pins: dict[tuple[str, str], dict[str, Any]] = {}
        warnings: list[str] = []
        for a in self.manifest.anchors:
            al = a.alignment or {}
            if not isinstance(al, dict):
                raise AlignmentError(f"manifest pin {a.name}: 'alignment' must be {{backend: rule}}, got {al!r}")
            for b, rule in al.items():
                pins[(a.name, b)] = validate_rule(rule, f"manifest pin {a.name}/{b}")
                if b not in self.statuses and b not in REGISTRY:
                    warnings.append(
                        f"manifest pin for unknown backend {b!r} at {a.name} is ignored "
                        f"(backends in this run: {', '.join(self.statuses) or 'none'}; "
                        f"known: {', '.join(REGISTRY)})"
                    )
        return pins, warnings

    def report(self) -> AlignmentReport:
        """The alignment report so far (decisions taken, unaligned anchors)."""
        alignments = [d for d in self._decisions.values() if not d.identity or d.source == "data"]
        identity = Counter(d.backend for d in self._decisions.values() if d.identity and d.source != "data")
        order = {n: i for i, n in enumerate(self._anchors)}
        alignments.sort(key=lambda d: (d.backend, order.get(d.anchor, 1 << 30)))
        unaligned = sorted(self._unaligned.values(), key=lambda u: (u.backend, order.get(u.anchor, 1 << 30)))
        return AlignmentReport(
            alignments=alignments,
            unaligned=unaligned,
            identity=dict(sorted(identity.items())),
            samples=self._samples,
            warnings=list(self.warnings),
            settings={
                "close_tol": self.close_tol,
                "min_margin": self.min_margin,
                "segment_search": self.segment_search,
                "segment_max_blocks": SEGMENT_MAX_BLOCKS,
            },
        )

    @property
    def decisions(self) -> dict[tuple[str, str], AlignmentDecision]:
        return dict(self._decisions)

    # ---- per anchor ----------------------------------------------------------------------------
    def _anchor_order(self, by_anchor):
        known = [a.name for a in self.manifest.anchors if a.name in by_anchor]
        return known + sorted(n for n in by_anchor if n not in self._anchors)

    def _align_anchor(self, anchor: Anchor, raw: dict[str, np.ndarray], sample_id: str, used):
        cs = self._canonical_shape(anchor, raw)
        aligned: dict[str, np.ndarray] = {}
        unal: dict[str, tuple[str, np.ndarray | None, Any]] = {}
        if cs is None:
            for b, x in raw.items():
                unal[b] = (
                    f"canonical shape {anchor.shape} cannot be resolved from the backends' shapes",
                    x,
                    anchor.shape,
                )
            return aligned, unal
        pending: dict[str, list[dict[str, Any]]] = {}  # backend -> candidate rules (data needed)
        fresh: dict[str, AlignmentDecision] = {}  # decided on this sample (segment check pending)
        for b, x in raw.items():
            dec = self._decisions.get((anchor.name, b))
            if dec is None:
                try:
                    dec, cands = self._decide_known(anchor, b, np.asarray(x), cs)
                except Unaligned as why:
                    unal[b] = (str(why), x, cs)
                    continue
                if dec is None and cands is None:
                    unal[b] = (no_fit_reason(anchor, x, cs), x, cs)
                    continue
                if dec is None:
                    pending[b] = cands
                    continue
                if "exclude" in dec.rule:
                    unal[b] = (f"excluded by manifest pin: {dec.rule['exclude']}", x, cs)
                    continue
                fresh[b] = dec
            elif "exclude" in dec.rule:
                unal[b] = (f"excluded by manifest pin: {dec.rule['exclude']}", x, cs)
                continue
            try:
                aligned[b] = self._apply_checked(dec.rule, x, cs)
            except ValueError as err:
                unal[b] = (
                    f"rule '{describe_rule(dec.rule)}' ({dec.source}) does not fit: {err}; "
                    f"backend shape {list(np.shape(x))}, canonical {list(cs)}",
                    x,
                    cs,
                )
                fresh.pop(b, None)
                continue
            if b not in fresh:
                dec.samples += 1
                used[(anchor.name, b)] = dec
        # segment search for freshly decided native-graph backends, then commit them
        for b, dec in fresh.items():
            if (
                b in aligned
                and dec.source in ("capture", "layout")
                and not returns_onnx_layout(b, self.statuses.get(b))
            ):
                self._check_converter(anchor, b, dec, np.asarray(raw[b]), cs, aligned)
            if b in aligned and self._segment_search_allowed(anchor, b, dec):
                cons = self._consensus(aligned, exclude=b, references_only=True)
                if cons is not None:
                    self._segment_check(anchor, dec, aligned, b, cons)
            self._decisions[(anchor.name, b)] = dec
            if b in aligned:
                dec.samples += 1
                used[(anchor.name, b)] = dec
        # data-driven choices
        for b, cands in pending.items():
            x = np.asarray(raw[b])
            # the ONNX-layout backends decide; the others' consensus only when none of them is here
            cons = self._consensus(aligned, exclude=b, references_only=True)
            if cons is None:
                cons = self._consensus(aligned, exclude=b, references_only=False)
            if cons is None:
                unal[b] = (
                    f"layout ambiguous ({len(cands)} candidates fit backend shape {list(x.shape)} -> canonical "
                    f"{list(cs)}: {'; '.join(describe_rule(c) for c in cands)}) "
                    "and no other backend to decide by",
                    x,
                    cs,
                )
                continue
            res = self._choose(anchor, b, x, cs, cands, cons)
            if isinstance(res, str):
                unal[b] = (res, x, cs)
                continue
            dec, arr, commit = res
            aligned[b] = arr
            if commit:
                self._decisions[(anchor.name, b)] = dec
            dec.samples += 1
            used[(anchor.name, b)] = dec
        return aligned, unal

    def _mark(self, out_u, name, b, sample_id, reason, x, cs):
        out_u.setdefault(name, {})[b] = reason
        key = (name, b)
        e = self._unaligned.get(key)
        if e is None:
            e = self._unaligned[key] = UnalignedEntry(
                anchor=name,
                backend=b,
                reason=reason,
                backend_shape=list(np.shape(x)) if x is not None else [],
                canonical_shape=list(cs) if cs is not None else [],
                backend_dtype=str(np.asarray(x).dtype) if x is not None else "",
                first_sample=sample_id,
            )
        e.reason = reason
        e.samples += 1

    # ---- canonical shape ------------------------------------------------------------------------
    def _canonical_shape(self, anchor: Anchor, raw: dict[str, np.ndarray]) -> tuple[int, ...] | None:
        pat = list(anchor.shape or [])
        if pat and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in pat):
            return tuple(pat)
        if not pat and not anchor.shape:
            # unknown rank: take the shape of reference-like backends
            shapes = [tuple(np.shape(x)) for b, x in raw.items() if self._reference_like(anchor, b)]
            return Counter(shapes).most_common(1)[0][0] if shapes else None

        def fits(shape):
            return len(shape) == len(pat) and all(not isinstance(p, int) or p == s for p, s in zip(pat, shape))

        for prefer in (True, False):
            shapes = [
                tuple(np.shape(x))
                for b, x in raw.items()
                if fits(np.shape(x)) and (not prefer or self._reference_like(anchor, b))
            ]
            if shapes:
                return Counter(shapes).most_common(1)[0][0]
        unknown = [i for i, p in enumerate(pat) if not isinstance(p, int)]
        if len(unknown) == 1:
            known = math.prod(p for p in pat if isinstance(p, int))
            sizes = Counter(int(np.size(x)) for x in raw.values())
            for size, _ in sizes.most_common():
                if known and size % known == 0:
                    out = list(pat)
                    out[unknown[0]] = size // known
                    return tuple(out)
        return None

    def _reference_like(self, anchor: Anchor, b: str) -> bool:
        st = self.statuses.get(b)
        if st is None:
            return False
        cap = anchor_capture((st.captures or {}).get(anchor.name))
        return st.family in ONNX_FAMILIES or (cap.status == "exact" and not cap.transform)

    def runs_onnx_graph(self, b: str) -> bool:
        """True when backend ``b`` executes the anchored ONNX graph (directly or converted from it):
        registered ONNX-graph backends, and unregistered ones of an ONNX family or named ``ort-*`` /
        ``openvino-*``."""
        if b in ONNX_GRAPH_BACKENDS:
            return True
        if b in NATIVE_BACKENDS:
            return False
        st = self.statuses.get(b)
        return (st is not None and st.family in ONNX_FAMILIES) or b.startswith(("ort-", "openvino-"))

    def _segment_search_allowed(self, anchor: Anchor, b: str, dec: AlignmentDecision) -> bool:
        if not self.segment_search or dec.source == "manifest" or self.runs_onnx_graph(b):
            return False
        if b in NATIVE_BACKENDS:
            return True
        st = self.statuses.get(b)
        cap = anchor_capture((st.captures or {}).get(anchor.name) if st else None)
        return cap.status != "exact"  # a backend claiming the same tensor is taken at its word

    def _consensus(self, aligned: dict[str, np.ndarray], exclude: str, references_only: bool) -> np.ndarray | None:
        """Element-wise median of the other backends' aligned tensors (fp32 references preferred)."""
        others = {b: a for b, a in aligned.items() if b != exclude}
        if not others:
            return None
        fp32 = {
            b: a
            for b, a in others.items()
            if self.statuses.get(b) is not None and (self.statuses[b].precision or "fp32") == "fp32"
        }
        ref = {b: a for b, a in fp32.items() if self._reference_status(b)}
        pool = ref or (None if references_only else (fp32 or others))
        if not pool:
            return None
        arrs = list(pool.values())
        if len(arrs) == 1:
            return arrs[0]
        return np.median(np.stack(arrs), axis=0)

    def _reference_status(self, b: str) -> bool:
        """An fp32 backend returning the ONNX layout by construction: the reference of alignment."""
        st = self.statuses.get(b)
        return st is not None and returns_onnx_layout(b, st) and (st.precision or "fp32") == "fp32"

    # ---- decisions ------------------------------------------------------------------------------
    def _decide_known(self, anchor: Anchor, b: str, x: np.ndarray, cs: tuple[int, ...]):
        """Return ``(decision, None)`` when known rules or the shape decide, ``(None, candidates)`` when
        the data must decide, ``(None, None)`` when nothing fits (:func:`anpred.align.known_rules.decide_known`)."""
        dec, cands, note = decide_known(anchor, b, x, cs, self.statuses.get(b), self._pins.get((anchor.name, b)))
        if cands is not None:
            self._notes[(anchor.name, b)] = note
        return dec, cands

    def _apply_checked(self, rule, x, cs) -> np.ndarray:
        a = apply_rule(rule, x, cs)
        if a.shape != tuple(cs):
            raise ValueError(f"result has shape {list(a.shape)}")
        return a

    def _choose(self, anchor, b, x, cs, cands, cons):
        """Data-driven choice among candidate rules. Returns ``(decision, array, commit)`` or a reason."""
        outs, errs = [], []
        for c in cands:
            try:
                a = self._apply_checked(c, x, cs)
            except ValueError:
                a = None
            outs.append(a)
            errs.append(normalized_error(a, cons) if a is not None else math.inf)
        order = sorted(range(len(cands)), key=lambda i: errs[i])
        bi, si = order[0], order[1]
        best, second = errs[bi], errs[si]
        desc = "; ".join(f"{describe_rule(cands[i])}: {errs[i]:.3g}" for i in order)
        valid = [o for o in outs if o is not None]
        dt = anchor_dtype(x, self.statuses.get(b), anchor.name)
        dec = AlignmentDecision(
            anchor=anchor.name,
            backend=b,
            rule=cands[bi],
            source="data",
            backend_shape=list(x.shape),
            canonical_shape=list(cs),
            backend_dtype=dt,
            error=best,
            runner_up=second,
            margin=(second / best) if best > 0 else None,
            candidates=[{"rule": cands[i], "error": errs[i]} for i in order],
        )
        if len(valid) == len(outs) and all(np.array_equal(valid[0], o, equal_nan=True) for o in valid[1:]):
            dec.detail = f"all {len(cands)} candidates give the same tensor on this sample; decision deferred"
            return dec, outs[bi], False
        if not best <= self.close_tol:
            return (
                f"layout ambiguous and no candidate matches the consensus (normalised errors: {desc}; "
                f"need <= {self.close_tol}): a real deviation or an unknown representation; "
                f"backend shape {list(x.shape)}, canonical {list(cs)}"
            )
        if not (second >= self.min_margin * best and second > 0):
            return (
                f"layout ambiguous: candidates not separated by the data (normalised errors: {desc}; "
                f"need runner-up >= {self.min_margin} x best); backend shape {list(x.shape)}, canonical {list(cs)}"
            )
        dec.detail = self._notes.get((anchor.name, b), "") + (
            f"{len(cands)} candidates fit backend shape {list(x.shape)} -> {list(cs)}; closest to the "
            f"consensus of the other backends ({desc})"
        )
        return dec, outs[bi], True

    def _check_converter(
        self,
        anchor: Anchor,
        b: str,
        dec: AlignmentDecision,
        x: np.ndarray,
        cs: tuple[int, ...],
        aligned: dict[str, np.ndarray],
    ) -> None:
        """A converter's reported layout (capture transform or layout) checked against the consensus of
        the ONNX-layout backends, never the reverse: when the reported rule's tensor does not match it
        (normalised error > ``close_tol``) while another candidate the shape admits matches closely and
        decisively (the data rule's two thresholds), the reported rule still stands (the converter's
        tensor is judged as it claims to be, and deviates: H and W swapped is a defect, not a
        representation) and :attr:`AlignmentDecision.layout_check` names the candidate that matches,
        for the reader (e.g. ``permute [0, 1, 3, 2]``: the converter swapped two axes)."""
        cons = self._consensus(aligned, exclude=b, references_only=True)
        if cons is None:
            return
        e0 = normalized_error(aligned[b], cons)
        if not e0 > self.close_tol:
            return
        base = {k: v for k, v in dec.rule.items() if k in ("cast", "dequantize")}
        scored = []
        # every reading of the tensor's axes that gives the ONNX shape (rank <= 6: at most 720)
        perms = [
            list(p)
            for p in itertools.permutations(range(x.ndim))
            if x.ndim <= 6 and tuple(x.shape[i] for i in p) == tuple(cs)
        ]
        for p in perms:
            c = {**base, **({} if p == list(range(x.ndim)) else {"permute": p})}
            try:
                scored.append((normalized_error(self._apply_checked(c, x, cs), cons), c))
            except ValueError:
                continue
        scored.sort(key=lambda t: t[0])
        if not scored or not scored[0][0] <= self.close_tol:
            return
        best, rule = scored[0]
        runner = min([e0] + [e for e, _ in scored[1:]])
        if runner >= self.min_margin * best and runner > 0:
            dec.layout_check = (
                f"the reported rule '{describe_rule(dec.rule)}' does not match the ONNX-layout "
                f"backends (normalised error {e0:.3g}) "
                f"while '{describe_rule(rule)}' does ({best:.3g}): "
                "the converter returns the tensor in another layout than it reports"
            )

    # ---- segment permutations --------------------------------------------------------------------
    def _segment_check(
        self, anchor: Anchor, dec: AlignmentDecision, aligned: dict[str, np.ndarray], b: str, cons: np.ndarray
    ) -> None:
        x = aligned[b]
        e0 = normalized_error(x, cons)
        if not e0 > self.close_tol:
            return
        axis = channel_axis(anchor.layout, x.ndim)
        if axis is None:
            return
        found = find_segment_permutation(x, cons, self.close_tol, self.min_margin, self.max_segment_axis, axes=[axis])
        if found is None:
            return
        seg, e1 = found
        dec.rule = {**dec.rule, "segments": seg}
        dec.detail = (
            f"{dec.detail}; then a segment order along the channel axis {seg['axis']} found by the data "
            f"({len(seg['order'])} blocks): normalised error {e0:.3g} -> {e1:.3g} (a port's concatenation "
            f"order, or a real channel-order defect: pin the rule or 'exclude' to decide)"
        )
        dec.source = "data"
        dec.error, dec.runner_up = e1, e0
        dec.margin = (e0 / e1) if e1 > 0 else None
        aligned[b] = apply_rule({"segments": seg}, x, x.shape)
