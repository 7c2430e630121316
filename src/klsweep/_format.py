"""What the console shows: numbers with four significant digits, parameter labels, and a console that never wraps
what is meant to be copied when its output goes to a file or a pipe."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console

#: Width of a console that is not a terminal: wide enough that no line is ever wrapped (a command, a table row).
UNWRAPPED_WIDTH = 100_000


def short(value: Any) -> str:
    """``0.711328125`` → ``"0.7113"``, ``nan`` → ``"nan"``, ``80`` → ``"80"``, None → ``""``."""
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return "" if value is None else str(value)


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr).

    On a terminal it wraps to the terminal's width. Written to a file or a pipe, rich would wrap at 80 columns and
    split the commands and table rows meant to be copied or grepped. There, lines are never wrapped: one line per
    row, one line per command."""
    out = Console(stderr=stderr)
    if out.is_terminal:
        return out
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)


def param_labels(keys: list[str]) -> dict[str, str]:
    """Column labels of searched verl keys: the last dotted component (``algorithm.kl_ctrl.kl_coef`` →
    ``kl_coef``), or the whole key where two keys share their last component (``actor.ppo_epochs`` and
    ``critic.ppo_epochs``)."""
    leaves = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: leaf if leaves.count(leaf) == 1 else key for key, leaf in zip(keys, leaves)}
