"""Remedy instead of kill: a stop rule with a ``remedy`` restarts its trial from the last checkpoint before its finding
began (:func:`trend_start`), with the prescribed knobs changed, as the same Ray Tune trial (issue 17).

The restart is Ray Tune's own, the way ``PopulationBasedTraining._exploit`` (ray/tune/schedulers/pbt.py, Ray 2.60)
continues a trial from a checkpoint with a new config: the scheduler pauses the trial without a checkpoint
(``pause_trial(trial, should_checkpoint=False)`` stops its actor), gives it the new config (``Trial.set_config``) and
makes the chosen checkpoint the one it restores from (its checkpoint manager's ``_latest_checkpoint_result``, as PBT
does), then runs it again before any new trial (:meth:`RemedyScheduler.choose_trial_to_run`). The trainable restores
that checkpoint (:func:`klsweep.orchestrate.trainable.run_trial`) and trains on to the budget; a verl trial's process
restarts ``verl.trainer.main_ppo`` from verl's own checkpoint of that step (``trainer.resume_mode=resume_path``,
:func:`klsweep.launchers.resume.rewind`) with the new overrides.

Who decides: the health stopper (:class:`klsweep.health.HealthStopper`) sees the stop first (Tune asks the stopper
before the scheduler, ``TuneController._process_trial_result``) and asks :meth:`RemedyScheduler.plan`; a trial whose
rule has no remedies left (``max_remedies``), whose prescription has no live knob, or that has no checkpoint before the
finding began is stopped as before, its stop reason saying why it was not remedied. A rule that fires again at or
before the step its last remedy answered (the dose changed nothing) repeats its remedy, stops the trial or escalates
it (its ``on_same_finding``: ``repeat``, ``stop``, ``escalate``, :func:`same_finding`). ``health: {remedies: false}``
turns remedies off (:func:`remedies_on`), as the trainers that serve recorded runs do (tabular, replay).

The adaptive KL controller: verl builds it from ``algorithm.kl_ctrl.kl_coef`` at every start and does not checkpoint
it (:mod:`klsweep.launchers.resume`), so a restart from the trial's initial coefficient would jump back to it; the
prescription applies to the coefficient the trial logged at the restart's checkpoint step
(``actor/reward_kl_penalty_coeff``) instead.

Each remedy is recorded in the trial's Tune config (:data:`REMEDIES`, which survives ``sweep resume``: the cap counts
from it) and in its Optuna trial's user attribute of the same name: a list of ``{"restart", "step", "rule",
"from_step", "key", "old", "new"}`` (``restart`` numbers the trial's restarts from 1; one may change several knobs),
shown as the ``remedies`` column of trials.csv; the trial's result.json keeps the steps of its final run
(:class:`ResultsFromCheckpoint`).

Which checkpoints are kept: those that can still be a restart point (:class:`KeepRestartPoints`, :func:`steps_to_keep`:
on the trial's current line, the last one at or before its newest one's step + 1 − :func:`restart_reach` and every
later one) and the newest (``sweep resume`` continues from it); a finished trial keeps only its newest. A sweep
without remedies keeps the newest alone (Ray Tune's ``CheckpointConfig(num_to_keep=1)``, :func:`checkpoint_config`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback, CheckpointConfig
from ray.tune.experiment import Trial
from ray.tune.logger import JsonLoggerCallback
from ray.tune.result import EXPR_RESULT_FILE
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from klsweep.health.rules import Rule, parse_operation
from klsweep.health.verdict import StopReason
from klsweep.launchers.resume import KL_COEF_KEY, KL_COEFF_METRIC
from klsweep.results import ATTR_REMEDIES, STEP, TOTAL_STEPS

#: The trial config key (and Optuna user attribute) holding a trial's remedies so far, oldest first; the trainable
#: drops it before building the trial's verl overrides.
REMEDIES = ATTR_REMEDIES
#: The actor's learning rate (a remedy may lower it).
ACTOR_LR_KEY = "actor_rollout_ref.actor.optim.lr"
#: Steps between an in-process trial's checkpoints when its sweep remedies and the trial sets no
#: ``trainer.save_freq``: a restart goes from the last checkpoint before the finding began (:func:`trend_start`), and
#: at the verl-style cadence of a fifth of the run (16 of 80 steps) that was up to 15 steps earlier still (a
#: kl_runaway at step 43 began at 32: restart from 16; a reward_hacking at 80 began at 61: restart from 48). An
#: embedded checkpoint takes ~0.02 s and 2.5 MB against ~0.13 s a step (2 shared cores): 4 costs ~4 % of the
#: run's time; of the disk, only the checkpoints that can still be a restart point stay (:class:`KeepRestartPoints`:
#: 6 of a running trial under the conservative preset, the newest one of a finished trial).
REMEDY_SAVE_FREQ = 4


def remedies_on(sweep) -> bool:
    """Whether ``sweep``'s health rules restart trials instead of stopping them: a rule of its rule set has a
    ``remedy``, the scheduler is ``none`` (ASHA stops instead), the trainer restarts trials
    (:attr:`klsweep.trainers.TrainerKind.no_restarts`: not the tabular and replay trainers, which serve recorded
    runs) and the sweep file does not say ``health: {remedies: false}`` (kill-only)."""
    from klsweep.trainers import trainer_kind

    if not sweep.health.remedies or sweep.scheduler.type != "none" or trainer_kind(sweep.trainer).no_restarts:
        return False
    return bool(remedy_rules(sweep))


#: The rules with a remedy by ``id`` of the sweep's ``health:`` (a frozen :class:`klsweep.health.HealthConfig`, kept
#: beside them so that its id is not reused): :func:`remedy_rules`.
_REMEDY_RULES: dict[int, tuple[Any, tuple[Rule, ...]]] = {}


def remedy_rules(sweep) -> tuple[Rule, ...]:
    """The rules of the sweep's rule set that have a ``remedy``, in rule-set order, whether or not the sweep remedies
    (:func:`remedies_on`). Loaded once per ``sweep.health`` (:func:`klsweep.health.load_ruleset` reads and validates
    the preset's YAML; :func:`remedies_on`, :func:`checkpoint_every`, :func:`restart_reach` and
    :class:`KeepRestartPoints` each ask at sweep start, and every trial asks again)."""
    from klsweep.health import load_ruleset

    health = sweep.health
    cached = _REMEDY_RULES.get(id(health))
    if cached is None or cached[0] is not health:
        if len(_REMEDY_RULES) >= 16:  # a process that loads many sweeps (the tests) keeps the latest ones
            _REMEDY_RULES.clear()
        cached = _REMEDY_RULES[id(health)] = (health, tuple(r for r in load_ruleset(health).rules if r.remedy))
    return cached[1]


def checkpoint_every(sweep, overrides: Mapping[str, Any]) -> int:
    """Steps between an in-process trial's checkpoints: the trial's ``trainer.save_freq`` when it sets one, else
    :data:`REMEDY_SAVE_FREQ` when the sweep remedies (:func:`remedies_on`), a rule's remedy can apply to its trials
    (:func:`cannot_apply`: not ``kl_coef`` alone under ``kl_placement: none``) and that is denser than
    :func:`klsweep.launchers.resume.save_freq` (a fifth of the run, or the validation cadence), else that."""
    from klsweep.launchers.resume import SAVE_FREQ_KEY, save_freq

    every = save_freq(overrides)
    if SAVE_FREQ_KEY in overrides or not remedies_on(sweep) or not _some_remedy_applies(sweep):
        return every
    return REMEDY_SAVE_FREQ if every <= 0 else min(every, REMEDY_SAVE_FREQ)


def cannot_apply(rule: Rule, placement: str) -> str:
    """Why ``rule``'s remedy can apply to no trial of a sweep with ``kl_placement`` ``placement``, or ``""``: every
    knob it prescribes is an alias without a live key there (:func:`klsweep.verl.presets.resolve_key`), e.g. the
    presets' ``kl_coef: "*4"`` in a sweep without KL to the reference (``kl_placement: none``)."""
    from klsweep.verl.presets import resolve_key

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
    """``"kl_coef *1.5: alias 'kl_coef' has no effect with kl_placement none (no KL to the reference)"``: the
    :func:`~klsweep.verl.presets.resolve_key` error without its advice on the sweep's parameters."""
    return f"{name} {operation}: {str(error).split(': ', 1)[0]}"


