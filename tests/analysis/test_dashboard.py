"""`sweep dashboard`: optuna-dashboard on a real sweep's study, bound to 127.0.0.1, read through its HTTP API; a busy
port is said (and, when no port was given, a free one is used) instead of printing a URL that serves something
else."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import psutil
import pytest

from klsweep.analysis.dashboard import DEFAULT_PORT
from klsweep.cli import _parser
from klsweep.results import SweepRecord, default_storage
from tests.orchestrate import conftest as orchestrate_conftest

pytestmark = pytest.mark.slow
#: The finished real sweep the dashboard serves (the fixture of tests/orchestrate/conftest.py).
pareto_run = orchestrate_conftest.pareto_run


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
        # the dashboard marks the health-stopped trial infeasible: it read no constraint Trial.set_constraint wrote
        assert {t["number"]: t["constraints"] for t in detail["trials"]} == {
            t.number: [1.0 if t.user_attrs["health"] == "stopped" else -1.0] for t in study.trials}
        assert json.loads(stopped["verl_overrides"])["algorithm.kl_ctrl.kl_coef"] == 0.05
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert f"http://127.0.0.1:{port}/dashboard/" in server.stdout.read()


def _one_trial_sweep(tmp_path):
    """A sweep directory whose study holds one finished trial (a real Optuna study, no Ray)."""
    out = tmp_path / "out"
    out.mkdir()
    SweepRecord(name="busy", sweep_file=str(tmp_path / "busy.yaml"), study_name="busy", storage=default_storage(),
                objectives=[{"metric": "val-core/arith/acc/mean@1", "mode": "max"}], sweep={}).write(out)
    optuna.create_study(study_name="busy", storage=f"sqlite:///{out / 'study.db'}",
                        direction="maximize").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    return out


def _listening(host: str, port: int) -> socket.socket:
    holder = socket.socket()
    holder.bind((host, port))
    holder.listen()
    return holder


def test_a_busy_port_given_is_refused_with_a_free_one_named(tmp_path):
    out = _one_trial_sweep(tmp_path)
    with _listening("127.0.0.1", 0) as holder:  # another server on the port asked for
        port = holder.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "klsweep.cli", "dashboard", str(out), "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "http://" not in run.stdout + run.stderr  # no URL of a server that is not ours
    assert f"port {port} on 127.0.0.1 is in use" in run.stderr
    free = int(run.stderr.rsplit("--port ", 1)[1].split()[0])
    with _listening("127.0.0.1", free):  # the port it names was free
        pass
    from optuna_dashboard._custom_plot_data import list_graph_object_ids

    study = optuna.load_study(study_name="busy", storage=f"sqlite:///{out / 'study.db'}")
    attrs = study._storage.get_study_system_attrs(study._study_id)  # where optuna-dashboard keeps its figures
    assert list_graph_object_ids(attrs) == []  # a refused start writes nothing into the study


def test_the_default_port_busy_serves_on_a_free_one_and_says_so(tmp_path):
    out = _one_trial_sweep(tmp_path)
    try:
        holder = _listening("127.0.0.1", DEFAULT_PORT)
    except OSError:  # something on this machine holds it already: busy either way
        holder = None
    server = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "dashboard", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        assert port != DEFAULT_PORT and line.startswith("optuna-dashboard for study 'busy'")
        studies = _get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["busy"]
        listening = [c.laddr for c in psutil.Process(server.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
        assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", port)]
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
        stderr = server.communicate(timeout=30)[1]
        if holder is not None:
            holder.close()
    assert server.returncode == 0 and "Traceback" not in stderr, stderr
    assert f"port {DEFAULT_PORT} on 127.0.0.1 is in use" in stderr and f"serving on the free port {port}" in stderr


def test_dashboard_serves_the_kl_frontier_figure(tmp_path):
    """The KL frontier is saved into the study before serving and read back through optuna-dashboard's HTTP API."""
    from klsweep.analysis.dashboard import FRONTIER_GRAPH_ID
    from klsweep.analysis.frontier import sweep_frontier
    from tests.analysis.conftest import FRONTIER_OBJECTIVES, frontier_specs, make_sweep

    # the Gao RL law alpha 1, beta 0.5 over 0.2 (tests/analysis/conftest.py): KL* = e**2 = 7.39 nats/sequence
    out = make_sweep(tmp_path / "frontier", frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 9.0], stopped={5: 3.0}),
                     objectives=FRONTIER_OBJECTIVES)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "dashboard", str(out), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        [summary] = _get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
        detail = _get(f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}")
    finally:
        server.terminate()
        stderr = server.communicate(timeout=30)[1]
    [graph] = [g for g in detail["plotly_graph_objects"] if g["id"] == FRONTIER_GRAPH_ID]
    figure = json.loads(graph["graph_object"])
    markers = {t["name"]: (t["x"], t["y"]) for t in figure["data"] if t.get("mode") == "markers"}
    assert markers["feasible trials (5)"][0] == [1.0, 4.0, 9.0, 16.0, 25.0]
    assert markers["stopped or failed, not fitted (1)"] == ([9.0], [3.0])
    assert markers["fitted peak"][0][0] == pytest.approx(2.718281828 ** 2, rel=1e-6)
    line = sweep_frontier(out, n_boot=20).summary()
    assert line.startswith("KL frontier (Gao RL form, 5 trials): KL* = 7.39 nats/sequence")
    assert line in stderr
    # made for the dashboard's card, a 450 px high div (optuna-dashboard's bundle.js, `user-defined-plot`): the
    # notes on hover, the legend under the plot, the x axis titled; it was 520 px, its axis cut off and its legend
    # over the plot
    layout = figure["layout"]
    [notes] = [a for a in layout["annotations"] if a.get("hovertext")]
    assert line in notes["hovertext"].replace("<br>", " ")
    assert layout["height"] == 450 and "subtitle" not in layout["title"]
    assert layout["legend"]["orientation"] == "h" and layout["legend"]["y"] < 0
    assert layout["xaxis"]["title"]["text"] == "per-sequence KL to the reference policy (nats)"
