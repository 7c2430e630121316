"""The whole verl overrides of a klsweep trial, for a Ray Tune log of it that holds only the searched ones.

A Tune log's config (``result.json``, ``progress.csv``) is the trial's searched parameters only; a klsweep run directory
also holds the sweep file the trial ran with (:data:`klsweep.results.SWEEP_FILE`). ``sweep health check`` passes
:func:`trial_log_overrides` to :func:`klsweep.health.readers.read_trace`, which knows nothing of sweep files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from klsweep.errors import KlsweepError
from klsweep.results import SWEEP_FILE, TUNE_DIR, SweepRecord
from klsweep.spec.schema import Sweep
from klsweep.spec.space import trial_overrides


def trial_log_overrides(path: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The trial's overrides as its sweep ran them, for a log at ``<run dir>/tune/<trial>/<file>``.

    Args:
        path: the Tune log of the trial.
        config: the log's own config; its dotted keys are the trial's verl values (others, like remedies, are not).

    Returns:
        :func:`klsweep.spec.space.trial_overrides` of the run's saved sweep file with those values; None when the
        log is not in a klsweep run directory, or its sweep file is of another klsweep version.
    """
    run_dir = path.parent.parent.parent
    if path.parent.parent.name != TUNE_DIR or not (run_dir / SWEEP_FILE).is_file():
        return None
    try:
        sweep = Sweep.model_validate(SweepRecord.read(run_dir).sweep)
        return trial_overrides(sweep, {k: v for k, v in config.items() if "." in k})
    except (KlsweepError, ValueError, KeyError):
        return None
