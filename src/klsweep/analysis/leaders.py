"""The confirmation phase in a trials table (``budget.confirm``): which leaders re-run, how far that got, what it says.

After the search, the ``top`` leaders each run again with ``seeds`` new training seeds. So does the seed preset
(trial 0), when ``preset: true`` and it ended healthy. The seeds are ``data.seed`` = the sweep's ``seed`` + 1, + 2,
..., the same for every leader. :mod:`klsweep.orchestrate.confirm_search` runs them. This module reads a
:func:`klsweep.analysis.load` frame only, without Ray.

Leaders: with one objective, the healthy COMPLETE search trials by their value; ties go to the lower trial number.
With several objectives, the Pareto front's trials come first (:func:`klsweep.analysis.pareto.pareto_front`), each
group ordered by the first objective.

Ranking (:func:`ranking`): by the mean of the first objective over the search run and its re-runs; the search run
counts as one seed. The sample standard deviation and range are given. A leader with a re-run that a health rule
stopped or that failed ranks after those without.

Noise (:func:`verdicts`): two means are within noise when their gap is at most two standard errors of the gap,
``2·√(s₁²/n₁ + s₂²/n₂)`` (Welch's standard error). A mean of one run takes the pooled standard deviation of the
others. With 3 seeds each, this is about a 90 % two-sided test.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import pandas as pd

from klsweep.analysis.confirm import confirm_of, is_search
from klsweep.analysis.confirm import ranking as rank_by_mean
from klsweep.analysis.pareto import feasible, pareto_front
from klsweep.spec.space import SEED_KEY

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

#: Gaps up to this many standard errors of the gap are within noise.
NOISE_SE = 2.0


def leaders(sweep: Sweep, df: pd.DataFrame, top: int) -> list[int]:
    """Trial numbers of the ``top`` best healthy COMPLETE search trials, best first (see the module docstring)."""
    columns = [f"value/{o.metric}" for o in sweep.objectives]
    if df.empty or any(c not in df for c in columns):
        return []
    search = df[is_search(df)]
    done = search[feasible(search)].dropna(subset=columns)
    first = sweep.objectives[0]
    ranked = done.sort_values([columns[0], "number"], ascending=[first.mode == "min", True])
    if len(columns) > 1 and len(ranked):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the summary prints the front's notes
            front = set(pareto_front(done, [(c, o.mode) for c, o in zip(columns, sweep.objectives)])["number"])
        on_front = ranked["number"].isin(front)
        ranked = pd.concat([ranked[on_front], ranked[~on_front]])
    return [int(n) for n in ranked["number"].head(top)]


def planned(sweep: Sweep, df: pd.DataFrame) -> list[tuple[int, int]]:
    """Every confirmation run the sweep wants now, as ``(leader's trial number, data.seed)``: the leaders, then the
    seed preset (trial 0) when asked for, healthy and not a leader. Empty when ``budget.confirm`` is off."""
    confirm = sweep.budget.confirm
    if confirm is None:
        return []
    chosen = leaders(sweep, df, confirm.top)
    if confirm.preset and sweep.seed_trials and 0 not in chosen and len(df):
        preset = df[(df["number"] == 0) & is_search(df)]
        values = [f"value/{o.metric}" for o in sweep.objectives]
        if len(preset) and bool(feasible(preset).all()) and all(c in preset for c in values) \
                and preset[values].notna().all(axis=None):
            chosen.append(0)
    return [(number, sweep.seed + k) for number in chosen for k in range(1, confirm.seeds + 1)]


def nothing_to_run(sweep: Sweep, df: pd.DataFrame) -> str | None:
    """``nothing to run: the top 3 are already confirmed with 2 seeds`` when every run :func:`planned` wants is in
    ``df`` already.

    A run is in ``df`` when a confirmation row has its ``confirm_of`` and ``config/data.seed``; this happens on a
    ``sweep resume`` of a confirmed sweep. None when ``budget.confirm`` is off, no run is planned, or one is still
    missing."""
    confirm = sweep.budget.confirm
    wanted = planned(sweep, df)
    if confirm is None or not wanted:
        return None
    runs = df[~is_search(df)]
    seeds = runs[f"config/{SEED_KEY}"] if f"config/{SEED_KEY}" in runs else pd.Series(math.nan, index=runs.index)
    held = {(int(o), int(s)) for o, s in zip(confirm_of(runs), pd.to_numeric(seeds, errors="coerce")) if s == s}
    if not set(wanted) <= held:
        return None
    top = len(leaders(sweep, df, confirm.top))
    preset = " and the seed preset (trial 0)" if any(of == 0 for of, _ in wanted[top * confirm.seeds:]) else ""
    seeds_word = "seed" if confirm.seeds == 1 else "seeds"
    return f"nothing to run: the top {top}{preset} are already confirmed with {confirm.seeds} {seeds_word}"


def ranking(sweep: Sweep, df: pd.DataFrame) -> pd.DataFrame:
    """The sweep's confirmed leaders ranked by their mean over seeds: :func:`klsweep.analysis.confirm.ranking` on
    the sweep's objectives and seed trials (see there for the columns)."""
    return rank_by_mean(df, [(o.metric, o.mode) for o in sweep.objectives], seed_trials=bool(sweep.seed_trials))


def within_noise(a: pd.Series, b: pd.Series, pooled_sd: float, metric: str) -> tuple[bool | None, float, float]:
    """``(within, gap, 2 SE)`` for two rows of :func:`ranking` on ``mean/<metric>``: ``within`` is None when the
    noise cannot be estimated (no row had 2 ok runs)."""
    gap = abs(float(a[f"mean/{metric}"]) - float(b[f"mean/{metric}"]))
    terms = []
    for row in (a, b):
        sd = float(row["sd"]) if row["ok"] >= 2 and math.isfinite(row["sd"]) else pooled_sd
        terms.append(sd * sd / max(int(row["ok"]), 1))
    bound = NOISE_SE * math.sqrt(sum(terms))
    if not math.isfinite(bound):
        return None, gap, bound
    return gap <= bound, gap, bound


def verdicts(sweep: Sweep, table: pd.DataFrame, df: pd.DataFrame | None = None) -> list[str]:
    """Plain sentences on a :func:`ranking`.

    They say who leads by mean, and whether it is within noise of the runner-up and of the seed preset. Given the
    trials table ``df``, they also say why the seed preset was not re-run, when it was not: it did not end healthy."""
    if table.empty or not table["ok"].iloc[0]:
        return []
    preset = df[(df["number"] == 0) & is_search(df)] if df is not None and sweep.seed_trials else pd.DataFrame()
    unfit = "" if preset.empty or bool(feasible(preset).all()) or sweep.budget.confirm is None or \
        not sweep.budget.confirm.preset else (f"the seed preset (trial 0) was not re-run: it did not end healthy "
                                              f"({preset['state'].iloc[0]}, health {preset['health'].iloc[0]})")
    metric = sweep.objectives[0].metric
    variances = [float(s) ** 2 for s, n in zip(table["sd"], table["ok"]) if n >= 2 and math.isfinite(s)]
    pooled = math.sqrt(sum(variances) / len(variances)) if variances else math.nan
    lead = table.iloc[0]
    name = "the seed preset (trial 0)" if lead["preset"] else f"trial {lead['trial']}"
    lines = [f"by mean over seeds, {name} leads: {metric} {_spread(lead, metric)}"]
    runner_up = table.iloc[1] if len(table) > 1 else None
    others = [] if runner_up is None else [
        (f"the runner-up, trial {runner_up['trial']}" + (" (the seed preset)" if runner_up["preset"] else ""),
         runner_up)]
    preset = table[table["preset"]]
    if len(preset) and not lead["preset"] and not (runner_up is not None and runner_up["preset"]):  # said once
        others.append(("the seed preset (trial 0)", preset.iloc[0]))
    for label, row in others:
        if not row["ok"]:
            continue
        within, gap, bound = within_noise(lead, row, pooled, metric)
        if within is None:
            lines.append(f"{label}: gap {gap:.4g}, noise unknown (no leader has 2 healthy runs)")
        elif within:
            lines.append(f"{label}: within noise (gap {gap:.4g} ≤ 2 SE = {bound:.4g}); more seeds would be needed "
                         "to tell them apart")
        else:
            lines.append(f"{label}: behind by {gap:.4g} (> 2 SE = {bound:.4g})")
    if unfit:
        lines.append(unfit)
    bad = table[table["ok"] < table["finished"]]
    for _, row in bad.iterrows():
        lines.append(f"trial {row['trial']}: {row['finished'] - row['ok']} of {row['finished']} runs stopped by a "
                     "health rule or failed: ranked after the leaders whose every run ended healthy")
    return lines


def _spread(row: pd.Series, metric: str) -> str:
    sd = f" ± {row['sd']:.3g} sd" if math.isfinite(row["sd"]) else ""
    seeds = "seed" if int(row["ok"]) == 1 else "seeds"
    return (f"mean {row[f'mean/{metric}']:.4g}{sd} over {int(row['ok'])} {seeds} "
            f"[{row['min']:.4g}, {row['max']:.4g}]")


def run_counts(sweep: Sweep, df: pd.DataFrame) -> tuple[int, int]:
    """``(finished, total)`` confirmation runs: those the study holds and those the phase plans now (:func:`planned`;
    a run it holds already counts once). ``(0, 0)`` when ``budget.confirm`` is off."""
    if sweep.budget.confirm is None or df.empty:
        return 0, 0
    runs = df[~is_search(df)]
    seeds = runs[f"config/{SEED_KEY}"] if f"config/{SEED_KEY}" in runs else pd.Series(math.nan, index=runs.index)
    held = {(int(o), int(s) if pd.notna(s) else -1) for o, s in zip(confirm_of(runs), seeds)}
    done = int(runs["state"].isin(["COMPLETE", "PRUNED", "FAIL"]).sum())
    return done, len(held | set(planned(sweep, df)))


def progress(sweep: Sweep, df: pd.DataFrame) -> str | None:
    """``confirmation: 4 of 8 runs finished, 2 running (or interrupted)`` (:func:`run_counts`).

    Running counts the study's RUNNING confirmation runs, whose driver may be gone. None when ``budget.confirm`` is
    off or no run is planned yet."""
    done, total = run_counts(sweep, df)
    if not total:
        return None
    running = int((df.loc[~is_search(df), "state"] == "RUNNING").sum())
    return f"confirmation: {done} of {total} runs finished, {running} running (or interrupted)"
