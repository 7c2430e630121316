"""A remedied trial that the same rule flags again at (or before) the step its remedy answered: ``on_same_finding``
repeats the remedy (as before), stops the trial, or escalates (the prescription applied twice); and the sweep's
rules with a remedy."""

from __future__ import annotations

import json

import optuna
import pandas as pd
import pytest
from pydantic import ValidationError

from klsweep.cli import main
from klsweep.health import Rule
from klsweep.health.verdict import StopReason
from klsweep.launchers.resume import KL_COEFF_METRIC
from klsweep.orchestrate.remedy import (
    REMEDIES,
    REMEDY_SAVE_FREQ,
    Remedy,
    checkpoint_every,
    prescribe,
    remedies_on,
    remedy_rules,
    restart_reach,
    same_finding,
)
from klsweep.orchestrate.remedy_tune import KeepRestartPoints, RemedyScheduler
from klsweep.results import ATTR_RESCUED_VALUES, STEP, TOTAL_STEPS
from klsweep.spec import load_sweep
from klsweep.trainers.restore import KL_COEF_KEY
from tests.orchestrate.conftest import sweep_file

#: β (the fixed in-reward KL coefficient, as logged) above 0.01 from step 4 on: a trial at β 0.05 is flagged at step
#: 4; halved from the checkpoint of step 3 it is at 0.025, still above, and flagged again at step 4.
BETA_HALVED = {"name": "beta_high", "metric": "actor/reward_kl_penalty_coeff", "above": 0.01, "after": 3,
               "action": "stop", "kind": "diverged", "advice": "lower kl_coef", "remedy": {"kl_coef": "*0.5"},
               "max_remedies": 3}


def _rule(**fields) -> Rule:
    return Rule.model_validate({**BETA_HALVED, **fields})


def _record(restart: int, step: int, rule: str = "beta_high") -> dict:
    return {"restart": restart, "step": step, "rule": rule, "from_step": step - 10, "key": KL_COEF_KEY, "old": 0.1,
            "new": 0.05}


def test_a_same_finding_is_the_same_rule_at_or_before_the_step_its_last_remedy_answered():
    assert same_finding([], "beta_high", 30) is None
    assert same_finding([_record(1, 30)], "beta_high", 30) == 30
    assert same_finding([_record(1, 30)], "beta_high", 26) == 30  # earlier still: the dose changed nothing either
    assert same_finding([_record(1, 30)], "beta_high", 31) is None  # later: the remedy moved the finding
    assert same_finding([_record(1, 30)], "kl_runaway", 30) is None  # another rule's finding
    # the last restart decides: beta_high at 50 after its restart, then kl_runaway's restart at 40
    assert same_finding([_record(1, 50), _record(2, 40, "kl_runaway")], "beta_high", 45) is None
    assert same_finding([_record(2, 40, "kl_runaway"), _record(1, 50)], "kl_runaway", 40) == 40  # by restart number


def test_on_same_finding_is_validated_with_the_rule():
    assert _rule().on_same_finding == "repeat"
    with pytest.raises(ValidationError, match="Input should be 'repeat', 'stop' or 'escalate'"):
        _rule(on_same_finding="halt")
    with pytest.raises(ValidationError, match="sets on_same_finding: stop but has no remedy.*Add a remedy"):
        _rule(remedy={}, on_same_finding="stop")
    with pytest.raises(ValidationError, match=r"remedy only sets values \(kl_coef: '=0.005'\).*on_same_finding: stop"):
        _rule(remedy={"kl_coef": "=0.005"}, on_same_finding="escalate")
    mixed = _rule(remedy={"kl_coef": "=0.005", "actor_rollout_ref.actor.optim.lr": "*0.5"}, on_same_finding="escalate")
    assert mixed.on_same_finding == "escalate"  # the learning rate escalates