def _some_remedy_applies(sweep) -> bool:
    """Whether a rule of the sweep's rule set has a remedy that :func:`cannot_apply` does not rule out."""
    return any(not cannot_apply(rule, sweep.placement) for rule in remedy_rules(sweep))


@dataclass(frozen=True)
class Remedy:
    """A planned restart of one trial.

    Attributes:
        config: the trial's new Tune config (the prescribed knobs changed, :data:`REMEDIES` extended).
        checkpoint: Ray's ``_TrainingResult`` (checkpoint and the metrics reported with it) to restore.
        from_step: the training step of that checkpoint.
        changes: ``{"restart", "step", "rule", "from_step", "key", "old", "new"}`` per changed knob.
        escalated: the rule's remedy applied twice (``on_same_finding: escalate``, :func:`same_finding`).
    """

    config: dict[str, Any]
    checkpoint: Any
    from_step: int
    changes: tuple[dict[str, Any], ...]
    escalated: bool = False

    def text(self) -> str:
        """``"kl_runaway at step 47: restarted from step 40 with algorithm.kl_ctrl.kl_coef 0.002 → 0.003"``, and
        ``" (escalated: the remedy applied twice, as the last one changed nothing)"`` when it is."""
        first = self.changes[0]
        knobs = ", ".join(f"{c['key']} {c['old']:.4g} → {c['new']:.4g}" for c in self.changes)
        escalated = " (escalated: the remedy applied twice, as the last one changed nothing)" if self.escalated else ""
        return f"{first['rule']} at step {first['step']}: restarted from step {self.from_step} with {knobs}{escalated}"


