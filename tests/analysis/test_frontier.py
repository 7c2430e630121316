"""klsweep.analysis.frontier: a sweep's trial paths, the frontier fitted to them, and its summary line."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from klsweep.analysis.frontier import SweepFrontier, frontier_points, score_range, sweep_frontier
from klsweep.analysis.frontier_fit import FormFit, Frontier, fit_frontier, loo_rmse
from klsweep.errors import ResultsError


def _history(trials: dict[str, list[tuple[int, dict[str, float]]]]) -> pd.DataFrame:
    return pd.DataFrame([(t, step, k, v) for t, rows in trials.items() for step, m in rows for k, v in m.items()],
                        columns=["trial_id", "step", "metric", "value"])


def test_points_take_the_last_step_with_kl_length_and_score_and_convert_to_per_sequence_kl():
    val = "val-core/x/acc/mean@1"
    history = _history({
        "a": [(1, {val: 0.30, "actor/kl_loss": 0.0, "response_length/mean": 10}),
              (2, {"actor/kl_loss": 0.05, "response_length/mean": 12}),
              (3, {val: 0.50, "actor/kl_loss": 0.04, "response_length/mean": 20})],
        "b": [(1, {val: 0.32, "actor/kl_loss": 0.0, "response_length/mean": 10}),
              (2, {val: 0.40, "actor/kl_loss": 0.10, "response_length/mean": 8}),
              (3, {"actor/kl_loss": 0.2})],  # no score at step 3: step 2 is its point
        "c": [(1, {val: 0.31, "response_length/mean": 10})],  # no KL logged: not a point, still a reference
        # restarted from a step-40 checkpoint by a remedy: its first score is mid-training, not the reference's
        "d": [(40, {val: 0.90, "actor/kl_loss": 0.3, "response_length/mean": 10})],
    })
    points = frontier_points(history, val)
    assert points.set_index("trial_id")[["step", "kl_seq", "score"]].to_dict("index") == {
        "a": {"step": 3, "kl_seq": pytest.approx(0.04 * 20), "score": 0.50},
        "b": {"step": 2, "kl_seq": pytest.approx(0.10 * 8), "score": 0.40},
        "d": {"step": 40, "kl_seq": pytest.approx(0.3 * 10), "score": 0.90},
    }
    assert points.attrs["reference"] == pytest.approx(0.31)  # median of 0.30, 0.32, 0.31 (d's 0.90 at step 40 out)


def test_points_refuse_mixed_kl_metrics():
    val = "v"
    history = _history({"a": [(1, {val: 0.3, "actor/kl_loss": 0.1, "response_length/mean": 10})],
                        "b": [(1, {val: 0.3, "actor/reward_kl_penalty": 0.1, "response_length/mean": 10})]})
    with pytest.raises(ResultsError, match="different metrics"):
        frontier_points(history, val)


def test_sweep_frontier_fits_feasible_trials_and_keeps_stopped_ones_apart(synthetic_sweep):
    from .conftest import FRONTIER_OBJECTIVES, GAO_REFERENCE, VAL, frontier_specs

    # five trials on the Gao RL law (alpha 1, beta 0.5): KL* = e**2 = 7.389 nats/sequence, peak 0.2 + 0.5 e = 1.559;
    # trial 5 stopped at KL 9 with a score of 3.0 far off the law: fitted with the others, the peak would move
    run_dir = synthetic_sweep(frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 9.0], stopped={5: 3.0}),
                              objectives=FRONTIER_OBJECTIVES)
    result = sweep_frontier(run_dir, n_boot=50)
    assert result.score_metric == VAL and "validation objective" in result.score_source
    assert result.reference_source == f"the fitted trials' median {VAL} at the earliest step they logged it"
    f = result.frontier
    assert f is not None and f.best.form == "rl" and f.n == 5 and f.reference == pytest.approx(GAO_REFERENCE)
    assert f.best.kl_star == pytest.approx(math.e ** 2, rel=1e-6)
    assert f.best.peak_score == pytest.approx(0.2 + 0.5 * math.e, rel=1e-6)
    assert sorted(result.points["kl_seq"]) == pytest.approx([1.0, 4.0, 9.0, 16.0, 25.0])
    assert result.stopped["number"].tolist() == [5] and result.stopped["score"].tolist() == [3.0]
    assert result.stopped["reason"].tolist() == ["kl_runaway: actor/kl_loss > 0.5"]
    assert result.runs == []  # one seed per config
    line = result.summary()
    assert line.startswith("KL frontier (Gao RL form, 5 trials): KL* = 7.39 nats/sequence [7.39, 7.39] (80 %), "
                           "peak score 1.56 [1.56, 1.56]") and "⚠" not in line


def test_sweep_frontier_says_why_it_cannot_fit(synthetic_sweep):
    from .conftest import FRONTIER_OBJECTIVES, VAL, frontier_specs

    three = sweep_frontier(synthetic_sweep(frontier_specs([1.0, 4.0, 9.0, 16.0], stopped={3: 1.0}), name="three",
                                           objectives=FRONTIER_OBJECTIVES), n_boot=10)
    assert three.frontier is None and three.reason == (
        f"the KL frontier needs at least 4 feasible trials with a reference KL, response_length/mean and {VAL} at one "
        "step; 3 so far")
    assert three.summary() == f"KL frontier: not fitted: {three.reason}"
    # conftest.curve logs no response length (and no validation score: the training score is fitted, and said)
    training = sweep_frontier(synthetic_sweep(8, name="training"), n_boot=10)
    assert training.score_metric == "critic/score/mean" and "not a held-out score" in training.score_source
    assert training.frontier is None and training.reason == (
        "no trial logged a reference KL, response_length/mean and critic/score/mean at the same step")
    minimised = sweep_frontier(synthetic_sweep(frontier_specs([1.0] * 4), name="min",
                                               objectives=[{"metric": "actor/kl_loss", "mode": "min"}]))
    assert minimised.frontier is None and minimised.reason == "the sweep maximises no objective: no score to fit"


def test_sweep_frontier_fits_each_kl_scale_group_apart(synthetic_sweep):
    from .conftest import AGG, FRONTIER_OBJECTIVES, KL_TYPE, frontier_specs

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 2.0])
    specs[5]["params"][KL_TYPE] = "k2"  # mse/k2: another estimator, another scale
    specs[4]["params"][AGG] = "seq-mean-token-mean"  # a per-token mean like token-mean: the same scale
    result = sweep_frontier(synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES), n_boot=50)
    assert result.frontier is None and [g.scale for g in result.groups] == [
        "actor/kl_loss (low_var_kl, token-mean)", "actor/kl_loss (mse, token-mean)"]
    main, k2 = result.groups
    # the low_var_kl group alone is the one-scale sweep of test_sweep_frontier_fits_feasible_trials_...: KL* = e**2
    assert main.frontier is not None and main.frontier.n == 5 and main.n_configs == 5
    assert main.frontier.best.kl_star == pytest.approx(math.e ** 2, rel=1e-6)
    assert sorted(main.points["kl_seq"]) == pytest.approx([1.0, 4.0, 9.0, 16.0, 25.0])
    assert k2.frontier is None and k2.n_configs == 1 and k2.points["kl_seq"].tolist() == pytest.approx([2.0])
    assert sorted(result.points["kl_seq"]) == pytest.approx([1.0, 2.0, 4.0, 9.0, 16.0, 25.0])
    lines = result.summary().splitlines()
    assert lines[0] == "KL frontiers, one per KL scale (1 of 2 fitted; trials compared within a scale):"
    assert " ".join(line.strip() for line in lines[1:-1]).startswith(
        "actor/kl_loss (low_var_kl, token-mean) (Gao RL form, 5 trials): KL* = 7.39 nats/sequence [7.39, 7.39]")
    assert lines[-1] == "  no frontier for actor/kl_loss (mse, token-mean): 1 feasible trial, needs 4"
    assert all(len(line) <= 80 for line in lines)


def test_sweep_frontier_flags_a_wide_or_extrapolated_forecast(synthetic_sweep):
    from .conftest import FRONTIER_OBJECTIVES, frontier_specs

    # KL up to 4 nats/sequence (d <= 2) while the law peaks at d = e: the peak lies beyond the largest KL reached
    result = sweep_frontier(synthetic_sweep(frontier_specs([0.25, 1.0, 2.25, 4.0]), objectives=FRONTIER_OBJECTIVES),
                            n_boot=10)
    assert result.frontier is not None and result.frontier.extrapolated
    assert result.summary().endswith("; ⚠ extrapolated: the peak lies beyond the largest KL reached (4 nats/sequence)")


def test_sweep_frontier_groups_seeds_of_one_config_into_attainment_runs(synthetic_sweep):
    from .conftest import FRONTIER_OBJECTIVES, frontier_specs

    # trials 0..2 (kl_coef 1e-3, 1e-2, 1e-1) with seed 0, trials 3..5 the same configs with seed 1
    specs = frontier_specs([1.0, 4.0, 9.0, 2.0, 3.0, 16.0], seeds={i: i // 3 for i in range(6)})
    result = sweep_frontier(synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES), n_boot=10)
    assert [sorted(r[:, 0]) for r in result.runs] == [[1.0, 4.0, 9.0], [2.0, 3.0, 16.0]]


def test_sweep_frontier_fits_running_paths_and_leaves_out_negative_kl_steps(synthetic_sweep):
    from .conftest import FRONTIER_OBJECTIVES, KL_TYPE, frontier_specs

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 36.0, 49.0])
    specs[5].update(state="RUNNING", steps=3)  # 3 of its 5 steps so far, on the law: fitted
    # running with another searched estimator (k2: another scale), its whole overrides not yet in the study
    specs[6].update(state="RUNNING", steps=4)
    specs[6]["params"][KL_TYPE] = "k2"
    law = specs[0]["metrics"]
    # trial 0 logs a per-token KL of -0.001 at step 2 (a k1 estimate's noise): that step is left out, not the trial
    specs[0]["metrics"] = lambda params, step: {**law(params, step), **({"actor/kl_loss": -0.001} if step == 2 else {})}
    result = sweep_frontier(synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES), n_boot=20, references={})
    f = result.frontier
    assert f is not None and f.n == 6 and result.running == 1 and result.negative == 1
    assert f.n_points == 5 * 5 + 3 - 1 and len(result.paths) == f.n_points
    assert sorted(result.points["kl_seq"]) == pytest.approx([1.0, 4.0, 9.0, 16.0, 25.0])  # finished trials' ends
    assert f.best.kl_star == pytest.approx(math.e**2, rel=1e-6)  # every fitted step lies on the law
    assert result.summary().startswith("KL frontier (Gao RL form, 5 trials + 1 running): KL* = 7.39 nats/sequence")


def test_confirmation_re_runs_are_resampled_with_the_config_they_confirm(synthetic_sweep):
    """4 search trials on the Gao law plus 2 re-runs of trial 3 (confirm_of 3, seeds 1 and 2, a score 0.3 lower at
    their last step): the fit has 4 configs and 6 runs, and its bootstrap and held-out error treat trial 3 and its
    re-runs as one unit (as fit_frontier with labels 0, 1, 2, 3, 3, 3 does; labels per run give other intervals)."""
    from .conftest import FRONTIER_OBJECTIVES, GAO_REFERENCE, frontier_specs, gao_metrics

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0], seeds={i: 0 for i in range(4)})
    for seed in (1, 2):
        specs.append({**specs[3], "params": {**specs[3]["params"], "data.seed": seed}, "confirm_of": 3,
                      "metrics": gao_metrics(16.0, 5, score=1.0)})
    result = sweep_frontier(synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES), n_boot=200,
                            references={FRONTIER_OBJECTIVES[0]["metric"]: GAO_REFERENCE})
    f = result.frontier
    assert f is not None and f.n == 4 and f.n_points == 30
    assert result.summary().startswith("KL frontier (Gao RL form, 4 configs, 6 runs): KL* = ")
    paths = result.paths
    labels = paths["trial_id"].map({f"t{i:05d}": min(i, 3) for i in range(6)}).to_numpy()
    by_config = fit_frontier(paths["kl_seq"], paths["score"], GAO_REFERENCE, trials=labels, n_boot=200)
    by_run = fit_frontier(paths["kl_seq"], paths["score"], GAO_REFERENCE, trials=paths["trial_id"], n_boot=200)
    assert f.best.intervals == by_config.best.intervals != by_run.best.intervals
    d, gain = np.sqrt(paths["kl_seq"].to_numpy()), paths["score"].to_numpy() - GAO_REFERENCE
    assert f.best.loo_rmse == pytest.approx(loo_rmse("rl", d, gain, labels))
    assert f.best.loo_rmse != pytest.approx(loo_rmse("rl", d, gain, paths["trial_id"].to_numpy()))


def test_a_fit_without_an_interior_peak_says_so_in_words(synthetic_sweep):
    """Scores rising faster than linearly in d = sqrt(KL) (gain 0.5 d + 0.05 d**2): the RL form fits beta < 0, no
    peak; the summary says the gain still rises at the largest KL seen (16 nats/sequence) and prints no inf."""
    from .conftest import FRONTIER_OBJECTIVES, GAO_REFERENCE, RESPONSE_TOKENS, frontier_specs

    def rising(final_kl):
        def metrics(params, step):
            kl = final_kl * (step - 1) / 4
            d = math.sqrt(kl)
            return {"actor/kl_loss": kl / RESPONSE_TOKENS, "response_length/mean": RESPONSE_TOKENS,
                    FRONTIER_OBJECTIVES[0]["metric"]: GAO_REFERENCE + 0.5 * d + 0.05 * d * d,
                    "actor/entropy": 1.0, "critic/score/mean": 0.5}
        return metrics

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0])
    for spec, kl in zip(specs, [1.0, 4.0, 9.0, 16.0]):
        spec["metrics"] = rising(kl)
    result = sweep_frontier(synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES), n_boot=50,
                            references={FRONTIER_OBJECTIVES[0]["metric"]: GAO_REFERENCE})
    assert result.frontier is not None and result.frontier.best.beta < 0
    line = result.summary()
    assert line.startswith("KL frontier (Gao RL form, 4 trials): no interior peak: the fitted gain still rises at "
                           "the largest KL seen (16 nats/sequence; ")
    assert "inf" not in line.replace("interior", "")


def test_the_summary_bounds_an_accuracys_peak_and_says_when_a_kl_bound_is_extrapolated():
    """An accuracy's peak-score interval is clipped to [0, 1] (verl's validation accuracy is a mean of 0/1).
    With a largest KL of 4 nats/sequence, a KL* bound beyond 10 × 4 = 40 reads as an extrapolation.
    A reward (verl's ``val-core/<source>/reward/...``, the reward function's own scale) is not clipped."""
    def line(metric, kl_interval, peak_interval, peak_score=0.624):
        fit = FormFit("rl", 1.0, 0.5, 0.01, 1.5, 2.25, peak_score, {"kl_star": kl_interval,
                                                                    "peak_score": peak_interval})
        frontier = Frontier(reference=0.3, fits={"rl": fit}, best=fit, n=5, d_max=2.0, level=0.8, n_points=25)
        empty = pd.DataFrame()
        return SweepFrontier(metric, "", "", empty, empty, frontier, None).summary()

    accuracy = "val-core/openai/gsm8k/acc/mean@4"
    assert line(accuracy, (0.386, 3.54e18), (0.618, 3.74e6)).startswith(
        "KL frontier (Gao RL form, 5 trials): KL* = 2.25 nats/sequence [0.386, > 40 (extrapolated)] (80 %), peak "
        "score 0.624 [0.618, 1]")
    assert "[0.386, 39] (80 %), peak score 0.624 [0.618, 0.7]" in line(accuracy, (0.386, 39.0), (0.618, 0.7))
    assert "peak score 1 (the fit's 1.2 is outside the accuracy's range) [0.9, 1]" in line(
        accuracy, (0.386, 39.0), (0.9, 1.5), peak_score=1.2)
    reward = "val-core/openai/gsm8k/reward/mean@4"
    assert "peak score 0.624 [0.618, 3.74e+06]" in line(reward, (0.386, math.inf), (0.618, 3.74e6))
    assert "KL* = 2.25 nats/sequence [0.386, unbounded]" in line(reward, (0.386, math.inf), (0.618, 3.74e6))
    assert [score_range(m) for m in (accuracy, "val-aux/arith/acc/maj@8/mean", "val-aux/arith/acc/std@8", reward,
                                     None)] == [(0.0, 1.0), (0.0, 1.0), None, None, None]


def test_a_peak_interval_below_a_score_a_trial_reached_says_why():
    """The peak interval is of the fitted mean curve; a single run's best validation score can lie above it (issue:
    0.636 [0.629, 0.645] while a trial reached 0.676). The line says so, with the score reached."""
    fit = FormFit("rl", 1.0, 0.5, 0.01, 1.5, 2.25, 0.636, {"kl_star": (0.386, 39.0), "peak_score": (0.629, 0.645)})
    frontier = Frontier(reference=0.3, fits={"rl": fit}, best=fit, n=5, d_max=2.0, level=0.8, n_points=25)
    paths = pd.DataFrame({"trial_id": ["a", "a", "b"], "score": [0.61, 0.676, 0.64]})
    line = SweepFrontier("val-core/openai/gsm8k/acc/mean@4", "", "", pd.DataFrame(), pd.DataFrame(), frontier, None,
                         paths=paths).summary()
    assert ("peak score 0.636 [0.629, 0.645]; the peak interval is of the fitted curve (a mean over trials), not of "
            "single runs: a trial reached 0.676 once;") in line
    below = SweepFrontier("val-core/openai/gsm8k/acc/mean@4", "", "", pd.DataFrame(), pd.DataFrame(), frontier, None,
                          paths=paths.assign(score=[0.61, 0.62, 0.64])).summary()
    assert "peak score 0.636 [0.629, 0.645]; ⚠" in below and "single runs" not in below


#: A conservative.yaml sweep of 8 trials × 20 steps (3, then resumed to 8), as recorded: per trial number, its
#: validation steps (step, KL nats/sequence, accuracy in 1/256ths of the 256 validation prompts). The reference
#: policy scores 149/256. Trials 3, 6 and 7 (kl_coef 0.5-0.76) pulled their KL back from step 10 to 20 while their
#: accuracy rose; the others drifted out to KL 0.5 at 148/256.
CONSERVATIVE = {0: [(10, 0.1891, 143), (20, 0.5163, 148)], 1: [(10, 0.189, 143), (20, 0.516, 148)],
                2: [(10, 0.1417, 143), (20, 0.469, 148)], 3: [(10, 0.1614, 140), (20, 0.1203, 167)],
                4: [(10, 0.189, 144), (20, 0.5161, 148)], 5: [(10, 0.1897, 140), (20, 0.4879, 147)],
                6: [(10, 0.1734, 140), (20, 0.1358, 176)], 7: [(10, 0.1668, 143), (20, 0.1492, 174)]}
ACCURACY = "val-core/arith/acc/mean@1"


def conservative_frontier() -> SweepFrontier:
    """The recorded sweep's frontier, fitted as :func:`sweep_frontier` fits it (paths, end points, the reference)."""
    paths = pd.DataFrame([(f"t{n}", n, step, kl, score / 256) for n, rows in CONSERVATIVE.items()
                          for step, kl, score in rows], columns=["trial_id", "number", "step", "kl_seq", "score"])
    frontier = fit_frontier(paths["kl_seq"], paths["score"], 149 / 256, trials=paths["trial_id"].to_numpy())
    points = paths.groupby("trial_id", sort=False).tail(1).reset_index(drop=True).assign(hover="")
    return SweepFrontier(ACCURACY, "", "", points, pd.DataFrame(), frontier, None, paths=paths)


