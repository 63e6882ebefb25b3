"""Serving a dashboard site on the loopback interface only (``anpred dashboard --serve``): the
standard library's ``http.server`` over the site folder. Reports linked outside the site folder
(``../``) are not reachable through the server; open ``index.html`` from the disk for those, or
write the site beside the reports (a campaign's ``OUT``)."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

from anpred.errors import AnpredError

__all__ = ["make_server", "serve"]

HOST = "127.0.0.1"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


def make_server(site: str | Path, port: int = 0) -> http.server.ThreadingHTTPServer:
    """An HTTP server for the folder ``site`` bound to 127.0.0.1:``port`` (0: a free port; the
    bound one is ``server.server_address[1]``), not yet serving.

    Raises:
        AnpredError: ``site`` is not a folder; the port cannot be bound (in use, not allowed).
    """
    root = Path(site)
    if not root.is_dir():
        raise AnpredError(f"{root}: no such site folder")
    handler = functools.partial(_Quiet, directory=str(root.absolute()))
    try:
        return http.server.ThreadingHTTPServer((HOST, port), handler)
    except OSError as err:
        raise AnpredError(f"cannot serve on {HOST}:{port}: {err}") from err


def serve(site: str | Path, port: int = 0, ready=None) -> None:
    """Serve ``site`` until interrupted (Ctrl-C: KeyboardInterrupt, handled by the CLI). ``ready``:
    called with the URL once listening."""
    server = make_server(site, port)
    url = f"http://{HOST}:{server.server_address[1]}/index.html"
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def serve_in_thread(site: str | Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` from a daemon thread; returns ``(server, url)`` (``server.shutdown()`` stops it)."""
    server = make_server(site, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{HOST}:{server.server_address[1]}/index.html"
