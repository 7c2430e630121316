"""The live view of a running sweep: a table of trials and a progress bar over the trial budget (rich).

Ray Tune ``Callback`` s: Tune calls them on the driver for every reported step and every finished trial.

On a terminal, :class:`SweepProgress` redraws a table: trial, status, searched parameters, step, KL, entropy, score,
objective, health. Under it is the KL frontier forecast (:func:`forecast_line`): KL* and the peak score with their
intervals, as ``sweep status`` prints them.

Elsewhere (CI, a file, a pipe) it prints one line per finished trial, so logs stay readable. An example is
``[9/12] trial 8 (4982d11d) TERMINATED ...``: the sweep's finished trials so far out of its ``budget.trials``
(:meth:`SweepProgress.count`), then the Optuna trial number and the Tune trial id, as the summary names trials.
After a trial finished, it also prints the forecast when it changed.

Both go to stdout, with the summary (``sweep run ... > log.txt`` keeps them). Ray's own messages and klsweep's
warnings go to stderr.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from ray.tune import Callback
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from klsweep._format import UNWRAPPED_WIDTH, fit_table, param_labels, short
from klsweep._format import console as plain_console
from klsweep.analysis.frontier import RESPONSE_LENGTH
from klsweep.analysis.frontier_fit import MIN_POINTS
from klsweep.analysis.pareto import feasible
from klsweep.analysis.status import frontier_line
from klsweep.analysis.sweep_dir import load, load_history, study_of
from klsweep.orchestrate.remedy import REMEDIES
from klsweep.orchestrate.searcher import optuna_number
from klsweep.results import (
    ATTR_CONFIRM_OF,
    ATTR_RAY_TRIAL_ID,
    HEALTH,
    STEP,
    STOP_REASON,
    TOTAL_STEPS,
    SweepRecord,
    schedule_line,
)
from klsweep.verl.metrics import resolve

#: Seconds between refits of the KL frontier forecast on a terminal while trials report (each refit reads the study
#: and every trial's result file, as trials.csv's rewrite does).
FORECAST_EVERY_S = 30.0
#: Aliases shown as the KL, entropy and score columns (klsweep.verl.metrics resolves them per verl version).
_COLUMNS = ("ref_kl", "entropy", "score")


class SweepProgress(Callback):
    """Live table + progress bar of a sweep.

    Args:
        total_trials: the trials this Tuner creates: the count's total for a trial outside a sweep directory or of
            the confirmation phase (:meth:`count`).
        objectives: objective metric names, shown as columns.
        params: the searched verl keys (:func:`klsweep.spec.space.parameters`), shown as columns by their last
            component.
        console: where to draw (default: stdout's console, :func:`klsweep._format.console`); ``quiet=True`` prints
            only finished trials, as on a pipe.

    The forecast is refitted when a trial starts or ends. On a terminal it is also refitted every
    :data:`FORECAST_EVERY_S` seconds while trials report. It is fitted from the sweep directory holding the trial's
    Tune experiment: the finished trials and the running ones' steps so far. A forecast that cannot be made is said
    on its line, never raised into the sweep.

    Off a terminal, the line is printed at most once per finished trial, and only when it differs from the last one
    printed. It is printed at the next trial's start or the experiment's end. By then Tune has told the study of the
    finished trial; at its ``on_trial_complete`` the trial may still count as running. It is never printed on a
    start alone: the running trials' curves move the forecast without news.

    A trial's parameters are those the searcher proposed, as ``sweep status`` and the study show them. They are
    Tune's ``Trial.evaluated_params``, which a remedy's ``set_config`` leaves alone and a restored experiment keeps.
    A remedied trial's whole schedule (:func:`klsweep.results.schedule_line`) is beside them.
    """

    def __init__(self, total_trials: int, objectives: list[str], *, params: list[str] | None = None,
                 quiet: bool = False, console: Console | None = None):
        self._objectives = objectives
        self._params = param_labels(params or [])
        self._rows: dict[str, dict[str, Any]] = {}
        self._done = 0
        self._total = total_trials
        self._quiet = quiet
        self._console = console
        self._live: Live | None = None
        self._forecast = ""
        self._forecast_at = 0.0
        self._printed = ""  # the forecast last printed off a terminal
        self._owed: Any = None  # off a terminal: the last finished trial, until the forecast after it is printed
        # per trial, the (step, metric, value) the forecast fits, as Tune hands them over: the trials' result files
        # in the sweep directory are synced from Tune's staging directory only now and then (all at the end of a
        # fast sweep)
        self._curves: dict[str, list[tuple[int, str, float]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment; the terminal objects are rebuilt by setup().
        return {**self.__dict__, "_console": None, "_live": None, "_progress": None, "_owed": None}

    def setup(self, **info) -> None:
        self._console = self._console or plain_console()
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
        proposed = {**trial.config, **trial.evaluated_params}
        for key in self._params:
            row[key] = proposed.get(key)
        row["remedies"] = schedule_line(trial.config.get(REMEDIES))
        # the trainer's own step, as trials.csv's steps; Tune's report count differs when a log starts at step 0
        row["step"] = result.get(STEP, result.get("training_iteration", row.get("step")))
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

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        # a trial that just ended is in the study and its result file by now (Tune tells the searcher and flushes
        # the file after this callback's on_trial_complete), so the forecast is refitted when the next one starts
        self._refresh_forecast(trial)
        self._print_forecast()
        self._redraw()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._row(trial, result, "RUNNING")
        self._keep(trial, result)
        if self._interactive and time.monotonic() - self._forecast_at >= FORECAST_EVERY_S:
            self._refresh_forecast(trial)  # the running trials' curves move the forecast too
        self._redraw()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, "TERMINATED")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, "ERROR")

    def _finish(self, trial, status: str) -> None:
        last = trial.last_result or {}
        row = self._row(trial, last, status)
        steps, total = last.get(STEP, last.get("training_iteration")), last.get(TOTAL_STEPS)
        if row.get("health") == "stopped":
            row["status"] = "STOPPED"
        elif status == "TERMINATED" and isinstance(steps, int) and isinstance(total, int) and steps < total:
            row["status"] = "PRUNED"  # ended early by the scheduler (ASHA), as the study records it
            row.setdefault("stop_reason", f"stopped by the scheduler at step {steps}")
        self._done += 1
        done, total = self.count(trial)
        self._progress.update(self._task, completed=done, total=total)
        if self._interactive:
            self._refresh_forecast(trial)
            self._redraw()
        else:
            params = "".join(f" {label}={short(row.get(key))}" for key, label in self._params.items())
            objectives = " ".join(f"{name}={short(row.get(name))}" for name in self._objectives)
            stop_reason = str(row.get("stop_reason") or "")
            reason = f" ({stop_reason})" if stop_reason and not stop_reason.startswith("remedied:") else ""
            reason += f" (remedied {row['remedies']})" if row.get("remedies") else ""
            self._console.print(
                f"[{done}/{total}] {_name(trial)} {row['status']}{params} step={short(row.get('step'))} "
                f"{objectives}{reason}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            self._refresh_forecast(trial)  # the table's line; printed once the study has the trial
            self._owed = trial

    def count(self, trial) -> tuple[int, int]:
        """``(n, N)`` after ``trial`` finished: the sweep's search trials finished so far, it included, out of its
        ``budget.trials``.

        Both are read from the sweep directory holding the trial's Tune experiment, so they hold across Tuners: a
        resume's restored Tuner and the Tuner that extends the budget go on from the trials finished before. The
        finished trials are the study's COMPLETE, PRUNED and FAIL search trials other than ``trial`` (the study may
        or may not have been told of it yet), plus one; a trial Tune resumes is RUNNING in the study until it ends.
        N is at least n. A confirmation re-run, a trial outside a sweep, or a sweep whose study cannot be read now
        counts in this Tuner alone: its trials finished out of the ``total_trials`` it creates.
        """
        fallback = (self._done, max(self._total, self._done))
        if trial.storage is None:
            return fallback
        try:
            run_dir = Path(trial.storage.experiment_fs_path).parent
            record = SweepRecord.read(run_dir)
            told = study_of(run_dir, record).get_trials(deepcopy=False)
            budget = int(record.sweep["budget"]["trials"])
        except Exception:  # a line must not stop the sweep
            return fallback
        if any(t.user_attrs.get(ATTR_RAY_TRIAL_ID) == trial.trial_id and ATTR_CONFIRM_OF in t.user_attrs
               for t in told):
            return fallback
        done = 1 + sum(t.state.is_finished() and ATTR_CONFIRM_OF not in t.user_attrs
                       and t.user_attrs.get(ATTR_RAY_TRIAL_ID) != trial.trial_id for t in told)
        return done, max(budget, done)

    def _keep(self, trial, result: Mapping[str, Any]) -> None:
        """Keep a reported step's reference KL, response length and objectives (what the forecast fits)."""
        step = result.get(STEP, result.get("training_iteration"))
        if not isinstance(step, int):
            return
        rows = self._curves.setdefault(trial.trial_id, [])
        for name in (resolve(result, "ref_kl"), RESPONSE_LENGTH, *self._objectives):
            value = result.get(name) if name else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((step, name, float(value)))

    def _refresh_forecast(self, trial) -> None:
        """Refit the forecast from the sweep directory of ``trial`` (none for a trial outside a sweep)."""
        if trial.storage is None:
            return
        self._forecast_at = time.monotonic()
        self._forecast = forecast_line(Path(trial.storage.experiment_fs_path).parent, self._curves)

    def _print_forecast(self) -> None:
        """Off a terminal, after a trial finished: print the forecast if it differs from the last one printed."""
        if self._owed is None or self._interactive:
            return
        self._owed = None
        if self._forecast and self._forecast != self._printed:
            self._printed = self._forecast
            self._console.print(self._forecast, markup=False, highlight=False, soft_wrap=True)

    def _table(self) -> Table:
        """The trials table, fitted to the terminal's width: no number is cut or split; the columns least needed
        are left out when it is narrow (:func:`klsweep._format.fit_table`). Off a terminal, every column."""
        console = self._console
        width = console.width if console is not None and console.is_terminal else UNWRAPPED_WIDTH
        rows = list(self._rows.values())[-20:]
        remedied = any(row.get("remedies") for row in rows)
        headers = ["trial", "status", *self._params.values(), "step", "KL", "entropy", "score", *self._objectives,
                   "health", *(["remedies"] if remedied else [])]
        labels = [header.rsplit("/", 3)[-3] if header.count("/") >= 3 else header for header in headers]
        cells = [[str(row["trial"]), str(row["status"]), *(short(row.get(k)) for k in self._params),
                  short(row.get("step")), *(short(row.get(c)) for c in _COLUMNS),
                  *(short(row.get(n)) for n in self._objectives), str(row.get("health", "")),
                  *([str(row.get("remedies", ""))] if remedied else [])] for row in rows]
        return fit_table(labels, cells, width, drop=("score", "entropy", "step"), wrap=("health", "remedies"))

    def renderable(self) -> Group:
        """What the terminal shows: the trials table, the KL frontier forecast line (once a trial has ended) and the
        progress bar."""
        parts = [self._table(), *([Text(self._forecast)] if self._forecast else []), self._progress]
        return Group(*parts)

    def _redraw(self) -> None:
        if self._live is not None:
            self._live.update(self.renderable(), refresh=True)

    def on_experiment_end(self, trials, **info) -> None:
        if self._owed is not None:
            self._refresh_forecast(self._owed)
            self._print_forecast()
        if self._live is not None:
            self._live.stop()


