"""Plotly figures of a sweep: Pareto front, per-trial curves with health bands, parameter importance, KL knobs.

Each function takes the tables of :mod:`klsweep.analysis.sweep_dir` (and the Optuna study where Optuna's own
evaluators or views are used). It returns an interactive ``plotly.graph_objects.Figure`` (``report.html``, the
notebook). What a figure shows is decided in :mod:`klsweep.analysis.figures`, :mod:`klsweep.analysis.curves` and
:mod:`klsweep.analysis.frontier_figure`; :mod:`klsweep.analysis.pngs` draws the same data as static PNGs with
matplotlib. :func:`plotly_figure` draws any of those data objects.
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import optuna
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from klsweep.analysis.curves import CurvesData, curves_data
from klsweep.analysis.figures import (
    FrontData,
    ImportanceData,
    KnobsData,
    SliceData,
    front_data,
    front_objectives,
    importance_data,
    knobs_data,
    varying_knobs,
)
from klsweep.analysis.frontier_figure import FrontierData, frontier_data

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.analysis.frontier import SweepFrontier
    from klsweep.analysis.pareto import Objectives
    from klsweep.health import RuleSet

__all__ = [
    "curves_figure", "front_figure", "front_objectives", "frontier_figure", "importance_figure", "knobs_figure",
    "plotly_figure", "slice_figure", "varying_knobs",
]

GREY = "rgba(150,150,150,0.6)"


def front_figure(df: pd.DataFrame, objectives: Objectives, front: pd.DataFrame | None = None) -> go.Figure:
    """Pareto front: every trial as a point (y: first objective, x: second, see :func:`front_objectives`).

    Feasible trials are coloured by how KL acts (``kl_loss_type / loss_agg_mode``, or ``kl_penalty`` with KL in
    the reward), infeasible ones grey (at their last reported values), the front outlined and joined. With no
    feasible trial the least infeasible are labelled with their rank. The title names the KL scale(s) plotted and
    the notes of :func:`klsweep.analysis.pareto.pareto_front`.
    """
    return _front(front_data(df, objectives, front))


def _front(data: FrontData) -> go.Figure:
    fig = go.Figure()
    if data.infeasible is not None:
        p = data.infeasible
        fig.add_trace(go.Scatter(x=p.x, y=p.y, mode="markers", name=p.name, marker=dict(color=GREY, size=8, symbol="x"),
                                 hovertext=p.hover, hoverinfo="text"))
    for p in data.groups:
        fig.add_trace(go.Scatter(x=p.x, y=p.y, mode="markers", name=p.name, marker=dict(size=9), hovertext=p.hover,
                                 hoverinfo="text"))
    if data.front is not None:
        p = data.front
        fig.add_trace(go.Scatter(
            x=p.x, y=p.y, mode="lines+markers", name=p.name,
            line=dict(color="black", width=1, shape="hv" if len(p.x) > 1 else "linear"),
            marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(color="black", width=2))))
    if data.least_infeasible is not None:
        p = data.least_infeasible
        fig.add_trace(go.Scatter(
            x=p.x, y=p.y, mode="markers+text", name=p.name, text=p.text, textposition="top center",
            marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(color="firebrick", width=2))))
    if data.remedied is not None:
        p = data.remedied
        fig.add_trace(go.Scatter(
            x=p.x, y=p.y, mode="markers+text", name=p.name, text=p.text, textposition="bottom center",
            hovertext=p.hover, hoverinfo="text",
            marker=dict(size=16, symbol="diamond-open", color="darkorange", line=dict(width=2))))
    subtitle = _wrap(f"KL plotted: {'; '.join(data.scales) or 'n/a'}")
    if data.notes:
        subtitle += "<br>⚠ " + "<br>⚠ ".join(_wrap(n) for n in data.notes)
    fig.update_layout(title=dict(text=data.title, subtitle=dict(text=subtitle)), xaxis_title=data.x,
                      yaxis_title=data.y, margin=dict(t=90 + 18 * (subtitle.count("<br>") + 1)),
                      height=520 + 18 * (subtitle.count("<br>") + 1),
                      legend=dict(title="KL: kl_loss_type / loss_agg_mode"), template="plotly_white")
    return fig


def _wrap(text: str, width: int = 120) -> str:
    return "<br>".join(textwrap.wrap(text, width))


def curves_figure(history: pd.DataFrame, df: pd.DataFrame, ruleset: RuleSet | None = None, *,
                  objectives: Objectives = (), baselines: Mapping[str, float] | None = None,
                  max_trials: int = 40) -> go.Figure:
    """Per-trial curves of each objective, reference KL, entropy and training score, one row each.

    Health thresholds are bands; the reference policy's value is a dotted line
    (:func:`klsweep.analysis.curves.curves_data`).

    Args:
        history: :func:`klsweep.analysis.sweep_dir.load_history` (long format).
        df: :func:`klsweep.analysis.sweep_dir.load` (for health verdicts, stop reasons and steps).
        ruleset: the sweep's :class:`klsweep.health.RuleSet`, or None for no bands. Stop rules are shaded red,
            warnings orange; the dashed line is the threshold (see :func:`klsweep.analysis.curves.thresholds`).
        objectives: ``(metric, mode)`` of the sweep, each a panel unless a KL/entropy/score panel shows it.
        baselines: metric → the reference policy's value, a dotted line on that metric's panel.
        max_trials: at most this many trials are drawn (stopped trials first, then by trial number).

    A stopped trial's last point is marked with an ✕ whose hover text is the stop reason.
    """
    return _curves(curves_data(history, df, ruleset, objectives=objectives, baselines=baselines,
                               max_trials=max_trials))


def _curves(data: CurvesData) -> go.Figure:
    fig = make_subplots(rows=len(data.panels), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[p.title for p in data.panels])
    for row_no, panel in enumerate(data.panels, start=1):
        for line in panel.lines:
            fig.add_trace(go.Scatter(x=line.steps, y=line.values, mode="lines", name=line.name,
                                     legendgroup=line.name, showlegend=row_no == 1,
                                     line=dict(color=line.color, width=1.5, dash=line.dash),
                                     hovertemplate=f"{line.name}<br>{line.metric}: %{{y:.4g}} at step %{{x}}"
                                                   "<extra></extra>"),
                          row=row_no, col=1)
            if line.stop_reason is not None:
                fig.add_trace(go.Scatter(x=line.steps[-1:], y=line.values[-1:], mode="markers",
                                         legendgroup=line.name, showlegend=False,
                                         marker=dict(symbol="x", size=11, color=line.color,
                                                     line=dict(width=1, color="black")),
                                         hovertext=f"{line.name} stopped: {line.stop_reason}", hoverinfo="text"),
                              row=row_no, col=1)
        bottom, top = panel.ylim
        fig.update_yaxes(range=[bottom, top], row=row_no, col=1)
        for band in panel.bands:
            value = band.get("above", band.get("below"))
            far = 10 * (abs(top) + abs(bottom) + 1.0)
            y0, y1 = (value, value + far) if "above" in band else (value - far, value)
            color = "rgba(220,40,40,0.10)" if band["action"] == "stop" else "rgba(255,150,0,0.10)"
            fig.add_hrect(y0=y0, y1=y1, fillcolor=color, line_width=0, row=row_no, col=1)
            fig.add_hline(y=value, line=dict(dash="dash", width=1,
                                             color="firebrick" if band["action"] == "stop" else "darkorange"),
                          annotation_text=f"{band['rule']} ({band['action']}, {'>' if 'above' in band else '<'} "
                                          f"{value:g})", annotation_position="top left", row=row_no, col=1)
        if panel.baseline is not None:
            fig.add_hline(y=panel.baseline, line=dict(dash="dot", width=1.5, color="grey"),
                          annotation_text=f"reference policy ({panel.baseline:.4g})",
                          annotation_position="bottom right", row=row_no, col=1)
    fig.update_layout(title=data.title, height=300 * len(data.panels), template="plotly_white", hovermode="closest")
    fig.update_xaxes(title_text="training step", row=len(data.panels), col=1)
    return fig


#: Height of a custom figure's card in optuna-dashboard (its ``user-defined-plot`` div, optuna-dashboard 0.20).
DASHBOARD_HEIGHT = 450


def frontier_figure(result: SweepFrontier, *, card: bool = False) -> go.Figure:
    """The KL frontier of :func:`klsweep.analysis.frontier.sweep_frontier`, as
    :func:`klsweep.analysis.frontier_figure.frontier_data` describes it.

    It draws feasible trials, stopped ones apart (hover: trial, knobs, stop reason), and both Gao forms (the best
    solid). It adds the reference score at ``d = 0``, KL* with its interval as a band, and the peak.
    Attainment surfaces over training seeds appear when a config ran with several. The legend is under the plot,
    never over it; KL*'s label hangs inside the plot, under the subtitle.

    ``card``: for optuna-dashboard's figure card (:data:`DASHBOARD_HEIGHT` pixels high, half the page wide): the
    notes go from the subtitle into a hover label (``notes``), so that the axes and legend fit the card."""
    return _frontier(frontier_data(result), card=card)


def _frontier(data: FrontierData, card: bool = False) -> go.Figure:
    fig = go.Figure()
    legend = dict(orientation="h", x=0, xanchor="left", y=-0.16 if not card else -0.3, yanchor="top",
                  font=dict(size=11))
    if card:  # short labels; the legend's details and the notes on hover
        fig.update_layout(title=dict(text=data.title, font=dict(size=13), x=0.01, xanchor="left"),
                          template="plotly_white", xaxis_title=data.x_label.split(" = ")[0],
                          yaxis_title=data.y_label, legend={**legend, "y": -0.28, "font": dict(size=10)},
                          height=DASHBOARD_HEIGHT, margin=dict(t=58, b=125, l=60, r=20))
        if data.notes:
            fig.add_annotation(text="notes (hover here)", hovertext="<br>".join(_wrap(n, 80) for n in data.notes),
                               showarrow=False, x=0, y=1.01, xref="paper", yref="paper", xanchor="left",
                               yanchor="bottom", font=dict(size=11, color="#1f77b4"))
    else:
        subtitle = "<br>".join(_wrap(n) for n in data.notes)
        lines = subtitle.count("<br>") + 1
        fig.update_layout(title=dict(text=data.title, subtitle=dict(text=subtitle)), template="plotly_white",
                          xaxis_title=data.x_label, yaxis_title=data.y_label, legend=legend,
                          margin=dict(t=100 + 18 * lines, b=150), height=630 + 18 * lines)
    if data.message is not None:
        return _message(fig, data.message)
    if data.kl_star is not None:
        kl_star, low, high = data.kl_star
        fig.add_vrect(x0=low, x1=high, fillcolor="rgba(31,119,180,0.12)", line_width=0)
        if kl_star <= data.x_max:
            fig.add_vline(x=kl_star, line=dict(dash="dot", color="#1f77b4"), annotation_text=f"KL* = {kl_star:.3g}",
                          annotation_position="top right", annotation=dict(yanchor="top"))
    for name, x, y, dashed in data.curves:
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name.split(", ")[0] if card else name,
                                 hovertemplate=f"{name}<extra></extra>",
                                 line=dict(color="#1f77b4", dash="dash" if dashed else "solid", width=2)))
    for p in data.surfaces:
        fig.add_trace(go.Scatter(x=[*p.x, data.x_max], y=[*p.y, p.y[-1]] if p.y else [], mode="lines", name=p.name,
                                 line=dict(shape="hv", width=1)))
    if data.reference is not None:
        fig.add_trace(go.Scatter(x=[0.0], y=[data.reference], mode="markers", name="reference policy (d = 0)",
                                 marker=dict(symbol="diamond", size=11, color="black")))
    if data.peak is not None:
        fig.add_trace(go.Scatter(x=[data.peak[0]], y=[data.peak[1]], mode="markers", name="fitted peak",
                                 marker=dict(symbol="star", size=16, color="#1f77b4")))
    if data.feasible is not None:
        p = data.feasible
        fig.add_trace(go.Scatter(x=p.x, y=p.y, mode="markers", name=p.name, marker=dict(size=9, color="#2ca02c"),
                                 hovertext=p.hover, hoverinfo="text"))
    if data.stopped is not None:
        p = data.stopped
        fig.add_trace(go.Scatter(x=p.x, y=p.y, mode="markers", name=p.name,
                                 marker=dict(size=9, color=GREY, symbol="x"), hovertext=p.hover, hoverinfo="text"))
    fig.update_xaxes(range=[0, data.x_max])
    return fig


def importance_figure(study: optuna.Study, objectives: Sequence[Mapping[str, str]] | None = None) -> go.Figure:
    """Parameter importance for each objective: Optuna's default evaluator
    (``optuna.importance.get_param_importances``, PED-ANOVA in Optuna 5) on the study's COMPLETE trials.

    With fewer than two COMPLETE trials (or when Optuna cannot evaluate, e.g. no parameter varies) the figure
    says why instead of plotting.
    """
    return _importance(importance_data(study, objectives))


def _importance(data: ImportanceData) -> go.Figure:
    fig = go.Figure()
    title = dict(text=data.title, subtitle=dict(text=_wrap(data.note))) if data.note else data.title
    fig.update_layout(title=title, template="plotly_white", barmode="group",
                      xaxis_title="importance (sums to 1 per objective)")
    if data.message is not None:
        return _message(fig, data.message)
    for name, importances in data.bars:
        params = list(importances)[::-1]  # the most important at the top
        fig.add_trace(go.Bar(x=[importances[p] for p in params], y=params, orientation="h", name=name))
    most = max(len(importances) for _, importances in data.bars)
    fig.update_layout(height=max(300, 120 + 40 * most * len(data.bars)), margin=dict(l=320))
    return fig


def _message(fig: go.Figure, text: str) -> go.Figure:
    fig.add_annotation(text=_wrap(text, 80), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=16))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def knobs_figure(df: pd.DataFrame, objectives: Objectives) -> go.Figure:
    """Parallel coordinates of the KL knobs that vary across trials against the first objective (categorical knobs
    as their category index, named on the axis)."""
    return _knobs(knobs_data(df, objectives))


def _knobs(data: KnobsData) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=data.title, template="plotly_white", margin=dict(l=80, r=80))
    if data.message is not None:
        return _message(fig, data.message)
    dims = [dict(label=a.label, values=a.values, **({"tickvals": a.tickvals, "ticktext": a.ticktext}
                                                    if a.ticktext is not None else {})) for a in data.axes]
    score = data.axes[-1].values
    fig.add_trace(go.Parcoords(dimensions=dims, line=dict(color=score, colorscale="Viridis", showscale=True)))
    return fig


def slice_figure(study: optuna.Study, objective: int = 0, target_name: str | None = None) -> go.Figure:
    """Optuna's slice plot (``optuna.visualization.plot_slice``, COMPLETE trials) of one objective against each
    searched knob."""
    return _slice(SliceData(study, objective, target_name))


def _slice(data: SliceData) -> go.Figure:
    multi = len(data.study.directions) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna warns (and draws nothing) when no trial is COMPLETE
        fig = optuna.visualization.plot_slice(
            data.study, target=(lambda t: t.values[data.objective]) if multi else None,
            target_name=data.target_name or f"objective {data.objective}")
    fig.update_layout(height=420, template="plotly_white")
    return fig


_RENDERERS = {FrontData: _front, CurvesData: _curves, ImportanceData: _importance, KnobsData: _knobs,
              SliceData: _slice, FrontierData: _frontier}


def plotly_figure(data) -> go.Figure:
    """The plotly figure of a data object of :mod:`klsweep.analysis.figures` (tables are HTML tables in the report,
    and PNGs only through :mod:`klsweep.analysis.pngs`)."""
    try:
        render = _RENDERERS[type(data)]
    except KeyError:
        raise TypeError(f"no plotly renderer for {type(data).__name__}; valid: "
                        f"{', '.join(t.__name__ for t in _RENDERERS)}") from None
    return render(data)
