"""A trial's ``result.json`` with each step once when a remedy restarted it from a checkpoint.

Ray's own logger (``JsonLoggerCallback.log_trial_start``, ray/tune/logger/json.py, **Ray 2.60.0**) copies the file
from the trial's storage over the driver's staging copy when the trial restarts from a checkpoint. The storage copy
is synced only now and then, so steps would be lost; and the restarted run's steps would follow the superseded ones.
:class:`ResultsFromCheckpoint` overrides the private ``JsonLoggerCallback._restore_from_remote`` for that.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ray.tune.experiment import Trial
from ray.tune.logger import JsonLoggerCallback
from ray.tune.result import EXPR_RESULT_FILE

from klsweep.results import STEP


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