def _name(trial) -> str:
    """A finished trial as the summary and ``sweep status`` name it: ``trial <Optuna number> (<Tune trial id>)``.

    The Tune id alone names a trial outside a sweep, or one whose study cannot be read now: a line must not stop
    the sweep."""
    try:
        number = optuna_number(trial) if trial.storage is not None else None
    except Exception:
        number = None
    return trial.trial_id if number is None else f"trial {number} ({trial.trial_id})"


def forecast_line(run_dir: Path, curves: Mapping[str, list[tuple[int, str, float]]] | None = None) -> str:
    """The KL frontier forecast of the sweep in ``run_dir``, as one line.

    It is ``sweep status``'s frontier line (:func:`klsweep.analysis.status.frontier_line`): KL* and the peak score
    with 80 % intervals, and "interval too wide" when it is. Before
    :data:`klsweep.analysis.frontier_fit.MIN_POINTS` trials are feasible, it says how many are. A forecast that
    fails says why; the sweep goes on.

    Args:
        curves: trial id → ``(step, metric, value)`` rows the live view kept as Tune handed them over. They replace
            those trials' result files, which may lag. Other trials' rows are read from ``run_dir``.
    """
    try:
        df = load(run_dir)
        history = load_history(run_dir)
        if curves:
            kept = pd.DataFrame([(t, step, name, value) for t, rows in curves.items() for step, name, value in rows],
                                columns=["trial_id", "step", "metric", "value"])
            history = pd.concat([history[~history["trial_id"].isin(curves)], kept], ignore_index=True)
        line = frontier_line(str(run_dir), df, SweepRecord.read(run_dir), history)
    except Exception as e:  # a forecast that cannot be made now must not stop the sweep
        return f"KL frontier: no forecast now ({type(e).__name__}: {e})"
    if line is None:
        n = int(feasible(df).sum()) if len(df) else 0
        return f"KL frontier: forecast once {MIN_POINTS} trials are feasible ({n} so far)"
    return line
