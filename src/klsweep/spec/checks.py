"""Every check of a schema-valid sweep that needs verl knowledge, errors and warnings, in one call: :func:`check_sweep`.

Each problem is ``(path, message)`` with ``path`` the tuple of the sweep-file field it concerns, so the loader can
put the file and line in front. These checks run before any trial config is composed (they read verl's defaults).
Here: seed trials, live/inert knobs, KL coefficients and scales; keys, health rules and trainers have their modules.
"""

from __future__ import annotations

import difflib
import itertools
import math
from collections.abc import Iterator
from typing import Any

from klsweep.health.signals import DERIVED
from klsweep.spec.key_checks import Problem, check_keys_resolved, label
from klsweep.spec.rule_checks import remedies_off, remedy_problems, rules_out_of_reach, unlogged_validation
from klsweep.spec.schema import Choice, Constant, ObjectiveStop, Range, Sweep
from klsweep.spec.space import condition, fixed_overrides, parameters
from klsweep.spec.trainer_checks import fate_unread, replay_shorter_than_budget, table_problems, verl_resources
from klsweep.verl import presets
from klsweep.verl.config import KL_COEF_KEYS
from klsweep.verl.liveness import inert_reason
from klsweep.verl.managed import managed_key_problems
from klsweep.verl.metrics import ALIASES, KL_IN_LOSS_METRICS, KL_IN_REWARD_METRICS, VAL_SCORE

#: Keys whose value decides whether other knobs are live; a `when` or a search over them opens scenarios.
_SWITCHES = ("algorithm.kl_ctrl.type", presets.ACTOR + "loss_agg_mode", presets.ACTOR + "clip_ratio_low",
             presets.ACTOR + "clip_ratio_high")


def check_sweep(sweep: Sweep) -> tuple[list[Problem], list[Problem]]:
    """Every problem (errors, warnings) of a schema-valid sweep.

    Errors:

    - unknown keys, with the closest valid key;
    - aliases without a live key under the kl_placement;
    - keys owned by other fields;
    - a key both fixed and searched;
    - `when` keys that are not fixed or earlier parameters, or that can never hold;
    - seed trials outside the space;
    - inert knobs: the coefficient of a KL mechanism that is off (verl#644), target_kl without the adaptive
      in-reward controller, KL-loss knobs under DrGRPO;
    - negative KL coefficients;
    - GRPO with rollout.n < 2;
    - ``algorithm: drgrpo`` with a fixed (or only searched) value that is not DrGRPO's;
    - for ``trainer: verl``: ``budget.resources.gpu`` that differs from the GPUs a trial's verl uses
      (``trainer.nnodes`` × ``trainer.n_gpus_per_node``), and multi-node trials;
    - an objective metric the trainer never logs (every trial would run its whole budget, then fail);
    - ``stopping.fate`` with no signal the trials log (:func:`~klsweep.spec.trainer_checks.fate_unread`).

    Sampler options are checked where the sampler is built: :func:`klsweep.orchestrate.samplers.build_sampler`.

    Warnings: a knob inert in some trials only; use_kl_* with coefficient 0 (verl#6519); a KL objective compared
    across searched estimators or loss aggregations, which are on different scales; a grid sweep with more trials
    than grid cells (the trials past them run cells again).
    """
    warnings: list[Problem] = []
    errors, resolved = check_keys_resolved(sweep)
    on_verl = sweep.kind.runs_verl
    errors += [(("overrides", where) if where in sweep.overrides else ("parameters", where), message)
               for where, message in managed_key_problems(sweep.overrides, resolved, runs_verl=on_verl)]
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
                (("parameters", name), f"{label(name, key)} is searched but has no effect in any trial: {reasons[0]}")
            )
        elif any(reasons):
            first = next(r for r in reasons if r)
            warnings.append((("parameters", name), f"{label(name, key)} has no effect in some trials: {first}. "
                             "Add a `when` condition so it is only sampled where it acts"))
    errors.extend(_negative_kl(sweep, params))
    errors.extend(remedy_problems(sweep, fixed))
    errors.extend(table_problems(sweep, params, resolved, fixed))
    if sweep.scheduler.type == "asha":
        warnings.extend((("health", "rules", i, "remedy"), f"rule {rule.name!r} has a remedy but scheduler is asha: "
                         "ASHA's scheduler takes the place of the one that restarts trials, so the rule stops the "
                         "trial instead. Use scheduler: none for remedies")
                        for i, rule in enumerate(sweep.health.rules) if rule.remedy)
    warnings.extend(remedies_off(sweep))
    warnings.extend(rules_out_of_reach(sweep))
    warnings.extend(_zero_kl(fixed, params, resolved))
    warnings.extend(_kl_objective_scales(sweep, params, resolved))
    warnings.extend(replay_shorter_than_budget(sweep))
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
    errors.extend(fate_unread(sweep, EMBEDDED_METRICS))
    warnings.extend(_grid_overrun(sweep, params))
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
    errors.extend(_not_drgrpo(sweep, params, resolved))
    errors.extend(_unlogged_objectives(sweep))
    errors.extend(_unlogged_rule_metrics(sweep))
    errors.extend(unlogged_validation(sweep))
    if on_verl:
        errors.extend(verl_resources(sweep, fixed, params, resolved))
    return errors, warnings


