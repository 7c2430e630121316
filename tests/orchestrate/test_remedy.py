"""Remedies: a stop rule's prescription applied from the last checkpoint before the onset, through real
Ray Tune and Optuna; the adaptive KL coefficient carried across the restart."""

from __future__ import annotations

import json
from types import SimpleNamespace

import optuna
import pandas as pd
import pytest
from verl.trainer.ppo import core_algos

from klsweep.analysis.sweep_dir import load_history
from klsweep.cli import main
from klsweep.errors import SweepFileError
from klsweep.health import Rule, load_ruleset
from klsweep.health.verdict import StopReason
from klsweep.launchers.resume import KL_COEFF_METRIC
from klsweep.orchestrate.remedy import (
    REMEDIES,
    REMEDY_SAVE_FREQ,
    Remedy,
    cannot_apply,
    checkpoint_every,
    onset_step,
    overrides_of,
    prescribe,
    remedies_on,
    restart_reach,
    steps_to_keep,
    trend_start,
    verl_checkpoints_kept,
)
from klsweep.orchestrate.remedy_tune import KeepRestartPoints, RemedyScheduler, checkpoint_config
from klsweep.results import STEP, schedule_line
from klsweep.spec import load_sweep
from klsweep.trainers.restore import KL_COEF_KEY, reapply_after_load
from tests.orchestrate.conftest import VAL, sweep_file

ADAPTIVE = {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive", KL_COEF_KEY: 0.002,
            "algorithm.kl_ctrl.target_kl": 0.03, "algorithm.kl_ctrl.horizon": 500}


def _rule(**fields) -> Rule:
    return Rule.model_validate({"name": "kl_runaway", "metric": "ref_kl", "above": 0.25, "action": "stop", **fields})


def test_onset_is_the_first_step_the_conditions_held():
    reason = StopReason("kl_runaway", "diverged", 13, {}, "", "... over steps 4-13 (... for 3 steps after step 10)")
    assert onset_step(_rule(**{"for": 3}), reason) == 11  # held at 11, 12, 13; slope10's window reads from 4
    assert onset_step(_rule(), reason) == 13


def test_a_restart_goes_from_before_the_window_the_finding_read():
    """kl_runaway (conservative preset): KL > 0.3 and slope10 > 0.01 for 3 steps, flagged at 46: held from 44, the
    slope read steps 35-44 at the onset; a drop over the whole run adds no window."""
    runaway = next(r for r in load_ruleset("conservative").rules if r.name == "kl_runaway")
    reason = StopReason("kl_runaway", "diverged", 46)
    assert (onset_step(runaway, reason), trend_start(runaway, reason)) == (44, 35)
    hacking = next(r for r in load_ruleset("conservative").rules if r.name == "reward_hacking")
    # for 11 (two validations in a row at test_freq 10) + drop_from_max20 of the score − 1: 30 steps back
    assert trend_start(hacking, StopReason("reward_hacking", "diverged", 80)) == 80 - (11 + 20 - 1) + 1 == 51
    plain = _rule()
    assert trend_start(plain, reason) == onset_step(plain, reason) == 46


#: The shipped sweeps stop flagged trials (remedies: false); these tests turn remedies on.
REMEDIES_ON = "health={preset: conservative, remedies: true}"


def test_remedies_switch_off_and_set_a_denser_checkpoint_cadence(tmp_path):
    on = load_sweep("sweeps/conservative.yaml", [REMEDIES_ON])  # the shipped file sets remedies: false
    off = load_sweep("sweeps/conservative.yaml")
    asha = load_sweep("sweeps/conservative.yaml", [REMEDIES_ON, "scheduler=asha"])
    assert (remedies_on(on), remedies_on(off), remedies_on(asha)) == (True, False, False)
    assert not remedies_on(load_sweep(sweep_file(tmp_path, health="seed")))  # no rule of it has a remedy
    run = {"trainer.total_training_steps": 80}  # save_freq: a fifth of the run, 16
    assert [checkpoint_every(s, run) for s in (on, off, asha)] == [REMEDY_SAVE_FREQ, 16, 16]
    assert checkpoint_every(on, {**run, "trainer.save_freq": 10}) == 10  # the trial's own cadence wins
    assert checkpoint_every(on, {**run, "trainer.test_freq": 2}) == 2  # already denser


def test_the_adaptive_coefficient_is_carried_and_jumps_back_without_it():
    # verl's own controller drifts away from its initial kl_coef while KL stays above target
    controller = core_algos.AdaptiveKLController(init_kl_coef=0.002, target_kl=0.03, horizon=500)
    for _ in range(20):
        controller.update(current_kl=0.3, n_steps=64)
    last = controller.value
    assert last == pytest.approx(0.002 * (1 + 0.2 * 64 / 500) ** 20)  # error clipped at 0.2: ×1.0256 per step
    rule = _rule(remedy={"kl_coef": "*1.5"})
    changes, skipped = prescribe(rule, "reward", ADAPTIVE, {KL_COEFF_METRIC: last})
    assert skipped == [] and changes == {KL_COEF_KEY: (last, pytest.approx(last * 1.5))}
    # verl rebuilds the controller from algorithm.kl_ctrl.kl_coef on a resume: with the carried value it goes on
    # from 1.5 × where it was; without it (nothing logged), from 1.5 × the initial value, a jump down by ×1.66
    resumed = core_algos.get_kl_controller(_kl_ctrl_config(changes[KL_COEF_KEY][1]))
    assert resumed.value == pytest.approx(last * 1.5)
    without = prescribe(rule, "reward", ADAPTIVE, {})[0][KL_COEF_KEY][1]
    assert without == pytest.approx(0.003) and last * 1.5 / without == pytest.approx(1.0256 ** 20, rel=1e-3)


