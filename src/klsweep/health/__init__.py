"""Health rules: early stopping that encodes KL and entropy health, calibrated on real verl runs.

Public API::

    HealthConfig     the sweep file's ``health:`` field (pydantic)
    load_ruleset     preset name | HealthConfig | YAML path -> RuleSet
    RuleSet          rules + built-in check settings
    HealthEngine     one per trial: .update(step, metrics) -> Verdict, .summary() -> dict
    Verdict, StopReason, Event
    HealthStopper    Ray Tune Stopper (imports Ray only when used)
    health_check     ``sweep health check``: replay a log, print a timeline (klsweep.health.check)
"""

from klsweep.health.engine import HealthEngine
from klsweep.health.load import load_ruleset
from klsweep.health.rules import PRESETS, BuiltinConfig, HealthConfig, Rule, RuleSet
from klsweep.health.verdict import Event, StopReason, Verdict


def __getattr__(name: str):
    if name == "HealthStopper":  # Ray is imported only by those who use the stopper
        from klsweep.health.stopper import HealthStopper

        return HealthStopper
    raise AttributeError(f"module 'klsweep.health' has no attribute {name!r}")


__all__ = [
    "PRESETS",
    "BuiltinConfig",
    "Event",
    "HealthConfig",
    "HealthEngine",
    "HealthStopper",
    "Rule",
    "RuleSet",
    "StopReason",
    "Verdict",
    "load_ruleset",
]
