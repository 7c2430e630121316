"""Compute accounting of a sweep: trial-steps and GPU-hours used, and saved by stopping trials early.

"Saved" compares with running every trial to ``budget.max_steps``, or to the end of the trainer's run when it ends
sooner: a replayed log of 105 steps under ``max_steps`` 200, or a verl run whose data runs out.
A trial stopped after ``s`` steps saved the steps it had left, ``max_steps − s`` or ``end − s``.
A trial that ended by itself before ``max_steps`` (COMPLETE, no stop reason) ran its whole run and saved nothing:
the budget's steps past the run's end were never there to save.
Hours are costed at the trial's own seconds per step × ``budget.resources.gpu``. The rate is ``step_s``: the time
between the trial's reports over the steps between them, start-up left out
(:func:`klsweep.analysis.sweep_dir.step_seconds`): a ``step_s`` column, else ``df.attrs`` as ``load`` sets it.
A trial without one (a single step) gets the median ``step_s`` of the sweep's other trials. Without any, it is
``wall_s / steps``, which holds the start-up and so overstates the hours a trial stopped early saved.
A failed trial (FAIL without a health stop) saved nothing: its missing steps count neither as used nor as saved.
A restart decided at step ``s`` from the checkpoint of step ``f`` ran steps ``f+1..s`` again.
Those ``s − f`` steps count as used (``steps_rerun``), at the trial's seconds per step.
Groups: how trials ended (``by="outcome"``, the report) or what stopped them (``by="reason"``, ``sweep status``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pandas as pd

from klsweep.analysis.pareto import feasible
from klsweep.analysis.sweep_dir import STEP_SECONDS
from klsweep.results import FATE_STOP_REASON, MEDIAN_STOP_REASON, STOP_KIND_OBJECTIVE, remedy_records, restarts

#: The rule named in a health stop's reason (``klsweep.health.verdict.StopReason.text``: "KIND at step N by RULE: ...").
_RULE = re.compile(r"\bat step \S+ by ([^\s:]+):")

#: The group of trials that ran their whole run, which ended before ``budget.max_steps``.
RUN_ENDED = "run ended before max_steps"
_OUTCOMES = ["health stop", "objective stop", "scheduler stop", "failed", "full budget", RUN_ENDED, "running"]
_LAST = ["median stopping", "fate stopping", "objective stopper", "scheduler", "failed", "full budget", RUN_ENDED,
         "running"]
#: The stoppers of ``stopping:`` that record ``stop_kind`` objective, by how their stop reasons begin; any other
#: reason of that kind is the objective stopper's (:mod:`klsweep.orchestrate.objective_stop`).
_OBJECTIVE_STOPPERS = {MEDIAN_STOP_REASON: "median stopping", FATE_STOP_REASON: "fate stopping"}


def compute_accounting(df: pd.DataFrame, max_steps: int, gpu: float,
                       by: Literal["outcome", "reason"] = "outcome") -> pd.DataFrame:
    """Trial-steps, wall hours and GPU-hours used and saved, by how trials ended or by what stopped them.

    Args:
        df: the trials table (:func:`klsweep.analysis.sweep_dir.load`: ``state``, ``health``, ``steps``, ``wall_s``, and
            for ``by="reason"`` or an objective stop ``stop_reason`` and ``stop_kind``). Seconds per step without
            the start-up come from a ``step_s`` column, else from ``df.attrs[STEP_SECONDS]`` (``{trial_id: seconds}``,
            as :func:`klsweep.analysis.sweep_dir.load` sets it: :func:`klsweep.analysis.sweep_dir.step_seconds`).
        max_steps: steps per trial in the budget (``budget.max_steps``).
        gpu: GPUs reserved per trial (``budget.resources.gpu``; 0 for CPU sweeps).
        by: ``"outcome"``: one row per outcome, ``health stop`` (health verdict stopped), ``objective stop``
            (``stop_kind`` objective: :mod:`klsweep.orchestrate.objective_stop`), ``scheduler stop`` (PRUNED, or
            COMPLETE with a stop reason, short of the budget otherwise), ``failed`` (FAIL), ``full budget`` (ran
            ``max_steps``), :data:`RUN_ENDED` (COMPLETE without a stop reason, short of ``max_steps``: the trainer's
            run ended there), ``running``. ``"reason"``: the health stops split by rule (``health: kl_runaway``, the
            rule named in the stop reason, else ``health: <stop kind>``), then the objective stops split by stopper
            (``median stopping``, ``fate stopping``: told by the start of the stop reason; ``objective stopper``:
            any other), ``scheduler``, ``failed``, ``full budget``, :data:`RUN_ENDED`, ``running``.

    Returns:
        One row per group present, then ``total``. Columns: ``outcome`` or ``reason`` (as ``by``), ``trials``,
        ``steps_used`` (the last run's steps plus ``steps_rerun``), ``steps_saved``, ``saved_share``,
        ``wall_h_used``, ``wall_h_saved``, ``gpu_h_used``, ``gpu_h_saved``, ``gpu_h_saved_share``, ``steps_rerun``
        (:func:`rerun_steps`).
        ``saved_share`` is the group's steps saved ÷ (steps used + steps saved) of the whole sweep: groups add up.
        ``gpu_h_saved_share`` is the same in GPU-hours, 0 when nothing was used.
        Hours saved = missing steps × the trial's seconds per step (module docstring) × gpu / 3600.
        A trial without a step or a wall time saves steps but no hours. A running or failed trial saves nothing.
        Neither does a :data:`RUN_ENDED` trial; the longest of those is where every trial's run ends (the trials
        of a sweep run the same trainer), so a stopped trial saves at most the steps up to it.

    Raises:
        ValueError: ``by`` is neither ``"outcome"`` nor ``"reason"``.
    """
    if by not in ("outcome", "reason"):
        raise ValueError(f"compute_accounting(by={by!r}): use 'outcome' or 'reason'")
    steps = _column(df, "steps", 0)
    wall = _column(df, "wall_s", 0)
    per_step = _step_rate(df, wall, steps)
    health = _text(df, "health")
    kind = _text(df, "stop_kind")
    stopped = health == "stopped"
    objective = (kind == STOP_KIND_OBJECTIVE) & ~stopped
    ended = (df["state"] == "COMPLETE") & ~stopped & ~objective & (_text(df, "stop_reason") == "") & (steps < max_steps)
    run_end = min(max_steps, steps[ended].max()) if ended.any() else max_steps
    missing = (run_end - steps).clip(lower=0)
    outcome = pd.Series("full budget", index=df.index, dtype=object)
    outcome[steps < max_steps] = "scheduler stop"
    outcome[ended] = RUN_ENDED
    outcome[objective] = "objective stop"
    outcome[df["state"] == "FAIL"] = "failed"
    outcome[df["state"] == "RUNNING"] = "running"
    outcome[stopped] = "health stop"
    # not stopped yet; an error lost its steps, it saved none; a run that ended had none left
    missing[outcome.isin(["running", "failed", RUN_ENDED])] = 0
    rerun = rerun_steps(df).astype(float)
    if by == "outcome":
        group, order = outcome, _OUTCOMES
    else:
        rules = _text(df, "stop_reason").str.extract(_RULE, expand=False).fillna("")
        health_group = "health: " + rules.where(rules != "", kind.where(kind != "", "stopped"))
        group = outcome.map({"objective stop": "objective stopper", "scheduler stop": "scheduler"}).fillna(outcome)
        reason = _text(df, "stop_reason")
        for start, stopper in _OBJECTIVE_STOPPERS.items():
            group[objective & reason.str.startswith(start)] = stopper
        group[stopped] = health_group[stopped]
        order = sorted(g for g in set(group) if g.startswith("health: ")) + _LAST
    table = pd.DataFrame({
        by: group, "trials": 1, "steps_used": steps + rerun, "steps_saved": missing,
        "wall_h_used": (wall + rerun * per_step) / 3600, "wall_h_saved": missing * per_step / 3600,
    })
    table["gpu_h_used"] = table["wall_h_used"] * gpu
    table["gpu_h_saved"] = table["wall_h_saved"] * gpu
    grouped = table.groupby(by).sum(numeric_only=True).reindex([g for g in order if g in set(group)])
    grouped.loc["total"] = grouped.sum()
    total = grouped.loc["total"]
    grouped.insert(3, "saved_share", _share(grouped["steps_saved"], total["steps_used"] + total["steps_saved"]))
    grouped["gpu_h_saved_share"] = _share(grouped["gpu_h_saved"], total["gpu_h_used"] + total["gpu_h_saved"])
    grouped["steps_rerun"] = rerun.groupby(group).sum().reindex(grouped.index[:-1]).tolist() + [rerun.sum()]
    for column in ("trials", "steps_used", "steps_saved", "steps_rerun"):
        grouped[column] = grouped[column].astype(int)
    return grouped.reset_index().rename(columns={"index": by})


def schedules(df: pd.DataFrame) -> pd.Series:
    """Each trial's remedies as a list of ``{"restart", "step", "rule", "from_step", "key", "old",
    "new"}`` (:func:`klsweep.results.remedy_records` of trials.csv's ``remedies`` column; empty when none)."""
    if "remedies" not in df:
        return pd.Series([[] for _ in df.index], index=df.index, dtype=object)
    return df["remedies"].map(remedy_records)


def rerun_steps(df: pd.DataFrame) -> pd.Series:
    """Steps each trial ran again because a remedy restarted it, as integers indexed as ``df``.

    Per restart: the step the remedy was decided at less its checkpoint's step (``step − from_step``).
    0 for a trial never restarted."""

    def rerun(remedies: list[dict[str, Any]]) -> int:
        return sum(r.step - r.from_step for r in restarts(remedies))

    return schedules(df).map(rerun).astype(int)


def remedy_outcomes(df: pd.DataFrame) -> pd.DataFrame:
    """Per health rule, what its findings came to when the sweep remedies.

    Args:
        df: the trials table (:func:`klsweep.analysis.sweep_dir.load`: ``state``, ``health``, ``stop_reason``,
            ``remedies``).

    Returns:
        One row per rule that fired (named in a remedy or in a health stop's reason, ``_RULE``), sorted by name:
        ``rule``; ``flagged`` (trials the rule fired on: remedied for it, or stopped by it); ``remedied`` (trials
        restarted for it at least once); ``rescued`` (of those, the ones that ended feasible:
        :func:`klsweep.analysis.pareto.feasible`, COMPLETE and not stopped); ``stopped_at_cap`` (stopped by it with
        its ``max_remedies`` used up); ``stopped_unremedied`` (stopped by it for another reason: no checkpoint
        before the finding, a knob without effect, remedies off). Empty (those columns) when no rule fired.
    """
    columns = ["rule", "flagged", "remedied", "rescued", "stopped_at_cap", "stopped_unremedied"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    ok = feasible(df)
    reason = _text(df, "stop_reason")
    stopped_by = reason.str.extract(_RULE, expand=False).where(_text(df, "health") == "stopped")
    at_cap = reason.str.contains("not remedied: max_remedies", regex=False)
    remedied_for = schedules(df).map(lambda rs: {r["rule"] for r in rs})
    rules = sorted(set().union(*remedied_for, set(stopped_by.dropna())))
    rows = []
    for rule in rules:
        remedied = remedied_for.map(lambda names: rule in names).astype(bool)
        stopped = stopped_by == rule
        rows.append([rule, int((remedied | stopped).sum()), int(remedied.sum()), int((remedied & ok).sum()),
                     int((stopped & at_cap).sum()), int((stopped & ~at_cap).sum())])
    return pd.DataFrame(rows, columns=columns)


def _step_rate(df: pd.DataFrame, wall: pd.Series, steps: pd.Series) -> pd.Series:
    """Seconds per step of each trial: ``step_s`` (a column, else ``df.attrs``), else the median ``step_s`` of the
    others, else ``wall / steps`` (0 for a trial without a step or a wall time)."""
    timed = (wall > 0) & (steps > 0)
    rate = (wall / steps).where(timed, 0.0)
    if "step_s" in df:
        own = pd.to_numeric(df["step_s"], errors="coerce")
    elif "trial_id" in df and df.attrs.get(STEP_SECONDS):
        own = pd.to_numeric(df["trial_id"].astype(str).map(df.attrs[STEP_SECONDS]), errors="coerce")
    else:
        return rate
    own = own.where(own > 0)
    if own.notna().any():
        rate = rate.where(~timed, own.median())
    return own.fillna(rate)


def _column(df: pd.DataFrame, name: str, fill: float) -> pd.Series:
    if name not in df:
        return pd.Series(fill, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").fillna(fill).astype(float)


def _text(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df:
        return pd.Series("", index=df.index, dtype=object)
    return df[name].where(df[name].notna(), "").astype(str)


def _share(part: pd.Series, whole: float) -> pd.Series:
    return part / whole if whole > 0 else part * 0.0
