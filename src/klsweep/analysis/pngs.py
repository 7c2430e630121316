"""Static PNGs of a sweep's figures, drawn with matplotlib's Agg renderer: no display and no browser needed.

Each renderer draws one data object of :mod:`klsweep.analysis.figures` on its own ``matplotlib.figure.Figure``. The
data objects are what the interactive plotly figures of :mod:`klsweep.analysis.plots` show. No pyplot state is used,
except Optuna's slice plot, which Optuna draws through pyplot; it is closed once saved. :func:`write_pngs` writes
them, each atomically.
"""

from __future__ import annotations

import os
import sys
import textwrap
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from matplotlib import colormaps, rc_context
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from klsweep.analysis.curves import CurvesData
from klsweep.analysis.figures import FrontData, ImportanceData, KnobsData, SliceData, TableData
from klsweep.analysis.frontier_figure import FrontierData

DPI = 100
#: Table text size in points, the height of one line of it, and how many of its characters fill one inch of width
#: (DejaVu Sans averages ~0.52 em per character of these tables; 0.56 leaves a margin).
TABLE_FONT = 8
LINE_IN = 0.17
TITLE_IN = 0.45
CHARS_PER_INCH = 72 / (0.56 * TABLE_FONT)
MAX_HEIGHT_IN = 20.0


def write_pngs(figures: Mapping[str, Any], out_dir: str | Path, *, width: int = 1100) -> list[Path]:
    """Draw each data object of :mod:`klsweep.analysis.figures` as ``<out_dir>/<name>.png``, ``width`` pixels wide.

    Each file is written to a temporary name and moved into place (``os.replace``), so a reader never sees half a
    PNG.

    Returns:
        The paths written, in the order of ``figures``.
    """
    out_dir = Path(out_dir)
    written = []
    for name, data in figures.items():
        fig = render(data, width / DPI)
        tmp, path = out_dir / f".{name}.png.tmp", out_dir / f"{name}.png"
        try:
            fig.savefig(tmp, format="png", dpi=DPI)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
            _close(fig)
        written.append(path)
    return written


def render(data: Any, width_in: float = 11.0) -> Figure:
    """The matplotlib figure of a data object of :mod:`klsweep.analysis.figures`, ``width_in`` inches wide."""
    try:
        draw = _RENDERERS[type(data)]
    except KeyError:
        raise TypeError(f"no PNG renderer for {type(data).__name__}; valid: "
                        f"{', '.join(t.__name__ for t in _RENDERERS)}") from None
    return draw(data, width_in)


def _front(data: FrontData, width_in: float) -> Figure:
    lines = textwrap.wrap(f"KL plotted: {'; '.join(data.scales) or 'n/a'}", 150)
    for note in data.notes:
        lines += textwrap.wrap(f"⚠ {note}", 150)
    fig = Figure(figsize=(width_in, 5.2 + 0.18 * len(lines)), layout="constrained")
    ax = fig.subplots()
    fig.suptitle(data.title, x=0.01, ha="left", fontweight="bold")
    ax.set_title("\n".join(lines), loc="left", fontsize=8)
    if data.infeasible is not None:
        p = data.infeasible
        ax.scatter(p.x, p.y, marker="x", s=45, color="grey", alpha=0.7, label=p.name)
    for p in data.groups:
        ax.scatter(p.x, p.y, s=50, label=p.name)
    if data.front is not None:
        p = data.front
        ax.plot(p.x, p.y, drawstyle="steps-post" if len(p.x) > 1 else "default", color="black", linewidth=1,
                marker="o", markersize=12, markerfacecolor="none", markeredgecolor="black", markeredgewidth=2,
                label=p.name)
    if data.least_infeasible is not None:
        p = data.least_infeasible
        ax.scatter(p.x, p.y, s=180, facecolors="none", edgecolors="firebrick", linewidths=2, label=p.name)
        for x, y, text in zip(p.x, p.y, p.text):
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=9)
    if data.remedied is not None:
        p = data.remedied
        ax.scatter(p.x, p.y, marker="D", s=160, facecolors="none", edgecolors="darkorange", linewidths=2, label=p.name)
        for x, y, text in zip(p.x, p.y, p.text):
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    ax.set_xlabel(data.x)
    ax.set_ylabel(data.y)
    ax.grid(alpha=0.3)
    ax.legend(title="KL: kl_loss_type / loss_agg_mode", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              title_fontsize=8)
    return fig