def _grid_overrun(sweep: Sweep, params: dict) -> Iterator[Problem]:
    """A ``sampler: grid`` sweep with more trials than grid cells: Optuna's GridSampler gives the trials past the
    grid cells that already ran, the same settings and seed again."""
    sizes = [len(p.values) for p in params.values() if isinstance(p, Choice)]
    if sweep.sampler.name != "grid" or not sizes or any(not isinstance(p, (Choice, Constant)) for p in params.values()):
        return
    cells, trials = math.prod(sizes), sweep.budget.trials
    if trials > cells:
        extra = f"trial {cells}" if trials == cells + 1 else f"trials {cells}-{trials - 1}"
        yield (("budget", "trials"), f"{trials} trials but the grid has {cells} cells "
               f"({' × '.join(map(str, sizes))} values): {extra} would run cells that already ran, with the same "
               f"settings and seed. Lower budget.trials to {cells}, or add values to the grid")


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
        key = sweep.parameter_keys[name]
        if key not in KL_COEF_KEYS:
            continue
        low = p.min if isinstance(p, Range) else min((v for v in _numbers(p)), default=0)
        if low < 0:
            yield ("parameters", name), f"{label(name, key)} can be {low}: {why}"


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
                    f"objective {objective.metric} is compared across trials with {label(names[key], key)} in "
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


#: What makes verl's GRPO DrGRPO (Liu et al. 2025, as :data:`klsweep.verl.presets.PRESETS` sets it), and why.
_DRGRPO = {
    "algorithm.norm_adv_by_std_in_grpo": (False, "DrGRPO's advantage is the score minus the group mean, not divided "
                                          "by the group's standard deviation"),
    presets.ACTOR + "loss_agg_mode": ("seq-mean-token-sum-norm", "DrGRPO sums each response's token losses and "
                                      "divides by a constant (loss_scale_factor), not by the response's length; "
                                      "verl logs actor/entropy and actor/kl_loss aggregated with the same mode "
                                      "(core_algos.agg_loss), so under seq-mean-token-sum or token-sum they are "
                                      "per-sequence sums, tens of times a per-token value, and health thresholds and "
                                      "comparisons with DrGRPO runs read them on another scale"),
}


def _not_drgrpo(sweep: Sweep, params: dict, names: dict[str, str]) -> Iterator[Problem]:
    """``algorithm: drgrpo`` whose overrides (or every searched value) leave DrGRPO: the trials are another algorithm
    under DrGRPO's name. A search that includes DrGRPO's value compares it with others and is left alone."""
    if sweep.algorithm != "drgrpo":
        return
    for key, (wanted, why) in _DRGRPO.items():
        p = params.get(key)
        if p is None and key in sweep.overrides and sweep.overrides[key] != wanted:
            path, shown = ("overrides", key), f"{key}={sweep.overrides[key]!r}"
        elif isinstance(p, (Choice, Constant)) and wanted not in (p.values if isinstance(p, Choice) else [p.value]):
            path, shown = ("parameters", names[key]), f"{label(names[key], key)} in {_values(p)}"
        else:
            continue
        yield path, (f"{shown} under algorithm: drgrpo: the trials are not DrGRPO, which needs {key}={wanted!r}: "
                     f"{why}. Remove it (the drgrpo preset sets {wanted!r}), or use algorithm: grpo to run GRPO with "
                     "these settings")


def _values(p) -> list[Any]:
    return p.values if isinstance(p, Choice) else [p.value]


#: Every metric the embedded trainer logs, under verl's names (``EmbeddedTrainer.train_step``: PPO with its critic
#: and GRPO, the KL in the reward or in the loss; tests/spec/test_checks.py runs both and compares).
EMBEDDED_METRICS = frozenset({
    "actor/entropy", "actor/grad_norm", "actor/kl_coef", "actor/kl_loss", "actor/lr", "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower", "actor/pg_loss", "actor/ppo_kl", "actor/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff", "critic/advantages/max", "critic/advantages/mean", "critic/advantages/min",
    "critic/grad_norm", "critic/lr", "critic/returns/max", "critic/returns/mean", "critic/returns/min",
    "critic/rewards/max", "critic/rewards/mean", "critic/rewards/min", "critic/score/max", "critic/score/mean",
    "critic/score/min", "critic/values/max", "critic/values/mean", "critic/values/min", "critic/vf_clipfrac",
    "critic/vf_explained_var", "critic/vf_loss", "embedded/gold_score/mean", "embedded/val_response_length/mean",
    "prompt_length/clip_ratio", "prompt_length/max", "prompt_length/mean", "prompt_length/min",
    "response/aborted_ratio", "response_length/clip_ratio", "response_length/max", "response_length/mean",
    "response_length/min", "response_length_non_aborted/clip_ratio", "response_length_non_aborted/max",
    "response_length_non_aborted/mean", "response_length_non_aborted/min", "timing_s/step",
    "val-core/arith/acc/mean@1",
})
#: What an objective usually is, under verl's names (verl/trainer/ppo/metric_utils.py ``compute_data_metrics``,
#: ``process_validation_metrics``; verl/workers/utils/losses.py): offered when an objective is never logged.
_COMMON_OBJECTIVES = ("critic/score/mean", "critic/rewards/mean", "actor/entropy", "actor/kl_loss",
                      "actor/reward_kl_penalty", "response_length/mean")


