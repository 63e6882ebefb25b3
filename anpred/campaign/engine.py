"""Running a campaign on Ray: an embedded local Ray by default, an existing cluster with ``address``.

Tasks (Ray remote functions over :mod:`anpred.campaign.tasks`):

- one **prepare** task per configuration (1 CPU);
- one **run** task per (configuration, backend), with the backend's resources from the campaign
  file (``num_cpus``, ``memory``, ``num_gpus``; :data:`anpred.campaign.spec.DEFAULT_RESOURCES`),
  submitted when its configuration is prepared; the backend itself runs in its own worker process
  under the task (:func:`anpred.run.run_model`), so a backend crash is a status, not a lost task;
- one **judge** task per configuration when all its run tasks have ended.

Configurations in the default environment (no pinned runtime version) do not get one run task per
backend: once prepared they are queued, and each batch of them (``[campaign] batch``,
:func:`anpred.campaign.warm.batch_size`) is one **batch** task that runs them one after the other on
warm workers (:func:`anpred.campaign.warm.run_configurations`: a backend's process, imports and
converter stay up across the batch; a crash or timeout is still that backend's status on that
configuration, and the next configuration gets a fresh worker). Their judge tasks are the same.

Faults: every task has ``max_retries = campaign.retries`` (Ray re-executes a task whose worker
process died, was killed or whose node died); a step that still fails is reported with its reason
(``OUT/failed/<id>.json``, the summary), never blocks the other configurations, and keeps what it
finished: single-backend runs stay in ``OUT/.work/<id>/runs`` and a re-run uses them. An exception
raised by a step (a model that cannot be loaded) is not retried: it fails the same way again.

Resume: a configuration whose report folder ``OUT/configs/<id>`` holds its record
(:data:`anpred.campaign.tasks.CONFIG_FILE`) is complete and skipped; an interrupted campaign loses at
most the steps in flight. The history database gets one run per configuration (and so one verdict
row per configuration and backend), appended by this driver, once (:func:`anpred.report.history.has_run`).

Conversions are cached and shared by all tasks (``ANPRED_CACHE``, built once under a file lock,
:func:`anpred.cache.cached_dir`); on a cluster point ``ANPRED_CACHE`` and the output folder at a file
system every node mounts at the same path.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.campaign.spec import Campaign, Configuration
from anpred.campaign.tasks import CONFIG_FILE, judge_configuration, prepare_configuration, read_record, run_backend
from anpred.campaign.warm import WarmBatch, batch_resources, batch_size, batchable, run_configurations, warm_statuses
from anpred.errors import AnpredError
from anpred.run.driver import sigterm_raises

__all__ = ["run_campaign", "CampaignResult", "start_ray", "config_folder", "CONFIG_FILE"]


@dataclass
class CampaignResult:
    """What :func:`run_campaign` did.

    Attributes:
        out: the output folder; ``records``: one record per configuration (complete: the
            configuration's summary, :func:`anpred.campaign.tasks.record_of`; failed: ``state``
            ``failed``, ``step`` and ``reason``), in the campaign's order.
        ran, skipped: configuration ids run now / found complete; ``seconds``: wall time;
        ray: Ray's address and resources as seen by the driver.
    """

    out: Path
    records: list[dict[str, Any]]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ray: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("state") != "complete"]

    @property
    def exit_code(self) -> int:
        """0: every configuration complete and consistent; 1: one failed, flagged or incomplete."""
        return 0 if all(r.get("state") == "complete" and r.get("exit_code") == 0 for r in self.records) else 1


def start_ray(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Connect to Ray: ``address`` (``auto``, ``ray://host:port``, ``host:port``) or, without one, a new
    embedded local Ray with ``num_cpus`` (default: all cores), no dashboard, usage statistics off, also
    where a cluster started apart runs on this machine (``auto`` joins that one).
    Returns ``{"address", "resources"}``. Raises AnpredError when Ray cannot start or connect."""
    import ray

    import logging

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return {"address": "already initialized", "resources": ray.cluster_resources()}
    if address:
        _reachable(address)
    try:
        if address:
            ctx = ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        else:
            # address "local": a new embedded Ray even where a cluster started with `ray start` runs on this
            # machine (Ray's default, address None, joins that cluster and then refuses num_cpus)
            ctx = ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
    except Exception as err:  # noqa: BLE001 - Ray raises many kinds; the message says what
        hint = ""
        if address and os.environ.get("RAY_AUTH_MODE") != "token":
            hint = (
                " (a cluster started with `ray start` may require token authentication: set RAY_AUTH_MODE=token"
                " here as on the cluster, with its token in ~/.ray/auth_token or RAY_AUTH_TOKEN)"
            )
        raise AnpredError(f"cannot start Ray{' at ' + address if address else ''}: {err}{hint}") from err
    return {
        "address": getattr(ctx, "address_info", {}).get("address") or address or "local",
        "resources": ray.cluster_resources(),
    }


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) address must accept a TCP connection within
    ``timeout_s`` before Ray is asked to join it (Ray itself retries for minutes, deaf to Ctrl-C).
    ``auto`` is left to Ray. Raises AnpredError."""
    import socket

    hostport = address.split("://", 1)[-1]
    if address == "auto" or ":" not in hostport:
        return
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as err:
        raise AnpredError(
            f"cannot reach a Ray cluster at {address} ({err}); start one with `ray start --head` "
            "or leave --address out for an embedded local Ray (nothing was written)"
        ) from err


def _infeasible(res: dict[str, float]) -> str | None:
    """Why no node of the cluster can ever run a task asking ``res`` (cpus, memory_gb, gpus), or None."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    need = {"CPU": res.get("cpus", 1), "memory": res.get("memory_gb", 2) * 2**30, "GPU": res.get("gpus", 0)}
    if any(all(n.get(k, 0) >= v for k, v in need.items() if v) for n in nodes):
        return None
    best = max(nodes, key=lambda n: n.get("CPU", 0), default={})
    return (
        f"no node of the Ray cluster can run it: it asks {need['CPU']:g} CPU, {need['memory'] / 2**30:.1f} GiB "
        f"memory, {need['GPU']:g} GPU; the largest node has {best.get('CPU', 0):g} CPU, "
        f"{best.get('memory', 0) / 2**30:.1f} GiB, {best.get('GPU', 0):g} GPU ([resources] of the campaign file)"
    )


