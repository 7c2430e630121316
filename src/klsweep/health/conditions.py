"""A health rule's conditions: a statistic of one metric (its value, or over a window of steps) against a bound.

``window`` is in training steps, not reports. A window of W steps ending at step s reads every report from the last
one at or before step s − W + 1. :mod:`klsweep.health.series` computes the statistics. The condition's ``stat`` picks
its model: ``value``, a window statistic (``mean``/``std``/``var``/``min``/``max``/``slope``), ``drop_from_max``,
``ratio_to_first``, or a scale-free ratio to the run's own history (``ratio_to_early``, ``ratio_to_median``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

WINDOW_STATS = ("mean", "std", "var", "min", "max", "slope")
RELATIVE_STATS = ("ratio_to_early", "ratio_to_median")
STATS = ("value", *WINDOW_STATS, "drop_from_max", "ratio_to_first", *RELATIVE_STATS)

_MODEL = ConfigDict(extra="forbid", frozen=True)


class _Condition(BaseModel):
    model_config = _MODEL

    metric: str = Field(min_length=1, description="verl metric name or alias the condition reads")
    above: float | None = Field(None, description="true when the statistic is strictly above this")
    below: float | None = Field(None, description="true when the statistic is strictly below this")

    @model_validator(mode="after")
    def _one_bound(self):
        if (self.above is None) == (self.below is None):
            raise ValueError(
                f"condition on {self.metric!r} needs exactly one of 'above' or 'below' "
                f"(got above={self.above}, below={self.below}); write two conditions under 'any:' for a band"
            )
        return self

    def holds(self, x: float) -> bool:
        return x > self.above if self.above is not None else x < self.below  # type: ignore[operator]

    def describe(self) -> str:
        bound = f"> {self.above:g}" if self.above is not None else f"< {self.below:g}"
        return f"{self.label()} {bound}"

    def label(self) -> str:
        return self.metric


class ValueCondition(_Condition):
    """The report's own value of the metric."""

    stat: Literal["value"] = "value"


class WindowCondition(_Condition):
    """A statistic of the metric over its last ``window`` steps (``slope``: least squares, units per step).

    The window reads every report from the last one at or before its first step. It is judged only once the run
    covers ``window`` steps, with at least two reports. Each report weighs the same.
    """

    stat: Literal["mean", "std", "var", "min", "max", "slope"]
    window: int = Field(ge=2, description="training steps the statistic covers, ending at the report's step")

    def label(self) -> str:
        return f"{self.stat}{self.window}({self.metric})"


class DropCondition(_Condition):
    """Relative drop from the running maximum: (max − value) / max; max over ``window`` steps or the whole run.

    Judged only while that maximum is above ``peak_above`` (default 0): a relative drop from a near-zero peak (a
    validation accuracy of 0.01 at the start of training) is noise, not a drop.
    """

    stat: Literal["drop_from_max"]
    window: int | None = Field(None, ge=2, description="training steps the maximum is taken over (default: whole run)")
    peak_above: float = Field(0.0, ge=0, description="judge only once the maximum is above this (metric units)")

    def describe(self) -> str:
        floor = f" (max > {self.peak_above:g})" if self.peak_above else ""
        return super().describe() + floor

    def label(self) -> str:
        return f"drop_from_max{self.window or ''}({self.metric})"


class RatioCondition(_Condition):
    """value / first finite value of the metric in the run."""

    stat: Literal["ratio_to_first"]

    def label(self) -> str:
        return f"ratio_to_first({self.metric})"


class RelativeCondition(_Condition):
    """The metric against the run's own history: a bound that means the same on a 0.5B and a 70B model.

    - ``ratio_to_early``: the value (or its mean over the last ``window`` steps, when given) divided by the median of
      the reports in the run's first ``early`` steps. Judged once the run has passed those steps.
    - ``ratio_to_median``: the value divided by the median of the reports of the last ``window`` steps (this one
      included). A jump shows while the window still holds more reports from before it than after.

    Undefined (never above or below a bound) while the reference median is not positive.
    """

    stat: Literal["ratio_to_early", "ratio_to_median"]
    early: int = Field(20, ge=1, description="ratio_to_early: the run's first steps whose median is the reference")
    window: int | None = Field(
        None, ge=2, description="ratio_to_median: the steps of the median (required); ratio_to_early: the steps the "
        "value is averaged over (default: the report's own value)",
    )

    @model_validator(mode="after")
    def _median_window(self):
        if self.stat == "ratio_to_median" and self.window is None:
            raise ValueError(
                f"condition on {self.metric!r}: ratio_to_median needs 'window' (the steps whose median the value is "
                "compared with), e.g. window: 50"
            )
        return self

    def label(self) -> str:
        if self.stat == "ratio_to_median":
            return f"ratio_to_median{self.window}({self.metric})"
        mean = f"mean{self.window} " if self.window else ""
        return f"ratio_to_early{self.early}({mean}{self.metric})"


def _condition_tag(data: Any) -> str | None:
    stat = data.get("stat", "value") if isinstance(data, Mapping) else getattr(data, "stat", None)
    if stat == "value":
        return "value"
    if stat in WINDOW_STATS:
        return "window"
    if stat in ("drop_from_max", "ratio_to_first"):
        return stat
    if stat in RELATIVE_STATS:
        return "relative"
    return None


Condition = Annotated[
    Annotated[ValueCondition, Tag("value")]
    | Annotated[WindowCondition, Tag("window")]
    | Annotated[DropCondition, Tag("drop_from_max")]
    | Annotated[RatioCondition, Tag("ratio_to_first")]
    | Annotated[RelativeCondition, Tag("relative")],
    Discriminator(
        _condition_tag,
        custom_error_type="invalid_stat",
        custom_error_message=f"unknown 'stat': valid statistics are {', '.join(STATS)}",
    ),
]

#: The keys of a condition written inline in a rule (``metric: ...``).
CONDITION_KEYS = ("metric", "stat", "window", "peak_above", "early", "above", "below")
