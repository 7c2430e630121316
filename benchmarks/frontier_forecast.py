"""How well the KL frontier forecast after 30 % of a sweep predicts the whole sweep's, on the tabular
benchmark (benchmarks/tabular/).

Each simulated sweep draws ``budget.trials`` trials at random from the table's runs (grid point and training seed
drawn uniformly, with replacement, as random search on the grid would); trials finish in the order drawn. The
forecast is made when the first ``ceil(0.3 × budget)`` trials (at least 4, the fit's minimum) have finished, with the
next ``budget.max_concurrent`` trials running, each a uniformly drawn fraction of the way through its steps. It is
what ``sweep status`` and the live view print then (:func:`klsweep.analysis.frontier_fit.fit_frontier` on the paths:
every validation step of the finished trials and the running ones' steps so far, per-sequence KL = verl's per-token
KL × ``response_length/mean``, steps with a KL below 0 left out, the RL form, 80 % expanded percentile intervals of a
bootstrap over trials). ``d = 0`` is the reference policy's validation score, as ``sweep status`` computes it for an
embedded sweep of the same file (:func:`klsweep.analysis.baseline.reference_scores`, a few seconds per table). Every
trial runs to its end: no health rule stops one (what the rules stop is measured by early_stop_savings.py --table),
so this measures the forecast alone.

Per file it prints the fraction of sweeps whose 30 % forecast has

* KL* within ±25 % of the full sweep's fit (all ``budget`` trials, same method), the peak score within ±5 % of it,
  and the full sweep's KL* and peak inside the forecast's 80 % intervals (coverage);
* the KL* of the fit on every run of the table (the method's answer with all the data; NaN when refused) inside the
  interval; the peak within ±5 % of the table's true best (the grid point with the best mean over seeds of the last
  objective value) and KL* within ±25 % of that point's mean end-of-run per-sequence KL;
* the forecast flagged "interval too wide" (relative KL* width > 1), and no interior peak (KL* = inf, a miss);
* the same for the previous method (one end point per trial, the form with the lower leave-one-out error, plain
  percentile intervals) on the same draws, for comparison.

The design (paths, the RL form, expanded intervals) was chosen on simulation seed 0; the default ``--seed 1`` draws
other sweeps (held out). The last line is the pooled coverage ratio of the full sweep's KL* by the forecast's 80 %
interval (the issue asks ≥ 0.8).

``grpo_kl`` is left out: its grid crosses 5 kl_loss_type estimators, whose KL values are on different scales (one
estimator per fit), and each estimator has 3 kl_loss_coef points. numpy/pandas, and torch once per table for the
reference score (no Ray, no Optuna); ~1 minute on 2 shared cores.

    python benchmarks/frontier_forecast.py [--sweeps 100] [--seed 1] [TABLE ...]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _bench import REPO, machine
from early_stop_savings import wilson

from klsweep.analysis.baseline import reference_scores
from klsweep.analysis.frontier import frontier_paths
from klsweep.analysis.frontier_fit import MIN_POINTS, fit_form, fit_frontier, peak
from klsweep.errors import ResultsError
from klsweep.spec import load_sweep
from klsweep.trainers.tabular import load_table

TABLES = ("conservative", "aggressive")
FRACTION = 0.3
LEVEL = 0.8


def table_paths(table_path: Path) -> tuple[list[pd.DataFrame], float, dict]:
    """Per run of the table, its path (:func:`klsweep.analysis.frontier.frontier_paths` rows, steps ascending);
    the reference policy's score; the header."""
    table = load_table(str(table_path))
    metric = table.header["objective"][0]["metric"]
    history = pd.DataFrame([(f"{p}/{s}", step, name, value) for (p, s), steps in table.runs.items()
                            for step, metrics in steps for name, value in metrics.items()],
                           columns=["trial_id", "step", "metric", "value"])
    paths = frontier_paths(history, metric)
    runs = [path.reset_index(drop=True) for _, path in paths.groupby("trial_id", sort=False)]
    trial = {f"config/{k}": v for k, v in table.header["fixed"].items()}
    [reference] = reference_scores("embedded", [metric], pd.DataFrame([trial])).values()
    return runs, reference, table.header


