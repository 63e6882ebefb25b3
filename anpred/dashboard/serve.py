"""Serving a dashboard site on the loopback interface only (``anpred dashboard --serve``): the
standard library's ``http.server`` over the *served root*: the common parent folder of the site and
the reports its page links (:func:`served_root`), so the relative links (``../run/report.html``)
resolve as they do from the disk; the site's ``index.html`` is the start page. Nothing outside the
root is served (a path that leaves it, through ``..`` or a symbolic link, is answered 404). Where the
only common parent is the file system's root, only the site folder is served (its reports outside
it are then not reachable through the server; open ``index.html`` from the disk)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path
from urllib.parse import quote, unquote

from anpred.errors import AnpredError

__all__ = ["make_server", "serve", "serve_in_thread", "served_root"]

HOST = "127.0.0.1"


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files under ``directory`` only: a path resolving outside it (a symbolic link) is not served."""

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def send_head(self):
        full = self.translate_path(self.path)  # drops ".." and drive parts: under directory by name
        root, real = os.path.realpath(self.directory), os.path.realpath(full)
        if real != root and not real.startswith(root + os.sep):  # a symbolic link out of the root
            self.send_error(404, "outside the served folder")
            return None
        return super().send_head()


def served_root(site: str | Path) -> Path:
    """The folder served for the site ``site``: the common parent of ``site`` and every report its
    page links (:func:`anpred.dashboard.site.read_data`; relative links only), or ``site`` itself when
    that parent is the file system's root or the page cannot be read."""
    from anpred.dashboard.site import read_data

    site = Path(site).resolve()
    try:
        data = read_data(site / "index.html")
    except AnpredError:
        return site
    links = [r[1] for r in data.get("runs", []) if r[1]]
    links += [c.get("report") for c in ((data.get("campaign") or {}).get("configs") or []) if c.get("report")]
    folders = [str((site / unquote(x)).resolve().parent) for x in links if "://" not in x and not x.startswith("file:")]
    root = Path(os.path.commonpath([str(site), *folders]))
    return site if root == Path(root.anchor) else root


def make_server(site: str | Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """An HTTP server for the site folder ``site`` (serving :func:`served_root`) bound to
    127.0.0.1:``port`` (0: a free port), not yet serving; returns ``(server, start URL)``.

    Raises:
        AnpredError: ``site`` is not a folder; the port cannot be bound (in use, not allowed).
    """
    site = Path(site)
    if not site.is_dir():
        raise AnpredError(f"{site}: no such site folder")
    root = served_root(site)
    handler = functools.partial(_Handler, directory=str(root))
    try:
        server = http.server.ThreadingHTTPServer((HOST, port), handler)
    except OSError as err:
        raise AnpredError(f"cannot serve on {HOST}:{port}: {err}") from err
    rel = site.resolve().relative_to(root).as_posix()
    path = "" if rel == "." else quote(rel) + "/"
    return server, f"http://{HOST}:{server.server_address[1]}/{path}index.html"


def serve(site: str | Path, port: int = 0, ready=None) -> None:
    """Serve ``site`` until interrupted (Ctrl-C: KeyboardInterrupt, handled by the CLI). ``ready``:
    called with the start URL once listening."""
    server, url = make_server(site, port)
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def serve_in_thread(site: str | Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` from a daemon thread; returns ``(server, start URL)`` (``server.shutdown()`` stops it)."""
    server, url = make_server(site, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, url
