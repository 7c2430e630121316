"""Remedies in Ray Tune: the scheduler that restarts a flagged trial from a checkpoint, and checkpoint retention.

The restart is Ray Tune's own, the way ``PopulationBasedTraining._exploit`` (ray/tune/schedulers/pbt.py) continues a
trial from a checkpoint with a new config. The health stopper (:class:`klsweep.health.HealthStopper`) sees a stop
first (Tune asks the stopper before the scheduler) and asks :meth:`RemedyScheduler.plan`, which decides with
:mod:`klsweep.orchestrate.remedy`. The scheduler then pauses the trial, sets its config and restore point, and runs it
before any new trial. The trainable restores that checkpoint (:func:`klsweep.orchestrate.trainable.run_trial`); a verl
trial's process resumes verl's own checkpoint of that step (:func:`klsweep.launchers.resume.rewind`).

Ray internals this module relies on, checked against **Ray 2.60.0** (``pyproject.toml`` pins it; re-check this module
when it moves):

- ``Trial.run_metadata.checkpoint_manager`` (``ray/train/_internal/checkpoint_manager.py``, ``_CheckpointManager``):
  ``best_checkpoint_results`` and ``latest_checkpoint_result`` read; the private ``_checkpoint_results`` list is
  rewritten (:func:`_keep_only`) and ``_latest_checkpoint_result`` set to the restart point, as PBT sets it.
- ``Trial.invalidate_json_state`` and ``Trial.run_metadata.invalidate_cache``: the next experiment save writes the
  shorter checkpoint list.
- ``TuneController.pause_trial(trial, should_checkpoint=False)``, ``TuneController.get_trials`` and
  ``Trial.set_config`` (``ray/tune/execution/tune_controller.py``, ``ray/tune/experiment/trial.py``).
- A checkpoint's metrics carry the config it was trained with (``Trainable.get_auto_filled_metrics``).
- ``OptunaSearch._ot_trials`` (``ray/tune/search/optuna/optuna_search.py``): the Optuna trial of a Tune trial.
- Tune pickles the scheduler (``tuner.pkl``) and the stopper that points to it (``search_gen_state-*.json``) apart:
  the copies share the driver's live trials and planned restarts through module state (:data:`_LIVE_TRIALS`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback, CheckpointConfig
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from klsweep.launchers.resume import checkpointed_step, has_checkpoint
from klsweep.orchestrate.remedy import (
    REMEDIES,
    Remedy,
    logged_at,
    prescribe,
    remedies_on,
    remedy_rules,
    restart_reach,
    restarts_behind,
    same_finding,
    split_config,
    steps_to_keep,
    trend_start,
)
from klsweep.results import STEP, TOTAL_STEPS, Restart, restarts
from klsweep.spec.space import trial_overrides
from klsweep.trainers import runs_verl
from klsweep.verl.presets import resolve_key

if TYPE_CHECKING:
    from klsweep.health.rules import Rule
    from klsweep.health.verdict import StopReason
    from klsweep.orchestrate.searcher import KlsweepSearch
    from klsweep.spec.schema import Sweep

#: The driver's trials and planned restarts by Tune trial id, shared by every copy of :class:`RemedyScheduler` in the
#: process (:meth:`RemedyScheduler.__setstate__`). Tune trial ids are unique across sweeps.
_LIVE_TRIALS: dict[str, Trial] = {}
_PENDING: dict[str, Remedy] = {}


def checkpoint_config(sweep: Sweep) -> CheckpointConfig:
    """Ray Tune's checkpoint retention for ``sweep``'s trials.

    The newest checkpoint alone (``num_to_keep=1``: a resume continues from it), unless the sweep remedies: then
    none is dropped by Ray, and :class:`KeepRestartPoints` keeps the restart points.
    """
    return CheckpointConfig(num_to_keep=None if remedies_on(sweep) else 1)


class RemedyScheduler(FIFOScheduler):
    """Ray Tune's FIFO scheduler that also restarts remedied trials from a checkpoint with a new config.

    Args:
        sweep: the loaded sweep (its ``kl_placement`` resolves a prescription's aliases).
        search: the sweep's searcher, whose Optuna trials get the :data:`REMEDIES` attribute; or None.
    """

    def __init__(self, sweep: Sweep, search: KlsweepSearch | None = None):
        super().__init__()
        self._sweep = sweep
        self._search = search
        self._trials, self._pending = _LIVE_TRIALS, _PENDING

    def __getstate__(self) -> dict[str, Any]:
        """The state without the live trials: unpickling a ``Trial`` needs its trainable registered.

        Tune pickles this scheduler with the experiment; a restored experiment adds its trials again
        (:meth:`on_trial_add`).
        """
        return {k: v for k, v in self.__dict__.items() if k not in ("_trials", "_pending")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore ``state`` and share the driver's live trials and planned restarts with every other copy.

        A restored experiment unpickles the stopper's copy apart from the scheduler's; both must know every trial.
        """
        self.__dict__.update(state)
        self._trials, self._pending = _LIVE_TRIALS, _PENDING

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        """Remember the trial, so that :meth:`plan` finds its checkpoints by id."""
        self._trials[trial.trial_id] = trial

    def plan(self, trial_id: str, rule: Rule, reason: StopReason, result: Mapping[str, Any]) -> Remedy | str:
        """A restart of ``trial_id`` for ``rule``'s finding ``reason``, or a sentence saying why there is none.

        No restart when:

        - the trainer keeps no restartable checkpoint;
        - the trial is unknown;
        - ``on_same_finding: stop`` applies (:func:`~klsweep.orchestrate.remedy.same_finding`);
        - the rule's ``max_remedies`` is used up;
        - fewer than the rule's ``for`` steps are left after the finding;
        - the prescription changes no knob;
        - no checkpoint of the trial's current line lies before :func:`~klsweep.orchestrate.remedy.trend_start`.

        ``escalate`` applies the prescription twice, ``repeat`` once more. ``result``: the finding step's metrics.
        """
        kind = self._sweep.kind
        if kind.in_process is None and not runs_verl(self._sweep.trainer):
            return f"trainer {self._sweep.trainer} trials keep no checkpoint a remedy can restart from"
        trial = self._trials.get(trial_id)
        if trial is None:
            return "the trial is not known to the sweep's scheduler"
        config, remedies = split_config(trial.config)
        done = restarts(remedies)
        same = same_finding(remedies, rule.name, reason.step)
        if same is not None and rule.on_same_finding == "stop":
            return (f"{rule.name} fired again at step {reason.step}, at or before step {same}, whose finding its last "
                    "remedy answered: the dose changed nothing (on_same_finding: stop)")
        if sum(r.rule == rule.name for r in done) >= rule.max_remedies:
            return f"max_remedies {rule.max_remedies} of {rule.name} reached"
        overrides = trial_overrides(self._sweep, config)
        total = result.get(TOTAL_STEPS, overrides.get("trainer.total_training_steps"))  # verl's reports lack it
        if isinstance(total, int) and total - reason.step < rule.for_:
            return (f"the finding is at step {reason.step} of {total}: a restart would only run again steps the trial "
                    f"has run, with fewer than {rule.for_} (the rule's for) left after it to rescue")
        escalated = same is not None and rule.on_same_finding == "escalate"
        times = 2 if escalated else 1
        changes, skipped = prescribe(rule, self._sweep.placement, overrides, result, times=times)
        if not changes:  # decided before any checkpoint is looked for: no restart would change the trial
            return "its remedy cannot apply: " + ("; ".join(skipped) or "it changes nothing")
        start = trend_start(rule, reason)
        checkpoint = self._checkpoint_before(trial, start)
        if checkpoint is None:
            return (f"no checkpoint before step {start}, where the finding began (checkpoints every "
                    "trainer.save_freq steps)")
        # the restart resumes the checkpoint's policy: prescribe from the adaptive coefficient logged there
        changes, _ = prescribe(rule, self._sweep.placement, overrides, logged_at(checkpoint.metrics, remedies), times)
        for key, (_, new) in changes.items():
            config = {k: v for k, v in config.items() if resolve_key(k, self._sweep.placement) != key}
            config[key] = new
        restart = Restart(len(done) + 1, reason.step, rule.name, int(checkpoint.metrics[STEP]), changes)
        config[REMEDIES] = [*remedies, *restart.records()]
        remedy = Remedy(config, checkpoint, restart, escalated)
        self._pending[trial_id] = remedy
        return remedy

    def _checkpoint_before(self, trial: Trial, start: int) -> Any:
        """The trial's last :func:`restart_points` checkpoint before step ``start``, or None."""
        usable = [result for result in restart_points(trial, self._sweep) if result.metrics[STEP] < start]
        return max(usable, key=lambda r: r.metrics[STEP]) if usable else None

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        """Restart a trial the stopper planned a remedy for and return NOOP; otherwise CONTINUE."""
        remedy = self._pending.pop(trial.trial_id, None)
        if remedy is None:
            return TrialScheduler.CONTINUE
        tune_controller.pause_trial(trial, should_checkpoint=False)
        trial.set_config(remedy.config)
        manager = trial.run_metadata.checkpoint_manager
        assert manager is not None  # plan() found the checkpoint there
        manager._latest_checkpoint_result = remedy.checkpoint  # the restore point, as PBT._exploit sets it
        if self._search is not None and trial.trial_id in self._search._ot_trials:
            self._search._ot_trials[trial.trial_id].set_user_attr(REMEDIES, json.dumps(remedy.config[REMEDIES]))
        return TrialScheduler.NOOP

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        """A remedied (PAUSED) trial first, so that it continues before new trials start; else FIFO."""
        for trial in tune_controller.get_trials():
            if trial.status == Trial.PAUSED:
                return trial
        return super().choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return "FIFO scheduling; trials a health rule remedies restart from a checkpoint (klsweep remedies)."


def restart_points(trial: Trial, sweep: Sweep) -> list[Any]:
    """The checkpoints (Ray's ``_TrainingResult``) of the trial's current line a remedy may restart from.

    A checkpoint's metrics carry the config it was trained with, so those of a run a later remedy abandoned are
    left out, after a ``sweep resume`` too. For a verl trial, only steps verl still holds a checkpoint of
    (:func:`klsweep.launchers.resume.has_checkpoint`) count.
    """
    manager = trial.run_metadata.checkpoint_manager
    in_process = sweep.kind.in_process is not None
    if manager is None or not in_process and trial.storage is None:
        return []
    verl = None if in_process or trial.storage is None else Path(trial.storage.trial_fs_path, "checkpoints")
    froms = [r.from_step for r in restarts(trial.config.get(REMEDIES, ()))]
    points = []
    for result in manager.best_checkpoint_results:
        step = result.metrics.get(STEP)
        if not isinstance(step, int) or verl is not None and not has_checkpoint(verl, step):
            continue
        done = restarts_behind(result.metrics)
        if done == len(froms) or (done < len(froms) and step <= min(froms[done:])):
            points.append(result)
    return points


class KeepRestartPoints(Callback):
    """Ray Tune callback of a remedy sweep that deletes the checkpoints no remedy can restart from.

    After each checkpoint (``on_trial_save``) it keeps the newest and the :func:`restart_points` that
    :func:`~klsweep.orchestrate.remedy.steps_to_keep` keeps. The reach is twice :func:`restart_reach` while a rule
    has remedies left for the trial (a finding soon after a restart goes back one more reach), once otherwise.
    Ray's ``CheckpointConfig(num_to_keep=K)`` counts checkpoints and cannot tell an abandoned run's apart.
    A trial that ended keeps only its newest Tune checkpoint, and a verl trial only the verl checkpoint its tracker
    names (:func:`klsweep.launchers.resume.checkpointed_step`).

    Args:
        sweep: the loaded sweep (its rules' lookbacks and its trainer).
    """

    def __init__(self, sweep: Sweep):
        self._sweep = sweep
        self._reach = restart_reach(sweep) or 1
        self._caps = {rule.name: rule.max_remedies for rule in remedy_rules(sweep)}

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        manager = trial.run_metadata.checkpoint_manager
        newest = manager.latest_checkpoint_result if manager is not None else None
        if newest is None or not isinstance(newest.metrics.get(STEP), int):
            return
        points = restart_points(trial, self._sweep)
        done = [r["rule"] for r in trial.config.get(REMEDIES, ())]  # one per record (changed knob)
        left = max((cap - done.count(name) for name, cap in self._caps.items()), default=0)
        reach = self._reach * (2 if left > 0 else 1)
        keep = steps_to_keep([r.metrics[STEP] for r in points], newest.metrics[STEP], reach)
        _keep_only(trial, [r for r in points if r.metrics[STEP] in keep])

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        self._ended(trial)

    def _ended(self, trial: Trial) -> None:
        """Keep the ended trial's newest Tune checkpoint and, for verl, the newest verl checkpoint only."""
        if trial.run_metadata.checkpoint_manager is not None:
            _keep_only(trial, [])
        if not runs_verl(self._sweep.trainer) or trial.storage is None:
            return
        folder = Path(trial.storage.trial_fs_path, "checkpoints")
        newest = checkpointed_step(folder)
        for old in folder.glob("global_step_*") if newest else ():
            if old.name != f"global_step_{newest}":
                shutil.rmtree(old, ignore_errors=True)


def _keep_only(trial: Trial, keep: list[Any]) -> None:
    """Delete the trial's Tune checkpoints other than ``keep`` and its newest, from the manager and from storage."""
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
