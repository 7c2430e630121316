"""Checks of a schema-valid sweep that need verl knowledge: keys, aliases, conditions, seed trials, live/inert knobs.

Each problem is ``(path, message)`` with ``path`` the tuple of the sweep-file field it concerns, so the loader can
put the file and line in front. These checks run before any trial config is composed (they read verl's defaults).
"""

from __future__ import annotations

import difflib
import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any

from klsweep.health.rules import Rule, WindowCondition
from klsweep.spec.schema import Choice, Constant, ObjectiveStop, Range, Sweep
from klsweep.spec.space import condition, fixed_overrides, parameters
from klsweep.trainers import runs_verl, trainer_kind
from klsweep.verl import presets
from klsweep.verl.config import KL_COEF_KEYS, closest_key, default_keys
from klsweep.verl.liveness import inert_reason
from klsweep.verl.metrics import KL_IN_LOSS_METRICS, KL_IN_REWARD_METRICS

Problem = tuple[tuple[Any, ...], str]

#: Keys owned by the sweep file's own fields, never set in ``overrides`` or ``parameters``.
_OWNED = {
    presets.USE_KL_LOSS: "kl_placement",
    presets.USE_KL_IN_REWARD: "kl_placement",
    "algorithm.adv_estimator": "algorithm",
    "trainer.total_training_steps": "budget.max_steps",
    "data.seed": "seed",
}

#: Keys whose value decides whether other knobs are live; a `when` or a search over them opens scenarios.
_SWITCHES = ("algorithm.kl_ctrl.type", presets.ACTOR + "loss_agg_mode", presets.ACTOR + "clip_ratio_low",
             presets.ACTOR + "clip_ratio_high")


