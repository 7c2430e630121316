"""The finite values of one signal over a window of steps, and the statistics a rule's condition reads from them.

Windows are in training steps, not reports, so a sampled log (a report every few steps) is judged over the same
steps as a log of every step. Memory and work stay O(window) per report.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from itertools import islice
from operator import mul


class Series:
    """The finite values of one signal: enough recent (step, value) pairs to cover ``span`` steps, the first value
    and step, the run max, and the values of the run's first ``early`` steps.

    Memory and work stay O(window + early): :meth:`push` drops the oldest pair once the next one also covers the span.
    A step lower than the last one (a log that restarts its count) starts the window afresh.
    """

    __slots__ = ("span", "steps", "values", "first", "first_step", "run_max", "count", "fresh", "early", "early_values")

    def __init__(self, span: int, early: int = 0):
        self.span = span
        self.early = early
        self.early_values: list[float] = []  # the values of steps first_step .. first_step + early - 1
        self.steps: deque[int] = deque()
        self.values: deque[float] = deque()
        self.first: float | None = None
        self.first_step = 0
        self.run_max = -math.inf
        self.count = 0
        self.fresh = False  # has a value in the current report

    def push(self, step: int, value: float) -> None:
        """Add this report's finite ``value`` at ``step``; marks the series fresh."""
        if self.steps and step < self.steps[-1]:
            self.steps.clear()
            self.values.clear()
        self.steps.append(step)
        self.values.append(value)
        while len(self.steps) > 1 and self.steps[1] <= step - self.span + 1:
            self.steps.popleft()
            self.values.popleft()
        if self.first is None:
            self.first, self.first_step = value, step
        if step < self.first_step + self.early:
            self.early_values.append(value)
        if value > self.run_max:
            self.run_max = value
        self.count += 1
        self.fresh = True

    def window(self, steps: int) -> int | None:
        """Index of the first pair of the window of ``steps`` steps ending at the last report.

        That is the last report at or before step ``last − steps + 1``, so the window covers the steps with at least
        two reports. None while the run has not covered that many steps yet."""
        target = self.steps[-1] - steps + 1
        for i in range(len(self.steps) - 1, -1, -1):
            if self.steps[i] <= target:
                return i
        return None


def statistic(
    stat: str, window: int | None, peak_above: float, series: Series, early: int = 0
) -> tuple[float, int] | None:
    """A condition's statistic over ``series`` and the first step it read; ``series`` holds this report's value.

    None while undefined: a window whose steps are not covered yet, ``drop_from_max`` while the maximum is at or
    below ``peak_above``, ``ratio_to_early`` before the run has passed its first ``early`` steps, or a ratio whose
    reference median is not positive.

    Windows are in training steps (:meth:`Series.window`): every report from the last one at or before the window's
    first step. Window statistics weigh each report equally and use exactly rounded sums (``math.fsum``).

    - variance = E[x²] − E[x]², population (ddof 0);
    - slope = least-squares slope of value against step, or against position when steps repeat. It is NaN, never
      above or below a bound, when the products overflow the float range.
    """
    value, step = series.values[-1], series.steps[-1]
    if stat == "value":
        return value, step
    if stat == "ratio_to_first":
        return (value / series.first, series.first_step) if series.first else None
    if stat == "ratio_to_early":
        if step < series.first_step + early or not series.early_values:
            return None
        reference = statistics.median(series.early_values)
        if window is not None:
            start = series.window(window)
            if start is None:
                return None
            value = math.fsum(islice(series.values, start, None)) / (len(series.values) - start)
        return (value / reference, series.first_step) if reference > 0 else None
    start = None if window is None else series.window(window)
    if stat == "ratio_to_median":
        if start is None:
            return None
        reference = statistics.median(islice(series.values, start, None))
        return (value / reference, series.steps[start]) if reference > 0 else None
    if stat == "drop_from_max":
        if window is None:
            peak, first = series.run_max, series.first_step
        else:  # a window not covered yet: the maximum so far
            first_index = start or 0
            peak, first = max(islice(series.values, first_index, None)), series.steps[first_index]
        return ((peak - value) / peak, first) if peak > peak_above else None
    if start is None:
        return None
    xs = list(islice(series.values, start, None))
    first = series.steps[start]
    if stat == "min":
        return min(xs), first
    if stat == "max":
        return max(xs), first
    n = len(xs)
    try:
        mean = math.fsum(xs) / n
    except OverflowError:  # finite values near the float limit: their sum overflows, their mean does not
        mean = math.fsum(x / n for x in xs)
    if stat == "mean":
        return mean, first
    if stat == "slope":
        ts = list(islice(series.steps, start, None))
        if len(set(ts)) < n:
            ts = list(range(n))
        try:
            t_mean = math.fsum(ts) / n
            sxx = math.fsum(map(mul, ts, ts)) / n - t_mean * t_mean
            sxy = math.fsum(map(mul, ts, xs)) / n - t_mean * mean
        except (OverflowError, ValueError):  # steps² or step × value beyond the float range: no finite slope
            return math.nan, first
        return sxy / sxx, first
    mean_square = math.fsum(map(mul, xs, xs)) / n
    if math.isfinite(mean_square):
        var = max(0.0, mean_square - mean * mean)
    else:  # squares beyond the float range: the spread is that large (inf when it is)
        var = math.fsum((x - mean) * (x - mean) for x in xs) / n
    return (var if stat == "var" else math.sqrt(var)), first
