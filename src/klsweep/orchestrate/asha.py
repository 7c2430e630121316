"""ASHA that works with health rules: ``scheduler: asha`` of a sweep file.

Ray Tune's ``ASHAScheduler`` (``ray/tune/schedulers/async_hyperband.py``, Ray 2.x) records each trial's objective at
each rung (steps ``grace_period × reduction_factor^k``) and stops a trial below the rung's
``1 − 1/reduction_factor`` quantile. Two things go wrong when health rules stop trials too:

* A run that will reward-hack scores as well as a healthy one at steps 10-30, so it sets the rung cutoffs, and the
  health rules stop it later. The healthy trials it pushed below the cutoff are gone, and a sweep can end with no
  trial finished.
* Stock ASHA also records the health-stopped trial's last value when the trial ends.

:class:`HealthAwareASHA` changes both, and nothing else:

* a trial the health rules stopped leaves every rung: its values set no cutoff from then on;
* until one trial has run its whole budget and ended healthy, no trial is stopped by ASHA: the first finished
  trial is never a casualty of cutoffs set by runs the rules later stop. A sweep then ends with no finished trial
  only when the health rules stopped every trial.

Ray internals touched (Ray 2.x): ``ASHAScheduler._trial_info`` (trial id → its ``_Bracket``) and
``_Bracket._rungs`` (a list of ``(milestone, {trial id: value})``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from klsweep.results import HEALTH, STOP_KIND, STOP_KIND_OBJECTIVE

if TYPE_CHECKING:
    from ray.tune.experiment import Trial


def health_stopped(result: dict[str, Any]) -> bool:
    """True when the health rules stopped the trial of this (last) result; a stop on the objective is not one."""
    return result.get(HEALTH) == "stopped" and result.get(STOP_KIND) != STOP_KIND_OBJECTIVE


class HealthAwareASHA(ASHAScheduler):
    """Ray Tune's ``ASHAScheduler`` with health-stopped trials out of the rungs (see the module docstring).

    Takes ASHAScheduler's arguments. ``max_t`` is also the step a trial must reach to count as finished.
    """

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.finished_healthy = 0

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        """ASHA's decision, except CONTINUE until a trial has finished healthy (the value is still recorded)."""
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and not self.finished_healthy:
            self._num_stopped -= 1
            return TrialScheduler.CONTINUE
        return action

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        """Record the trial's end: a health stop leaves every rung, a full healthy run counts as finished."""
        if health_stopped(result):
            bracket = self._trial_info.pop(trial.trial_id, None)
            for _, recorded in bracket._rungs if bracket is not None else ():
                recorded.pop(trial.trial_id, None)
            return
        if result.get(self._time_attr, 0) >= self._max_t:
            self.finished_healthy += 1
        super().on_trial_complete(tune_controller, trial, result)
