"""What each figure of a sweep shows, as plain data: the Pareto front, importance, knobs and tables.

One function per figure, drawn by two renderers: :mod:`klsweep.analysis.plots` with plotly (``report.html``, the
notebook) and :mod:`klsweep.analysis.pngs` with matplotlib (the report's PNGs). Every choice of what is shown is made
here once, so the two agree. The curves' data is in :mod:`klsweep.analysis.curves`, the KL frontier's in
:mod:`klsweep.analysis.frontier_figure`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
import pandas as pd

from klsweep.analysis.accounting import schedules
from klsweep.analysis.pareto import (
    DEFAULT_LOSS_AGG_MODE,
    feasible,
    kl_scale,
    least_infeasible,
    objective_columns,
    pareto_front,
)
from klsweep.results import restarts
from klsweep.verl.metrics import KlSetup

if TYPE_CHECKING:
    from klsweep.analysis.pareto import Objectives

AGG = "config/actor_rollout_ref.actor.loss_agg_mode"
#: COMPLETE trials from which Optuna's default importance is stable: PED-ANOVA (``target_quantile=0.1``) "prefers at
#: least 5 trials above target_quantile" (optuna/importance/_ped_anova/evaluator.py, Optuna 5), i.e. 5 / 0.1.
STABLE_IMPORTANCE_TRIALS = 50
@dataclass
class Points:
    """One series of trials on the front plot: ``x``, ``y``, and per point its hover text and label."""

    name: str
    x: list[float]
    y: list[float]
    hover: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


@dataclass
class FrontData:
    """The Pareto front plot (:func:`front_data`)."""

    x: str
    x_mode: str  # "" when x is the trial number (a single objective without a reference KL)
    y: str
    y_mode: str
    infeasible: Points | None  # grey, at their last reported values
    groups: list[Points]  # feasible trials, one series per way KL acts
    front: Points | None  # the front, in x order; None when it is empty
    least_infeasible: Points | None  # with an empty front: the closest trials, labelled ``#rank``
    scales: list[str]  # the KL scales of every trial drawn (the notes warn when feasible ones differ)
    notes: list[str]  # the notes of :func:`klsweep.analysis.pareto.pareto_front`
    remedied: Points | None = None  # trials a health rule's remedy restarted, labelled ``R<restarts>``

    @property
    def title(self) -> str:
        if self.x_mode:
            return f"Pareto front: {self.y} ({self.y_mode}) vs {self.x} ({self.x_mode})"
        return f"Best trials: {self.y} ({self.y_mode})"


@dataclass
class ImportanceData:
    """Parameter importance per objective (:func:`importance_data`); ``message`` says why there is none."""

    bars: list[tuple[str, dict[str, float]]]  # (objective, {parameter: importance}), most important first
    message: str | None = None
    title: str = "Parameter importance (Optuna, COMPLETE trials)"
    note: str | None = None  # a caveat shown under the title (too few trials for a stable ranking)


@dataclass
class Axis:
    """One axis of the parallel-coordinates plot; categorical knobs are their category index, named by ticktext."""

    label: str
    values: list[float]
    tickvals: list[int] | None = None
    ticktext: list[str] | None = None


@dataclass
class KnobsData:
    """Parallel coordinates of the varying knobs (:func:`knobs_data`); the last axis is the objective."""

    axes: list[Axis]
    title: str
    message: str | None = None


@dataclass
class SliceData:
    """Optuna's slice plot of one objective (Optuna prepares its data for both of its renderers)."""

    study: Any
    objective: int = 0
    target_name: str | None = None


@dataclass
class TableData:
    """A table, cells as text (:func:`table_data`)."""

    columns: list[str]
    rows: list[list[str]]
    title: str


def _label(row: pd.Series) -> str:
    """Colour group of a trial: how its KL acts. KL in the loss: ``kl_loss_type / loss_agg_mode``; KL in the
    reward: ``kl_penalty=<estimator> (in reward)``; ``no KL`` when neither mechanism is on (verl 0.9.1 defaults for
    keys the trial does not set)."""
    overrides = {c[len("config/"):]: row[c] for c in row.index if c.startswith("config/") and _shown(row[c])}
    setup = KlSetup.from_overrides(overrides or {"algorithm.use_kl_in_reward": False})
    parts = []
    if setup.kl_in_loss:
        parts.append(f"{setup.loss_estimator} / {overrides.get(AGG[len('config/'):], DEFAULT_LOSS_AGG_MODE)}")
    if setup.kl_in_reward:
        parts.append(f"kl_penalty={setup.reward_estimator} (in reward)")
    return " + ".join(parts) or "no KL"


