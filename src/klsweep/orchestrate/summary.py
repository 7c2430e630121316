"""The end of ``sweep run``: counts by state, the stop reasons, the best trial(s) and the verl command that
reproduces each."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from klsweep._format import console as plain_console
from klsweep._format import short
from klsweep.analysis.load import overrides_of
from klsweep.trainers import trainer_kind

#: Console.print options for text that must come out verbatim ("[console,file]" is not rich markup).
_PLAIN = {"markup": False, "highlight": False, "soft_wrap": True}

def best_trials(sweep, df: pd.DataFrame) -> pd.DataFrame:
    """The best COMPLETE, healthy trial (single objective) or the Pareto front of them (several objectives).

    Uses the values told to Optuna (``value/<metric>``: each objective's last reported value). The front is
    :func:`klsweep.analysis.pareto.pareto_front` (Optuna's non-dominated sort); its ``attrs["notes"]`` say when it
    is empty or mixes KL scales.
    """
    import warnings

    from klsweep.analysis.pareto import feasible, pareto_front

    value_cols = [f"value/{o.metric}" for o in sweep.objectives]
    if df.empty or any(c not in df for c in value_cols):
        return df.iloc[0:0]
    if len(value_cols) == 1:
        done = df[feasible(df)].dropna(subset=value_cols)
        o = sweep.objectives[0]
        return done.sort_values(value_cols[0], ascending=o.mode == "min").head(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # print_summary shows the front's notes
        return pareto_front(df, [(c, o.mode) for c, o in zip(value_cols, sweep.objectives)])


def counts_line(sweep, df: pd.DataFrame) -> str:
    """``tiny: 1 finished, 1 running (or interrupted), 1 not started (budget 3 trials × 4 steps)``, from a
    :func:`klsweep.analysis.load` frame (a RUNNING study trial may belong to a driver that is gone)."""
    counts = df["state"].value_counts().to_dict() if len(df) else {}
    finished = sum(n for s, n in counts.items() if s in ("COMPLETE", "PRUNED", "FAIL"))
    left = max(0, sweep.budget.trials - len(df))
    return (f"{sweep.name}: {finished} finished, {counts.get('RUNNING', 0)} running (or interrupted), {left} not "
            f"started (budget {sweep.budget.trials} trials × {sweep.budget.max_steps} steps)")


def print_summary(sweep, df: pd.DataFrame, out_dir: Path, console: Console | None = None, *,
                  ended: bool = True) -> int:
    """Print what the sweep did and its best trial(s); returns 0 if a trial completed healthy, else 1.

    ``ended=False``: the sweep is still running or was interrupted (Ctrl-C) before its budget; no healthy trial yet
    is then no failure and is not reported as one.
    """
    console = console or plain_console()
    counts = df["state"].value_counts().to_dict() if len(df) else {}
    console.print(f"\n[bold]{sweep.name}[/bold]: {len(df)} trials — "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), highlight=False)
    stopped = df[df.get("stop_reason", pd.Series("", index=df.index)).fillna("").astype(str) != ""]
    if len(stopped):
        table = Table(title="stopped trials", show_edge=False)
        for col in ("number", "state", "steps", "stop_reason"):
            table.add_column(col, overflow="fold")
        for _, row in stopped.iterrows():
            table.add_row(*(Text(short(row.get(c))) for c in ("number", "state", "steps", "stop_reason")))
        console.print(table)
    best = best_trials(sweep, df)
    if best.empty and not sum(n for s, n in counts.items() if s != "RUNNING"):
        console.print("no trial has finished yet", highlight=False)
        return 1
    if best.empty and not ended:
        console.print("no trial has completed healthy yet", highlight=False)
        return 1
    if best.empty:
        console.print("no trial completed healthy: see trials.csv for the stop reasons", style="red")
        console.print(f"results: {out_dir}")
        return 1
    for note in best.attrs.get("notes", []):
        console.print(f"note: {note}", style="yellow", **_PLAIN)
    title = "best trial" if len(sweep.objectives) == 1 else f"Pareto front ({len(best)} trials)"
    console.print(f"\n[bold]{title}[/bold]")
    for _, row in best.iterrows():
        values = ", ".join(f"{o.metric}={short(row[f'value/{o.metric}'])}" for o in sweep.objectives)
        has_kl = isinstance(row.get("kl_metric"), str)
        kl = f", {row['kl_metric']} last={short(row.get('last/ref_kl'))}" if has_kl else ""
        console.print(f"trial {row['number']} ({row['trial_id']}): {values}{kl}", **_PLAIN)
        for label, command in trainer_kind(sweep.trainer).reproduce(overrides_of(row)):
            if label:
                console.print(label, highlight=False)
            console.print(command, **_PLAIN)
    console.print(f"\nresults: {out_dir} (trials.csv, study.db, tune/)")
    return 0
