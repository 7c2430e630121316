"""Ray Tune's OptunaSearch, recording each trial's outcome in the Optuna study the way it really ended.

Stock ``OptunaSearch`` (Ray 2.60 + Optuna 5, ``ray/tune/search/optuna/optuna_search.py``) has three faults. It
records a trial stopped by a Stopper or ASHA as COMPLETE with its last value. It leaves a trial whose last value is
NaN RUNNING forever. It raises KeyError on a result that lacks the metric, and validation metrics come only every
``trainer.test_freq`` steps. :class:`KlsweepSearch` records each outcome as follows:

============================================  ===============================================================
what happened in Tune                          Optuna trial state
============================================  ===============================================================
ran its full budget, objectives finite         COMPLETE with the last reported value of each objective
stopped by a health rule (single objective)    PRUNED (value = last intermediate value), reason in user attrs
stopped by a health rule (multi-objective)     COMPLETE + constraint violated (infeasible), or FAIL if it
                                               never reported every objective
stopped for non-finite losses or no signal     FAIL: not a score the sampler should learn from
stopped early by ASHA                          PRUNED, stop_reason "scheduler"
stopped on the objective (stop_kind            PRUNED, its reason in user attrs (single and multi-objective)
``objective``)
raised, or last objective NaN/inf/missing      FAIL, with the reason
remedied (restarted with changed knobs) and    PRUNED, stop reason ``remedied: ...``; its values in the user
would otherwise be COMPLETE                    attribute ``rescued_values``
============================================  ===============================================================

A remedied trial's score belongs to its restart schedule (kl_coef 0.002, raised to 0.14 from step 32's checkpoint),
not to its params: run unchanged from step 1, they are the setting a health rule found sick. Recorded PRUNED, it is
never ``study.best_trial``, optuna-dashboard's best trial or in ``study.best_trials``; samplers still learn from
its intermediate values. The summary shows it as the best run, a restart schedule, beside the best setting.

Every finished trial gets user attributes ``ray_trial_id``, ``health`` (healthy|warned|stopped), ``stop_reason``,
``steps`` and ``verl_overrides`` (JSON of the full trial config). In a multi-objective study it also gets an Optuna
constraint (:data:`klsweep.results.CONSTRAINTS_ATTR`): 1.0, infeasible, when a health rule stopped it, else -1.0,
feasible. Samplers learn from it, and it keeps infeasible trials out of ``study.best_trials``.

The study itself carries its objectives' metric names (``Study.set_metric_names``; optuna-dashboard labels its axes
with them). It also carries a one-line description of the sweep (user attribute ``description``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from ray.tune.search.optuna import OptunaSearch

from klsweep.analysis.sweep_dir import study_of
from klsweep.results import (
    ATTR_HEALTH,
    ATTR_RAY_TRIAL_ID,
    ATTR_REMEDIES,
    ATTR_RESCUED_VALUES,
    ATTR_STEPS,
    ATTR_STOP_REASON,
    ATTR_VERL_OVERRIDES,
    CONSTRAINTS_ATTR,
    HEALTH,
    STEP,
    STOP_KIND,
    STOP_KIND_OBJECTIVE,
    STOP_REASON,
    TOTAL_STEPS,
    remedied_reason,
)

#: Health stop kinds recorded as FAIL: the run is broken (NaN) or learned nothing, so its last value means nothing.
FAILED_KINDS = frozenset({"nonfinite", "no_signal"})



class KlsweepSearch(OptunaSearch):
    """OptunaSearch that records PRUNED/FAIL/infeasible trials correctly (see the module docstring).

    Args:
        overrides_of: maps a trial's suggested params to its full verl override dict. The dict is stored as a user
            attribute when the trial is proposed.
        total_steps: the step budget of a trial. A trial that ended earlier without a health stop was stopped by
            the scheduler.
        description: the study's ``description`` user attribute (what the sweep searches, for the dashboard).
        **kwargs: passed to ``OptunaSearch`` (space, metric, mode, points_to_evaluate, sampler, study_name, storage).
    """
    def __init__(self, *, overrides_of: Callable[[Mapping[str, Any]], Mapping[str, Any]], total_steps: int,
                 description: str = "", **kwargs):
        self._description = description
        super().__init__(**kwargs)
        self._overrides_of = overrides_of
        self._total_steps = total_steps
        self._last_values: dict[str, dict[str, float]] = {}
        self._orphans: list[optuna.Trial] = []

    def _setup_study(self, mode) -> None:
        """OptunaSearch's study (created or loaded), labelled with the objectives' metric names and the sweep's
        description."""
        super()._setup_study(mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # set_metric_names: Optuna 3.2+
            self._ot_study.set_metric_names(self._metrics)
        if self._description:
            self._ot_study.set_user_attr("description", self._description)

    def suggest(self, trial_id: str) -> dict | None:
        """Optuna's ask (or an orphan adopted after a crash, see :meth:`restore`), tagged with the Tune trial id."""
        if trial_id not in self._ot_trials and self._orphans:
            self._ot_trials[trial_id] = self._orphans.pop(0)
        params = super().suggest(trial_id)
        ot_trial = self._ot_trials[trial_id]
        ot_trial.set_user_attr(ATTR_RAY_TRIAL_ID, trial_id)
        if params is not None:
            self._record_overrides(ot_trial)
        return params

    def _record_overrides(self, ot_trial: optuna.Trial) -> None:
        """Record the trial's full verl overrides as it is proposed, so running trials show them too."""
        try:
            ot_trial.set_user_attr(ATTR_VERL_OVERRIDES, json.dumps(dict(self._overrides_of(ot_trial.params))))
        except Exception as e:  # a broken config must not leave the trial RUNNING
            ot_trial.set_user_attr(ATTR_VERL_OVERRIDES, f"unavailable: {e}")

    def restore(self, checkpoint_path: str) -> None:
        """Restore the saved searcher, then adopt the study's orphans.

        After a SIGKILL of the driver, the saved searcher state can be older than the study. Trials asked from
        Optuna after the last save are RUNNING in the study but unknown to Tune. They are handed to the next trials
        Tune starts; their params were sampled already, and re-suggesting returns the same values. No trial is lost,
        and the study holds exactly one trial per Tune trial.
        """
        super().restore(checkpoint_path)
        known = {t._trial_id for t in self._ot_trials.values()}
        running = self._ot_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        self._orphans = [optuna.Trial(self._ot_study, t._trial_id) for t in running if t._trial_id not in known]

    @property
    def _metrics(self) -> list[str]:
        return self.metric if isinstance(self.metric, list) else [self.metric]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        last = self._last_values.setdefault(trial_id, {})
        for name in self._metrics:
            value = _as_float(result.get(name))
            if value is not None:
                last[name] = value
        value = last.get(self.metric) if not isinstance(self.metric, list) else None
        if value is not None and self.metric in result and math.isfinite(value):
            # The storage's setter, not Trial.report, which keeps a step's first value: a remedy restarts the trial
            # from a checkpoint (klsweep.orchestrate.remedy) and the steps it runs again replace the abandoned run's,
            # so a PRUNED trial's value (Optuna takes its last intermediate value) is its final run's, as in
            # trials.csv. A resume from a checkpoint runs the steps after it again with the same values.
            ot_trial = self._ot_trials[trial_id]
            ot_trial.storage.set_trial_intermediate_value(ot_trial._trial_id, result["training_iteration"], value)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        self._completed_trials.add(trial_id)
        result = result or {}
        ot_trial = self._ot_trials[trial_id]
        stored = self._ot_study._storage.get_trial(ot_trial._trial_id)
        if stored.state.is_finished():  # told before the driver died; Tune's older state re-ran it: keep the first
            return
        last = self._last_values.pop(trial_id, {})
        for name in self._metrics:  # the final result may carry values on_trial_result never saw (stopper's row)
            value = _as_float(result.get(name))
            if value is not None:
                last[name] = value
        values = [last.get(name) for name in self._metrics]
        iteration = int(result.get("training_iteration", 0) or 0)
        # Training steps: the trainer's own step (a replayed, sampled log skips steps), its own total when it says so.
        steps = int(result.get(STEP, iteration) or 0)
        total_steps = int(result.get(TOTAL_STEPS) or self._total_steps)
        health = str(result.get(HEALTH, "healthy") or "healthy")
        stop_reason = str(result.get(STOP_REASON, "") or "")
        stop_kind = str(result.get(STOP_KIND, "") or "")
        state, stop_reason = self._outcome(error, health, stop_kind, stop_reason, steps < total_steps, steps, values)
        remedies = stored.user_attrs.get(ATTR_REMEDIES) or (result.get("config") or {}).get(ATTR_REMEDIES)
        if remedies and state == optuna.trial.TrialState.COMPLETE:  # a restart schedule, not its params' score
            state, stop_reason = optuna.trial.TrialState.PRUNED, remedied_reason(remedies)
            ot_trial.set_user_attr(ATTR_RESCUED_VALUES, values)
        if len(self._metrics) == 1 and state == optuna.trial.TrialState.PRUNED:
            # Tune gives the result a Stopper or ASHA stopped on to on_trial_complete only, not on_trial_result
            value = _as_float(result.get(self.metric))
            if value is not None and math.isfinite(value) and iteration and iteration not in stored.intermediate_values:
                ot_trial.report(value, iteration)

        ot_trial.set_user_attr(ATTR_RAY_TRIAL_ID, trial_id)
        ot_trial.set_user_attr(ATTR_HEALTH, health)
        ot_trial.set_user_attr(ATTR_STOP_REASON, stop_reason)
        ot_trial.set_user_attr(ATTR_STEPS, steps)
        if len(self._metrics) > 1:  # single objective: a health stop is PRUNED (CmaEsSampler warns on constraints)
            self._ot_study._storage.set_trial_system_attr(ot_trial._trial_id, CONSTRAINTS_ATTR,
                                                          [1.0 if health == "stopped" else -1.0])
        if ATTR_VERL_OVERRIDES not in stored.user_attrs:  # proposed before a driver crash, never recorded
            self._record_overrides(ot_trial)
        told = values if len(values) > 1 else values[0]
        try:
            self._ot_study.tell(ot_trial, told if state == optuna.trial.TrialState.COMPLETE else None, state=state)
        except RuntimeError as e:
            # GridSampler.after_trial calls Study.stop() once every grid point ran; outside Study.optimize Optuna
            # raises, after it stored the trial's state (optuna/study/_tell.py). Tune's num_samples ends the sweep.
            if "Study.stop" not in str(e):
                raise

    def _outcome(
        self, error: bool, health: str, stop_kind: str, stop_reason: str, early: bool, steps: int,
        values: list[float | None],
    ) -> tuple[optuna.trial.TrialState, str]:
        return outcome(self._metrics, error, health, stop_kind, stop_reason, early, steps, values)