def _hover(row: pd.Series, columns: list[str]) -> str:
    knobs = [f"{c[len('config/'):]}={row[c]}" for c in row.index if c.startswith("config/") and _shown(row[c])]
    lines = [f"trial {row.get('number')} ({row.get('state')}, {row.get('health')})"]
    lines += [f"{c} = {row[c]:.4g}" for c in columns if isinstance(row.get(c), (int, float))]
    if isinstance(row.get("stop_reason"), str) and row["stop_reason"]:
        lines.append(f"stop: {row['stop_reason']}")
    return "<br>".join(lines + knobs[:8])


def _shown(v: Any) -> bool:
    return not (v is None or (isinstance(v, float) and pd.isna(v)))


def front_objectives(df: pd.DataFrame, objectives: Objectives) -> list[tuple[str, str]]:
    """The objectives a front is computed on, as ``[(column, mode)]``; the first two are the plot's y and x axes.

    With two or more objectives: all of them. With one: that objective and the last reference KL (``last/ref_kl``,
    minimised), the trade-off every KL sweep is about, when every feasible trial logged a reference KL; otherwise
    (e.g. DrGRPO trials, which have no KL to the reference) the one objective alone, plotted against trial number.
    """
    columns = objective_columns(df, objectives)
    if len(columns) >= 2:
        return columns
    ok = feasible(df) if len(df) else pd.Series(dtype=bool)
    kl = pd.to_numeric(df["last/ref_kl"], errors="coerce")[ok] if "last/ref_kl" in df else pd.Series(dtype=float)
    if len(kl) and kl.notna().all():
        return [columns[0], ("last/ref_kl", "min")]
    return columns


def front_data(df: pd.DataFrame, objectives: Objectives, front: pd.DataFrame | None = None) -> FrontData:
    """Every trial as a point (y: first objective, x: second, see :func:`front_objectives`).

    Feasible trials are grouped by how KL acts (``kl_loss_type / loss_agg_mode``, or ``kl_penalty`` in the reward).
    Infeasible ones are kept apart, at their last reported values. The front is in x order.
    With no feasible trial, the five least infeasible carry their rank instead.
    Trials a health rule's remedy restarted also form their own series, ``remedied (n)``, labelled ``R<restarts>``.
    Their values are those of their last run; the hover names the schedule.
    """
    axes = front_objectives(df, objectives)
    (y, y_mode), (x, x_mode) = axes[0], (axes[1] if len(axes) > 1 else ("number", ""))
    if front is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            front = pareto_front(df, axes)
    xs, ys = _plotted(df, x), _plotted(df, y)
    ok = feasible(df) if len(df) else pd.Series(dtype=bool)

    def points(name: str, rows: pd.DataFrame, **extra: Any) -> Points:
        return Points(name, xs[rows.index].tolist(), ys[rows.index].tolist(),
                      [_hover(r, [x, y]) for _, r in rows.iterrows()], **extra)

    bad = df[~ok]
    good = df[ok]
    groups = [points(str(label), group) for label, group in
              good.groupby(good.apply(_label, axis=1) if len(good) else [], sort=True)]
    best = least = None
    if len(front):
        order = front.index[xs[front.index].argsort()]
        best = Points(f"Pareto front ({len(front)})", xs[order].tolist(), ys[order].tolist())
    else:
        ranked = least_infeasible(df).head(5)
        least = points("least infeasible (rank)", ranked, text=[f"#{r}" for r in ranked["infeasible_rank"]])
    schedule = schedules(df)
    fixed = df[schedule.map(len) > 0]
    counts = schedule[fixed.index].map(lambda rs: len(restarts(rs)))
    remedied = Points(f"remedied ({len(fixed)})", xs[fixed.index].tolist(), ys[fixed.index].tolist(),
                      [f"{_hover(r, [x, y])}<br>remedied: {_schedule_text(schedule[i])}" for i, r in fixed.iterrows()],
                      [f"R{n}" for n in counts])
    return FrontData(
        x=x, x_mode=x_mode, y=y, y_mode=y_mode, remedied=remedied if len(fixed) else None,
        infeasible=points("infeasible (stopped, pruned or failed)", bad) if len(bad) else None,
        groups=groups, front=best, least_infeasible=least,
        scales=sorted(set(kl_scale(df))),
        notes=list(front.attrs.get("notes", [])),
    )


