"""What the health engine says about one report: findings (stop, warn, advise) with a structured reason."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


@dataclass(frozen=True)
class StopReason:
    """Why a rule or built-in check fired.

    Attributes:
        rule: the rule or built-in check name (e.g. ``kl_blowup``, ``builtin.no_signal``).
        kind: diverged | no_signal | collapsed | misconfigured | nonfinite | unhealthy.
        step: the training step of the report that fired it.
        values: the statistics and metric values that triggered it, e.g. ``{"mean5(actor/kl_loss)": 1.8}``.
        advice: the remedy, possibly empty.
        message: one line saying what was seen.
    """

    rule: str
    kind: str
    step: int
    values: Mapping[str, float] = field(default_factory=dict)
    advice: str = ""
    message: str = ""

    def text(self) -> str:
        """``"diverged at step 42 by kl_blowup: mean5(actor/kl_loss) = 1.8 > 1 (advice: lower lr)"``."""
        out = f"{self.kind} at step {self.step} by {self.rule}: {self.message}"
        return out + (f" (advice: {self.advice})" if self.advice else "")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite numbers as strings)."""
        return {
            "rule": self.rule,
            "kind": self.kind,
            "step": self.step,
            "values": {k: _json_number(v) for k, v in self.values.items()},
            "advice": self.advice,
            "message": self.message,
        }


@dataclass(frozen=True)
class Event(StopReason):
    """A finding at one report: a :class:`StopReason` plus the rule's action (stop, warn or advise)."""

    action: str = "warn"

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, **super().as_dict()}


@dataclass(frozen=True)
class Verdict:
    """The engine's answer to one report.

    Attributes:
        step: the report's step.
        stop: True once any stop finding has fired in this run (sticky).
        reason: the first stop finding of the run, or None.
        events: every finding at this report (stop, warn, advise), in rule order.
        health: healthy | warned | stopped, for the run so far (advise findings leave a run healthy).
    """

    step: int
    stop: bool
    reason: StopReason | None
    events: tuple[Event, ...]
    health: str
