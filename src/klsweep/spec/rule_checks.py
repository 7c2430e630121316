"""Checks of the sweep's health rules: their remedies' keys, remedies a trainer cannot apply, rules out of reach.

Each problem is ``(path, message)`` with ``path`` the tuple of the sweep-file field it concerns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from klsweep.health.conditions import WindowCondition
from klsweep.health.rules import Rule
from klsweep.spec.key_checks import Problem
from klsweep.spec.schema import Sweep
from klsweep.verl import presets
from klsweep.verl.config import closest_key, default_keys, engine_of
from klsweep.verl.liveness import inert_reason


def remedy_problems(sweep: Sweep, fixed: dict[str, Any]) -> Iterator[Problem]:
    """Check the prescriptions of the sweep's own health rules (``health.rules[i].remedy``).

    Takes the trial-independent overrides ``fixed`` (:func:`klsweep.spec.space.fixed_overrides`). Yields an error for
    an alias without a live key, a key that is not verl's (with the closest), a knob inert for the sweep's
    algorithm and KL placement, and on verl's own trainer an optimizer key, which verl's checkpoint load restores.
    A preset's inert prescription is not checked: the rule then stops, saying so.
    """
    for i, rule in enumerate(sweep.health.rules):
        for name in rule.remedy:
            path = ("health", "rules", i, "remedy", name)
            try:
                key = presets.resolve_key(name, sweep.placement)
            except ValueError as e:
                yield path, str(e)
                continue
            if key not in default_keys(engine_of(sweep.overrides)):
                hint = closest_key(key, engine_of(sweep.overrides))
                fix = (f"did you mean {hint!r}?" if hint
                       else f"use a verl key or an alias ({', '.join(presets.ALIASES)})")
                yield path, f"{key!r} is not a key of verl 0.9.1's ppo_trainer config: {fix}"
                continue
            inert = inert_reason(key, fixed)
            if inert:
                yield path, f"the remedy changes {key}, which has no effect: {inert}"
            elif sweep.kind.runs_verl and ".optim." in key:
                yield path, (
                    f"the remedy changes {key}, which a verl run restarted from its checkpoint does not take: verl's "
                    "checkpoint load restores the optimizer's param groups and the lr scheduler "
                    "(FSDPCheckpointManager.load_checkpoint in verl/utils/checkpoint/fsdp_checkpoint_manager.py; "
                    "the Megatron manager alike), so the run keeps the checkpoint's value. Prescribe a KL knob "
                    "(kl_coef, kl_loss_coef, target_kl), or drop the remedy and let the rule stop the trial")


def remedies_off(sweep: Sweep) -> Iterator[Problem]:
    """Warn once when remedies are on but no trial will be restarted, naming the rules whose remedy then stops it.

    The trainer cannot restart a trial (:attr:`klsweep.trainers.TrainerKind.no_restarts`), or the file asks for
    ``health: {remedies: true}`` under an ASHA scheduler, which stops instead (see
    :func:`klsweep.orchestrate.remedy.remedies_on`). Yields nothing with ``health: {remedies: false}``, nor for
    ASHA with remedies on by default only.
    """
    named = [rule.name for rule in sweep.ruleset.rules if rule.remedy]
    if not named or not sweep.health.remedies:
        return
    why = sweep.kind.no_restarts
    if why and sweep.scheduler.type == "none":
        yield ("health",), (f"trainer {sweep.trainer}: remedies off, {why}: {', '.join(named)} stop their trial "
                             "instead of restarting it (as with health: {remedies: false})")
    elif sweep.scheduler.type != "none" and "remedies" in sweep.health.model_fields_set:
        yield ("health", "remedies"), (
            f"scheduler {sweep.scheduler.type}: remedies off, ASHA stops trials and does not restart them: "
            f"{', '.join(named)} stop their trial instead of restarting it (as with health: {{remedies: false}}). "
            "Use scheduler: none to have them remedied")


def _first_firing_step(rule: Rule) -> int:
    """The earliest training step at which ``rule`` can fire in a trial that reports every step from step 0.

    Its streak starts no earlier than ``after + 1``, the warm-up (:class:`klsweep.health.streak.Streak`). Nor does
    it start before its conditions are judged. A window statistic of W steps is judged once the run covers W steps:
    step W − 1, from a report at step 0. Under ``all`` every condition must be judged; under ``any``, the first.
    ``drop_from_max``, ``value`` and ``ratio_to_first`` are judged at once. The rule fires once held for ``for``
    steps: ``max(after + 1, judged) + for − 1``.
    """
    judged = [c.window - 1 if isinstance(c, WindowCondition) else 0 for c in rule.conditions]
    first = max(judged) if rule.match == "all" else min(judged)
    return max(rule.after + 1, first) + rule.for_ - 1


def rules_out_of_reach(sweep: Sweep) -> Iterator[Problem]:
    """Warn once, naming the health rules that cannot fire within ``budget.max_steps`` (:func:`_first_firing_step`).

    A trial such a stop rule would stop ends COMPLETE and healthy; such a warn rule never warns.
    """
    steps = sweep.budget.max_steps
    late = [(rule, _first_firing_step(rule)) for rule in sweep.ruleset.rules]
    late = [(rule, first) for rule, first in late if first > steps]
    if not late:
        return
    named = ", ".join(f"{rule.name} ({rule.describe()}: step {first} at the earliest)" for rule, first in late)
    yield ("budget", "max_steps"), (
        f"{steps} steps end every trial before these health rules can fire: {named}. A trial such a stop rule would "
        f"stop ends COMPLETE and healthy. Raise budget.max_steps to {max(f for _, f in late)} or more, or lower their "
        "`after`/`for` (a rule of the same name in health.rules replaces the preset's)")


def unlogged_validation(sweep: Sweep) -> Iterator[Problem]:
    """``health.validation`` naming a validation key no trial would report: the rules on ``val_score`` (reward
    hacking) would judge nothing, and the trial would end healthy.

    A trainer whose one validation metric is known (:attr:`klsweep.trainers.TrainerKind.validation_metric`) must be
    given that one; verl's validation keys start with ``val-core/`` or ``val-aux/``
    (verl/trainer/ppo/metric_utils.py ``process_validation_metrics``)."""
    name = sweep.health.validation
    kind = sweep.kind
    if name is None or kind.name not in ("embedded", "verl", "tabular"):
        return
    if kind.validation_metric is not None and name != kind.validation_metric:
        yield ("health", "validation"), (
            f"the {kind.name} trainer never logs {name!r}: its one validation key is {kind.validation_metric!r}, so "
            f"the rules on val_score would judge nothing. Use {kind.validation_metric!r}, or leave health.validation "
            "out (every validation set is judged)")
    elif kind.validation_metric is None and not name.startswith(("val-core/", "val-aux/")):
        yield ("health", "validation"), (
            f"{name!r} is not a verl validation key: verl logs them as val-core/<data_source>/<reward key>/mean@<n> "
            "(or val-aux/...), so the rules on val_score would judge nothing. Name one of those, or leave "
            "health.validation out (every validation set is judged)")