def check_sweep(sweep: Sweep) -> tuple[list[Problem], list[Problem]]:
    """Every problem (errors, warnings) of a schema-valid sweep.

    Errors: unknown keys (with the closest valid key), aliases without a live key under the kl_placement, keys owned
    by other fields, a key both fixed and searched, `when` keys that are not fixed or earlier parameters or that can
    never hold, seed trials outside the space, inert knobs (the coefficient of a KL mechanism that is off, verl#644;
    target_kl without the adaptive in-reward controller; KL-loss knobs under DrGRPO), negative KL coefficients,
    GRPO with rollout.n < 2; for ``trainer: verl``, ``budget.resources.gpu`` that differs from the GPUs a trial's verl
    uses (``trainer.nnodes`` × ``trainer.n_gpus_per_node``), and multi-node trials. (Sampler options are checked
    where the sampler is built: :func:`klsweep.orchestrate.samplers.build_sampler`.)
    Warnings: a knob inert in some trials only, use_kl_* with coefficient 0 (verl#6519), a KL objective compared
    across searched estimators or loss aggregations (different scales).
    """
    warnings: list[Problem] = []
    errors, resolved = _check_keys(sweep)
    from klsweep.verl.managed import managed_key_problems  # keys klsweep writes into every trial itself

    errors += [(("overrides", where) if where in sweep.overrides else ("parameters", where), message)
               for where, message in managed_key_problems(sweep.overrides, resolved, trainer=sweep.trainer)]
    if errors:
        return errors, warnings
    fixed = fixed_overrides(sweep)
    params = parameters(sweep)
    for i, seed in enumerate(sweep.seed_trials):
        errors.extend((("seed_trials", i) + sub, m) for sub, m in _seed_problems(sweep, seed, params))
    for key in sweep.overrides:
        if key in presets.KNOBS or key in presets.CRITIC_KNOBS:
            reasons = [inert_reason(key, scenario) for scenario in _scenarios(sweep, fixed, params, None)]
            if all(reasons):
                errors.append((("overrides", key), f"{key} has no effect: {reasons[0]}"))
    for key, p in params.items():
        name = resolved[key]
        reasons = [inert_reason(key, scenario) for scenario in _scenarios(sweep, fixed, params, p.when)]
        if reasons and all(reasons):
            errors.append(
                (("parameters", name), f"{_label(name, key)} is searched but has no effect in any trial: {reasons[0]}")
            )
        elif any(reasons):
            first = next(r for r in reasons if r)
            warnings.append((("parameters", name), f"{_label(name, key)} has no effect in some trials: {first}. "
                             "Add a `when` condition so it is only sampled where it acts"))
    errors.extend(_negative_kl(sweep, params))
    errors.extend(_remedy_problems(sweep, fixed))
    errors.extend(_table_problems(sweep, params, resolved, fixed))
    if sweep.scheduler.type == "asha":
        warnings.extend((("health", "rules", i, "remedy"), f"rule {rule.name!r} has a remedy but scheduler is asha: "
                         "ASHA's scheduler takes the place of the one that restarts trials, so the rule stops the "
                         "trial instead. Use scheduler: none for remedies")
                        for i, rule in enumerate(sweep.health.rules) if rule.remedy)
    warnings.extend(_remedies_off(sweep))
    warnings.extend(_rules_out_of_reach(sweep))
    warnings.extend(_zero_kl(fixed, params, resolved))
    warnings.extend(_kl_objective_scales(sweep, params, resolved))
    stop = sweep.stopping.objective
    if stop is not None and sweep.budget.trials <= stop.min_peers:
        warnings.append((("stopping", "objective"), f"can never stop a trial: it waits for "
                         f"min_peers ({stop.min_peers}) other trials at a step and budget.trials is "
                         f"{sweep.budget.trials}. Lower min_peers or raise budget.trials"))
    if stop is not None and stop.window > sweep.budget.max_steps:
        warnings.append((("stopping", "objective", "window"), f"window {stop.window} is longer than the run "
                         f"(budget.max_steps {sweep.budget.max_steps}, at most one value per step): it never fills, "
                         "so a trial's value at a step is the mean of all its values so far, early ones included. "
                         f"Use a window of a few values (the default is "
                         f"{ObjectiveStop.model_fields['window'].default})"))
    confirm = sweep.budget.confirm
    if confirm is not None and confirm.top > sweep.budget.trials:
        warnings.append((("budget", "confirm", "top"), f"top {confirm.top} is more than budget.trials "
                         f"({sweep.budget.trials}): at most {sweep.budget.trials} search trials can be re-run. Lower "
                         f"budget.confirm.top to {sweep.budget.trials} or less, or raise budget.trials"))
    n = fixed.get("actor_rollout_ref.rollout.n")
    if (fixed.get("algorithm.adv_estimator") == "grpo" and "actor_rollout_ref.rollout.n" not in params
            and n is not None and n < 2):
        errors.append((("overrides", "actor_rollout_ref.rollout.n"),
                       f"actor_rollout_ref.rollout.n={n}: GRPO's advantage compares the rollout.n responses of a "
                       "prompt, a group of 1 has no baseline. Use rollout.n >= 2 (the preset's 5)"))
    if runs_verl(sweep.trainer):
        errors.extend(_verl_resources(sweep, fixed, params, resolved))
    return errors, warnings


def check_keys(sweep: Sweep) -> list[Problem]:
    """The problems of a schema-valid sweep's keys alone, the first stage of :func:`check_sweep` (the other checks
    need every key to be a verl key): unknown keys (with the closest or the full verl key), aliases in overrides or
    without a live key under the kl_placement, keys owned by other fields, a key both fixed and searched, `when`
    keys that are not fixed or earlier parameters or that can never hold."""
    return _check_keys(sweep)[0]


def _check_keys(sweep: Sweep) -> tuple[list[Problem], dict[str, str]]:
    errors: list[Problem] = []
    placement = sweep.placement
    for key in sweep.overrides:
        errors.extend((("overrides", key), m) for m in _key_problems(key, placement))
    resolved: dict[str, str] = {}  # verl key -> parameter name
    for name, p in sweep.parameters.items():
        try:
            key = presets.resolve_key(name, placement)
        except ValueError as e:
            errors.append((("parameters", name), str(e)))
            continue
        errors.extend((("parameters", name), m) for m in _key_problems(key))
        if key in resolved:
            errors.append(
                (("parameters", name), f"names the same verl key {key} as parameter {resolved[key]!r}: keep one")
            )
        if key in sweep.overrides:
            errors.append((("parameters", name), f"{key} is both fixed in overrides and searched: remove one"))
        errors.extend((("parameters", name, "when") + sub, m) for sub, m in _when_problems(sweep, p.when, resolved))
        resolved[key] = name
    return errors, resolved


