"""A private local Ray whose start times out (its raylet does not register with the GCS within Ray's 30 s, as on an
overloaded machine) is ended and started again: the sweep runs, with a warning, and the first start's daemons are
gone. The test makes the first start time out for real: it stops (SIGSTOP) the first raylet the driver spawns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.launchers.conftest import alive
from tests.orchestrate.conftest import sweep_file

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _stop_first_raylet(driver: subprocess.Popen, stopped: list[int]) -> None:
    """SIGSTOP the first process named ``raylet`` under ``driver``, as soon as it appears."""
    deadline = time.monotonic() + 120
    while driver.poll() is None and time.monotonic() < deadline:
        try:
            children = psutil.Process(driver.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for child in children:
            try:
                if child.name() == "raylet":
                    child.send_signal(signal.SIGSTOP)
                    stopped.append(child.pid)
                    return
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.001)


def test_a_local_ray_start_that_timed_out_is_ended_and_started_again(tmp_path):
    out = tmp_path / "out"
    path = sweep_file(tmp_path, budget={"trials": 1, "max_concurrent": 1, "max_steps": 2})
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env={**os.environ, "RAY_AUTH_MODE": "disabled"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    stopped: list[int] = []
    watcher = threading.Thread(target=_stop_first_raylet, args=(driver, stopped))
    watcher.start()
    try:
        stdout, stderr = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        watcher.join()
    assert len(stopped) == 1, "no raylet was seen"
    assert driver.returncode == 0, (stdout + stderr)[-3000:]
    assert "Ray's local node did not start within Ray's 30 s" in stderr and "starting it again" in stderr
    assert "Traceback" not in stderr
    assert not alive(stopped[0])  # the stopped raylet was ended with its start
    assert (out / "trials.csv").read_text().count("\n") == 2  # the header and the one trial
