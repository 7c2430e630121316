"""A resume keeps its word: the sweep it is given is compared with the saved one; a larger budget is applied and
said, a changed search space or trial config is refused with the fix (optuna/optuna#2564: a study whose search space
changed under it misleads its sampler)."""

from __future__ import annotations

import json

import optuna
import pytest

from klsweep.cli import main
from klsweep.errors import ResultsError
from klsweep.orchestrate.resume_changes import check_resume, sweep_changes
from klsweep.results import ATTR_CONFIRM_OF, SweepRecord
from tests.orchestrate.conftest import started_sweep_dir, sweep_file

SAVED = {"name": "s", "budget": {"trials": 3, "max_steps": 15}, "parameters": {"kl_coef": {"values": [1, 2]}},
         "wandb": {"mode": "disabled"}}


def test_a_larger_budget_is_applied_and_said():
    given = {**SAVED, "budget": {"trials": 8, "max_steps": 15}, "wandb": {"mode": "offline"}}
    assert check_resume(SAVED, given, run_dir="runs/s", source="b.yaml") == [
        "budget.trials: 3 → 8", "wandb.mode: 'disabled' → 'offline'"]
    assert check_resume(SAVED, SAVED, run_dir="runs/s", source="a.yaml") == []


def test_a_confirmation_phase_added_to_a_finished_sweep_is_applied_and_said():
    saved = {**SAVED, "budget": {**SAVED["budget"], "confirm": None}}
    given = {**SAVED, "budget": {**SAVED["budget"], "confirm": {"top": 2, "seeds": 3, "preset": True}}}
    assert check_resume(saved, given, run_dir="runs/s", source="b.yaml") == [
        "budget.confirm.preset: (unset) → True", "budget.confirm.seeds: (unset) → 3", "budget.confirm.top: (unset) → 2"]


def test_a_changed_search_space_or_trial_is_refused_with_each_difference_and_the_fix():
    given = {**SAVED, "budget": {"trials": 8, "max_steps": 20}, "parameters": {"kl_coef": {"values": [1, 2, 3]}}}
    with pytest.raises(ResultsError) as e:
        check_resume(SAVED, given, run_dir="runs/s", source="b.yaml")
    message = str(e.value)
    assert "runs/s holds a sweep whose trials differ from those of b.yaml" in message
    assert "  budget.max_steps: 15 → 20\n" in message and "  parameters.kl_coef.values: [1, 2] → [1, 2, 3]\n" in message
    assert "budget.trials" not in message.split("only")[0]  # a budget change alone would have been applied
    assert "--out DIR" in message and "--overwrite" in message


def test_a_budget_below_the_trials_the_study_holds_is_refused(tmp_path):
    out = started_sweep_dir(tmp_path, sweep_file(tmp_path, "held", budget={"trials": 8}))
    saved = SweepRecord.read(out).sweep

    def budget(trials: int) -> dict:
        return {**saved, "budget": {**saved["budget"], "trials": trials}}

    # no study yet (the driver ended before the first trial): any budget
    assert check_resume(saved, budget(1), run_dir=str(out), source="the command line") == ["budget.trials: 8 → 1"]

    study = optuna.create_study(study_name="held", storage=f"sqlite:///{out / 'study.db'}", direction="maximize")
    for value in (0.1, 0.2, 0.3):
        study.add_trial(optuna.trial.create_trial(value=value))
    study.add_trial(optuna.trial.create_trial(value=0.3, user_attrs={ATTR_CONFIRM_OF: 2}))  # not a search trial
    study.enqueue_trial({})  # WAITING: still to run, not held
    with pytest.raises(ResultsError) as e:
        check_resume(saved, budget(2), run_dir=str(out), source="the command line")
    assert str(e.value) == (f"{out}: its study already holds 3 trials, so budget.trials must be at least 3 (given 2); "
                            "give budget.trials=3 or more")
    assert check_resume(saved, budget(3), run_dir=str(out), source="the command line") == ["budget.trials: 8 → 3"]
    assert check_resume(saved, budget(5), run_dir=str(out), source="the command line") == ["budget.trials: 8 → 5"]
    assert check_resume(saved, budget(9), run_dir=str(out), source="the command line") == ["budget.trials: 8 → 9"]


def test_fields_only_one_side_has_are_named():
    assert sweep_changes({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == {"a.c": (None, 2)}


@pytest.mark.slow
def test_sweep_run_resume_with_an_edited_file(ray_local, tmp_path, capsys):
    out = tmp_path / "out"
    budget = {"trials": 2, "max_concurrent": 1, "max_steps": 2}
    first = sweep_file(tmp_path, "edit", budget=budget, parameters={"kl_coef": {"values": [0.001, 0.002]}})
    assert main(["run", first, "--out", str(out), "--quiet"]) in (0, 1)
    saved = (out / "sweep.json").read_text()
    capsys.readouterr()

    # a category added and more trials: refused, nothing run, nothing rewritten
    (tmp_path / "b").mkdir()
    edited = sweep_file(tmp_path / "b", "edit", budget={**budget, "trials": 4},
                        parameters={"kl_coef": {"values": [0.001, 0.002, 0.003]}})
    assert main(["run", edited, "--out", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "parameters.kl_coef.values: [0.001, 0.002] → [0.001, 0.002, 0.003]" in err and "--out DIR" in err
    assert "Traceback" not in err
    assert (out / "sweep.json").read_text() == saved
    info = json.loads(saved)
    assert len(optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}").trials) == 2

    # only a larger budget: applied, and said
    (tmp_path / "c").mkdir()
    more = sweep_file(tmp_path / "c", "edit", budget={**budget, "trials": 3},
                      parameters={"kl_coef": {"values": [0.001, 0.002]}})
    assert main(["run", more, "--out", str(out), "--resume", "--quiet"]) in (0, 1)
    assert "resume: budget.trials: 2 → 3" in capsys.readouterr().err
    assert len(optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}").trials) == 3
    assert json.loads((out / "sweep.json").read_text())["sweep_file"] == more

    # a budget below the trials the study holds: refused on one line, before anything changes
    saved = (out / "sweep.json").read_text()
    assert main(["resume", str(out), "budget.trials=2", "--quiet"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    assert errors == [f"sweep resume: error: {out}: its study already holds 3 trials, so budget.trials must be at "
                      "least 3 (given 2); give budget.trials=3 or more"]
    assert (out / "sweep.json").read_text() == saved

    # the saved file edited in place, then `sweep resume`: the edit is seen, not ignored
    path = tmp_path / "c" / "edit.yaml"
    path.write_text(path.read_text().replace("max_steps: 2", "max_steps: 3"))
    assert main(["resume", str(out), "--quiet"]) == 2
    assert "budget.max_steps: 2 → 3" in capsys.readouterr().err

    # the results directory moved: its study.db is found where it is now, in the study and in Tune's saved searcher
    path.write_text(path.read_text().replace("max_steps: 3", "max_steps: 2"))
    moved = tmp_path / "moved"
    out.rename(moved)
    assert main(["resume", str(moved), "budget.trials=4", "--quiet"]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err
    assert len(optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{moved / 'study.db'}").trials) == 4
