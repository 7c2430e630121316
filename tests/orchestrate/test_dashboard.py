"""`sweep dashboard`: optuna-dashboard on a real sweep's study, bound to 127.0.0.1, read through its HTTP API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import psutil
import pytest

from klsweep.cli import _parser

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_host_defaults_to_loopback():
    assert _parser().parse_args(["dashboard", "runs/x"]).host == "127.0.0.1"


def test_dashboard_serves_the_study_on_loopback(pareto_run):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "dashboard", str(pareto_run), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        studies = _get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
        assert [(s["study_name"], s["directions"]) for s in studies] == [("pareto", ["maximize", "minimize"])]
        listening = [c.laddr for c in psutil.Process(server.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" and addr.port == port for addr in listening)

        detail = _get(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}")
        study = optuna.load_study(study_name="pareto", storage=f"sqlite:///{pareto_run / 'study.db'}")
        served = {t["number"]: {a["key"]: a["value"] for a in t["user_attrs"]} for t in detail["trials"]}
        assert sorted(served) == [t.number for t in study.trials]
        for trial in study.trials:
            attrs = served[trial.number]
            assert json.loads(attrs["verl_overrides"]) == json.loads(trial.user_attrs["verl_overrides"])
            assert attrs["health"] == trial.user_attrs["health"]
            assert attrs["stop_reason"] == trial.user_attrs["stop_reason"]
        assert {attrs["health"] for attrs in served.values()} == {"healthy", "stopped"}
        stopped = next(a for a in served.values() if a["health"] == "stopped")
        assert "beta_high" in stopped["stop_reason"]
        assert json.loads(stopped["verl_overrides"])["algorithm.kl_ctrl.kl_coef"] == 0.05
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert f"http://127.0.0.1:{port}/dashboard/" in server.stdout.read()
