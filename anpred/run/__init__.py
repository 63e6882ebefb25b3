"""The RUN step: execute an anchored model on several backends, each in its own process, and store
what every backend saw in a run folder.

- :mod:`anpred.run.spec`: what a run is asked to do (:class:`BackendSpec`, the worker's job);
- :mod:`anpred.run.driver`: :func:`run_model` (one worker process per backend, timeouts, signals,
  the partial-folder commit, the summary table);
- :mod:`anpred.run.pool`: :class:`WorkerPool`, long-lived workers that serve a stream of runs
  (:mod:`anpred.run.warm`: across models);
- :mod:`anpred.run.jobs`: a worker's job file and environment, the pre-run coverage refusals;
- :mod:`anpred.run.limits`: what guards a run (:class:`RunGuards`: memory bounds held by an RSS
  watchdog, the bad-input rule, the shared-conversion folder);
- :mod:`anpred.run.outcome`: how a backend's run ended, in words (a crash named as a crash of the
  library), the bad-input rule, the summary table;
- :mod:`anpred.run.worker`: the backend worker process (``python -m anpred.run.worker``);
- :mod:`anpred.run.model`: the anchored model and its manifest, copied into the run;
- :mod:`anpred.run.streaming`: streaming statistics of ``stats``-mode runs;
- :mod:`anpred.run.store`: :class:`RunStore`, the run folder (its on-disk contract as a tree).

Array files are read and written by :mod:`anpred.tensorfile` (below this package and the backends).
The worker module is not imported here (``python -m anpred.run.worker`` runs it as ``__main__``).
"""

from anpred.run.driver import WORKER_MALLOC_TUNABLES, Terminated, format_summary, run_model, worker_malloc_tunables
from anpred.run.limits import RunGuards
from anpred.run.model import copy_model, load_anchored
from anpred.run.pool import WorkerPool
from anpred.run.spec import FAULTS, MODES, BackendSpec, RunSettings, WorkerJob
from anpred.run.store import SCHEMA, RunStore
from anpred.run.streaming import STATS_SCHEMA, StreamingStats, read_stats, sample_summary

__all__ = [
    "run_model",
    "Terminated",
    "format_summary",
    "WORKER_MALLOC_TUNABLES",
    "worker_malloc_tunables",
    "WorkerPool",
    "RunGuards",
    "copy_model",
    "load_anchored",
    "FAULTS",
    "MODES",
    "BackendSpec",
    "RunSettings",
    "WorkerJob",
    "SCHEMA",
    "RunStore",
    "STATS_SCHEMA",
    "StreamingStats",
    "read_stats",
    "sample_summary",
]
