"""The end of ``sweep run``: counts by state, the stop reasons, the best trial(s) and the verl command that
reproduces each."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from klsweep.verl.config import verl_command


def best_trials(sweep, df: pd.DataFrame) -> pd.DataFrame:
    """The best COMPLETE, healthy trial (single objective) or the Pareto front of them (several objectives).

    Uses the values told to Optuna (``value/<metric>``: each objective's last reported value). The front is Optuna's
    non-dominated sort (:func:`optuna.study._multi_objective._get_pareto_front_trials` semantics via
    :func:`klsweep.analysis.pareto.pareto_front` when available).
    """
    done = df[(df["state"] == "COMPLETE") & (df.get("health", "healthy") != "stopped")] if len(df) else df
    value_cols = [f"value/{o.metric}" for o in sweep.objectives]
    if done.empty or any(c not in done for c in value_cols):
        return done.iloc[0:0]
    done = done.dropna(subset=value_cols)
    if len(value_cols) == 1:
        o = sweep.objectives[0]
        return done.sort_values(value_cols[0], ascending=o.mode == "min").head(1)
    from optuna.study._multi_objective import _is_pareto_front
    import numpy as np

    signs = np.array([-1.0 if o.mode == "max" else 1.0 for o in sweep.objectives])
    points = done[value_cols].to_numpy(dtype=float) * signs
    return done[_is_pareto_front(points, assume_unique_lexsorted=False)]


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def print_summary(sweep, df: pd.DataFrame, out_dir: Path, console: Console | None = None) -> int:
    """Print what the sweep did and its best trial(s); returns 0 if a trial completed healthy, else 1."""
    console = console or Console()
    counts = df["state"].value_counts().to_dict() if len(df) else {}
    console.print(f"\n[bold]{sweep.name}[/bold]: {len(df)} trials — "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), highlight=False)
    stopped = df[df.get("stop_reason", pd.Series(dtype=str)).fillna("").astype(str) != ""] if len(df) else df
    if len(stopped):
        table = Table(title="stopped trials", show_edge=False)
        for col in ("number", "state", "steps", "stop_reason"):
            table.add_column(col, overflow="fold")
        for _, row in stopped.iterrows():
            table.add_row(*(_fmt(row.get(c)) for c in ("number", "state", "steps", "stop_reason")))
        console.print(table)
    best = best_trials(sweep, df)
    if best.empty:
        console.print("no trial completed healthy: see trials.csv for the stop reasons", style="red")
        console.print(f"results: {out_dir}")
        return 1
    title = "best trial" if len(sweep.objectives) == 1 else f"Pareto front ({len(best)} trials)"
    console.print(f"\n[bold]{title}[/bold]")
    for _, row in best.iterrows():
        values = ", ".join(f"{o.metric}={_fmt(row[f'value/{o.metric}'])}" for o in sweep.objectives)
        kl = f", {row['kl_metric']} last={_fmt(row.get('last/ref_kl'))}" if isinstance(row.get("kl_metric"), str) else ""
        console.print(f"trial {row['number']} ({row['trial_id']}): {values}{kl}", highlight=False)
        overrides = {k[len("config/"):]: v for k, v in row.items() if k.startswith("config/") and _present(v)}
        console.print(verl_command(overrides), highlight=False, soft_wrap=True)
    console.print(f"\nresults: {out_dir} (trials.csv, study.db, tune/)")
    return 0


def _present(v) -> bool:
    return not (isinstance(v, float) and math.isnan(v))
