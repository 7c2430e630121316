"""Optuna samplers by the names a sweep file uses: tpe, gp, nsga2, random, grid, cmaes.

Each is Optuna's own sampler, seeded with the sweep seed. Health stops reach the samplers as the trial constraint
``health`` (set by :class:`~klsweep.orchestrate.searcher.KlsweepSearch` with Optuna 5's ``Trial.set_constraint``).
"""

from __future__ import annotations

from typing import Any

import optuna

from klsweep.errors import SweepFileError


def build_sampler(sweep) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of ``sweep.sampler`` (name + options), seeded with ``sweep.seed``.

    TPE's random start-up phase defaults to ``max(2, min(10, trials // 4))`` trials so that a 16-trial sweep spends
    most of its budget on model-guided trials (Optuna's default of 10 suits budgets of 100+).

    Raises:
        SweepFileError: the sampler cannot handle this sweep's space (grid over a continuous range, cmaes on a
            multi-objective or categorical space) or an option is not accepted by the Optuna sampler.
    """
    name = sweep.sampler.name
    options: dict[str, Any] = dict(sweep.sampler.options)
    multi = len(sweep.objectives) > 1
    trials = sweep.budget.trials
    if name == "grid":
        return _grid(sweep, options)
    if name == "cmaes":
        _refuse_if(multi, "cmaes optimises a single objective; use nsga2, tpe or gp for a Pareto sweep")
        non_numeric = [k for k, p in sweep.parameters.items() if hasattr(p, "values") or p.when]
        _refuse_if(
            bool(non_numeric),
            f"cmaes samples numeric, unconditional ranges only, but {', '.join(non_numeric)} "
            "are categorical or conditional (Optuna would sample them at random): use tpe or gp",
        )
    factories = {
        "tpe": lambda: optuna.samplers.TPESampler(
            **{"n_startup_trials": max(2, min(10, trials // 4)), "multivariate": True, **options},
            seed=sweep.seed,
        ),
        "gp": lambda: optuna.samplers.GPSampler(
            **{"n_startup_trials": max(2, min(10, trials // 4)), **options},
            seed=sweep.seed,
        ),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(
            **{"population_size": max(4, min(50, trials // 2)), **options},
            seed=sweep.seed,
        ),
        "random": lambda: optuna.samplers.RandomSampler(**options, seed=sweep.seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(**options, seed=sweep.seed),
    }
    try:
        return factories[name]()
    except TypeError as e:
        raise SweepFileError([f"sampler.options: {e} — see the Optuna documentation of the {name} sampler"]) from None


def _grid(sweep, options: dict[str, Any]) -> optuna.samplers.GridSampler:
    from klsweep.space import parameters
    from klsweep.spec.schema import Choice, Constant

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
    return optuna.samplers.GridSampler(space, seed=sweep.seed, **options)


def _refuse_if(condition: bool, message: str) -> None:
    if condition:
        raise SweepFileError([f"sampler: {message}"])
