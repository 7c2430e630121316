"""One driver per sweep directory: while a driver holds the directory's lock, a second `sweep resume`, `sweep run
--resume` or `sweep run --overwrite` there is refused with one line naming the PID, exit 2, touching nothing; once the
driver is gone, SIGKILL included, the next one goes ahead.

The holder is a real second process taking the real lock (klsweep.orchestrate.driver_lock), as a running `sweep run`
does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import optuna
import pytest

from klsweep.cli import main
from klsweep.orchestrate.driver_lock import DRIVER_LOCK, driver_lock
from tests.orchestrate.conftest import started_sweep_dir, sweep_file

HOLDER = """
import sys, time
from pathlib import Path
from klsweep.orchestrate.driver_lock import driver_lock
with driver_lock(Path(sys.argv[1])):
    print("holding", flush=True)
    time.sleep(600)
"""


def _sweep_dir(tmp_path):
    """A sweep directory as `sweep run` leaves it before its first trial: sweep.json."""
    path = sweep_file(tmp_path, "locked", budget={"trials": 1, "max_concurrent": 1, "max_steps": 2})
    return path, started_sweep_dir(tmp_path, path)


def _holder(out) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def _files(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_second_driver_is_refused_while_the_first_runs(tmp_path, capsys):
    path, out = _sweep_dir(tmp_path)
    holder = _holder(out)
    try:
        before = _files(out)
        fix = (f"{out}: its sweep driver (PID {holder.pid}) still runs: a second driver would corrupt its results. "
               f"Wait for it to end, or stop it with `kill -INT {holder.pid}` (it saves and says how to continue), "
               "then run this again")
        for command in (["resume", str(out), "budget.trials=3"], ["run", path, "--out", str(out), "--resume"],
                        ["run", path, "--out", str(out), "--overwrite"]):
            assert main(command) == 2, command
            assert capsys.readouterr().err.strip().splitlines() == [f"sweep {command[0]}: error: {fix}"], command
            assert _files(out) == before, command  # no study, no Ray record, sweep.json as it was
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_drivers_lock_does_not_block(tmp_path):
    """SIGKILL leaves the PID in the file but the kernel drops the lock with the process: the next driver takes it
    and writes its own PID."""
    _, out = _sweep_dir(tmp_path)
    holder = _holder(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (out / DRIVER_LOCK).read_text() == f"{holder.pid}\n"  # the dead driver's PID is still written there
    with driver_lock(out):
        assert (out / DRIVER_LOCK).read_text() == f"{os.getpid()}\n"
    with driver_lock(out):  # released at the end of the block, for the next driver of this process
        pass


@pytest.mark.slow  # two real one-trial sweeps
def test_resume_goes_ahead_once_the_driver_was_killed(ray_local, tmp_path):
    path = sweep_file(tmp_path, "locked", budget={"trials": 1, "max_concurrent": 1, "max_steps": 2})
    out = tmp_path / "out"
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    holder = _holder(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert main(["resume", str(out), "budget.trials=2", "--quiet"]) == 0
    assert len((out / "trials.csv").read_text().splitlines()) == 3  # header and both trials


@pytest.mark.parametrize("other", ["runs", "ended"])
def test_a_driver_that_made_the_directory_first_wins_a_race_into_a_new_one(tmp_path, monkeypatch, other):
    """Two `sweep run`s started at the same moment into one new --out: both passed the check for a sweep there
    before either made the directory, and the second ran beside the first. The other driver is injected during
    this one's preflight (the slow part): it holds the directory's lock, or it has ended and left its sweep."""
    import klsweep.orchestrate.sweep as sweep_module
    from klsweep.errors import ResultsError
    from klsweep.orchestrate.sweep import run_sweep

    path = sweep_file(tmp_path, "race", budget={"trials": 1, "max_concurrent": 1, "max_steps": 2})
    out = tmp_path / "out"
    started = {}

    def the_other_driver_starts(sweep, address):
        if other == "runs":
            out.mkdir()
            started["holder"] = _holder(out)
        else:
            started_sweep_dir(tmp_path, path)  # tmp_path/out with the other driver's sweep.json

    monkeypatch.setattr(sweep_module, "_preflight", the_other_driver_starts)
    try:
        with pytest.raises(ResultsError) as refused:
            run_sweep(path, [], out=str(out), quiet=True)
    finally:
        if "holder" in started:
            started["holder"].kill()
            started["holder"].wait()
    expected = (f"its sweep driver (PID {started['holder'].pid}) still runs" if other == "runs"
                else "already holds a sweep: pass --resume")
    assert expected in str(refused.value)
    assert sorted(p.name for p in out.iterdir()) == ([DRIVER_LOCK] if other == "runs" else [DRIVER_LOCK, "sweep.json"])


def test_a_file_a_reader_makes_in_the_new_directory_does_not_refuse_its_driver(tmp_path, monkeypatch):
    """A notebook or script polling `optuna.load_study(storage="sqlite:///OUT/study.db")` creates study.db the moment
    the driver has made OUT; the driver's check for a racing driver then refused its own new directory ("holds files
    but no klsweep sweep"). Only a sweep left there refuses it."""
    import klsweep.orchestrate.sweep as sweep_module
    from klsweep.errors import ClusterError
    from klsweep.orchestrate.sweep import run_sweep

    path = sweep_file(tmp_path, "reader", budget={"trials": 1, "max_concurrent": 1, "max_steps": 2})
    out = tmp_path / "out"
    prepare = sweep_module._prepare_out

    def made_then_read(directory, *, overwrite):
        prepare(directory, overwrite=overwrite)
        optuna.storages.RDBStorage(f"sqlite:///{directory / 'study.db'}")  # what load_study does first

    def past_the_checks(sweep, address, out_dir):
        raise ClusterError("past the checks")

    monkeypatch.setattr(sweep_module, "_prepare_out", made_then_read)
    monkeypatch.setattr(sweep_module, "_init_ray", past_the_checks)
    with pytest.raises(ClusterError, match="past the checks"):
        run_sweep(path, [], out=str(out), quiet=True)