def onset_step(rule: Rule, reason: StopReason) -> int:
    """The first step at which ``rule``'s conditions held in the streak that fired it: ``step − for + 1`` for a
    trial that reports every step (a Tune trial does). The report before it did not meet the conditions (or was in
    the warm-up), so a checkpoint at an earlier step was taken while the rule saw the trial healthy. (A window
    statistic may read further back: ``slope10`` at step 13 reads steps 4-13; those steps are not the onset.)"""
    return reason.step - rule.for_ + 1


def lookback(rule: Rule) -> int:
    """How far before a finding of ``rule`` its restart point lies at the latest: a finding at step ``s`` restarts
    from the last checkpoint at or before step ``s − lookback`` (:func:`trend_start` − 1): the rule's ``for`` plus the
    longest window its conditions read, − 1 (the conservative preset's ``kl_runaway``, for 3 and a 10-step slope: 12;
    its ``reward_hacking``, for 1 and a 20-step drop: 20; a rule without a window: its ``for``)."""
    windows = [w for c in rule.conditions if isinstance(w := getattr(c, "window", None), int)]
    return rule.for_ + max(windows, default=1) - 1


def trend_start(rule: Rule, reason: StopReason) -> int:
    """The first step of the evidence ``rule`` fired on: :func:`onset_step` less the longest window its conditions
    read, + 1 (``slope10`` held from step 44: the rise it measures began by step 35), i.e. the finding's step less
    :func:`lookback`, + 1. A restart goes from the last checkpoint before this step, not before the onset: restarted
    from the step before the onset, the prescription met a KL already rising at its steepest: on
    sweeps/conservative.yaml (``kl_coef *1.5``, at most 2, checkpoints every 4 steps) 6 of 7 flagged trials were
    flagged again and stopped; restarted from before the window, 5 of 7 ended healthy (BENCHMARKS.md, remedies). A
    ``drop_from_max`` over the whole run has no window: it adds nothing."""
    return reason.step - lookback(rule) + 1


def restart_reach(sweep) -> int | None:
    """The longest :func:`lookback` of the sweep's rules with a remedy: a restart point of a finding at step ``s`` is
    at or before ``s − restart_reach``; None when the sweep does not remedy (:func:`remedies_on`)."""
    if not remedies_on(sweep):
        return None
    return max(lookback(rule) for rule in remedy_rules(sweep))


def steps_to_keep(steps: list[int], newest: int, reach: int) -> set[int]:
    """Which checkpoints of a trial's current line can still be a restart point, by step.

    The trial's next finding is at a step ``s > newest`` (the stopper judged ``newest`` before its checkpoint was
    registered) and restarts from the last checkpoint at or before ``s − reach``: the last one at or before
    ``newest + 1 − reach`` and every later one can be that; the earlier ones cannot. With none at or before it,
    every checkpoint is kept (a later finding may restart from the first).

    Args:
        steps: the training steps of the line's checkpoints (:func:`restart_points`).
        newest: the step of the trial's newest checkpoint.
        reach: :func:`restart_reach` (≥ 1).

    Returns:
        the subset of ``steps`` to keep; e.g. ``steps`` 4, 8, ..., 40, newest 40, reach 20: ``{20, 24, ..., 40}``.
    """
    below = [step for step in steps if step <= newest + 1 - reach]
    floor = max(below) if below else min(steps, default=0)
    return {step for step in steps if step >= floor}


def checkpoint_config(sweep) -> CheckpointConfig:
    """Ray Tune's checkpoint retention of the sweep's trials: the newest checkpoint alone (``num_to_keep=1``: a
    resume continues from it) unless the sweep remedies, whose restart points :class:`KeepRestartPoints` keeps."""
    return CheckpointConfig(num_to_keep=None if remedies_on(sweep) else 1)


