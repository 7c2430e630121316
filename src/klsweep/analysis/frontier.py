"""The KL frontier: Gao, Schulman & Hilton's over-optimisation laws fitted to a sweep's trials.

Gao et al. 2022 ("Scaling laws for reward model overoptimization", arXiv 2210.10760, eqs. 1-2) model the gold score
gained over the initial policy as a function of ``d = sqrt(KL(pi || pi_init))``, with KL per sequence in nats:

* RL:        ``R(d) = d (alpha - beta log d)``, peak at ``d* = exp(alpha / beta - 1)``, ``R(d*) = beta d*``
* best-of-n: ``R(d) = d (alpha - beta d)``,     peak at ``d* = alpha / (2 beta)``,      ``R(d*) = alpha^2 / (4 beta)``

Both are linear in ``(alpha, beta)`` and pass through ``R(0) = 0``, so each is an ordinary least-squares fit without
intercept of the gain ``score - reference`` on the features ``(d, -d log d)`` or ``(d, -d**2)``. The better form is
the one with the lower leave-one-out error; intervals are percentile bootstrap intervals over trials.

Units: verl logs KL as a per-token mean (``actor/kl_loss`` under ``token-mean``, ``actor/reward_kl_penalty``); the
paper's KL is per sequence. :func:`frontier_points` converts with each trial's mean response length
(``response_length/mean``): ``KL_seq = KL_token * response_length``. It refuses trials whose KL is on another scale
(estimator, aggregation or mechanism, :func:`klsweep.analysis.pareto.kl_scale`), as the Pareto front does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from klsweep.analysis.pareto import kl_scale
from klsweep.errors import ResultsError
from klsweep.verl.metrics import resolve

Form = Literal["rl", "bon"]
FORMS: tuple[Form, ...] = ("rl", "bon")
#: verl's mean response length per training step (tokens), ``compute_data_metrics`` in verl/trainer/ppo/metric_utils.py.
RESPONSE_LENGTH = "response_length/mean"
#: Fewer trials than this leave the two-parameter fit and its leave-one-out error meaningless.
MIN_POINTS = 4


def gao_gain(form: Form, d: np.ndarray | float, alpha: float, beta: float) -> np.ndarray:
    """Gold-score gain over the initial policy at ``d = sqrt(KL_seq)`` (Gao et al. 2022, eqs. 1-2); ``R(0) = 0``.

    Args:
        form: ``"rl"`` (``d (alpha - beta log d)``) or ``"bon"`` (``d (alpha - beta d)``).
        d: square roots of per-sequence KL in nats, any shape, ``>= 0``.
    Returns:
        Array of ``d``'s shape.
    """
    d = np.asarray(d, dtype=float)
    if form == "rl":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d > 0, d * (alpha - beta * np.log(np.where(d > 0, d, 1.0))), 0.0)
    return d * (alpha - beta * d)


def _features(form: Form, d: np.ndarray) -> np.ndarray:
    """Design matrix ``(n, 2)`` of the linear model ``gain = X @ (alpha, beta)``."""
    if form == "rl":
        return np.column_stack([d, -d * np.log(np.where(d > 0, d, 1.0))])
    return np.column_stack([d, -d * d])


def fit_form(form: Form, d: np.ndarray, gain: np.ndarray) -> tuple[float, float]:
    """Least-squares ``(alpha, beta)`` of one form through the origin.

    Args:
        d: ``(n,)`` square roots of per-sequence KL, ``n >= 2``.
        gain: ``(n,)`` score minus the reference policy's score.
    """
    coef, *_ = np.linalg.lstsq(_features(form, d), gain, rcond=None)
    return float(coef[0]), float(coef[1])


def peak(form: Form, alpha: float, beta: float) -> tuple[float, float]:
    """``(d*, R(d*))``: where the fitted gain peaks and its value there.

    ``beta <= 0`` has no interior maximum (the gain keeps rising with KL): ``(inf, inf)`` when it rises, and for a
    gain that never rises (``alpha <= 0`` with ``beta <= 0``) the peak is at ``d = 0`` with gain 0.
    """
    if beta <= 0:
        return (math.inf, math.inf) if alpha > 0 or beta < 0 else (0.0, 0.0)
    if form == "rl":
        exponent = alpha / beta - 1.0
        if exponent > 700:  # beyond float range: a peak far outside any sweep
            return math.inf, math.inf
        d_star = math.exp(exponent)
        return d_star, beta * d_star
    if alpha <= 0:
        return 0.0, 0.0
    return alpha / (2 * beta), alpha * alpha / (4 * beta)


def loo_rmse(form: Form, d: np.ndarray, gain: np.ndarray) -> float:
    """Leave-one-out root-mean-square error of the form's predictions (held-out error used to pick the form)."""
    errors = []
    for i in range(len(d)):
        keep = np.arange(len(d)) != i
        alpha, beta = fit_form(form, d[keep], gain[keep])
        errors.append(float(gao_gain(form, d[i], alpha, beta)) - gain[i])
    return float(np.sqrt(np.mean(np.square(errors))))


