"""The KL frontier: Gao, Schulman & Hilton's over-optimisation laws fitted to a sweep's trials.

Gao et al. 2022 ("Scaling laws for reward model overoptimization", arXiv 2210.10760, eqs. 1-2) model the gold score
gained over the initial policy as a function of ``d = sqrt(KL(pi || pi_init))``, with KL per sequence in nats:

* RL:        ``R(d) = d (alpha - beta log d)``, peak at ``d* = exp(alpha / beta - 1)``, ``R(d*) = beta d*``
* best-of-n: ``R(d) = d (alpha - beta d)``,     peak at ``d* = alpha / (2 beta)``,      ``R(d*) = alpha^2 / (4 beta)``

Both are linear in ``(alpha, beta)`` and pass through ``R(0) = 0``, so each is an ordinary least-squares fit without
intercept of the gain ``score - reference`` on the features ``(d, -d log d)`` or ``(d, -d**2)``.

As in the paper, whose RL curves are a run's checkpoints along training, the points are every validation step of
each trial (its path from the reference policy outwards, :func:`frontier_paths`), not one end point per trial: a
trial that over-optimises crosses the peak on its way and shows where the gain turns, so a few trials pin the shape
(on the tabular benchmark, 4 finished trials and 2 running forecast the 12-trial KL* within ±25 % in 0.99-1.00 of
held-out sweeps, end points in 0.06-0.37; ``benchmarks/frontier_forecast.py``). A trial's points are correlated (one
seed, one config), so the trial is the unit of resampling and of held-out error:

* the form used is the RL form (Gao et al. derive it for RL, and every klsweep trial trains by RL); the best-of-n
  form is fitted beside it with its leave-one-trial-out error. Choosing the form by that error flips between the two
  from one few-trial draw to the next (``form=None`` does so);
* intervals are expanded percentile intervals of a bootstrap over trials (Hesterberg 2015, "What teachers should
  know about the bootstrap", The American Statistician 69(4), section 4.3): the percentiles are taken at
  ``Phi(sqrt(n / (n - 1)) t_{n-1}(q))`` instead of ``q``, so that at ``n`` trials they are as wide as a Student-t
  interval where a plain percentile interval under-covers (4 finished + 2 running trials of the tabular benchmark,
  conservative / aggressive: plain ones covered the full sweep's KL* in 0.84 / 0.83 of the tuning draws and 0.82 /
  0.77 of the held-out ones, expanded ones in 0.92 / 0.84 and 0.90 / 0.83).

Units: verl logs KL as a per-token mean (``actor/kl_loss`` under ``token-mean``, ``actor/reward_kl_penalty``); the
paper's KL is per sequence. :func:`frontier_paths` converts with the mean response length at the same step
(``response_length/mean``): ``KL_seq = KL_token * response_length``. It refuses trials whose KL is on another scale
(estimator, aggregation or mechanism, :func:`klsweep.analysis.pareto.kl_scale`), as the Pareto front does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
from scipy import stats

from klsweep.analysis.pareto import kl_scale
from klsweep.errors import ResultsError
from klsweep.verl.metrics import resolve

Form = Literal["rl", "bon"]
FORMS: tuple[Form, ...] = ("rl", "bon")
#: verl's mean response length per training step (tokens), ``compute_data_metrics`` in verl/trainer/ppo/metric_utils.py.
RESPONSE_LENGTH = "response_length/mean"
#: Fewer trials than this leave the two-parameter fit and its leave-one-trial-out error meaningless.
MIN_POINTS = 4
_KEYS = ("alpha", "beta", "d_star", "kl_star", "peak_score")
#: A KL* interval bound beyond this multiple of the largest KL the sweep reached rests on resamples whose peak lies
#: where no trial went: :meth:`SweepFrontier.summary` prints it as ``> X (extrapolated)``, not as a number.
EXTRAPOLATION_FACTOR = 10.0
#: verl's validation accuracies, ``val-core/<source>/acc/<mean|maj|best|worst>@N[/mean]`` (and ``val-aux/...``):
#: means over 0/1 correctness (``process_validation_metrics`` in verl/trainer/ppo/metric_utils.py over the reward
#: function's ``acc``, e.g. verl/utils/reward_score/math_dapo.py's bool), so within [0, 1]. ``std@N`` is not one.
_ACCURACY = re.compile(r"^val-(core|aux)/.+/acc/(mean|maj|best|worst)@\d+(/mean)?$")


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


def loo_rmse(form: Form, d: np.ndarray, gain: np.ndarray, groups: np.ndarray | None = None) -> float:
    """Leave-one-trial-out root-mean-square error of the form's predictions (the held-out error of the forms).

    Args:
        d, gain: ``(n,)`` points.
        groups: ``(n,)`` the trial of each point: a trial's points are left out together (its steps share a seed
            and a config); ``None``: each point is its own trial.
    """
    groups = np.arange(len(d)) if groups is None else np.asarray(groups)
    errors = []
    for g in np.unique(groups):
        out = groups == g
        alpha, beta = fit_form(form, d[~out], gain[~out])
        errors.extend(gao_gain(form, d[out], alpha, beta) - gain[out])
    return float(np.sqrt(np.mean(np.square(errors))))


@dataclass(frozen=True)
class FormFit:
    """One Gao form fitted to a sweep.

    Attributes:
        form: ``"rl"`` or ``"bon"``.
        alpha, beta: the fitted coefficients (score units per sqrt-nat).
        loo_rmse: leave-one-trial-out RMSE of the gain, score units.
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
    """Both forms fitted to the points of ``n`` trials, the one used for KL* in :attr:`best`.

    Attributes:
        reference: the reference policy's score (``d = 0``).
        fits: ``{form: FormFit}``.
        best: the form KL* and the peak are read from (:func:`fit_frontier`'s ``form``).
        n: trials fitted; ``n_points``: their points (validation steps); ``d_max``: the largest ``d`` among them (a
            peak beyond it is an extrapolation).
        level: the intervals' coverage (e.g. 0.8).
    """

    reference: float
    fits: dict[str, FormFit]
    best: FormFit
    n: int
    d_max: float
    level: float
    n_points: int = 0

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


