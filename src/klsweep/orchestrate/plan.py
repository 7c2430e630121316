"""``sweep plan`` and ``sweep validate``: what a sweep would run, and whether verl would accept it, without Ray.

``plan`` asks an in-memory Optuna study (the sweep's own sampler and seed) for the first N trials, seed trials first,
exactly as the Tune searcher would. It prints each trial's parameters and verl command line. ``validate`` loads the
file, builds the sampler, and preflights every distinct config a trial can reach at the edges of the space
(:func:`preflight_configs`).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, TextIO

import optuna

from klsweep.analysis.sweep_dir import overrides_of
from klsweep.errors import KlsweepError, PreflightError
from klsweep.launchers.checkpoints import POLICY_ENV, checkpoint_cost, policy
from klsweep.orchestrate.capacity import local_gpu_warning
from klsweep.orchestrate.samplers import MODEL_BASED, SpaceFillingStart, build_sampler
from klsweep.spec import Sweep, load_sweep
from klsweep.spec.load import load_partial
from klsweep.spec.space import condition, define_space, key_locations, parameters, seed_params, trial_overrides
from klsweep.trainers import reproduce_lines
from klsweep.verl.metrics import ALIASES, VAL_SCORE
from klsweep.verl.preflight import preflight


def planned_params(sweep: Sweep, n: int) -> list[dict[str, Any]]:
    """Parameters (verl keys) of the first ``n`` trials: ``seed_trials`` first, then the sweep's sampler.

    Uses an in-memory Optuna study with :func:`klsweep.orchestrate.samplers.build_sampler` (seeded with the sweep
    seed) and :func:`klsweep.spec.space.define_space`; no trial is told a value, as before any result exists.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions = ["maximize" if o.mode == "max" else "minimize" for o in sweep.objectives]
    study = optuna.create_study(sampler=build_sampler(sweep), directions=directions)
    for seed in seed_params(sweep):
        study.enqueue_trial(seed)
    space = define_space(sweep)
    out = []
    for _ in range(n):
        trial = study.ask()
        constants = space(trial)
        out.append({**trial.params, **constants})
    return out


def preflight_configs(sweep: Sweep) -> list[dict[str, Any]]:
    """Distinct trial configs that cover every value the sweep can emit.

    1. Each seed trial, or the fixed config.
    2. For each parameter, each of its ``values`` and the ``min``/``max`` of its range. Each is substituted into the
       first seed trial, together with the values its ``when`` needs.
    3. For each pair of numeric parameters, the four combinations of their smallest and largest values. A horizon is
       only too short for the largest batch a trial can have (verl's n_steps).

    A bad categorical value is thus caught before any trial runs, not when a sampler happens to pick it."""
    seeds = seed_params(sweep) or [{}]
    variants: list[dict[str, Any]] = list(seeds)
    ends: dict[str, tuple[dict[str, Any], list[Any]]] = {}  # numeric parameter -> (its `when` needs, [min, max])
    for key, p in parameters(sweep).items():
        needs = {k: allowed[0] for k, allowed in condition(sweep, p.when).items()}
        values = getattr(p, "values", None) or ([p.value] if hasattr(p, "value") else [p.min, p.max])
        if getattr(p, "distribution", None) == "int_uniform":
            values = [int(v) for v in values]
        variants += [{**seeds[0], **needs, key: v} for v in values]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(set(numbers)) > 1:
            ends[key] = (needs, [min(numbers), max(numbers)])
    for (a, (needs_a, ends_a)), (b, (needs_b, ends_b)) in itertools.combinations(ends.items(), 2):
        if any(needs_b.get(k, v) != v for k, v in needs_a.items()):
            continue  # never sampled together
        variants += [{**seeds[0], **needs_a, **needs_b, a: x, b: y} for x in ends_a for y in ends_b]
    configs, seen = [], set()
    for params in variants:
        overrides = trial_overrides(sweep, params)
        fingerprint = repr(sorted(overrides.items(), key=lambda kv: kv[0]))
        if fingerprint not in seen:
            seen.add(fingerprint)
            configs.append(overrides)
    return configs


