"""What the KL frontier figure shows, as data: fitted points, both Gao forms, KL* and attainment surfaces.

:func:`frontier_data` reads a :class:`klsweep.analysis.frontier.SweepFrontier`; :mod:`klsweep.analysis.plots` and
:mod:`klsweep.analysis.pngs` draw it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from klsweep.analysis.figures import Points
from klsweep.analysis.frontier import RESPONSE_LENGTH, kl_star_interval
from klsweep.analysis.frontier_fit import FORM_NAMES, attainment_surface

if TYPE_CHECKING:
    from klsweep.analysis.frontier import SweepFrontier


@dataclass
class FrontierData:
    """The KL frontier of a sweep (:func:`frontier_data`): x is the per-sequence KL in nats, y the fitted score.

    ``curves``: ``(name, x, y, dashed)`` per Gao form, the best (solid) first; ``kl_star``: ``(KL*, low, high)`` of
    the best form, the interval drawn as a band and named in the legend by these bounds. It is set only when the
    whole interval lies on the axis (``high <= x_max``), so the legend states the interval the notes' summary states;
    otherwise ``None``, and a note gives the interval and why it is not drawn;
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

    Feasible trials are drawn as the fitted points; the fit itself is on their paths (the notes count the steps).
    Stopped (infeasible) trials are drawn apart, never fitted; the hover names their reason.
    Both Gao forms are drawn on ``points`` KL values from 0 to the axis end.
    The axis ends at 1.3 × the largest KL drawn, or at 1.1 × KL* when KL* lies within 3 × that KL.
    The axis is widened to 1.1 × the KL* interval's upper bound when that lies within 3 × the largest KL drawn, so
    the band is the whole interval. A KL* interval reaching further (or unbounded) is not drawn: a band cut at the
    axis end would state another interval than the summary.
    The reference score sits at ``d = 0``; KL* is drawn with its interval as a band, and the peak.
    The x axis is per-sequence KL in nats (verl's per-token KL × ``response_length/mean``).
    When the trials span several KL scales (``result.groups``), it draws one scale group, the first fitted one (most
    feasible trials), names its scale in the title, and the notes give every group's line.
    """
    if result.groups:
        shown = next((g for g in result.groups if g.frontier is not None), result.groups[0])
        data = frontier_data(shown, points)
        data.title = f"KL frontier of {shown.scale}: {result.score_metric or 'no score'} vs per-sequence KL"
        data.notes = [n for n in data.notes if n != shown.summary()] + result.summary().splitlines()
        data.notes.append(f"drawn: the trials of {shown.scale} only (trials on other KL scales are not comparable)")
        return data
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
    band = None  # the KL* interval, when the axis can hold it whole
    if f is not None and math.isfinite(f.best.kl_star):
        low, high = f.best.intervals["kl_star"]
        if 0 <= low <= high <= 3 * reach:
            x_max = max(x_max, 1.1 * high)
            band = (f.best.kl_star, low, high)
        else:
            notes.append(f"KL* interval {kl_star_interval(f)} not drawn: it reaches beyond 3 × the largest KL drawn "
                         f"({reach:.3g} nats/sequence)")
    feasible_points = (Points(f"feasible trials ({len(fitted)})", fitted["kl_seq"].tolist(), fitted["score"].tolist(),
                              fitted["hover"].tolist()) if len(fitted) else None)
    stopped_points = (Points(f"stopped or failed, not fitted ({len(stopped)})", stopped["kl_seq"].tolist(),
                             stopped["score"].tolist(),
                             [f"{h}<br>stopped: {r}" for h, r in zip(stopped["hover"], stopped["reason"])])
                      if len(stopped) else None)
    curves, kl_star, peak_point, reference = [], None, None, None
    if f is not None:
        grid = np.linspace(0.0, x_max, points)
        for fit in sorted(f.fits.values(), key=lambda fit: fit is not f.best):
            name = (f"{FORM_NAMES[fit.form]}{' (best)' if fit is f.best else ''}, leave-one-trial-out RMSE "
                    f"{fit.loo_rmse:.3g}")
            curves.append((name, grid.tolist(), f.score(np.sqrt(grid), fit.form).tolist(), fit is not f.best))
        kl_star = band
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
