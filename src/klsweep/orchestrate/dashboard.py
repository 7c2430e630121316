"""``sweep dashboard runs/<name>``: optuna-dashboard on the sweep's study storage, on 127.0.0.1 by default.

Trial user attributes (verl overrides, health verdict, stop reason, Ray trial id) show in the dashboard's trial view.
SQLite (the default storage) lets the dashboard read while a sweep writes.
"""

from __future__ import annotations

import sys


def serve(run_dir: str, *, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Serve the dashboard until interrupted. Returns 0.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory.
    """
    from optuna_dashboard import run_server

    from klsweep.analysis.load import storage_from_url
    from klsweep.results import SweepRecord

    record = SweepRecord.read(run_dir)
    storage = storage_from_url(record.storage_url(run_dir))
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {host}: anyone who can reach this address can read the study", file=sys.stderr)
    print(f"optuna-dashboard for study {record.study_name!r}: http://{host}:{port}/dashboard/ (Ctrl-C to stop)",
          flush=True)
    run_server(storage, host=host, port=port)
    return 0
