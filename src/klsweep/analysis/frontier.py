"""The KL frontier of a sweep: its trials' paths in (per-sequence KL, score), fitted by :mod:`.frontier_fit`.

The points are every validation step of each trial (its path from the reference policy outwards,
:func:`frontier_paths`), as Gao et al. 2022 fit a run's checkpoints along training. A trial that over-optimises
crosses the peak on its way, so a few trials pin the shape. :func:`sweep_frontier` assembles the points from a sweep's
trials table and histories, picks the score and the reference, and fits them.

Units: verl logs KL as a per-token mean (``actor/kl_loss`` under ``token-mean``, ``actor/reward_kl_penalty``). The
paper's KL is per sequence: :func:`frontier_paths` computes ``KL_seq = KL_token * response_length/mean`` at the
same step. Trials whose KL is on different scales (estimator, aggregation or mechanism,
:func:`klsweep.analysis.pareto.kl_scale`) are never fitted together: :func:`sweep_frontier` then fits one frontier per
scale group (the trials that share one scale) and says why a group has none.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from klsweep.analysis.baseline import reference_scores
from klsweep.analysis.confirm import config_of
from klsweep.analysis.frontier_fit import FORM_NAMES, MIN_POINTS, fit_frontier
from klsweep.analysis.pareto import feasible, kl_scale, remedied_trials
from klsweep.analysis.sweep_dir import load, load_history, sweep_info
from klsweep.errors import ResultsError
from klsweep.verl.metrics import resolve

if TYPE_CHECKING:
    from pathlib import Path

    from klsweep.analysis.frontier_fit import Frontier
    from klsweep.results import SweepRecord

#: verl's mean response length per training step (tokens), ``compute_data_metrics`` in verl/trainer/ppo/metric_utils.py.
RESPONSE_LENGTH = "response_length/mean"
#: A KL* interval bound beyond this multiple of the largest KL the sweep reached rests on resamples whose peak lies
#: where no trial went: :meth:`SweepFrontier.summary` prints it as ``> X (extrapolated)``, not as a number.
EXTRAPOLATION_FACTOR = 10.0
#: verl's validation accuracies, ``val-core/<source>/acc/<mean|maj|best|worst>@N[/mean]`` (and ``val-aux/...``):
#: means over 0/1 correctness (``process_validation_metrics`` in verl/trainer/ppo/metric_utils.py over the reward
#: function's ``acc``, e.g. verl/utils/reward_score/math_dapo.py's bool), so within [0, 1]. ``std@N`` is not one.
_ACCURACY = re.compile(r"^val-(core|aux)/.+/acc/(mean|maj|best|worst)@\d+(/mean)?$")


class MixedScalesError(ResultsError):
    """The trials given to :func:`frontier_paths` measure KL on different scales
    (:func:`klsweep.analysis.pareto.kl_scale`): fit the trials of one scale at a time."""


def frontier_paths(history: pd.DataFrame, score_metric: str, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each trial's path from the reference policy outwards: per-sequence KL and score at each step.

    A step counts when it logged a reference KL, the response length and the score.
    Gao et al.'s RL points are such checkpoints along training.

    Args:
        history: :func:`klsweep.analysis.sweep_dir.load_history` (long format: ``trial_id, step, metric, value``).
        score_metric: the gold/validation metric (e.g. ``val-core/arith/acc/mean@1``).
        trials: :func:`klsweep.analysis.sweep_dir.load` of the same sweep; when given, the KL scales of the trials
            with a point (:func:`klsweep.analysis.pareto.kl_scale`) must agree.

    Returns:
        Columns ``trial_id, step, kl_token, response_length, kl_seq, score, kl_metric``: one row per trial and step,
        steps ascending. A per-token ``kl`` (k1) estimate may be below 0.
        ``attrs["reference"]`` is the median over trials of the score at the earliest step any trial logged one.
        verl validates the initial policy there, before training. A trial whose history starts later is left out.

    Raises:
        ResultsError: no trial logged all three at one step.
        MixedScalesError: the trials measure KL on different scales.
    """
    frames, firsts = [], []
    for trial_id, trial in history.groupby("trial_id", sort=False):
        wide = trial.pivot_table(index="step", columns="metric", values="value", aggfunc="last").sort_index()
        if score_metric not in wide:
            continue
        first = wide[score_metric].dropna()
        if len(first):
            firsts.append((first.index[0], float(first.iloc[0])))
        kl_metric = resolve(dict.fromkeys(wide.columns), "ref_kl")
        if kl_metric is None or RESPONSE_LENGTH not in wide:
            continue
        both = wide[[kl_metric, RESPONSE_LENGTH, score_metric]].dropna()
        if both.empty:
            continue
        kl_token, length, score = (both[c].to_numpy(dtype=float) for c in both.columns)
        frames.append(pd.DataFrame({"trial_id": trial_id, "step": both.index.astype(int), "kl_token": kl_token,
                                    "response_length": length, "kl_seq": kl_token * length, "score": score,
                                    "kl_metric": kl_metric}))
    if not frames:
        raise ResultsError(f"no trial logged a reference KL, {RESPONSE_LENGTH} and {score_metric} at the same step")
    out = pd.concat(frames, ignore_index=True)
    if out["kl_metric"].nunique() > 1:
        raise ResultsError("the trials log KL in different metrics (" + ", ".join(sorted(out["kl_metric"].unique()))
                           + "): one frontier per KL mechanism; fit the trials of one at a time")
    if trials is not None and "trial_id" in trials:
        scales = kl_scale(trials[trials["trial_id"].isin(out["trial_id"])]).unique()
        if len(scales) > 1:
            raise MixedScalesError("the trials measure KL on different scales (" + "; ".join(sorted(scales))
                               + "): fit one estimator and aggregation at a time")
    earliest = min(step for step, _ in firsts)
    out.attrs["reference"] = float(np.median([v for step, v in firsts if step == earliest]))
    return out


