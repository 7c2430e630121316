"""Median stopping against the trials that finished healthy: ``stopping: {median: on}``.

Ray Tune's ``MedianStoppingRule`` and Optuna's ``MedianPruner`` stop a trial whose value at a step is below the
median of the other trials' values at that step. In a KL sweep that median is set by the wrong runs: a run that will
reward-hack scores as well as a healthy one for its first 20-60 steps, and the health rules stop it later. So the
median here is taken over the trials that ran their whole budget and ended healthy, only:

* at a step where a trial reports every objective, it is stopped when each objective is worse than the median of
  the finished healthy trials' values at the same step by more than ``margin`` of that median's magnitude;
* nothing is stopped before ``min_finished`` trials have finished healthy, and a trial is never stopped at its last
  step (a finished trial is a result);
* a trial at or above that median is never stopped, nor is a trial within the margin below it.

Calibrated on the tabular benchmark (``benchmarks/peers.py``, sweep seeds 0-19; figures on held-out seeds in
BENCHMARKS.md). :class:`MedianRule` is the rule on plain numbers; :class:`MedianStopper` is the Ray Tune stopper.
A stop writes ``stop_reason`` and ``stop_kind`` ``objective`` into the result, as the objective stopper does: the
searcher records the trial PRUNED with its reason.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from klsweep.orchestrate.rule_stopper import RuleStopper
from klsweep.results import HEALTH, MEDIAN_STOP_REASON
from klsweep.spec.schema import MedianStop


class MedianRule:
    """Decides at each reported step whether a trial is below the finished healthy trials' median.

    Args:
        objectives: ``(metric, mode)`` pairs, mode ``max`` or ``min``.
        total_steps: a trial's step budget; a trial that reaches it is finished.
        settings: the sweep file's ``stopping.median`` (:class:`~klsweep.spec.schema.MedianStop`); default: its
            defaults.

    Raises:
        ValueError: no objective or a mode other than max/min.
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], total_steps: int, settings: MedianStop | None = None):
        if not objectives or any(mode not in ("max", "min") for _, mode in objectives):
            raise ValueError(f"objectives must be (metric, max|min) pairs, got {list(objectives)!r}")
        self.objectives = [(metric, 1.0 if mode == "max" else -1.0) for metric, mode in objectives]
        self.total_steps = total_steps
        self.settings = settings or MedianStop()
        self.curves: dict[str, dict[float, list[float]]] = {}  # trial → step → signed values (higher is better)
        self.finished: list[dict[float, list[float]]] = []

    def finish(self, trial_id: str) -> None:
        """Count the trial as finished healthy: its curve joins the median from now on."""
        curve = self.curves.pop(trial_id, None)
        if curve:
            self.finished.append(curve)

    def update(self, trial_id: str, step: float, values: Mapping[str, Any]) -> str | None:
        """Record the trial's values at ``step`` (when every objective is finite); the stop reason, or None."""
        signed = []
        for metric, sign in self.objectives:
            value = values.get(metric)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return None
            signed.append(sign * value)
        curve = self.curves.setdefault(trial_id, {})
        curve[step] = signed
        for later in [s for s in curve if s > step]:  # restarted from a checkpoint: the old steps after it are gone
            del curve[later]
        if step >= self.total_steps:
            return None
        peers = [c[step] for c in self.finished if step in c]
        if len(peers) < self.settings.min_finished:
            return None
        parts = []
        for i, (metric, sign) in enumerate(self.objectives):
            median = statistics.median(p[i] for p in peers)
            if signed[i] >= median - self.settings.margin * abs(median):
                return None
            parts.append(f"{metric} = {sign * signed[i]:.4g}, more than {self.settings.margin:.0%} "
                         f"{'below' if sign > 0 else 'above'} the median {sign * median:.4g}")
        return (f"{MEDIAN_STOP_REASON}{step:g}: {'; '.join(parts)} of the {len(peers)} trials that finished "
                "healthy, at the same step")


class MedianStopper(RuleStopper):
    """Ray Tune stopper of :class:`MedianRule`. Combined after the health stopper, which writes ``health`` first.

    A trial whose result reaches the step budget and is not health-stopped counts as finished healthy. A result on
    which a remedy was planned (``remedy_note`` set) is not judged, nor is a health-stopped one.
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], total_steps: int, settings: MedianStop | None = None):
        self.rule = MedianRule(objectives, total_steps, settings)

    def judge(self, trial_id: str, step: float, result: dict) -> str | None:
        """Record the result in the rule; the stop reason or None. A result at the budget finishes the trial."""
        if result.get(HEALTH) == "stopped":
            return None
        reason = self.rule.update(trial_id, step, result)
        if step >= self.rule.total_steps:
            self.rule.finish(trial_id)
        return reason
