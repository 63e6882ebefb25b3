"""Version bisection: the first release of a runtime package where a model's verdict changes.

Given a campaign, a model (its label), a backend, a package and two versions ``good`` and ``bad``
whose standings of that backend differ, :func:`bisect_versions` orders the candidate versions
between them (the given list, else ``pip index versions PACKAGE``; ordered by
``packaging.version``), and binary-searches for the first version whose standing differs from
``good``'s: each probe is a configuration of the campaign (the model's first configuration that
holds the backend, with ``package`` at the probed version for the backends of that package's
``[[versions]]`` entry, else for ``backend`` alone), run, recorded and resumable like any other
(``OUT/configs``). The standing compared is the verdict word of the backend (``ok``, ``FLAGGED
s<stage>``, a run failure: :func:`anpred.campaign.summary.cell_text` without its task headline).
A search over n candidates runs about log2(n) + 2 configurations (the two ends, then the halvings);
the first deviating version is then run once more with the drill-down (log2(n) + 3 in all), so the result names the
stage and the operator (for fp32 ONNX backends).

The result (``OUT/bisect.json``): ``first_bad``, ``last_good``, their standings, the probes in
order, ``origin_stage``/``origin_anchor`` and ``culprit`` (node, op_type) at ``first_bad``. A
version that cannot be run (not installable, a failed step) is skipped (``probes[i]["skipped"]``,
the reason), never taken for the change. The probes do not touch OUT's campaign summary.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from anpred.errors import AnpredError

__all__ = ["bisect_versions", "BisectRequest", "available_versions", "format_bisection", "order_versions"]


def available_versions(package: str, timeout_s: float = 120) -> list[str]:
    """The releases of ``package`` on the package index (``pip index versions``), oldest first.
    Raises AnpredError when pip cannot list them (no network, unknown package)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise AnpredError(f"cannot list the versions of {package}: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return order_versions([v.strip() for v in m.group(1).split(",")])


def order_versions(versions: list[str]) -> list[str]:
    """``versions`` sorted by PEP 440 order (``packaging.version``), duplicates removed.
    Raises AnpredError on a text that is not a version."""
    from packaging.version import InvalidVersion, Version

    try:
        return sorted(dict.fromkeys(versions), key=Version)
    except InvalidVersion as err:
        raise AnpredError(f"not a version: {err}") from err


def _probe_campaign(campaign, base_cfg, package: str, backends: list[str], versions: list[str], axis_src):
    """A campaign of one configuration per version (``base_cfg`` with ``package`` at that version)."""
    from anpred.campaign.spec import Configuration, VersionAxis, config_id

    axis = VersionAxis(
        package=package,
        versions=list(versions),
        backends=backends,
        find_links=getattr(axis_src, "find_links", None),
        paths=getattr(axis_src, "paths", {}) or {},
    )
    configs = []
    for v in versions:
        versions_map = {**{k: x for k, x in base_cfg.versions.items() if k != package}, package: v}
        # the campaign's own id for the same test (model content, options, versions): a probe reuses a
        # configuration the campaign finished, and an edited model is probed anew
        cid = config_id(
            base_cfg.label,
            base_cfg.backend_set,
            base_cfg.inputs_name,
            base_cfg.model_key or base_cfg.model,
            base_cfg.backends,
            base_cfg.options,
            versions_map,
            campaign.base,
        )
        configs.append(
            Configuration(
                id=cid,
                model=base_cfg.model,
                label=base_cfg.label,
                backend_set=base_cfg.backend_set,
                backends=base_cfg.backends,
                inputs_name=base_cfg.inputs_name,
                options=dict(base_cfg.options),
                versions=versions_map,
                resources=base_cfg.resources,
                model_key=base_cfg.model_key,
            )
        )
    return dataclasses.replace(
        campaign, configurations=configs, axes=[a for a in campaign.axes if a.package != package] + [axis]
    )


@dataclasses.dataclass(frozen=True)
class BisectRequest:
    """What a bisection looks for: the first version of ``package`` in (``good``, ``bad``] where
    ``backend``'s standing on the campaign's model ``model`` (its label) differs from its standing at
    ``good``.

    versions: the candidate versions (default: :func:`available_versions`; ``good`` and ``bad`` are
    added); drill: run the first deviating version once more with the drill-down (stage and operator).
    """

    package: str
    model: str
    backend: str
    good: str
    bad: str
    versions: list[str] | None = None
    drill: bool = True


def bisect_versions(
    campaign,
    out: str | Path,
    request: BisectRequest,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Find the first version of ``request.package`` in (``good``, ``bad``] where ``request.backend``'s
    standing on ``request.model`` differs from its standing at ``good`` (see the module docstring).

    Args:
        campaign: a loaded campaign (:func:`anpred.campaign.load_campaign`); ``out``: its output folder.
        request: the package, the model label, one of that configuration's backends, ``good`` before
            ``bad`` in version order, the candidates and whether to drill (:class:`BisectRequest`).
        address, num_cpus: the Ray cluster (:func:`anpred.campaign.engine.start_ray`); progress: print it.

    Returns:
        ``{"package", "model", "backend", "candidates", "probes": [{"version", "standing", "id"}],
        "first_bad", "last_good", "standing_good", "standing_bad", "origin_stage", "origin_anchor",
        "culprit", "note"}``; ``first_bad`` is None when ``good`` and ``bad`` stand the same.

    Raises:
        AnpredError: an unknown model label or a backend not in its configurations; ``good`` not
            before ``bad``; the candidate versions cannot be listed.
    """
    import ray

    from anpred.campaign.engine import run_campaign, start_ray
    from anpred.campaign.summary import cell_text

    package, model, backend, good, bad = request.package, request.model, request.backend, request.good, request.bad
    drill = request.drill
    base, cands = _candidates(campaign, request)
    axis_src = next((a for a in campaign.axes if a.package == package), None)
    backends = list(axis_src.backends) if axis_src else [backend]
    if backend not in backends:
        backends.append(backend)
    probe = _probe_campaign(campaign, base, package, backends, cands, axis_src)
    by_version = {c.versions[package]: c for c in probe.configurations}
    own = not ray.is_initialized() and not address
    start_ray(address, num_cpus)
    probes: list[dict[str, Any]] = []
    cache: dict[str, str] = {}

    def standing(v: str) -> str | None:
        """The backend's standing at ``v``; None when the configuration could not be run (the
        release cannot be installed, a step failed): such a version is skipped, never taken for a
        change (``git bisect skip``)."""
        if v not in cache:
            cfg = by_version[v]
            res = run_campaign(probe, out, only=[cfg.id], progress=progress, summary=False)
            rec = res.records[0] if res.records else {}
            if rec.get("state") != "complete":
                cache[v] = None
                probes.append(
                    {
                        "version": v,
                        "standing": None,
                        "id": cfg.id,
                        "skipped": f"{rec.get('step')}: {str(rec.get('reason', ''))[:300]}",
                    }
                )
            else:
                cache[v] = cell_text(rec["backends"].get(backend)).split(" | ")[0]
                probes.append({"version": v, "standing": cache[v], "id": cfg.id})
        return cache[v]

    result: dict[str, Any] = {
        "package": package,
        "model": model,
        "backend": backend,
        "candidates": cands,
        "probes": probes,
        "first_bad": None,
        "last_good": None,
        "origin_stage": None,
        "origin_anchor": None,
        "culprit": None,
        "note": "",
    }
    try:
        s_good, s_bad = standing(good), standing(bad)
        result.update(standing_good=s_good, standing_bad=s_bad)
        if s_good is None or s_bad is None:
            result["note"] = (
                f"{good if s_good is None else bad} could not be run "
                f"({next(p['skipped'] for p in probes if p['standing'] is None)}): nothing to bisect"
            )
        elif s_good == s_bad:
            result["note"] = f"{backend} stands the same at {good} and {bad} ({s_good}): nothing to bisect"
        else:
            last_good, first_bad = _first_change(cands, standing, s_good)
            result.update(first_bad=first_bad, last_good=last_good, standing_first_bad=standing(first_bad))
            skipped = [p["version"] for p in probes if p["standing"] is None]
            if skipped:
                result["note"] = (
                    f"skipped (could not be run): {', '.join(skipped)}; the change lies between "
                    f"{last_good} and {first_bad}"
                )
            result.update(_where(probe, out, by_version[first_bad], backend, drill, progress))
    finally:
        if own:
            ray.shutdown()
    _save(campaign, out, result)
    return result


def _save(campaign, out: str | Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``out/bisect.json`` and record it in the campaign's history database."""
    from anpred.onnx_io import atomic_write_text, to_json
    from anpred.report.history import record_bisection  # the dashboard shows the first bad version

    atomic_write_text(Path(out) / "bisect.json", to_json(result, indent=1))
    db = Path(campaign.history) if Path(campaign.history).is_absolute() else Path(out) / campaign.history
    record_bisection(db, result, campaign.name, out)


def _candidates(campaign, request: BisectRequest) -> tuple[Any, list[str]]:
    """``(base configuration, candidate versions)``: the campaign's configuration of ``request.model``
    holding ``request.backend``, and the versions from ``good`` to ``bad`` in version order (the given
    ones, else those the package index lists).

    Raises:
        AnpredError: no such configuration; ``good`` not before ``bad``; the versions cannot be listed.
    """
    package, model, backend, good, bad = request.package, request.model, request.backend, request.good, request.bad
    versions = request.versions
    base = next((c for c in campaign.configurations if c.label == model and backend in c.backends), None)
    if base is None:
        labels = sorted({c.label for c in campaign.configurations})
        raise AnpredError(
            f"no configuration of model {model!r} holds backend {backend!r} (models: {', '.join(labels)})"
        )
    cands = order_versions(list(versions) + [good, bad] if versions else available_versions(package) + [good, bad])
    if cands.index(good) >= cands.index(bad):
        raise AnpredError(f"--good {good} must come before --bad {bad} in version order")
    return base, cands[cands.index(good) : cands.index(bad) + 1]


def _first_change(cands: list[str], standing, s_good: str) -> tuple[str, str]:
    """``(last good, first bad)``: the binary search over the candidate versions ``cands`` (the first
    stands ``s_good``, the last does not) for the first whose ``standing(version)`` differs from
    ``s_good``; a version that cannot be run (standing None) is skipped."""
    live = list(cands)  # standing(live[lo]) == s_good, standing(live[hi]) != s_good
    lo, hi = 0, len(live) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        s_mid = standing(live[mid])
        if s_mid is None:  # skipped: the search goes on without it
            del live[mid]
            hi -= 1
        elif s_mid == s_good:
            lo = mid
        else:
            hi = mid
    return live[lo], live[hi]


def _where(probe, out, cfg, backend: str, drill: bool, progress: bool) -> dict[str, Any]:
    """Origin stage/anchor and culprit operator of ``backend`` at the first deviating version (run
    once more with the drill-down when ``drill`` and the probe did not drill)."""
    from anpred.campaign.engine import run_campaign

    if drill and not cfg.options.get("drill"):
        cfg = dataclasses.replace(cfg, id=cfg.id + ".drill", options={**cfg.options, "drill": True})
        probe = dataclasses.replace(probe, configurations=[cfg])
    res = run_campaign(probe, out, only=[cfg.id], progress=progress, summary=False)
    rec = res.records[0] if res.records else {}
    row = (rec.get("backends") if rec.get("state") == "complete" else None) or {}
    row = row.get(backend) or {}
    culprit = {"node": row.get("culprit"), "op_type": row.get("culprit_op")} if row.get("culprit") else None
    return {
        "origin_stage": row.get("origin_stage"),
        "origin_anchor": row.get("origin_anchor"),
        "culprit": culprit,
        "report": rec.get("report_html"),
    }


def format_bisection(res: dict[str, Any]) -> str:
    """The bisection's probes and its conclusion, as lines of text."""
    lines = [
        f"bisect {res['package']} for {res['model']} / {res['backend']}: "
        f"{len(res['candidates'])} candidate versions, {len(res['probes'])} probed"
    ]
    lines += [
        f"  {p['version']:<12} {p['standing'] or 'skipped: ' + p.get('skipped', '')[:150]}" for p in res["probes"]
    ]
    if res.get("first_bad"):
        where = (
            f" at stage {res['origin_stage']} ({res['origin_anchor']})" if res.get("origin_stage") is not None else ""
        )
        op = f", operator {res['culprit']['node']} ({res['culprit']['op_type']})" if res.get("culprit") else ""
        lines.append(
            f"first version where {res['backend']} changes: {res['package']} {res['first_bad']} "
            f"(last as before: {res['last_good']}): {res.get('standing_first_bad')}{where}{op}"
        )
        if res.get("note"):
            lines.append(res["note"])
    else:
        lines.append(res.get("note") or "no change found")
    return "\n".join(lines)
