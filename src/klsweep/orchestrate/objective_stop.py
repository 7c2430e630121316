"""Stopping on the objective: stop a trial that cannot become competitive, not only a sick one.

Health rules (:mod:`klsweep.health`) stop a trial whose run is broken. This stops a healthy-looking trial that its
peers already beat by more than the noise, so its remaining steps go to other trials. It is built for RL sweeps of
8-32 trials with noisy curves, where the usual early stoppers do not fit:

* Ray Tune's ASHA and median stopping and Optuna's pruners rank one scalar and need many trials per rung. ASHA keeps
  1/η of each rung; Optuna's ``MedianPruner`` needs ``n_startup_trials``. None handles reward ↑ and KL ↓ together:
  Optuna prunes single-objective studies only (optuna#5260).
* So the rule here is Pareto dominance by a margin at the same step; with one objective, "worse by a margin".
  A *rung* is a step where a trial reports every objective (``trainer.test_freq`` for verl's validation metrics).
  At a rung, a trial is stopped when at least ``dominated_by`` other trials that reached the same step were better
  on *every* objective by at least that objective's margin. It needs ``min_peers`` trials at that step and ``grace``
  of the trial's budget run. A trial is never stopped at its last step: a finished trial is a result.
  A trial on or within the margin of the front of its step is never stopped, since dominance by a margin implies it.
  With ``dominated_by`` ≥ 2, neither is a trial that only one peer beats.
* Noise: values are the mean of a trial's last ``window`` rung values. Each objective's margin is
  ``margin`` × σ × √2, the standard deviation of a difference of two such values. σ is the step-to-step noise of
  every curve seen so far: 1.4826 × the median absolute deviation of successive rung differences ÷ √2. Each
  difference holds two noisy values; the median keeps collapses and trends out. No trial stops until at least
  ``min_diffs`` differences are known, so nothing needs calibrating on earlier sweeps.

:class:`ObjectiveRule` is the rule on plain numbers, used by the live sweep and by
``benchmarks/early_stop_savings.py --table``. :class:`ObjectiveStopper` is the Ray Tune stopper. The sweep combines
it with :class:`~klsweep.health.HealthStopper` (``ray.tune.stopper.CombinedStopper``, health first). A stop writes
``stop_reason`` (the text) and ``stop_kind`` ``objective`` into the result. The searcher then records the trial
PRUNED with its reason, as it does a scheduler's stop.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from klsweep.orchestrate.rule_stopper import RuleStopper
from klsweep.spec.schema import ObjectiveStop

_MAD_TO_SD = 1.4826  # σ of a normal distribution ÷ its median absolute deviation


class ObjectiveRule:
    """Decides, rung by rung, whether a trial can still become competitive (see the module docstring).

    Args:
        objectives: ``(metric, mode)`` pairs, mode ``max`` or ``min``; a result counts as a rung only when it holds
            a finite value of every metric.
        total_steps: the step budget of a trial (``grace`` is a fraction of it).
        settings: the sweep file's ``stopping.objective`` knobs (:class:`~klsweep.spec.schema.ObjectiveStop`);
            default: its defaults.

    Raises:
        ValueError: no objective, a mode other than max/min, or ``total_steps`` < 1.
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], total_steps: int,
                 settings: ObjectiveStop | None = None):
        if not objectives:
            raise ValueError("ObjectiveRule needs at least one (metric, mode) objective")
        bad = [mode for _, mode in objectives if mode not in ("max", "min")]
        if bad:
            raise ValueError(f"objective mode must be max or min, not {bad[0]!r}")
        if total_steps < 1:
            raise ValueError(f"total_steps must be ≥ 1, not {total_steps}")
        self.metrics = [metric for metric, _ in objectives]
        self.signs = [1.0 if mode == "max" else -1.0 for _, mode in objectives]
        self.settings = settings or ObjectiveStop()
        self.grace_steps = self.settings.grace * total_steps
        self.total_steps = total_steps
        self._rungs: dict[str, list[tuple[float, tuple[float, ...]]]] = {}  # trial → [(step, signed values)]

    def update(self, trial_id: str, step: float, metrics: Mapping[str, Any]) -> str | None:
        """Feed one report of a trial; returns the stop reason's text when the trial should stop, else None.

        A step before the trial's last rung (a restart from a checkpoint) drops the rungs after it; a second report
        of a rung's step replaces the rung when it holds every objective.
        """
        rungs = self._rungs.setdefault(trial_id, [])
        while rungs and rungs[-1][0] > step:
            rungs.pop()
        values = [metrics.get(m) for m in self.metrics]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            return None
        if rungs and rungs[-1][0] == step:
            rungs.pop()
        rungs.append((step, tuple(sign * float(v) for sign, v in zip(self.signs, values))))  # type: ignore[arg-type]
        return self._judge(trial_id, step)

    def noise(self) -> list[float] | None:
        """Per objective, σ of one rung value (see the module docstring); None while too few differences are
        known."""
        diffs: list[list[float]] = [[] for _ in self.metrics]
        for rungs in self._rungs.values():
            for (_, a), (_, b) in zip(rungs, rungs[1:]):
                for j, column in enumerate(diffs):
                    column.append(b[j] - a[j])
        if len(diffs[0]) < self.settings.min_diffs:
            return None
        out = []
        for column in diffs:
            centre = statistics.median(column)
            out.append(_MAD_TO_SD * statistics.median(abs(d - centre) for d in column) / math.sqrt(2))
        return out

    def _value(self, trial_id: str, step: float) -> tuple[float, ...] | None:
        """The trial's smoothed value at ``step``: the mean of its last ``window`` rungs at or before it, if the
        trial reached ``step``."""
        rungs = self._rungs.get(trial_id, [])
        if not rungs or rungs[-1][0] < step:
            return None
        upto = [v for s, v in rungs if s <= step][-self.settings.window:]
        if not upto:
            return None
        return tuple(statistics.fmean(column) for column in zip(*upto))

    def _judge(self, trial_id: str, step: float) -> str | None:
        s = self.settings
        if step < self.grace_steps or step >= self.total_steps:  # at its last step a trial has nothing left to save
            return None
        mine = self._value(trial_id, step)
        peers = {t: v for t in self._rungs if t != trial_id and (v := self._value(t, step)) is not None}
        if mine is None or len(peers) < s.min_peers:
            return None
        sigma = self.noise()
        if sigma is None:
            return None
        margins = [s.margin * sd * math.sqrt(2) for sd in sigma]
        better = [v for v in peers.values() if all(p >= x + m for p, x, m in zip(v, mine, margins))]
        if len(better) < s.dominated_by:
            return None
        shown = ", ".join(f"{metric} {sign * x:.4g} (margin {m:.3g})"
                          for metric, sign, x, m in zip(self.metrics, self.signs, mine, margins))
        return (f"objective: at step {step:g} {len(better)} of {len(peers)} trials at that step beat {shown} "
                f"by more than the margin on every objective")


class ObjectiveStopper(RuleStopper):
    """Ray Tune stopper of :class:`ObjectiveRule`: on a stop it writes ``result["stop_reason"]`` and
    ``result["stop_kind"] = "objective"`` (Tune keeps them in ``result.json``; the searcher records PRUNED).

    A result on which the health stopper planned a remedy (its ``remedy_note`` is set) is not judged. The trial
    restarts from an earlier checkpoint with other settings; its rungs after that checkpoint are dropped when it
    reports from there.

    Args:
        objectives: ``(metric, mode)`` pairs of the sweep.
        total_steps: the sweep's ``budget.max_steps``.
        settings: the sweep file's ``stopping.objective`` knobs.
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], total_steps: int,
                 settings: ObjectiveStop | None = None):
        self.rule = ObjectiveRule(objectives, total_steps, settings)

    def judge(self, trial_id: str, step: float, result: dict) -> str | None:
        """Feed the result to the rule; its stop reason or None."""
        return self.rule.update(trial_id, step, result)
