"""Per-trial curves of a sweep's metrics with the health rules' thresholds, as figure data.

:func:`curves_data` decides what the curves figure shows; :mod:`klsweep.analysis.plots` and
:mod:`klsweep.analysis.pngs` draw it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import plotly.colors

from klsweep.verl.metrics import ALIASES

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.analysis.pareto import Objectives
    from klsweep.health import RuleSet

#: The three panels of :func:`curves_data`: alias (klsweep.verl.metrics.ALIASES) and axis title.
CURVES = (("ref_kl", "reference KL"), ("entropy", "actor/entropy"), ("score", "critic/score/mean"))
#: Trial colours of the curves, in order (plotly's default qualitative palette, hex).
PALETTE: tuple[str, ...] = tuple(plotly.colors.qualitative.Plotly)
#: Line styles (plotly's ``dash`` names) of the curves: trial ``i`` is drawn in colour ``i % 10`` and style
#: ``i // 10 % 4``, so 40 trials have 40 distinct colour-and-style pairs (colour alone repeated from the 11th trial).
DASHES: tuple[str, ...] = ("solid", "dash", "dot", "dashdot")


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


def thresholds(ruleset: RuleSet) -> dict[str, list[dict[str, Any]]]:
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


def curves_data(history: pd.DataFrame, df: pd.DataFrame, ruleset: RuleSet | None = None, *, objectives: Objectives = (),
                baselines: Mapping[str, float] | None = None, max_trials: int = 40) -> CurvesData:
    """Per-trial curves of each objective, reference KL, entropy and training score (panels), with health bands.

    A validation objective beside the training score (the proxy reward) shows whether the policy got better.

    Args:
        history: :func:`klsweep.analysis.sweep_dir.load_history` (long format).
        df: :func:`klsweep.analysis.sweep_dir.load` (for health verdicts, stop reasons and steps).
        ruleset: the sweep's :class:`klsweep.health.RuleSet`, or None for no thresholds (see :func:`thresholds`).
        objectives: ``(metric, mode)`` of the sweep; each gets a panel of its own unless a :data:`CURVES` panel
            shows that metric already.
        baselines: metric → the reference policy's value (:func:`klsweep.analysis.baseline.reference_scores`),
            drawn as a dotted line on the metric's panel.
        max_trials: at most this many trials are drawn (stopped trials first, then by trial number).

    Each panel's y range shows the data and every rule's threshold.
    A built-in threshold (``kl_explosion``) counts only when the data comes within a factor 2 of it.
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