def _frontier(data: FrontierData, width_in: float) -> Figure:
    if data.message is not None:
        return _message(data.title, data.message, width_in)
    lines = [wrapped for note in data.notes for wrapped in textwrap.wrap(note, 150)]
    fig = Figure(figsize=(width_in, 5.2 + 0.18 * len(lines)), layout="constrained")
    ax = fig.subplots()
    fig.suptitle(data.title, x=0.01, ha="left", fontweight="bold")
    ax.set_title("\n".join(lines), loc="left", fontsize=8)
    if data.kl_star is not None:
        kl_star, low, high = data.kl_star
        ax.axvspan(low, high, color="tab:blue", alpha=0.12, linewidth=0, label=f"KL* interval [{low:.3g}, {high:.3g}]")
        if kl_star <= data.x_max:
            ax.axvline(kl_star, linestyle=":", color="tab:blue", label=f"KL* = {kl_star:.3g}")
    for name, x, y, dashed in data.curves:
        ax.plot(x, y, color="tab:blue", linestyle="--" if dashed else "-", linewidth=2, label=name)
    for p in data.surfaces:
        ax.plot([*p.x, data.x_max], [*p.y, p.y[-1]] if p.y else [], drawstyle="steps-post", linewidth=1, label=p.name)
    if data.reference is not None:
        ax.scatter([0.0], [data.reference], marker="D", s=60, color="black", label="reference policy (d = 0)",
                   zorder=3)
    if data.peak is not None:
        ax.scatter([data.peak[0]], [data.peak[1]], marker="*", s=260, color="tab:blue", label="fitted peak", zorder=3)
    if data.feasible is not None:
        p = data.feasible
        ax.scatter(p.x, p.y, s=50, color="tab:green", label=p.name, zorder=4)
    if data.stopped is not None:
        p = data.stopped
        ax.scatter(p.x, p.y, marker="x", s=50, color="grey", label=p.name, zorder=4)
    ax.set_xlim(0, data.x_max)
    ax.set_xlabel(data.x_label)
    ax.set_ylabel(data.y_label)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


#: matplotlib's line style of each of plotly's ``dash`` names (:data:`klsweep.analysis.curves.DASHES`).
_LINESTYLES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}


