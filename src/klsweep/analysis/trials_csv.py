"""``trials.csv``: the trials table of a sweep directory (:func:`klsweep.analysis.load`) written beside its study."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

from klsweep.analysis.sweep_dir import load
from klsweep.results import TRIALS_CSV

#: an older ``trials.csv`` that held more trials than the study now does
PREVIOUS_CSV = "trials.previous.csv"


def write_trials_csv(out_dir: Path) -> pd.DataFrame:
    """Write ``out_dir/trials.csv`` and return its frame.

    The table goes to a temporary file first, then a rename, so a reader never sees half a file. A ``trials.csv``
    that holds more trials than the new table is never replaced: it is kept as ``trials.previous.csv`` (said on
    stderr), since a study cannot lose trials.

    Raises:
        ResultsError: ``out_dir`` is not a sweep directory, or its study is lost
            (:func:`klsweep.analysis.study_file.check_study`).
    """
    df = load(out_dir)
    held = _rows(out_dir / TRIALS_CSV)
    if held > len(df):
        os.replace(out_dir / TRIALS_CSV, out_dir / PREVIOUS_CSV)
        print(f"warning: {out_dir / TRIALS_CSV} held {held} trials and the study holds {len(df)}: the old table is "
              f"kept as {out_dir / PREVIOUS_CSV}", file=sys.stderr)
    tmp = out_dir / (TRIALS_CSV + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, out_dir / TRIALS_CSV)
    return df


def _rows(file: Path) -> int:
    """The number of trials in a ``trials.csv`` (0 when there is none, or it cannot be read)."""
    try:
        return len(pd.read_csv(file))
    except (OSError, ValueError):
        return 0
