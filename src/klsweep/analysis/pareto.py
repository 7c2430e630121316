"""Pareto fronts and hypervolume of a sweep's trials table (:func:`klsweep.analysis.sweep_dir.load`).

The non-dominated sort and the hypervolume are Optuna's own: ``optuna.study._multi_objective._is_pareto_front``
(behind ``Study.best_trials``) and ``optuna._hypervolume.compute_hypervolume`` (exact WFG). This module turns table
columns and directions into Optuna's minimisation convention, and decides which trials are feasible.

Feasible = Optuna state COMPLETE and health verdict not ``stopped`` (the health constraint of
:data:`klsweep.results.CONSTRAINTS_ATTR`). When no trial is feasible the front is empty, a
:class:`EmptyFrontWarning` says so and :func:`least_infeasible` ranks the trials that came closest (optuna#6445).

KL comparability: ``actor/kl_loss`` is aggregated with the run's ``actor.loss_agg_mode`` and computed with
``actor.kl_loss_type`` (``verl.trainer.ppo.core_algos.agg_loss`` and ``kl_penalty``); ``actor/reward_kl_penalty``
with ``algorithm.kl_penalty`` as a per-sequence token mean (``apply_kl_penalty`` in
``verl/trainer/ppo/ray_trainer.py``). Trials that differ there measure KL on different scales; the front names the KL
it uses (:func:`kl_scale`) and warns when it mixes scales or was chosen among trials on several.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from klsweep.errors import ResultsError
from klsweep.results import REMEDIED
from klsweep.verl.metrics import KlSetup, base_estimator

#: verl 0.9.1 default of ``actor_rollout_ref.actor.loss_agg_mode`` (verl/trainer/config/actor/actor.yaml).
DEFAULT_LOSS_AGG_MODE = "token-mean"
#: Estimator names verl computes identically (``core_algos.kl_penalty``: ``kl``/``k1``, ``mse``/``k2``,
#: ``low_var_kl``/``k3``).
_SAME_ESTIMATOR = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
#: Aggregations on one scale, named by the first: token-mean and seq-mean-token-mean are both per-token means
#: (verl core_algos.agg_loss), as ``sweep validate`` says (klsweep.spec.checks).
SAME_AGGREGATION = {"seq-mean-token-mean": "token-mean"}

Objectives = Sequence[tuple[str, str]] | Mapping[str, str]


class EmptyFrontWarning(UserWarning):
    """No trial is feasible, so the Pareto front is empty (see :func:`least_infeasible`)."""


class KlScaleWarning(UserWarning):
    """The trials compared measure KL on different scales (estimator, aggregation or mechanism differ)."""


def feasible(df: pd.DataFrame) -> pd.Series:
    """Boolean Series: the trial is COMPLETE and its health verdict is not ``stopped``."""
    health = df["health"] if "health" in df else pd.Series("healthy", index=df.index)
    return (df["state"] == "COMPLETE") & (health.fillna("healthy") != "stopped")


def remedied_trials(df: pd.DataFrame) -> pd.Series:
    """Boolean Series: the trial is a remedied one that ended, a restart schedule that ran to its end (its stop
    reason starts with :data:`klsweep.results.REMEDIED`; PRUNED in the study, so that no schedule is called a
    setting). Such a trial is not feasible and not stopped by a health rule."""
    reasons = df["stop_reason"].fillna("").astype(str) if "stop_reason" in df else pd.Series("", index=df.index)
    state = df["state"] if "state" in df else pd.Series("", index=df.index)
    return reasons.str.startswith(REMEDIED) & (state != "RUNNING")


def objective_columns(df: pd.DataFrame, objectives: Objectives) -> list[tuple[str, str]]:
    """``[(column, "min"|"max")]`` for objectives given as ``[(name, mode)]`` or ``{name: mode}``.

    A name is a column of ``df`` or a metric, read from ``value/<metric>`` (the value told to Optuna) or else
    ``last/<metric>`` (e.g. ``ref_kl`` → ``last/ref_kl``).

    Raises:
        ResultsError: a mode other than min/max, or a name with none of those columns (the message lists them).
    """
    items = list(objectives.items()) if isinstance(objectives, Mapping) else [tuple(o) for o in objectives]
    if not items:
        raise ResultsError("objectives is empty: give at least one (name, 'min'|'max') pair")
    out = []
    for name, mode in items:
        if mode not in ("min", "max"):
            raise ResultsError(f"objective {name!r} has mode {mode!r}: use 'min' or 'max'")
        column = next((c for c in (name, f"value/{name}", f"last/{name}") if c in df.columns), None)
        if column is None:
            metrics = sorted(c for c in df.columns if c.startswith(("value/", "last/", "best/", "max/", "min/")))
            raise ResultsError(
                f"objective {name!r} is not in the trials table: no column {name!r}, 'value/{name}' or 'last/{name}'; "
                f"columns with metrics are {', '.join(metrics) or 'none'}"
            )
        out.append((column, mode))
    return out


def _losses(df: pd.DataFrame, columns: list[tuple[str, str]]) -> np.ndarray:
    """Objective values in Optuna's minimisation convention, shape (trials, objectives)."""
    signs = np.array([-1.0 if mode == "max" else 1.0 for _, mode in columns])
    return df[[c for c, _ in columns]].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float) * signs