@dataclass(frozen=True)
class FormFit:
    """One Gao form fitted to a sweep.

    Attributes:
        form: ``"rl"`` or ``"bon"``.
        alpha, beta: the fitted coefficients (score units per sqrt-nat).
        loo_rmse: leave-one-out RMSE of the gain, score units.
        d_star: ``sqrt(KL*)`` where the gain peaks (``inf``: no peak, the gain still rises).
        kl_star: ``d_star ** 2``, per-sequence KL in nats.
        peak_score: the reference score plus the gain at the peak.
        intervals: ``{"alpha"|"beta"|"d_star"|"kl_star"|"peak_score": (low, high)}`` at ``level``.
    """

    form: Form
    alpha: float
    beta: float
    loo_rmse: float
    d_star: float
    kl_star: float
    peak_score: float
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Frontier:
    """Both forms fitted to ``n`` trials, the better one first in :attr:`best`.

    Attributes:
        reference: the reference policy's score (``d = 0``).
        fits: ``{form: FormFit}``.
        best: the form with the lower leave-one-out error.
        n: trials fitted; ``d_max``: the largest ``d`` among them (a peak beyond it is an extrapolation).
        level: the intervals' coverage (e.g. 0.8).
    """

    reference: float
    fits: dict[str, FormFit]
    best: FormFit
    n: int
    d_max: float
    level: float

    def score(self, d: np.ndarray | float, form: Form | None = None) -> np.ndarray:
        """Predicted score (reference + gain) at ``d``, by ``form`` (default: the best)."""
        fit = self.fits[form] if form else self.best
        return self.reference + gao_gain(fit.form, d, fit.alpha, fit.beta)

    @property
    def extrapolated(self) -> bool:
        """The best form's peak lies beyond the largest KL the sweep reached."""
        return self.best.d_star > self.d_max

    def interval_width(self, key: str = "kl_star") -> float:
        """Relative width ``(high - low) / estimate`` of the best form's interval on ``key`` (``inf`` if unbounded)."""
        low, high = self.best.intervals[key]
        estimate = getattr(self.best, key)
        if not all(map(math.isfinite, (low, high, estimate))) or estimate == 0:
            return math.inf
        return (high - low) / abs(estimate)


