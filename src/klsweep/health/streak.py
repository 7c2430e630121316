"""How long a condition has held, in training steps: the ``for`` of rules and the streaks of built-in checks.

A log may have one report per step or one every k steps: W&B history exports are sampled, and many runs log every N
steps. A streak is counted in steps, not reports. It starts right after the last report at which the condition did
not hold, since it may have begun anywhere after that report. It starts no earlier than ``after + 1``. The first
report of a run starts it at its own step. So a log sampled every k steps fires within k steps of the full log
whenever the condition, once true, stays true. A condition that flickers between two reports cannot be seen in the
sampled log.
"""

from __future__ import annotations


class Streak:
    """The steps a condition has held for, fed report by report.

    Args:
        after: warm-up: the streak never starts at a step <= ``after``.
    """

    __slots__ = ("after", "start", "clear")

    def __init__(self, after: int = 0):
        self.after = after
        self.start: int | None = None  # first step of the current streak
        self.clear: int | None = None  # last step at which the condition did not hold (or could not be judged)

    def hold(self, step: int) -> int:
        """The condition holds at ``step``: returns the steps it has held for (``step − start + 1``, >= 1)."""
        if self.start is None or step < self.start:  # a step below the start: the log restarted its count
            start = step if self.clear is None else max(self.clear + 1, self.after + 1)
            self.start = min(start, step)
        return step - self.start + 1

    def update(self, step: int, holds: bool) -> int:
        """One report: the steps the condition has held for at ``step`` (:meth:`hold`), or 0 when it does not hold
        there (:meth:`reset`)."""
        if not holds:
            self.reset(step)
            return 0
        return self.hold(step)

    def reset(self, step: int) -> None:
        """The condition does not hold at ``step`` (or cannot be judged there, e.g. in the warm-up)."""
        self.start = None
        self.clear = step



def steps_text(first: int, last: int) -> str:
    """``"steps 50-125"``, or ``"step 125"`` when ``first >= last``: the steps a finding looked at."""
    return f"steps {first}-{last}" if first < last else f"step {last}"