def _kl_ctrl_config(kl_coef: float):
    from omegaconf import OmegaConf

    return OmegaConf.create({"type": "adaptive", "kl_coef": kl_coef, "target_kl": 0.03, "horizon": 500})


def test_aliases_resolve_inert_knobs_are_skipped_and_integers_stay_integers():
    rule = _rule(remedy={"kl_coef": "*2", "target_kl": "*0.5", "actor_rollout_ref.actor.ppo_epochs": "+1"})
    fixed = {**ADAPTIVE, "algorithm.kl_ctrl.type": "fixed", "actor_rollout_ref.actor.ppo_epochs": 1}
    changes, skipped = prescribe(rule, "reward", fixed, {})
    assert changes == {KL_COEF_KEY: (0.002, 0.004), "actor_rollout_ref.actor.ppo_epochs": (1.0, 2)}
    assert isinstance(changes["actor_rollout_ref.actor.ppo_epochs"][1], int)
    assert len(skipped) == 1 and "target_kl has no effect" in skipped[0] and "'fixed'" in skipped[0]


@pytest.mark.parametrize("operation,message", [("1.5", "is not an operation"), ("^2", "is not an operation"),
                                               ("/0", "is not an operation"), ("*inf", "is not an operation")])
def test_bad_operations_are_refused_at_load(operation, message):
    with pytest.raises(ValueError, match=message):
        _rule(remedy={"kl_coef": operation})


def test_embedded_trainer_restores_its_controller_from_the_checkpoint_unlike_verl(tmp_path):
    """The embedded trainer's load() puts back the checkpoint's coefficient (verl's trainer does not checkpoint it):
    a remedied coefficient would be undone without :func:`reapply_after_load`."""
    from klsweep.trainers.embedded import EmbeddedTrainer

    tiny = {"trainer.total_training_steps": 3, "trainer.test_freq": 0, "data.train_batch_size": 4,
            "actor_rollout_ref.rollout.n": 2, "algorithm.adv_estimator": "grpo", **ADAPTIVE}
    first = EmbeddedTrainer(tiny)
    first.train_step()
    at_checkpoint = first.kl_ctrl.value
    first.save(tmp_path)
    remedied = {**tiny, KL_COEF_KEY: 0.01}
    second = EmbeddedTrainer(remedied)
    second.load(tmp_path)
    assert second.kl_ctrl.value == at_checkpoint != 0.01
    reapply_after_load(second, remedied, [KL_COEF_KEY])
    assert second.kl_ctrl.value == 0.01


def test_prescriptions_of_the_sweeps_own_rules_are_checked(tmp_path):
    rules = [_rule(name="a", remedy={"target_kl": "*0.7"}).model_dump(by_alias=True),
             _rule(name="b", remedy={"actor_rollout_ref.actor.optim.lrr": "*0.5"}).model_dump(by_alias=True)]
    for r in rules:
        r.pop("conditions"), r.update(metric="ref_kl", above=0.25)
    with pytest.raises(SweepFileError) as refused:  # sweep validate, run and resume load it so
        load_sweep(sweep_file(tmp_path, health={"preset": "default", "rules": rules}))
    problems = [p for p in refused.value.problems if ".remedy." in p]
    assert len(problems) == 2
    assert "health.rules.0.remedy.target_kl: the remedy changes algorithm.kl_ctrl.target_kl, which has no effect" \
        in problems[0] and "'fixed'" in problems[0]
    assert "did you mean 'actor_rollout_ref.actor.optim.lr'?" in problems[1]
    assert main(["run", sweep_file(tmp_path, health={"preset": "default", "rules": rules}), "--out",
                 str(tmp_path / "out")]) == 2


def test_a_remedy_under_asha_is_said_to_stop_instead(tmp_path):
    rule = _rule(name="a", remedy={"kl_coef": "*1.5"}).model_dump(by_alias=True)
    rule.pop("conditions"), rule.update(metric="ref_kl", above=0.25)
    health = {"preset": "default", "rules": [rule]}
    asha = load_sweep(sweep_file(tmp_path, health=health, scheduler={"type": "asha", "grace_period": 2}))
    (warning,) = [w for w in asha.warnings if "has a remedy but scheduler" in w]
    assert "health.rules.0.remedy: rule 'a' has a remedy but scheduler is asha" in warning
    assert "Use scheduler: none for remedies" in warning
    assert not [w for w in load_sweep(sweep_file(tmp_path, health=health)).warnings if "has a remedy but" in w]


