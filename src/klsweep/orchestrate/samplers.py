"""Optuna samplers by the names a sweep file uses: tpe, gp, nsga2, random, grid, cmaes.

Each is Optuna's own sampler, built for every trial with a seed derived from the sweep seed and the trial number
(:class:`StudySeededSampler`). A resumed sweep thus continues the study's sequence instead of replaying it.
The model-based ones (tpe, gp) start from a space-filling design instead of random draws (:class:`SpaceFillingStart`).
Health stops reach the samplers as a trial constraint (:data:`klsweep.results.CONSTRAINTS_ATTR`, set by
:class:`~klsweep.orchestrate.searcher.KlsweepSearch`).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial

from klsweep.errors import SweepFileError
from klsweep.spec.schema import Choice, Constant, Sweep
from klsweep.spec.space import parameters


def build_sampler(sweep: Sweep) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of ``sweep.sampler`` (name + options), seeded per trial from ``sweep.seed``
    (:class:`StudySeededSampler`).

    tpe and gp start with ``n_startup_trials`` trials (seed trials included) at the points of a scrambled Sobol
    sequence (:class:`SpaceFillingStart`). The default is ``max(2, min(10, trials // 16))``. It leaves a
    12-32-trial sweep one space-filling trial after its seed trial, and the rest of its budget to the model.
    Optuna's default of 10 random trials suits budgets of 100+. TPE also scores ``n_ei_candidates`` 128 candidates
    per trial (Optuna: 24). With the few observations of a small sweep, it then proposes the best of its density
    ratio rather than a near-random draw from its wide kernels. Both settings were chosen on the tabular benchmark
    (``benchmarks/search_efficiency.py --table``, BENCHMARKS.md).

    Raises:
        SweepFileError: the sampler cannot handle this sweep's space (grid over a continuous range, cmaes on a
            multi-objective or categorical space) or an option is not accepted by the Optuna sampler.
    """
    name = sweep.sampler.name
    options: dict[str, Any] = dict(sweep.sampler.options)
    multi = len(sweep.objectives) > 1
    trials = sweep.budget.trials
    if name == "cmaes":
        _refuse_if(multi, "cmaes optimises a single objective; use nsga2, tpe or gp for a Pareto sweep")
        non_numeric = [k for k, p in sweep.parameters.items() if hasattr(p, "values") or p.when]
        _refuse_if(
            bool(non_numeric),
            f"cmaes samples numeric, unconditional ranges only, but {', '.join(non_numeric)} "
            "are categorical or conditional (Optuna would sample them at random): use tpe or gp",
        )
    try:
        if name == "grid":
            # GridSampler already keeps its sequence in the study (each trial's grid id is a system attribute) and
            # shuffles its grid once from the seed: seeded the same in every process, it continues after a resume.
            return _new_sampler(name, options, trials, _grid_space(sweep), sweep.seed)
        if name in MODEL_BASED:
            startup = options.pop("n_startup_trials", startup_trials(trials))
            # the model's own random start-up only covers a trial that starts before any trial finished
            after = {"n_startup_trials": 1, **options}
            model = StudySeededSampler(functools.partial(_new_sampler, name, after, trials, None), seed=sweep.seed)
            return SpaceFillingStart(model, list(parameters(sweep)), startup, seed=sweep.seed)
        return StudySeededSampler(functools.partial(_new_sampler, name, options, trials, None), seed=sweep.seed)
    except TypeError as e:
        raise SweepFileError([f"sampler.options: {e} — see the Optuna documentation of the {name} sampler"]) from None


#: Samplers that fit a model to the trials so far and start from a space-filling design (:class:`SpaceFillingStart`).
MODEL_BASED = ("tpe", "gp")


