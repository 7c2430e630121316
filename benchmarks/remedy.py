"""Remedy instead of kill: the same sweep file, same seeds, with its health rules' remedies and kill-only.

For each sweep file and seed S, two live ``sweep run`` of the file with ``seed=S`` (the sampler's seed and
``data.seed``): one as shipped (a rule with a ``remedy`` restarts its trial from the last checkpoint before the
finding began, with the prescription, :mod:`klsweep.orchestrate.remedy`), one with ``health: {remedies: false}``
(those rules stop their trial, as before remedies existed). Per run it counts, from ``trials.csv`` and each trial's Tune
``progress.csv`` (every step a trial ran, the steps a restart ran again included):

- flagged: trials a rule with a remedy fired on (remedied, or stopped by such a rule);
- rescued: flagged trials that end healthy within 90 % of the run's best healthy score (the objective's last value
  of trials no rule stopped); goal ≥ 50 % of the flagged;
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
``--on-same-finding stop|escalate`` does the same with the rules' ``on_same_finding`` (what a rule does when the
trial its remedy restarted is flagged again at or before the step that remedy answered). ``--kill-from DIR`` reuses
the kill-only arms an earlier ``--out DIR`` kept (same seeds, trials, steps and ``health``: checked) instead of
running them again: they do not depend on the remedy arm's options.

``--bound DIR ...`` runs nothing: from the pairs an earlier ``--out DIR`` kept (``<file>-s<seed>-remedy`` and
``-kill``), the least extra trial-steps any remedy policy pays to rescue half the flagged trials (:func:`bound`).

    nice -n 10 python benchmarks/remedy.py [--seeds 0 1 2] [--trials 8] [--steps 80] [--prescription KNOB=OP]
                                           [--on-same-finding stop|escalate] [--kill-from DIR] [--out DIR] [SWEEP ...]
    python benchmarks/remedy.py --bound DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import tempfile
from pathlib import Path

import pandas as pd
from _bench import machine, sweep_run, trials
from early_stop_savings import bootstrap_mean, wilson

from klsweep.health import load_ruleset
from klsweep.health.rules import HealthConfig, Rule
from klsweep.health.verdict import StopReason
from klsweep.orchestrate.remedy import REMEDY_SAVE_FREQ, trend_start
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
    reasons = df["stop_reason"].astype(object).fillna("")  # all NaN (float) when no trial stopped
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


def remedy_health(health: HealthConfig, update: dict[str, object] | None) -> tuple[dict, list[Rule]]:
    """The remedy arm's ``health:`` (as its override's JSON holds it) and its rules that have a remedy.

    ``update`` None or empty: the file's own ``health:``. Otherwise every rule with a remedy, re-added with the fields
    of ``update`` (``{"remedy": {"kl_coef": "*4"}}``, ``{"on_same_finding": "stop"}``) in place of its own, which
    replaces the preset rule of that name; a bad value raises pydantic's ValidationError naming the rule and the
    field before any sweep runs.
    """
    rules = [r for r in load_ruleset(health).rules if r.remedy]
    own = health.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if not update:
        return own, rules
    rules = [Rule.model_validate({**r.model_dump(mode="json", by_alias=True), **update}) for r in rules]
    names = {r.name for r in rules}
    added = [r for r in health.rules if r.name not in names]
    dumped = [r.model_dump(mode="json", by_alias=True, exclude_defaults=True) for r in [*added, *rules]]
    return {**own, "rules": dumped}, rules


def _same_run(out: Path, overrides: list[str]) -> bool:
    """Whether ``out`` is a finished sweep directory run with exactly ``overrides`` (its sweep.json's); says so
    when it exists and is not."""
    try:
        kept = json.loads((out / "sweep.json").read_text())["overrides"]
    except (OSError, ValueError, KeyError):
        return False
    if kept != overrides or not (out / "trials.csv").is_file():
        print(f"--kill-from: {out} was run with {kept}, not {overrides} (or did not finish): running it again")
        return False
    return True


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


def restart_costs(out: Path, remedy_rules: set[str]) -> tuple[list[int], int, int]:
    """Per flagged trial of a remedy arm (:func:`summarise`), the fewest trial-steps a rescue of it adds to a
    kill-only stop at its first finding: ``max_steps − from_step`` of its first restart (it must at least run again
    from that restart point to the end); ``math.inf`` for a flagged trial no remedy restarted (a finding too close to
    the end, no checkpoint before it). Returns (those costs, the arm's trial-steps with every flagged trial stopped at
    its first finding, ``max_steps``).

    Raises:
        FileNotFoundError: ``out`` holds no trials.csv or sweep.json (not a finished sweep directory).
    """
    max_steps = int(json.loads((out / "sweep.json").read_text())["sweep"]["budget"]["max_steps"])
    df = trials(out)
    costs, stopped_at_first = [], 0
    for _, row in df.iterrows():
        records = json.loads(row["remedies"]) if isinstance(row.get("remedies"), str) else []
        reason = row["stop_reason"] if isinstance(row["stop_reason"], str) else ""
        first = min(records, key=lambda r: r["restart"]) if records else None
        if first is None and not (row["health"] == "stopped" and any(f" by {n}:" in reason for n in remedy_rules)):
            stopped_at_first += _steps_run(out, row["trial_id"])  # not flagged: runs as in kill-only
            continue
        stopped_at_first += int(first["step"]) if first else int(row["steps"])
        costs.append(max_steps - int(first["from_step"]) if first else math.inf)
    return costs, stopped_at_first, max_steps


def kill_costs(out: Path, remedy_rules: list[Rule], max_steps: int) -> list[float]:
    """The same costs for the trials a rule with a remedy stopped in a kill-only arm: from the last checkpoint a
    remedy sweep's embedded trial would hold (every :data:`~klsweep.orchestrate.remedy.REMEDY_SAVE_FREQ` steps)
    before the finding's evidence began (:func:`~klsweep.orchestrate.remedy.trend_start`) to ``max_steps``;
    ``math.inf`` where there is none, or the finding is fewer than the rule's ``for`` steps before the end (a remedy
    sweep stops those too)."""
    by_name = {r.name: r for r in remedy_rules}
    costs: list[float] = []
    for reason in trials(out)["stop_reason"].dropna():
        found = re.search(r" at step (\d+) by (\w+):", reason)
        rule = by_name.get(found.group(2)) if found else None
        if rule is None:
            continue
        step = int(found.group(1))
        start = trend_start(rule, StopReason(rule.name, "diverged", step))
        restart = (start - 1) // REMEDY_SAVE_FREQ * REMEDY_SAVE_FREQ
        costs.append(max_steps - restart if restart > 0 and max_steps - step >= rule.for_ else math.inf)
    return costs


def bound(dirs: list[Path], share: float = 0.5) -> float:
    """The least extra trial-steps, as a fraction of the kill-only arms' trial-steps, that any remedy policy pays to
    rescue ``share`` of the flagged trials of the ``<file>-s<seed>-remedy`` / ``-kill`` pairs in ``dirs``.

    A rescue runs at least from its restart point to the end (:func:`restart_costs`); the cheapest
    ``ceil(share × flagged)`` are counted (the others stopped at their first finding, as kill-only stops them), per
    sweep file and pooled. The restart points are those the remedy arm used (the last checkpoint before the finding's
    evidence began, :func:`klsweep.orchestrate.remedy.trend_start`): a policy restarting later would pay less. Prints
    per file, then the pooled fraction last; above 0.15 the two remedy goals (rescued ≥ 50 %, extra ≤ 15 %)
    cannot both be met on these runs. The same bound from the kill-only arms' own flagged trials
    (:func:`kill_costs`, restart points computed, not observed) is printed beside it, as a check that the remedy
    arms' flagged trials (TPE proposes other trials there) are not unusually costly.

    Raises:
        SystemExit: no pair found in ``dirs``.
    """
    pairs = sorted(r for d in dirs for r in d.glob("*-s*-remedy") if r.with_name(
        r.name.removesuffix("-remedy") + "-kill").is_dir())
    if not pairs:
        raise SystemExit(f"--bound: no <file>-s<seed>-remedy and -kill pair under {', '.join(map(str, dirs))}")
    by_file: dict[str, list] = {}
    for remedy_dir in pairs:
        kill_dir = remedy_dir.with_name(remedy_dir.name.removesuffix("-remedy") + "-kill")
        sweep = load_sweep(json.loads((remedy_dir / "sweep.json").read_text())["sweep_file"])
        rules = [r for r in load_ruleset(sweep.health).rules if r.remedy]
        costs, base, max_steps = restart_costs(remedy_dir, {r.name for r in rules})
        kill = sum(_steps_run(kill_dir, t) for t in trials(kill_dir)["trial_id"])
        entry = by_file.setdefault(remedy_dir.name.rsplit("-s", 1)[0], [[], 0, 0, max_steps, []])
        entry[0] += costs
        entry[1] += base
        entry[2] += kill
        entry[4] += kill_costs(kill_dir, rules, max_steps)

    def least(costs: list[float], kill: int) -> tuple[int, float]:
        need = math.ceil(share * len(costs))
        return need, sum(sorted(costs)[:need]) / kill

    everything: list[float] = []
    in_kill: list[float] = []
    kill_all = base_all = 0
    for name, (costs, base, kill, max_steps, own) in by_file.items():
        need, extra = least(costs, kill)
        own_need, own_extra = least(own, kill)
        print(f"{name}: {len(costs)} flagged, rescue costs (max_steps {max_steps} - restart point) "
              f"{sorted(costs)}; the cheapest {need} add {extra:+.1%} to the kill-only arms' {kill} trial-steps "
              f"(the remedy arms with every flagged trial stopped at its first finding: {base / kill - 1:+.1%} "
              f"already, {base / kill - 1 + extra:+.1%} in all); the kill-only arms' own {len(own)} flagged: the "
              f"cheapest {own_need} add {own_extra:+.1%}")
        everything += costs
        in_kill += own
        kill_all, base_all = kill_all + kill, base_all + base
    need, extra = least(everything, kill_all)
    own_need, own_extra = least(in_kill, kill_all)
    print(f"pooled: the cheapest {need} of {len(everything)} flagged add {extra:+.1%} "
          f"({base_all / kill_all - 1 + extra:+.1%} with the arms' own difference; the kill-only arms' own "
          f"{len(in_kill)} flagged: {own_extra:+.1%}); goal <= +15 %: "
          f"{'the goals conflict' if min(extra, own_extra) > 0.15 else 'no conflict'}")
    print(f"least extra trial-steps to rescue {share:.0%} of the flagged trials: {extra:.3f}")
    return extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="*", default=SWEEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--prescription", action="append", metavar="KNOB=OP", default=None,
                        help="the remedy of every rule that has one, e.g. kl_coef=*4 (repeat for several knobs; "
                        "default: the presets' own)")
    parser.add_argument("--on-same-finding", choices=["repeat", "stop", "escalate"], default=None,
                        help="the on_same_finding of every rule that has a remedy (default: the presets' own)")
    parser.add_argument("--kill-from", type=Path, default=None, metavar="DIR",
                        help="reuse the kill-only arms an earlier --out DIR kept, where they match")
    parser.add_argument("--out", type=Path, default=None, help="keep the sweep directories here")
    parser.add_argument("--bound", type=Path, nargs="+", metavar="DIR", default=None,
                        help="run nothing: the least extra trial-steps to rescue half the flagged trials of the pairs "
                        "earlier --out DIRs kept")
    args = parser.parse_args()
    if args.bound:
        bound(args.bound)
        return
    update: dict[str, object] = {}
    if args.prescription:
        update["remedy"] = prescription(args.prescription)
    if args.on_same_finding:
        update["on_same_finding"] = args.on_same_finding
    root = args.out or Path(tempfile.mkdtemp(prefix="klsweep-remedy-"))
    print(machine())
    flagged_all = rescued_all = 0
    for path in args.sweeps:
        sweep = load_sweep(path)
        remedied, remedy_rules = remedy_health(sweep.health, update)
        rules = {r.name for r in remedy_rules}
        described = ", ".join(f"{r.name} {r.remedy} (at most {r.max_remedies}, on_same_finding {r.on_same_finding})"
                              for r in remedy_rules)
        given = f"({', '.join(update)} given)" if update else "(as shipped)"
        print(f"{path}: remedy arm's rules {described} {given}; {args.trials} trials x {args.steps} steps, "
              f"seeds {args.seeds}", flush=True)
        health = json.dumps({**sweep.health.model_dump(mode="json", exclude_defaults=True), "remedies": False})
        remedy_overrides = [f"health={json.dumps(remedied)}"] if update else []
        metric = sweep.objectives[0].metric
        extra, gain, gain_equal = [], [], []
        flagged = rescued = 0
        for seed in args.seeds:
            base = [f"seed={seed}", f"budget.trials={args.trials}", f"budget.max_steps={args.steps}"]
            runs = {}
            for mode, overrides in (("remedy", [*base, *remedy_overrides]), ("kill", [*base, f"health={health}"])):
                out = root / f"{Path(path).stem}-s{seed}-{mode}"
                kept = args.kill_from / out.name if args.kill_from and mode == "kill" else None
                if kept is not None and _same_run(kept, overrides):
                    out, wall = kept, float("nan")
                else:
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
