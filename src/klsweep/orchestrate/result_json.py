"""A trial's ``result.json``: each step once when a remedy restarted it from a checkpoint, and in the sweep
directory before the study says the trial ended.

Ray's own logger (``JsonLoggerCallback.log_trial_start``, ray/tune/logger/json.py, **Ray 2.60.0**) copies the file
from the trial's storage over the driver's staging copy when the trial restarts from a checkpoint. The storage copy
is synced only now and then, so steps would be lost; and the restarted run's steps would follow the superseded ones.
:class:`ResultsFromCheckpoint` overrides the private ``JsonLoggerCallback._restore_from_remote`` for that.

Tune writes ``result.json`` in the driver's staging folder and copies it to the sweep directory every 10 s or so
(``TUNE_GLOBAL_CHECKPOINT_S``, ray/tune/execution/experiment_state.py). The searcher tells Optuna a trial ended as
soon as it does, so ``sweep status`` would show a finished trial with the numbers of an earlier step.
:class:`ResultsFromCheckpoint` copies a trial's file there itself at its last step and at its end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.fs
from ray.tune.experiment import Trial
from ray.tune.logger import JsonLoggerCallback
from ray.tune.result import EXPR_RESULT_FILE

from klsweep.results import STEP, TOTAL_STEPS


class ResultsFromCheckpoint(JsonLoggerCallback):
    """Ray Tune's ``result.json`` logger: a restarted trial's file holds each step once, the rerun's last.

    The staging copy is kept when it has lines (this driver wrote it, so it is the latest); a resumed sweep's new
    driver has none and copies the storage's. Rows after the checkpoint's step are dropped: the restarted run
    reports them again. An in-process trial runs them again from its checkpoint; a verl trial reports the steps
    its files logged after the checkpoint's step (:func:`klsweep.launchers.process.run_process_trial`'s
    ``reported_to``), or runs them again from verl's checkpoint a remedy rewound to
    (:func:`klsweep.launchers.resume.rewind`). A trial restored without a checkpoint reports every step again, so
    its file starts empty. Passed in the run config's callbacks, it replaces Ray's default.

    Args:
        in_process: the sweep's trainer runs in the Tune worker (:attr:`klsweep.trainers.TrainerKind.in_process`);
            kept for the callers, both kinds restart the same way.
    """

    def __init__(self, in_process: bool = True):
        super().__init__()
        self._in_process = in_process

    def log_trial_result(self, iteration: int, trial: Trial, result: dict) -> None:
        """Write the row; at the trial's last row (``done``, or its last training step) copy the file to storage.

        Tune calls the callbacks with a result before it stops the trial and tells the searcher."""
        super().log_trial_result(iteration, trial, result)
        step, total = result.get(STEP), result.get(TOTAL_STEPS)
        if result.get("done") or (isinstance(step, int) and isinstance(total, int) and step >= total):
            _copy_to_storage(trial)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        super().log_trial_end(trial, failed)
        _copy_to_storage(trial)  # a process trial's last row carries no total_steps

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if trial.local_path is None or trial.storage is None:
            return super()._restore_from_remote(file_name, trial)
        local = Path(trial.local_path, file_name)
        if not (local.is_file() and local.stat().st_size):  # a new driver (sweep resume): the storage's copy
            super()._restore_from_remote(file_name, trial)
        checkpoint = trial.latest_checkpoint_result
        if file_name != EXPR_RESULT_FILE or not local.is_file():
            return
        last = checkpoint.metrics.get(STEP, 0) if checkpoint is not None else 0
        kept = [line for line in local.read_text().splitlines() if _step_of(line, last + 1) <= last]
        tmp = local.with_name(local.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, local)


def _copy_to_storage(trial: Trial) -> None:
    """Replace the trial's ``result.json`` in the sweep directory with the driver's staging copy, atomically.

    Only for storage on a local (or mounted) file system, which klsweep requires; elsewhere Tune's own sync does it.
    """
    storage = trial.storage
    if trial.local_path is None or storage is None or not isinstance(storage.storage_filesystem,
                                                                      pyarrow.fs.LocalFileSystem):
        return
    source = Path(trial.local_path, EXPR_RESULT_FILE)
    target = Path(storage.trial_fs_path, EXPR_RESULT_FILE)
    if not source.is_file() or source == target:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".copy")
    tmp.write_bytes(source.read_bytes())
    os.replace(tmp, target)


def _step_of(line: str, default: int) -> int:
    """The training step of one ``result.json`` line (``step``, else ``training_iteration``).

    Returns ``default`` for a line that is not a JSON object with one (a killed driver's half-written last line).
    """
    try:
        row = json.loads(line)
        step = row.get(STEP, row.get("training_iteration"))
    except (json.JSONDecodeError, AttributeError):
        return default
    return step if isinstance(step, int) else default