def _objective_problems(sweep: Sweep) -> list[str]:
    """Objectives no trial would ever report.

    One is a health-rule alias (``ref_kl``): trials report verl's own names. Another is a validation metric the
    trainer is known not to log; a typo would fail every trial after its whole budget."""
    kind = sweep.kind
    validation = kind.validation_metric or "val-core/<data_source>/<metric>/mean@<n>"
    logged_as = {
        "ref_kl": {"loss": "actor/kl_loss", "reward": "actor/reward_kl_penalty"}.get(sweep.placement),
        "kl_coef": {"loss": "actor/kl_coef", "reward": "actor/reward_kl_penalty_coeff"}.get(sweep.placement),
        "entropy": "actor/entropy",
        "score": "critic/score/mean",
        VAL_SCORE: validation,
    }
    listed = ("objective", "0") in (getattr(sweep, "_where", None) or {}) or len(sweep.objectives) > 1
    problems = []
    for i, o in enumerate(sweep.objectives):
        path = ("objective", i, "metric") if listed else ("objective", "metric")
        field, line = ".".join(map(str, path)), sweep.where(*path)
        at = f"{line}: {field}" if line else field
        if o.metric in logged_as or (o.metric in ALIASES and "/" not in o.metric):
            name = logged_as.get(o.metric)
            fix = f"use {name!r}" if name else f"this sweep (kl_placement {sweep.placement}) logs no such metric"
            problems.append(f"{at}: {o.metric!r} is an alias of the health rules, but an objective names the metric "
                            f"the trainer reports under verl's name — {fix}")
        elif (kind.validation_metric and o.metric.startswith(("val-core/", "val/", "test_score/"))
              and o.metric != kind.validation_metric):
            problems.append(f"{at}: {o.metric!r} is not logged by the {kind.name} trainer, whose validation metric "
                            f"is {kind.validation_metric!r} — use that name")
    return problems


def preflight_sweep(sweep: Sweep, *, files_here: bool = False) -> list[str]:
    """Preflight every config of :func:`preflight_configs`; returns the warnings (deduplicated). ``files_here``: the
    trials run on this machine, so a missing local data file or model folder is a problem (``preflight``).

    Raises:
        PreflightError: every distinct problem, one per line, with the sweep-file line of the key.
    """
    where = key_locations(sweep)
    problems: dict[str, None] = dict.fromkeys(_objective_problems(sweep))
    warnings: dict[str, None] = {}
    for overrides in preflight_configs(sweep):
        try:
            warnings.update(dict.fromkeys(preflight(
                overrides, runs_verl=sweep.kind.runs_verl, allow_negative_kl=sweep.allow_negative_kl,
                where=where, files_here=files_here)))
        except PreflightError as e:
            problems.update(dict.fromkeys(str(e).splitlines()))
    if problems:
        raise PreflightError("\n".join(problems))
    return list(warnings)


#: Trials ``sweep plan`` shows when not told how many (fewer when the sweep runs fewer).
PLAN_TRIALS = 4


def plan(path: str, overrides: list[str], n: int | None = None, out: TextIO | None = None) -> int:
    """Print the parameters and reproduce commands of the first ``n`` trials. Returns 0 (errors raise KlsweepError).

    ``n`` (at least 1) is capped at ``budget.trials``, the trials the sweep runs; a larger ``n`` is said in a note
    before the trials. None: :data:`PLAN_TRIALS`, capped silently.

    Each trial says where its values come from:

    - a seed trial;
    - a draw ``sweep run`` makes the same way: the sampler's random start-up, where each trial's draw is seeded by
      the sweep seed and its number (:mod:`~.samplers`);
    - a trial the sampler proposes from the results of finished trials, which ``plan`` cannot know. Those are shown
      as the random start-up draw of that trial number, and labelled so.

    For a verl sweep it ends with the checkpoint cost of the trials shown
    (:func:`klsweep.launchers.checkpoints.checkpoint_cost`: saves per trial, disk per save when the model is a local
    folder) and the retention policy of finished trials' checkpoints.

    The commands are the ones ``sweep run`` and ``sweep status`` print. They are
    :func:`klsweep.trainers.reproduce_lines` of the overrides as the trial's ``trials.csv`` row gives them back
    (:func:`klsweep.analysis.sweep_dir.overrides_of`).
    """
    out = out or sys.stdout
    sweep = load_sweep(path, overrides)
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=out)
    trials = sweep.budget.trials
    if n is not None and n > trials:
        print(f"note: the search runs {trials} trials (budget.trials={trials}): all {trials} are shown, not {n}",
              file=out)
    seeds = len(seed_params(sweep))
    startup = _random_start(sweep)
    name = sweep.sampler.name
    guided = False
    costs: dict[str, None] = {}
    for i, params in enumerate(planned_params(sweep, min(PLAN_TRIALS if n is None else n, trials))):
        overrides_i = trial_overrides(sweep, params)
        if sweep.kind.runs_verl:
            costs[checkpoint_cost(overrides_i).describe()] = None
        warnings = preflight(overrides_i, runs_verl=sweep.kind.runs_verl,
                             allow_negative_kl=sweep.allow_negative_kl)
        if i < seeds:
            origin = f"seed trial {i + 1}"
        elif name == "grid":
            origin = "grid point"
        elif startup is None or i < startup:
            origin = f"{name} {'space-filling start' if name in MODEL_BASED else 'random draw'}, as sweep run draws it"
        else:
            origin, guided = f"{name} proposes it from results; shown: a random start-up draw", True
        shown = " ".join(f"{k}={v!r}" for k, v in params.items()) or "(no parameters)"
        print(f"trial {i} ({origin}): {shown}", file=out)
        for warning in warnings:
            print(f"  warning: {warning}", file=out)
        # as sweep run records the trial and status and the report read it back (whole floats as ints, null left out)
        for line in reproduce_lines(sweep.trainer, overrides_of({f"config/{k}": v for k, v in overrides_i.items()})):
            print(f"  {line}", file=out)
    if guided:
        print(f"note: from trial {startup} on, sweep run's {name} sampler proposes each trial from the results of "
              f"the trials finished before it, which no plan can know; shown here for those trials: the random "
              f"start-up draws {name} makes while fewer than {startup} trials have finished (COMPLETE or PRUNED)",
              file=out)
    for cost in costs:
        print(f"checkpoints: {cost}", file=out)
    if costs:
        print(f"checkpoint retention ({POLICY_ENV}={policy()}): {_RETENTION[policy()]}", file=out)
    return 0