def expanded_tails(level: float, n: int) -> tuple[float, float]:
    """Percentiles (0-100) of Hesterberg's (2015) expanded percentile interval at ``level`` from ``n`` resampled
    units: ``Phi(-+ sqrt(n / (n - 1)) t_{n-1}((1 + level) / 2))``; they tend to ``(1 -+ level) / 2`` as ``n`` grows.

    Raises:
        ValueError: ``n < 2`` or ``level`` outside ``(0, 1)``.
    """
    if n < 2 or not 0 < level < 1:
        raise ValueError(f"expanded_tails needs n >= 2 and 0 < level < 1, got n={n}, level={level}")
    z = math.sqrt(n / (n - 1)) * float(stats.t.ppf((1 + level) / 2, n - 1))
    upper = float(stats.norm.cdf(z)) * 100
    return 100 - upper, upper


def fit_frontier(
    kl_seq: Sequence[float] | np.ndarray,
    score: Sequence[float] | np.ndarray,
    reference: float,
    *,
    trials: Sequence | np.ndarray | None = None,
    form: Form | None = "rl",
    level: float = 0.8,
    n_boot: int = 1000,
    seed: int = 0,
) -> Frontier:
    """Fit both Gao forms to ``(KL, score)`` points of trials (finished, or the steps so far of running ones).

    Args:
        kl_seq: ``(n,)`` per-sequence KL to the reference policy, nats, ``>= 0`` (see :func:`frontier_paths`).
        score: ``(n,)`` gold/validation score at the same steps.
        reference: the reference policy's score (the fit's ``d = 0``).
        trials: ``(n,)`` the trial of each point (e.g. ``trial_id``: several validation steps per trial); ``None``:
            each point is its own trial. Trials are the unit of the bootstrap and of the held-out error.
        form: the form KL* is read from: ``"rl"`` (default: Gao et al.'s law for RL, which every klsweep trial
            trains by), ``"bon"``, or ``None``: the one with the lower leave-one-trial-out error.
        level: coverage of the intervals: expanded percentile intervals (:func:`expanded_tails`) of a bootstrap
            over trials (trials drawn with replacement, each with all its points).
        n_boot: bootstrap resamples; ``seed``: their generator's seed.

    Raises:
        ResultsError: fewer than :data:`MIN_POINTS` trials with a finite point, or a negative KL.
    """
    kl = np.asarray(kl_seq, dtype=float)
    y = np.asarray(score, dtype=float)
    groups = np.arange(len(kl)) if trials is None else np.asarray(trials)
    ok = np.isfinite(kl) & np.isfinite(y)
    kl, y, groups = kl[ok], y[ok], groups[ok]
    labels, group = np.unique(groups, return_inverse=True)
    if len(labels) < MIN_POINTS:
        raise ResultsError(f"the KL frontier needs at least {MIN_POINTS} trials with a KL and a score; "
                           f"got {len(labels)}")
    if (kl < 0).any():
        raise ResultsError(f"KL must be >= 0 to fit the frontier, got {kl.min():g}: use a non-negative estimator "
                           "(kl on a trial that ended, or low_var_kl/k3, mse/k2, abs)")
    d, gain = np.sqrt(kl), y - reference
    n = len(labels)
    # each resample: how many times each trial is drawn; the normal equations are sums over trials
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)
    tails = expanded_tails(level, n)
    fits = {}
    for f in FORMS:
        x = _features(f, d)
        xtx = np.zeros((n, 2, 2))
        xty = np.zeros((n, 2))
        np.add.at(xtx, group, x[:, :, None] * x[:, None, :])
        np.add.at(xty, group, x * gain[:, None])
        alpha, beta = fit_form(f, d, gain)
        d_star, best_gain = peak(f, alpha, beta)
        boot = []
        for c in counts:
            a, b = np.linalg.lstsq(np.tensordot(c, xtx, 1), c @ xty, rcond=None)[0]
            ds, g = peak(f, float(a), float(b))
            boot.append((a, b, ds, ds * ds, reference + g))
        table = np.array(boot)
        intervals = {
            key: tuple(float(v) for v in np.percentile(table[:, i], tails, method="inverted_cdf"))
            for i, key in enumerate(_KEYS)
        }
        fits[f] = FormFit(f, alpha, beta, loo_rmse(f, d, gain, group), d_star, d_star * d_star,
                          reference + best_gain, intervals)  # type: ignore[arg-type]
    best = fits[form] if form else min(fits.values(), key=lambda fit: fit.loo_rmse)
    return Frontier(reference, fits, best, n, float(d.max()), level, len(d))


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