def _remote(fn, **opts):
    import ray

    return ray.remote(**opts)(fn)


def _reason(err: BaseException) -> str:
    """A one-paragraph reason: a step's own exception (its type and message) or why Ray lost it."""
    import ray.exceptions as rex

    if isinstance(err, rex.RayTaskError):
        cause = err.cause if getattr(err, "cause", None) is not None else err
        text = f"{type(cause).__name__}: {cause}"
    elif isinstance(
        err,
        (
            rex.WorkerCrashedError,
            rex.NodeDiedError,
            rex.OwnerDiedError,
            rex.ObjectLostError,
            rex.TaskCancelledError,
            rex.OutOfMemoryError,
        ),
    ):
        text = f"{type(err).__name__}: the task's process or node died and its retries ran out: {err}"
    else:
        text = f"{type(err).__name__}: {err}"
    return " ".join(text.split())[:600]


def _environments(campaign: Campaign, configs: list[Configuration]) -> dict[tuple[str, str], str | Exception]:
    """Every (package, version) the configurations need, prepared once here (installed or found)."""
    from anpred.campaign.envs import prepare_version

    out: dict[tuple[str, str], str | Exception] = {}
    for axis in campaign.axes:
        for v in axis.versions:
            if not any(c.versions.get(axis.package) == v for c in configs):
                continue
            try:
                out[(axis.package, v)] = str(
                    prepare_version(axis.package, v, find_links=axis.find_links, path=axis.paths.get(v))
                )
            except AnpredError as err:
                out[(axis.package, v)] = err
    return out


def _env_paths(campaign: Campaign, cfg: Configuration, backend: str, envs) -> list[str]:
    paths = []
    for axis in campaign.axis_for(backend):
        v = cfg.versions.get(axis.package)
        if v is not None:
            env = envs[(axis.package, v)]
            if isinstance(env, Exception):
                raise env
            paths.append(env)
    return paths