def test_the_restart_point_is_the_last_checkpoint_before_the_onset_on_the_trials_current_line(tmp_path):
    """A checkpoint of a run an earlier remedy abandoned (step 45, after the restart from 40) is never used."""
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial

    first = {"restart": 1, "step": 47, "rule": "kl_runaway", "from_step": 40, "key": KL_COEF_KEY, "old": 0.05,
             "new": 0.075}
    trial = Trial("run_trial", config={KL_COEF_KEY: 0.075, REMEDIES: [first]}, stub=True)
    for step, remedies in [(10, []), (20, []), (30, []), (40, []), (45, []), (50, [first])]:
        folder = tmp_path / f"c{step}"
        folder.mkdir()
        metrics = {STEP: step, KL_COEFF_METRIC: 0.08, "config": {KL_COEF_KEY: 0.05, REMEDIES: remedies}}
        trial.run_metadata.checkpoint_manager.register_checkpoint(
            _TrainingResult(checkpoint=Checkpoint.from_directory(str(folder)), metrics=metrics))
    scheduler = RemedyScheduler(load_sweep(sweep_file(tmp_path, budget={"max_steps": 80})))
    scheduler.on_trial_add(None, trial)
    rule = _rule(remedy={"kl_coef": "*1.5"})

    def plan(onset: int):  # the rule has for: 1: the onset is the step that fired it
        reason = StopReason("kl_runaway", "diverged", onset, {}, "", f"x = 1 over step {onset} (x > 0)")
        return scheduler.plan(trial.trial_id, rule, reason, {KL_COEFF_METRIC: 0.08})

    assert plan(48).from_step == 40  # not 45: that run was abandoned at the restart from 40
    remedy = plan(55)
    assert remedy.from_step == 50 and remedy.config[KL_COEF_KEY] == pytest.approx(0.12)  # 0.08 logged at 50 × 1.5
    assert [(r["restart"], r["from_step"]) for r in remedy.config[REMEDIES]] == [(1, 40), (2, 50)]
    assert plan(5) == "no checkpoint before step 5, where the finding began (checkpoints every trainer.save_freq steps)"
    trial.set_config(remedy.config)
    assert plan(55) == "max_remedies 2 of kl_runaway reached"
    # a restarted trial flagged again at the same step from the same checkpoint is a second restart, not the first
    trial.set_config({**remedy.config, REMEDIES: [first, {**first, "restart": 2}]})
    assert plan(47) == "max_remedies 2 of kl_runaway reached"
    # Tune pickles the scheduler with the experiment (the stopper points to it): without its live trials, whose
    # unpickling needs the trainable registered (a resumed sweep reads that file before; test_resume.py)
    import ray.cloudpickle as cloudpickle

    assert "_trials" not in scheduler.__getstate__() and "_pending" not in scheduler.__getstate__()
    # a restored experiment unpickles the stopper's copy apart from the scheduler's: both see the live trials
    assert cloudpickle.loads(cloudpickle.dumps(scheduler))._trials[trial.trial_id] is trial
    # a verl trial restarts only from a step verl still holds a checkpoint of (global_step_N/actor in its folder)
    verl = RemedyScheduler(load_sweep(sweep_file(tmp_path, budget={"max_steps": 80})).model_copy(
        update={"trainer": "verl"}))
    trial.set_config({KL_COEF_KEY: 0.05})
    trial.storage = SimpleNamespace(trial_fs_path=str(tmp_path / "trial"))  # the trial's folder in the results dir
    (tmp_path / "trial" / "checkpoints" / "global_step_20" / "actor").mkdir(parents=True)
    (tmp_path / "trial" / "checkpoints" / "global_step_40").mkdir()  # its actor/ removed past max_actor_ckpt_to_keep
    verl.on_trial_add(None, trial)
    assert verl.plan(trial.trial_id, rule, StopReason("kl_runaway", "diverged", 48), {}).from_step == 20


#: β = kl_coef under the fixed controller (logged as actor/reward_kl_penalty_coeff): above 0.01 from step 4 on
BETA_REMEDY = {"name": "beta_high", "metric": "actor/reward_kl_penalty_coeff", "above": 0.01, "after": 3,
               "action": "stop", "kind": "diverged", "advice": "lower kl_coef", "remedy": {"kl_coef": "*0.1"},
               "max_remedies": 1}
SEEDS = [{"kl_coef": 0.05, "trainer.save_freq": 1},  # remedied at step 4 from step 3 with β 0.005: runs to 6
         {"kl_coef": 0.5, "trainer.save_freq": 1},  # remedied once (β 0.05, still too high): the cap stops it
         {"kl_coef": 0.05, "trainer.save_freq": 10}]  # no checkpoint before step 4: stopped, saying why