def verl_checkpoints_kept(sweep, overrides: Mapping[str, Any]) -> dict[str, int]:
    """``trainer.max_actor_ckpt_to_keep`` and ``trainer.max_critic_ckpt_to_keep`` of a verl trial of a remedy sweep:
    enough that verl still holds the restart point of a finding soon after a restart as well as at its newest
    checkpoint's step (as :class:`KeepRestartPoints` keeps Tune's), ``ceil(2 reach / save_freq) + 1`` (at most
    ``ceil(2 reach / save_freq)`` checkpoints lie in the ``2 reach`` steps up to the finding, :func:`restart_reach`;
    the restart point is the one before them). verl saves every ``trainer.save_freq`` steps
    (:func:`klsweep.launchers.resume.save_freq`); a restarted verl process removes only the checkpoints it saved itself
    (``BaseCheckpointManager``, verl/utils/checkpoint/checkpoint_manager.py), so those before the restart stay until
    the trial ends (:class:`KeepRestartPoints`). 1 each without remedies (a resume needs only the newest)."""
    from klsweep.launchers.resume import save_freq

    reach, every = restart_reach(sweep), save_freq(overrides)
    kept = 1 if reach is None or every <= 0 else math.ceil(2 * reach / every) + 1
    return {"trainer.max_actor_ckpt_to_keep": kept, "trainer.max_critic_ckpt_to_keep": kept}


def apply_operation(operation: str, value: float, key: str) -> float:
    """``operation`` (``"*1.5"``, ``"/2"``, ``"+0.01"``, ``"-0.01"``, ``"=0.005"``) applied to ``value``."""
    op, x = parse_operation(key, operation)
    return {"*": value * x, "/": value / x, "+": value + x, "-": value - x, "=": x}[op]


def prescribe(rule: Rule, placement: str, overrides: Mapping[str, Any], last: Mapping[str, Any], times: int = 1
              ) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """The knobs ``rule.remedy`` changes in a trial, and why the others were left alone.

    Aliases resolve as parameters do (:func:`klsweep.verl.presets.resolve_key` for ``placement``); a knob inert
    under the trial's ``overrides`` (:func:`klsweep.verl.liveness.inert_reason`) or without a numeric value is skipped.
    The in-reward KL coefficient of an adaptive controller starts from the coefficient the trial logged
    (``actor/reward_kl_penalty_coeff`` in ``last``: the metrics of the checkpoint it restarts from), not from its
    initial value: verl resets its controller to
    ``algorithm.kl_ctrl.kl_coef`` on every start.

    Args:
        rule: a rule with a ``remedy``.
        placement: the sweep's ``kl_placement`` (``Sweep.placement``).
        overrides: the trial's full flat verl overrides (:func:`klsweep.space.trial_overrides`).
        last: the trial's reported metrics at the step it restarts from (its checkpoint's).
        times: how many times each operation applies (2 escalates: ``*4`` multiplies by 16, ``+0.01`` adds 0.02).

    Returns:
        ``({verl key: (old, new)}, [why each skipped knob was skipped])``.
    """
    from klsweep.verl.liveness import inert_reason
    from klsweep.verl.presets import resolve_key, verl_default

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


#: The driver's trials and planned restarts by Tune trial id, shared by every copy of :class:`RemedyScheduler` in
#: the process (see :meth:`RemedyScheduler.__setstate__`); trial ids are unique across sweeps.
_LIVE_TRIALS: dict[str, Trial] = {}
_PENDING: dict[str, Remedy] = {}


