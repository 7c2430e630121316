"""The confirmation phase (``budget.confirm``, issue 16): the search's leaders re-run with new training seeds, ranked
by their mean over seeds with its spread.

A sweep's best trial is one training seed's value, and on RL curves the runner-up is often within that seed's noise.
After the search trials, the ``top`` leaders, and the seed preset (the sweep's first seed trial, trial 0) when
``preset: true`` and it ended healthy, each run again with ``seeds`` new training seeds: ``data.seed`` = the sweep's
``seed`` + 1, + 2, ... (the same seeds for every leader, so they are compared on equal draws). The runs are trials of
the same Ray Tune experiment and Optuna study: each is enqueued (``Study.enqueue_trial``) with its leader's params
plus ``data.seed`` (an Optuna param, fixed by the queue) and the user attributes ``confirm_of`` (the leader's trial
number) and ``confirm_seed``, so optuna-dashboard, ``trials.csv`` (``confirm_of``, ``config/data.seed``) and the
samplers see them. The health rules judge them as any trial; ASHA does not run in this phase (a re-run is measured
to the end, not raced).

Leaders: single objective, the healthy COMPLETE search trials by their value (ties: the lower trial number); with
several objectives the Pareto front's trials first (:func:`klsweep.analysis.pareto.pareto_front`), each group by the
first objective. Ranking (:func:`ranking`): by the mean of the first objective over the search run and its re-runs
(the search run counts as one seed), with the sample standard deviation and range; a leader with a re-run that a
health rule stopped or that failed ranks after those without. Noise (:func:`verdicts`): two means are within noise
when their gap is at most two standard errors of the gap, ``2·√(s₁²/n₁ + s₂²/n₂)`` (Welch's standard error; a mean of
one run takes the pooled standard deviation of the others), about a 90 % two-sided test with 3 seeds each.

Resume: a run is enqueued only when Tune asks for a trial (never left waiting where the search could take it), and
:func:`confirmation_phase` plans only the runs the study does not hold yet, adopting confirmation trials left RUNNING
by a killed driver, so a sweep stopped in this phase resumes without duplicates or lost runs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from ray.tune.search import Searcher

from klsweep.analysis.confirm import confirm_of, is_search
from klsweep.analysis.confirm import ranking as rank_by_mean
from klsweep.orchestrate.searcher import KlsweepSearch
from klsweep.results import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from klsweep.space import SEED_KEY

#: Gaps up to this many standard errors of the gap are within noise.
NOISE_SE = 2.0
#: The largest training seed a confirmation run's Optuna param may hold (its IntDistribution's high end).
_SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class Run:
    """One confirmation run to enqueue: ``params`` (the leader's Optuna params) with ``data.seed = seed``."""

    of: int
    seed: int
    params: dict[str, Any]


@dataclass
class Phase:
    """What the confirmation phase still has to run: ``runs`` to enqueue and ``adopt`` (study trial ids of
    confirmation trials left RUNNING by a killed driver, re-run under new Tune trials). ``len`` is the number of Tune
    trials it needs."""

    runs: list[Run] = field(default_factory=list)
    adopt: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs) + len(self.adopt)


def search_trial_count(study) -> int:
    """Trials of an Optuna study that belong to the search (every trial but the confirmation runs)."""
    return sum(ATTR_CONFIRM_OF not in t.user_attrs for t in study.get_trials(deepcopy=False))


def leaders(sweep, df: pd.DataFrame, top: int) -> list[int]:
    """Trial numbers of the ``top`` best healthy COMPLETE search trials, best first (see the module docstring)."""
    from klsweep.analysis.pareto import feasible, pareto_front

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


def planned(sweep, df: pd.DataFrame) -> list[tuple[int, int]]:
    """Every confirmation run the sweep wants now, as ``(leader's trial number, data.seed)``: the leaders, then the
    seed preset (trial 0) when asked for, healthy and not a leader. Empty when ``budget.confirm`` is off."""
    from klsweep.analysis.pareto import feasible

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


def nothing_to_run(sweep, df: pd.DataFrame) -> str | None:
    """``nothing to run: the top 3 are already confirmed with 2 seeds`` when every run :func:`planned` wants is in
    ``df`` already (a confirmation row with that ``confirm_of`` and ``config/data.seed``), e.g. a ``sweep resume`` of
    a confirmed sweep; None when ``budget.confirm`` is off, no run is planned, or one is still missing."""
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


