"""Ctrl-C during `sweep run`: a real `sweep run` process gets SIGINT the way a terminal sends it (to its whole
process group: the driver and its private Ray) while its first trial runs. It says it was interrupted, what finished
and what to run to continue, keeps the study resumable, writes trials.csv, exits 130 and prints no traceback.
SIGTERM to the driver alone (SLURM's time limit or preemption, a deleted Kubernetes pod, `timeout`, `kill PID`) ends
it the same way with exit status 143; Ray's driver would otherwise print an abseil stack dump and save nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest

from tests.orchestrate.conftest import sweep_file

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _running_trials(out) -> int:
    try:
        study = optuna.load_study(study_name="intr", storage=f"sqlite:///{out / 'study.db'}")
    except Exception:  # study.db or the study not created yet
        return 0
    return sum(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)


def _tracebacks(output: str) -> list[str]:
    """The tracebacks in a driver's output, but Tune's own log of a failed background sync of its experiment state
    (``wait_for_sync`` in ray/tune/execution/experiment_state.py, Ray 2.60: logged, not raised; the next save syncs
    again). Seen once, at load 10+, when the interrupt's last save overlapped the sync before it."""
    blocks = output.split("Traceback (most recent call last):")[1:]
    return [block for block in blocks if "in wait_for_sync" not in block]


@pytest.mark.parametrize(("signum", "said", "status"),
                         [(signal.SIGINT, "Ctrl-C", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_ctrl_c_or_sigterm_during_the_first_trial(tmp_path, signum, said, status):
    out = tmp_path / "out"
    # 5000 steps: the first trial cannot end before the SIGINT reaches it
    path = sweep_file(tmp_path, "intr", parameters={"kl_coef": {"values": [0.001, 0.002]}},
                      budget={"trials": 3, "max_concurrent": 1, "max_steps": 5000})
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out)],
                              env={**os.environ, "RAY_AUTH_MODE": "disabled"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _running_trials(out):
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "the first trial did not start"
            time.sleep(0.2)
        if signum == signal.SIGINT:
            os.killpg(driver.pid, signal.SIGINT)
        else:
            driver.send_signal(signal.SIGTERM)
        stdout, stderr = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()

    assert driver.returncode == status, stdout + stderr
    assert not _tracebacks(stdout + stderr) and "SIGTERM received" not in stderr
    study = optuna.load_study(study_name="intr", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING]  # left for `sweep resume`
    lines = stdout.splitlines()
    assert f"interrupted ({said}): intr: 0 finished, 1 running (or interrupted), 2 not started " \
           "(budget 3 trials × 5000 steps)" in lines
    assert lines[-1] == f"continue with: sweep resume {out}"
    assert "no trial completed healthy" not in stdout
    trials = pd.read_csv(out / "trials.csv")
    assert list(trials["state"]) == ["RUNNING"] and list(trials["number"]) == [0]


def test_ctrl_c_twice_as_the_sweep_ends_leaves_no_ray_process_and_no_traceback(tmp_path):
    """Ray's own exit hook shut its Ray down after the sweep's last line; a Ctrl-C then (a late one, or the second of
    two) interrupted it: a traceback from ``ray.shutdown``, and Ray's agents left running. The sweep had finished, so
    its exit status stays 0."""
    from tests.orchestrate.test_resume import _alive, _session_processes

    out = tmp_path / "out"
    path = sweep_file(tmp_path, "late", parameters={"kl_coef": {"values": [0.001]}},
                      budget={"trials": 1, "max_concurrent": 1, "max_steps": 2})
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out)],
                              env={**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "1000"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in driver.stdout:  # the summary's last line: the sweep is done, its Ray about to shut down
            if line.startswith("results:"):
                break
        session = _session_processes(json.loads((out / "ray_session.json").read_text())["session_dir"])
        driver.send_signal(signal.SIGINT)
        time.sleep(0.3)
        if driver.poll() is None:
            driver.send_signal(signal.SIGINT)
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, stderr
    assert not _tracebacks(stdout + stderr), stderr
    assert session and not _alive(session, timeout=20)
