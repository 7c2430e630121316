"""best_trials: the best healthy trial (one objective) or the Pareto front (several), via analysis.pareto_front."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from klsweep.orchestrate.summary import best_trials, reproduce_commands
from klsweep.spec.schema import Objective


def sweep_of(*objectives):
    return SimpleNamespace(objectives=[Objective(metric=m, mode=mode) for m, mode in objectives])


DF = pd.DataFrame({
    "number": [0, 1, 2, 3],
    "state": ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"],
    "health": ["healthy", "healthy", "stopped", "stopped"],
    "value/score": [0.5, 0.7, 0.9, None],
    "value/kl": [0.1, 0.3, 0.01, None],
    "config/actor_rollout_ref.actor.use_kl_loss": [True, True, True, True],
})


def test_best_trial_single_objective_skips_stopped():
    # trial 2 has the top score but a health rule stopped it
    assert list(best_trials(sweep_of(("score", "max")), DF)["number"]) == [1]


def test_front_several_objectives():
    # feasible: 0 (0.5, 0.1) and 1 (0.7, 0.3): neither dominates the other; 2 is infeasible
    assert list(best_trials(sweep_of(("score", "max"), ("kl", "min")), DF)["number"]) == [0, 1]
    # all infeasible: empty, no exception, and the front says so
    front = best_trials(sweep_of(("score", "max"), ("kl", "min")), DF.assign(health="stopped"))
    assert front.empty and "no feasible trial" in front.attrs["notes"][0]


def test_reproduce_commands_drop_embedded_sizes_from_the_verl_line():
    overrides = {"algorithm.kl_ctrl.kl_coef": 0.002, "data.train_batch_size": 16}
    (label, embedded), (_, verl) = reproduce_commands(overrides, "embedded")
    assert embedded == "python3 -m klsweep.trainers.embedded algorithm.kl_ctrl.kl_coef=0.002 data.train_batch_size=16"
    # verl's default batch is 1024 prompts: the embedded trainer's 16 is not a setting to carry over
    assert verl == "python3 -m verl.trainer.main_ppo algorithm.kl_ctrl.kl_coef=0.002"
    assert reproduce_commands(overrides, "verl") == [
        ("", "python3 -m verl.trainer.main_ppo algorithm.kl_ctrl.kl_coef=0.002 data.train_batch_size=16")]


def test_a_replay_trial_has_no_command_to_reproduce_it():
    assert reproduce_commands({"algorithm.kl_ctrl.kl_coef": 0.002}, "replay") == []


def test_short_numbers():
    from klsweep._format import short

    assert [short(v) for v in (0.711328125, float("nan"), 80, None, "x")] == ["0.7113", "nan", "80", "", "x"]
