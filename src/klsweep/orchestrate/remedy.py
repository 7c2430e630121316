"""The remedy policy: which health rules restart a trial instead of stopping it, from where, with what.

A stop rule with a ``remedy`` restarts its trial from the last checkpoint before its finding's evidence began
(:func:`trend_start`), with the prescribed knobs changed (:func:`prescribe`), as the same Ray Tune trial. This module
decides and imports no Ray; :mod:`klsweep.orchestrate.remedy_tune` carries the decisions out in Ray Tune.

- Which sweeps remedy: :func:`remedies_on` (a rule with a remedy, no ASHA, a trainer that restarts, no
  ``health: {remedies: false}``).
- How often a rule remedies: its ``max_remedies``; a rule firing again at or before the step its last remedy
  answered follows its ``on_same_finding`` (:func:`same_finding`).
- The adaptive KL controller: verl rebuilds it from ``algorithm.kl_ctrl.kl_coef`` at every start and does not
  checkpoint it, so the prescription applies to the coefficient logged at the restart point (:func:`logged_at`).
- Which checkpoints stay: those that can still be a restart point (:func:`steps_to_keep`, :func:`restart_reach`).

Each restart is recorded in the trial's Tune config under :data:`REMEDIES` as flat records
(:class:`klsweep.results.Restart`); it survives ``sweep resume``, and the cap counts from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from klsweep.health.rules import Rule, parse_operation
from klsweep.launchers.resume import KL_COEFF_METRIC, SAVE_FREQ_KEY, save_freq
from klsweep.results import ATTR_REMEDIES, Restart, restarts
from klsweep.spec.space import trial_overrides
from klsweep.trainers.restore import KL_COEF_KEY
from klsweep.verl.liveness import inert_reason
from klsweep.verl.presets import resolve_key, verl_default

if TYPE_CHECKING:
    from klsweep.health.verdict import StopReason
    from klsweep.spec.schema import Sweep

#: The trial config key (and Optuna user attribute) holding a trial's remedy records, oldest first.
REMEDIES = ATTR_REMEDIES
#: Steps between an in-process trial's checkpoints in a remedy sweep when the trial sets no ``trainer.save_freq``.
#: Denser than verl's fifth of the run, so a restart point lies close before a finding (BENCHMARKS.md, remedies).
REMEDY_SAVE_FREQ = 4


def remedies_on(sweep: Sweep) -> bool:
    """Whether ``sweep``'s health rules restart trials instead of stopping them.

    True when a rule has a ``remedy``, the scheduler is ``none`` (ASHA stops instead), the trainer restarts trials
    (not :attr:`klsweep.trainers.TrainerKind.no_restarts`) and ``health.remedies`` is not false.
    """
    if not sweep.health.remedies or sweep.scheduler.type != "none" or sweep.kind.no_restarts:
        return False
    return bool(remedy_rules(sweep))


def remedy_rules(sweep: Sweep) -> tuple[Rule, ...]:
    """The rules of the sweep's rule set that have a ``remedy``, in rule-set order."""
    return tuple(rule for rule in sweep.ruleset.rules if rule.remedy)


def checkpoint_every(sweep: Sweep, overrides: Mapping[str, Any]) -> int:
    """Steps between an in-process trial's checkpoints.

    The trial's ``trainer.save_freq`` when it sets one. Else :data:`REMEDY_SAVE_FREQ` when the sweep remedies, a
    remedy can apply (:func:`cannot_apply`) and it is denser than :func:`klsweep.launchers.resume.save_freq`.
    Else that cadence.
    """
    every = save_freq(overrides)
    if SAVE_FREQ_KEY in overrides or not remedies_on(sweep) or not _some_remedy_applies(sweep):
        return every
    return REMEDY_SAVE_FREQ if every <= 0 else min(every, REMEDY_SAVE_FREQ)


def cannot_apply(rule: Rule, placement: str) -> str:
    """Why ``rule``'s remedy applies to no trial under ``kl_placement`` ``placement``, or ``""`` when it can.

    It cannot when every knob it prescribes is an alias without a live key there
    (:func:`klsweep.verl.presets.resolve_key`), e.g. ``kl_coef`` under ``kl_placement: none``.
    """
    why = []
    for name, operation in rule.remedy.items():
        try:
            resolve_key(name, placement)
        except ValueError as e:
            why.append(_alias_problem(name, operation, e))
            continue
        return ""
    return "; ".join(why)


def _alias_problem(name: str, operation: str, error: ValueError) -> str:
    """``"kl_coef *1.5: alias 'kl_coef' has no effect with kl_placement none ..."``: ``error`` without its advice."""
    return f"{name} {operation}: {str(error).split(': ', 1)[0]}"


