"""Health rules as a Ray Tune ``Stopper``: one :class:`HealthEngine` per trial, the verdict written into the result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ray.tune import Stopper

from klsweep.health.engine import HealthEngine
from klsweep.health.rules import RuleSet
from klsweep.results import HEALTH, STEP, STOP_KIND, STOP_REASON
from klsweep.verl.metrics import flat_verl_config


class HealthStopper(Stopper):
    """Stops a trial when its health rules say so, and records why.

    On every result it writes ``result["health"]`` (healthy | warned | stopped), ``result["stop_reason"]`` (the
    stop reason's text, "" when none) and ``result["stop_kind"]`` (diverged, no_signal, nonfinite, ...; "" when
    none): Tune keeps them in ``result.json`` and the results dataframe.

    Args:
        ruleset: from :func:`~klsweep.health.load_ruleset`.
        run_config_of: maps a trial's Tune config to its flat verl override dict; default: the dotted keys of the
            config itself (:func:`flat_verl_config`).
    """

    def __init__(self, ruleset: RuleSet, run_config_of: Callable[[dict], Mapping[str, Any]] | None = None):
        self.ruleset = ruleset
        self.run_config_of = run_config_of
        self.engines: dict[str, HealthEngine] = {}

    def __call__(self, trial_id: str, result: dict) -> bool:
        """Feed one result (verl metric names; step from ``step``, else ``training_iteration``); True to stop."""
        engine = self.engines.get(trial_id)
        if engine is None:
            config = result.get("config") or {}
            run_config = self.run_config_of(config) if self.run_config_of else flat_verl_config(config)
            engine = self.engines[trial_id] = HealthEngine(self.ruleset, run_config)
        step = result.get(STEP, result.get("training_iteration"))
        verdict = engine.update(step, result)
        result[HEALTH] = verdict.health
        result[STOP_REASON] = verdict.reason.text() if verdict.reason else ""
        result[STOP_KIND] = verdict.reason.kind if verdict.reason else ""
        return verdict.stop

    def stop_all(self) -> bool:
        """Health is judged per trial: never stops the whole experiment."""
        return False

    def summary(self, trial_id: str) -> dict[str, Any] | None:
        """:meth:`HealthEngine.summary` of a trial seen by this stopper, or None."""
        engine = self.engines.get(trial_id)
        return engine.summary() if engine else None
