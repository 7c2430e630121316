"""The Ray Tune side of klsweep's early stoppers: one result in, the rule's verdict out, a stop written down.

:class:`RuleStopper` holds what the stoppers of ``stopping:`` share: the step of a result (``step``, else
``training_iteration``), results a remedy was planned on (``remedy_note`` set) left unjudged, and a stop written into
the result as ``stop_reason`` (the rule's text) and ``stop_kind`` ``objective``. The searcher then records the trial
PRUNED with that reason, as it does a health stop. A subclass says how one result is judged (:meth:`judge`).
:class:`StopperChain` asks a sweep's stoppers in order and tells the others of a stop.
"""

from __future__ import annotations

from collections.abc import Sequence

from ray.tune.stopper import Stopper

from klsweep.health.stopper import REMEDY_NOTE
from klsweep.results import HEALTH, STEP, STOP_KIND, STOP_KIND_OBJECTIVE, STOP_REASON


def result_step(result: dict) -> float | None:
    """The step of a Tune result: ``step``, else ``training_iteration``; None when neither is a number."""
    step = result.get(STEP, result.get("training_iteration"))
    return step if isinstance(step, (int, float)) else None


class RuleStopper(Stopper):
    """A per-trial Ray Tune stopper around a rule on plain numbers; never stops the whole experiment."""

    def judge(self, trial_id: str, step: float, result: dict) -> str | None:
        """The stop reason for this result of ``trial_id`` at ``step``, or None to let the trial run on."""
        raise NotImplementedError

    def __call__(self, trial_id: str, result: dict) -> bool:
        """Feed one result; True to stop the trial, with ``stop_reason`` and ``stop_kind`` written into ``result``.

        A result without a numeric step, or on which the health stopper planned a remedy, is not judged.
        """
        step = result_step(result)
        if step is None or result.get(REMEDY_NOTE):
            return False
        reason = self.judge(trial_id, step, result)
        if reason is None:
            return False
        result[STOP_REASON], result[STOP_KIND] = reason, STOP_KIND_OBJECTIVE
        return True

    def stopped(self, trial_id: str, result: dict) -> None:
        """Another stopper of the chain stopped the trial on ``result``; a rule that learns from it overrides this."""

    def stop_all(self) -> bool:
        """Judged per trial: never stops the whole experiment."""
        return False


class StopperChain(Stopper):
    """Ray Tune's ``CombinedStopper`` (the stoppers asked in order, the first True stops the trial), except that
    the other :class:`RuleStopper` s of the chain then hear of the stop (:meth:`RuleStopper.stopped`) with the
    result that ended it: a rule can learn from the trials the health rules stop."""

    def __init__(self, *stoppers: Stopper):
        self.stoppers = stoppers

    def __call__(self, trial_id: str, result: dict) -> bool:
        """True when a stopper stops the trial; the stoppers after it are not asked, as in ``CombinedStopper``."""
        return _ask(self.stoppers, trial_id, result)

    def stop_all(self) -> bool:
        """True when any stopper stops the whole experiment."""
        return any(stopper.stop_all() for stopper in self.stoppers)

    def replay(self, trial_id: str, rows: Sequence[dict]) -> None:
        """Tell the rule stoppers an ended trial's results (``result.json`` rows, in step order) as they heard them.

        A Tuner that extends a sweep starts with new stoppers: replayed, they judge its trials against the trials
        that ran before, as one Tuner would have. A last row the health rules stopped (``health`` ``stopped``,
        ``stop_kind`` not ``objective``) is told as a stop; the health stopper itself is not asked again.
        """
        rules = [stopper for stopper in self.stoppers if isinstance(stopper, RuleStopper)]
        for i, row in enumerate(rows):
            if i == len(rows) - 1 and row.get(HEALTH) == "stopped" and row.get(STOP_KIND) != STOP_KIND_OBJECTIVE:
                for rule in rules:
                    rule.stopped(trial_id, dict(row))
                return
            if _ask(rules, trial_id, dict(row)):
                return


def _ask(stoppers: Sequence[Stopper], trial_id: str, result: dict) -> bool:
    """Ask ``stoppers`` in order; at the first that stops the trial, tell the other rule stoppers and return True."""
    for stopper in stoppers:
        if stopper(trial_id, result):
            for other in stoppers:
                if other is not stopper and isinstance(other, RuleStopper):
                    other.stopped(trial_id, result)
            return True
    return False
