"""The study owns the sampler's sequence: a sweep resumed or extended in a new process continues the sequence of
proposals instead of replaying it (optuna/optuna#3255: a seeded sampler built again proposes its first trials again)."""

from __future__ import annotations

import optuna
import pytest

from klsweep.orchestrate.samplers import build_sampler, trial_seed
from klsweep.space import define_space
from klsweep.spec import load_sweep
from klsweep.spec.schema import SAMPLERS
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
    # pinned: a resumed study's later trials must get the seeds its earlier process would have given them, on any
    # machine and numpy version (numpy's SeedSequence([seed, number]), first 32-bit word of its state)
    assert (trial_seed(0, 7), trial_seed(3, 0)) == (1369798745, 1576890651)


def test_a_resumed_grid_visits_each_remaining_point_once(tmp_path):
    grid = {"kl_coef": {"values": [0.0005, 0.001, 0.002, 0.005]}, "entropy_coeff": {"values": [0.0, 0.001, 0.01]}}
    sweep = load_sweep(sweep_file(tmp_path, parameters=grid, sampler="grid", budget={"trials": 12}))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = optuna.create_study(study_name="g", storage=storage, sampler=build_sampler(sweep), direction="maximize")
    proposed = _ask(first, sweep, 5)
    resumed = optuna.load_study(study_name="g", storage=storage, sampler=build_sampler(sweep))
    proposed += _ask(resumed, sweep, 7)
    assert len(set(proposed)) == 12


RANGES = {  # numeric ranges only: every sampler name accepts them (cmaes refuses categories)
    "kl_coef": {"distribution": "log_uniform_values", "min": 0.0005, "max": 0.05},
    "entropy_coeff": {"distribution": "uniform", "min": 0.0, "max": 0.01},
}


def _random_proposal(seed: int, sweep) -> tuple:
    """What Optuna's own RandomSampler seeded ``seed`` proposes for the sweep's space as a study's first trial."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction="maximize")
    return _ask(study, sweep, 1)[0]


IDENTITIES = [
    # budget 16 trials: klsweep's start-up default max(2, min(10, 16 // 4)) = 4, NSGA-II's population
    # max(4, min(50, 16 // 2)) = 8 (Optuna's own defaults: 10 start-up trials, population 50, multivariate off)
    ("tpe", optuna.samplers.TPESampler, {"_n_startup_trials": 4, "_multivariate": True}),
    ("gp", optuna.samplers.GPSampler, {"_n_startup_trials": 4}),
    ("nsga2", optuna.samplers.NSGAIISampler, {"_population_size": 8}),
    ("random", optuna.samplers.RandomSampler, {}),
    ("cmaes", optuna.samplers.CmaEsSampler, {}),
]


def test_every_sampler_name_of_the_schema_has_its_identity_checked():
    # both ways: a name the sweep file accepts without a check here, or a check of a name it refuses, fails
    assert {name for name, _, _ in IDENTITIES} | {"grid"} == set(SAMPLERS)


@pytest.mark.parametrize("name,sampler_class,settings", IDENTITIES)
def test_each_sampler_name_is_optunas_sampler_with_klsweeps_settings(tmp_path, name, sampler_class, settings):
    sweep = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler=name, seed=7, budget={"trials": 16}))
    study = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    first = _ask(study, sweep, 1)[0]
    inner = study.sampler.sampler  # the Optuna sampler StudySeededSampler built for the trial
    assert type(inner) is sampler_class
    assert {attribute: getattr(inner, attribute) for attribute in settings} == settings  # private in Optuna 5.0
    if name != "cmaes":  # CMA-ES draws its first point from its own initial distribution, not uniformly
        # seeded with the sweep seed through trial_seed: the first trial is the random draw of that seed
        assert first == _random_proposal(trial_seed(7, 0), sweep)
        assert first != _random_proposal(trial_seed(8, 0), sweep)


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_model_based_samplers_propose_at_random_for_exactly_the_start_up_trials(tmp_path, name):
    # start-up of 4 trials (budget 16): trials 0-3 are the random draws of their trial seeds, trial 4 is the model's
    sweep = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler=name, seed=7, budget={"trials": 16}))
    study = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    proposed = _ask(study, sweep, 5)
    random_draws = [_random_proposal(trial_seed(7, n), sweep) for n in range(5)]
    assert proposed[:4] == random_draws[:4]
    assert proposed[4] != random_draws[4]


def test_grid_is_optunas_grid_sampler_over_the_listed_values(tmp_path):
    grid = {"kl_coef": {"values": [0.0005, 0.001]}, "entropy_coeff": {"values": [0.0, 0.01]}}
    sweep = load_sweep(sweep_file(tmp_path, parameters=grid, sampler="grid", seed=7, budget={"trials": 4}))
    sampler = build_sampler(sweep)
    assert type(sampler) is optuna.samplers.GridSampler
    study = optuna.create_study(sampler=sampler, direction="maximize")
    assert sorted(_ask(study, sweep, 4)) == sorted(
        (("actor_rollout_ref.actor.entropy_coeff", e), ("algorithm.kl_ctrl.kl_coef", k))
        for e in (0.0, 0.01) for k in (0.0005, 0.001)
    )