def fit_frontier(
    kl_seq: Sequence[float] | np.ndarray,
    score: Sequence[float] | np.ndarray,
    reference: float,
    *,
    level: float = 0.8,
    n_boot: int = 1000,
    seed: int = 0,
) -> Frontier:
    """Fit both Gao forms to ``(KL, score)`` points of finished trials.

    Args:
        kl_seq: ``(n,)`` per-sequence KL to the reference policy, nats, ``>= 0`` (see :func:`frontier_points`).
        score: ``(n,)`` gold/validation score of the same trials at the same step.
        reference: the reference policy's score (the fit's ``d = 0``).
        level: coverage of the percentile bootstrap intervals (resampling trials with replacement).
        n_boot: bootstrap resamples; ``seed``: their generator's seed.

    Raises:
        ResultsError: fewer than :data:`MIN_POINTS` finite points, or a negative KL.
    """
    kl = np.asarray(kl_seq, dtype=float)
    y = np.asarray(score, dtype=float)
    ok = np.isfinite(kl) & np.isfinite(y)
    kl, y = kl[ok], y[ok]
    if len(kl) < MIN_POINTS:
        raise ResultsError(f"the KL frontier needs at least {MIN_POINTS} trials with a KL and a score; got {len(kl)}")
    if (kl < 0).any():
        raise ResultsError(f"KL must be >= 0 to fit the frontier, got {kl.min():g}: use a non-negative estimator "
                           "(kl on a trial that ended, or low_var_kl/k3, mse/k2, abs)")
    d, gain = np.sqrt(kl), y - reference
    rng = np.random.default_rng(seed)
    samples = rng.integers(0, len(d), size=(n_boot, len(d)))
    tails = ((1 - level) / 2 * 100, (1 + level) / 2 * 100)
    fits = {}
    for form in FORMS:
        alpha, beta = fit_form(form, d, gain)
        d_star, best_gain = peak(form, alpha, beta)
        boot = []
        for idx in samples:
            a, b = fit_form(form, d[idx], gain[idx])
            ds, g = peak(form, a, b)
            boot.append((a, b, ds, ds * ds, reference + g))
        table = np.array(boot)
        intervals = {
            key: tuple(float(v) for v in np.percentile(table[:, i], tails, method="inverted_cdf"))
            for i, key in enumerate(("alpha", "beta", "d_star", "kl_star", "peak_score"))
        }
        fits[form] = FormFit(form, alpha, beta, loo_rmse(form, d, gain), d_star, d_star * d_star,
                             reference + best_gain, intervals)  # type: ignore[arg-type]
    best = min(fits.values(), key=lambda f: f.loo_rmse)
    return Frontier(reference, fits, best, len(d), float(d.max()), level)


def attainment_surface(runs: Sequence[np.ndarray], level: float) -> np.ndarray:
    """The empirical ``level``-attainment surface of several runs' fronts of (KL down, score up).

    Fonseca, Grunert da Fonseca & Hall 2001 ("Inferential performance assessment of stochastic optimisers and the
    attainment function"): a goal ``(kl, score)`` is attained by a run when one of its points has KL ``<=`` kl and
    score ``>=`` score; the ``k``-th attainment surface bounds the goals attained by at least ``k`` of the ``n``
    runs, with ``k = ceil(level * n)`` (``level`` 0.5 is the median surface, 1/n the best, 1 the worst).
    In two objectives it is a staircase: at each KL where some run has a point, the ``k``-th largest over runs of
    the best score reached at or below that KL.

    Args:
        runs: one ``(m_i, 2)`` array of ``(kl, score)`` per run (e.g. per training seed), NaN rows ignored.
        level: in ``(0, 1]``.

    Returns:
        ``(p, 2)`` array of the staircase's corners ``(kl, score)``, KL ascending, score strictly ascending.

    Raises:
        ValueError: ``level`` outside ``(0, 1]`` or no runs.
    """
    if not 0 < level <= 1:
        raise ValueError(f"level must be in (0, 1], got {level}")
    if not runs:
        raise ValueError("attainment_surface needs at least one run")
    clean = [r[np.isfinite(r).all(axis=1)] for r in (np.asarray(r, dtype=float).reshape(-1, 2) for r in runs)]
    k = max(1, math.ceil(level * len(clean) - 1e-9))
    corners: list[tuple[float, float]] = []
    for kl in np.unique(np.concatenate([r[:, 0] for r in clean])):
        best = sorted((r[r[:, 0] <= kl, 1].max(initial=-math.inf) for r in clean), reverse=True)
        score = best[k - 1]
        if math.isfinite(score) and (not corners or score > corners[-1][1]):
            corners.append((float(kl), float(score)))
    return np.array(corners, dtype=float).reshape(-1, 2)