#: The keys that size a verl trial's GPUs: verl's ResourcePoolManager asks Ray for nnodes × n_gpus_per_node.
_GPU_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")


@functools.lru_cache(maxsize=None)
def _verl_default(key: str) -> Any:
    from omegaconf import OmegaConf

    from klsweep.verl.config import compose

    return OmegaConf.select(compose({}), key)


def _verl_resources(sweep: Sweep, fixed: dict, params: dict, names: dict[str, str]) -> Iterator[Problem]:
    """A verl trial runs on exactly the GPUs Ray reserves for it (``budget.resources.gpu``; the launcher sets
    ``CUDA_VISIBLE_DEVICES`` to them) and asks its own local Ray for ``trainer.nnodes × trainer.n_gpus_per_node``
    GPUs (verl/trainer/ppo/v1/trainer_base.py, verl/single_controller/ray/base.py ``ResourcePoolManager``; verl's
    default n_gpus_per_node is 8). Fewer reserved than asked fails every trial ("Total available GPUs ... is less than
    total desired GPUs ..."), more idles them. A fraction of one GPU is fine for a one-GPU trial (trials share the
    GPU). Each trial is one process with its own local Ray on one node, so ``trainer.nnodes`` must be 1."""
    searched = [key for key in _GPU_KEYS if key in params]
    for key in searched:
        yield ("parameters", names[key]), (
            f"{key} is searched, but every trial reserves the same budget.resources.gpu GPUs "
            f"({sweep.budget.resources.gpu:g}): the GPU count is a resource, not a hyperparameter. Fix {key} in "
            "overrides and set budget.resources.gpu to match")
    if searched:
        return
    nnodes, per_node = (fixed.get(key, _verl_default(key)) for key in _GPU_KEYS)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (nnodes, per_node)):
        return  # not a whole number: no GPU count to compare (verl itself fails on it)
    if nnodes != 1:
        yield ("overrides", "trainer.nnodes"), (
            f"trainer.nnodes={nnodes}: klsweep runs each verl trial as one process with its own local Ray on one "
            "node, so a multi-node trial would wait for GPUs that never join it. Set trainer.nnodes: 1 (the "
            "default); a Ray cluster spreads trials, not one trial, over nodes (budget.max_concurrent)")
        return
    gpu = sweep.budget.resources.gpu
    if gpu == per_node or (per_node == 1 and 0 < gpu < 1):
        return
    origin = "verl's default" if "trainer.n_gpus_per_node" not in fixed else "set in overrides"
    if gpu < per_node:
        why = (f"verl fails every trial at start (\"Total available GPUs {math.ceil(gpu)} is less than total "
               f"desired GPUs {per_node}\")")
    else:
        why = f"{gpu - per_node:g} of the reserved GPUs would sit idle in every trial"
    if gpu >= 1 and gpu == int(gpu):
        fix = f"Set budget.resources.gpu: {per_node}, or trainer.n_gpus_per_node: {int(gpu)} in overrides"
    else:
        fix = (f"Set budget.resources.gpu: {per_node}, or trainer.n_gpus_per_node: 1 in overrides with "
               "budget.resources.gpu: 1 (or a fraction of 1 to share one GPU between trials)")
    yield ("budget", "resources", "gpu"), (
        f"budget.resources.gpu is {gpu:g} but each verl trial uses trainer.nnodes × trainer.n_gpus_per_node = "
        f"1 × {per_node} = {per_node} GPU{'s' * (per_node != 1)} (n_gpus_per_node {per_node} is {origin}): a trial "
        f"sees only the GPUs Ray reserves for it, so {why}. {fix}")


def _label(name: str, key: str) -> str:
    return key if name == key else f"{name} ({key})"


