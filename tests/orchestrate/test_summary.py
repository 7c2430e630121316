"""best_trials: the best healthy trial (one objective) or the Pareto front (several), via analysis.pareto_front."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from klsweep.orchestrate.summary import best_trials
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


def test_short_numbers():
    from klsweep._format import short

    assert [short(v) for v in (0.711328125, float("nan"), 80, None, "x")] == ["0.7113", "nan", "80", "", "x"]