def run_campaign(
    campaign: Campaign,
    out: str | Path,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    progress: bool = True,
    only: list[str] | None = None,
    summary: bool = True,
) -> CampaignResult:
    """Run every configuration of ``campaign`` that is not complete in ``out`` (see the module
    docstring), append the verdicts to the history database and write the summary
    (:func:`anpred.campaign.summary.write_summary`).

    Args:
        out: the campaign's output folder (created); ``OUT/configs/<id>`` per configuration.
        address: a Ray cluster to join (None: an embedded local Ray, stopped at the end).
        num_cpus: CPUs of the embedded Ray (default: all).
        progress: a tqdm bar over the configurations and one line per finished step (stderr).
        only: configuration ids to consider (default all; bisection probes use it).
        summary: write the summary files (False: a bisection's probes leave OUT's summary alone).

    Raises:
        AnpredError: ``out`` is a file; Ray cannot start or the cluster cannot be reached (nothing
            written then). A failed step does not raise.
        Terminated: SIGTERM (Ctrl-C: KeyboardInterrupt) during the run; finished configurations
            stay, the embedded Ray is stopped, a re-run resumes.
    """
    from anpred.campaign.summary import write_summary

    t0 = time.perf_counter()
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise AnpredError(f"{out} exists and is not a folder")
    configs = [c for c in campaign.configurations if only is None or c.id in only]
    db = out / campaign.history if not Path(campaign.history).is_absolute() else Path(campaign.history)
    records, todo, skipped = _complete(configs, out, db)
    ray_info: dict[str, Any] = {}
    if todo:
        steps = _Steps(campaign, out, db, records, progress)
        ray_info = steps.run(todo, address=address, num_cpus=num_cpus, total=len(configs), done=len(skipped))
    ordered = [records[c.id] for c in configs if c.id in records]
    result = CampaignResult(
        out=out,
        records=ordered,
        ran=[c.id for c in todo],
        skipped=skipped,
        seconds=time.perf_counter() - t0,
        ray=ray_info,
    )
    if summary:
        write_summary(campaign, result, db)
    for pool in (out / ".work").glob(".pool-*"):  # left by a batch task whose process was killed (no task runs now)
        shutil.rmtree(pool, ignore_errors=True)
    if (out / ".work").is_dir() and not any((out / ".work").iterdir()):
        shutil.rmtree(out / ".work", ignore_errors=True)
    return result


def _complete(
    configs: list[Configuration], out: Path, db: Path
) -> tuple[dict[str, dict[str, Any]], list[Configuration], list[str]]:
    """``(records, todo, skipped)``: the records of the configurations complete in ``out`` (their
    verdicts appended to the history ``db`` once), the configurations to run, the ids skipped."""
    records: dict[str, dict[str, Any]] = {}
    todo: list[Configuration] = []
    skipped = []
    for c in configs:
        rec = read_record(out / "configs" / c.id)
        if rec is not None and rec.get("state") == "complete":
            records[c.id] = rec
            skipped.append(c.id)
            _append_history(db, out / "configs" / c.id)
        else:
            todo.append(c)
    return records, todo, skipped


