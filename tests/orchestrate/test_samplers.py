"""The study owns the sampler's sequence: a sweep resumed or extended in a new process continues the sequence of
proposals instead of replaying it (optuna/optuna#3255: a seeded sampler built again proposes its first trials again)."""

from __future__ import annotations

import math

import optuna
import pytest

from klsweep.orchestrate.samplers import build_sampler, trial_seed
from klsweep.spec import load_sweep
from klsweep.spec.schema import SAMPLERS, Sweep
from klsweep.spec.space import define_space, seed_params
from tests.orchestrate.conftest import sweep_file

PARAMETERS = {
    "kl_coef": {"distribution": "log_uniform_values", "min": 0.0005, "max": 0.05},
    "entropy_coeff": {"values": [0.0, 0.001, 0.01]},
}


def _ask(study: optuna.Study, sweep: Sweep, n: int) -> list[tuple]:
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


def _random_proposal(seed: int, sweep: Sweep) -> tuple:
    """What Optuna's own RandomSampler seeded ``seed`` proposes for the sweep's space as a study's first trial."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction="maximize")
    return _ask(study, sweep, 1)[0]


IDENTITIES = [
    # budget 16 trials: tpe and gp start with max(2, min(10, 16 // 16)) = 2 space-filling trials, then the model (its
    # own random start-up only for a trial that starts before any finished); TPE scores 128 candidates; NSGA-II's
    # population max(4, min(50, 16 // 2)) = 8 (Optuna's own defaults: 10 start-up trials, 24 candidates, population
    # 50, multivariate off)
    ("tpe", optuna.samplers.TPESampler, {"_n_startup_trials": 1, "_multivariate": True, "_n_ei_candidates": 128}),
    ("gp", optuna.samplers.GPSampler, {"_n_startup_trials": 1}),
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
    outer = study.sampler
    if name in ("tpe", "gp"):  # SpaceFillingStart: 2 Sobol trials (seed trials included), then the model
        assert outer.startup == 2
        outer = outer.model
    inner = outer.sampler  # the Optuna sampler StudySeededSampler built for the trial
    assert type(inner) is sampler_class
    assert {attribute: getattr(inner, attribute) for attribute in settings} == settings  # private in Optuna 5.0
    if name in ("random", "nsga2"):  # CMA-ES draws from its own initial distribution; tpe and gp: see below
        # seeded with the sweep seed through trial_seed: the first trial is the random draw of that seed
        assert first == _random_proposal(trial_seed(7, 0), sweep)
        assert first != _random_proposal(trial_seed(8, 0), sweep)


def _slices(values, low: float, high: float, n: int, log: bool) -> list[int]:
    """The slice (0..n-1) of ``[low, high]`` cut into n equal parts (in log space when ``log``) holding each value."""
    lo, hi = (math.log(low), math.log(high)) if log else (low, high)
    return sorted(min(int(((math.log(v) if log else v) - lo) / (hi - lo) * n), n - 1) for v in values)


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_model_based_samplers_start_space_filling_then_use_the_model(tmp_path, name):
    # 8 start-up trials: one in each eighth of every parameter's range (log for kl_coef), which 8 random draws give
    # with probability 8!/8**8 < 0.3 % per parameter; trial 8 is the model's
    sweep = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler={"name": name, "options": {
        "n_startup_trials": 8}}, seed=7, budget={"trials": 16}))
    study = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    proposed = [dict(p) for p in _ask(study, sweep, 9)]
    kl = [p["algorithm.kl_ctrl.kl_coef"] for p in proposed]
    entropy = [p["actor_rollout_ref.actor.entropy_coeff"] for p in proposed]
    assert _slices(kl[:8], 0.0005, 0.05, 8, log=True) == list(range(8))
    assert _slices(entropy[:8], 0.0, 0.01, 8, log=False) == list(range(8))
    # deterministic by seed: the same seed gives the same design, another seed another one
    again = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    assert [dict(p) for p in _ask(again, sweep, 8)] == proposed[:8]
    other = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler={"name": name, "options": {
        "n_startup_trials": 8}}, seed=8, budget={"trials": 16}))
    assert [dict(p) for p in _ask(optuna.create_study(sampler=build_sampler(other), direction="maximize"), other,
                                  8)] != proposed[:8]
    # the model's trial is not the design's next point: the design of 9 start-up trials has another 9th row
    longer = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler={"name": name, "options": {
        "n_startup_trials": 9}}, seed=7, budget={"trials": 16}))
    assert dict(_ask(optuna.create_study(sampler=build_sampler(longer), direction="maximize"), longer, 9)[8]) != \
        proposed[8]


def test_the_start_up_spreads_categorical_values_and_a_resume_continues_it(tmp_path):
    # 4 values, 8 start-up trials: each value twice (random: 8 draws of 4 values are that even in 2.4 % of cases);
    # a second driver after 3 trials continues the design: the 8 are the uninterrupted driver's, none repeated
    space = {**RANGES, "entropy_coeff": {"values": [0.0, 0.001, 0.003, 0.01]}}
    sweep = load_sweep(sweep_file(tmp_path, parameters=space, sampler={"name": "tpe", "options": {
        "n_startup_trials": 8}}, seed=3, budget={"trials": 12}))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = optuna.create_study(study_name="s", storage=storage, sampler=build_sampler(sweep), direction="maximize")
    proposed = _ask(first, sweep, 3)
    resumed = optuna.load_study(study_name="s", storage=storage, sampler=build_sampler(sweep))
    proposed += _ask(resumed, sweep, 5)
    assert sorted(dict(p)["actor_rollout_ref.actor.entropy_coeff"] for p in proposed) == [
        0.0, 0.0, 0.001, 0.001, 0.003, 0.003, 0.01, 0.01]
    assert len(set(proposed)) == 8
    assert _ask(optuna.create_study(sampler=build_sampler(sweep), direction="maximize"), sweep, 8) == proposed


def test_a_seed_trial_keeps_its_values_and_the_design_fills_the_rest(tmp_path):
    seed_trial = {"kl_coef": 0.002, "entropy_coeff": 0.005}
    sweep = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler={"name": "tpe", "options": {
        "n_startup_trials": 4}}, seed=7, budget={"trials": 12}, seed_trials=[seed_trial]))
    study = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    for params in seed_params(sweep):
        study.enqueue_trial(params)
    proposed = [dict(p) for p in _ask(study, sweep, 4)]
    assert proposed[0] == {"algorithm.kl_ctrl.kl_coef": 0.002, "actor_rollout_ref.actor.entropy_coeff": 0.005}
    plain = load_sweep(sweep_file(tmp_path, parameters=RANGES, sampler={"name": "tpe", "options": {
        "n_startup_trials": 4}}, seed=7, budget={"trials": 12}))
    assert proposed[1:] == [dict(p) for p in _ask(optuna.create_study(sampler=build_sampler(plain),
                                                                      direction="maximize"), plain, 4)][1:]


def test_grid_is_optunas_grid_sampler_over_the_listed_values(tmp_path):
    grid = {"kl_coef": {"values": [0.0005, 0.001]}, "entropy_coeff": {"values": [0.0, 0.01]}}
    sweep = load_sweep(sweep_file(tmp_path, parameters=grid, sampler="grid", seed=7, budget={"trials": 4}))
    sampler = build_sampler(sweep)
    assert isinstance(sampler, optuna.samplers.GridSampler)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    assert sorted(_ask(study, sweep, 4)) == sorted(
        (("actor_rollout_ref.actor.entropy_coeff", e), ("algorithm.kl_ctrl.kl_coef", k))
        for e in (0.0, 0.01) for k in (0.0005, 0.001)
    )


GRID = {"kl_coef": {"values": [0.0005, 0.001, 0.002]}, "entropy_coeff": {"values": [0.0, 0.01]}}
# two seed trials on cells of the grid: each of the 6 cells must run once in 6 trials
GRID_SEEDS = [{"kl_coef": 0.001, "entropy_coeff": 0.0}, {"kl_coef": 0.002, "entropy_coeff": 0.01}]
WHOLE_GRID = {(("actor_rollout_ref.actor.entropy_coeff", e), ("algorithm.kl_ctrl.kl_coef", k))
              for e in (0.0, 0.01) for k in (0.0005, 0.001, 0.002)}


def _grid_sweep(tmp_path, seed: int) -> Sweep:
    return load_sweep(sweep_file(tmp_path, parameters=GRID, sampler="grid", seed_trials=GRID_SEEDS, seed=seed,
                                 budget={"trials": 6}))


@pytest.mark.parametrize("seed", range(4))
def test_a_grid_runs_each_cell_once_with_the_seed_trials_cells_among_them(tmp_path, seed):
    # as Ray's OptunaSearch: seed trials enqueued, then every trial asked before any is told (6 running at once)
    sweep = _grid_sweep(tmp_path, seed)
    study = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    for point in seed_params(sweep):
        study.enqueue_trial(point)
    space = define_space(sweep)
    trials = [study.ask() for _ in range(6)]
    for trial in trials:
        space(trial)
    proposed = [tuple(sorted(t.params.items())) for t in trials]
    assert proposed[:2] == [(("actor_rollout_ref.actor.entropy_coeff", 0.0), ("algorithm.kl_ctrl.kl_coef", 0.001)),
                            (("actor_rollout_ref.actor.entropy_coeff", 0.01), ("algorithm.kl_ctrl.kl_coef", 0.002))]
    assert set(proposed) == WHOLE_GRID
    for trial in trials:
        try:
            study.tell(trial, 1.0)
        except RuntimeError:  # GridSampler's Study.stop() once the grid ran
            pass
    assert build_sampler(sweep).is_exhausted(study)  # Optuna counts the seed trials' cells as run


def test_a_resumed_grid_with_seed_trials_runs_each_remaining_cell_once(tmp_path):
    sweep = _grid_sweep(tmp_path, 0)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = optuna.create_study(study_name="g", storage=storage, sampler=build_sampler(sweep), direction="maximize")
    for point in seed_params(sweep):
        first.enqueue_trial(point)
    proposed = _ask(first, sweep, 3)
    resumed = optuna.load_study(study_name="g", storage=storage, sampler=build_sampler(sweep))
    proposed += _ask(resumed, sweep, 3)
    assert set(proposed) == WHOLE_GRID