def _some_remedy_applies(sweep: Sweep) -> bool:
    """Whether some rule of the sweep has a remedy that :func:`cannot_apply` does not rule out."""
    return any(not cannot_apply(rule, sweep.placement) for rule in remedy_rules(sweep))


@dataclass(frozen=True)
class Remedy:
    """A planned restart of one trial.

    Attributes:
        config: the trial's new Tune config: the prescribed knobs changed, :data:`REMEDIES` extended.
        checkpoint: what to restore: Ray's ``_TrainingResult`` (checkpoint and the metrics reported with it).
        restart: the restart as recorded (number, finding step, rule, checkpoint step, knob changes).
        escalated: the prescription was applied twice (``on_same_finding: escalate``).
    """

    config: dict[str, Any]
    checkpoint: Any
    restart: Restart
    escalated: bool = False

    @property
    def from_step(self) -> int:
        """The training step of the checkpoint the trial restarts from."""
        return self.restart.from_step

    def text(self) -> str:
        """``"kl_runaway at step 47: restarted from step 40 with algorithm.kl_ctrl.kl_coef 0.002 → 0.003"``.

        An escalated remedy ends with ``" (escalated: the remedy applied twice, as the last one changed nothing)"``.
        """
        r = self.restart
        knobs = ", ".join(f"{key} {old:.4g} → {new:.4g}" for key, (old, new) in r.changes.items())
        escalated = " (escalated: the remedy applied twice, as the last one changed nothing)" if self.escalated else ""
        return f"{r.rule} at step {r.step}: restarted from step {r.from_step} with {knobs}{escalated}"


def onset_step(rule: Rule, reason: StopReason) -> int:
    """The first step of the streak that fired ``rule``: ``step − for + 1`` (a Tune trial reports every step)."""
    return reason.step - rule.for_ + 1


def lookback(rule: Rule) -> int:
    """Steps from a finding of ``rule`` back to its restart point at the latest: ``for`` + longest window − 1.

    A finding at step ``s`` restarts from the last checkpoint at or before ``s − lookback``. A rule without a
    window looks back its ``for``.
    """
    windows = [w for c in rule.conditions if isinstance(w := getattr(c, "window", None), int)]
    return rule.for_ + max(windows, default=1) - 1


def trend_start(rule: Rule, reason: StopReason) -> int:
    """The first step of the evidence ``rule`` fired on: the finding's step − :func:`lookback` + 1.

    A restart goes from the last checkpoint before it, before the window the rule read, not just before the
    onset (BENCHMARKS.md, remedies). A ``drop_from_max`` over the whole run has no window and adds nothing.
    """
    return reason.step - lookback(rule) + 1


def restart_reach(sweep: Sweep) -> int | None:
    """The longest :func:`lookback` of the sweep's rules with a remedy; None when the sweep does not remedy.

    A restart point of a finding at step ``s`` is at or before ``s − restart_reach``.
    """
    if not remedies_on(sweep):
        return None
    return max(lookback(rule) for rule in remedy_rules(sweep))


def steps_to_keep(steps: list[int], newest: int, reach: int) -> set[int]:
    """Which checkpoints of a trial's current line can still be a restart point, by step.

    The next finding is at a step ``s > newest`` and restarts from the last checkpoint at or before
    ``s − reach``. So the last one at or before ``newest + 1 − reach`` and all later ones are kept. With none
    at or before it, all are kept.

    Args:
        steps: the training steps of the line's checkpoints.
        newest: the step of the trial's newest checkpoint.
        reach: :func:`restart_reach` (≥ 1).

    Returns:
        the subset of ``steps`` to keep; e.g. steps 4, 8, ..., 40, newest 40, reach 20: ``{20, 24, ..., 40}``.
    """
    below = [step for step in steps if step <= newest + 1 - reach]
    floor = max(below) if below else min(steps, default=0)
    return {step for step in steps if step >= floor}


def verl_checkpoints_kept(sweep: Sweep, overrides: Mapping[str, Any]) -> dict[str, int]:
    """verl's ``trainer.max_actor_ckpt_to_keep`` and ``max_critic_ckpt_to_keep`` for a trial of ``sweep``.

    With remedies: ``ceil(2 reach / save_freq) + 1``, the checkpoints in two :func:`restart_reach` spans before a
    finding plus the restart point. verl saves every :func:`klsweep.launchers.resume.save_freq` steps and removes only
    what the running process saved. Without remedies: 1 each (a resume needs only the newest).
    """
    reach, every = restart_reach(sweep), save_freq(overrides)
    kept = 1 if reach is None or every <= 0 else math.ceil(2 * reach / every) + 1
    return {"trainer.max_actor_ckpt_to_keep": kept, "trainer.max_critic_ckpt_to_keep": kept}