def _schedule_text(remedies: list[dict[str, Any]]) -> str:
    """``"kl_runaway at step 47 → from step 32, algorithm.kl_ctrl.kl_coef 0.002 → 0.003"``, one per restart."""
    return "; ".join(f"{r.rule} at step {r.step} → from step {r.from_step}, "
                     + ", ".join(f"{key} {old:.4g} → {new:.4g}" for key, (old, new) in r.changes.items())
                     for r in restarts(remedies))


def _plotted(df: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers; a ``value/`` column (told to Optuna, empty for PRUNED/FAIL trials) falls back to the
    trial's ``last/`` value so that infeasible trials can still be drawn."""
    values = pd.to_numeric(df[column], errors="coerce") if column in df else pd.Series(float("nan"), index=df.index)
    last = column.replace("value/", "last/", 1)
    if last != column and last in df:
        values = values.fillna(pd.to_numeric(df[last], errors="coerce"))
    return values


def importance_data(study: optuna.Study, objectives: Sequence[Mapping[str, str]] | None = None) -> ImportanceData:
    """Parameter importance for each objective: Optuna's default evaluator
    (``optuna.importance.get_param_importances``, PED-ANOVA in Optuna 5) on the study's COMPLETE trials.

    With fewer than two COMPLETE trials (or when Optuna cannot evaluate, e.g. no parameter varies) ``message`` says
    why instead. With fewer than :data:`STABLE_IMPORTANCE_TRIALS` ``note`` says the ranking is a hint at most.
    """
    names = [o["metric"] for o in objectives] if objectives else [f"objective {i}" for i in
                                                                   range(len(study.directions))]
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        return ImportanceData([], f"parameter importance needs at least 2 COMPLETE trials; this study has "
                                  f"{len(complete)}")
    bars = []
    for i, name in enumerate(names):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importances = optuna.importance.get_param_importances(
                    study, target=(lambda t, i=i: t.values[i]) if len(names) > 1 else None)
        except (ValueError, RuntimeError) as e:
            return ImportanceData([], f"Optuna could not evaluate importance: {e}")
        if not importances:
            return ImportanceData([], "no searched parameter varies across the COMPLETE trials")
        bars.append((name, dict(importances)))
    note = None
    if len(complete) < STABLE_IMPORTANCE_TRIALS:
        note = (f"{len(complete)} COMPLETE trials are too few for a stable ranking (PED-ANOVA wants 5 trials in its "
                f"top 10 %: {STABLE_IMPORTANCE_TRIALS} trials); read it as a hint at most")
    return ImportanceData(bars, title=f"Parameter importance (Optuna, {len(complete)} COMPLETE trials)", note=note)


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """The ``config/`` columns whose value differs between trials (list values such as ``trainer.logger`` compared
    as text)."""
    return [c for c in df.columns if c.startswith("config/") and df[c].dropna().astype(str).nunique() > 1]


def knobs_data(df: pd.DataFrame, objectives: Objectives) -> KnobsData:
    """Parallel coordinates of the KL knobs that vary across trials against the first objective (categorical knobs
    as their category index, named on the axis)."""
    (y, _) = objective_columns(df, objectives)[0]
    axes = []
    for c in varying_knobs(df):
        values = df[c]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            axes.append(Axis(_short(c), values.tolist()))
        else:
            cats = sorted(values.dropna().astype(str).unique())
            axes.append(Axis(_short(c), values.astype(str).map(cats.index).tolist(), list(range(len(cats))), cats))
    title = f"KL knobs vs {y} (all trials)"
    if not axes:
        return KnobsData([], title, "no searched knob varies across trials")
    return KnobsData([*axes, Axis(y, _plotted(df, y).tolist())], title)


def table_data(table: pd.DataFrame, title: str) -> TableData:
    """A table with its cells as text (floats to 4 significant digits, missing values empty)."""
    return TableData([str(c) for c in table.columns],
                     [[_cell(v) for v in row] for row in table.itertuples(index=False)], title)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "" if pd.isna(v) else f"{v:.4g}"
    return "" if v is None else str(v)


def _short(column: str) -> str:
    return column.removeprefix("config/").replace("actor_rollout_ref.", "")
