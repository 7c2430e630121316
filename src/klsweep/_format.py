"""What the console shows: numbers with four significant digits, parameter labels, a console that never wraps what
is meant to be copied when its output goes to a file or a pipe, and tables that fit a terminal without cutting a
number (:func:`fit_table`)."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

#: Width of a console that is not a terminal: wide enough that no line is ever wrapped (a command, a table row).
UNWRAPPED_WIDTH = 100_000


def short(value: Any) -> str:
    """``0.711328125`` → ``"0.7113"``, ``nan`` → ``"nan"``, ``80`` → ``"80"``, None → ``""``."""
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return "" if value is None else str(value)


def arg(value: Any) -> str:
    """``value`` as one shell word, quoted where needed (a path with a space), for a command the user copies."""
    return shlex.quote(str(value))


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


#: Space rich puts between two columns of a table without edges: a padding cell each side of the rule.
_GAP = 3
#: The narrowest a wrapping text column (health, remedies) is squeezed to before a column is left out.
_TEXT_MIN = 14
#: The narrowest it gets once every column that may be left out is (its words fold).
_TEXT_FLOOR = 4
_LABEL_BREAKS = re.compile(r"(?<=[/_\-.@ ])")


def fit_table(headers: list[str], rows: list[list[str]], width: int, *, drop: tuple[str, ...] = (),
              wrap: tuple[str, ...] = (), caption: str | None = None) -> Table:
    """A table of ``rows`` (cells as strings) whose numbers are never cut or split, in ``width`` columns.

    Every column but those in ``wrap`` is as wide as its widest cell; a label wider than that breaks after ``/``,
    ``_``, ``-``, ``.`` or ``@``. The ``wrap`` columns (free text) wrap into the width left, at least
    :data:`_TEXT_MIN` each. When the table is still too wide, the columns named in ``drop`` are left out in that
    order, and the caption says which; then the text columns narrow to :data:`_TEXT_FLOOR`. Returns a rich Table
    with no outer edge; ``caption`` is printed under it."""
    drop_order = [headers.index(h) for h in drop if h in headers]
    need = [_column_width(h, [r[i] for r in rows]) for i, h in enumerate(headers)]
    floor = [min(n, _TEXT_MIN) if h in wrap else n for h, n in zip(headers, need)]
    shown = list(range(len(headers)))
    left_out = []
    while sum(floor[i] for i in shown) + _GAP * (len(shown) - 1) > width and drop_order:
        i = drop_order.pop(0)
        shown.remove(i)
        left_out.append(headers[i])
    spare = width - sum(floor[i] for i in shown) - _GAP * (len(shown) - 1)
    for i in shown:  # still too wide: the text columns wrap narrower (words fold), never a number
        if spare < 0 and headers[i] in wrap:
            give = min(-spare, floor[i] - _TEXT_FLOOR)
            if give > 0:
                floor[i] -= give
                spare += give
    for i in shown:  # room left: labels on one line where it suffices
        if headers[i] not in wrap and spare > 0 and len(headers[i]) > need[i]:
            grow = min(spare, len(headers[i]) - need[i])
            need[i] += grow
            spare -= grow
    notes = [caption] if caption else []
    if left_out:
        notes.append(f"left out to fit {width} columns: {', '.join(left_out)} (a wider terminal shows them; "
                     "trials.csv holds every value)")
    table = Table(show_edge=False, pad_edge=False, caption="\n".join(notes) or None, caption_justify="left")
    for i in shown:
        if headers[i] in wrap:
            table.add_column(headers[i], overflow="fold", min_width=floor[i])
        else:
            table.add_column(Text(_break_label(headers[i], need[i])), no_wrap=True, min_width=need[i])
    for row in rows:
        table.add_row(*(Text(row[i]) for i in shown))
    return table


def _column_width(header: str, cells: list[str]) -> int:
    """The width a column of ``cells`` needs: its widest cell, or its label's longest unbreakable part."""
    widest = max((len(cell) for cell in cells), default=0)
    return max(widest, max(len(part) for part in _LABEL_BREAKS.split(header)), 1)


def _break_label(label: str, width: int) -> str:
    """``label`` on as many lines as it needs in ``width`` columns, broken after ``/ _ - . @`` or a space."""
    lines = [""]
    for part in _LABEL_BREAKS.split(label):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(line.rstrip() for line in lines)
