"""The checks of a schema-valid sweep that read verl: a DrGRPO sweep whose overrides leave DrGRPO."""

from __future__ import annotations

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from klsweep.verl.presets import PRESETS

A = "actor_rollout_ref.actor."


def _problems(path) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    return e.value.problems


def test_a_drgrpo_sweep_whose_overrides_leave_drgrpo_is_refused_with_the_reason(sweep_file):
    assert PRESETS["drgrpo"][A + "loss_agg_mode"] == "seq-mean-token-sum-norm"
    path = sweep_file(f"overrides:\n  {A}loss_agg_mode: seq-mean-token-sum\n", algorithm="drgrpo")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:5: overrides.{A}loss_agg_mode: {A}loss_agg_mode='seq-mean-token-sum' under "
                              "algorithm: drgrpo: the trials are not DrGRPO, which needs "
                              f"{A}loss_agg_mode='seq-mean-token-sum-norm'"), problem
    assert "under seq-mean-token-sum or token-sum they are per-sequence sums" in problem
    assert "actor/entropy and actor/kl_loss" in problem
    assert problem.endswith("Remove it (the drgrpo preset sets 'seq-mean-token-sum-norm'), or use algorithm: grpo to "
                            "run GRPO with these settings")
    (std,) = _problems(sweep_file("overrides:\n  algorithm.norm_adv_by_std_in_grpo: true\n", algorithm="drgrpo"))
    assert "algorithm.norm_adv_by_std_in_grpo=True under algorithm: drgrpo: the trials are not DrGRPO" in std


def test_drgrpo_own_values_and_a_comparison_that_includes_them_pass(sweep_file):
    assert load_sweep(sweep_file(f"overrides:\n  {A}loss_agg_mode: seq-mean-token-sum-norm\n", algorithm="drgrpo"))
    assert load_sweep(sweep_file("parameters:\n  loss_agg_mode: {values: [seq-mean-token-sum-norm, token-mean]}\n",
                                 algorithm="drgrpo"))
    assert load_sweep(sweep_file(f"overrides:\n  {A}loss_agg_mode: seq-mean-token-sum\n", algorithm="grpo"))
    (only_others,) = _problems(sweep_file("parameters:\n  loss_agg_mode: {values: [token-mean, token-sum]}\n",
                                          algorithm="drgrpo"))
    assert f"parameters.loss_agg_mode: loss_agg_mode ({A}loss_agg_mode) in ['token-mean', 'token-sum'] under " \
           "algorithm: drgrpo" in only_others


def test_an_objective_the_trainer_never_logs_fails_validate_with_the_names_it_logs(sweep_file):
    """``metric: reward`` passed validate; every trial then ran its whole budget before it was marked FAIL."""
    header = "name: t\nalgorithm: grpo\n"
    path = sweep_file(header + "objective: {metric: reward, mode: max}\n", header=False)
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:3: objective.metric: the embedded trainer never logs 'reward'")
    assert "Did you mean 'critic/rewards/mean' or 'actor/reward_kl_penalty'?" in problem
    assert "val-core/arith/acc/mean@1, critic/score/mean" in problem  # what it does log
    listed = sweep_file(header + "objective:\n  - {metric: critic/score/mean, mode: max}\n"
                                 "  - {metric: critic/scor/mean, mode: min}\n", header=False)
    (problem,) = _problems(listed)
    assert problem.startswith(f"{listed}:5: objective.1.metric: the embedded trainer never logs 'critic/scor/mean'")
    assert "Did you mean 'critic/score/mean'?" in problem
    # verl names every metric section/name: a bare name is never logged; a name with a section may be its own
    verl = ("trainer: verl\nbudget: {resources: {gpu: 1}}\noverrides: {trainer.n_gpus_per_node: 1}\n"
            "objective: {metric: %s, mode: max}\n")
    (problem,) = [p for p in _problems(sweep_file(header + verl % "reward", header=False)) if "objective." in p]
    assert "the verl trainer logs verl's metric names, all of them section/name: never 'reward'" in problem
    try:
        load_sweep(sweep_file(header + verl % "val-aux/gsm8k/reward/mean@4", header=False))
    except SweepFileError as e:
        assert not [p for p in e.problems if "objective." in p]