class RemedyScheduler(FIFOScheduler):
    """Ray Tune's FIFO scheduler that also restarts remedied trials from a checkpoint with a new config.

    Args:
        sweep: the loaded :class:`klsweep.spec.Sweep` (its ``kl_placement`` resolves a prescription's aliases).
        search: the sweep's :class:`~klsweep.orchestrate.searcher.KlsweepSearch` (its Optuna trials get the
            :data:`REMEDIES` attribute), or None.
    """

    def __init__(self, sweep, search=None):
        super().__init__()
        self._sweep = sweep
        self._search = search
        self._trials, self._pending = _LIVE_TRIALS, _PENDING

    def __getstate__(self) -> dict[str, Any]:
        """Without the live trials: Tune pickles this scheduler with the experiment (``search_gen_state-*.json``
        holds the run config, whose stopper points here), and unpickling a ``Trial`` needs its trainable registered
        (``Trial.__setstate__``), which a resumed sweep's repair step reads before it is. A restored experiment adds
        its trials again (:meth:`on_trial_add`)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_trials", "_pending")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled, it shares the driver's live trials and planned restarts with every other copy: a restored
        experiment unpickles the stopper's copy (from ``search_gen_state-*.json``) apart from the scheduler's (from
        ``tuner.pkl``), and without that the stopper's planner knew none of the trials Tune added after a ``sweep
        resume`` ("not remedied: the trial is not known to the sweep's scheduler")."""
        self.__dict__.update(state)
        self._trials, self._pending = _LIVE_TRIALS, _PENDING

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        """Remember the trial, so that :meth:`plan` (called with its id by the stopper) finds its checkpoints."""
        self._trials[trial.trial_id] = trial

    def plan(self, trial_id: str, rule: Rule, reason: StopReason, result: Mapping[str, Any]) -> Remedy | str:
        """A restart of ``trial_id`` for ``rule``'s finding ``reason``, or why there is none (a sentence).

        The checkpoint is the trial's last one at a step before :func:`trend_start` (among those of the current run
        of the trial: a checkpoint of a run abandoned by an earlier remedy is never used). A prescription that
        changes no knob of the trial (:func:`prescribe`: an alias without a live key under the sweep's
        ``kl_placement``, an inert knob) is a stop whose reason starts "its remedy cannot apply: ", decided before
        the checkpoint is looked for. A finding fewer than the rule's ``for`` steps before the trial's last step
        (``total_steps`` in ``result``, else the trial's ``trainer.total_training_steps``; a reward_hacking at step
        80 of 80) stops the trial as without remedies: a
        restart would run steps 61-80 again and rescue no step after them, and the finding would be forgotten (on
        sweeps/conservative.yaml one such trial ended "healthy" at 0.574, below the reference policy's 0.582).
        A finding the trial's last remedy already answered (:func:`same_finding`: the same rule, at or before that
        remedy's step) follows the rule's ``on_same_finding``: ``stop`` stops the trial (checked before the cap, its
        reason saying the dose changed nothing), ``escalate`` applies the prescription twice (:func:`prescribe`'s
        ``times``), ``repeat`` applies it once more.
        """
        from klsweep.space import trial_overrides
        from klsweep.trainers import runs_verl, trainer_kind

        kind = trainer_kind(self._sweep.trainer)
        if kind.in_process is None and not runs_verl(self._sweep.trainer):
            return f"trainer {self._sweep.trainer} trials keep no checkpoint a remedy can restart from"
        trial = self._trials.get(trial_id)
        if trial is None:
            return "the trial is not known to the sweep's scheduler"
        done = [r for r in trial.config.get(REMEDIES, ()) if r["rule"] == rule.name]
        same = same_finding(trial.config.get(REMEDIES, ()), rule.name, reason.step)
        if same is not None and rule.on_same_finding == "stop":
            return (f"{rule.name} fired again at step {reason.step}, at or before step {same}, whose finding its last "
                    "remedy answered: the dose changed nothing (on_same_finding: stop)")
        if len(_restarts(done)) >= rule.max_remedies:
            return f"max_remedies {rule.max_remedies} of {rule.name} reached"
        config = {k: v for k, v in trial.config.items() if k != REMEDIES}
        overrides = trial_overrides(self._sweep, config)
        total = result.get(TOTAL_STEPS, overrides.get("trainer.total_training_steps"))  # verl's reports lack it
        if isinstance(total, int) and total - reason.step < rule.for_:
            return (f"the finding is at step {reason.step} of {total}: a restart would only run again steps the trial "
                    f"has run, with fewer than {rule.for_} (the rule's for) left after it to rescue")
        escalated = same is not None and rule.on_same_finding == "escalate"
        changes, skipped = prescribe(rule, self._sweep.placement, overrides, result, times=2 if escalated else 1)
        if not changes:  # decided before any checkpoint is looked for: no restart would change the trial
            return "its remedy cannot apply: " + ("; ".join(skipped) or "it changes nothing")
        start = trend_start(rule, reason)
        checkpoint = self._checkpoint_before(trial, start)
        if checkpoint is None:
            return (f"no checkpoint before step {start}, where the finding began (checkpoints every "
                    "trainer.save_freq steps)")
        # the restart resumes the policy of the checkpoint's step, so the prescription applies to the adaptive
        # coefficient logged there: the finding's includes the controller's growth since (on sweeps/conservative.yaml
        # "*4" of step 50's coefficient, restarted at step 28, was ×40 of step 28's)
        logged = _logged_at(checkpoint, trial.config.get(REMEDIES, ()))
        changes, _ = prescribe(rule, self._sweep.placement, overrides, logged, times=2 if escalated else 1)
        from klsweep.verl.presets import resolve_key

        for key, (_, new) in changes.items():
            config = {k: v for k, v in config.items() if resolve_key(k, self._sweep.placement) != key}
            config[key] = new
        from_step = int(checkpoint.metrics[STEP])
        restart = len(_restarts(trial.config.get(REMEDIES, ()))) + 1
        records = tuple({"restart": restart, "step": reason.step, "rule": rule.name, "from_step": from_step,
                         "key": key, "old": old, "new": new} for key, (old, new) in changes.items())
        config[REMEDIES] = [*trial.config.get(REMEDIES, ()), *records]
        remedy = Remedy(config, checkpoint, from_step, records, escalated)
        self._pending[trial_id] = remedy
        return remedy

    def _checkpoint_before(self, trial: Trial, start: int):
        """The trial's last checkpoint before step ``start`` among its :func:`restart_points`."""
        usable = [result for result in restart_points(trial, self._sweep) if result.metrics[STEP] < start]
        return max(usable, key=lambda r: r.metrics[STEP]) if usable else None

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        """Restart a trial the stopper planned a remedy for (see the module docstring); otherwise CONTINUE."""
        remedy = self._pending.pop(trial.trial_id, None)
        if remedy is None:
            return TrialScheduler.CONTINUE
        tune_controller.pause_trial(trial, should_checkpoint=False)
        trial.set_config(remedy.config)
        # the checkpoint the trial restores from, set as PopulationBasedTraining._exploit sets it (Ray 2.60)
        manager = trial.run_metadata.checkpoint_manager
        assert manager is not None  # plan() found the checkpoint there
        manager._latest_checkpoint_result = remedy.checkpoint
        if self._search is not None and trial.trial_id in self._search._ot_trials:
            self._search._ot_trials[trial.trial_id].set_user_attr(REMEDIES, json.dumps(remedy.config[REMEDIES]))
        return TrialScheduler.NOOP

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        """A remedied (PAUSED) trial first, so that it continues before the sweep starts new trials; else FIFO."""
        for trial in tune_controller.get_trials():
            if trial.status == Trial.PAUSED:
                return trial
        return super().choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return "FIFO scheduling; trials a health rule remedies restart from a checkpoint (klsweep remedies)."


