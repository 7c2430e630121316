"""klsweep.analysis.frontier_fit: Gao et al. (2022) forms fitted to (KL, score) points.

Expected values come from outside the module: peaks by a dense grid search of the closed forms written out here,
coefficients by scipy's nonlinear least squares, and coverage from repeated simulation with a known truth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import curve_fit

from klsweep.analysis.frontier_fit import (
    attainment_surface,
    expanded_tails,
    fit_frontier,
    gao_gain,
    loo_rmse,
    peak,
)
from klsweep.errors import ResultsError


def rl(d, a, b):  # Gao et al. 2022, eq. 2 (RL)
    return d * (a - b * np.log(d))


def bon(d, a, b):  # Gao et al. 2022, eq. 1 (best-of-n)
    return d * (a - b * d)


@pytest.mark.parametrize(("form", "law", "alpha", "beta"), [("rl", rl, 1.0, 0.5), ("rl", rl, 0.3, 0.4),
                                                            ("bon", bon, 0.8, 0.25), ("bon", bon, 0.2, 0.05)])
def test_peak_is_the_maximum_of_the_law(form, law, alpha, beta):
    grid = np.linspace(1e-4, 20, 400_001)
    values = law(grid, alpha, beta)
    d_star, gain = peak(form, alpha, beta)
    assert d_star == pytest.approx(grid[values.argmax()], abs=1e-3)
    assert gain == pytest.approx(values.max(), rel=1e-6)
    assert np.allclose(gao_gain(form, grid[::1000], alpha, beta), values[::1000])


def test_no_interior_peak_when_the_gain_keeps_rising():
    assert peak("rl", 1.0, -0.1) == (math.inf, math.inf)
    assert peak("bon", 1.0, 0.0) == (math.inf, math.inf)
    assert peak("bon", -1.0, 0.5) == (0.0, 0.0)  # never rises: spend no KL


@pytest.mark.parametrize(("form", "law", "alpha", "beta"), [("rl", rl, 1.0, 0.5), ("bon", bon, 0.8, 0.25)])
def test_fit_recovers_the_generating_law_and_picks_its_form(form, law, alpha, beta):
    rng = np.random.default_rng(1)
    d = rng.uniform(0.2, 4.0, 40)
    reference = 0.3
    score = reference + law(d, alpha, beta) + rng.normal(0, 0.02, d.size)
    frontier = fit_frontier(d**2, score, reference, form=None, n_boot=200)
    fit = frontier.fits[form]
    (a_ref, b_ref), _ = curve_fit(law, d, score - reference, p0=(0.5, 0.5))
    assert (fit.alpha, fit.beta) == pytest.approx((a_ref, b_ref), rel=1e-6)  # same least squares, solved another way
    assert (fit.alpha, fit.beta) == pytest.approx((alpha, beta), abs=0.05)
    assert frontier.best.form == form
    true_d, true_gain = peak(form, alpha, beta)
    assert fit.kl_star == pytest.approx(true_d**2, rel=0.15)
    assert fit.peak_score == pytest.approx(reference + true_gain, abs=0.03)
    low, high = fit.intervals["kl_star"]
    assert low < fit.kl_star < high
    assert frontier.score(0.0) == pytest.approx(reference)


def test_intervals_cover_the_truth_at_about_their_level():
    """80 % bootstrap intervals on KL* from 20 noisy trials cover the true KL* in at least 65 % of 60 sweeps (a
    percentile bootstrap under-covers a little at n = 20; 65 % is 2.9 standard errors below 80 %)."""
    rng = np.random.default_rng(7)
    alpha, beta = 1.0, 0.5
    true_kl = peak("rl", alpha, beta)[0] ** 2
    covered = 0
    for seed in range(60):
        d = rng.uniform(0.3, 4.0, 20)
        score = rl(d, alpha, beta) + rng.normal(0, 0.05, d.size)
        low, high = fit_frontier(d**2, score, 0.0, level=0.8, n_boot=300, seed=seed).fits["rl"].intervals["kl_star"]
        covered += low <= true_kl <= high
    assert covered / 60 >= 0.65


def test_too_few_points_and_negative_kl_are_refused():
    with pytest.raises(ResultsError, match="at least 4 trials"):
        fit_frontier([0.1, 0.2, float("nan"), 0.3], [0.1, 0.2, 0.3, 0.4], 0.0)
    with pytest.raises(ResultsError, match="KL must be >= 0"):
        fit_frontier([0.1, 0.2, -0.3, 0.4], [0.1, 0.2, 0.3, 0.4], 0.0)


def test_attainment_surfaces_of_a_hand_built_two_seed_front():
    """Two seeds of the same three configs, (KL, score) with KL down and score up. Worked by hand:
    seed A reaches score 0.4 from KL 0.1, 0.6 from 0.3, 0.7 from 0.5; seed B 0.5 from 0.2, 0.55 from 0.4, 0.8 from 0.6.
    Best (k = 1, level 0.5 of 2 runs): at KL 0.1 → 0.4, 0.2 → 0.5, 0.3 → 0.6, 0.5 → 0.7, 0.6 → 0.8.
    Worst (k = 2, level 1): at 0.2 → min(0.4, 0.5) = 0.4 (no change from nothing → first corner), 0.3 → min(0.6, 0.5) =
    0.5, 0.4 → min(0.6, 0.55) = 0.55, 0.5 → min(0.7, 0.55) = 0.55 (no corner), 0.6 → min(0.7, 0.8) = 0.7."""
    a = np.array([[0.1, 0.4], [0.3, 0.6], [0.5, 0.7]])
    b = np.array([[0.2, 0.5], [0.4, 0.55], [0.6, 0.8]])
    best = attainment_surface([a, b], 0.5)
    worst = attainment_surface([a, b], 1.0)
    assert best.tolist() == [[0.1, 0.4], [0.2, 0.5], [0.3, 0.6], [0.5, 0.7], [0.6, 0.8]]
    assert worst.tolist() == [[0.2, 0.4], [0.3, 0.5], [0.4, 0.55], [0.6, 0.7]]
    assert attainment_surface([a, b], 0.25).tolist() == best.tolist()  # ceil(0.25 * 2) = 1
    assert attainment_surface([a], 1.0).tolist() == a.tolist()  # one run: its own front
    with pytest.raises(ValueError, match="level"):
        attainment_surface([a], 0.0)


def test_intervals_have_an_unbounded_end_when_resamples_have_no_peak():
    """A gain still rising at the largest KL: many resamples fit beta <= 0 (no peak, KL* = inf). The interval is then
    [finite, inf] (order statistics of the bootstrap), where interpolating between two infinite resamples gave NaN."""
    f = fit_frontier([1, 4, 9, 16], [1.0, 2.1, 2.9, 4.2], 0.0, n_boot=200)
    for fit in f.fits.values():
        low, high = fit.intervals["kl_star"]
        assert math.isfinite(low) and high == math.inf
    assert f.interval_width() == math.inf


def test_expanded_percentiles_match_a_student_t_interval():
    """Hesterberg (2015): at n = 6 and level 0.8 the percentiles are Phi(-+ sqrt(6/5) t_5(0.9)), t_5(0.9) = 1.476
    (t table), so Phi(1.617) = 0.9470; they tend to 10/90 as n grows."""
    low, high = expanded_tails(0.8, 6)
    assert (low, high) == pytest.approx((5.30, 94.70), abs=0.02)
    assert expanded_tails(0.8, 10_000) == pytest.approx((10.0, 90.0), abs=0.02)
    with pytest.raises(ValueError, match="n >= 2"):
        expanded_tails(0.8, 1)


def test_held_out_error_leaves_a_whole_trial_out():
    """Two trials of three steps each on a line through the origin, and a third off it: leaving trial c out fits the
    line exactly from a and b, so c's held-out error is its whole offset; leaving a point out would not."""
    d = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
    gain = np.concatenate([d[:6] * 0.5, d[6:] * 0.5 + 1.0])
    groups = np.repeat(["a", "b", "c"], 3)
    rmse = loo_rmse("bon", d, gain, groups)
    errors = []
    for g in "abc":
        keep = groups != g
        (a, b), *_ = np.linalg.lstsq(np.column_stack([d[keep], -d[keep] ** 2]), gain[keep], rcond=None)
        errors.extend(d[~keep] * (a - b * d[~keep]) - gain[~keep])
    assert rmse == pytest.approx(math.sqrt(np.mean(np.square(errors))))
    assert rmse > loo_rmse("bon", d, gain)  # point by point, c's other steps pull the fit towards each left-out one


