"""A trial's ``result.json``: written in the sweep directory row by row, each step once after a restart.

Ray's own logger (``JsonLoggerCallback``, ray/tune/logger/json.py, **Ray 2.60.0**) writes the file in the driver's
staging folder. Tune copies that folder to the sweep directory every 10 s or so (``TUNE_GLOBAL_CHECKPOINT_S``,
ray/tune/execution/experiment_state.py) with ``pyarrow.fs.copy_files``, in a thread of the driver, which truncates each
file before it writes it (``_upload_to_fs_path``, ray/train/_internal/storage.py). So ``sweep status`` read a finished
trial's numbers of an earlier step, and a SIGKILL of the driver during a copy left a ``result.json`` cut anywhere,
even empty, for ``sweep resume`` to continue. :class:`ResultsFromCheckpoint` writes the file in the sweep directory
itself: each row appended and flushed as Tune reports it, and rewritten whole (a new file, then ``os.replace``) only
when the trial starts. The staging folder holds no ``result.json``, so Tune's copy never touches it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.fs
from ray.tune.experiment import Trial
from ray.tune.logger import JsonLoggerCallback
from ray.tune.result import EXPR_RESULT_FILE

from klsweep.results import STEP


class ResultsFromCheckpoint(JsonLoggerCallback):
    """Ray Tune's ``result.json`` logger that writes in the sweep directory; a restarted trial's file holds each step
    once, the rerun's last.

    When a trial starts (new, restarted by a remedy, retried by Tune or continued by ``sweep resume``) its file keeps
    the rows up to the step of the checkpoint it starts from, and drops the rest: the run reports them again. An
    in-process trial runs them again from its checkpoint; a verl trial reports the steps its files logged after the
    checkpoint's step (:func:`klsweep.launchers.process.run_process_trial`'s ``reported_to``), or runs them again from
    verl's checkpoint a remedy rewound to (:func:`klsweep.launchers.resume.rewind`). A trial without a checkpoint
    reports every step again, so its file starts empty. A driver killed while it appended leaves at most a cut last
    line, which readers skip and the next start drops. Passed in the run config's callbacks, it replaces Ray's
    default. On storage that is not a local (or mounted) file system, which klsweep refuses, it is Ray's logger.
    """

    def log_trial_start(self, trial: Trial) -> None:
        target = _in_storage(trial)
        if target is None:
            return super().log_trial_start(trial)
        if trial in self._trial_files:
            self._trial_files[trial].close()
        self.update_config(trial, trial.config)  # params.json in the staging folder, copied by Tune
        trial.init_local_path()
        target.parent.mkdir(parents=True, exist_ok=True)
        checkpoint = trial.latest_checkpoint_result
        last = checkpoint.metrics.get(STEP, 0) if checkpoint is not None else 0
        lines = target.read_text().splitlines() if target.is_file() else []
        kept = [line for line in lines if _step_of(line, last + 1) <= last]
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, target)
        self._trial_files[trial] = target.open("at")


def _in_storage(trial: Trial) -> Path | None:
    """The trial's ``result.json`` in the sweep directory, or None off a local file system."""
    storage = trial.storage
    if storage is None or not isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return None
    return Path(storage.trial_fs_path, EXPR_RESULT_FILE)


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
