"""The dashboard over a history database (``anpred dashboard``, docs/dashboard.md): a static,
self-contained site (one ``index.html``), a grid of models x backends, each cell the latest verdict
with a sparkline of its trend, regressions marked, every cell linked to its report.

- :mod:`anpred.dashboard.data`: what is shown, read from the history (:func:`collect`), and the
  regression rule;
- :mod:`anpred.dashboard.site`: the page (:func:`write_site`), with ``static/app.js`` and
  ``static/style.css`` inlined;
- :mod:`anpred.dashboard.serve`: serving a site on the loopback interface (``--serve``).

    from anpred.dashboard import build
    build(["history.sqlite"], "site/")   # site/index.html
"""

from __future__ import annotations

from pathlib import Path

from anpred.dashboard.data import History, collect
from anpred.dashboard.site import SiteOptions, write_site

__all__ = ["build", "collect", "write_site", "History", "SiteOptions"]


def build(
    dbs: list[str | Path],
    out: str | Path,
    *,
    margin: float | None = None,
    campaign: str | None = None,
    opts: SiteOptions | None = None,
) -> Path:
    """:func:`collect` the databases ``dbs`` and :func:`write_site` to ``out``; returns the page's path.
    ``margin``: task-metric drop that counts as a regression (default
    :data:`anpred.report.history.DEFAULT_MARGIN`); ``campaign``: only that campaign's runs.

    Raises:
        AnpredError: a database is missing or unreadable; no campaign ``campaign`` there; ``out``
            cannot be written.
    """
    from anpred.report.history import DEFAULT_MARGIN

    hist = collect(
        list(dict.fromkeys(str(d) for d in dbs)), margin=DEFAULT_MARGIN if margin is None else margin, campaign=campaign
    )
    return write_site(hist, out, opts)
