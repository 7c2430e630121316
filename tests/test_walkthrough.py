"""A first day with klsweep, scripted: write a sweep, validate it, run it, look at it with `sweep status` while it
runs, Ctrl-C it, resume it, report on it, move its directory and report again. Every command runs as a user runs it
(a real `sweep` process from the working directory, its output to a pipe), and none prints a traceback.

The sweep is a tiny PPO sweep on the embedded trainer: 3 trials of 40 steps, one at a time, validated and
checkpointed every 2 steps. Ctrl-C comes once a trial has validated at step 4 (its step-2 checkpoint is then in the
driver's hands), 36 steps before that trial could end."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import optuna
import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.fault]

STEPS, TRIALS = 40, 3
VAL = "val-core/arith/acc/mean@1"
SWEEP = {
    "name": "walk",
    "algorithm": "ppo",
    "overrides": {"algorithm.kl_ctrl.type": "fixed", "data.train_batch_size": 4,
                  "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "critic.ppo_mini_batch_size": 4,
                  "actor_rollout_ref.rollout.n": 2, "trainer.test_freq": 2},
    "parameters": {"kl_coef": {"values": [0.001, 0.002, 0.004]}},
    "objective": {"metric": VAL, "mode": "max"},
    "sampler": "random",
    "budget": {"trials": TRIALS, "max_concurrent": 1, "max_steps": STEPS},
}
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "80"}  # COLUMNS: a terminal's width, not a pipe's


def sweep(cwd, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`sweep ARGS` from ``cwd``; no traceback, whatever its exit code."""
    done = subprocess.run([sys.executable, "-m", "klsweep.cli", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def study(run_dir) -> optuna.Study:
    return optuna.load_study(study_name="walk", storage=f"sqlite:///{run_dir / 'study.db'}")


def reported_steps(run_dir, opened: dict) -> list[int]:
    """Steps at which the study holds a validation score of its running trial (the driver told Optuna).

    The study is loaded once, into ``opened``, and read again on each call: loading it on every poll takes long
    enough on a loaded machine for a trial of 40 steps (a few seconds) to start and end unseen."""
    if "study" not in opened:
        if not (run_dir / "study.db").is_file():  # opening it first would create it: the driver then finds its new
            return []                             # directory holding a file it did not write, and refuses it
        try:
            opened["study"] = study(run_dir)
        except Exception:  # study.db or the study not created yet
            return []
    trials = opened["study"].get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return sorted(step for t in trials for step in t.intermediate_values)


def counts(run_dir) -> str:
    """The counts line `sweep status` prints, from the study."""
    states = [t.state for t in study(run_dir).trials]
    finished = sum(s.is_finished() for s in states)
    running = states.count(optuna.trial.TrialState.RUNNING)
    return (f"walk: {finished} finished, {running} running (or interrupted), {TRIALS - len(states)} not started "
            f"(budget {TRIALS} trials × {STEPS} steps)")


def between(line: str, before: str, after: str) -> bool:
    """Whether a counts line is a state of the study from `before` to `after`: as many finished trials as in one of
    them or a number in between, and all TRIALS accounted for."""
    pattern = re.compile(r"walk: (\d+) finished, (\d+) running \(or interrupted\), (\d+) not started "
                         rf"\(budget {TRIALS} trials × {STEPS} steps\)")
    got, low, high = (pattern.fullmatch(text) for text in (line, before, after))
    if not (got and low and high):
        return False
    finished, running, waiting = (int(g) for g in got.groups())
    return int(low[1]) <= finished <= int(high[1]) and finished + running + waiting == TRIALS


def wait_for_step(driver, run_dir, step: int, opened: dict) -> None:
    deadline = time.monotonic() + 300
    while not [s for s in reported_steps(run_dir, opened) if s >= step]:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, f"no trial reached step {step}"
        time.sleep(0.02)


def test_first_day(tmp_path):
    (tmp_path / "walk.yaml").write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    assert sweep(tmp_path, "validate", "walk.yaml").returncode == 0

    run_dir = tmp_path / "runs" / "walk"
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", "walk.yaml"], cwd=tmp_path, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    opened: dict = {}  # the study, loaded once the driver has created it
    status = None
    try:
        wait_for_step(driver, run_dir, 2, opened)
        before = counts(run_dir)
        # `sweep status` from a second terminal while the sweep runs; on a loaded machine it takes longer than a
        # trial of 40 steps, so the Ctrl-C below does not wait for it
        status = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "status", "runs/walk"], cwd=tmp_path, env=ENV,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_step(driver, run_dir, 4, opened)  # the driver has taken the running trial's step-2 checkpoint
        os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole process group
        stdout, stderr = driver.communicate(timeout=300)
        status_out, status_err = status.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        if status is not None and status.poll() is None:
            status.kill()
            status.wait()
    after = counts(run_dir)
    assert status.returncode == 0 and "Traceback" not in status_out + status_err, status_out + status_err
    lines = status_out.splitlines()
    # the study as it was at some moment of the call: between `before` and `after`, possibly in between them
    # (a trial just finished and the next not yet asked: "1 finished, 0 running, 2 not started")
    assert between(lines[0], before, after), (lines[0], before, after)
    header = next(line for line in lines if line.startswith("trial"))
    assert [c.strip() for c in header.split("┃")][:3] == ["trial", "state", "kl_coef"]
    if " 1 running" in lines[0]:
        assert "if its `sweep run` is no longer running, continue it with: sweep resume runs/walk" in lines
    assert (run_dir / "trials.csv").is_file()  # kept current while the sweep runs

    assert driver.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert stdout.splitlines()[-1] == "continue with: sweep resume runs/walk"
    (interrupted,) = study(run_dir).get_trials(states=(optuna.trial.TrialState.RUNNING,))
    trial_id = interrupted.user_attrs["ray_trial_id"]

    resumed = sweep(tmp_path, "resume", "runs/walk", timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "reported value is ignored" not in resumed.stderr
    trials = study(run_dir).trials
    assert len(trials) == TRIALS and all(t.state.is_finished() for t in trials)
    assert trials[interrupted.number].user_attrs["ray_trial_id"] == trial_id  # the same trial, ...
    (result,) = (run_dir / "tune").glob(f"run_trial_{trial_id}_*/result.json")
    rows = [json.loads(line) for line in result.read_text().splitlines()]
    restarted = [row for row in rows if row["iterations_since_restore"] == 1]
    assert len(restarted) == 2 and restarted[1]["step"] >= 3  # ... continued from a checkpoint, not from step 1
    assert rows[-1]["step"] == STEPS

    assert sweep(tmp_path, "report", "runs/walk").returncode == 0
    assert (run_dir / "report" / "report.html").is_file()

    (tmp_path / "moved").mkdir()
    shutil.move(run_dir, tmp_path / "moved" / "walk")  # as rsync to a laptop would
    (tmp_path / "moved" / "walk" / "report" / "report.html").unlink()
    assert sweep(tmp_path, "report", "moved/walk").returncode == 0
    assert (tmp_path / "moved" / "walk" / "report" / "report.html").is_file()
    status = sweep(tmp_path, "status", "moved/walk")
    assert status.returncode == 0
    assert f"walk: {TRIALS} finished, 0 running (or interrupted), 0 not started" in status.stdout