def within(estimate: float, truth: float, tolerance: float) -> bool:
    """``|estimate - truth| <= tolerance × |truth|`` (both finite)."""
    return math.isfinite(estimate) and math.isfinite(truth) and abs(estimate - truth) <= tolerance * abs(truth)


def fit(runs: list[pd.DataFrame], reference: float, method: str, seed: int):
    """The best form's fit of ``runs`` by ``method`` (``paths``: klsweep's; ``ends``: one end point per trial, the
    form by leave-one-out error, plain percentile intervals), or ``None`` when refused (a negative end-point KL)."""
    if method == "paths":
        points = pd.concat([r.assign(trial=i) for i, r in enumerate(runs)], ignore_index=True)
        points = points[points["kl_seq"] >= 0]
        return fit_frontier(points["kl_seq"], points["score"], reference, trials=points["trial"], level=LEVEL,
                            n_boot=500, seed=seed)
    ends = pd.DataFrame([r.iloc[-1] for r in runs if len(r)])
    try:
        frontier = fit_frontier(ends["kl_seq"], ends["score"], reference, form=None, level=LEVEL, n_boot=2,
                                seed=seed)
    except ResultsError:
        return None
    # plain percentile intervals, as before: resample end points, no expansion
    rng = np.random.default_rng(seed)
    d, gain, form = np.sqrt(ends["kl_seq"].to_numpy()), ends["score"].to_numpy() - reference, frontier.best.form
    boot = np.array([peak(form, *fit_form(form, d[idx], gain[idx]))
                     for idx in rng.integers(0, len(d), size=(500, len(d)))])
    tails = ((1 - LEVEL) / 2 * 100, (1 + LEVEL) / 2 * 100)
    with np.errstate(over="ignore"):  # d* of ~1e200 (beta ~ 0): KL* = inf, the interval unbounded
        kls = boot[:, 0] ** 2
    return (frontier, tuple(np.percentile(kls, tails, method="inverted_cdf")),
            tuple(np.percentile(reference + boot[:, 1], tails, method="inverted_cdf")))

def simulate(runs: list[pd.DataFrame], reference: float, budget: int, concurrent: int, n_sweeps: int, seed: int,
             method: str) -> pd.DataFrame:
    """One row per simulated sweep: the 30 % forecast's and the full fit's KL*, peak and intervals."""
    rng = np.random.default_rng(seed)
    early = max(MIN_POINTS, math.ceil(FRACTION * budget))
    rows = []
    for i in range(n_sweeps):
        drawn = [runs[j] for j in rng.integers(0, len(runs), size=budget)]
        running = [r.iloc[:rng.integers(0, len(r) + 1)] for r in drawn[early:early + concurrent]]
        row: dict = {"refused": False}
        for prefix, part in (("", drawn[:early] + running), ("full_", drawn)):
            got = fit(part, reference, method, seed=i)
            if got is None:
                row.update({f"{prefix}kl_star": math.nan, f"{prefix}peak": math.nan, "refused": True})
                row.update({"kl_interval": (math.nan, math.nan), "peak_interval": (math.nan, math.nan),
                            "wide": False} if not prefix else {})
                continue
            frontier = got if method == "paths" else got[0]
            row.update({f"{prefix}kl_star": frontier.best.kl_star, f"{prefix}peak": frontier.best.peak_score})
            if not prefix:
                intervals = ((frontier.best.intervals["kl_star"], frontier.best.intervals["peak_score"])
                             if method == "paths" else got[1:])
                row.update({"form": frontier.best.form, "kl_interval": intervals[0], "peak_interval": intervals[1],
                            "wide": frontier.interval_width() > 1})
        rows.append(row)
    return pd.DataFrame(rows)


