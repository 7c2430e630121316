"""Compute accounting of a sweep: trial-steps and GPU-hours used, and saved by stopping trials early.

"Saved" compares with running every trial to ``budget.max_steps``: a trial stopped after ``s`` steps saved
``max_steps − s`` steps, costed at that trial's own seconds per step (``wall_s / steps``) × ``budget.resources.gpu``.
"""

from __future__ import annotations

import pandas as pd


def compute_accounting(df: pd.DataFrame, max_steps: int, gpu: float) -> pd.DataFrame:
    """Trial-steps, wall hours and GPU-hours used and saved, by how trials ended.

    Args:
        df: the trials table (:func:`klsweep.analysis.load.load`: ``state``, ``health``, ``steps``, ``wall_s``).
        max_steps: steps per trial in the budget (``budget.max_steps``).
        gpu: GPUs reserved per trial (``budget.resources.gpu``; 0 for CPU sweeps).

    Returns:
        One row per outcome, ``health stop`` (health verdict stopped), ``scheduler stop`` (PRUNED or COMPLETE short
        of the budget without a health stop), ``failed`` (FAIL), ``full budget`` (ran ``max_steps``), ``running``,
        then ``total``. Columns: ``trials``, ``steps_used``, ``steps_saved``, ``wall_h_used``, ``wall_h_saved``,
        ``gpu_h_used``, ``gpu_h_saved`` (hours; saved = missing steps × the trial's seconds per step × gpu / 3600;
        a trial with no step or no wall time saves steps but no measurable hours).
    """
    steps = pd.to_numeric(df.get("steps"), errors="coerce").fillna(0) if len(df) else pd.Series(dtype=float)
    wall = pd.to_numeric(df.get("wall_s"), errors="coerce").fillna(0) if len(df) else pd.Series(dtype=float)
    per_step = (wall / steps.where(steps > 0)).fillna(0)
    missing = (max_steps - steps).clip(lower=0)
    health = df["health"].fillna("") if "health" in df else pd.Series("", index=df.index)
    outcome = pd.Series("full budget", index=df.index, dtype=object)
    outcome[missing > 0] = "scheduler stop"
    outcome[df["state"] == "FAIL"] = "failed"
    outcome[df["state"] == "RUNNING"] = "running"
    outcome[health == "stopped"] = "health stop"
    missing[outcome == "running"] = 0  # not stopped yet: nothing saved
    table = pd.DataFrame({
        "outcome": outcome, "trials": 1, "steps_used": steps, "steps_saved": missing,
        "wall_h_used": wall / 3600, "wall_h_saved": missing * per_step / 3600,
    })
    table["gpu_h_used"] = table["wall_h_used"] * gpu
    table["gpu_h_saved"] = table["wall_h_saved"] * gpu
    order = ["health stop", "scheduler stop", "failed", "full budget", "running"]
    grouped = table.groupby("outcome").sum(numeric_only=True).reindex([o for o in order if o in set(outcome)])
    grouped.loc["total"] = grouped.sum()
    grouped["trials"] = grouped["trials"].astype(int)
    grouped["steps_used"] = grouped["steps_used"].astype(int)
    grouped["steps_saved"] = grouped["steps_saved"].astype(int)
    return grouped.reset_index().rename(columns={"index": "outcome"})
