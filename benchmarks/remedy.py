"""Remedy instead of kill (issue 17): the same sweep file, same seeds, with its health rules' remedies and kill-only.

For each sweep file and seed S, two live ``sweep run`` of the file with ``seed=S`` (the sampler's seed and
``data.seed``): one as shipped (a rule with a ``remedy`` restarts its trial from the last checkpoint before the
finding began, with the prescription, :mod:`klsweep.orchestrate.remedy`), one with ``health: {remedies: false}``
(those rules stop their trial, as before issue 17). Per run it counts, from ``trials.csv`` and each trial's Tune
``progress.csv`` (every step a trial ran, the steps a restart ran again included):

- flagged: trials a rule with a remedy fired on (remedied, or stopped by such a rule);
- rescued: flagged trials that end healthy within 90 % of the run's best healthy score (the objective's last value
  of trials no rule stopped); goal ≥ 50 % of the flagged (issue 17);
- trial-steps: every step run; the remedy runs' extra over kill-only, goal ≤ 15 %;
- best healthy score, overall and at equal trial-steps (trials in start order until the smaller run's trial-steps
  are spent; two run at a time, so this is approximate); goal ≥ kill-only + 5 %.

TPE sees a kill-only stop as pruned and a remedied trial's final run as complete, so after its random start-up trials
the two runs can propose different parameters: the comparison is of whole sweeps, as a user would run them. The
sweeps here are single-objective: there is no hypervolume to compare. The tabular benchmark cannot serve a remedied
trial (its table holds no run restarted with a changed coefficient), so the runs are live and scaled down by default
(8 trials instead of the files' 12, ~2-4 min a sweep on 2 shared cores). The last line is the pooled fraction rescued.

``--prescription 'kl_coef=*4'`` measures another prescription without editing the presets: the remedy arm's
``health:`` becomes the file's own plus every rule that has a remedy, re-added under its name with that remedy
(a rule named like a preset rule replaces it, :class:`klsweep.health.rules.HealthConfig`); its cap stays.

    nice -n 10 python benchmarks/remedy.py [--seeds 0 1 2] [--trials 8] [--steps 80] [--prescription KNOB=OP]
                                           [--out DIR] [SWEEP ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import pandas as pd
from _bench import machine, sweep_run, trials
from early_stop_savings import bootstrap_mean, wilson

from klsweep.health import load_ruleset
from klsweep.health.rules import HealthConfig, Rule
from klsweep.spec import load_sweep

SWEEPS = ["sweeps/aggressive.yaml", "sweeps/grpo_kl.yaml"]
WITHIN = 0.9


def _steps_run(out: Path, trial_id: str) -> int:
    """Rows of the trial's Tune progress.csv: every step it ran, the ones a restart ran again included."""
    return sum(len(pd.read_csv(p)) for p in (out / "tune").glob(f"*{trial_id}*/progress.csv"))


def summarise(out: Path, metric: str, remedy_rules: set[str]) -> dict:
    """Flagged, rescued, trial-steps and best healthy scores of one finished sweep directory."""
    df = trials(out).sort_values("number")
    value = df[f"last/{metric}"]
    healthy = (df["health"] != "stopped") & value.notna()
    best = float(value[healthy].max()) if healthy.any() else float("nan")
    remedied = df["remedies"].notna() if "remedies" in df else pd.Series(False, index=df.index)
    reasons = df["stop_reason"].fillna("")
    by_rule = reasons.apply(lambda r: any(f" by {name}:" in r for name in remedy_rules))
    flagged = remedied | ((df["health"] == "stopped") & by_rule)
    rescued = flagged & healthy & (value >= WITHIN * best)
    steps = [_steps_run(out, t) for t in df["trial_id"]]
    return {"flagged": int(flagged.sum()), "rescued": int(rescued.sum()), "trial_steps": sum(steps),
            "best": best, "steps": steps, "healthy_values": [v if h else None for v, h in zip(value, healthy)],
            "remedies": int(remedied.sum())}


def prescription(items: list[str]) -> dict[str, str]:
    """``["kl_coef=*4"]`` → ``{"kl_coef": "*4"}`` (a rule's ``remedy``; its operations are validated with the rules).

    Raises:
        SystemExit: an item not of the form ``KNOB=OPERATION`` (the message names the item and the form).
    """
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (key, eq, op) in zip(items, pairs) if not (key.strip() and eq and op.strip())]
    if bad:
        raise SystemExit(f"--prescription {bad[0]!r}: write KNOB=OPERATION, e.g. kl_coef=*4 or target_kl=*0.5")
    return {key.strip(): op.strip() for key, _, op in pairs}