def frontier_paths(history: pd.DataFrame, score_metric: str, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per trial, the per-sequence KL and the score at every step that logged a reference KL, the response length and
    the score: the trial's path from the reference policy outwards (Gao et al.'s RL points are such checkpoints).

    Args:
        history: :func:`klsweep.analysis.sweep_dir.load_history` (long format: ``trial_id, step, metric, value``).
        score_metric: the gold/validation metric (e.g. ``val-core/arith/acc/mean@1``).
        trials: :func:`klsweep.analysis.sweep_dir.load` of the same sweep; when given, the KL scales of the trials
            with a point (:func:`klsweep.analysis.pareto.kl_scale`) must agree.

    Returns:
        Columns ``trial_id, step, kl_token, response_length, kl_seq, score, kl_metric`` (one row per trial and step,
        steps ascending; a per-token ``kl`` (k1) estimate may be below 0), and ``attrs["reference"]``: the median
        over trials of the score logged at the earliest step any trial logged one (verl validates the initial policy
        before training); a trial whose history starts later (restarted from a checkpoint by a remedy) is left out
        of it.

    Raises:
        ResultsError: no trial logged all three at one step, or the trials measure KL on different scales.
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
            raise ResultsError("the trials measure KL on different scales (" + "; ".join(sorted(scales))
                               + "): fit one estimator and aggregation at a time")
    earliest = min(step for step, _ in firsts)
    out.attrs["reference"] = float(np.median([v for step, v in firsts if step == earliest]))
    return out