def _key_problems(key: str, placement: str | None = None) -> list[str]:
    """Why ``key`` is not a verl key a sweep may set, with the fix: the closest verl key, the full key of a bare leaf
    name (``kl_loss_coef``) or of an alias given in ``overrides`` (``placement`` set: aliases are for parameters)."""
    if key in _OWNED:
        return [f"{key} is set by the sweep file's `{_OWNED[key]}` field: set that field instead"]
    if key.startswith("+") or key in default_keys():
        return []
    if placement is not None and key in presets.ALIASES:
        try:
            full = f"write {presets.resolve_key(key, placement)!r}"
        except ValueError as e:
            full = str(e)
        return [f"{key!r} is an alias, which only `parameters` and `when` take; overrides take verl's full keys: "
                f"{full}"]
    closest = closest_key(key)
    hints = [closest] if closest else _full_keys(key)
    aliases = ", ".join(presets.ALIASES)
    fix = (f"did you mean {' or '.join(map(repr, hints))}?" if hints
           else f"use a key of verl's ppo_trainer config or an alias ({aliases})")
    return [f"{key!r} is not a key of verl 0.9.1's ppo_trainer config: {fix}"]


def _full_keys(name: str) -> list[str]:
    """The verl keys whose last parts are ``name`` or close to it (``kl_loss_coef`` →
    ``actor_rollout_ref.actor.kl_loss_coef``; ``lr`` → both learning rates)."""
    keys = default_keys()
    found = [k for k in keys if k.endswith("." + name)]
    if not found:
        depth = name.count(".") + 1
        tails = {".".join(k.split(".")[-depth:]): k for k in keys}
        close = difflib.get_close_matches(name, list(tails), n=1, cutoff=0.8)
        found = [k for k in keys if close and k.endswith("." + close[0])]
    return sorted(found)


def _when_problems(sweep: Sweep, when: dict | None, earlier: dict[str, str]) -> Iterator[Problem]:
    if not when:
        return
    fixed = None
    for name, allowed in when.items():
        try:
            key = presets.resolve_key(name, sweep.placement)
        except ValueError as e:
            yield (name,), str(e)
            continue
        if key in earlier:
            p = sweep.parameters[earlier[key]]
            options = p.values if isinstance(p, Choice) else [p.value] if isinstance(p, Constant) else None
            wanted = allowed if isinstance(allowed, list) else [allowed]
            if options is not None and not set(map(repr, wanted)) & set(map(repr, options)):
                yield (name,), f"condition {name} in {wanted} never holds: parameter {earlier[key]!r} takes {options}"
            continue
        if key in sweep.parameters or any(presets.resolve_key(n, sweep.placement) == key for n in sweep.parameters):
            yield (name,), f"{name} is a parameter defined after this one: move this parameter below it"
            continue
        fixed = fixed if fixed is not None else fixed_overrides(sweep)
        if key not in fixed:
            yield (name,), (f"{name} is neither a parameter defined earlier nor fixed by the preset or overrides: "
                            "set it in overrides or define it as a parameter above")
            continue
        wanted = allowed if isinstance(allowed, list) else [allowed]
        if fixed[key] not in wanted:
            yield (name,), (f"condition {name} in {wanted} never holds: {key} is fixed to {fixed[key]!r}, so this "
                            "parameter is never sampled. Fix the value or search the key")


def _scenarios(sweep: Sweep, fixed: dict, params: dict, when: dict | None) -> Iterator[dict[str, Any]]:
    """The configs a parameter can meet: every combination of searched switch values allowed by its `when`."""
    cond = condition(sweep, when)
    axes: list[tuple[str, list[Any]]] = []
    for key in _SWITCHES:
        if key in cond:
            axes.append((key, cond[key]))
        elif isinstance(params.get(key), Choice):
            axes.append((key, params[key].values))
    for combo in itertools.product(*(values for _, values in axes)):
        yield {**fixed, **dict(zip((k for k, _ in axes), combo))}