#: What each retention policy does with a finished trial's checkpoint (:mod:`klsweep.launchers.checkpoints`).
_RETENTION = {
    "best": "a trial that ran to its last step keeps its checkpoint only while it is the best finished trial (on the "
            "Pareto front with several objectives); a trial that stopped early keeps it for a retry, a resume or a "
            "remedy",
    "all": "every trial keeps its last checkpoint",
    "none": "a trial that ran to its last step deletes its checkpoint",
}


def _random_start(sweep: Sweep) -> int | None:
    """How many trials, seed trials counted, the sweep's sampler proposes before it uses results.

    That is the space-filling start of TPE and GP, Optuna's ``n_startup_trials`` of CMA-ES, or NSGA-II's first
    ``population_size``. None for ``random``, which never uses results."""
    sampler = build_sampler(sweep)
    if isinstance(sampler, SpaceFillingStart):  # tpe, gp: a Sobol design, then the model
        return sampler.startup
    inner = getattr(sampler, "sampler", sampler)  # StudySeededSampler wraps the Optuna sampler
    if isinstance(inner, optuna.samplers.RandomSampler):
        return None
    for attribute in ("_n_startup_trials", "_population_size"):  # private in Optuna 5.0: no public accessor
        if isinstance(getattr(inner, attribute, None), int):
            return getattr(inner, attribute)
    return 0


def validate(path: str, overrides: list[str], out: TextIO | None = None) -> int:
    """Check a sweep file: schema, verl keys and live/inert knobs, sampler, preflight of every reachable config.

    Every problem that does not depend on another is found in one run: the file's problems
    (:func:`klsweep.spec.load.load_partial`), then the sampler's and the preflight's on the rest of the file.
    Prints ``ok``/warnings and returns 0, or prints every problem (one per line) and returns 2.
    """
    out = out or sys.stdout
    problems: list[str] = []
    warnings: list[str] = []
    try:
        sweep, problems = load_partial(path, overrides)
    except KlsweepError as e:
        sweep, problems = None, str(e).splitlines()
    if sweep is not None:
        warnings += [*sweep.warnings, *filter(None, [local_gpu_warning(sweep)])]
        try:
            build_sampler(sweep)
        except KlsweepError as e:
            problems += str(e).splitlines()
        try:
            warnings += preflight_sweep(sweep)
        except KlsweepError as e:
            problems += str(e).splitlines()
    if problems or sweep is None:
        print(f"{path}: invalid", file=out)
        for line in problems:
            print(f"  error: {line}", file=out)
        for warning in warnings:
            print(f"  warning: {warning}", file=out)
        return 2
    for warning in warnings:
        print(f"  warning: {warning}", file=out)
    print(f"{path}: ok ({sweep.algorithm}, trainer {sweep.trainer}, {len(sweep.parameters)} parameters, "
          f"{sweep.budget.trials} trials)", file=out)
    return 0