class _Steps:
    """The steps of the configurations to run, each submitted to Ray once what it needs has ended:
    prepare, then one run per backend, then judge (module docstring). ``records`` gets each
    configuration's record as it completes or fails."""

    def __init__(
        self, campaign: Campaign, out: Path, db: Path, records: dict[str, dict[str, Any]], progress: bool
    ) -> None:
        self.campaign, self.out, self.db, self.records, self.progress = campaign, out, db, records, progress
        self.pending: dict[Any, tuple[str, Configuration, str | None]] = {}
        self.state: dict[str, dict[str, Any]] = {}
        self.envs: dict[tuple[str, str], str | Exception] = {}
        self.warm: set[str] = set()  # the configurations run in batches on warm workers
        self.queue: list[Configuration] = []  # prepared, waiting for their batch
        self.batch = 1

    def run(
        self, todo: list[Configuration], *, address: str | None, num_cpus: int | None, total: int, done: int
    ) -> dict[str, Any]:
        """Run ``todo`` on Ray (joined at ``address``, else an embedded one, stopped at the end) until
        every step has ended; ``total``, ``done``: the progress bar's configurations. Returns Ray's
        address and resources (:func:`start_ray`)."""
        import ray
        from tqdm import tqdm

        campaign, out = self.campaign, self.out
        own_ray = not ray.is_initialized() and not address
        ray_info = start_ray(address, num_cpus)  # before anything is written: a bad address loses nothing
        for sub in ("configs", ".work", "failed"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        restore = sigterm_raises(replace=True)  # instead of Ray's handler, which aborts
        self.paths = list(dict.fromkeys([os.getcwd(), str(campaign.base)]))
        retries = max(0, int(campaign.retries))
        self.prep_r = _remote(prepare_configuration, num_cpus=1, max_retries=retries)
        self.run_r = _remote(run_backend, max_retries=retries)
        self.judge_r = _remote(judge_configuration, num_cpus=1, max_retries=retries)
        self.batch_r = _remote(run_configurations, max_retries=retries)
        self._plan_batches(todo)
        self.meta = {"name": campaign.name, "file": str(campaign.path)}
        self.bar = tqdm(
            total=total,
            initial=done,
            desc=f"campaign {campaign.name}",
            unit="config",
            disable=not self.progress,
            leave=True,
        )
        try:
            self.envs = _environments(campaign, todo)
            for c in todo:
                self.state[c.id] = {"prep": None, "statuses": {}, "lost": {}}
                # a shared conversion that failed in an earlier invocation is attempted again in this one
                shutil.rmtree(out / ".work" / c.id / "shared", ignore_errors=True)
                self.pending[self.prep_r.remote(c, str(out / ".work" / c.id), self.paths)] = ("prepare", c, None)
            self._wait_all()
        finally:
            self.bar.close()
            restore()
            if own_ray:
                ray.shutdown()
        return ray_info

    def _wait_all(self) -> None:
        """Take each step as it ends and submit what it unblocks, until none is pending."""
        import ray

        while self.pending:
            ready, _ = ray.wait(list(self.pending), num_returns=1)
            ref = ready[0]
            step, cfg, backend = self.pending.pop(ref)
            try:
                value = ray.get(ref)
                err = None
            except Exception as e:  # noqa: BLE001 - any failure of a step is that step's result
                value, err = None, e
            if step == "batch":
                self._batch_ran(cfg, value, err)
            elif step == "judge":
                self._judged(cfg, value, err)
            elif step == "prepare" and err is not None:
                self._fail(cfg, "prepare", _reason(err))
            else:
                if step == "prepare" and cfg.id in self.warm:
                    self.state[cfg.id]["prep"] = value
                    self.queue.append(cfg)
                elif step == "prepare":
                    self._submit_runs(cfg, value)
                else:
                    self._ran(cfg, backend, value, err)
                self._judge_when_ran(cfg)
            self._flush()

    def _plan_batches(self, todo: list[Configuration]) -> None:
        """Which configurations of ``todo`` run in batches on warm workers (in the default environment,
        with resources a node has; ``[campaign] batch = 0``: none) and how many per batch."""
        import ray

        if self.campaign.batch == 0:
            return
        self.warm = {c.id for c in todo if batchable(c) and _infeasible(batch_resources([c])) is None}
        cpus = float(ray.cluster_resources().get("CPU", 1))
        task_cpus = batch_resources([c for c in todo if c.id in self.warm])["cpus"]
        self.batch = batch_size(self.campaign.batch, len(self.warm), cpus, task_cpus)

    def _flush(self) -> None:
        """Submit the queued configurations as batch tasks: each full batch, and what is left once no
        configuration is being prepared any more."""
        preparing = any(step == "prepare" for step, _, _ in self.pending.values())
        order = {c.id: i for i, c in enumerate(self.campaign.configurations)}
        self.queue.sort(key=lambda c: order.get(c.id, 0))  # a batch runs in the campaign's order
        while len(self.queue) >= self.batch or (self.queue and not preparing):
            cfgs, self.queue = self.queue[: self.batch], self.queue[self.batch :]
            res = batch_resources(cfgs)
            opts = {"num_cpus": res["cpus"], "memory": int(res["memory_gb"] * 2**30)}
            if res["gpus"]:
                opts["num_gpus"] = res["gpus"]
            wb = WarmBatch(
                out=str(self.out),
                timeout_s=self.campaign.timeout_s,
                paths=self.paths,
                memory_bound_gb=self.campaign.memory_bound_gb,
                name=cfgs[0].id,
            )
            r = self.batch_r.options(**opts).remote([(c, self.state[c.id]["prep"]) for c in cfgs], wb)
            self.pending[r] = ("batch", cfgs, None)

    def _batch_ran(self, cfgs: list[Configuration], value: Any, err: BaseException | None) -> None:
        """A batch task ended: each configuration's statuses go to its judge; a configuration whose run
        raised fails its run step; a batch task lost after its retries keeps the runs it committed
        (:func:`anpred.campaign.warm.warm_statuses`) and fails the others with Ray's reason."""
        for cfg in cfgs:
            res = (value or {}).get(cfg.id)
            if res is None:
                sts = warm_statuses(self.out / ".work" / cfg.id, cfg.backends)
                res = (
                    {"statuses": sts}
                    if sts is not None
                    else {"error": f"batch task of {', '.join(cfg.backends)}: {_reason(err) if err else 'no result'}"}
                )
            if "error" in res:
                self.state[cfg.id]["judging"] = True
                self._fail(cfg, "run", res["error"])
                continue
            self.state[cfg.id]["statuses"] = res["statuses"]
            self._judge_when_ran(cfg)

    def _fail(self, cfg: Configuration, step: str, reason: str) -> None:
        rec = {
            **cfg.to_dict(),
            "state": "failed",
            "step": step,
            "reason": reason,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        self.records[cfg.id] = rec
        _atomic_json(self.out / "failed" / f"{cfg.id}.json", rec)
        self.bar.update(1)
        if self.progress:
            self.bar.write(f"failed {cfg.id} ({step}): {reason[:200]}")

    def _submit_runs(self, cfg: Configuration, prep: Any) -> None:
        """The configuration is prepared (``prep``): one run task per backend, with its resources and
        environment; a backend that cannot get either is lost with the reason."""
        st = self.state[cfg.id]
        st["prep"] = prep
        for b in cfg.backends:
            try:
                envp = _env_paths(self.campaign, cfg, b, self.envs)
            except AnpredError as e:
                st["lost"][b] = f"environment: {e}"
                continue
            res = cfg.resources.get(b, {})
            why = _infeasible(res)
            if why is not None:  # Ray would wait for it forever
                st["lost"][b] = why
                continue
            opts = {"num_cpus": res.get("cpus", 1), "memory": int(res.get("memory_gb", 2) * 2**30)}
            if res.get("gpus"):
                opts["num_gpus"] = res["gpus"]
            r = self.run_r.options(**opts).remote(
                cfg,
                b,
                str(self.out / ".work" / cfg.id),
                prep,
                envp,
                self.campaign.timeout_s,
                self.paths,
                self.campaign.memory_bound_gb,
            )
            self.pending[r] = ("run", cfg, b)

    def _ran(self, cfg: Configuration, backend: str, value: Any, err: BaseException | None) -> None:
        st = self.state[cfg.id]
        if err is None:
            st["statuses"][backend] = value
        else:
            st["lost"][backend] = _reason(err)
            if self.progress:
                self.bar.write(f"lost {cfg.id} / {backend}: {st['lost'][backend][:200]}")

    def _judge_when_ran(self, cfg: Configuration) -> None:
        """Once every backend of the configuration has run or is lost: the judge task, or the
        configuration fails (a lost backend, every backend's shape error on one sample)."""
        st = self.state[cfg.id]
        if (
            st["prep"] is not None
            and len(st["statuses"]) + len(st["lost"]) == len(cfg.backends)
            and "judging" not in st
        ):
            st["judging"] = True
            if st["lost"]:  # a lost backend fails the configuration; finished runs are kept for a re-run
                self._fail(cfg, "run", "; ".join(f"{b}: {r}" for b, r in st["lost"].items()))
                return
            misfit = _inputs_misfit(st["statuses"])  # anpred test's rule, over all its backends
            if misfit:
                self._fail(cfg, "run", f"InputError: {misfit}")
                return
            r = self.judge_r.remote(
                cfg,
                str(self.out / ".work" / cfg.id),
                str(self.out / "configs" / cfg.id),
                st["prep"],
                st["statuses"],
                {},
                self.meta,
                self.paths,
            )
            self.pending[r] = ("judge", cfg, None)

    def _judged(self, cfg: Configuration, value: Any, err: BaseException | None) -> None:
        if err is not None:
            self._fail(cfg, "judge", _reason(err))
            return
        self.records[cfg.id] = value
        (self.out / "failed" / f"{cfg.id}.json").unlink(missing_ok=True)
        _append_history(self.db, self.out / "configs" / cfg.id)
        self.bar.update(1)


def _inputs_misfit(statuses: dict[str, dict[str, Any]]) -> str | None:
    """The bad-input rule of a run (:func:`anpred.run.outcome.inputs_misfit`) over the statuses of all
    the configuration's single-backend runs (backend -> status dict): one backend's shape error is
    that backend's failure, every backend's on the same sample is bad input."""
    from dataclasses import fields

    from anpred.backends.base import BackendStatus
    from anpred.run.outcome import inputs_misfit

    keys = {f.name for f in fields(BackendStatus)}  # (a task adds its own keys, e.g. task_seconds)
    return inputs_misfit(BackendStatus.from_dict({k: v for k, v in d.items() if k in keys}) for d in statuses.values())


def _atomic_json(path: Path, obj: Any) -> None:
    from anpred.onnx_io import atomic_write_text, to_json

    atomic_write_text(path, to_json(obj, indent=1))


def _append_history(db: Path, folder: Path) -> None:
    """Append the configuration's report to the history once (keyed by its run folder)."""
    from anpred.report.history import append, has_run
    from anpred.report.json import read_json

    try:
        report = read_json(folder / "report.json")
    except (OSError, json.JSONDecodeError, AnpredError):
        return
    # keyed by the run folder the report names (where it was judged; an OUT moved since keeps its key)
    if report.status != "error" and not has_run(db, str(report.run_dir)):
        append(db, report)


def config_folder(out: str | Path, cfg: Configuration) -> Path:
    """``OUT/configs/<id>`` (complete when it holds :data:`CONFIG_FILE`)."""
    return Path(out) / "configs" / cfg.id
