"""``trials.csv`` kept current while a sweep runs, so ``sweep status`` and a notebook never read a stale one."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ray.tune import Callback

from klsweep.analysis.trials_csv import write_trials_csv


class TrialsCsv(Callback):
    """Keeps the sweep directory's ``trials.csv`` current while the sweep runs.

    The file is rewritten when a trial starts or ends, and on reported steps at most every ``every_s`` seconds. Each
    write reads the study and every trial's result file.

    The sweep directory is the parent of the trial's Tune experiment directory (``trial.storage``), not a path kept
    in the callback. Tune pickles callbacks with the experiment, and a resumed sweep may have been moved since.
    """

    def __init__(self, every_s: float = 10.0):
        self._every_s = every_s
        self._written = 0.0

    def _write(self, trial) -> None:
        self._written = time.monotonic()
        try:
            write_trials_csv(Path(trial.storage.experiment_fs_path).parent)
        except Exception as e:  # a table that could not be written now must not stop the sweep
            print(f"warning: trials.csv not updated ({type(e).__name__}: {e}); it is written again when the next "
                  f"trial starts or ends", file=sys.stderr)

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._write(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if time.monotonic() - self._written >= self._every_s:
            self._write(trial)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._write(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._write(trial)