def score(sims: pd.DataFrame, true_kl: float, true_peak: float, all_kl: float) -> dict[str, float]:
    """The fractions of sweeps the module docstring lists."""
    def share(hits) -> float:
        return float(np.mean(list(hits)))

    return {
        "KL* ±25 % of full": share(within(a, b, 0.25) for a, b in zip(sims["kl_star"], sims["full_kl_star"])),
        "peak ±5 % of full": share(within(a, b, 0.05) for a, b in zip(sims["peak"], sims["full_peak"])),
        "KL* 80 % coverage": share(lo <= b <= hi for (lo, hi), b in zip(sims["kl_interval"], sims["full_kl_star"])),
        "peak 80 % coverage": share(lo <= b <= hi for (lo, hi), b in zip(sims["peak_interval"], sims["full_peak"])),
        "all-runs KL* covered": share(lo <= all_kl <= hi for lo, hi in sims["kl_interval"]),
        "peak ±5 % of true best": share(within(a, true_peak, 0.05) for a in sims["peak"]),
        "KL* ±25 % of true best's KL": share(within(a, true_kl, 0.25) for a in sims["kl_star"]),
        "flagged too wide": share(sims["wide"]),
        "no interior peak": share(a == math.inf for a in sims["kl_star"]),
        "refused (a negative KL)": share(sims["refused"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=100, help="simulated sweeps per table (>= 20)")
    parser.add_argument("--seed", type=int, default=1, help="simulation seed (0 was used to choose the method)")
    parser.add_argument("tables", nargs="*", type=Path, help="table files (default: conservative, aggressive)")
    args = parser.parse_args()
    tables = args.tables or [REPO / "benchmarks" / "tabular" / f"{name}.jsonl.gz" for name in TABLES]
    print(machine())
    start = time.perf_counter()
    pooled = []
    for path in tables:
        runs, reference, header = table_paths(path)
        budget = load_sweep(REPO / header["source"]).budget
        ends = pd.DataFrame([(r["trial_id"].iloc[-1].split("/")[0], r["kl_seq"].iloc[-1], r["score"].iloc[-1])
                             for r in runs], columns=["point", "kl_seq", "score"])
        means = ends.groupby("point")[["kl_seq", "score"]].mean()
        best = means["score"].idxmax()
        true_kl, true_peak = float(means.loc[best, "kl_seq"]), float(means.loc[best, "score"])
        everything = {method: fit(runs, reference, method, seed=0) for method in ("paths", "ends")}
        whole = everything["paths"].best
        print(f"{path.name}: {args.sweeps} sweeps of {budget.trials} trials, forecast after "
              f"{max(MIN_POINTS, math.ceil(FRACTION * budget.trials))} finished + {budget.max_concurrent} running; "
              f"reference policy score {reference:.3f}; true best: point {best}, mean score {true_peak:.3f} at "
              f"{true_kl:.3g} nats/sequence; fit on all {len(runs)} runs' paths: KL* {whole.kl_star:.3g}, "
              f"peak {whole.peak_score:.3f}")
        for method in ("paths", "ends"):
            sims = simulate(runs, reference, budget.trials, budget.max_concurrent, args.sweeps, args.seed, method)
            fitted = everything[method]
            all_kl = math.nan if fitted is None else (fitted if method == "paths" else fitted[0]).best.kl_star
            figures = score(sims, true_kl, true_peak, all_kl)
            label = "klsweep (paths)" if method == "paths" else "end points (before)"
            print(f"  {label}: full-sweep KL* median {sims['full_kl_star'].median():.3g}, peak median "
                  f"{sims['full_peak'].median():.3f}; forms at 30 %: {dict(sims['form'].value_counts())}")
            print("    " + "; ".join(f"{k}: {v:.2f}" for k, v in figures.items()))
            if method == "paths":
                pooled.append(sims)
    everything_sims = pd.concat(pooled)
    hits = [lo <= b <= hi for (lo, hi), b in zip(everything_sims["kl_interval"], everything_sims["full_kl_star"])]
    low, high = wilson(sum(hits), len(hits))
    print(f"wall {time.perf_counter() - start:.0f} s")
    print(f"pooled KL* 80 % coverage ratio over {len(hits)} sweeps (klsweep): {np.mean(hits):.2f} "
          f"(95 % Wilson interval {low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
