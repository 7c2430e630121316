"""Plotly figures of a sweep: Pareto front, per-trial curves with health bands, parameter importance, KL knobs.

Each function takes the tables of :mod:`klsweep.analysis.load` (and the Optuna study where Optuna's own evaluators or
views are used) and returns a ``plotly.graph_objects.Figure``; :func:`write_pngs` exports several at once (kaleido,
which needs a Chrome or Chromium on the machine).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from klsweep.analysis.pareto import (
    DEFAULT_LOSS_AGG_MODE, Objectives, feasible, kl_scale, least_infeasible, objective_columns, pareto_front,
)
from klsweep.verl.metrics import ALIASES, KlSetup

AGG = "config/actor_rollout_ref.actor.loss_agg_mode"
GREY = "rgba(150,150,150,0.6)"
#: The three panels of :func:`curves_figure`: alias (klsweep.verl.metrics.ALIASES) and axis title.
CURVES = (("ref_kl", "reference KL"), ("entropy", "actor/entropy"), ("score", "critic/score/mean"))


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


def front_figure(df: pd.DataFrame, objectives: Objectives, front: pd.DataFrame | None = None) -> go.Figure:
    """Pareto front: every trial as a point (y: first objective, x: second, see :func:`front_objectives`).

    Feasible trials are coloured by how KL acts (``kl_loss_type / loss_agg_mode``, or ``kl_penalty`` with KL in
    the reward), infeasible ones grey (at their last reported values), the front outlined and joined. With no
    feasible trial the least infeasible are labelled with their rank (card K25). The title names the KL scale(s)
    plotted and the notes of :func:`klsweep.analysis.pareto.pareto_front`.
    """
    axes = front_objectives(df, objectives)
    (y, y_mode), (x, x_mode) = axes[0], (axes[1] if len(axes) > 1 else ("number", ""))
    if front is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            front = pareto_front(df, axes)
    xs, ys = _plotted(df, x), _plotted(df, y)
    ok = feasible(df) if len(df) else pd.Series(dtype=bool)
    fig = go.Figure()
    bad = df[~ok]
    if len(bad):
        fig.add_trace(go.Scatter(
            x=xs[bad.index], y=ys[bad.index], mode="markers", name="infeasible (stopped, pruned or failed)",
            marker=dict(color=GREY, size=8, symbol="x"),
            hovertext=[_hover(r, [x, y]) for _, r in bad.iterrows()], hoverinfo="text"))
    good = df[ok]
    for label, group in good.groupby(good.apply(_label, axis=1) if len(good) else [], sort=True):
        fig.add_trace(go.Scatter(
            x=xs[group.index], y=ys[group.index], mode="markers", name=label, marker=dict(size=9),
            hovertext=[_hover(r, [x, y]) for _, r in group.iterrows()], hoverinfo="text"))
    if len(front):
        order = front.index[xs[front.index].argsort()]
        fig.add_trace(go.Scatter(
            x=xs[order], y=ys[order], mode="lines+markers", name=f"Pareto front ({len(front)})",
            line=dict(color="black", width=1, shape="hv" if len(front) > 1 else "linear"),
            marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(color="black", width=2))))
    else:
        ranked = least_infeasible(df).head(5)
        fig.add_trace(go.Scatter(
            x=xs[ranked.index], y=ys[ranked.index], mode="markers+text", name="least infeasible (rank)",
            text=[f"#{r}" for r in ranked["infeasible_rank"]], textposition="top center",
            marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(color="firebrick", width=2))))
    scales = front.attrs.get("kl_scale") or sorted(set(kl_scale(df[ok])))
    title = f"Pareto front: {y} ({y_mode}) vs {x} ({x_mode})" if x_mode else f"Best trials: {y} ({y_mode})"
    subtitle = _wrap(f"KL plotted: {'; '.join(scales) or 'n/a'}")
    notes = front.attrs.get("notes", [])
    if notes:
        subtitle += "<br>⚠ " + "<br>⚠ ".join(_wrap(n) for n in notes)
    fig.update_layout(title=dict(text=title, subtitle=dict(text=subtitle)), xaxis_title=x, yaxis_title=y,
                      margin=dict(t=90 + 18 * (subtitle.count("<br>") + 1)),
                      height=520 + 18 * (subtitle.count("<br>") + 1),
                      legend=dict(title="KL: kl_loss_type / loss_agg_mode"), template="plotly_white")
    return fig


def _plotted(df: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers; a ``value/`` column (told to Optuna, empty for PRUNED/FAIL trials) falls back to the
    trial's ``last/`` value so that infeasible trials can still be drawn."""
    values = pd.to_numeric(df[column], errors="coerce") if column in df else pd.Series(float("nan"), index=df.index)
    last = column.replace("value/", "last/", 1)
    if last != column and last in df:
        values = values.fillna(pd.to_numeric(df[last], errors="coerce"))
    return values


