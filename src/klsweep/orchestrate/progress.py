"""The live view of a running sweep: a table of trials and a progress bar over the trial budget (rich).

A Ray Tune ``Callback``: Tune calls it on the driver for every reported step and every finished trial. On a
terminal it redraws a table (trial, status, step, KL, entropy, score, objective, health); elsewhere (CI, a pipe) it
prints one line per finished trial, so logs stay readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.tune import Callback
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from klsweep._format import short
from klsweep.results import HEALTH, STOP_REASON
from klsweep.verl.metrics import resolve

#: Aliases shown as the KL, entropy and score columns (klsweep.verl.metrics resolves them per verl version).
_COLUMNS = ("ref_kl", "entropy", "score")


class SweepProgress(Callback):
    """Live table + progress bar of a sweep.

    Args:
        total_trials: the sweep's trial budget (``budget.trials``).
        objectives: objective metric names, shown as columns.
        console: where to draw (default: stderr's console); ``quiet=True`` prints only finished trials.
    """

    def __init__(self, total_trials: int, objectives: list[str], *, quiet: bool = False,
                 console: Console | None = None):
        self._objectives = objectives
        self._rows: dict[str, dict[str, Any]] = {}
        self._done = 0
        self._total = total_trials
        self._quiet = quiet
        self._console = console
        self._live: Live | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment; the terminal objects are rebuilt by setup().
        return {**self.__dict__, "_console": None, "_live": None, "_progress": None}

    def setup(self, **info) -> None:
        self._console = self._console or Console(stderr=True)
        self._interactive = self._console.is_terminal and not self._quiet
        self._progress = Progress(
            TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self._console
        )
        self._task = self._progress.add_task("trials", total=self._total, completed=self._done)
        if self._interactive:
            self._live = Live(console=self._console, auto_refresh=False)
            self._live.start()

    def _row(self, trial, result: Mapping[str, Any], status: str) -> dict[str, Any]:
        row = self._rows.setdefault(trial.trial_id, {"trial": trial.trial_id})
        row["status"] = status
        row["step"] = result.get("training_iteration", row.get("step"))
        for column in _COLUMNS:
            key = resolve(result, column)
            if key is not None:
                row[column] = result[key]
        for name in self._objectives:
            if isinstance(result.get(name), (int, float)):
                row[name] = result[name]
        row["health"] = result.get(HEALTH, row.get("health", ""))
        if result.get(STOP_REASON):
            row["stop_reason"] = result[STOP_REASON]
        return row

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._row(trial, result, "RUNNING")
        self._redraw()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, "TERMINATED")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, "ERROR")

    def _finish(self, trial, status: str) -> None:
        row = self._row(trial, trial.last_result or {}, status)
        if row.get("health") == "stopped":
            row["status"] = "STOPPED"
        self._done += 1
        self._progress.update(self._task, completed=self._done)
        if self._interactive:
            self._redraw()
        else:
            objectives = " ".join(f"{name}={short(row.get(name))}" for name in self._objectives)
            reason = f" ({row['stop_reason']})" if row.get("stop_reason") else ""
            self._console.print(
                f"[{self._done}/{self._total}] {trial.trial_id} {row['status']} step={short(row.get('step'))} "
                f"{objectives}{reason}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _table(self) -> Table:
        table = Table(expand=False, show_edge=False, pad_edge=False)
        headers = ["trial", "status", "step", "KL", "entropy", "score", *self._objectives, "health"]
        for header in headers:
            table.add_column(header.rsplit("/", 3)[-3] if header.count("/") >= 3 else header, overflow="fold")
        for row in list(self._rows.values())[-20:]:
            cells = [row["trial"], row["status"], short(row.get("step")), *(short(row.get(c)) for c in _COLUMNS),
                     *(short(row.get(n)) for n in self._objectives), str(row.get("health", ""))]
            table.add_row(*(Text(cell) for cell in cells))
        return table

    def _redraw(self) -> None:
        if self._live is not None:
            self._live.update(Group(self._table(), self._progress), refresh=True)

    def on_experiment_end(self, trials, **info) -> None:
        if self._live is not None:
            self._live.stop()