def test_a_health_rule_on_a_metric_the_trainer_never_logs_fails_validate(sweep_file):
    """A misspelt metric in a rule of the sweep's own passed validate, and the rule never fired: the user believed
    the guard was on. An alias, or a name the trainer logs, passes."""
    rules = ("health:\n  rules:\n"
             "    - {name: mykl, metric: actor/kl_los, above: 0.01, action: stop}\n"
             "    - {name: bare, metric: foo_bar_baz, above: 0.01, action: stop}\n"
             "    - {name: alias, metric: ref_kl, above: 5, action: stop}\n"
             "    - {name: derived, metric: kl_loss_share, above: 0.9, action: warn}\n"
             "    - {name: named, all: [{metric: actor/kl_loss, above: 5}, {metric: entropy, below: 0.01}],\n"
             "       action: warn}\n")
    path = sweep_file(rules)
    problems = [p for p in _problems(path) if "health.rules" in p]
    assert len(problems) == 2, problems
    mykl, bare = problems
    assert mykl.startswith(f"{path}:6: health.rules.0: rule mykl: the embedded trainer never logs 'actor/kl_los', "
                           "so the rule can never fire. Did you mean 'actor/kl_loss'?"), mykl
    assert bare.startswith(f"{path}:7: health.rules.1: rule bare: the embedded trainer never logs 'foo_bar_baz'")
    assert "an alias (entropy, ref_kl, kl_coef, score, kl_loss_share, val_score)" in bare
    verl = sweep_file("trainer: verl\nbudget: {resources: {gpu: 1}}\noverrides: {trainer.n_gpus_per_node: 1}\n"
                      + rules.replace("actor/kl_los", "actor/own_metric"), name="verl.yaml")
    (problem,) = [p for p in _problems(verl) if "health.rules" in p]  # verl may log a section/name of its own
    assert "rule bare: the verl trainer logs verl's metric names, all of them section/name: never 'foo_bar_baz'" \
        in problem


def test_a_health_validation_key_the_trainer_never_logs_fails_validate(sweep_file):
    """``health: {validation: val-core/gsm8k/acc/mean@1}`` on the embedded trainer passed validate, and the reward
    hacking rule never judged a trial: the embedded trainer's one validation key is val-core/arith/acc/mean@1."""
    path = sweep_file("health: {preset: conservative, validation: val-core/gsm8k/acc/mean@1}\n")
    (problem,) = [p for p in _problems(path) if "health.validation" in p]
    assert problem.startswith(f"{path}:4: health.validation: the embedded trainer never logs "
                              "'val-core/gsm8k/acc/mean@1': its one validation key is "
                              "'val-core/arith/acc/mean@1'"), problem
    assert load_sweep(sweep_file("health: {preset: conservative, validation: val-core/arith/acc/mean@1}\n"))
    verl = "trainer: verl\nbudget: {resources: {gpu: 1}}\noverrides: {trainer.n_gpus_per_node: 1}\n"
    (problem,) = [p for p in _problems(sweep_file(verl + "health: {validation: gsm8k/acc}\n", name="v.yaml"))
                  if "health.validation" in p]
    assert "'gsm8k/acc' is not a verl validation key" in problem
    try:
        load_sweep(sweep_file(verl + "health: {validation: val-core/openai/gsm8k/reward/mean@1}\n", name="w.yaml"))
    except SweepFileError as e:
        assert not [p for p in e.problems if "health.validation" in p]


def test_the_embedded_metric_names_are_what_the_embedded_trainer_logs():
    """:data:`EMBEDDED_METRICS` against two steps of the embedded trainer (validating each step): PPO with the KL
    in the reward and GRPO with the KL in the loss, the two kinds of shipped embedded sweeps."""
    from klsweep.spec.checks import EMBEDDED_METRICS
    from klsweep.spec.space import seed_params, trial_overrides
    from klsweep.trainers import trainer_kind
    from tests.conftest import REPO

    logged: set[str] = set()
    for name in ("conservative", "grpo_kl"):
        sweep = load_sweep(REPO / "sweeps" / f"{name}.yaml", ["budget.max_steps=2"])
        seeds = seed_params(sweep)
        overrides = trial_overrides(sweep, seeds[0] if seeds else {})
        kind = trainer_kind(sweep.trainer)
        trainer = kind.in_process(sweep, {**kind.defaults(overrides), **overrides, "trainer.test_freq": 1})
        for _ in range(2):
            logged |= set(trainer.train_step())
    assert logged == EMBEDDED_METRICS


def test_a_grid_sweep_with_more_trials_than_cells_warns_that_the_rest_repeat_cells(sweep_file):
    grid = ("parameters:\n  actor_rollout_ref.actor.optim.lr: {values: [0.001, 0.01]}\n"
            "  loss_agg_mode: {values: [token-mean, seq-mean-token-mean, seq-mean-token-sum-norm]}\nsampler: grid\n")
    over = [w for w in load_sweep(sweep_file(grid + "budget: {trials: 8}\n")).warnings if "grid" in w]
    assert len(over) == 1
    assert over[0].endswith("budget.trials: 8 trials but the grid has 6 cells (2 × 3 values): trials 6-7 would run "
                            "cells that already ran, with the same settings and seed. Lower budget.trials to 6, or add "
                            "values to the grid")
    assert not [w for w in load_sweep(sweep_file(grid + "budget: {trials: 6}\n")).warnings if "grid" in w]
    [one] = [w for w in load_sweep(sweep_file(grid), ["budget.trials=7"]).warnings if "grid" in w]
    assert one.startswith("command line 'budget.trials=7': budget.trials: 7 trials") and "trial 6 would run" in one
    # another sampler may run more trials than the values' combinations
    assert not [w for w in load_sweep(sweep_file(grid.replace("grid", "tpe") + "budget: {trials: 8}\n")).warnings
                if "grid" in w]