def pareto_front(df: pd.DataFrame, objectives: Objectives) -> pd.DataFrame:
    """The non-dominated feasible search trials for any number of objectives, as rows of ``df``, in ``df``'s order.

    A confirmation re-run (a row with ``confirm_of``) is another seed of a search trial's config, not a config of its
    own: it is left out, as ``sweep status`` and the report leave it out (their confirmation table ranks the means).

    Args:
        df: the trials table (:func:`klsweep.analysis.sweep_dir.load`; needs ``state`` and, when present, ``health``).
        objectives: ``[(name, "min"|"max"), ...]`` or ``{name: mode}``; see :func:`objective_columns`.

    Returns:
        The front (trials with every objective finite; duplicates of a front point are all kept, as Optuna does).
        ``attrs``: ``objectives`` (the columns used), ``feasible`` (whether any trial was feasible), ``kl_scale``
        (the KL scales on the front, :func:`kl_scale`), ``notes`` (the warnings issued, as text).

    Warns:
        EmptyFrontWarning: no trial is feasible; ``attrs["least_infeasible"]`` lists trial numbers in
            :func:`least_infeasible` order.
        KlScaleWarning: the front mixes KL scales, or the feasible trials it was chosen from do (the warning
            names each scale and its trials; compare like with like).

    Raises:
        ResultsError: see :func:`objective_columns`.
    """
    from optuna.study._multi_objective import _is_pareto_front

    if "confirm_of" in df:
        df = df[df["confirm_of"].isna()]
    columns = objective_columns(df, objectives)
    candidates = df[feasible(df)] if len(df) else df
    losses = _losses(candidates, columns)
    finite = np.isfinite(losses).all(axis=1) if len(candidates) else np.zeros(0, bool)
    candidates, losses = candidates[finite], losses[finite]
    on_front = _is_pareto_front(losses, assume_unique_lexsorted=False) if len(candidates) else np.zeros(0, bool)
    front = candidates[on_front].copy()
    notes = []
    front.attrs = {"objectives": columns, "feasible": bool(len(candidates)), "kl_scale": [], "notes": notes}
    if front.empty:
        ranked = least_infeasible(df)
        front.attrs["least_infeasible"] = [int(n) for n in ranked["number"]] if "number" in ranked else []
        remedied, n = int(remedied_trials(df).sum()), len(df)
        schedules = "ran to the end as remedied restart schedules, not one setting each"
        who = (f"all {n} trials {schedules}" if remedied == n else
               f"{remedied} of the {n} trials {schedules}; the others were" if remedied else f"all {n} trials were")
        stopped = "" if remedied == n else (" stopped by a health rule, pruned, failed or did not report "
                                            f"{', '.join(c for c, _ in columns)}")
        notes.append(
            f"no feasible trial: {who}{stopped}; the Pareto front is empty. Least infeasible (most steps survived): "
            + (", ".join(f"trial {n}" for n in front.attrs["least_infeasible"][:5]) or "none")
        )
        warnings.warn(notes[-1], EmptyFrontWarning, stacklevel=2)
        return front
    scales = sorted(set(kl_scale(front)))
    front.attrs["kl_scale"] = scales
    compared = kl_scale(candidates).value_counts()
    if len(scales) > 1:
        notes.append(
            f"the front mixes KL scales ({'; '.join(scales)}): KL values of trials with a different estimator, "
            "loss_agg_mode or KL mechanism are not comparable. Compare within one scale (filter the table by "
            "config/actor_rollout_ref.actor.kl_loss_type and loss_agg_mode) before trading reward against KL."
        )
        warnings.warn(notes[-1], KlScaleWarning, stacklevel=2)
    elif len(compared) > 1:
        notes.append(
            "the trials compared mix KL scales ("
            + "; ".join(f"{scale}: {n} trial{'s' if n > 1 else ''}" for scale, n in sorted(compared.items()))
            + f"): the front holds only {scales[0]}, but its trials were ranked against KL values on other scales "
            "(a token-sum is hundreds of times a token-mean), so which of them are dominated means little. Compare "
            "within one scale (filter the table by config/actor_rollout_ref.actor.kl_loss_type and loss_agg_mode)."
        )
        warnings.warn(notes[-1], KlScaleWarning, stacklevel=2)
    return front