def apply_operation(operation: str, value: float, key: str) -> float:
    """``operation`` (``"*1.5"``, ``"/2"``, ``"+0.01"``, ``"-0.01"``, ``"=0.005"``) applied to ``value``.

    Raises:
        ValueError: ``operation`` is not one (:func:`klsweep.health.rules.parse_operation`; ``key`` names it).
    """
    op, x = parse_operation(key, operation)
    return {"*": value * x, "/": value / x, "+": value + x, "-": value - x, "=": x}[op]


def prescribe(rule: Rule, placement: str, overrides: Mapping[str, Any], last: Mapping[str, Any], times: int = 1
              ) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """The knobs ``rule.remedy`` changes in a trial, and why the others were left alone.

    Aliases resolve as parameters do (:func:`klsweep.verl.presets.resolve_key`). A knob that is inert under
    ``overrides`` (:func:`klsweep.verl.liveness.inert_reason`) or has no numeric value is skipped. The in-reward KL
    coefficient starts from the value logged in ``last`` (``actor/reward_kl_penalty_coeff``), as verl resets its
    controller to ``algorithm.kl_ctrl.kl_coef`` on every start. Integer knobs stay integers.

    Args:
        rule: a rule with a ``remedy``.
        placement: the sweep's ``kl_placement`` (``Sweep.placement``).
        overrides: the trial's full flat verl overrides (:func:`klsweep.spec.space.trial_overrides`).
        last: the trial's reported metrics at the step it restarts from.
        times: how often each operation applies (2 escalates: ``*4`` multiplies by 16).

    Returns:
        ``({verl key: (old, new)}, [why each skipped knob was skipped])``.
    """
    changes: dict[str, tuple[float, float]] = {}
    skipped: list[str] = []
    for name, operation in rule.remedy.items():
        try:
            key = resolve_key(name, placement)
        except ValueError as e:
            skipped.append(_alias_problem(name, operation, e))
            continue
        inert = inert_reason(key, overrides)
        if inert:
            skipped.append(f"{key} has no effect: {inert}")
            continue
        old = overrides.get(key)
        if old is None:
            try:
                old = verl_default(key, overrides)
            except KeyError:
                old = None
        carried = last.get(KL_COEFF_METRIC)
        if key == KL_COEF_KEY and isinstance(carried, (int, float)) and math.isfinite(carried):
            old = carried
        if isinstance(old, bool) or not isinstance(old, (int, float)):
            skipped.append(f"{key} has no numeric value to change (it is {old!r})")
            continue
        new = float(old)
        for _ in range(times):
            new = apply_operation(operation, new, name)
        changes[key] = (float(old), int(round(new)) if isinstance(old, int) and key != KL_COEF_KEY else new)
    return changes, skipped


def same_finding(remedies: Any, rule_name: str, step: int) -> int | None:
    """The step of the finding the trial's last remedy answered, when ``rule_name`` fires again at or before it.

    That is: the last restart (by number) was ``rule_name``'s and ``step`` is at or before its step (the dose
    changed nothing, what ``on_same_finding`` decides). Else None. ``remedies``: the trial's :data:`REMEDIES`.
    """
    done = restarts(remedies)
    if not done:
        return None
    last = done[-1]
    return last.step if last.rule == rule_name and step <= last.step else None


def logged_at(metrics: Mapping[str, Any], remedies: Any) -> dict[str, Any]:
    """The metrics a restart from a checkpoint prescribes from (:func:`prescribe`'s ``last``).

    ``metrics``: the checkpoint's reported metrics, with the ``config`` it was trained with. ``remedies``: the
    trial's :data:`REMEDIES` now. For a checkpoint taken before a later restart that changed the in-reward KL
    coefficient, ``actor/reward_kl_penalty_coeff`` is replaced by the latest such restart's new value: the
    checkpoint logged the coefficient before that remedy.
    """
    out = dict(metrics)
    done = restarts_behind(out)
    later = [r for r in restarts(remedies) if r.number > done and KL_COEF_KEY in r.changes]
    if later:
        out[KL_COEFF_METRIC] = later[-1].changes[KL_COEF_KEY][1]
    return out


def restarts_behind(metrics: Mapping[str, Any]) -> int:
    """How many restarts the run that reported ``metrics`` had behind it, read from the ``config`` it trained with."""
    return len(restarts((metrics.get("config") or {}).get(REMEDIES, ())))


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A trial's Tune config → (its parameters, as :func:`klsweep.spec.space.trial_overrides` reads them; its
    remedies)."""
    return {k: v for k, v in config.items() if k != REMEDIES}, list(config.get(REMEDIES, ()))


def overrides_of(sweep: Sweep, config: Mapping[str, Any]) -> dict[str, Any]:
    """The verl overrides of a trial's Tune config (:func:`klsweep.spec.space.trial_overrides`), :data:`REMEDIES`
    left out."""
    return trial_overrides(sweep, split_config(config)[0])