def _wrap(text: str, width: int = 120) -> str:
    import textwrap

    return "<br>".join(textwrap.wrap(text, width))


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


def curves_figure(history: pd.DataFrame, df: pd.DataFrame, ruleset=None, *, max_trials: int = 40) -> go.Figure:
    """Per-trial curves of reference KL, entropy and training score (rows), health thresholds as bands.

    Args:
        history: :func:`klsweep.analysis.load.load_history` (long format).
        df: :func:`klsweep.analysis.load.load` (for health verdicts, stop reasons and steps).
        ruleset: the sweep's :class:`klsweep.health.RuleSet`, or None for no bands. Stop rules are shaded red,
            warnings orange; the dashed line is the threshold (see :func:`thresholds`).
        max_trials: at most this many trials are drawn (stopped trials first, then by trial number).

    A stopped trial's last point is marked with an ✕ whose hover text is the stop reason.
    """
    fig = make_subplots(rows=len(CURVES), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[t for _, t in CURVES])
    if len(df):
        stopped_first = df.assign(_s=(df.get("health") != "stopped")).sort_values(["_s", "number"])
        trials = stopped_first.head(max_trials)
    else:
        trials = df
    bands = thresholds(ruleset) if ruleset is not None else {}
    by_trial = {tid: g for tid, g in history.groupby("trial_id")} if len(history) else {}
    colors = plotly.colors.qualitative.Plotly
    for row_no, (alias, _title) in enumerate(CURVES, start=1):
        lo, hi = float("inf"), float("-inf")
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
            lo, hi = min(lo, series["value"].min()), max(hi, series["value"].max())
            color = colors[i % len(colors)]
            name = f"trial {trial['number']}"
            fig.add_trace(go.Scatter(x=series["step"], y=series["value"], mode="lines", name=name,
                                     legendgroup=name, showlegend=row_no == 1, line=dict(color=color, width=1.5),
                                     hovertemplate=f"{name}<br>{metric}: %{{y:.4g}} at step %{{x}}<extra></extra>"),
                          row=row_no, col=1)
            if trial.get("health") == "stopped":
                end = series.iloc[-1]
                fig.add_trace(go.Scatter(x=[end["step"]], y=[end["value"]], mode="markers", legendgroup=name,
                                         showlegend=False, marker=dict(symbol="x", size=11, color=color,
                                                                       line=dict(width=1, color="black")),
                                         hovertext=f"{name} stopped: {trial.get('stop_reason')}",
                                         hoverinfo="text"), row=row_no, col=1)
        panel = bands.get(alias, [])
        if lo > hi:  # no trial logged this metric
            lo = hi = 0.0
        # the axis shows the data and every rule's threshold; a built-in one (kl_explosion) only when the data
        # comes within a factor 2 of it, so a KL of 0.1 is not drawn on a 0..5 axis
        shown = [b for b in panel if not b["rule"].endswith("(built-in)") or b.get("above", 0) <= 2 * max(hi, 0)]
        uppers = [b["above"] for b in shown if "above" in b]
        lowers = [b["below"] for b in shown if "below" in b]
        top = max([hi, *uppers])
        bottom = min([lo, *lowers])
        pad = 0.08 * ((top - bottom) or abs(top) or 1.0)
        fig.update_yaxes(range=[bottom - pad, top + pad], row=row_no, col=1)
        for band in panel:
            value = band.get("above", band.get("below"))
            far = 10 * (abs(top) + abs(bottom) + 1.0)
            y0, y1 = (value, value + far) if "above" in band else (value - far, value)
            color = "rgba(220,40,40,0.10)" if band["action"] == "stop" else "rgba(255,150,0,0.10)"
            fig.add_hrect(y0=y0, y1=y1, fillcolor=color, line_width=0, row=row_no, col=1)
            fig.add_hline(y=value, line=dict(dash="dash", width=1,
                                             color="firebrick" if band["action"] == "stop" else "darkorange"),
                          annotation_text=f"{band['rule']} ({band['action']}, {'>' if 'above' in band else '<'} "
                                          f"{value:g})", annotation_position="top left", row=row_no, col=1)
    shown = f"{len(trials)} of {len(df)} trials" if len(df) > len(trials) else f"{len(df)} trials"
    preset = f", health bands: {ruleset.name}" if ruleset is not None else ""
    fig.update_layout(title=f"Curves ({shown}{preset}; ✕ = stopped by a health rule)", height=300 * len(CURVES),
                      template="plotly_white", hovermode="closest")
    fig.update_xaxes(title_text="training step", row=len(CURVES), col=1)
    return fig