def test_escalating_applies_each_operation_twice():
    rule = _rule(remedy={"kl_coef": "*4", "actor_rollout_ref.actor.ppo_epochs": "+1",
                         "actor_rollout_ref.actor.optim.lr": "=0.0001"})
    overrides = {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "fixed", KL_COEF_KEY: 0.002,
                 "actor_rollout_ref.actor.ppo_epochs": 1, "actor_rollout_ref.actor.optim.lr": 3e-4}
    changes, skipped = prescribe(rule, "reward", overrides, {KL_COEFF_METRIC: 0.003}, times=2)
    assert skipped == []
    assert changes == {KL_COEF_KEY: (0.003, pytest.approx(0.048)), "actor_rollout_ref.actor.ppo_epochs": (1.0, 3),
                       "actor_rollout_ref.actor.optim.lr": (3e-4, 1e-4)}


def test_the_scheduler_stops_or_escalates_a_same_finding(tmp_path):
    """plan() on a trial restarted once by beta_high at step 30 from step 20 (0.08 → 0.04), flagged again at 30 (and
    at 34): the next remedy starts from the 0.04 the restart resumed with, not from the 0.08 its checkpoint logged."""
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial

    sweep = load_sweep(sweep_file(tmp_path, budget={"max_steps": 80}))
    first = {**_record(1, 30), "from_step": 20, "old": 0.08, "new": 0.04}
    trial = Trial("run_trial", config={KL_COEF_KEY: 0.04, REMEDIES: [first]}, stub=True)
    (tmp_path / "c").mkdir()
    # the checkpoint the first restart went from: taken before it, logging the coefficient before its remedy
    trial.run_metadata.checkpoint_manager.register_checkpoint(_TrainingResult(
        checkpoint=Checkpoint.from_directory(str(tmp_path / "c")),
        metrics={STEP: 20, KL_COEFF_METRIC: 0.08, "config": {KL_COEF_KEY: 0.08}}))
    scheduler = RemedyScheduler(sweep)
    scheduler.on_trial_add(None, trial)

    def plan(on_same_finding: str, step: int):
        scheduler._pending.clear()
        reason = StopReason("beta_high", "diverged", step, {}, "", f"x = 1 over step {step} (x > 0)")
        return scheduler.plan(trial.trial_id, _rule(on_same_finding=on_same_finding), reason,
                              {KL_COEFF_METRIC: 0.04, TOTAL_STEPS: 80})

    assert plan("stop", 30) == ("beta_high fired again at step 30, at or before step 30, whose finding its last "
                                "remedy answered: the dose changed nothing (on_same_finding: stop)")
    assert trial.trial_id not in scheduler._pending
    repeated, escalated, later = plan("repeat", 30), plan("escalate", 30), plan("escalate", 34)
    assert isinstance(repeated, Remedy) and isinstance(escalated, Remedy) and isinstance(later, Remedy)
    assert repeated.config[KL_COEF_KEY] == pytest.approx(0.02) and not repeated.escalated
    assert escalated.config[KL_COEF_KEY] == pytest.approx(0.01) and escalated.from_step == 20
    assert escalated.text() == ("beta_high at step 30: restarted from step 20 with algorithm.kl_ctrl.kl_coef 0.04 → "
                                "0.01 (escalated: the remedy applied twice, as the last one changed nothing)")
    assert escalated.config[REMEDIES] == [first, {**first, "restart": 2, "old": 0.04, "new": pytest.approx(0.01)}]
    assert later.config[KL_COEF_KEY] == pytest.approx(0.02) and not later.escalated  # 34: the remedy moved it