def _logged_at(checkpoint, remedies) -> dict[str, Any]:
    """The metrics a restart from ``checkpoint`` prescribes from (:func:`prescribe`'s ``last``): the checkpoint's,
    but for one taken before the trial's latest restart that changed the in-reward KL coefficient (a second restart
    from the same or an earlier checkpoint) the coefficient that restart resumed with: the checkpoint logged the
    coefficient of the run that restart abandoned, before its remedy (β 0.05 at step 3, restarted from 3 at 0.025
    and flagged again: the next remedy starts from 0.025, not from 0.05 again, which would restart it as before)."""
    metrics = dict(checkpoint.metrics)
    done = len(_restarts((metrics.get("config") or {}).get(REMEDIES, ())))
    later = [r for r in remedies if r["restart"] > done and r["key"] == KL_COEF_KEY]
    if later:
        metrics[KL_COEFF_METRIC] = max(later, key=lambda r: r["restart"])["new"]
    return metrics


def same_finding(remedies, rule_name: str, step: int) -> int | None:
    """The step of the finding the trial's last remedy answered, when that remedy was ``rule_name``'s and the rule
    fires again at ``step`` at or before it (the dose changed nothing: what ``on_same_finding`` decides); else None.
    ``remedies``: the trial's :data:`REMEDIES` records. On sweeps/aggressive.yaml and sweeps/grpo_kl.yaml
    (``kl_coef *4``, seeds 0-4) 29 of 48 remedied trials were flagged again at the very step of their first finding;
    the second remedy rescued 2 of them."""
    if not remedies:
        return None
    last = max(remedies, key=lambda r: r["restart"])
    return int(last["step"]) if last["rule"] == rule_name and step <= last["step"] else None


def _restarts(remedies) -> list[int]:
    """The step each restart of a trial continued from, in order (one restart may change several knobs, and a
    restarted trial may be flagged again at the same step: restarts are told apart by their number)."""
    return list({r["restart"]: r["from_step"] for r in remedies}.values())


def restart_points(trial: Trial, sweep) -> list[Any]:
    """The checkpoints (Ray's ``_TrainingResult``) a remedy of ``trial`` may restart from, those of the trial's
    current line: each checkpoint's metrics carry the config it was trained with (Ray's
    ``Trainable.get_auto_filled_metrics``), so a checkpoint of a run that a later remedy abandoned (one after the step
    it restarted from) is told apart, after a ``sweep resume`` too. A verl trial reports a Tune checkpoint of its step
    at every step (``step.json``): only those of a step verl still holds a checkpoint of in the trial's
    ``checkpoints/`` (:func:`klsweep.launchers.resume.has_checkpoint`) count, and the restart resumes verl from there
    (:func:`klsweep.launchers.resume.rewind`)."""
    from klsweep.launchers.resume import has_checkpoint
    from klsweep.trainers import trainer_kind

    manager = trial.run_metadata.checkpoint_manager
    in_process = trainer_kind(sweep.trainer).in_process is not None
    if manager is None or not in_process and trial.storage is None:
        return []
    verl = None if in_process or trial.storage is None else Path(trial.storage.trial_fs_path, "checkpoints")
    restarts = _restarts(trial.config.get(REMEDIES, ()))
    points = []
    for result in manager.best_checkpoint_results:
        step = result.metrics.get(STEP)
        if not isinstance(step, int) or verl is not None and not has_checkpoint(verl, step):
            continue
        config = result.metrics.get("config") or {}
        done = len(_restarts(config.get(REMEDIES, ())))
        if done == len(restarts) or (done < len(restarts) and step <= min(restarts[done:])):
            points.append(result)
    return points


