"""What each figure of a sweep shows, as plain data: one function per figure, drawn by two renderers.

:mod:`klsweep.analysis.plots` draws these with plotly (the interactive figures of ``report.html`` and the notebook),
:mod:`klsweep.analysis.pngs` with matplotlib (the report's PNGs, no browser needed). Every choice of what is shown
(which trials, colour groups, the front, thresholds, axis ranges, titles) is made here once, so the two agree.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.colors

from klsweep.analysis.frontier import RESPONSE_LENGTH, SweepFrontier
from klsweep.analysis.frontier_fit import FORM_NAMES, attainment_surface
from klsweep.analysis.pareto import (
    DEFAULT_LOSS_AGG_MODE,
    Objectives,
    feasible,
    kl_scale,
    least_infeasible,
    objective_columns,
    pareto_front,
)
from klsweep.results import restarts
from klsweep.verl.metrics import ALIASES, KlSetup

AGG = "config/actor_rollout_ref.actor.loss_agg_mode"
#: The three panels of :func:`curves_data`: alias (klsweep.verl.metrics.ALIASES) and axis title.
CURVES = (("ref_kl", "reference KL"), ("entropy", "actor/entropy"), ("score", "critic/score/mean"))
#: COMPLETE trials from which Optuna's default importance is stable: PED-ANOVA (``target_quantile=0.1``) "prefers at
#: least 5 trials above target_quantile" (optuna/importance/_ped_anova/evaluator.py, Optuna 5), i.e. 5 / 0.1.
STABLE_IMPORTANCE_TRIALS = 50
#: Trial colours of the curves, in order (plotly's default qualitative palette, hex).
PALETTE: tuple[str, ...] = tuple(plotly.colors.qualitative.Plotly)
#: Line styles (plotly's ``dash`` names) of the curves: trial ``i`` is drawn in colour ``i % 10`` and style
#: ``i // 10 % 4``, so 40 trials have 40 distinct colour-and-style pairs (colour alone repeated from the 11th trial).
DASHES: tuple[str, ...] = ("solid", "dash", "dot", "dashdot")


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
    remedied: Points | None = None  # trials a health rule's remedy restarted (issue 17), labelled ``R<restarts>``

    @property
    def title(self) -> str:
        if self.x_mode:
            return f"Pareto front: {self.y} ({self.y_mode}) vs {self.x} ({self.x_mode})"
        return f"Best trials: {self.y} ({self.y_mode})"


@dataclass
class Line:
    """One trial's curve of one metric."""

    name: str
    color: str
    metric: str
    steps: list[float]
    values: list[float]
    stop_reason: str | None  # set when a health rule stopped the trial (its last point is marked)
    dash: str = "solid"  # one of :data:`DASHES`


@dataclass
class Panel:
    alias: str
    title: str
    lines: list[Line]
    bands: list[dict[str, Any]]  # :func:`thresholds` of this panel
    ylim: tuple[float, float]
    baseline: float | None = None  # the reference policy's value of this metric (a dotted line), when known


@dataclass
class CurvesData:
    """Per-trial curves: one panel per objective that no entry of :data:`CURVES` shows, then one per entry
    (:func:`curves_data`)."""

    panels: list[Panel]
    title: str


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


@dataclass
class FrontierData:
    """The KL frontier of a sweep (:func:`frontier_data`): x is the per-sequence KL in nats, y the fitted score.

    ``curves``: ``(name, x, y, dashed)`` per Gao form, the best (solid) first; ``kl_star``: ``(KL*, low, high)`` of
    the best form when finite (the interval drawn as a band, its ends capped at ``x_max``, the axis end);
    ``peak``: ``(KL*, score)`` when the peak lies on the axis; ``surfaces``: the 25/50/75 % attainment surfaces
    (staircases) over training seeds.
    ``message`` is set (and nothing else drawn) when no trial has a point to draw.
    """

    title: str
    x_label: str
    y_label: str
    feasible: Points | None
    stopped: Points | None
    curves: list[tuple[str, list[float], list[float], bool]]
    reference: float | None
    kl_star: tuple[float, float, float] | None
    peak: tuple[float, float] | None
    surfaces: list[Points]
    notes: list[str]
    x_max: float
    message: str | None = None


#: Attainment levels drawn when a config ran with several training seeds (Fonseca et al. 2001).
ATTAINMENT_LEVELS = (0.25, 0.5, 0.75)