def frontier_points(history: pd.DataFrame, score_metric: str, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per trial, the last row of :func:`frontier_paths`: its end point in (per-sequence KL, score).

    Same columns and ``attrs["reference"]`` as :func:`frontier_paths`.

    Raises:
        ResultsError: as :func:`frontier_paths`.
    """
    paths = frontier_paths(history, score_metric, trials)
    out = paths.groupby("trial_id", sort=False).tail(1).reset_index(drop=True)
    out.attrs["reference"] = paths.attrs["reference"]
    return out


#: The training seed's column in :func:`klsweep.analysis.sweep_dir.load` (verl's ``data.seed``); trials that differ only
#: in it ran the same config.
SEED_COLUMN = "config/data.seed"


@dataclass(frozen=True)
class SweepFrontier:
    """The KL frontier of one sweep (:func:`sweep_frontier`), or the reason there is none.

    Attributes:
        score_metric: the fitted score (``None`` when the sweep maximises no objective); ``score_source`` says why.
        reference_source: where the score at ``d = 0`` came from.
        points: the feasible trials' end points (:func:`frontier_points` columns plus ``number`` and ``hover``).
        stopped: the infeasible trials' end points (same columns plus ``reason``), never fitted.
        frontier: the fit, or ``None``; ``reason`` then says why.
        runs: one ``(m, 2)`` array of ``(kl_seq, score)`` per training seed when some config ran with several
            seeds (:func:`klsweep.analysis.frontier_fit.attainment_surface` input), else empty.
        paths: the fitted points (:func:`frontier_paths`) with a KL ``>= 0``: every validation step of the feasible
            trials, and the steps so far of the running ones.
        running: how many of the fitted trials are still running.
        negative: steps left out for a KL below 0 (a per-token k1 estimate's noise).
        scale: the KL scale of the fitted trials (:func:`klsweep.analysis.pareto.kl_scale`), ``""`` when unknown.
        n_configs: how many feasible configs have a point.
        groups: when the feasible trials span several KL scales, one :class:`SweepFrontier` per scale group (most
            feasible configs first); this object then holds no fit of its own (``frontier`` is ``None``) and its
            ``points``, ``stopped`` and ``paths`` are the groups' together.
        remedied: how many remedied trials (restart schedules, :func:`remedied_trials`) were left out of the fit.
    """

    score_metric: str | None
    score_source: str
    reference_source: str
    points: pd.DataFrame
    stopped: pd.DataFrame
    frontier: Frontier | None
    reason: str | None
    runs: list[np.ndarray] = field(default_factory=list)
    paths: pd.DataFrame = field(default_factory=pd.DataFrame)
    running: int = 0
    negative: int = 0
    scale: str = ""
    n_configs: int = 0
    groups: tuple[SweepFrontier, ...] = ()
    remedied: int = 0

    def summary(self) -> str:
        """One line: ``KL frontier (Gao RL form, N trials[ + k running]): KL* = x nats/sequence [lo, hi] (80 %), peak
        score y [lo, hi]``, or the reason there is no fit.

        Warnings follow when the KL* interval is too wide (relative width > 1) or the peak is extrapolated.
        With confirmation re-runs it counts configs and runs (``N configs, R runs``).
        A fit without a finite peak says so in words, never ``inf``.
        An interval bound no resample reached reads ``unbounded``.
        A KL* bound beyond :data:`EXTRAPOLATION_FACTOR` times the largest KL reached reads ``> X (extrapolated)``.
        The peak score of an accuracy is clipped to its range (:func:`score_range`).
        The peak and its interval are the fitted curve's: a mean over trials, and a bootstrap over trials of where
        that mean peaks, not a bound on single runs. The points drawn beside the fit are the feasible trials' end
        points (:attr:`points`). When some end above the fitted peak score, the line says how many, and the best
        (its score, KL and trial number): the data, next to the fit they contradict. When the best ends above the
        peak interval, or above the fitted peak by more than twice the fit's leave-one-trial-out RMSE (beyond the
        scatter of trials about the curve), a ⚠ says the Gao form does not describe the trials (a score that is not
        a function of KL alone: e.g. trials whose KL penalty pulled KL back while their score still rose); their
        KL* is then not to be acted on. Otherwise, a trial that reached a score above the peak interval at some
        step is named as such.
        With scale ``groups``: a head line, each fitted group's line led by its scale, then the groups without a
        frontier and why, wrapped at 80 columns."""
        if self.groups:
            return _groups_summary(self.groups)
        f = self.frontier
        if f is None:
            return f"KL frontier: not fitted: {self.reason}"
        b, pct = f.best, f"{f.level * 100:g} %"
        p_lo, p_hi = b.intervals["peak_score"]
        runs = int(self.paths["trial_id"].nunique()) if len(self.paths) else f.n
        if runs > f.n:
            trials = f"{f.n} configs, {runs} runs" + (f" of which {self.running} running" if self.running else "")
        else:
            trials = f"{f.n - self.running} trials" + (f" + {self.running} running" if self.running else "")
        head = f"KL frontier ({FORM_NAMES[b.form]}, {trials}): "
        tail = f"; {_remedied_left_out(self.remedied)}" if self.remedied else ""
        if not math.isfinite(b.kl_star):
            return head + (f"no interior peak: the fitted gain still rises at the largest KL seen "
                           f"({f.d_max ** 2:.3g} nats/sequence; alpha {b.alpha:.3g}, beta {b.beta:.3g} <= 0 or "
                           "a peak beyond any float): run trials with a weaker KL penalty to find where it turns"
                           ) + tail
        if b.kl_star == 0:
            return head + ("no gain: the fitted score never rises above the reference policy's "
                           f"({f.reference:.3g}) at any KL") + tail
        reached = f.d_max ** 2
        top = score_range(self.score_metric)
        peak_score = f"{b.peak_score:.3g}"
        if top is not None and not top[0] <= b.peak_score <= top[1]:
            peak_score = f"{_clip(b.peak_score, top)} (the fit's {b.peak_score:.3g} is outside the accuracy's range)"
        line = (f"{head}KL* = {b.kl_star:.3g} nats/sequence {kl_star_interval(f)} ({pct}), "
                f"peak score {peak_score} [{_clip(p_lo, top)}, {_clip(p_hi, top)}]")
        warnings = []
        width = f.interval_width()
        if not math.isfinite(width):
            warnings.append("interval unbounded (some resamples have no interior peak): run more trials")
        elif width > 1:
            warnings.append(f"interval too wide to act on (relative width {width:.3g} > 1): run more trials")
        if f.extrapolated:
            warnings.append(f"extrapolated: the peak lies beyond the largest KL reached ({reached:.3g} "
                            "nats/sequence)")
        above = _above_peak(self.points, b.peak_score)
        if len(above):
            best = above.iloc[0]
            name = f"trial {int(best['number'])}" if pd.notna(best["number"]) else f"trial {best['trial_id']}"
            line += (f"; {len(above)} feasible trial{'s' * (len(above) != 1)} end{'s' * (len(above) == 1)} above the "
                     f"fitted peak (a mean over trials), the best {name} at {best['score']:.3g} "
                     f"(KL {best['kl_seq']:.3g} nats/sequence)")
            if best["score"] > p_hi or best["score"] - b.peak_score > 2 * b.loo_rmse:
                beyond = ("above its interval" if best["score"] > p_hi else
                          f"more than twice its leave-one-trial-out RMSE ({b.loo_rmse:.3g})")
                warnings.insert(0, f"the fit does not describe these trials: {name} ends "
                                   f"{best['score'] - b.peak_score:.3g} above its peak, {beyond}; do not act on KL*")
        else:
            reached_score = _best_reached(self.paths)
            if reached_score is not None and math.isfinite(p_hi) and reached_score > p_hi:
                line += (f"; the peak interval is of the fitted curve (a mean over trials), not of single runs: a "
                         f"trial reached {reached_score:.3g} once")
        return line + tail + "".join(f"; ⚠ {w}" for w in warnings)


def _groups_summary(groups: Sequence[SweepFrontier]) -> str:
    """The lines of :meth:`SweepFrontier.summary` for a sweep whose trials span several KL scales."""
    fitted = [g for g in groups if g.frontier is not None]
    lines = [f"KL frontiers, one per KL scale ({len(fitted)} of {len(groups)} fitted; trials compared within a "
             "scale):"]
    for g in fitted:
        line = f"{g.scale} {g.summary().removeprefix('KL frontier ')}"
        lines += textwrap.wrap(line, 80, initial_indent="  ", subsequent_indent="    ")
    missing = [f"{g.scale}: " + (f"{g.n_configs} feasible trial{'s' * (g.n_configs != 1)}, needs {MIN_POINTS}"
                                 if g.n_configs < MIN_POINTS else str(g.reason)) for g in groups if g.frontier is None]
    if missing:
        lines += textwrap.wrap("no frontier for " + "; ".join(missing), 80, initial_indent="  ",
                               subsequent_indent="    ")
    return "\n".join(lines)


def _above_peak(points: pd.DataFrame, peak_score: float) -> pd.DataFrame:
    """The feasible end points (:attr:`SweepFrontier.points`) with a score above ``peak_score``, best first."""
    if not len(points) or not {"score", "kl_seq", "number", "trial_id"} <= set(points.columns):
        return pd.DataFrame()
    scores = pd.to_numeric(points["score"], errors="coerce").to_numpy(dtype=float)
    above = (scores > peak_score) & ~np.isclose(scores, peak_score, rtol=1e-9, atol=1e-12)  # on the peak: not above
    return points.assign(score=scores)[above].sort_values("score", ascending=False, kind="stable")


def _best_reached(paths: pd.DataFrame) -> float | None:
    """The highest score a fitted trial logged at any validation step (``paths["score"]``), or None."""
    if not len(paths) or "score" not in paths:
        return None
    scores = pd.to_numeric(paths["score"], errors="coerce").dropna()
    return float(scores.max()) if len(scores) else None


def kl_star_interval(frontier: Frontier) -> str:
    """The best form's KL* interval as :meth:`SweepFrontier.summary` and the figure's legend state it: ``[low, high]``,
    each bound as :func:`_bound` writes it (beyond :data:`EXTRAPOLATION_FACTOR` times the largest KL reached)."""
    low, high = frontier.best.intervals["kl_star"]
    limit = EXTRAPOLATION_FACTOR * frontier.d_max ** 2
    return f"[{_bound(low, limit)}, {_bound(high, limit)}]"


def _bound(value: float, limit: float = math.inf) -> str:
    """A KL* interval bound for :meth:`SweepFrontier.summary`: ``unbounded`` when not finite, ``> limit
    (extrapolated)`` beyond ``limit`` (:data:`EXTRAPOLATION_FACTOR` times the largest KL reached), else 3 digits."""
    if not math.isfinite(value):
        return "unbounded"
    return f"> {limit:.3g} (extrapolated)" if value > limit else f"{value:.3g}"


def _clip(value: float, bounds: tuple[float, float] | None) -> str:
    """A peak-score bound for :meth:`SweepFrontier.summary`, clipped to the metric's range ``bounds`` (a confidence
    interval intersected with the values the score can take keeps its coverage); ``unbounded`` when not finite."""
    if bounds is not None:
        value = min(max(value, bounds[0]), bounds[1])
    return f"{value:.3g}" if math.isfinite(value) else "unbounded"


def score_range(metric: str | None) -> tuple[float, float] | None:
    """The values ``metric`` can take: ``(0, 1)`` for verl's validation accuracies (:data:`_ACCURACY`).

    Returns ``None`` (no known bound) for any other score, e.g. ``val-core/<source>/reward/mean@N``."""
    return (0.0, 1.0) if metric and _ACCURACY.match(metric) else None


def score_metric_of(objectives: Sequence) -> tuple[str | None, str]:
    """The score a frontier is fitted to, and why: ``(metric or None, reason)``.

    It is the first maximised validation objective (``val-…``, Gao et al.'s gold score). Without one, it is the
    first maximised objective, a training score (the proxy reward), and the reason says so.

    Args:
        objectives: :class:`klsweep.results.Objective` items (``metric``, ``mode``).
    """
    maxed = [o.metric for o in objectives if o.mode == "max"]
    validation = [m for m in maxed if m.startswith("val")]
    if validation:
        return validation[0], f"{validation[0]}: the sweep's maximised validation objective"
    if maxed:
        return maxed[0], (f"{maxed[0]}: the sweep's maximised objective (no validation objective: this measures the "
                          "training reward, not a held-out score)")
    return None, "the sweep maximises no objective: no score to fit"


def sweep_frontier(source: str | Path | tuple[pd.DataFrame, pd.DataFrame, SweepRecord], *, level: float = 0.8,
                   n_boot: int = 1000, references: Mapping[str, float] | None = None) -> SweepFrontier:
    """Fit the KL frontier of a sweep on the paths (:func:`frontier_paths`) of its feasible and running trials.

    Feasible trials are COMPLETE and not stopped by a health rule. A remedied trial (:func:`remedied_trials`) is a
    restart schedule, not one setting: it is left out of the fit, and the summary and ``reason`` say so. Running
    ones add their steps so far (the forecast while the sweep runs). A running trial whose searched KL estimator or
    aggregation no finished trial ran is left out. The KL scales are checked on the finished trials. The fit needs
    :data:`MIN_POINTS` feasible configs.
    The unit of the bootstrap and of the held-out error is the config (:func:`klsweep.analysis.confirm.config_of`):
    a confirmation re-run counts with the trial it confirms, and ``Frontier.n`` counts configs.

    Args:
        source: a sweep directory, or ``(df, history, record)``: :func:`klsweep.analysis.sweep_dir.load`,
            :func:`klsweep.analysis.sweep_dir.load_history` and its :class:`klsweep.results.SweepRecord`.
        level, n_boot: of :func:`fit_frontier`.
        references: metric → the reference policy's score, the fit's ``d = 0``
            (:func:`klsweep.analysis.baseline.reference_scores`: the embedded trainer's validation); ``None``
            computes them (seconds: it builds and validates the reference policy), ``{}`` skips that. A metric
            without one falls back to the fitted trials' median score at the earliest step they logged it
            (:func:`frontier_paths`).

    Returns:
        A :class:`SweepFrontier`; its ``frontier`` is ``None`` (and ``reason`` says why) when the sweep maximises no
        objective, fewer than :data:`MIN_POINTS` feasible trials logged a KL, ``response_length/mean`` and the score
        at one step, or no KL was logged. Steps with a KL below 0 (the per-token ``kl`` (k1) estimate can end there)
        are left out of the fit and counted in ``negative``. When the feasible trials measure KL on different scales
        (:func:`klsweep.analysis.pareto.kl_scale`), its ``groups`` hold one such fit per scale: the feasible and
        stopped trials of that scale, and the running ones with that scale's searched KL settings.

    Raises:
        ResultsError: ``source`` is not a sweep directory.
    """
    if isinstance(source, tuple):
        df, history, record = source
    else:
        df, history, record = load(source), load_history(source), sweep_info(source)
    metric, score_source = score_metric_of(record.objectives)
    empty = pd.DataFrame()
    if metric is None or df.empty or "trial_id" not in df:
        reason = score_source if metric is None else "no trial yet"
        return SweepFrontier(metric, score_source, "", empty, empty, None, reason)
    ok = feasible(df)
    health = df["health"].fillna("healthy") if "health" in df else pd.Series("healthy", index=df.index)
    running = (df["state"] == "RUNNING") & (health != "stopped")
    fitted = df[ok | (running & _same_kl_settings(df, df[ok]))]
    paths, points, stopped, reason = empty, empty, empty, None
    remedied = remedied_trials(df)
    n_remedied = int(remedied.sum())
    left_out = _left_out(ok, running, remedied)
    try:
        if fitted.empty:
            raise ResultsError(f"no feasible trial to fit: {left_out}" if left_out else "no feasible trial to fit")
        paths = frontier_paths(history[history["trial_id"].isin(fitted["trial_id"])], metric, df[ok])
        points = _points(paths, metric, df[ok])
    except MixedScalesError:
        return _by_scale(source, df, history, record, ok, running, level=level, n_boot=n_boot, references=references)
    except ResultsError as e:
        reason = str(e)
    try:
        stopped = _points(frontier_points(history[history["trial_id"].isin(df.loc[~ok & ~running, "trial_id"])],
                                          metric), metric, df[~ok & ~running])
        rows = df.set_index("trial_id").loc[stopped["trial_id"]]
        why = rows["stop_reason"] if "stop_reason" in rows else pd.Series("", index=rows.index)
        stopped["reason"] = [r if isinstance(r, str) and r else s for r, s in zip(why, rows["state"])]
    except ResultsError:
        pass
    reference, reference_source = math.nan, ""
    if len(paths):
        if references is None:
            references = reference_scores(record.sweep.get("trainer", ""), [metric], df,
                                          cache_dir=None if isinstance(source, tuple) else source)
        if metric in references:
            reference, reference_source = references[metric], "the reference policy's validation score"
        else:
            reference = paths.attrs["reference"]
            reference_source = f"the fitted trials' median {metric} at the earliest step they logged it"
    configs = config_of(df).set_axis(df["trial_id"])  # a confirmation re-run belongs to the trial it confirms
    n_configs = int(configs.loc[points["trial_id"]].nunique()) if len(points) else 0
    if reason is None and n_configs < MIN_POINTS:
        reason = (f"the KL frontier needs at least {MIN_POINTS} feasible trials with a reference KL, "
                  f"{RESPONSE_LENGTH} and {metric} at one step; {n_configs} so far"
                  + (" (a confirmation re-run counts with the trial it confirms)" if len(points) > n_configs else "")
                  + (f"; {_remedied_left_out(n_remedied)}" if n_remedied else ""))
    negative = int((paths["kl_seq"] < 0).sum()) if len(paths) else 0
    if len(paths):
        paths = paths[paths["kl_seq"] >= 0].reset_index(drop=True)
    frontier = None
    if reason is None:
        try:
            frontier = fit_frontier(paths["kl_seq"], paths["score"], reference,
                                    trials=configs.loc[paths["trial_id"]].to_numpy(), level=level, n_boot=n_boot)
        except ResultsError as e:  # every step of some trials below 0: too few trials left
            reason = str(e)
    n_running = int(fitted.loc[running, "trial_id"].isin(paths["trial_id"]).sum()) if len(paths) else 0
    scales = kl_scale(df[ok]).unique() if ok.any() else []
    return SweepFrontier(metric, score_source, reference_source, points, stopped, frontier, reason,
                         _seed_runs(points, df), paths, n_running, negative, scales[0] if len(scales) == 1 else "",
                         n_configs, remedied=n_remedied)


def _remedied_left_out(n: int) -> str:
    """``2 remedied trials ran to the end as restart schedules, not one setting each, and are left out of the fit``."""
    if n == 1:
        return "1 remedied trial ran to the end as a restart schedule, not one setting, and is left out of the fit"
    return f"{n} remedied trials ran to the end as restart schedules, not one setting each, and are left out of the fit"


def _left_out(ok: pd.Series, running: pd.Series, remedied: pd.Series) -> str:
    """Why the finished trials that are not feasible are not fitted, by kind: the ``remedied`` ones, and the ones a
    health rule stopped, pruned or failed. ``""`` when every finished trial is feasible."""
    others = int((~ok & ~running & ~remedied).sum())
    parts = [_remedied_left_out(int(remedied.sum()))] if remedied.any() else []
    if others:
        parts.append(f"{others} other trial{'s' * (others != 1)} {'were' if others != 1 else 'was'} stopped by a "
                     "health rule, pruned or failed")
    return "; ".join(parts)


def _by_scale(source: str | Path | tuple, df: pd.DataFrame, history: pd.DataFrame, record: SweepRecord,
              ok: pd.Series, running: pd.Series, *, level: float, n_boot: int,
              references: Mapping[str, float] | None) -> SweepFrontier:
    """:func:`sweep_frontier` of a sweep whose feasible trials span several KL scales: one fit per scale group.

    A group is the finished trials (feasible or not) of one :func:`~klsweep.analysis.pareto.kl_scale`, with the
    running trials whose searched KL settings its feasible trials ran (:func:`_same_kl_settings`). Groups are
    ordered by feasible configs with a point, most first, then by scale."""
    metric, score_source = score_metric_of(record.objectives)
    if references is None:
        references = reference_scores(record.sweep.get("trainer", ""), [metric] if metric else [], df,
                                      cache_dir=None if isinstance(source, tuple) else source)
    done = ~running
    scales = kl_scale(df[done])
    groups = []
    for scale in sorted(scales.unique()):
        mine = df[done].index[scales == scale]
        member = df.index.isin(mine) | (running & _same_kl_settings(df, df.loc[mine][ok.loc[mine]]))
        group = sweep_frontier((df[member], history, record), level=level, n_boot=n_boot, references=references)
        groups.append(replace(group, scale=scale))
    groups.sort(key=lambda g: (-g.n_configs, g.scale))
    parts = [(g.points, g.stopped, g.paths) for g in groups]
    points, stopped, paths = (pd.concat([p[i] for p in parts if len(p[i])], ignore_index=True)
                              if any(len(p[i]) for p in parts) else pd.DataFrame() for i in range(3))
    first = next((g for g in groups if g.reference_source), groups[0])
    return SweepFrontier(metric, score_source, first.reference_source, points, stopped, None, None, paths=paths,
                         running=sum(g.running for g in groups), negative=sum(g.negative for g in groups),
                         n_configs=sum(g.n_configs for g in groups), groups=tuple(groups))


#: verl keys (last component) that set the scale a trial's KL is measured on (:func:`klsweep.analysis.pareto.kl_scale`).
_SCALE_KEYS = ("kl_loss_type", "kl_penalty", "loss_agg_mode", "loss_scale_factor", "use_kl_loss", "use_kl_in_reward")


def _same_kl_settings(df: pd.DataFrame, finished: pd.DataFrame) -> pd.Series:
    """Per trial, whether each KL-scale setting it holds (:data:`_SCALE_KEYS`) is one the finished trials ran with.

    A running trial's row holds only its searched values, so :func:`~klsweep.analysis.pareto.kl_scale` cannot read
    its scale. This check stands in for it."""
    same = pd.Series(True, index=df.index)
    for column in (c for c in df.columns if c.startswith("config/") and c.rsplit(".", 1)[-1] in _SCALE_KEYS):
        same &= df[column].isna() | df[column].astype(str).isin(set(finished[column].dropna().astype(str)))
    return same


def _points(paths: pd.DataFrame, metric: str, trials: pd.DataFrame) -> pd.DataFrame:
    """The end points (:func:`frontier_points`) in ``paths`` of ``trials``, with their ``number`` and a hover text
    (state, KL, score, knobs)."""
    out = paths[paths["trial_id"].isin(trials["trial_id"])].groupby("trial_id", sort=False).tail(1)
    out = out.reset_index(drop=True)
    rows = trials.set_index("trial_id").loc[out["trial_id"]]
    out["number"] = rows["number"].to_numpy()
    knobs = [", ".join(f"{c[len('config/'):]}={v}" for c, v in row.items()
                       if str(c).startswith("config/") and v is not None and v == v) for _, row in rows.iterrows()]
    out["hover"] = [f"trial {n} ({s}): KL {k:.4g} nats/sequence, {metric} {y:.4g}<br>{p}" for n, s, k, y, p in
                    zip(out["number"], rows["state"], out["kl_seq"], out["score"], knobs)]
    return out


def _seed_runs(points: pd.DataFrame, df: pd.DataFrame) -> list[np.ndarray]:
    """Per training seed, the feasible points, when some config (all ``config/`` columns but the seed) ran with
    several seeds; else ``[]``."""
    if points.empty or SEED_COLUMN not in df:
        return []
    rows = df.set_index("trial_id").loc[points["trial_id"]]
    configs = rows[[c for c in rows.columns if c.startswith("config/") and c != SEED_COLUMN]]
    key = np.array(["|".join(map(str, row)) for row in configs.itertuples(index=False)])
    seeds = rows[SEED_COLUMN].to_numpy()
    if not (pd.DataFrame({"key": key, "seed": seeds}).groupby("key")["seed"].nunique() > 1).any():
        return []
    return [points.loc[seeds == s, ["kl_seq", "score"]].to_numpy(dtype=float) for s in sorted(set(seeds))]