def _partial_sweep(rng, finished: int = 4, running: int = 2, steps: int = 8):
    """Points of a sweep on the Gao RL law (alpha 1, beta 0.5 over 0.2: KL* = e**2, peak 0.2 + 0.5 e): each trial's
    d grows linearly to its end (uniform in [0.5, 5]) over ``steps`` validation steps, with N(0, 0.05) noise per
    step; a running trial has logged a random number of its steps so far."""
    kl, score, trial = [], [], []
    for t in range(finished + running):
        n = steps if t < finished else int(rng.integers(1, steps + 1))
        d = rng.uniform(0.5, 5.0) * np.arange(1, n + 1) / steps
        kl += list(d**2)
        score += list(0.2 + rl(d, 1.0, 0.5) + rng.normal(0, 0.05, n))
        trial += [t] * n
    return kl, score, trial


def test_a_partial_sweeps_forecast_covers_the_true_peak_at_its_level():
    """The forecast from 4 finished trials and the paths so far of 2 running ones, over 60 synthetic sweeps.
    Its 80 % intervals cover the true KL* = e**2 and the true peak score in at least 65 % of them each.
    65 % is 2.9 standard errors below 80 % at 60 draws. Trials here share no per-trial seed offset."""
    true_d, true_gain = math.e, 0.5 * math.e  # the peak of d (1 - 0.5 log d): log d = 1
    kl_hits = peak_hits = 0
    for seed in range(60):
        kl, score, trial = _partial_sweep(np.random.default_rng(seed))
        fit = fit_frontier(kl, score, 0.2, trials=trial, n_boot=300, seed=seed).best
        assert fit.form == "rl"
        low, high = fit.intervals["kl_star"]
        kl_hits += low <= true_d**2 <= high
        low, high = fit.intervals["peak_score"]
        peak_hits += low <= 0.2 + true_gain <= high
    assert kl_hits / 60 >= 0.65 and peak_hits / 60 >= 0.65