def least_infeasible(df: pd.DataFrame) -> pd.DataFrame:
    """Infeasible trials ranked from the closest to feasible.

    The order is: most training steps survived first; then COMPLETE before PRUNED before FAIL; then trial number.
    An infeasible COMPLETE trial was stopped by a health rule after reporting every objective.

    Returns:
        The infeasible rows of ``df`` in that order, with a column ``infeasible_rank`` (1 = least infeasible).
    """
    out = df[~feasible(df)].copy() if len(df) else df.copy()
    state_order = {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2}
    steps = pd.to_numeric(out["steps"], errors="coerce").fillna(0) if "steps" in out else pd.Series(0, index=out.index)
    key = pd.DataFrame({"steps": -steps, "state": out["state"].map(state_order).fillna(3),
                        "number": out["number"] if "number" in out else range(len(out))}, index=out.index)
    out = out.loc[key.sort_values(["steps", "state", "number"]).index]
    out["infeasible_rank"] = range(1, len(out) + 1)
    return out


def hypervolume(df: pd.DataFrame, objectives: Objectives, reference_point: Sequence[float]) -> float:
    """Hypervolume dominated by the feasible trials of ``df`` and bounded by ``reference_point``.

    Args:
        reference_point: one value per objective, in the objectives' own units and directions (for a ``max``
            objective a value below every trial's, for ``min`` one above). Trials not strictly better than the
            reference point in every objective contribute nothing.

    Returns:
        The hypervolume in the product of the objectives' units; 0.0 when no feasible trial beats the reference.
        Computed by Optuna's exact ``compute_hypervolume`` (WFG algorithm; While et al. 2012) on the
        minimisation form (max objectives negated).

    Raises:
        ResultsError: the reference point's length differs from the number of objectives; see also
            :func:`objective_columns`.
    """
    from optuna._hypervolume import compute_hypervolume

    columns = objective_columns(df, objectives)
    if len(reference_point) != len(columns):
        raise ResultsError(
            f"reference_point has {len(reference_point)} values but there are {len(columns)} objectives "
            f"({', '.join(c for c, _ in columns)}): give one value per objective"
        )
    signs = np.array([-1.0 if mode == "max" else 1.0 for _, mode in columns])
    reference = np.asarray(reference_point, dtype=float) * signs
    losses = _losses(df[feasible(df)], columns) if len(df) else np.zeros((0, len(columns)))
    losses = losses[np.isfinite(losses).all(axis=1) & (losses < reference).all(axis=1)]
    if not len(losses):
        return 0.0
    return float(compute_hypervolume(losses, reference))


def kl_scale(df: pd.DataFrame) -> pd.Series:
    """The scale each trial's reference KL is measured on, as text, e.g.
    ``"actor/kl_loss (low_var_kl, token-mean)"`` or ``"actor/reward_kl_penalty (kl, per-sequence token mean)"``.

    Read from the trial's ``config/`` columns (missing keys: verl 0.9.1 defaults) and ``kl_metric``. Estimator
    synonyms (k1/kl, k2/mse, k3/low_var_kl) and straight-through ``+`` variants share a scale, and so do the
    per-token means ``token-mean`` and ``seq-mean-token-mean`` (named ``token-mean``, :data:`SAME_AGGREGATION`). With
    ``seq-mean-token-sum-norm`` a set ``actor.loss_scale_factor`` is part of the scale.
    """
    prefix = "config/"
    config_cols = [c for c in df.columns if c.startswith(prefix)]

    def one(row: pd.Series) -> str:
        overrides = {c[len(prefix):]: row[c] for c in config_cols if _present(row[c])}
        setup = KlSetup.from_overrides(overrides or {"algorithm.use_kl_in_reward": False})
        metric = row.get("kl_metric") if isinstance(row.get("kl_metric"), str) else None
        in_loss = metric == "actor/kl_loss" if metric else setup.kl_in_loss
        if in_loss:
            agg = overrides.get("actor_rollout_ref.actor.loss_agg_mode", DEFAULT_LOSS_AGG_MODE)
            agg = SAME_AGGREGATION.get(agg, agg)
            factor = overrides.get("actor_rollout_ref.actor.loss_scale_factor")
            if agg == "seq-mean-token-sum-norm" and factor is not None:
                agg = f"{agg}, loss_scale_factor={factor}"
            return f"actor/kl_loss ({_estimator(setup.loss_estimator)}, {agg})"
        if metric or setup.kl_in_reward:
            metric = metric or "actor/reward_kl_penalty"
            return f"{metric} ({_estimator(setup.reward_estimator)}, per-sequence token mean)"
        return "no reference KL"

    return df.apply(one, axis=1) if len(df) else pd.Series(dtype=str)


def _estimator(name: str | None) -> str:
    base = base_estimator(name) or "?"
    return _SAME_ESTIMATOR.get(base, base)


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value))