def _curves(data: CurvesData, width_in: float) -> Figure:
    fig = Figure(figsize=(width_in, 3.0 * len(data.panels)), layout="constrained")
    axes = fig.subplots(len(data.panels), 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(data.title, x=0.01, ha="left", fontweight="bold")
    for ax, panel in zip(axes, data.panels):
        for line in panel.lines:
            ax.plot(line.steps, line.values, color=line.color, linestyle=_LINESTYLES[line.dash], linewidth=1.2,
                    label=line.name)
            if line.stop_reason is not None:
                ax.plot(line.steps[-1:], line.values[-1:], linestyle="none", marker="X", markersize=9,
                        color=line.color, markeredgecolor="black")
        bottom, top = panel.ylim
        for band in panel.bands:
            value = band.get("above", band.get("below"))
            stop = band["action"] == "stop"
            low, high = (value, max(top, value)) if "above" in band else (min(bottom, value), value)
            ax.axhspan(low, high, color="tab:red" if stop else "orange", alpha=0.10, linewidth=0)
            ax.axhline(value, linestyle="--", linewidth=1, color="firebrick" if stop else "darkorange")
            if bottom <= value <= top:
                ax.annotate(f"{band['rule']} ({band['action']}, {'>' if 'above' in band else '<'} {value:g})",
                            (0.005, value), xycoords=("axes fraction", "data"), va="bottom", fontsize=7,
                            color="firebrick" if stop else "darkorange")
        if panel.baseline is not None:
            ax.axhline(panel.baseline, linestyle=":", linewidth=1.5, color="grey")
            ax.annotate(f"reference policy ({panel.baseline:.4g})", (0.995, panel.baseline),
                        xycoords=("axes fraction", "data"), ha="right", va="top", fontsize=7, color="dimgrey")
        ax.set_ylim(bottom, top)
        ax.set_title(panel.title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        if not panel.lines:
            ax.text(0.5, 0.5, "no trial logged this metric", transform=ax.transAxes, ha="center", color="grey")
    axes[-1].set_xlabel("training step")
    if data.panels and data.panels[0].lines:
        n = len(data.panels[0].lines)
        axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, ncol=1 + (n - 1) // 14)
    return fig


def _importance(data: ImportanceData, width_in: float) -> Figure:
    if data.message is not None:
        return _message(data.title, data.message, width_in)
    params = list(dict.fromkeys(p for _, importances in data.bars for p in importances))[::-1]  # most important on top
    n = len(data.bars)
    fig = Figure(figsize=(width_in, max(3.0, 1.2 + 0.4 * len(params) * n)), layout="constrained")
    ax = fig.subplots()
    height = 0.8 / n
    for i, (name, importances) in enumerate(data.bars):
        ys = [j - 0.4 + height * (i + 0.5) for j in range(len(params))]
        ax.barh(ys, [importances.get(p, 0.0) for p in params], height=height, label=name)
    ax.set_yticks(range(len(params)), params, fontsize=8)
    ax.set_xlabel("importance (sums to 1 per objective)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(data.title, x=0.01, ha="left", fontweight="bold")
    if data.note:
        ax.set_title("\n".join(textwrap.wrap(f"⚠ {data.note}", 150)), loc="left", fontsize=8)
    return fig


def _knobs(data: KnobsData, width_in: float) -> Figure:
    if data.message is not None:
        return _message(data.title, data.message, width_in)
    fig = Figure(figsize=(width_in, 5.0), layout="constrained")
    ax = fig.subplots()
    fig.suptitle(data.title, x=0.01, ha="left", fontweight="bold")
    scaled = []
    for i, axis in enumerate(data.axes):
        finite = [v for v in axis.values if v == v]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        span = (hi - lo) or 1.0
        scaled.append([(v - lo) / span if hi > lo else 0.5 for v in axis.values])
        ax.axvline(i, color="black", linewidth=1)
        ticks = (zip(axis.tickvals, axis.ticktext) if axis.ticktext is not None and axis.tickvals is not None
                 else [(lo, f"{lo:.3g}"), (hi, f"{hi:.3g}")] if finite else [])
        for value, text in ticks:
            ax.text(i + 0.02, (value - lo) / span if hi > lo else 0.5, text, fontsize=7, va="center")
    score = data.axes[-1].values
    finite = [v for v in score if v == v]
    norm = Normalize(min(finite), max(finite)) if finite else Normalize(0.0, 1.0)
    cmap = colormaps["viridis"]
    for j, value in enumerate(score):
        ax.plot(range(len(data.axes)), [column[j] for column in scaled], linewidth=1.2, alpha=0.8,
                color=cmap(norm(value)) if value == value else "lightgrey")
    labels = ["\n".join(textwrap.wrap(a.label, 24, break_long_words=False)) for a in data.axes]
    ax.set_xticks(range(len(data.axes)), labels, fontsize=8)
    ax.set_xlim(-0.1, len(data.axes) - 0.6)
    ax.set_ylim(-0.05, 1.05)
    ax.set_yticks([])
    for side in ("left", "right", "top", "bottom"):
        ax.spines[side].set_visible(False)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label=data.axes[-1].label)
    return fig


def _slice(data: SliceData, width_in: float) -> Figure:
    complete = data.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    name = data.target_name or f"objective {data.objective}"
    if not complete:
        return _message(f"Slice plot: {name}", "no COMPLETE trial to plot", width_in)
    multi = len(data.study.directions) > 1
    with warnings.catch_warnings(), rc_context():  # Optuna switches the global style to ggplot: keep it local
        warnings.simplefilter("ignore")  # ExperimentalWarning of optuna.visualization.matplotlib
        axes = optuna.visualization.matplotlib.plot_slice(
            data.study, target=(lambda t: t.values[data.objective]) if multi else None, target_name=name)
    fig = np.atleast_1d(axes).flat[0].figure
    fig.set_size_inches(width_in, 4.2)
    for ax in np.atleast_1d(axes).flat:  # long verl keys side by side: smaller text than Optuna's
        ax.xaxis.label.set_fontsize(8)
        ax.tick_params(labelsize=8)
    if np.atleast_1d(axes).size > 1:
        fig.set_layout_engine("constrained")
    else:  # one searched parameter: constrained layout divides by zero on the colorbar Optuna drew beside its axes
        fig.subplots_adjust(left=0.07, right=0.88, bottom=0.15, top=0.88)
    return fig


def _table(data: TableData, width_in: float) -> Figure:
    rows = data.rows or [[""] * len(data.columns)]
    available = int(width_in * 0.94 * CHARS_PER_INCH)  # the table's own margins take ~4 % of the axes width
    limits = _column_widths([[c, *(row[i] for row in rows)] for i, c in enumerate(data.columns)], available)
    cells = [[textwrap.fill(c, limit) for c, limit in zip(row, limits)] for row in [data.columns, *rows]]
    heights = [LINE_IN * max([c.count("\n") + 1 for c in row], default=1) + 0.06 for row in cells]
    while len(cells) > 2 and TITLE_IN + sum(heights) > MAX_HEIGHT_IN:  # the header and at least one row
        cells.pop()
        heights.pop()
    title = data.title
    if len(cells) - 1 < len(rows):
        title += f" (first {len(cells) - 1} of {len(rows)} rows)"
    height_in = TITLE_IN + sum(heights) + 0.1
    fig = Figure(figsize=(width_in, height_in))
    fig.suptitle("\n".join(textwrap.wrap(title, 140)), x=0.01, y=1 - 0.08 / height_in, ha="left", va="top",
                 fontweight="bold", fontsize=10)
    ax = fig.add_axes((0.01, 0.05 / height_in, 0.98, sum(heights) / height_in))
    ax.axis("off")
    if not data.columns:
        return fig
    table = ax.table(cellText=cells[1:], colLabels=cells[0], cellLoc="left", colLoc="left", loc="upper left",
                     colWidths=[(limit + 3) / (width_in * 0.98 * CHARS_PER_INCH) for limit in limits])
    pads = [1.0 / (limit + 3) for limit in limits]  # one character each side (matplotlib's default: 10 % of the cell)
    table.auto_set_font_size(False)
    table.set_fontsize(TABLE_FONT)
    for (r, c), cell in table.get_celld().items():
        cell.set_height(heights[r] / sum(heights))
        cell.PAD = pads[c]
        cell.set_edgecolor("#dddddd")
        if r == 0:
            cell.set_facecolor("#dde4f0")
    return fig


def _column_widths(columns: list[list[str]], available: int) -> list[int]:
    """Characters per line of each column: its longest cell.

    When the columns do not fit ``available`` characters together (3 of padding per column), the widest are cut to
    a common limit of at least 10."""
    natural = [max(len(c) for c in column) for column in columns]
    room = available - 3 * len(columns)
    if sum(natural) <= room:
        return natural
    limit = max(natural)
    while limit > 10 and sum(min(n, limit) for n in natural) > room:
        limit -= 1
    return [min(n, limit) for n in natural]


def _message(title: str, text: str, width_in: float) -> Figure:
    fig = Figure(figsize=(width_in, 3.0))
    fig.suptitle(title, x=0.01, ha="left", fontweight="bold")
    fig.text(0.5, 0.45, "\n".join(textwrap.wrap(text, 80)), ha="center", va="center", fontsize=14)
    return fig


def _close(fig: Figure) -> None:
    """Forget a figure pyplot made (Optuna's slice plot); figures made here have no pyplot manager."""
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)


_RENDERERS = {FrontData: _front, CurvesData: _curves, ImportanceData: _importance, KnobsData: _knobs,
              SliceData: _slice, TableData: _table, FrontierData: _frontier}
