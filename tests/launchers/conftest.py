"""Fixtures of the launcher tests: the stand-in trainer process and process-table checks (psutil, independent of
the supervisor's own /proc reader)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import psutil
import pytest

from klsweep.trainers import TRAINERS, TrainerKind

HERE = Path(__file__).resolve().parent

#: ``tests/launchers/fake_trainer.py`` as a process trainer (``python -m fake_trainer`` with HERE on PYTHONPATH).
FAKE = TrainerKind("fake", "a scripted trainer for the launcher tests", module="fake_trainer", in_process=None)


@pytest.fixture
def fake_trainer(monkeypatch):
    """Registers ``tests/launchers/fake_trainer.py`` as trainer ``fake`` (``python -m fake_trainer``)."""
    monkeypatch.setitem(TRAINERS, "fake", FAKE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    return "fake"


@pytest.fixture
def verl_standin(monkeypatch):
    """``tests/launchers/fake_trainer.py`` as trainer ``verl``: its trials get every verl key klsweep sets
    (``trainer.save_freq``, ``trainer.default_local_dir``, ``+ray_kwargs.ray_init.address``, ...)."""
    monkeypatch.setitem(TRAINERS, "verl", dataclasses.replace(TRAINERS["verl"], module=FAKE.module))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    return "verl"


def ran(trial_dir: Path) -> list[Path]:
    """The attempt directories of a stand-in trial that logged a step (a line in ``metrics.jsonl``), oldest first.

    On a loaded host a trial's own Ray may time out starting: the launcher starts it again as a new attempt
    (``RAY_STARTS``, klsweep.launchers.process), and the attempt that timed out logged nothing."""
    attempts = sorted(trial_dir.glob("attempt-*"), key=lambda p: int(p.name.removeprefix("attempt-")))
    return [a for a in attempts if (a / "metrics.jsonl").is_file() and (a / "metrics.jsonl").stat().st_size]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree_of(run_dir: Path) -> set[int]:
    """Every pid of an attempt's tree: the supervisor, all its descendants, and the fake trainer's own list."""
    info = json.loads((run_dir / "supervisor.json").read_text())
    pids = {info["supervisor_pid"], info["pid"]}
    pids |= {p.pid for p in psutil.Process(info["supervisor_pid"]).children(recursive=True)}
    tree_file = run_dir / "tree.json"
    if tree_file.exists():
        pids |= set(json.loads(tree_file.read_text()).values())
    return pids


def seconds_until_gone(pids: set[int], timeout: float = 15.0) -> float:
    """Seconds until none of ``pids`` is alive; fails the test, naming the survivors, after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not any(alive(p) for p in pids):
            return time.monotonic() - start
        time.sleep(0.05)
    survivors = {p: psutil.Process(p).cmdline() for p in pids if alive(p)}
    raise AssertionError(f"processes survived {timeout} s: {survivors}")


def wait_for(path: Path, timeout: float = 30.0) -> None:
    start = time.monotonic()
    while not path.exists():
        assert time.monotonic() - start < timeout, f"{path} never appeared"
        time.sleep(0.05)