class KeepRestartPoints(Callback):
    """Ray Tune callback of a remedy sweep that deletes the checkpoints no remedy can restart from.

    After each checkpoint of a trial (``on_trial_save``, once Tune registered it), it keeps the trial's newest
    checkpoint and those of its :func:`restart_points` that :func:`steps_to_keep` keeps for twice
    :func:`restart_reach` while a rule with a remedy has one left for the trial (its ``max_remedies`` not used up),
    once otherwise: a finding soon after a restart from step F restarts from before ``F + 1 − restart_reach``, one
    reach before the restart point (seen live: restarted from step 28, flagged again at 40, restart point ≤ 21);
    the others (older ones, and those of a run a restart abandoned) are deleted, as Ray's own
    ``CheckpointConfig(num_to_keep=K)`` deletes (ray/train/_internal/checkpoint_manager.py), which counts checkpoints
    and cannot tell an abandoned run's from a restart point. A trial that ended (complete, stopped or failed: Tune
    does not resume it) keeps only its newest Tune checkpoint, and a verl trial only the verl checkpoint its tracker
    names (:func:`klsweep.launchers.resume.checkpointed_step`). ``sweep run sweeps/conservative.yaml`` (checkpoints
    every 4 steps, reach 20: at most 11 per running trial) left 37 MB (12 checkpoints) with a single reach, 572 MB
    (230) with every checkpoint kept.

    Args:
        sweep: the loaded :class:`klsweep.spec.Sweep` (its rules' :func:`lookback` and its trainer).
    """

    def __init__(self, sweep):
        self._sweep = sweep
        self._reach = restart_reach(sweep) or 1
        self._caps = {rule.name: rule.max_remedies for rule in remedy_rules(sweep)}

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        manager = trial.run_metadata.checkpoint_manager
        newest = manager.latest_checkpoint_result if manager is not None else None
        if newest is None or not isinstance(newest.metrics.get(STEP), int):
            return
        points = restart_points(trial, self._sweep)
        done = [r["rule"] for r in trial.config.get(REMEDIES, ())]
        left = max((cap - done.count(name) for name, cap in self._caps.items()), default=0)
        reach = self._reach * (2 if left > 0 else 1)
        keep = steps_to_keep([r.metrics[STEP] for r in points], newest.metrics[STEP], reach)
        _keep_only(trial, [r for r in points if r.metrics[STEP] in keep])

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        self._ended(trial)

    def _ended(self, trial: Trial) -> None:
        from klsweep.launchers.resume import checkpointed_step
        from klsweep.trainers import runs_verl

        if trial.run_metadata.checkpoint_manager is not None:
            _keep_only(trial, [])
        if not runs_verl(self._sweep.trainer) or trial.storage is None:
            return
        import shutil

        folder = Path(trial.storage.trial_fs_path, "checkpoints")
        newest = checkpointed_step(folder)
        for old in folder.glob("global_step_*") if newest else ():
            if old.name != f"global_step_{newest}":
                shutil.rmtree(old, ignore_errors=True)


def _keep_only(trial: Trial, keep: list[Any]) -> None:
    """Delete the trial's Tune checkpoints other than ``keep`` and its newest one, from its checkpoint manager's
    list (Ray 2.60's ``_CheckpointManager._checkpoint_results``) and from storage."""
    manager = trial.run_metadata.checkpoint_manager
    kept = {id(r) for r in keep} | {id(manager.latest_checkpoint_result)}
    dropped = [r for r in manager._checkpoint_results if id(r) not in kept]
    if not dropped:
        return
    manager._checkpoint_results = [r for r in manager._checkpoint_results if id(r) in kept]
    for result in dropped:
        try:
            result.checkpoint.filesystem.delete_dir(result.checkpoint.path)
        except (FileNotFoundError, OSError):  # already gone (a killed driver's deletion before Tune saved its state)
            pass
    trial.invalidate_json_state()  # the next experiment save writes the shorter list
    trial.run_metadata.invalidate_cache()


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A trial's Tune config → (its parameters, as :func:`klsweep.space.trial_overrides` reads them; its remedies)."""
    return {k: v for k, v in config.items() if k != REMEDIES}, list(config.get(REMEDIES, ()))