def importance_figure(study, objectives: Sequence[Mapping[str, str]] | None = None) -> go.Figure:
    """Parameter importance for each objective: Optuna's default evaluator
    (``optuna.importance.get_param_importances``, PED-ANOVA in Optuna 5) on the study's COMPLETE trials.

    With fewer than two COMPLETE trials (or when Optuna cannot evaluate, e.g. no parameter varies) the figure
    says why instead of plotting.
    """
    import optuna

    names = [o["metric"] for o in objectives] if objectives else [f"objective {i}" for i in
                                                                   range(len(study.directions))]
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    fig = go.Figure()
    fig.update_layout(title="Parameter importance (Optuna, COMPLETE trials)", template="plotly_white",
                      barmode="group", xaxis_title="importance (sums to 1 per objective)")
    if len(complete) < 2:
        return _message(fig, f"parameter importance needs at least 2 COMPLETE trials; this study has {len(complete)}")
    for i, name in enumerate(names):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importances = optuna.importance.get_param_importances(
                    study, target=(lambda t, i=i: t.values[i]) if len(names) > 1 else None)
        except (ValueError, RuntimeError) as e:
            return _message(fig, f"Optuna could not evaluate importance: {e}")
        if not importances:
            return _message(fig, "no searched parameter varies across the COMPLETE trials")
        params = list(importances)[::-1]
        fig.add_trace(go.Bar(x=[importances[p] for p in params], y=params, orientation="h", name=name))
    fig.update_layout(height=max(300, 120 + 40 * len(params) * len(names)), margin=dict(l=320))
    return fig


def _message(fig: go.Figure, text: str) -> go.Figure:
    fig.add_annotation(text=_wrap(text, 80), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=16))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """The ``config/`` columns whose value differs between trials (list values such as ``trainer.logger`` compared
    as text)."""
    return [c for c in df.columns if c.startswith("config/") and df[c].dropna().astype(str).nunique() > 1]


def knobs_figure(df: pd.DataFrame, objectives: Objectives) -> go.Figure:
    """Parallel coordinates of the KL knobs that vary across trials against the first objective (categorical knobs
    as their category index, named on the axis)."""
    (y, _) = objective_columns(df, objectives)[0]
    knobs = varying_knobs(df)
    dims = []
    for c in knobs:
        values = df[c]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            dims.append(dict(label=_short(c), values=values))
        else:
            cats = sorted(values.dropna().astype(str).unique())
            dims.append(dict(label=_short(c), values=values.astype(str).map(cats.index),
                             tickvals=list(range(len(cats))), ticktext=cats))
    score = _plotted(df, y)
    fig = go.Figure()
    if not dims:
        return _message(fig, "no searched knob varies across trials")
    dims.append(dict(label=y, values=score))
    fig.add_trace(go.Parcoords(dimensions=dims, line=dict(color=score, colorscale="Viridis", showscale=True)))
    fig.update_layout(title=f"KL knobs vs {y} (all trials)", template="plotly_white", margin=dict(l=80, r=80))
    return fig


def slice_figure(study, objective: int = 0, target_name: str | None = None) -> go.Figure:
    """Optuna's slice plot (``optuna.visualization.plot_slice``, COMPLETE trials) of one objective against each
    searched knob."""
    import optuna

    multi = len(study.directions) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna warns (and draws nothing) when no trial is COMPLETE
        fig = optuna.visualization.plot_slice(study, target=(lambda t: t.values[objective]) if multi else None,
                                              target_name=target_name or f"objective {objective}")
    fig.update_layout(height=420, template="plotly_white")
    return fig


def table_figure(table: pd.DataFrame, title: str) -> go.Figure:
    """A table as a figure (for the PNG export of the report's tables)."""
    cells = [[_cell(v) for v in table[c]] for c in table.columns]
    fig = go.Figure(go.Table(header=dict(values=[str(c) for c in table.columns], fill_color="#dde4f0", align="left"),
                             cells=dict(values=cells, align="left")))
    fig.update_layout(title=title, height=min(2000, 110 + 32 * (len(table) + 1)), margin=dict(l=10, r=10, t=60, b=10))
    return fig


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "" if pd.isna(v) else f"{v:.4g}"
    return "" if v is None else str(v)


def _short(column: str) -> str:
    return column.removeprefix("config/").replace("actor_rollout_ref.", "")


def write_pngs(figures: Mapping[str, go.Figure], out_dir: str | Path, *, width: int = 1100) -> list[Path]:
    """Export figures as ``<out_dir>/<name>.png`` with one kaleido session; each file is written to a temporary name
    and moved into place (``os.replace``), so a reader never sees half a PNG.

    Raises:
        RuntimeError: kaleido cannot start Chrome/Chromium (``apt-get install chromium`` or ``plotly_get_chrome``).
    """
    import plotly.io as pio

    out_dir = Path(out_dir)
    names = list(figures)
    tmp = [out_dir / f".{n}.png.tmp" for n in names]
    heights = [int(figures[n].layout.height or 600) for n in names]
    pio.write_images([figures[n] for n in names], tmp, format="png", width=width, height=heights)
    final = []
    for n, t in zip(names, tmp):
        os.replace(t, out_dir / f"{n}.png")
        final.append(out_dir / f"{n}.png")
    return final