@pytest.mark.slow
@pytest.mark.parametrize("on_same_finding", ["stop", "escalate"])
def test_a_trial_flagged_again_at_the_same_step_is_stopped_or_escalated(ray_local, tmp_path, on_same_finding):
    """A real embedded trial at β 0.05 with checkpoints every step: flagged at step 4, restarted from step 3 at
    0.025 and flagged again at step 4. ``stop`` ends it there, saying why; ``escalate`` restarts it from step 3 at
    0.025 × 0.5² = 0.00625, below the threshold: it runs to step 6 healthy, with two remedies where ``repeat`` needs
    three (0.025 → 0.0125 is still above 0.01)."""
    out = tmp_path / "out"
    parameters = {"kl_coef": {"values": [0.05]}, "trainer.save_freq": {"values": [1]}}
    path = sweep_file(tmp_path, "same", parameters=parameters, budget={"max_steps": 6, "trials": 1},
                      health={"preset": "default", "rules": [{**BETA_HALVED, "on_same_finding": on_same_finding}]})
    none_healthy = 1
    assert main(["run", path, "--out", str(out), "--quiet"]) == (none_healthy if on_same_finding == "stop" else 0)
    [trial] = optuna.load_study(study_name="same", storage=f"sqlite:///{out / 'study.db'}").trials
    [progress] = (out / "tune").glob(f"*{trial.user_attrs['ray_trial_id']}*/progress.csv")
    rows = pd.read_csv(progress).to_dict("records")
    remedies = json.loads(trial.user_attrs["remedies"])
    first = {"restart": 1, "step": 4, "rule": "beta_high", "from_step": 3, "key": KL_COEF_KEY, "old": 0.05,
             "new": pytest.approx(0.025)}
    if on_same_finding == "stop":
        assert trial.state == optuna.trial.TrialState.PRUNED and remedies == [first]
        assert [(r[STEP], r[KL_COEFF_METRIC]) for r in rows] == \
            [(1, 0.05), (2, 0.05), (3, 0.05), (4, 0.05), (4, pytest.approx(0.025))]
        assert trial.user_attrs["stop_reason"].endswith(
            "(not remedied: beta_high fired again at step 4, at or before step 4, whose finding its last remedy "
            "answered: the dose changed nothing (on_same_finding: stop))")
        return
    # healthy, but a remedied run is a restart schedule, not a setting: PRUNED, its score kept apart
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.user_attrs["health"] == "healthy"
    assert ATTR_RESCUED_VALUES in trial.user_attrs
    assert remedies == [first, {**first, "restart": 2, "old": pytest.approx(0.025), "new": pytest.approx(0.00625)}]
    assert [(r[STEP], r[KL_COEFF_METRIC]) for r in rows] == [
        (1, 0.05), (2, 0.05), (3, 0.05), (4, 0.05), (4, pytest.approx(0.025)),
        (4, pytest.approx(0.00625)), (5, pytest.approx(0.00625)), (6, pytest.approx(0.00625))]
    notes = [r["remedy_note"] for r in rows if isinstance(r.get("remedy_note"), str)]
    assert notes[-1].endswith("0.025 → 0.00625 (escalated: the remedy applied twice, as the last one changed nothing)")
    row = pd.read_csv(out / "trials.csv").iloc[0]
    assert row["steps"] == 6 and json.loads(row["remedies"]) == remedies


def test_the_rules_with_a_remedy_are_those_of_the_sweeps_own_health(tmp_path):
    """remedies_on, checkpoint_every, restart_reach and KeepRestartPoints read the rules of each sweep's health."""
    path = sweep_file(tmp_path, health={"preset": "default", "rules": [BETA_HALVED]})
    sweep = load_sweep(path)
    assert [r.name for r in remedy_rules(sweep)] == ["kl_runaway", "reward_hacking", "beta_high"]
    assert remedies_on(sweep) and checkpoint_every(sweep, {"trainer.total_training_steps": 80}) == REMEDY_SAVE_FREQ
    assert restart_reach(sweep) == 20  # the default preset's reward_hacking: for 1 + a 20-step window - 1
    assert KeepRestartPoints(sweep)._caps == {"kl_runaway": 2, "reward_hacking": 2, "beta_high": 3}
    other = load_sweep(sweep_file(tmp_path, health={"preset": "none", "rules": [BETA_HALVED]}))
    assert [r.name for r in remedy_rules(other)] == ["beta_high"] and restart_reach(other) == 1
