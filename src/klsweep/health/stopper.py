"""Health rules as a Ray Tune ``Stopper``: one :class:`HealthEngine` per trial, the verdict written into the result.

A stop by a rule with a ``remedy`` is first offered to the sweep's remedy planner
(:class:`klsweep.orchestrate.remedy_tune.RemedyScheduler`). When it plans a restart from a checkpoint, the trial is
not stopped. Its engine restarts from the reports up to that checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ray.tune import Stopper

from klsweep.health.engine import HealthEngine
from klsweep.health.rules import Rule, RuleSet
from klsweep.health.verdict import StopReason
from klsweep.results import HEALTH, STEP, STOP_KIND, STOP_REASON, TOTAL_STEPS
from klsweep.verl.metrics import flat_verl_config

#: The result key of the note on a result where a restart was planned ("remedied: RULE at step N: restarted from step
#: F with KEY OLD → NEW"), "" otherwise. A remedy is no stop: the note is kept out of ``stop_reason``, and the
#: schedule itself is the trial's ``remedies`` (:data:`klsweep.orchestrate.remedy.REMEDIES`).
REMEDY_NOTE = "remedy_note"


class RemedyPlanner(Protocol):
    """What the stopper asks before it stops a trial for a rule with a ``remedy``."""

    def plan(self, trial_id: str, rule: Rule, reason: StopReason, result: Mapping[str, Any]) -> Any:
        """A planned restart (an object with ``from_step`` and ``text()``), or why there is none (a ``str``)."""
        ...


class HealthStopper(Stopper):
    """Stops a trial when its health rules say so, and records why.

    On every result it writes four keys, which Tune keeps in ``result.json`` and the results dataframe:

    - ``result["health"]``: healthy | warned | stopped;
    - ``result["stop_reason"]``: the stop reason's text, "" when none;
    - ``result["stop_kind"]``: diverged, no_signal, nonfinite, ...; "" when none;
    - ``result["remedy_note"]``: :data:`REMEDY_NOTE`.

    Args:
        ruleset: from :func:`~klsweep.health.load_ruleset`.
        run_config_of: maps a trial's Tune config to its flat verl override dict; default: the dotted keys of the
            config itself (:func:`flat_verl_config`).
        remedies: plans restarts for stops by rules with a ``remedy``; None: such rules stop as any other.
    """

    def __init__(self, ruleset: RuleSet, run_config_of: Callable[[dict], Mapping[str, Any]] | None = None,
                 remedies: RemedyPlanner | None = None):
        self.ruleset = ruleset
        self.run_config_of = run_config_of
        self.remedies = remedies
        self.engines: dict[str, HealthEngine] = {}
        self._rules = {rule.name: rule for rule in ruleset.rules if rule.remedy}
        self._history: dict[str, list[tuple[Any, dict[str, Any]]]] = {}  # trial id → reports, for a restart

    def __call__(self, trial_id: str, result: dict) -> bool:
        """Feed one result (verl metric names; step from ``step``, else ``training_iteration``); True to stop."""
        engine = self.engines.get(trial_id)
        history = self._history.setdefault(trial_id, []) if self._rules and self.remedies is not None else None
        if engine is None:
            config = result.get("config") or {}
            run_config = self.run_config_of(config) if self.run_config_of else flat_verl_config(config)
            engine = self.engines[trial_id] = HealthEngine(self.ruleset, run_config)
            for old_step, metrics in history or ():  # a restarted trial: its reports up to the checkpoint
                engine.update(old_step, metrics)
        step = result.get(STEP, result.get("training_iteration"))
        if history is not None:
            history.append((step, {k: v for k, v in result.items() if isinstance(v, (int, float))}))
        verdict = engine.update(step, result)
        reason = verdict.reason
        stop_reason = reason.text() if reason else ""
        result[REMEDY_NOTE] = ""
        if verdict.stop and reason is not None and self.remedies is not None and reason.rule in self._rules:
            remedy = self.remedies.plan(trial_id, self._rules[reason.rule], reason, result)
            if not isinstance(remedy, str):
                self.engines.pop(trial_id)
                self._history[trial_id] = [(s, m) for s, m in history or () if _at_or_before(s, remedy.from_step)]
                result[HEALTH], result[STOP_REASON], result[STOP_KIND] = "warned", "", ""
                result[REMEDY_NOTE] = f"remedied: {remedy.text()}"
                return False
            stop_reason += f" (not remedied: {remedy})"
        result[HEALTH] = verdict.health
        result[STOP_REASON] = stop_reason
        result[STOP_KIND] = reason.kind if reason else ""
        total = result.get(TOTAL_STEPS)
        if verdict.stop or isinstance(step, int) and isinstance(total, int) and step >= total:
            self._history.pop(trial_id, None)  # the trial ends here: nothing left to restart
        return verdict.stop

    def stop_all(self) -> bool:
        """Health is judged per trial: never stops the whole experiment."""
        return False

    def summary(self, trial_id: str) -> dict[str, Any] | None:
        """:meth:`HealthEngine.summary` of a trial seen by this stopper, or None."""
        engine = self.engines.get(trial_id)
        return engine.summary() if engine else None


def _at_or_before(step: Any, last: int) -> bool:
    return isinstance(step, (int, float)) and step <= last
