"""`sweep resume` after the driver was killed with SIGKILL mid-sweep: the study and Tune agree again, nothing is lost
or run twice, no trial stays RUNNING, the budget is reached, and `budget.trials=N` extends the finished sweep.

The sweep runs as a real `sweep run` process (its own private Ray), killed from outside like a lost login node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from tests.orchestrate.conftest import sweep_file

pytestmark = [pytest.mark.slow, pytest.mark.fault]

TRIALS, STEPS = 6, 6
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def _sweep(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "klsweep.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _study(out: Path) -> optuna.Study:
    info = json.loads((out / "sweep.json").read_text())
    return optuna.load_study(study_name=info["study_name"], storage=info["storage"])


def _finished(out: Path) -> int:
    try:
        return sum(t.state in FINISHED for t in _study(out).trials)
    except Exception:  # study not created yet
        return 0


def _tune_trial_ids(out: Path) -> list[str]:
    """Ray Tune trial ids from the trial folders in the Tune directory (``run_trial_<id>_<n>_...``).

    Not from result.json or params.json: a trial that started and finished between two saves of the driver's state
    has only its checkpoints in the sweep directory after a SIGKILL (the driver had not synced the rest yet)."""
    return [folder.name.split("_")[2] for folder in (out / "tune").glob("run_trial_*") if folder.is_dir()]


def _alive(processes: dict[psutil.Process, str], timeout: float) -> list[str]:
    """Names of the processes still alive (zombies count as gone) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for process, name in processes.items():
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{process.pid} {name}")
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _check_consistent(out: Path, budget: int) -> None:
    study = _study(out)
    trials = study.trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    ray_ids = [t.user_attrs.get("ray_trial_id") for t in trials]
    assert None not in ray_ids and len(set(ray_ids)) == len(ray_ids)  # each Tune trial told once
    assert len(trials) == budget and all(t.state in FINISHED for t in trials)
    tune_ids = _tune_trial_ids(out)
    assert set(ray_ids) <= set(tune_ids)  # every study trial ran as a Tune trial
    # A trial in flight when the driver died, whose start the driver had not saved yet, is re-run by the resumed
    # sweep under a new Tune id (the study trial Optuna had proposed for it is adopted, so its params are re-used):
    # its folder stays behind, unfinished. There are at most max_concurrent of them, and none ran to the end.
    abandoned = set(tune_ids) - set(ray_ids)
    assert len(abandoned) <= 2
    for trial_id in abandoned:
        for result in (out / "tune").glob(f"run_trial_{trial_id}_*/result.json"):
            assert len(result.read_text().splitlines()) < STEPS


def test_resume_after_driver_sigkill(tmp_path):
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "crash", parameters={"kl_coef": {"distribution": "log_uniform", "min": 0.0005,
                                                                 "max": 0.005}},
                      budget={"trials": TRIALS, "max_steps": STEPS}, health="default")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 400
    while _finished(out) < 2:
        assert driver.poll() is None, f"the sweep ended before it could be killed:\n{driver.stdout.read()}"
        assert time.monotonic() < deadline, "two trials did not finish in time"
        time.sleep(0.5)
    ray_processes = {p: " ".join(p.cmdline()[:2]) for p in psutil.Process(driver.pid).children(recursive=True)}
    done_before = {t.user_attrs["ray_trial_id"]: (t.state, t.values) for t in _study(out).trials if t.state in FINISHED}
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # the driver's private Ray goes down with it: GCS, raylet and the trial workers within seconds
    core = {p: name for p, name in ray_processes.items() if "Agent" not in name}
    assert not _alive(core, timeout=10)

    # `sweep status` reads the crashed sweep without Ray: its counts are the study's
    status = _sweep("status", str(out))
    study = _study(out)
    running = sum(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)
    finished = sum(t.state in FINISHED for t in study.trials)
    assert status.returncode == 0, status.stderr
    assert (f"crash: {finished} finished, {running} running (or interrupted), {TRIALS - len(study.trials)} not started"
            in status.stdout)
    assert running > 0 and "sweep resume" in status.stdout

    resumed = _sweep("resume", str(out), "--quiet")
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr
    _check_consistent(out, TRIALS)
    after = {t.user_attrs["ray_trial_id"]: (t.state, t.values) for t in _study(out).trials}
    assert {k: after[k] for k in done_before} == done_before  # finished trials kept as they were, not re-run

    # Ray's DashboardAgent and RuntimeEnvAgent outlive their raylet by 40 s or more; by now (a resume later) they
    # must be gone too
    assert not _alive(ray_processes, timeout=30)

    extended = _sweep("resume", str(out), "budget.trials=8", "--quiet")
    assert extended.returncode in (0, 1), extended.stdout + extended.stderr
    _check_consistent(out, 8)
