"""The figures of the reference evaluation (benchmarks/oracle_eval.py): detection rate vs magnitude per
model, detection vs the true injected fault size, and nRMSE along the anchors (clean run and faults);
and the order of a fault kind's magnitudes its tables and figures share."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import evaluation as ev


def mag_order(kind: str, mags) -> list:
    """Magnitudes of ``kind`` ordered from the smallest to the largest fault (``round``: more
    significand bits = smaller fault, so descending p; every other kind ascending)."""
    return sorted(mags, key=(lambda m: -float(m)) if kind == "round" else float)


def plots(p: dict, out: Path) -> None:
    """eval_detection_<model>.png (detection rate vs magnitude per kind, per method),
    eval_detection_vs_size.png (detection vs the true injected nRMSE, all models),
    eval_propagation_<model>.png (oracle nRMSE along the anchors: reduced precision and some faults)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ["anpred"] + [f"threshold@{t:g}" for t in ev.TOLERANCES]
    styles = {"anpred": dict(color="k", lw=2.5, marker="o")}
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(ev.TOLERANCES)))
    for i, t in enumerate(ev.TOLERANCES):
        styles[f"threshold@{t:g}"] = dict(color=colors[i], lw=1.2, ls="--", marker="s", ms=4)
    _plot_detection(p, out, plt, methods, styles)
    _plot_detection_vs_size(p, out, plt, methods, styles)
    _plot_propagation(p, out, plt)


def _plot_detection(p: dict, out: Path, plt, methods: list[str], styles: dict) -> None:
    """eval_detection_<model>.png: detection rate vs magnitude per kind, one line per method."""
    for scope, s in p["summary"].items():
        if scope == "all":
            continue
        det = s["detection"]
        kinds = [k for k in det["anpred"] if k != "all" and len(det["anpred"][k]) > 1]
        if not kinds:
            continue
        fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.4), squeeze=False)
        for ax, k in zip(axes[0], kinds):
            mags = mag_order(k, det["anpred"][k])
            xs = np.arange(len(mags))
            for m in methods:
                ys = [det[m].get(k, {}).get(mg, {}).get("rate") for mg in mags]
                ax.plot(xs, [np.nan if y is None else y for y in ys], label=m, **styles[m])
            ax.set_xticks(xs, mags)
            ax.set_title(k)
            ax.set_xlabel(
                {
                    "round": "significand bits p (fewer = larger fault)",
                    "weight-ulp": "ULPs",
                    "approx-sigmoid": "blend weight",
                    "norm-epsilon": "epsilon factor",
                }.get(k, "magnitude")
            )
            ax.set_ylim(-0.05, 1.05)
        axes[0][0].set_ylabel("detection rate")
        axes[0][-1].legend(fontsize=7, loc="lower right")
        fig.suptitle(f"{scope}: detection rate vs magnitude")
        fig.tight_layout()
        fig.savefig(out / f"eval_detection_{scope}.png", dpi=90)
        plt.close(fig)


def _plot_detection_vs_size(p: dict, out: Path, plt, methods: list[str], styles: dict) -> None:
    """eval_detection_vs_size.png: detection rate vs the true injected nRMSE, pooled over models and kinds."""
    cfgs = [r for r in p["configs"] if r["kind"] and not r["skipped"] and r["injected_nrmse"]]
    if cfgs:
        edges = 10.0 ** np.arange(-9, 2)
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        sizes = np.array([r["injected_nrmse"] for r in cfgs])
        idx = np.digitize(sizes, edges)
        for m in methods:
            ys, xs = [], []
            for b in sorted(set(idx)):
                sel = [r for r, i in zip(cfgs, idx) if i == b]
                if not sel:
                    continue
                flag = [r["flagged"] if m == "anpred" else r["threshold"][m.split("@")[1]] for r in sel]
                xs.append(np.sqrt(edges[max(b - 1, 0)] * edges[min(b, len(edges) - 1)]))
                ys.append(np.mean(flag))
            ax.plot(xs, ys, label=m, **styles[m])
        ax.set_xscale("log")
        from anpred.defaults import OracleConfig

        fl = OracleConfig().floor_at("fp32", 0)
        ax.axvline(fl, color="r", lw=0.8, ls=":", label=f"oracle fp32 floor {fl:g} (stage 0)")
        ax.set_xlabel("true injected nRMSE at the injection stage (vs clean ort)")
        ax.set_ylabel("detection rate")
        ax.set_title("detection vs fault size (all models and kinds)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "eval_detection_vs_size.png", dpi=90)
        plt.close(fig)


def _plot_propagation(p: dict, out: Path, plt) -> None:
    """eval_propagation_<model>.png: nRMSE along the anchors of the clean run's backends (left) and of a
    few injected faults (right)."""
    for name, c in p["clean"].items():
        names = [a["name"] for a in c["anchors"]]
        fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
        ax = axes[0]
        for b, prof in c["profile"].items():
            ys = [np.nan if v is None or v <= 0 else v for v in prof]
            ax.plot(
                range(len(ys)),
                ys,
                marker="o",
                ms=3,
                label=b,
                lw=2 if b in ev.LOWP_BACKENDS else 1,
                ls="-" if b in ev.LOWP_BACKENDS else ":",
            )
        ax.set_yscale("log")
        ax.set_title(f"{name}: clean run, nRMSE vs consensus per anchor")
        ax.set_xticks(
            range(len(names)),
            [n.replace("anchor/", "").replace("output/", "out:")[:18] for n in names],
            rotation=70,
            fontsize=6,
        )
        ax.legend(fontsize=6)
        ax = axes[1]
        rs = [r for r in p["configs"] if r["model"] == name and r["kind"] and not r["skipped"] and r["flagged"]]
        pick = {}
        for r in rs:  # the largest magnitude of each kind at a few stages
            key = (r["kind"], r["stage"])
            if key not in pick or abs(r["magnitude"]) > abs(pick[key]["magnitude"]):
                pick[key] = r
        chosen = sorted(pick.values(), key=lambda r: (r["kind"], r["stage"]))[:: max(1, len(pick) // 8)][:8]
        for r in chosen:
            ys = [np.nan if v is None or v <= 0 else v for v in r["true_profile"]]
            ax.plot(range(len(ys)), ys, marker=".", label=f"{r['kind']}@{r['stage']} m={r['magnitude']:g}")
        ax.set_yscale("log")
        ax.set_title(f"{name}: injected faults, true nRMSE vs clean ort per anchor")
        ax.set_xticks(
            range(len(names)),
            [n.replace("anchor/", "").replace("output/", "out:")[:18] for n in names],
            rotation=70,
            fontsize=6,
        )
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / f"eval_propagation_{name}.png", dpi=90)
        plt.close(fig)
