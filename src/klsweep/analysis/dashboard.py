"""``sweep dashboard runs/<name>``: optuna-dashboard on the sweep's study storage, on 127.0.0.1 by default.

Trial user attributes (verl overrides, health verdict, stop reason, Ray trial id) show in the dashboard's trial view.
SQLite (the default storage) lets the dashboard read while a sweep writes. Before serving, the KL frontier figure
(:func:`klsweep.analysis.plots.frontier_figure`) is saved into the study with
``optuna_dashboard.save_plotly_graph_object`` (id :data:`FRONTIER_GRAPH_ID`, replaced at each start), so the
dashboard shows it next to its own plots.

The server is optuna-dashboard's WSGI app (``optuna_dashboard.wsgi``) on the standard library's ``wsgiref`` server.
``optuna_dashboard.run_server`` also uses that server, through bottle. Here the port is bound before the URL is
printed. A busy port (another dashboard, another study) is thus said, instead of printing a URL that serves something
else.
"""

from __future__ import annotations

import socket
import sys
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from optuna.exceptions import StorageInternalError
from optuna_dashboard import save_plotly_graph_object, wsgi
from sqlalchemy.exc import SQLAlchemyError

from klsweep._format import arg
from klsweep.analysis.frontier import sweep_frontier
from klsweep.analysis.plots import frontier_figure
from klsweep.analysis.study_file import StudyNotCreated
from klsweep.analysis.sweep_dir import storage_from_url, study_of
from klsweep.errors import KlsweepError
from klsweep.results import SweepRecord

#: The port tried when none is given (optuna-dashboard's own default).
DEFAULT_PORT = 8080
#: The id of the KL frontier among the study's custom plotly figures (a valid HTML id, as optuna-dashboard asks).
FRONTIER_GRAPH_ID = "klsweep-kl-frontier"


class _Server(WSGIServer):
    """``wsgiref``'s server, IPv6 when the host is an IPv6 address (``::1``)."""
    @classmethod
    def for_host(cls, host: str) -> type[WSGIServer]:
        return type("_Server6", (cls,), {"address_family": socket.AF_INET6}) if ":" in host else cls


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # one line per HTTP request would bury the URL
        pass


def serve(run_dir: str, *, host: str = "127.0.0.1", port: int | None = None) -> int:
    """Serve the dashboard until interrupted (Ctrl-C). Returns 0.

    Args:
        run_dir: the sweep directory.
        host: the address to bind (``127.0.0.1``: this machine only).
        port: the port to bind (0: any free one); ``None`` tries :data:`DEFAULT_PORT` and, when it is in use, any
            free port (said).

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory.
        KlsweepError: ``port`` was given and is in use (the message names a free one).
    """
    record = SweepRecord.read(run_dir)
    app = wsgi(storage_from_url(record.storage_url(run_dir)))
    server_class = _Server.for_host(host)
    try:
        server = make_server(host, DEFAULT_PORT if port is None else port, app, server_class=server_class,
                             handler_class=_QuietHandler)
    except OSError as e:
        if port is not None:
            raise KlsweepError(
                f"port {port} on {host} is in use ({e.strerror}): another dashboard or server holds it, and its URL "
                f"would not show this sweep. Pass a free port: --port {_free_port(host, server_class)}") from None
        server = make_server(host, 0, app, server_class=server_class, handler_class=_QuietHandler)
        print(f"port {DEFAULT_PORT} on {host} is in use ({e.strerror}): serving on the free port "
              f"{server.server_port} instead", file=sys.stderr)
    summary = save_frontier(run_dir, record)  # once the port is ours: a refused start writes nothing
    if summary is not None:
        print(summary, file=sys.stderr)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {host}: anyone who can reach this address can read the study", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"optuna-dashboard for study {record.study_name!r}: http://{shown}:{server.server_port}/dashboard/ "
          f"(Ctrl-C to stop)", flush=True)
    with server:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def save_frontier(run_dir: str, record: SweepRecord) -> str | None:
    """Save the sweep's KL frontier figure into its study (optuna-dashboard's custom plotly figures, id
    :data:`FRONTIER_GRAPH_ID`); a sweep that cannot be fitted yet gets the figure that says why.

    A study that cannot be written (a read-only study.db) keeps the figure it had, and a warning says so.

    Returns:
        The frontier's one-line summary, saying where the figure is when it was saved; ``None`` when the study does
        not exist yet (no trial started).
    """
    try:
        study = study_of(run_dir, record)
    except StudyNotCreated:
        return None
    result = sweep_frontier(run_dir)
    try:
        save_plotly_graph_object(study, frontier_figure(result, card=True), graph_object_id=FRONTIER_GRAPH_ID)
    except (StorageInternalError, SQLAlchemyError, OSError) as e:  # a read-only study.db: serve it as it is
        cause = str(getattr(e, "__cause__", None) or e).splitlines()[0][:120]
        print(f"warning: the KL frontier figure was not saved into the study ({cause}); a read-only study.db? The "
              f"dashboard shows the study without it: `sweep report {arg(run_dir)} --out DIR` draws it",
              file=sys.stderr)
        return result.summary()
    return f"{result.summary()} (the figure is in the dashboard's study page)"


def _free_port(host: str, server_class: type[WSGIServer]) -> int:
    """A port free on ``host`` right now (the kernel's pick)."""
    with socket.socket(server_class.address_family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
