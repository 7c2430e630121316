"""The study owns the sampler's sequence: a sweep resumed or extended in a new process continues the sequence of
proposals instead of replaying it (optuna/optuna#3255: a seeded sampler built again proposes its first trials again)."""

from __future__ import annotations

import optuna
import pytest

from klsweep.orchestrate.samplers import build_sampler, trial_seed
from klsweep.space import define_space
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import sweep_file

PARAMETERS = {
    "kl_coef": {"distribution": "log_uniform_values", "min": 0.0005, "max": 0.05},
    "entropy_coeff": {"values": [0.0, 0.001, 0.01]},
}


def _ask(study: optuna.Study, sweep, n: int) -> list[tuple]:
    """Ask ``n`` trials the way Ray's OptunaSearch does (define-by-run), tell each a value; their param sets."""
    space = define_space(sweep)
    proposed = []
    for _ in range(n):
        trial = study.ask()
        space(trial)
        try:
            study.tell(trial, trial.params["algorithm.kl_ctrl.kl_coef"])
        except RuntimeError:  # GridSampler's Study.stop() once the grid ran; Ray's OptunaSearch ignores it too
            assert study.trials[-1].state == optuna.trial.TrialState.COMPLETE
        proposed.append(tuple(sorted(trial.params.items())))
    return proposed


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_new_process_continues_the_sequence_instead_of_replaying_it(tmp_path, sampler):
    sweep = load_sweep(sweep_file(tmp_path, parameters=PARAMETERS, sampler=sampler, budget={"trials": 12}))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    # one driver proposes 5 trials; a second driver (a new sampler, as after a SIGKILL and `sweep resume`) 7 more
    first = optuna.create_study(study_name="s", storage=storage, sampler=build_sampler(sweep), direction="maximize")
    proposed = _ask(first, sweep, 5)
    resumed = optuna.load_study(study_name="s", storage=storage, sampler=build_sampler(sweep))
    proposed += _ask(resumed, sweep, 7)
    assert len(set(proposed)) == 12  # Optuna's own seeded sampler gives the first proposals again here

    # and the sequence is the study's: one uninterrupted driver proposes exactly the same 12
    whole = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    assert _ask(whole, sweep, 12) == proposed


def test_trial_seeds_differ_by_trial_and_by_sweep_seed():
    seeds = {trial_seed(seed, number) for seed in range(3) for number in range(100)}
    assert len(seeds) == 300
    assert all(0 <= s < 2**32 for s in seeds)
    assert trial_seed(0, 7) == trial_seed(0, 7)


def test_a_resumed_grid_visits_each_remaining_point_once(tmp_path):
    grid = {"kl_coef": {"values": [0.0005, 0.001, 0.002, 0.005]}, "entropy_coeff": {"values": [0.0, 0.001, 0.01]}}
    sweep = load_sweep(sweep_file(tmp_path, parameters=grid, sampler="grid", budget={"trials": 12}))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = optuna.create_study(study_name="g", storage=storage, sampler=build_sampler(sweep), direction="maximize")
    proposed = _ask(first, sweep, 5)
    resumed = optuna.load_study(study_name="g", storage=storage, sampler=build_sampler(sweep))
    proposed += _ask(resumed, sweep, 7)
    assert len(set(proposed)) == 12