def frontier_points(history: pd.DataFrame, score_metric: str, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per trial, the last row of :func:`frontier_paths`: the per-sequence KL and the score at the trial's last step
    that logged a reference KL, the response length and the score (same columns and ``attrs["reference"]``).

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
FORM_NAMES = {"rl": "Gao RL form", "bon": "Gao best-of-n form"}


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
            seeds (:func:`attainment_surface` input), else empty.
        paths: the fitted points (:func:`frontier_paths`): every validation step of the feasible trials and of the
            running ones (their steps so far) with a KL ``>= 0``; ``running``: how many of the fitted trials are
            still running; ``negative``: steps left out for a KL below 0 (a per-token k1 estimate's noise).
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

    def summary(self) -> str:
        """One line: ``KL frontier (Gao RL form, N trials[ + k running]): KL* = x nats/sequence [lo, hi] (80 %), peak
        score y [lo, hi]``, then a warning when the KL* interval is too wide (relative width > 1) or the peak is
        extrapolated (beyond the largest KL reached); or the reason there is no fit. With confirmation re-runs the
        count is of configs (``N configs, R runs``: a re-run is one more seed of the config it confirms). A fit with
        no finite peak says so in words (never ``inf``): the gain still rises at the largest KL seen, or never rises;
        an interval bound no resample reached is ``unbounded``, a KL* bound beyond :data:`EXTRAPOLATION_FACTOR` times
        the largest KL reached ``> X (extrapolated)``, and the peak score of an accuracy (:func:`score_range`) is
        clipped to [0, 1] (a bootstrap upper bound of 3.74e+06 for an accuracy of 0.624 said nothing)."""
        f = self.frontier
        if f is None:
            return f"KL frontier: not fitted: {self.reason}"
        b, pct = f.best, f"{f.level * 100:g} %"
        (kl_lo, kl_hi), (p_lo, p_hi) = b.intervals["kl_star"], b.intervals["peak_score"]
        runs = int(self.paths["trial_id"].nunique()) if len(self.paths) else f.n
        if runs > f.n:
            trials = f"{f.n} configs, {runs} runs" + (f" of which {self.running} running" if self.running else "")
        else:
            trials = f"{f.n - self.running} trials" + (f" + {self.running} running" if self.running else "")
        head = f"KL frontier ({FORM_NAMES[b.form]}, {trials}): "
        if not math.isfinite(b.kl_star):
            return head + (f"no interior peak: the fitted gain still rises at the largest KL seen "
                           f"({f.d_max ** 2:.3g} nats/sequence; alpha {b.alpha:.3g}, beta {b.beta:.3g} <= 0 or "
                           "a peak beyond any float): run trials with a weaker KL penalty to find where it turns")
        if b.kl_star == 0:
            return head + ("no gain: the fitted score never rises above the reference policy's "
                           f"({f.reference:.3g}) at any KL")
        reached = f.d_max ** 2
        limit = EXTRAPOLATION_FACTOR * reached
        top = score_range(self.score_metric)
        peak_score = f"{b.peak_score:.3g}"
        if top is not None and not top[0] <= b.peak_score <= top[1]:
            peak_score = f"{_clip(b.peak_score, top)} (the fit's {b.peak_score:.3g} is outside the accuracy's range)"
        line = (f"{head}KL* = {b.kl_star:.3g} nats/sequence [{_bound(kl_lo, limit)}, {_bound(kl_hi, limit)}] ({pct}), "
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
        return line + "".join(f"; ⚠ {w}" for w in warnings)


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
    """The values ``metric`` can take: ``(0, 1)`` for verl's validation accuracies (``val-core/<source>/acc/mean@N``
    and the other means, majorities, bests and worsts of the 0/1 ``acc``, see :data:`_ACCURACY`); ``None`` (no known
    bound) for any other score, e.g. ``val-core/<source>/reward/mean@N``, the reward function's own scale."""
    return (0.0, 1.0) if metric and _ACCURACY.match(metric) else None


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
    """Fit the KL frontier of a sweep on the paths (every validation step, :func:`frontier_paths`) of its feasible
    trials (COMPLETE, not stopped by a health rule) and of its running ones (their steps so far: the forecast while
    the sweep runs; one whose searched KL estimator or aggregation no finished trial ran is left out), once
    :data:`MIN_POINTS` feasible configs have a point. The KL scales are checked on the finished trials. The unit of
    the bootstrap and of the held-out error is the config: a confirmation re-run (``confirm_of``) differs from the
    search trial it confirms only in its training seed, so its points are resampled and left out together with that
    trial's (:func:`klsweep.analysis.confirm.config_of`), and ``Frontier.n`` counts configs.

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
        at one step, no KL was logged, or the trials measure KL on different scales. Steps with a KL below 0 (the
        per-token ``kl`` (k1) estimate can end there) are left out of the fit and counted in ``negative``.

    Raises:
        ResultsError: ``source`` is not a sweep directory.
    """
    from klsweep.analysis.confirm import config_of
    from klsweep.analysis.pareto import feasible
    from klsweep.analysis.sweep_dir import load, load_history, sweep_info

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
    try:
        paths = frontier_paths(history[history["trial_id"].isin(fitted["trial_id"])], metric, df[ok])
        points = _points(paths, metric, df[ok])
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
            from klsweep.analysis.baseline import reference_scores

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
                  + (" (a confirmation re-run counts with the trial it confirms)" if len(points) > n_configs else ""))
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
    return SweepFrontier(metric, score_source, reference_source, points, stopped, frontier, reason,
                         _seed_runs(points, df), paths, n_running, negative)


#: verl keys (last component) that set the scale a trial's KL is measured on (:func:`klsweep.analysis.pareto.kl_scale`).
_SCALE_KEYS = ("kl_loss_type", "kl_penalty", "loss_agg_mode", "loss_scale_factor", "use_kl_loss", "use_kl_in_reward")


def _same_kl_settings(df: pd.DataFrame, finished: pd.DataFrame) -> pd.Series:
    """Per trial, whether each KL-scale setting it holds (:data:`_SCALE_KEYS` among its ``config/`` columns) is one
    the finished trials ran with. A running trial's row holds only its searched values until the study is told its
    whole overrides, so its scale cannot be read by :func:`~klsweep.analysis.pareto.kl_scale`; one that searched
    another estimator or aggregation is left out of the fit."""
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
