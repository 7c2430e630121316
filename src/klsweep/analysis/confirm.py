"""The confirmation phase's runs in a trials table (``budget.confirm``): which rows re-run a search trial
(``confirm_of``) and the ranking of the confirmed search trials by their mean over seeds.

Pure pandas on a :func:`klsweep.analysis.sweep_dir.load` frame, shared by ``sweep status``/the end-of-run summary
(:mod:`klsweep.orchestrate.confirm_search`) and ``sweep report`` (:mod:`klsweep.analysis.report`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from klsweep.analysis.pareto import feasible
from klsweep.spec.space import SEED_KEY


def confirm_of(df: pd.DataFrame) -> pd.Series:
    """The ``confirm_of`` column of a :func:`klsweep.analysis.sweep_dir.load` frame (or of ``trials.csv``) as floats.

    The value is the search trial a confirmation run re-runs, NaN on search trials. All NaN when the column is
    absent."""
    if "confirm_of" not in df:
        return pd.Series(math.nan, index=df.index, dtype=float)
    return pd.to_numeric(df["confirm_of"], errors="coerce").astype(float)


def is_search(df: pd.DataFrame) -> pd.Series:
    """Boolean Series over a :func:`klsweep.analysis.sweep_dir.load` frame: the trial is a search trial (no
    ``confirm_of``)."""
    return confirm_of(df).isna()


def config_of(df: pd.DataFrame) -> pd.Series:
    """Per row, the search trial whose config it ran: its own ``number``, or for a confirmation run the trial it
    re-runs (``confirm_of``); ints. A search trial and its re-runs share one config (only the training seed
    differs), so they are one unit wherever runs must be independent (a bootstrap, a held-out error)."""
    return confirm_of(df).fillna(pd.to_numeric(df["number"], errors="coerce")).astype(int)


def ranking(df: pd.DataFrame, objectives: Sequence[tuple[str, str]], *, seed_trials: bool) -> pd.DataFrame:
    """The confirmed search trials ranked by their mean over seeds (the search run counts as one seed).

    Args:
        df: a :func:`klsweep.analysis.sweep_dir.load` frame of the sweep (search trials and confirmation runs).
        objectives: ``(metric, mode)`` per objective; the first ranks (``mode`` ``"max"`` or ``"min"``).
        seed_trials: the sweep enqueued seed trials, so trial 0 is the seed preset.

    Returns:
        One row per search trial with at least one confirmation run, best first. Empty when nothing was confirmed.
        Columns: ``trial``; ``preset`` (trial 0 of a sweep with seed trials); ``runs`` (search run and re-runs);
        ``finished``; ``ok`` (finished COMPLETE and healthy, with a value); ``seeds`` (``data.seed`` of the ok runs);
        ``mean/<metric>`` per objective; for the first objective ``sd`` (sample, NaN below 2 ok runs), ``min``,
        ``max``. A trial with a stopped or failed run ranks after those without; ties go to the lower number.
    """
    columns = [f"value/{metric}" for metric, _ in objectives]
    if df.empty or "confirm_of" not in df or any(c not in df for c in columns):
        return pd.DataFrame()
    ok = feasible(df) & df[columns].notna().all(axis=1)
    finished = df["state"].isin(["COMPLETE", "PRUNED", "FAIL"])
    of = confirm_of(df)
    rows = []
    for number in sorted({int(n) for n in of.dropna()}):
        group = df[(df["number"] == number) & of.isna() | (of == number)]
        values = group[ok.loc[group.index]]
        first = pd.to_numeric(values[columns[0]], errors="coerce") if len(values) else pd.Series(dtype=float)
        seed_column = f"config/{SEED_KEY}"
        row: dict[str, Any] = {
            "trial": number, "preset": bool(seed_trials) and number == 0, "runs": len(group),
            "finished": int(finished.loc[group.index].sum()), "ok": len(values),
            "seeds": [int(s) for s in values[seed_column]] if seed_column in values else [],
        }
        for column, (metric, _) in zip(columns, objectives):
            row[f"mean/{metric}"] = pd.to_numeric(values[column], errors="coerce").mean()
        row.update(sd=first.std(ddof=1) if len(first) >= 2 else math.nan, min=first.min(), max=first.max())
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    metric, mode = objectives[0]
    mean = table[f"mean/{metric}"]
    table["_bad"] = (table["ok"] < table["finished"]) | mean.isna()
    table["_key"] = -mean if mode == "max" else mean
    table = table.sort_values(["_bad", "_key", "trial"]).drop(columns=["_bad", "_key"])
    return table.reset_index(drop=True)