def test_trials_ending_above_the_fitted_peak_are_named_beside_it():
    """On the recorded sweep the RL form's mean curve peaks at 0.594 while trials 3, 6 and 7 end at 0.652-0.688: its
    score is not a function of KL alone (at KL 0.12-0.19 it is 0.547 at step 10 and up to 0.688 at step 20). The
    line keeps the fit's peak and interval, names the end points above the peak, the best with its KL, and warns
    when the best lies beyond the fit's scatter (more than 2 × its leave-one-trial-out RMSE above the peak)."""
    result = conservative_frontier()
    best = result.frontier.best
    assert best.peak_score == pytest.approx(0.594, abs=5e-4) and best.loo_rmse == pytest.approx(0.0462, abs=5e-4)
    line = result.summary()
    assert (f"peak score 0.594 [{best.intervals['peak_score'][0]:.3g}, 1]; 3 feasible trials end above the fitted "
            "peak (a mean over trials), the best trial 6 at 0.688 (KL 0.136 nats/sequence); ⚠ the fit does not "
            "describe these trials: trial 6 ends 0.0939 above its peak, more than twice its leave-one-trial-out RMSE "
            "(0.0462); do not act on KL*; ⚠ interval unbounded") in line

    # a GRPO sweep's forecast "peak score 0.582 [0.582, 1]" while a trial ended at 0.625: above the interval's
    # upper bound when that is finite; within the scatter and the interval, a note without the warning
    def line_of(peak_interval, rmse, scores):
        fit = FormFit("rl", 0.1, 0.5, rmse, 0.3, 0.09, 0.582, {"kl_star": (0.08, 0.1), "peak_score": peak_interval})
        frontier = Frontier(reference=0.55, fits={"rl": fit}, best=fit, n=4, d_max=0.7, level=0.8, n_points=8)
        points = pd.DataFrame({"trial_id": list("abcd"), "number": [0, 1, 2, 3], "kl_seq": [0.1, 0.2, 0.3, 0.4],
                               "score": scores})
        return SweepFrontier(ACCURACY, "", "", points, pd.DataFrame(), frontier, None, paths=points).summary()

    assert line_of((0.57, 0.6), 0.05, [0.5, 0.625, 0.58, 0.582]).endswith(
        "peak score 0.582 [0.57, 0.6]; 1 feasible trial ends above the fitted peak (a mean over trials), the best "
        "trial 1 at 0.625 (KL 0.2 nats/sequence); ⚠ the fit does not describe these trials: trial 1 ends 0.043 above "
        "its peak, above its interval; do not act on KL*")
    assert line_of((0.57, 0.7), 0.05, [0.5, 0.625, 0.58, 0.582]).endswith(
        "peak score 0.582 [0.57, 0.7]; 1 feasible trial ends above the fitted peak (a mean over trials), the best "
        "trial 1 at 0.625 (KL 0.2 nats/sequence)")
    assert line_of((0.57, 0.7), 0.05, [0.5, 0.5, 0.58, 0.582]).endswith("peak score 0.582 [0.57, 0.7]")