def frontier_points(history: pd.DataFrame, score_metric: str, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per trial, the per-sequence KL and the score at the trial's last step that logged both.

    Args:
        history: :func:`klsweep.analysis.load.load_history` (long format: ``trial_id, step, metric, value``).
        score_metric: the gold/validation metric (e.g. ``val-core/arith/acc/mean@1``).
        trials: :func:`klsweep.analysis.load.load` of the same sweep; when given, the KL scales of the fitted trials
            (:func:`klsweep.analysis.pareto.kl_scale`) must agree.

    Returns:
        Columns ``trial_id, step, kl_token, response_length, kl_seq, score, kl_metric`` (one row per trial that
        logged a reference KL, the response length and the score at one step), and ``attrs["reference"]``: the
        median over trials of the score logged at the earliest step any trial logged one (verl validates the
        initial policy before training); a trial whose history starts later (restarted from a checkpoint by a
        remedy) is left out of it.

    Raises:
        ResultsError: no trial logged all three, or the trials measure KL on different scales.
    """
    rows, firsts = [], []
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
        step, (kl_token, length, score) = both.index[-1], both.iloc[-1].to_numpy()
        rows.append((trial_id, int(step), kl_token, length, kl_token * length, score, kl_metric))
    if not rows:
        raise ResultsError(f"no trial logged a reference KL, {RESPONSE_LENGTH} and {score_metric} at the same step")
    out = pd.DataFrame(rows, columns=["trial_id", "step", "kl_token", "response_length", "kl_seq", "score",
                                      "kl_metric"])
    if out["kl_metric"].nunique() > 1:
        raise ResultsError("the trials log KL in different metrics (" + ", ".join(sorted(out["kl_metric"].unique()))
                           + "): one frontier per KL mechanism; fit the trials of one at a time")
    if trials is not None and "trial_id" in trials:
        scales = kl_scale(trials[trials["trial_id"].isin(out["trial_id"])]).unique()
        if len(scales) > 1:
            raise ResultsError("the trials measure KL on different scales (" + "; ".join(sorted(scales))
                               + "): fit one estimator and aggregation at a time")
    earliest = min(step for step, _ in firsts)
    out.attrs["reference"] = float(np.median([v for step, v in firsts if step == earliest]))
    return out


#: The training seed's column in :func:`klsweep.analysis.load.load` (verl's ``data.seed``); trials that differ only
#: in it ran the same config.
SEED_COLUMN = "config/data.seed"
FORM_NAMES = {"rl": "Gao RL form", "bon": "Gao best-of-n form"}


@dataclass(frozen=True)
class SweepFrontier:
    """The KL frontier of one sweep (:func:`sweep_frontier`), or the reason there is none.

    Attributes:
        score_metric: the fitted score (``None`` when the sweep maximises no objective); ``score_source`` says why.
        reference_source: where the score at ``d = 0`` came from.
        points: the feasible trials' points (:func:`frontier_points` columns plus ``number`` and ``hover``).
        stopped: the infeasible trials' points (same columns plus ``reason``), never fitted.
        frontier: the fit, or ``None``; ``reason`` then says why.
        runs: one ``(m, 2)`` array of ``(kl_seq, score)`` per training seed when some config ran with several
            seeds (:func:`attainment_surface` input), else empty.
    """

    score_metric: str | None
    score_source: str
    reference_source: str
    points: pd.DataFrame
    stopped: pd.DataFrame
    frontier: Frontier | None
    reason: str | None
    runs: list[np.ndarray] = field(default_factory=list)

    def summary(self) -> str:
        """One line: ``KL frontier (Gao RL form, N trials): KL* = x nats/sequence [lo, hi] (80 %), peak score y
        [lo, hi]``, then a warning when the KL* interval is too wide (relative width > 1) or the peak is
        extrapolated (beyond the largest KL reached); or the reason there is no fit."""
        f = self.frontier
        if f is None:
            return f"KL frontier: not fitted: {self.reason}"
        b, pct = f.best, f"{f.level * 100:g} %"
        (kl_lo, kl_hi), (p_lo, p_hi) = b.intervals["kl_star"], b.intervals["peak_score"]
        line = (f"KL frontier ({FORM_NAMES[b.form]}, {f.n} trials): KL* = {b.kl_star:.3g} nats/sequence "
                f"[{kl_lo:.3g}, {kl_hi:.3g}] ({pct}), peak score {b.peak_score:.3g} [{p_lo:.3g}, {p_hi:.3g}]")
        warnings = []
        width = f.interval_width()
        if width > 1:
            warnings.append(f"interval too wide to act on (relative width {width:.3g} > 1): run more trials")
        if f.extrapolated:
            warnings.append(f"extrapolated: the peak lies beyond the largest KL reached ({f.d_max ** 2:.3g} "
                            "nats/sequence)")
        return line + "".join(f"; ⚠ {w}" for w in warnings)


def score_metric_of(objectives: Sequence) -> tuple[str | None, str]:
    """The score a frontier is fitted to: the first maximised validation objective (``val-…``, the gold score of
    Gao et al.), else the first maximised objective (a training score: the proxy reward, said), and why.

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


def sweep_frontier(source, *, level: float = 0.8, n_boot: int = 1000,
                   references: Mapping[str, float] | None = None) -> SweepFrontier:
    """Fit the KL frontier of a sweep on its feasible trials (COMPLETE, not stopped by a health rule).

    Args:
        source: a sweep directory, or ``(df, history, record)``: :func:`klsweep.analysis.load.load`,
            :func:`klsweep.analysis.load.load_history` and its :class:`klsweep.results.SweepRecord`.
        level, n_boot: of :func:`fit_frontier`.
        references: metric → the reference policy's score, the fit's ``d = 0``
            (:func:`klsweep.analysis.baseline.reference_scores`: the embedded trainer's validation); ``None``
            computes them (seconds: it builds and validates the reference policy), ``{}`` skips that. A metric
            without one falls back to the feasible trials' median score at the earliest step they logged it
            (:func:`frontier_points`).

    Returns:
        A :class:`SweepFrontier`; its ``frontier`` is ``None`` (and ``reason`` says why) when the sweep maximises no
        objective, fewer than :data:`MIN_POINTS` feasible trials logged a KL, ``response_length/mean`` and the score
        at one step, no KL was logged, the trials measure KL on different scales, or a KL is negative.

    Raises:
        ResultsError: ``source`` is not a sweep directory.
    """
    from klsweep.analysis.load import load, load_history, sweep_info
    from klsweep.analysis.pareto import feasible

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
    points, stopped, reason = empty, empty, None
    try:
        points = _points(history, metric, df[ok])
    except ResultsError as e:
        reason = str(e)
    try:
        stopped = _points(history, metric, df[~ok], check_scale=False)
        rows = df.set_index("trial_id").loc[stopped["trial_id"]]
        why = rows["stop_reason"] if "stop_reason" in rows else pd.Series("", index=rows.index)
        stopped["reason"] = [r if isinstance(r, str) and r else s for r, s in zip(why, rows["state"])]
    except ResultsError:
        pass
    reference, reference_source = math.nan, ""
    if len(points):
        if references is None:
            from klsweep.analysis.baseline import reference_scores

            references = reference_scores(record.sweep.get("trainer", ""), [metric], df,
                                          cache_dir=None if isinstance(source, tuple) else source)
        if metric in references:
            reference, reference_source = references[metric], "the reference policy's validation score"
        else:
            reference = points.attrs["reference"]
            reference_source = f"the feasible trials' median {metric} at the earliest step they logged it"
    if reason is None and len(points) < MIN_POINTS:
        reason = (f"the KL frontier needs at least {MIN_POINTS} feasible trials with a reference KL, "
                  f"{RESPONSE_LENGTH} and {metric} at one step; {len(points)} so far")
    frontier = None
    if reason is None:
        try:
            frontier = fit_frontier(points["kl_seq"], points["score"], reference, level=level, n_boot=n_boot)
        except ResultsError as e:  # a negative KL (the kl/k1 estimator mid-run)
            reason = str(e)
    return SweepFrontier(metric, score_source, reference_source, points, stopped, frontier, reason,
                         _seed_runs(points, df))


def _points(history: pd.DataFrame, metric: str, trials: pd.DataFrame, *, check_scale: bool = True) -> pd.DataFrame:
    """:func:`frontier_points` of ``trials`` with their ``number`` and a hover text (state, KL, score, knobs)."""
    if trials.empty:
        raise ResultsError("no trial")
    out = frontier_points(history[history["trial_id"].isin(trials["trial_id"])], metric,
                          trials if check_scale else None)
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
