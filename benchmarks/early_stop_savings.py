"""Trial-steps saved by health early stopping (issue 8): ``sweeps/aggressive.yaml`` with and without health rules.

Two ``sweep run`` of the same file, same seed and sampler (TPE, seed 0, the seed preset as trial 0): one with the
file's rules (``health: aggressive``; ``--health PRESET`` for another), one with none (preset ``none`` and the built-in
checks off). Prints the trial-steps each used (Σ ``steps`` of trials.csv), the trials each rule stopped, and whether
the best healthy trial (highest validation accuracy among trials no rule stopped) has the same parameters in both.
The last line is the fraction of trial-steps saved; goal ≥ 40 %.

TPE sees the stopped trials as pruned/infeasible, so after its random start-up trials the two runs can propose
different parameters: the comparison is of whole sweeps, as a user would run them, not of the same trial list.

What bounds the figure: a rule can only stop a trial once its metrics show the failure. On the embedded task the
trials that go wrong reward-hack (proxy score up, gold validation accuracy down), which shows at the validations of
steps 30-60; with 5 of 12 trials hacking, stopping each at its first bad validation saves at most ~25 %.

Scaled down: nothing by default (12 trials × 80 steps, the file's budget, ~2 × 1-3 min on 2 cores);
``--steps``/``--trials`` shrink it.

    python benchmarks/early_stop_savings.py [--trials 12] [--steps 80] [--health default]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _bench import machine, sweep_run, trials

SWEEP = "sweeps/aggressive.yaml"
VAL = "val-core/arith/acc/mean@1"
NO_HEALTH = ("health={preset: none, builtin: {nonfinite_loss: false, nonfinite_grad_norm_streak: 0, "
             "no_signal_for: 0, kl_dead_for: 0, kl_explosion: 0}}")


def best_healthy(df) -> dict | None:
    """Parameters (config/ columns the sweep searches) and value of the best trial no rule stopped, or None."""
    healthy = df[(df["health"] != "stopped") & df[f"last/{VAL}"].notna()]
    if healthy.empty:
        return None
    row = healthy.sort_values(f"last/{VAL}", ascending=False).iloc[0]
    searched = ("algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon")
    return {"params": {k: row[f"config/{k}"].item() for k in searched}, VAL: float(row[f"last/{VAL}"]),
            "number": int(row["number"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--health", help="a health preset instead of the file's (default, conservative, ...)")
    args = parser.parse_args()
    budget = [f"budget.trials={args.trials}", f"budget.max_steps={args.steps}"]
    rules = [f"health={args.health}"] if args.health else []
    print(f"machine: {machine()}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("with rules", rules), ("without rules", [NO_HEALTH])):
            out = Path(tmp) / label.replace(" ", "_")
            wall = sweep_run(SWEEP, budget + extra, out)
            df = trials(out)
            results[label] = df
            stops = df.loc[df["health"] == "stopped", ["number", "steps", "stop_reason"]]
            print(f"{label}: {int(df['steps'].sum())} trial-steps in {wall:.0f} s, states "
                  f"{df['state'].value_counts().to_dict()}")
            for _, s in stops.iterrows():
                print(f"  trial {s['number']} stopped at step {s['steps']}: {str(s['stop_reason'])[:110]}")
    used = {label: int(df["steps"].sum()) for label, df in results.items()}
    saved = 1 - used["with rules"] / used["without rules"]
    best = {label: best_healthy(df) for label, df in results.items()}
    for label, b in best.items():
        print(f"best healthy trial {label}: {json.dumps(b)}")
    same = best["with rules"] is not None and best["without rules"] is not None and \
        best["with rules"]["params"] == best["without rules"]["params"]
    print(f"same best healthy trial: {'yes' if same else 'no'}")
    print(f"machine after: {machine()}")
    print(f"trial-steps saved: {saved:.3f} ({used['with rules']} vs {used['without rules']}; goal ≥ 0.40)")


if __name__ == "__main__":
    main()