def _seed_problems(sweep: Sweep, seed: dict[str, Any], params: dict) -> Iterator[Problem]:
    for name, value in seed.items():
        try:
            key = presets.resolve_key(name, sweep.placement)
        except ValueError as e:
            yield (name,), str(e)
            continue
        p = params.get(key)
        if p is None:
            hint = difflib.get_close_matches(name, list(sweep.parameters), n=1, cutoff=0.6)
            fix = f"did you mean {hint[0]!r}? " if hint else ""
            known = f"Parameters: {', '.join(sweep.parameters)}" if sweep.parameters else "this sweep has no parameters"
            yield (name,), f"{name} is not a parameter of this sweep: {fix}{known}"
        elif isinstance(p, Choice) and repr(value) not in map(repr, p.values):
            yield (name,), f"{value!r} is not one of the parameter's values {p.values}: add it to values"
        elif isinstance(p, Constant) and value != p.value:
            yield (name,), (f"{value!r} differs from the parameter's constant value {p.value!r}: set it to "
                            f"{p.value!r} or drop it from the seed trial")
        elif isinstance(p, Range):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                yield (name,), (f"{value!r} is not a number but the parameter is a range [{p.min}, {p.max}]: give a "
                                "number in the range")
            elif not p.min <= value <= p.max:
                yield (name,), f"{value!r} is outside the parameter's range [{p.min}, {p.max}]: widen the range"


def _negative_kl(sweep: Sweep, params: dict) -> Iterator[Problem]:
    if sweep.allow_negative_kl:
        return
    why = ("a negative KL coefficient rewards moving away from the reference policy. Use values >= 0, or set "
           "allow_negative_kl: true if you mean it")
    for key in KL_COEF_KEYS:
        value = sweep.overrides.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            yield ("overrides", key), f"{key}={value}: {why}"
    for name, p in sweep.parameters.items():
        key = presets.resolve_key(name, sweep.placement)
        if key not in KL_COEF_KEYS:
            continue
        low = p.min if isinstance(p, Range) else min((v for v in _numbers(p)), default=0)
        if low < 0:
            yield ("parameters", name), f"{_label(name, key)} can be {low}: {why}"