@pytest.mark.slow
def test_a_flagged_trial_restarts_from_its_checkpoint_with_the_prescription(ray_local, tmp_path):
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "remedy", parameters={"kl_coef": {"values": [0.05, 0.5]},
                                                      "trainer.save_freq": {"values": [1, 10]}},
                      seed_trials=SEEDS, budget={"max_steps": 6, "trials": 3},
                      health={"preset": "default", "rules": [BETA_REMEDY]})
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    study = optuna.load_study(study_name="remedy", storage=f"sqlite:///{out / 'study.db'}")
    by_params = {(t.params["algorithm.kl_ctrl.kl_coef"], t.params["trainer.save_freq"]): t for t in study.trials}
    rescued, capped, bare = by_params[(0.05, 1)], by_params[(0.5, 1)], by_params[(0.05, 10)]

    # its score is the restart schedule's, not its params': never Optuna's best trial
    assert rescued.state == optuna.trial.TrialState.PRUNED and rescued.user_attrs["steps"] == 6
    assert rescued.user_attrs["stop_reason"] == \
        "remedied: a restart schedule, not one setting (1× beta_high@4 from 3 kl_coef 0.05→0.005)"
    assert rescued.user_attrs["rescued_values"] == rescued.values
    assert rescued.user_attrs["health"] == "healthy"
    [record] = json.loads(rescued.user_attrs["remedies"])
    assert record == {"restart": 1, "step": 4, "rule": "beta_high", "from_step": 3, "key": KL_COEF_KEY, "old": 0.05,
                      "new": pytest.approx(0.005)}
    rows = _results(out, rescued.user_attrs["ray_trial_id"])
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 4, 5, 6]  # step 4 flagged, then 4-6 again from step 3
    assert [r[KL_COEFF_METRIC] for r in rows] == [0.05] * 4 + [pytest.approx(0.005)] * 3
    assert rows[3]["remedy_note"].startswith("remedied: beta_high at step 4: restarted from step 3 with")
    assert [r["stop_reason"] for r in rows if isinstance(r["stop_reason"], str)] == []  # a remedy is no stop

    assert capped.state == optuna.trial.TrialState.PRUNED
    assert "(not remedied: max_remedies 1 of beta_high reached)" in capped.user_attrs["stop_reason"]
    assert len(json.loads(capped.user_attrs["remedies"])) == 1
    assert [r[KL_COEFF_METRIC] for r in _results(out, capped.user_attrs["ray_trial_id"])] == \
        [0.5] * 4 + [pytest.approx(0.05)]

    assert bare.state == optuna.trial.TrialState.PRUNED and "remedies" not in bare.user_attrs
    assert "(not remedied: no checkpoint before step 4, where the finding began" in bare.user_attrs["stop_reason"]
    trials = pd.read_csv(out / "trials.csv").set_index("number")
    assert sorted(trials["steps"]) == [4, 4, 6] and VAL in " ".join(trials.columns)
    # trials.csv: the proposed params, the schedule beside them, the values of the final (remedied) run
    row = trials.loc[rescued.number]
    assert row[f"config/{KL_COEF_KEY}"] == 0.05 and json.loads(row["remedies"]) == [record]
    assert pd.isna(trials.loc[bare.number, "remedies"])
    # a finished trial keeps its newest checkpoint only (KeepRestartPoints); save_freq 10 of 6 steps saved none
    kept = {t.number: len(list(next((out / "tune").glob(f"*_{t.user_attrs['ray_trial_id']}_*")).glob("checkpoint_*")))
            for t in (rescued, capped, bare)}
    assert kept == {rescued.number: 1, capped.number: 1, bare.number: 0}
    # result.json and the history hold each step once: the flagged step 4 is superseded by the restarted run's
    results = _result_json(out, rescued.user_attrs["ray_trial_id"])
    assert [r["step"] for r in results] == [1, 2, 3, 4, 5, 6]
    assert row["value/" + VAL] == rescued.values[0] == row["last/" + VAL] == results[-1][VAL]
    assert [r[KL_COEFF_METRIC] for r in results] == [0.05] * 3 + [pytest.approx(0.005)] * 3
    history = load_history(out)
    beta = history[(history["trial_id"] == rescued.user_attrs["ray_trial_id"]) & (history["metric"] == KL_COEFF_METRIC)]
    assert list(beta["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(beta["value"]) == pytest.approx([0.05] * 3 + [0.005] * 3)
    capped_results = _result_json(out, capped.user_attrs["ray_trial_id"])
    assert [(r["step"], r[KL_COEFF_METRIC]) for r in capped_results] == \
        [(1, 0.5), (2, 0.5), (3, 0.5), (4, pytest.approx(0.05))]


@pytest.mark.slow
def test_the_best_trial_is_a_setting_that_ran_unchanged(ray_local, tmp_path, capsys):
    """A remedied trial's score is its restart schedule's (kl_coef 0.05, lowered to 0.005 from step 3): run as
    proposed, its params are what the health rule stopped. Neither ``study.best_trial`` (optuna-dashboard's best
    trial) nor the summary's best trial is it; the summary shows it apart when its run scored better, says what had
    to change, and ends with the winner's knob values on one line and where the files are."""
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "best", parameters={"kl_coef": {"values": [0.05, 0.001]},
                                                    "trainer.save_freq": {"values": [1]}},
                      seed_trials=[{"kl_coef": 0.05, "trainer.save_freq": 1},
                                   {"kl_coef": 0.001, "trainer.save_freq": 1}],
                      budget={"max_steps": 6, "trials": 2, "max_concurrent": 1},
                      health={"preset": "default", "rules": [BETA_REMEDY]})
    capsys.readouterr()
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    study = optuna.load_study(study_name="best", storage=f"sqlite:///{out / 'study.db'}")
    remedied, plain = study.trials
    assert "remedies" in remedied.user_attrs and remedied.state == optuna.trial.TrialState.PRUNED
    assert plain.state == optuna.trial.TrialState.COMPLETE
    assert study.best_trial.number == plain.number and study.best_params[KL_COEF_KEY] == 0.001
    rescued, setting = remedied.user_attrs["rescued_values"][0], plain.values[0]
    assert lines[-1] == f"results: {out} (trials.csv, study.db, tune/)"
    winner = lines.index(f"winner: trial {plain.number} ({plain.user_attrs['ray_trial_id']}), {VAL} = {setting:.4g} "
                         "(max)")
    assert lines[winner + 1] == "  kl_coef=0.001 save_freq=1"
    best_run = [line for line in lines if line.startswith("best run (a restart schedule, not a setting)")]
    if rescued > setting:  # the embedded runs are deterministic: one branch, always the same
        assert best_run == [f"best run (a restart schedule, not a setting): trial {remedied.number} scored "
                            f"{VAL}={rescued:.4g} only because kl_coef 0.05 needed lowering to 0.005 at step 4 "
                            "(restarted from step 3's checkpoint)"]
    else:
        assert best_run == []


def _result_json(out, trial_id: str) -> list[dict]:
    [path] = (out / "tune").glob(f"*{trial_id}*/result.json")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _results(out, trial_id: str) -> list[dict]:
    """Every report of the trial, superseded ones too, from Tune's progress.csv (result.json keeps only the run a
    restart continued, :class:`klsweep.orchestrate.result_json.ResultsFromCheckpoint`)."""
    [progress] = (out / "tune").glob(f"*{trial_id}*/progress.csv")
    return pd.read_csv(progress).to_dict("records")


def _stopper_with_a_checkpoint(tmp_path, kl_coef: float, metrics: dict, **fields):
    """A :class:`RemedyScheduler` and :class:`HealthStopper` of a sweep with the rule ``BETA_REMEDY`` (sweep-file
    ``fields`` as :func:`sweep_file`'s), and a stub Tune trial at ``kl_coef`` with a checkpoint reported with
    ``metrics`` (and the trial's config): ``(scheduler, stopper, trial)``."""
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial

    from klsweep.health import HealthStopper

    sweep = load_sweep(sweep_file(tmp_path, health={"preset": "none", "rules": [BETA_REMEDY]}, **fields))
    scheduler = RemedyScheduler(sweep)
    stopper = HealthStopper(load_ruleset(sweep.health), run_config_of=lambda c: overrides_of(sweep, c),
                            remedies=scheduler)
    trial = Trial("run_trial", config={KL_COEF_KEY: kl_coef}, stub=True)
    scheduler.on_trial_add(None, trial)
    (tmp_path / "c").mkdir()
    trial.run_metadata.checkpoint_manager.register_checkpoint(_TrainingResult(
        checkpoint=Checkpoint.from_directory(str(tmp_path / "c")), metrics={**metrics, "config": dict(trial.config)}))
    return scheduler, stopper, trial


def test_the_stopper_offers_the_stop_to_the_scheduler_and_restarts_its_engine_from_the_checkpoint(tmp_path):
    from klsweep.health.stopper import REMEDY_NOTE
    from klsweep.results import HEALTH, STOP_KIND, STOP_REASON, TOTAL_STEPS

    scheduler, stopper, trial = _stopper_with_a_checkpoint(tmp_path, 0.05, {STEP: 2})

    def report(step: int, beta: float) -> tuple[bool, dict]:
        result = {STEP: step, TOTAL_STEPS: 6, KL_COEFF_METRIC: beta, "config": dict(trial.config)}
        return stopper(trial.trial_id, result), result

    assert [report(step, 0.05)[0] for step in (1, 2, 3)] == [False] * 3  # after: 3
    stopped, result = report(4, 0.05)  # β > 0.01 at step 4: remedied from the checkpoint at step 2
    assert not stopped and result[HEALTH] == "warned"
    assert result[REMEDY_NOTE] == ("remedied: beta_high at step 4: restarted from step 2 with "
                                   "algorithm.kl_ctrl.kl_coef 0.05 → 0.005")
    assert result[STOP_REASON] == "" and result[STOP_KIND] == ""
    assert [s for s, _ in stopper._history[trial.trial_id]] == [1, 2]
    # what the scheduler does with the trial (RemedyScheduler.on_trial_result) needs a running Tune; the config:
    trial.set_config(scheduler._pending.pop(trial.trial_id).config)
    assert trial.config[KL_COEF_KEY] == pytest.approx(0.005) and len(trial.config[REMEDIES]) == 1
    assert [report(step, 0.005)[0] for step in (3, 4, 5)] == [False] * 3  # the new engine judges β = 0.005
    assert stopper.summary(trial.trial_id)["reports"] == 5  # steps 1-2 replayed, then 3-5
    assert report(6, 0.005)[0] is False and trial.trial_id not in stopper._history  # ended: history dropped


def test_the_prescription_applies_to_the_coefficient_of_the_checkpoint_it_restarts_from(tmp_path):
    # an adaptive controller grows β while KL stays above target: 0.05 at the checkpoint of step 2, 0.2 at the finding
    # (step 4). The restart resumes the policy of step 2, so "*0.1" gives 0.005, not 0.02 (×0.1 of the controller's
    # growth after the checkpoint; on sweeps/conservative.yaml "*4" from step 50's β restarted at step 28 was ×40)
    from klsweep.results import TOTAL_STEPS

    adaptive = {"algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.target_kl": 0.03,
                "algorithm.kl_ctrl.horizon": 500, "data.train_batch_size": 4,
                "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "critic.ppo_mini_batch_size": 4,
                "actor_rollout_ref.rollout.n": 2}
    scheduler, stopper, trial = _stopper_with_a_checkpoint(tmp_path, 0.001, {STEP: 2, KL_COEFF_METRIC: 0.05},
                                                           overrides=adaptive)
    for step, beta in ((1, 0.002), (2, 0.05), (3, 0.1), (4, 0.2)):
        result = {STEP: step, TOTAL_STEPS: 6, KL_COEFF_METRIC: beta, "config": dict(trial.config)}
        assert stopper(trial.trial_id, result) is False
    remedy = scheduler._pending.pop(trial.trial_id)
    assert remedy.from_step == 2 and remedy.config[KL_COEF_KEY] == pytest.approx(0.005)
    assert remedy.restart.changes == {KL_COEF_KEY: (0.05, pytest.approx(0.005))}


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_of_the_driver_around_a_restart_then_resume_loses_and_duplicates_nothing(tmp_path):
    """The driver is killed with SIGKILL as soon as a trial's remedied report is in its progress.csv (the restart
    from step 3 planned, under way or just done); `sweep resume` ends the sweep with that trial remedied once and
    every step of it in result.json once, β 0.05 before the restart and 0.005 after; a trial the resumed driver
    starts is remedied too (its stopper and scheduler are unpickled apart: RemedyScheduler.__setstate__)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out, steps = tmp_path / "out", 30
    path = sweep_file(tmp_path, "killed", parameters={"kl_coef": {"values": [0.05, 0.005]},
                                                      "trainer.save_freq": {"values": [1]}},
                      seed_trials=[SEEDS[0]], budget={"max_steps": steps, "trials": 2, "max_concurrent": 1},
                      health={"preset": "default", "rules": [BETA_REMEDY]})
    # Tune syncs a trial's progress.csv to --out at its experiment saves (every >= 10 s by default): every second
    # here, so the kill lands while the remedied seed trial still runs, not after the next trial began (whose first
    # steps would then be in no saved file: a SIGKILL loses what Tune had not synced).
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 400
    while not any("remedied:" in p.read_text() for p in (out / "tune").glob("*/progress.csv")):
        assert driver.poll() is None and time.monotonic() < deadline, "no restart before the driver ended"
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    resumed = subprocess.run([sys.executable, "-m", "klsweep.cli", "resume", str(out), "--quiet"], env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr

    study = optuna.load_study(study_name="killed", storage=f"sqlite:///{out / 'study.db'}")
    assert len(study.trials) == 2
    assert {t.state for t in study.trials if "remedies" not in t.user_attrs} <= {optuna.trial.TrialState.COMPLETE}
    assert {t.state for t in study.trials if "remedies" in t.user_attrs} == {optuna.trial.TrialState.PRUNED}
    trials = pd.read_csv(out / "trials.csv").set_index("trial_id")
    flagged = [t for t in study.trials if t.params["algorithm.kl_ctrl.kl_coef"] == 0.05]
    assert flagged  # the seed trial; the sampler may propose kl_coef 0.05 again (one started after the resume)
    for trial in flagged:
        [record] = json.loads(trial.user_attrs["remedies"])  # once, not once per driver
        assert (record["step"], record["from_step"], record["new"]) == (4, 3, pytest.approx(0.005))
        assert trial.user_attrs["steps"] == steps and trial.user_attrs["health"] == "healthy"
        results = _result_json(out, trial.user_attrs["ray_trial_id"])
        assert [r["step"] for r in results] == list(range(1, steps + 1))
        assert [r[KL_COEFF_METRIC] for r in results] == pytest.approx([0.05] * 3 + [0.005] * (steps - 3))
        assert json.loads(trials.loc[trial.user_attrs["ray_trial_id"], "remedies"]) == [record]


def test_a_remedy_whose_knob_has_no_effect_stops_the_trial_saying_why(tmp_path):
    """sweeps/drgrpo_vs_grpo.yaml has no KL to the reference (kl_placement none): the default preset's kl_coef *4
    can apply to none of its trials. A flagged trial is stopped, its reason saying so, though a checkpoint before the
    finding exists; and its trials keep the sweep's checkpoint cadence (no denser one for remedies)."""
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial

    from klsweep.health import HealthStopper
    from klsweep.results import STOP_REASON

    sweep = load_sweep("sweeps/drgrpo_vs_grpo.yaml", ["health={preset: default, remedies: true}"])
    hacking = next(r for r in load_ruleset(sweep.health).rules if r.name == "reward_hacking")
    why = "kl_coef *4: alias 'kl_coef' has no effect with kl_placement none (no KL to the reference)"
    assert cannot_apply(hacking, "none") == why and cannot_apply(hacking, "reward") == ""
    assert remedies_on(sweep) and checkpoint_every(sweep, {"trainer.total_training_steps": 80}) == 16  # not 4
    kl_sweep = load_sweep("sweeps/conservative.yaml", [REMEDIES_ON])
    assert checkpoint_every(kl_sweep, {"trainer.total_training_steps": 80}) == REMEDY_SAVE_FREQ

    scheduler = RemedyScheduler(sweep)
    trial = Trial("run_trial", config={"algorithm.norm_adv_by_std_in_grpo": False, "loss_agg_mode": "token-mean",
                                       "actor_rollout_ref.actor.optim.lr": 0.0003}, stub=True)
    scheduler.on_trial_add(None, trial)
    (tmp_path / "c").mkdir()
    trial.run_metadata.checkpoint_manager.register_checkpoint(_TrainingResult(
        checkpoint=Checkpoint.from_directory(str(tmp_path / "c")), metrics={STEP: 2, "config": dict(trial.config)}))
    planned = scheduler.plan(trial.trial_id, hacking, StopReason("reward_hacking", "diverged", 30), {STEP: 30})
    assert planned == f"its remedy cannot apply: {why}"
    assert trial.trial_id not in scheduler._pending

    # through the stopper: a rule with that remedy firing at step 2 stops the trial, the reason saying why
    rule = Rule.model_validate({"name": "loss_high", "metric": "actor/pg_loss", "above": 1.0, "action": "stop",
                                "kind": "diverged", "remedy": hacking.remedy})
    ruleset = load_ruleset(sweep.health.model_copy(update={"preset": "none", "rules": [rule]}))
    stopper = HealthStopper(ruleset, run_config_of=lambda c: overrides_of(sweep, c), remedies=scheduler)
    result = {STEP: 1, "actor/pg_loss": 2.0, "config": dict(trial.config)}
    assert stopper(trial.trial_id, result) is True
    assert result[STOP_REASON].endswith(f"(not remedied: its remedy cannot apply: {why})")


def test_a_finding_at_the_last_steps_stops_the_trial_instead_of_restarting_it(tmp_path):
    """reward_hacking at step 80 of 80 restarted a trial from 60 (20 steps run again, none rescued) and the trial
    ended "healthy" below the reference policy: a finding fewer than the rule's ``for`` steps before the end stops."""
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial

    from klsweep.results import TOTAL_STEPS

    trial = Trial("run_trial", config={KL_COEF_KEY: 0.05}, stub=True)
    for step in (40, 60):
        (tmp_path / f"c{step}").mkdir()
        trial.run_metadata.checkpoint_manager.register_checkpoint(_TrainingResult(
            checkpoint=Checkpoint.from_directory(str(tmp_path / f"c{step}")),
            metrics={STEP: step, KL_COEFF_METRIC: 0.08, "config": dict(trial.config)}))
    scheduler = RemedyScheduler(load_sweep(sweep_file(tmp_path)))
    scheduler.on_trial_add(None, trial)

    def plan(rule: Rule, step: int):
        reason = StopReason(rule.name, "diverged", step, {}, "", f"x = 1 over step {step} (x > 0)")
        return scheduler.plan(trial.trial_id, rule, reason, {KL_COEFF_METRIC: 0.08, TOTAL_STEPS: 80})

    once = _rule(remedy={"kl_coef": "*1.5"})  # for: 1
    assert plan(once, 80) == ("the finding is at step 80 of 80: a restart would only run again steps the trial has "
                              "run, with fewer than 1 (the rule's for) left after it to rescue")
    remedy = plan(once, 79)
    assert isinstance(remedy, Remedy) and remedy.from_step == 60
    assert remedy.config[KL_COEF_KEY] == pytest.approx(0.12)
    scheduler._pending.clear()
    streak = _rule(remedy={"kl_coef": "*1.5"}, **{"for": 3})  # fired at 78: onset 76, 2 steps left < 3
    assert plan(streak, 78).startswith("the finding is at step 78 of 80:")
    assert plan(streak, 77).from_step == 60  # onset 75, 3 steps left
    # a verl trial's reports carry no total_steps: the trial's trainer.total_training_steps (budget.max_steps 4)
    scheduler._pending.clear()
    reason = StopReason("kl_runaway", "diverged", 4, {}, "", "x = 1 over step 4 (x > 0)")
    assert scheduler.plan(trial.trial_id, once, reason, {}).startswith("the finding is at step 4 of 4:")


def test_the_schedule_line_lists_every_restart_in_order():
    first = {"restart": 1, "step": 43, "rule": "kl_runaway", "from_step": 28, "key": KL_COEF_KEY, "old": 0.0023633,
             "new": 0.0035449}
    lr = {**first, "key": "actor_rollout_ref.actor.optim.lr", "old": 3e-4, "new": 1.5e-4}
    second = {"restart": 2, "step": 80, "rule": "reward_hacking", "from_step": 60, "key": KL_COEF_KEY, "old": 0.004,
              "new": 0.006}
    assert schedule_line(json.dumps([first, lr, second])) == (
        "2× kl_runaway@43 from 28 kl_coef 0.002363→0.003545, lr 0.0003→0.00015; "
        "reward_hacking@80 from 60 kl_coef 0.004→0.006")
    assert schedule_line(float("nan")) == schedule_line("") == schedule_line([]) == ""


#: Two rules with remedies, as in the conservative preset, and one without: the longest lookback of the first two is
#: 20 steps (for 1 + a 20-step window − 1; the other: for 3 + 10 − 1 = 12); the third's 50-step window restarts nothing.
RETENTION_RULES = [
    {"name": "runaway", "all": [{"metric": "ref_kl", "above": 0.25},
                                {"metric": "ref_kl", "stat": "slope", "window": 10, "above": 0.01}],
     "for": 3, "action": "stop", "kind": "diverged", "advice": "raise kl_coef", "remedy": {"kl_coef": "*1.5"}},
    {"name": "hacking", "metric": "critic/score/mean", "stat": "drop_from_max", "window": 20, "below": 0.1,
     "action": "stop", "kind": "diverged", "advice": "raise kl_coef", "remedy": {"kl_coef": "*1.5"}},
    {"name": "slow_drop", "metric": "critic/score/mean", "stat": "drop_from_max", "window": 50, "above": 0.5,
     "for": 3, "action": "stop", "kind": "collapsed", "advice": "lower the learning rate"},
]


def test_only_checkpoints_that_can_still_be_a_restart_point_are_kept(tmp_path):
    """Checkpoints every 4 steps, reach 20, remedies left: a finding at 41 or later restarts from step 20 or later,
    and a finding soon after that restart from 20 minus another reach, so 40 steps back are kept (all 10 at step 40);
    a restart from 20 abandons 24-40, and a finished trial keeps its newest checkpoint only."""
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial

    sweep = load_sweep(sweep_file(tmp_path, budget={"max_steps": 80},
                                  health={"preset": "none", "rules": RETENTION_RULES}))
    assert restart_reach(sweep) == 20
    assert steps_to_keep(list(range(4, 41, 4)), 40, 20) == {20, 24, 28, 32, 36, 40}
    assert steps_to_keep(list(range(4, 41, 4)), 41, 20) == {20, 24, 28, 32, 36, 40}  # at 42 too: from 20
    assert steps_to_keep(list(range(4, 45, 4)), 44, 20) == {24, 28, 32, 36, 40, 44}  # a finding at 45 → from 24
    assert steps_to_keep([8, 12], 12, 20) == {8, 12}  # none 20 steps back yet: any may be the restart point
    assert checkpoint_config(sweep).num_to_keep is None
    off = load_sweep(sweep_file(tmp_path, health={"preset": "none", "rules": RETENTION_RULES, "remedies": False}))
    assert restart_reach(off) is None and checkpoint_config(off).num_to_keep == 1  # a resume needs only the newest
    # verl: ceil(20 / save_freq) checkpoints in the 20 steps up to a finding, + the restart point before them
    # verl: ceil(2 × 20 / save_freq) checkpoints in the 40 steps up to a finding, + the restart point before them
    assert verl_checkpoints_kept(sweep, {"trainer.save_freq": 16})["trainer.max_actor_ckpt_to_keep"] == 4
    assert verl_checkpoints_kept(sweep, {"trainer.save_freq": 4}) == {"trainer.max_actor_ckpt_to_keep": 11,
                                                                       "trainer.max_critic_ckpt_to_keep": 11}
    assert verl_checkpoints_kept(off, {"trainer.save_freq": 4})["trainer.max_critic_ckpt_to_keep"] == 1

    trial = Trial("run_trial", config={KL_COEF_KEY: 0.05}, stub=True)
    manager = trial.run_metadata.checkpoint_manager
    keep = KeepRestartPoints(sweep)

    def save(step: int, line: str, remedies: list) -> None:
        folder = tmp_path / f"{line}{step}"
        folder.mkdir()
        metrics = {STEP: step, "config": {KL_COEF_KEY: 0.05, REMEDIES: remedies}}
        manager.register_checkpoint(_TrainingResult(checkpoint=Checkpoint.from_directory(str(folder)), metrics=metrics))
        keep.on_trial_save(0, [trial], trial)

    def on_disk() -> list[str]:
        return sorted((p.name for p in tmp_path.iterdir() if p.is_dir() and p.name[0] in "ab"),
                      key=lambda name: (name[0], int(name[1:])))

    for step in range(4, 41, 4):
        save(step, "a", [])
    assert on_disk() == [f"a{step}" for step in range(4, 41, 4)]
    assert [r.metrics[STEP] for r in manager.best_checkpoint_results] == list(range(4, 41, 4))
    scheduler = RemedyScheduler(sweep)
    scheduler.on_trial_add(None, trial)
    hacking = next(r for r in load_ruleset(sweep.health).rules if r.name == "hacking")
    remedy = scheduler.plan(trial.trial_id, hacking, StopReason("hacking", "diverged", 41), {})
    assert remedy.from_step == 20  # the checkpoint the retention kept for it
    trial.set_config(remedy.config)
    manager._latest_checkpoint_result = remedy.checkpoint  # as RemedyScheduler.on_trial_result does
    save(24, "b", remedy.config[REMEDIES])  # the restarted run: 24-40 of the first are abandoned
    assert on_disk() == ["a4", "a8", "a12", "a16", "a20", "b24"]  # a finding at 25 restarts from 4
    for step in range(28, 49, 4):
        save(step, "b", remedy.config[REMEDIES])
    # a finding at 49 restarts from 28 at the earliest, one soon after that restart from 8
    assert on_disk() == ["a8", "a12", "a16", "a20", "b24", "b28", "b32", "b36", "b40", "b44", "b48"]
    used_up = [{**remedy.config[REMEDIES][0], "rule": name} for name in ("hacking", "hacking", "runaway", "runaway")]
    trial.set_config({**remedy.config, REMEDIES: used_up})
    save(52, "b", used_up)  # no remedy left: one reach, the last restart point at or before 33
    assert on_disk() == ["b32", "b36", "b40", "b44", "b48", "b52"]
    keep.on_trial_complete(0, [trial], trial)
    assert on_disk() == ["b52"] and [r.metrics[STEP] for r in manager.best_checkpoint_results] == [52]


def test_trainers_that_serve_recorded_runs_turn_remedies_off_and_say_so_once(tmp_path):
    """A table or a recorded log holds no run restarted with a changed coefficient: a remedy would serve the same
    curve again, fire again and count re-run steps that never ran."""
    table = "tabular={table: benchmarks/tabular/aggressive.jsonl.gz}"
    on = "health={preset: aggressive, remedies: true}"  # the shipped file sets remedies: false
    embedded = load_sweep("sweeps/aggressive.yaml", [on])
    tabular = load_sweep("sweeps/aggressive.yaml",
                         [on, "trainer=tabular", table, "parameters.horizon={values: [20000]}"])
    assert (remedies_on(embedded), remedies_on(tabular)) == (True, False)
    run = {"trainer.total_training_steps": 80}
    assert (checkpoint_every(embedded, run), checkpoint_every(tabular, run)) == (REMEDY_SAVE_FREQ, 16)
    said = [w for w in tabular.warnings if "remedies off" in w]
    assert said == [f"command line '{on}': health: trainer tabular: remedies off, a table holds no restarted "
                    "runs: kl_runaway, reward_hacking stop their trial instead of restarting it (as with health: "
                    "{remedies: false})"]  # where remedies were asked for
    assert not [w for w in embedded.warnings if "remedies off" in w]
    replay = load_sweep("sweeps/aggressive.yaml", [on, "trainer=replay",
                                                   "replay={trace: tests/data/traces/ppo_qwen05b_gsm8k_sampled.jsonl}"])
    assert not remedies_on(replay)
    assert [w.split("': health: ", 1)[1] for w in replay.warnings if "remedies off" in w] == [
        "trainer replay: remedies off, a recorded log holds no restarted runs: kl_runaway, reward_hacking stop their "
        "trial instead of restarting it (as with health: {remedies: false})"]
    # already kill-only: nothing to say
    off = load_sweep("sweeps/aggressive.yaml", ["trainer=tabular", table, "parameters.horizon={values: [20000]}",
                                                "health={preset: aggressive, remedies: false}"])
    assert not [w for w in off.warnings if "remedies off" in w]


def test_remedies_asked_for_under_asha_are_said_to_be_off():
    """`health: {remedies: true}` with `scheduler: asha` validated as ok, and the run stopped the flagged trials: ASHA
    stops, it does not restart. Remedies on only by default are not worth a warning."""
    asha = "scheduler={type: asha, grace_period: 10, reduction_factor: 3}"
    asked = load_sweep("sweeps/aggressive.yaml", ["health.remedies=true", asha])
    assert not remedies_on(asked)
    assert [w for w in asked.warnings if "remedies off" in w] == [
        "command line 'health.remedies=true': health.remedies: scheduler asha: remedies off, ASHA stops trials and "
        "does not restart them: kl_runaway, reward_hacking stop their trial instead of restarting it (as with "
        "health: {remedies: false}). Use scheduler: none to have them remedied"]
    by_default = load_sweep("sweeps/aggressive.yaml", ["health={preset: aggressive}", asha])
    assert by_default.health.remedies and not [w for w in by_default.warnings if "remedies off" in w]
