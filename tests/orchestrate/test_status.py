"""`sweep status` from the moment `sweep run` wrote sweep.json: before the study exists, with only running trials."""

from __future__ import annotations

import optuna

from klsweep.cli import main
from klsweep.results import SweepRecord, default_storage
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import sweep_file


def _started(tmp_path):
    """A results directory as `sweep run` leaves it before its first trial: sweep.json only."""
    path = sweep_file(tmp_path, budget={"trials": 3})
    sweep = load_sweep(path)
    out = tmp_path / "out"
    out.mkdir()
    SweepRecord(name=sweep.name, sweep_file=path, study_name=sweep.name, storage=default_storage(),
                objectives=[o.model_dump() for o in sweep.objectives], sweep=sweep.model_dump(mode="json")).write(out)
    return out, sweep


def test_status_before_the_study_exists_and_with_only_running_trials(tmp_path, capsys):
    out, sweep = _started(tmp_path)
    assert main(["status", str(out)]) == 0
    printed = capsys.readouterr()
    assert "tiny: 0 finished, 0 running (or interrupted), 3 not started" in printed.out
    assert "no trial has finished yet" in printed.out and "Traceback" not in printed.err
    assert main(["report", str(out)]) == 2  # nothing to report yet, said in one line
    assert "the study 'tiny' holds no trial yet; nothing to report" in capsys.readouterr().err

    study = optuna.create_study(study_name=sweep.name, storage=f"sqlite:///{out / 'study.db'}", direction="maximize")
    study.ask().suggest_float("x", 0, 1)  # the first trial, running
    assert main(["status", str(out)]) == 0
    printed = capsys.readouterr()
    assert "tiny: 0 finished, 1 running (or interrupted), 2 not started" in printed.out
    assert "no trial has finished yet" in printed.out and "Traceback" not in printed.err
