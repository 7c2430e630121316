"""``trials.csv``: the trials table of a sweep directory (:func:`klsweep.analysis.load`) written beside its study."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from klsweep.analysis.sweep_dir import load
from klsweep.results import TRIALS_CSV


def write_trials_csv(out_dir: Path) -> pd.DataFrame:
    """Write ``out_dir/trials.csv`` and return its frame.

    The table goes to a temporary file first, then a rename, so a reader never sees half a file.

    Raises:
        ResultsError: ``out_dir`` is not a sweep directory.
    """
    df = load(out_dir)
    tmp = out_dir / (TRIALS_CSV + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, out_dir / TRIALS_CSV)
    return df