def outcome(metrics: list[str], error: bool, health: str, stop_kind: str, stop_reason: str, early: bool, steps: int,
            values: list[float | None]) -> tuple[optuna.trial.TrialState, str]:
    """The Optuna state and stop reason of a trial that ended (the table of the module docstring).

    Takes the objectives' ``metrics``, whether the trial raised (``error``), its last result's ``health``,
    ``stop_kind`` and ``stop_reason``, whether it ended before its step budget (``early``), its ``steps``, and the
    last value of each objective (None when never reported)."""
    State = optuna.trial.TrialState
    finite = all(v is not None and math.isfinite(v) for v in values)
    if error:
        return State.FAIL, stop_reason or "trial raised an error (see its error.txt in the Tune directory)"
    if health == "stopped":
        if stop_kind in FAILED_KINDS:
            return State.FAIL, stop_reason
        if len(values) > 1 and finite:
            return State.COMPLETE, stop_reason  # infeasible through the constraint
        return (State.PRUNED if len(values) == 1 else State.FAIL), stop_reason
    if not finite:
        missing = [m for m, v in zip(metrics, values) if v is None or not math.isfinite(v)]
        return State.FAIL, f"objective {', '.join(missing)} was never reported or is not finite"
    if early:
        if len(values) == 1 or stop_kind == STOP_KIND_OBJECTIVE:  # beaten by its peers: not a result
            return State.PRUNED, stop_reason or f"stopped by the scheduler at step {steps}"
        return State.COMPLETE, stop_reason or f"stopped at step {steps}"
    return State.COMPLETE, stop_reason


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def optuna_number(trial) -> int | None:
    """The Optuna trial number of a Tune trial, or None when the study does not say.

    The study is that of the sweep directory holding the trial's Tune experiment. The searcher tags each Optuna
    trial with its Tune trial id when it suggests it."""
    sweep_dir = Path(trial.storage.experiment_fs_path).parent
    for told in study_of(sweep_dir).get_trials(deepcopy=False):
        if told.user_attrs.get(ATTR_RAY_TRIAL_ID) == trial.trial_id:
            return told.number
    return None