def frontier_data(result: SweepFrontier, points: int = 200) -> FrontierData:
    """What the KL frontier figure shows, from :func:`klsweep.analysis.frontier.sweep_frontier`.

    Feasible trials are the fitted points; stopped (infeasible) ones are drawn apart, hover naming their reason, and
    never fitted (the fit is on the paths, :attr:`~klsweep.analysis.frontier.SweepFrontier.paths`; the notes say how
    many steps). Both Gao forms are drawn on ``points`` KL values from 0 to the axis end (1.3 × the largest KL
    drawn, or 1.1 × KL* when the peak lies a little beyond, up to 3 × the largest KL), with the reference score at
    ``d = 0``, KL* with its interval as a band and the peak. The x axis is per-sequence KL: verl logs KL per token
    and klsweep multiplies it by the trial's mean response length (``response_length/mean``).
    """
    title = f"KL frontier: {result.score_metric or 'no score'} vs per-sequence KL"
    x_label = f"per-sequence KL to the reference policy (nats) = verl's per-token KL × {RESPONSE_LENGTH}"
    fitted, stopped = result.points, result.stopped
    notes = [f"score: {result.score_source}"]
    if result.reference_source:
        notes.append(f"score at d = 0: {result.reference_source}")
    notes.append(result.summary())
    if result.frontier is not None:
        running = f", {result.running} of them running" if result.running else ""
        notes.append(f"fitted on {result.frontier.n_points} validation steps of {result.frontier.n} trials{running} "
                     "(each trial's path; the points drawn are the finished trials' last steps)")
    if result.negative:
        notes.append(f"{result.negative} validation steps with a KL below 0 (a per-token k1 estimate's noise) left "
                     "out of the fit")
    kls = [*(fitted["kl_seq"] if len(fitted) else []), *(stopped["kl_seq"] if len(stopped) else [])]
    if not kls:
        return FrontierData(title, x_label, "", None, None, [], None, None, None, [], notes, 1.0,
                            message=result.reason or "no trial to draw")
    reach = max(kls) or 1.0
    f = result.frontier
    x_max = 1.3 * reach
    if f is not None and reach < f.best.kl_star <= 3 * reach:
        x_max = 1.1 * f.best.kl_star
    feasible_points = (Points(f"feasible trials ({len(fitted)})", fitted["kl_seq"].tolist(), fitted["score"].tolist(),
                              fitted["hover"].tolist()) if len(fitted) else None)
    stopped_points = (Points(f"stopped or failed, not fitted ({len(stopped)})", stopped["kl_seq"].tolist(),
                             stopped["score"].tolist(),
                             [f"{h}<br>stopped: {r}" for h, r in zip(stopped["hover"], stopped["reason"])])
                      if len(stopped) else None)
    curves, kl_star, peak_point, reference = [], None, None, None
    if f is not None:
        import numpy as np

        grid = np.linspace(0.0, x_max, points)
        for fit in sorted(f.fits.values(), key=lambda fit: fit is not f.best):
            name = (f"{FORM_NAMES[fit.form]}{' (best)' if fit is f.best else ''}, leave-one-trial-out RMSE "
                    f"{fit.loo_rmse:.3g}")
            curves.append((name, grid.tolist(), f.score(np.sqrt(grid), fit.form).tolist(), fit is not f.best))
        low, high = f.best.intervals["kl_star"]
        if np.isfinite(f.best.kl_star):
            kl_star = (f.best.kl_star, min(low, x_max), min(high, x_max))
        if f.best.kl_star <= x_max:
            peak_point = (f.best.kl_star, f.best.peak_score)
        reference = f.reference
    surfaces = []
    if result.runs:
        for level in ATTAINMENT_LEVELS:
            corners = attainment_surface(result.runs, level)
            surfaces.append(Points(f"{level:.0%} attainment over {len(result.runs)} seeds",
                                   corners[:, 0].tolist(), corners[:, 1].tolist()))
    return FrontierData(title, x_label, result.score_metric or "", feasible_points, stopped_points, curves, reference,
                        kl_star, peak_point, surfaces, notes, x_max, message=None)


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

    Feasible trials are grouped by how KL acts (``kl_loss_type / loss_agg_mode``, or ``kl_penalty`` with KL in the
    reward), infeasible ones kept apart (at their last reported values), the front in x order. With no feasible
    trial the least infeasible five carry their rank instead (a sweep where every trial was stopped still gets a
    plot that says which came closest). Trials a health rule's remedy restarted (issue 17: their values are those of
    their last run) are also drawn as their own series, ``remedied (n)``, each labelled ``R<restarts>`` and its hover
    naming the schedule, so they are never mixed silently with trials that ran as proposed.
    """
    from klsweep.analysis.accounting import schedules

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


def thresholds(ruleset) -> dict[str, list[dict[str, Any]]]:
    """Plain thresholds of a health rule set per curve panel (``ref_kl``, ``entropy``, ``score``).

    Only single-value conditions (``stat: value``) are plain thresholds on a curve; window statistics, drops and
    ratios are not drawn. The built-in ``kl_explosion`` check adds a stop threshold on the reference KL.

    Args:
        ruleset: a :class:`klsweep.health.RuleSet` (``klsweep.health.load_ruleset``).

    Returns:
        ``{panel: [{"rule", "action", "above" | "below": value, "for"}]}``.
    """
    out: dict[str, list[dict[str, Any]]] = {alias: [] for alias, _ in CURVES}
    for rule in ruleset.rules:
        if rule.match == "all" and len(rule.conditions) > 1:
            continue  # a band of one condition would claim a stop the other conditions may not allow
        for condition in rule.conditions:
            if condition.stat != "value":
                continue
            for alias, _ in CURVES:
                if condition.metric == alias or condition.metric in ALIASES.get(alias, (alias,)):
                    bound = {"above": condition.above} if condition.above is not None else {"below": condition.below}
                    out[alias].append({"rule": rule.name, "action": rule.action, "for": rule.for_, **bound})
    if ruleset.builtin.kl_explosion > 0:
        out["ref_kl"].append({"rule": "kl_explosion (built-in)", "action": "stop", "for": 1,
                              "above": ruleset.builtin.kl_explosion})
    return out


def curves_data(history: pd.DataFrame, df: pd.DataFrame, ruleset=None, *, objectives: Objectives = (),
                baselines: Mapping[str, float] | None = None, max_trials: int = 40) -> CurvesData:
    """Per-trial curves of each objective, reference KL, entropy and training score (panels), with the health
    thresholds. Next to the training score (the proxy reward), a validation objective shows whether the policy
    got better or only learned to please the reward (the embedded task's gold accuracy falls while its proxy rises).

    Args:
        history: :func:`klsweep.analysis.sweep_dir.load_history` (long format).
        df: :func:`klsweep.analysis.sweep_dir.load` (for health verdicts, stop reasons and steps).
        ruleset: the sweep's :class:`klsweep.health.RuleSet`, or None for no thresholds (see :func:`thresholds`).
        objectives: ``(metric, mode)`` of the sweep; each gets a panel of its own unless a :data:`CURVES` panel
            shows that metric already.
        baselines: metric → the reference policy's value (:func:`klsweep.analysis.baseline.reference_scores`),
            drawn as a dotted line on the metric's panel.
        max_trials: at most this many trials are drawn (stopped trials first, then by trial number).

    Each panel's y range shows the data and every rule's threshold; a built-in one (``kl_explosion``) only when the
    data comes within a factor 2 of it, so a KL of 0.1 is not drawn on a 0..5 axis.
    """
    if len(df):
        stopped_first = df.assign(_s=(df.get("health") != "stopped")).sort_values(["_s", "number"])
        trials = stopped_first.head(max_trials)
    else:
        trials = df
    bands = thresholds(ruleset) if ruleset is not None else {}
    by_trial = {tid: g for tid, g in history.groupby("trial_id")} if len(history) else {}
    baselines = baselines or {}
    in_curves = {name for alias, _ in CURVES for name in (alias, *ALIASES.get(alias, ()))}
    specs = [(metric, f"{metric} (objective, {mode})") for metric, mode in objectives if metric not in in_curves]
    panels = []
    for alias, title in [*specs, *CURVES]:
        lines = []
        for i, (_, trial) in enumerate(trials.iterrows()):
            steps = by_trial.get(trial["trial_id"])
            if steps is None:
                continue
            names = ALIASES.get(alias, (alias,))
            if alias == "ref_kl" and isinstance(trial.get("kl_metric"), str):
                names = (trial["kl_metric"],)
            metric = next((m for m in names if (steps["metric"] == m).any()), None)
            if metric is None:
                continue
            series = steps[steps["metric"] == metric].sort_values("step")
            stopped = trial.get("health") == "stopped"
            lines.append(Line(f"trial {trial['number']}", PALETTE[i % len(PALETTE)], metric, series["step"].tolist(),
                              series["value"].tolist(), str(trial.get("stop_reason")) if stopped else None,
                              DASHES[i // len(PALETTE) % len(DASHES)]))
        baseline = baselines.get(alias)
        values = [v for line in lines for v in line.values if v == v]  # NaN reports are not drawn
        values += [baseline] if baseline is not None else []
        lo, hi = (min(values), max(values)) if values else (0.0, 0.0)
        panel = bands.get(alias, [])
        shown = [b for b in panel if not b["rule"].endswith("(built-in)") or b.get("above", 0) <= 2 * max(hi, 0)]
        top = max([hi, *(b["above"] for b in shown if "above" in b)])
        bottom = min([lo, *(b["below"] for b in shown if "below" in b)])
        pad = 0.08 * ((top - bottom) or abs(top) or 1.0)
        panels.append(Panel(alias, title, lines, panel, (bottom - pad, top + pad), baseline))
    shown_trials = f"{len(trials)} of {len(df)} trials" if len(df) > len(trials) else f"{len(df)} trials"
    preset = f", health bands: {ruleset.name}" if ruleset is not None else ""
    return CurvesData(panels, f"Curves ({shown_trials}{preset}; ✕ = stopped by a health rule)")


def importance_data(study, objectives: Sequence[Mapping[str, str]] | None = None) -> ImportanceData:
    """Parameter importance for each objective: Optuna's default evaluator
    (``optuna.importance.get_param_importances``, PED-ANOVA in Optuna 5) on the study's COMPLETE trials.

    With fewer than two COMPLETE trials (or when Optuna cannot evaluate, e.g. no parameter varies) ``message`` says
    why instead. With fewer than :data:`STABLE_IMPORTANCE_TRIALS` ``note`` says the ranking is a hint at most.
    """
    import optuna

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