def overrides_of(sweep, config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`klsweep.space.trial_overrides` of a trial's Tune config, its :data:`REMEDIES` left out."""
    from klsweep.space import trial_overrides

    return trial_overrides(sweep, split_config(config)[0])


def reapply_after_load(trainer, overrides: Mapping[str, Any], remedies: list[dict[str, Any]]) -> None:
    """Put a remedied trial's prescribed values back after an in-process trainer restored its checkpoint.

    The embedded trainer's ``load`` restores what its checkpoint holds, the adaptive KL coefficient and the AdamW
    learning rate included (verl rebuilds its KL controller from the config instead, ``RayPPOTrainer.__init__``), so
    without this a remedied ``kl_coef`` or ``actor_rollout_ref.actor.optim.lr`` would be undone by the restore.
    """
    keys = {r["key"] for r in remedies}
    kl_ctrl = getattr(trainer, "kl_ctrl", None)
    if KL_COEF_KEY in keys and kl_ctrl is not None:
        kl_ctrl.value = float(overrides[KL_COEF_KEY])
    optimizer = getattr(trainer, "actor_optimizer", None)
    if ACTOR_LR_KEY in keys and optimizer is not None:
        for group in optimizer.param_groups:
            group["lr"] = float(overrides[ACTOR_LR_KEY])


class ResultsFromCheckpoint(JsonLoggerCallback):
    """Ray Tune's ``result.json`` logger, with a restarted trial's file holding each step once: the steps up to the
    checkpoint it restarts from, then the new run's.

    Ray's own (``JsonLoggerCallback.log_trial_start``, ray/tune/logger/json.py, Ray 2.60) copies the file from the
    trial's storage over the driver's staging copy when the trial restarts from a checkpoint, though the storage's
    copy is only synced from the staging one now and then: a trial remedied at step 4 kept steps 4-6 of 6. And a
    restart would keep the steps the restarted run supersedes. Here the staging copy is kept when it has lines (the
    same driver wrote it: it is the latest; a resumed sweep's new driver has none and copies), and the rows after the
    checkpoint's step are dropped where the restarted run reports those steps again: an in-process trial always does
    (it continues from the checkpoint), a process trial (verl) when a remedy rewound it
    (:func:`klsweep.launchers.resume.rewind`; otherwise it reports only the steps after those its earlier attempts
    logged). Passed in the run config's callbacks, it replaces Ray's default JSON logger
    (``ray/tune/utils/callback.py``).

    Args:
        in_process: the sweep's trainer runs in the Tune worker (:attr:`klsweep.trainers.TrainerKind.in_process`).
    """

    def __init__(self, in_process: bool = True):
        super().__init__()
        self._in_process = in_process

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if trial.local_path is None or trial.storage is None:
            return super()._restore_from_remote(file_name, trial)
        local = Path(trial.local_path, file_name)
        if not (local.is_file() and local.stat().st_size):  # a new driver (sweep resume): the storage's copy
            super()._restore_from_remote(file_name, trial)
        checkpoint = trial.latest_checkpoint_result
        if file_name != EXPR_RESULT_FILE or not local.is_file() or checkpoint is None:
            return
        last = checkpoint.metrics.get(STEP, 0)
        restarts = _restarts(trial.config.get(REMEDIES, ()))
        if not (self._in_process or restarts and restarts[-1] == last):
            return
        kept = [line for line in local.read_text().splitlines() if _step_of(line, last + 1) <= last]
        tmp = local.with_name(local.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, local)


def _step_of(line: str, default: int) -> int:
    """The training step of one ``result.json`` line (``step``, else ``training_iteration``); ``default`` for a line
    that is not a JSON object with one (the half-written last line of a killed driver)."""
    try:
        row = json.loads(line)
        step = row.get(STEP, row.get("training_iteration"))
    except (json.JSONDecodeError, AttributeError):
        return default
    return step if isinstance(step, int) else default


def schedule_line(remedies: Any) -> str:
    """A trial's whole remedy schedule on one line, for the trial lines of ``sweep run`` and ``sweep status``:
    ``"2× kl_runaway@46 from 32 kl_coef 0.002363→0.003545; kl_runaway@46 from 32 kl_coef 0.003788→0.005682"``
    (restarts, then per restart: the rule, the step it fired at, the step restarted from, each knob changed by its
    last key component, old → new); ``""`` for none. ``remedies``: the :data:`REMEDIES` list, or trials.csv's JSON
    column (:func:`klsweep.trainers.remedy_schedule`; raises ``ValueError`` for a string that is not a JSON list)."""
    from klsweep.trainers import remedy_schedule

    restarts: dict[int, list[dict[str, Any]]] = {}
    for record in remedy_schedule(remedies):
        restarts.setdefault(int(record["restart"]), []).append(record)
    parts = [f"{rs[0]['rule']}@{rs[0]['step']} from {rs[0]['from_step']} "
             + ", ".join(f"{r['key'].rsplit('.', 1)[-1]} {r['old']:.4g}→{r['new']:.4g}" for r in rs)
             for _, rs in sorted(restarts.items())]
    return f"{len(parts)}× " + "; ".join(parts) if parts else ""