def confirmation_phase(sweep, out_dir: str | Path) -> Phase:
    """The runs of :func:`planned` the study of the sweep in ``out_dir`` does not hold yet, and its confirmation
    trials left RUNNING (their Tune trials are gone once every Tuner of this driver has ended)."""
    from klsweep.analysis.sweep_dir import load, study_of

    if sweep.budget.confirm is None:
        return Phase()
    study = study_of(out_dir)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    held = {(t.user_attrs[ATTR_CONFIRM_OF], t.user_attrs.get(ATTR_CONFIRM_SEED))
            for t in trials.values() if ATTR_CONFIRM_OF in t.user_attrs}
    runs = [Run(of, seed, dict(trials[of].params)) for of, seed in planned(sweep, load(out_dir))
            if (of, seed) not in held]
    adopt = [t._trial_id for t in trials.values()
             if ATTR_CONFIRM_OF in t.user_attrs and t.state == optuna.trial.TrialState.RUNNING]
    return Phase(runs, adopt)


class ConfirmSpace:
    """The sweep's define-by-run space (:class:`klsweep.space.SearchSpace`) plus the training seed ``data.seed`` as
    an Optuna int param: a confirmation trial's queue entry fixes both the leader's params and the seed."""

    def __init__(self, space):
        self.space = space

    def __call__(self, trial) -> dict[str, Any]:
        constants = self.space(trial)
        trial.suggest_int(SEED_KEY, 0, _SEED_MAX)
        return constants


class ConfirmSearch(KlsweepSearch):
    """:class:`KlsweepSearch` for the confirmation phase: each trial Tune asks for is the next run of ``phase``
    (enqueued at that moment, then asked), or a RUNNING confirmation trial it adopts; when none is left it answers
    ``Searcher.FINISHED``, so it never proposes a trial of its own.

    Args:
        phase: from :func:`confirmation_phase`.
        **kwargs: as :class:`KlsweepSearch` (``space`` is wrapped in :class:`ConfirmSpace`).
    """

    def __init__(self, *, phase: Phase, **kwargs):
        super().__init__(**{**kwargs, "space": ConfirmSpace(kwargs["space"])})
        self._queue: list[Run] = list(phase.runs)
        self._orphans = [optuna.Trial(self._ot_study, trial_id) for trial_id in phase.adopt]

    def suggest(self, trial_id: str) -> dict | None:
        """The next confirmation run (or an adopted one), tagged with the Tune trial id; ``FINISHED`` when none."""
        if trial_id not in self._ot_trials and not self._orphans:
            if not self._queue:
                return Searcher.FINISHED
            run = self._queue.pop(0)
            self._ot_study.enqueue_trial({**run.params, SEED_KEY: run.seed},
                                         user_attrs={ATTR_CONFIRM_OF: run.of, ATTR_CONFIRM_SEED: run.seed})
        return super().suggest(trial_id)


def ranking(sweep, df: pd.DataFrame) -> pd.DataFrame:
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


def verdicts(sweep, table: pd.DataFrame, df: pd.DataFrame | None = None) -> list[str]:
    """Plain sentences on a :func:`ranking`: who leads by mean, and whether it is within noise of the runner-up and
    of the seed preset; given the trials table ``df``, also why the seed preset was not re-run when it was not
    (it did not end healthy)."""
    from klsweep.analysis.pareto import feasible

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


def run_counts(sweep, df: pd.DataFrame) -> tuple[int, int]:
    """``(finished, total)`` confirmation runs: those the study holds and those the phase plans now (:func:`planned`;
    a run it holds already counts once). ``(0, 0)`` when ``budget.confirm`` is off."""
    if sweep.budget.confirm is None or df.empty:
        return 0, 0
    runs = df[~is_search(df)]
    seeds = runs[f"config/{SEED_KEY}"] if f"config/{SEED_KEY}" in runs else pd.Series(math.nan, index=runs.index)
    held = {(int(o), int(s) if pd.notna(s) else -1) for o, s in zip(confirm_of(runs), seeds)}
    done = int(runs["state"].isin(["COMPLETE", "PRUNED", "FAIL"]).sum())
    return done, len(held | set(planned(sweep, df)))


def progress(sweep, df: pd.DataFrame) -> str | None:
    """``confirmation: 4 of 8 runs finished, 2 running (or interrupted)`` (:func:`run_counts`; running: the study's
    RUNNING confirmation runs, whose driver may be gone), or None when ``budget.confirm`` is off or no run is planned
    yet."""
    done, total = run_counts(sweep, df)
    if not total:
        return None
    running = int((df.loc[~is_search(df), "state"] == "RUNNING").sum())
    return f"confirmation: {done} of {total} runs finished, {running} running (or interrupted)"