def _numbers(p) -> list[float]:
    values = p.values if isinstance(p, Choice) else [p.value]
    return [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


#: What sets the scale of each KL metric an objective can name: the estimator (verl ``core_algos.kl_penalty``) and, for
#: the KL loss, its aggregation over tokens (``core_algos.agg_loss``).
_KL_SCALE_KEYS = {
    **dict.fromkeys(KL_IN_LOSS_METRICS, (presets.ACTOR + "kl_loss_type", presets.ACTOR + "loss_agg_mode")),
    **dict.fromkeys(KL_IN_REWARD_METRICS, ("algorithm.kl_penalty",)),
}
_ESTIMATOR_SCALE = ("each estimator has its own scale (verl core_algos.kl_penalty: kl/k1 is the log-ratio and can "
                    "be negative, abs its absolute value, mse/k2 half its square, low_var_kl/k3 clamped to [-10, 10])")
_SCALE_OF = {
    presets.ACTOR + "kl_loss_type": _ESTIMATOR_SCALE,
    "algorithm.kl_penalty": _ESTIMATOR_SCALE,
    presets.ACTOR + "loss_agg_mode": "verl aggregates the KL loss with it (core_algos.agg_loss): token-mean and "
    "seq-mean-token-mean are per-token means, token-sum and seq-mean-token-sum sums over each response's tokens "
    "(tens of times larger), seq-mean-token-sum-norm a sum divided by loss_scale_factor",
}


def _kl_objective_scales(sweep: Sweep, params: dict, names: dict[str, str]) -> Iterator[Problem]:
    """A KL objective (``actor/kl_loss``, ``actor/reward_kl_penalty``) compared across trials that search what sets
    its scale: the best trial or the Pareto front would favour a scale, not less drift."""
    for objective in sweep.objectives:
        for key in _KL_SCALE_KEYS.get(objective.metric, ()):
            p = params.get(key)
            if isinstance(p, Choice) and len(p.values) > 1:
                yield ("parameters", names[key]), (
                    f"objective {objective.metric} is compared across trials with {_label(names[key], key)} in "
                    f"{p.values}, but {_SCALE_OF[key]}: the {'front' if len(sweep.objectives) > 1 else 'best trial'} "
                    f"would favour the scale, not the smaller drift. Fix {key} in overrides for a KL objective, or "
                    "optimise a metric with one scale (the validation score) and compare KL per value in the report")


def _zero_kl(fixed: dict, params: dict, names: dict[str, str]) -> Iterator[Problem]:
    pairs = (
        (presets.USE_KL_LOSS, presets.ACTOR + "kl_loss_coef"),
        (presets.USE_KL_IN_REWARD, "algorithm.kl_ctrl.kl_coef"),
    )
    for switch, coef in pairs:
        if not fixed.get(switch):
            continue
        p = params.get(coef)
        can_be_zero = fixed.get(coef) == 0 if p is None else (
            p.min <= 0 if isinstance(p, Range) else 0 in _numbers(p))
        if can_be_zero:
            yield (("parameters", names[coef]) if p else ("overrides", coef)), (
                f"{switch}=True with {coef}=0: the reference model's forward pass costs compute for no effect. "
                f"Use a coefficient > 0, or turn the KL off with kl_placement")


def _remedy_problems(sweep: Sweep, fixed: dict[str, Any]) -> Iterator[Problem]:
    """The prescriptions of the sweep's own health rules (``health.rules[i].remedy``): an alias without a live key,
    a key that is not verl's (with the closest), a knob inert for the sweep's algorithm and KL placement. A preset's
    prescription that is inert for the sweep is not a problem: the rule then stops as before, saying so."""
    for i, rule in enumerate(sweep.health.rules):
        for name in rule.remedy:
            path = ("health", "rules", i, "remedy", name)
            try:
                key = presets.resolve_key(name, sweep.placement)
            except ValueError as e:
                yield path, str(e)
                continue
            if key not in default_keys():
                hint = closest_key(key)
                fix = (f"did you mean {hint!r}?" if hint
                       else f"use a verl key or an alias ({', '.join(presets.ALIASES)})")
                yield path, f"{key!r} is not a key of verl 0.9.1's ppo_trainer config: {fix}"
                continue
            inert = inert_reason(key, fixed)
            if inert:
                yield path, f"the remedy changes {key}, which has no effect: {inert}"


def _remedies_off(sweep: Sweep) -> Iterator[Problem]:
    """Under a trainer that cannot restart a trial (:attr:`klsweep.trainers.TrainerKind.no_restarts`), the rules
    with a remedy stop their trial instead (:func:`klsweep.orchestrate.remedy.remedies_on`): said once, naming them,
    where remedies would otherwise be on (ASHA and ``health: {remedies: false}`` turn them off anyway)."""
    why = trainer_kind(sweep.trainer).no_restarts
    if not why or not sweep.health.remedies or sweep.scheduler.type != "none":
        return
    from klsweep.health import load_ruleset

    named = [rule.name for rule in load_ruleset(sweep.health).rules if rule.remedy]
    if named:
        yield ("health",), (f"trainer {sweep.trainer}: remedies off, {why}: {', '.join(named)} stop their trial "
                             "instead of restarting it (as with health: {remedies: false})")


def _first_firing_step(rule: Rule) -> int:
    """The earliest training step at which ``rule`` can fire in a trial that reports every step from step 0.

    Its streak starts no earlier than ``after + 1`` (the warm-up, :class:`klsweep.health.streak.Streak`) nor before
    its conditions are judged: a window statistic of W steps once the run covers W steps (step W − 1 from a report
    at step 0; every condition under ``all``, the first judged one under ``any``); ``drop_from_max``, ``value`` and
    ``ratio_to_first`` at once. It fires once held for ``for`` steps: ``max(after + 1, judged) + for − 1``.
    """
    judged = [c.window - 1 if isinstance(c, WindowCondition) else 0 for c in rule.conditions]
    first = max(judged) if rule.match == "all" else min(judged)
    return max(rule.after + 1, first) + rule.for_ - 1


def _rules_out_of_reach(sweep: Sweep) -> Iterator[Problem]:
    """One warning naming the health rules that cannot fire within ``budget.max_steps`` (:func:`_first_firing_step`):
    a trial such a stop rule would stop ends COMPLETE and healthy, a warn rule never warns."""
    from klsweep.health import load_ruleset

    steps = sweep.budget.max_steps
    late = [(rule, _first_firing_step(rule)) for rule in load_ruleset(sweep.health).rules]
    late = [(rule, first) for rule, first in late if first > steps]
    if not late:
        return
    named = ", ".join(f"{rule.name} ({rule.describe()}: step {first} at the earliest)" for rule, first in late)
    yield ("budget", "max_steps"), (
        f"{steps} steps end every trial before these health rules can fire: {named}. A trial such a stop rule would "
        f"stop ends COMPLETE and healthy. Raise budget.max_steps to {max(f for _, f in late)} or more, or lower their "
        "`after`/`for` (a rule of the same name in health.rules replaces the preset's)")


def _table_problems(sweep: Sweep, params: dict, names: dict[str, str], fixed: dict[str, Any]) -> Iterator[Problem]:
    """For ``trainer: tabular``: a table recorded for another sweep (other searched keys or training settings, or
    none of a searched category's values: one problem naming the sweep its header was recorded for and the table of
    its folder that fits, if any); else each searched categorical value the table did not record (its header's
    ``grid``). The trainer would refuse such trials at run time (:meth:`klsweep.trainers.tabular.Table.nearest`) or
    serve them another sweep's runs."""
    if sweep.trainer != "tabular" or sweep.tabular is None:
        return
    from klsweep.trainers.tabular import header_mismatch, load_table

    header = load_table(sweep.tabular.table).header
    why = header_mismatch(header, list(params), fixed)
    if why:
        yield _other_sweeps_table(sweep.tabular.table, header, why, params, fixed)
        return
    for key, p in params.items():
        axis = header["parameters"].get(key, {})
        grid = axis.get("grid", axis.get("values"))
        if not isinstance(p, Choice) or axis.get("scale") != "categorical" or grid is None:
            continue
        kept = [v for v in p.values if v in grid]
        name = names[key]
        if not kept:
            why = f"none of the values this sweep searches for {name} ({p.values}) was recorded (it holds {grid})"
            yield _other_sweeps_table(sweep.tabular.table, header, why, params, fixed)
            return
        if len(kept) < len(p.values):
            yield ("parameters", name), (
                f"{_label(name, key)} searches {[v for v in p.values if v not in grid]}, which the table "
                f"{sweep.tabular.table} did not record (it holds {grid}): those trials would fail. Search only the "
                f"recorded values (add the override 'parameters.{name}={{values: [{', '.join(map(str, kept))}]}}') "
                "or generate a table with them (benchmarks/tabular/README.md)")


def _other_sweeps_table(path: str, header: dict, why: str, params: dict, fixed: dict[str, Any]) -> Problem:
    """The one problem of a table recorded for another sweep: what its header says it was recorded for, why it does
    not fit (``why``), and the fix: the tables of its folder that fit (:func:`klsweep.trainers.tabular.
    header_mismatch`), else generating one."""
    from pathlib import Path

    from klsweep.errors import TraceReadError
    from klsweep.trainers.tabular import header_mismatch, read_header, recorded_for

    def shown(p: Path) -> str:
        return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)

    table, fits = Path(path), []
    for other in sorted(table.parent.glob("*.jsonl.gz")):
        try:
            if other != table and header_mismatch(read_header(other), list(params), fixed) is None:
                fits.append(shown(other))
        except TraceReadError:
            continue
    fix = (f"use {' or '.join(fits)}" if fits else
           "generate a table from this sweep file (benchmarks/tabular/generate.py, benchmarks/tabular/README.md)")
    return ("tabular", "table"), (f"{shown(table)} was recorded for {recorded_for(header)}, but {why}: every trial "
                                  f"would fail or be served another sweep's runs. Fix: {fix}")
