"""The KL frontier's mathematics: Gao, Schulman & Hilton's over-optimisation laws, fitted by least squares.

Gao et al. 2022 ("Scaling laws for reward model overoptimization", arXiv 2210.10760, eqs. 1-2) model the gold score
gained over the initial policy as a function of ``d = sqrt(KL(pi || pi_init))``, KL per sequence in nats:

* RL:        ``R(d) = d (alpha - beta log d)``, peak at ``d* = exp(alpha / beta - 1)``, ``R(d*) = beta d*``
* best-of-n: ``R(d) = d (alpha - beta d)``,     peak at ``d* = alpha / (2 beta)``,      ``R(d*) = alpha^2 / (4 beta)``

Both are linear in ``(alpha, beta)`` and pass through ``R(0) = 0``. Each is a least-squares fit without intercept
of the gain ``score - reference`` on the features ``(d, -d log d)`` or ``(d, -d**2)``.

A trial's points are correlated (one seed, one config). The trial is the unit of resampling and of held-out error:

* KL* is read from the RL form by default: Gao et al. derive it for RL, and every klsweep trial trains by RL. The
  best-of-n form is fitted beside it, with its leave-one-trial-out error.
* Intervals are expanded percentile intervals of a bootstrap over trials (Hesterberg 2015, "What teachers should
  know about the bootstrap", The American Statistician 69(4), section 4.3): :func:`expanded_tails`.
* :func:`attainment_surface` gives the empirical attainment surfaces over seeds (Fonseca et al. 2001).

Pure numpy and scipy on arrays. BENCHMARKS.md ("KL frontier forecast") measures the forecast's accuracy and coverage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import stats

from klsweep.errors import ResultsError

Form = Literal["rl", "bon"]
FORMS: tuple[Form, ...] = ("rl", "bon")
#: The forms' names in summaries and figure legends.
FORM_NAMES = {"rl": "Gao RL form", "bon": "Gao best-of-n form"}
#: Fewer trials than this leave the two-parameter fit and its leave-one-trial-out error meaningless.
MIN_POINTS = 4
_KEYS = ("alpha", "beta", "d_star", "kl_star", "peak_score")


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

    ``beta <= 0`` has no interior maximum: the result is ``(inf, inf)`` while the gain rises with KL.
    A gain that never rises (``alpha <= 0`` with ``beta <= 0``) peaks at ``d = 0`` with gain 0.
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
    """Percentiles (0-100) of Hesterberg's (2015) expanded percentile interval at ``level`` from ``n`` units.

    Formula: ``Phi(-+ sqrt(n / (n - 1)) t_{n-1}((1 + level) / 2))``.
    At ``n`` units the interval is as wide as a Student-t one; it tends to ``(1 -+ level) / 2`` as ``n`` grows.

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
        kl_seq: ``(n,)`` per-sequence KL to the reference policy, nats, ``>= 0``
            (:func:`klsweep.analysis.frontier.frontier_paths`).
        score: ``(n,)`` gold/validation score at the same steps.
        reference: the reference policy's score (the fit's ``d = 0``).
        trials: ``(n,)`` the trial of each point (e.g. ``trial_id``: several validation steps per trial); ``None``:
            each point is its own trial. Trials are the unit of the bootstrap and of the held-out error.
        form: the form KL* is read from: ``"rl"`` (default: Gao et al.'s law for RL, which every klsweep trial
            trains by), ``"bon"``, or ``None``: the one with the lower leave-one-trial-out error.
        level: coverage of the intervals: expanded percentile intervals (:func:`expanded_tails`) of a bootstrap
            over trials (trials drawn with replacement, each with all its points).
        n_boot: bootstrap resamples; ``seed``: their generator's seed.

    Returns:
        A :class:`Frontier` with both forms' fits and intervals. ``best`` is ``form``'s fit, or the lower-error one.

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

    Source: Fonseca, Grunert da Fonseca & Hall 2001, "Inferential performance assessment of stochastic optimisers
    and the attainment function".
    A run attains a goal ``(kl, score)`` when one of its points has KL ``<=`` kl and score ``>=`` score.
    The ``k``-th surface bounds the goals at least ``k`` of the ``n`` runs attain, ``k = ceil(level * n)``.
    ``level`` 0.5 gives the median surface, 1/n the best, 1 the worst.
    In two objectives it is a staircase. At each KL where some run has a point, its height is the ``k``-th largest
    over runs of the best score reached at or below that KL.

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