def startup_trials(trials: int) -> int:
    """klsweep's default start-up of tpe and gp for a budget of ``trials``: ``max(2, min(10, trials // 16))``, seed
    trials included (2 up to 47 trials, 10 from 160)."""
    return max(2, min(10, trials // 16))


class SpaceFillingStart(optuna.samplers.BaseSampler):
    """The first ``startup`` trials of a study (by trial number) at the points of a scrambled Sobol sequence seeded
    with the sweep seed; every later trial from ``model``.

    Trial ``n < startup`` takes row ``n`` of the sequence: Owen-scrambled Sobol (``scipy.stats.qmc.Sobol``; Sobol
    1967, Owen 1998). The row has one column per sweep parameter in file order. Each column is mapped onto the
    parameter's own scale: log for ``log_uniform_values``, equal shares of ``[0, 1)`` for categorical values. The
    first ``2**k`` rows of a Sobol sequence put one point in each of ``2**k`` equal slices of every parameter's
    range; random draws of a small start-up often cluster. Rows depend on the sweep seed and the trial number only,
    never on the process. A resumed sweep thus continues the design instead of repeating it, and the same seed gives
    the same design. A seed trial (enqueued) keeps its own values and leaves its row unused.

    Args:
        model: the sampler of the trials after the start-up (TPE or GP, in a :class:`StudySeededSampler`).
        names: the sweep's parameter names as Optuna sees them (resolved verl keys), in file order.
        startup: trials of the space-filling start, seed trials included (0: none).
        seed: the sweep seed (scrambles the sequence).
    """
    def __init__(self, model: optuna.samplers.BaseSampler, names: Sequence[str], startup: int, seed: int) -> None:
        self.model = model
        self.startup = startup
        self._columns = {name: i for i, name in enumerate(names)}
        self._rows = _sobol(len(names), startup, seed)

    def _starting(self, trial: FrozenTrial) -> bool:
        return trial.number < self.startup

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.model.before_trial(study, trial)  # also seeds the model's independent draws of this trial

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {} if self._starting(trial) else self.model.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {} if self._starting(trial) else self.model.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if self._starting(trial) and param_name in self._columns:
            return _at(float(self._rows[trial.number, self._columns[param_name]]), param_distribution)
        return self.model.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: optuna.trial.TrialState,
                    values: Sequence[float] | None) -> None:
        self.model.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.model.reseed_rng()


def _sobol(dimensions: int, rows: int, seed: int) -> np.ndarray:
    """``rows × dimensions`` points of the Owen-scrambled Sobol sequence seeded ``seed``, in ``[0, 1)``."""
    from scipy.stats import qmc

    if rows == 0 or dimensions == 0:
        return np.zeros((rows, dimensions))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "balance properties ... n = 2**m": any prefix is still a design
        return qmc.Sobol(dimensions, scramble=True, seed=seed).random(rows)


def _at(u: float, distribution: BaseDistribution) -> Any:
    """The value of ``distribution`` at quantile ``u`` of its own scale (log for log ranges, equal shares of the
    unit interval for categorical choices, rounded to a ranged step)."""
    if isinstance(distribution, CategoricalDistribution):
        choices = distribution.choices
        return choices[min(int(u * len(choices)), len(choices) - 1)]
    if not isinstance(distribution, (FloatDistribution, IntDistribution)):
        raise TypeError(f"no space-filling value for {distribution!r}")
    low, high = float(distribution.low), float(distribution.high)
    if distribution.log:
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        value = low + u * (high - low)
    if distribution.step is not None:
        value = low + round((value - low) / distribution.step) * distribution.step
    value = min(max(value, low), high)
    return int(round(value)) if isinstance(distribution, IntDistribution) else value


class StudySeededSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler made anew for every trial, seeded from the sweep seed and the trial's number.

    Optuna's samplers keep their random state in the process. A seeded sampler built again in a new process (a
    resumed or extended sweep) proposes its first trials again (optuna/optuna#3255, for ``RandomSampler`` and the
    random start-up of ``TPESampler``). Seeding each trial from ``(seed, trial.number)`` makes the study, not the
    process, own the sequence. Trial numbers never repeat in a study, so a resume continues the sequence. The same
    study history gives the same proposals. Every Optuna sampler keeps the rest of its state in the study (trials,
    system attributes), so building a new one per trial loses nothing else.

    Args:
        make: builds the wrapped sampler from a seed (an ``int``); must be picklable (Ray Tune saves the searcher).
        seed: the sweep seed.
    """
    def __init__(self, make: Callable[[int], optuna.samplers.BaseSampler], seed: int) -> None:
        self._make = make
        self._seed = seed
        self._sampler = make(seed)

    @property
    def sampler(self) -> optuna.samplers.BaseSampler:
        """The Optuna sampler of the current trial."""
        return self._sampler

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._sampler = self._make(trial_seed(self._seed, trial.number))
        self._sampler.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._sampler.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._sampler.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: optuna.trial.TrialState,
                    values: Sequence[float] | None) -> None:
        self._sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number`` of a sweep seeded ``seed``: a 32-bit integer from numpy's ``SeedSequence``
    (independent streams for distinct ``(seed, number)`` pairs)."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def _new_sampler(name: str, options: dict[str, Any], trials: int, grid: dict[str, list[Any]] | None,
                 seed: int) -> optuna.samplers.BaseSampler:
    """Optuna's sampler ``name`` with the sweep's ``options`` and klsweep's defaults for a budget of ``trials``.

    Raises:
        TypeError: an option the Optuna sampler does not accept.
    """
    startup = startup_trials(trials)
    if name == "tpe":
        return optuna.samplers.TPESampler(
            **{"n_startup_trials": startup, "multivariate": True, "n_ei_candidates": 128, **options}, seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(**{"n_startup_trials": startup, **options}, seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(**{"population_size": max(4, min(50, trials // 2)), **options}, seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(**options, seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(**options, seed=seed)
    if name == "grid":
        return GridAfterSeeds(grid or {}, seed=seed, **options)
    raise ValueError(f"unknown sampler {name!r}: use one of tpe, gp, nsga2, random, grid, cmaes")


class GridAfterSeeds(optuna.samplers.GridSampler):
    """Optuna's GridSampler that gives no trial a grid cell another trial of the study has, seed trials included.

    Optuna's own gives trial ``n`` cell ``n`` of its shuffled grid (while ``n`` is below the grid's size) and counts a
    cell as run only by a trial holding its ``grid_id``. An enqueued trial (a seed trial, a confirmation run) holds
    none, so the grid ran the seed trials' cells again and left as many cells out. Here an enqueued trial whose
    values are a cell's is given that cell's ``grid_id`` (its values stay its own). A trial whose cell ``n`` another
    trial holds or is queued with gets the first cell, in the grid's seeded order, that none does; every other trial
    gets Optuna's own choice. The cells taken are read from the study, so a resumed sweep continues the grid.
    GridSampler internals used (private in Optuna 5.0, no public accessor; ``tests/orchestrate/test_samplers.py``
    fails when they move): ``_all_grids``, ``_param_names``, ``_search_space``, ``_same_search_space``,
    ``_grid_value_equal``, and the trial attributes ``grid_id`` and ``search_space`` it sets through
    ``study._storage``, as its own ``before_trial`` does.
    """

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "grid_id" in trial.system_attrs:  # a trial Optuna re-runs keeps its cell
            return
        fixed = trial.system_attrs.get("fixed_params")
        if fixed is None:
            taken = {self._taken(t) for t in study.get_trials(deepcopy=False) if t.number != trial.number}
            if trial.number < len(self._all_grids) and trial.number in taken:
                cell = next((i for i in range(len(self._all_grids)) if i not in taken), None)
            else:
                cell = None
            if cell is None:
                super().before_trial(study, trial)
                return
        else:
            cell = self._cell(fixed)
        if cell is not None:
            study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
            study._storage.set_trial_system_attr(trial._trial_id, "grid_id", cell)

    def _taken(self, trial: FrozenTrial) -> int | None:
        """The cell of this grid a trial of the study holds, or is queued with (None: none)."""
        attrs = trial.system_attrs
        if "grid_id" in attrs:
            return attrs["grid_id"] if self._same_search_space(attrs.get("search_space", {})) else None
        return self._cell(attrs.get("fixed_params") or {})

    def _cell(self, params: dict[str, Any]) -> int | None:
        """The index of the cell whose values ``params`` holds (None when it holds no cell's)."""
        if not all(name in params for name in self._param_names):
            return None
        values = [params[name] for name in self._param_names]
        return next((i for i, cell in enumerate(self._all_grids)
                     if all(map(self._grid_value_equal, values, cell))), None)


def _grid_space(sweep: Sweep) -> dict[str, list[Any]]:
    """The grid of a ``sampler: grid`` sweep: each categorical parameter's values (constants are not suggested).

    Raises:
        SweepFileError: a range or a conditional parameter (a grid needs value lists).
    """
    space, problems = {}, []
    for key, param in parameters(sweep).items():
        if isinstance(param, Choice):
            space[key] = list(param.values)
        elif isinstance(param, Constant):
            continue  # returned by the space as a constant, never suggested
        else:
            problems.append(f"parameters.{key}: sampler grid needs `values: [...]` lists, not a {param.distribution} "
                            "range — list the grid points, or use tpe/random")
        if getattr(param, "when", None):
            problems.append(f"parameters.{key}: sampler grid cannot sample conditional parameters — use tpe or random")
    if problems:
        raise SweepFileError(problems)
    return space


def _refuse_if(condition: bool, message: str) -> None:
    if condition:
        raise SweepFileError([f"sampler: {message}"])