def _never_logged(trainer: str, metric: str, *, read_as: tuple[str, ...]) -> str | None:
    """Why the ``trainer`` (embedded, verl or tabular) never logs ``metric``, or None when it may. Names in
    ``read_as`` (aliases read under a logged name, derived signals) and validation names are not judged here."""
    if metric in read_as or metric.startswith(("val-core/", "val/", "test_score/")):
        return None
    if trainer == "embedded" and metric not in EMBEDDED_METRICS:
        return f"the embedded trainer never logs {metric!r}"
    if "/" not in metric:
        return f"the {trainer} trainer logs verl's metric names, all of them section/name: never {metric!r}"
    return None


def _unlogged_objectives(sweep: Sweep) -> Iterator[Problem]:
    """An objective metric no trial would ever report: every trial would run its whole budget and then fail.

    verl names every metric ``section/name`` (``critic/score/mean``), so a name without ``/`` is never logged; the
    embedded trainer logs :data:`EMBEDDED_METRICS`. The health rules' aliases (``ref_kl``) and validation names of
    another trainer have their own message (``klsweep.orchestrate.plan``), and are left to it."""
    kind = sweep.kind
    if kind.name not in ("embedded", "verl", "tabular"):
        return  # a replayed log holds its own names
    written = getattr(sweep, "_where", None) or {}
    listed = ("objective", "0") in written or len(sweep.objectives) > 1
    for i, objective in enumerate(sweep.objectives):
        metric = objective.metric
        logs = _never_logged(kind.name, metric, read_as=(*ALIASES, VAL_SCORE))
        if logs is None:
            continue
        if kind.name == "embedded":
            names = sorted(EMBEDDED_METRICS)
        else:
            names = [kind.validation_metric or "val-core/<data_source>/<reward key>/mean@<n>", *_COMMON_OBJECTIVES]
        offered = [kind.validation_metric or names[0], *_COMMON_OBJECTIVES]
        close = ([n for n in offered if metric.lower() in n.lower() and "<" not in n]
                 or difflib.get_close_matches(metric, names, n=1, cutoff=0.5))
        fix = (f"Did you mean {' or '.join(map(repr, close))}? " if close else "") + \
            f"Objectives it logs: {', '.join(offered)}"
        yield ((("objective", i, "metric") if listed else ("objective", "metric")),
               f"{logs}: every trial would run its whole budget, then fail. {fix}")


#: The names a rule reads that are not verl's: the aliases and the derived signals (val_score among them).
_SIGNALS = tuple(a for a in ALIASES if "/" not in a) + DERIVED


def _unlogged_rule_metrics(sweep: Sweep) -> Iterator[Problem]:
    """A metric of one of the sweep's own health rules (``health.rules``) that no trial would ever report: the rule
    could never fire, and the user would believe the guard is on.

    The names are judged as for an objective (:func:`_unlogged_objectives`): an alias of the health rules
    (:data:`klsweep.verl.metrics.ALIASES`) is read under whichever name the trainer logs, and a derived signal
    (:data:`klsweep.health.signals.DERIVED`, ``kl_loss_share``) is computed from them; the embedded trainer logs
    :data:`EMBEDDED_METRICS`; verl names every metric ``section/name``. A replayed log is not judged."""
    kind = sweep.kind
    if kind.name not in ("embedded", "verl", "tabular"):
        return
    for i, rule in enumerate(sweep.health.rules):
        for metric in rule.metrics:
            logs = _never_logged(kind.name, metric, read_as=(*ALIASES, *DERIVED))
            if logs is None:
                continue
            names = sorted(EMBEDDED_METRICS) if kind.name == "embedded" else [*ALIASES, *_COMMON_OBJECTIVES]
            close = difflib.get_close_matches(metric, names, n=1, cutoff=0.6)
            fix = (f"Did you mean {close[0]!r}? " if close else "") + \
                f"Name a metric the trainer logs, or an alias ({', '.join(dict.fromkeys(_SIGNALS))})"
            yield ("health", "rules", i), f"rule {rule.name}: {logs}, so the rule can never fire. {fix}"