def remedy_health(health: HealthConfig, remedy: dict[str, str] | None) -> tuple[dict, list[Rule]]:
    """The remedy arm's ``health:`` (as its override's JSON holds it) and its rules that have a remedy.

    ``remedy`` None: the file's own ``health:``. Otherwise every rule with a remedy, re-added with ``remedy`` in
    place of its own, which replaces the preset rule of that name; a bad operation raises pydantic's ValidationError
    naming the rule and the knob before any sweep runs.
    """
    rules = [r for r in load_ruleset(health).rules if r.remedy]
    own = health.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if remedy is None:
        return own, rules
    rules = [Rule.model_validate({**r.model_dump(mode="json", by_alias=True), "remedy": remedy}) for r in rules]
    names = {r.name for r in rules}
    added = [r for r in health.rules if r.name not in names]
    dumped = [r.model_dump(mode="json", by_alias=True, exclude_defaults=True) for r in [*added, *rules]]
    return {**own, "rules": dumped}, rules


def best_within(run: dict, budget: int) -> float:
    """Best healthy score among the trials (start order) whose cumulative trial-steps fit in ``budget``."""
    spent, best = 0, float("nan")
    for steps, v in zip(run["steps"], run["healthy_values"]):
        spent += steps
        if spent > budget:
            break
        if v is not None and not v <= best:
            best = v
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="*", default=SWEEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--prescription", action="append", metavar="KNOB=OP", default=None,
                        help="the remedy of every rule that has one, e.g. kl_coef=*4 (repeat for several knobs; "
                        "default: the presets' own)")
    parser.add_argument("--out", type=Path, default=None, help="keep the sweep directories here")
    args = parser.parse_args()
    remedy = prescription(args.prescription) if args.prescription else None
    root = args.out or Path(tempfile.mkdtemp(prefix="klsweep-remedy-"))
    print(machine())
    flagged_all = rescued_all = 0
    for path in args.sweeps:
        sweep = load_sweep(path)
        remedied, remedy_rules = remedy_health(sweep.health, remedy)
        rules = {r.name for r in remedy_rules}
        described = ", ".join(f"{r.name} {r.remedy} (at most {r.max_remedies})" for r in remedy_rules)
        print(f"{path}: remedy arm's rules {described} {'(--prescription)' if remedy else '(as shipped)'}; "
              f"{args.trials} trials x {args.steps} steps, seeds {args.seeds}", flush=True)
        health = json.dumps({**sweep.health.model_dump(mode="json", exclude_defaults=True), "remedies": False})
        remedy_overrides = [f"health={json.dumps(remedied)}"] if remedy else []
        metric = sweep.objectives[0].metric
        extra, gain, gain_equal = [], [], []
        flagged = rescued = 0
        for seed in args.seeds:
            base = [f"seed={seed}", f"budget.trials={args.trials}", f"budget.max_steps={args.steps}"]
            runs = {}
            for mode, overrides in (("remedy", [*base, *remedy_overrides]), ("kill", [*base, f"health={health}"])):
                out = root / f"{Path(path).stem}-s{seed}-{mode}"
                wall = sweep_run(path, [*overrides, "--overwrite"] if out.exists() else overrides, out)
                runs[mode] = {**summarise(out, metric, rules), "wall": wall}
            r, k = runs["remedy"], runs["kill"]
            budget = min(r["trial_steps"], k["trial_steps"])
            equal = (best_within(r, budget), best_within(k, budget))
            extra.append(r["trial_steps"] / k["trial_steps"] - 1)
            gain.append(r["best"] / k["best"] - 1)
            gain_equal.append(equal[0] / equal[1] - 1)
            flagged, rescued = flagged + r["flagged"], rescued + r["rescued"]
            print(f"{path} seed {seed}: remedy {r['rescued']}/{r['flagged']} flagged rescued ({r['remedies']} "
                  f"remedied), {r['trial_steps']} trial-steps, best {r['best']:.4f} ({r['wall']:.0f} s); kill-only "
                  f"{k['flagged']} flagged, {k['trial_steps']} trial-steps, best {k['best']:.4f} ({k['wall']:.0f} s); "
                  f"at {budget} trial-steps best {equal[0]:.4f} vs {equal[1]:.4f}", flush=True)
        lo, hi = wilson(rescued, flagged) if flagged else (float("nan"), float("nan"))
        print(f"{path}: rescued {rescued}/{flagged} = {rescued / max(flagged, 1):.0%} (Wilson 95 % {lo:.0%}-{hi:.0%}); "
              f"extra trial-steps {statistics.mean(extra):+.1%} (bootstrap 95 % "
              f"{'-'.join(f'{x:+.1%}' for x in bootstrap_mean(extra))}); best healthy {statistics.mean(gain):+.1%}; "
              f"at equal trial-steps {statistics.mean(gain_equal):+.1%} vs kill-only over seeds {args.seeds}")
        flagged_all, rescued_all = flagged_all + flagged, rescued_all + rescued
    print(f"flagged trials rescued within {WITHIN:.0%} of the best healthy score: "
          f"{rescued_all / max(flagged_all, 1):.3f}")


if __name__ == "__main__":
    main()
