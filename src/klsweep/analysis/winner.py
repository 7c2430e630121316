"""The winner block that ends ``sweep run`` and ``sweep status``: what won, by how much, and one command to rerun it.

The block names the best trial and its score, its searched knob values on as few lines as the terminal allows, the
runner-up and whether the gap is within noise (``budget.confirm``'s verdict when it ran; one seed each otherwise,
which cannot tell), and ONE reproduce command: verl's. A trainer's own command (the embedded one) is printed on
request (``sweep status DIR --commands``). On a terminal the command is broken into lines that fit it, each ending
in `` \\`` so that it pastes into a shell as one command; to a file or a pipe it stays on one line.
"""

from __future__ import annotations

import shlex
import textwrap
from typing import TYPE_CHECKING

import pandas as pd

from klsweep._format import param_labels, short
from klsweep.analysis.confirm import is_search
from klsweep.analysis.pareto import feasible
from klsweep.spec.space import parameters
from klsweep.trainers import VERL_MODULE, reproduce_commands

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

#: Indent of the lines under a block's first line.
INDENT = "  "


def knob_values(sweep: Sweep, row: pd.Series, keys: list[str] | None = None) -> str:
    """The searched knob values of a trial as ``key=value`` words (each key its last dotted component, or the whole
    key where two share it): ``kl_coef=0.002 entropy_coeff=0``; ``(no searched knob)`` when none is set.

    ``keys``: the verl keys to show; default the sweep's searched parameters."""
    keys = list(parameters(sweep)) if keys is None else keys
    words = [f"{label}={short(row.get(f'config/{key}'))}" for key, label in param_labels(keys).items()
             if row.get(f"config/{key}") is not None and not pd.isna(row.get(f"config/{key}"))]
    return " ".join(words) or "(no searched knob)"


def runner_up(sweep: Sweep, df: pd.DataFrame, best: pd.Series) -> str | None:
    """``runner-up: trial 6 at 0.6289, 0.0156 lower; ...``: the second best healthy COMPLETE search trial of a
    one-objective sweep against ``best``, and why its gap cannot be called noise or not: each ran one training
    seed. None when there is no second trial."""
    o = sweep.objectives[0]
    column = f"value/{o.metric}"
    search = df[is_search(df)]
    done = search[feasible(search)].dropna(subset=[column])
    others = done[done["number"] != best["number"]].sort_values([column, "number"], ascending=[o.mode == "min", True])
    if others.empty:
        return None
    second = others.iloc[0]
    gap = abs(float(best[column]) - float(second[column]))
    lower = "lower" if o.mode == "max" else "higher"
    how_far = "tied" if gap == 0 else f"{gap:.3g} {lower}"
    return (f"runner-up: trial {second['number']} at {short(second[column])} ({how_far}); one seed each, so "
            "budget.confirm (re-runs with new seeds) would tell if the gap is noise")


def reproduce(trainer: str, row: pd.Series, overrides: dict, *, every: bool = False) -> list[tuple[str, str]]:
    """``[(label, command)]`` that rerun a trial: verl's command (one per restart segment of a remedied trial);
    ``every``: each trainer's own command too (the embedded trainer's). A trainer with no verl command gives its
    own."""
    commands = reproduce_commands(trainer, overrides, row.get("remedies"))
    if every:
        return commands
    verl = [(label, command) for label, command in commands if f" -m {VERL_MODULE} " in f"{command} "]
    return verl or commands


def shell_lines(command: str, width: int) -> list[str]:
    """``command`` as lines of at most ``width`` columns where it can, each but the last ending in `` \\`` (a shell
    reads them as one command); one line when it fits. An argument longer than a line gets a line of its own."""
    if len(command) <= width:
        return [command]
    words = [shlex.quote(word) for word in shlex.split(command)]
    lines = [words[0]]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) + 2 > width:
            lines[-1] += " \\"
            lines.append(INDENT + word)
        else:
            lines[-1] += " " + word
    return lines


def wrapped(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` wrapped at spaces to ``width`` columns, the first line and the next ones indented by ``indent``
    (a word longer than a line is never split: numbers and names stay whole)."""
    return textwrap.wrap(text, max(width, 20), initial_indent=indent, subsequent_indent=indent + INDENT,
                         break_long_words=False, break_on_hyphens=False) or [indent]
