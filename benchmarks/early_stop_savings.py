"""Trial-steps saved by health early stopping: ``sweeps/aggressive.yaml`` with and without health rules.

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

``--table`` runs many sweeps per shipped file in seconds on the tabular benchmark (benchmarks/tabular/)
instead: each sweep is the file with ``seed=S`` (S = 0..``--sweeps``-1; the sampler's seed and ``data.seed``), its own
sampler, search space and seed trials, asked one trial at a time (no concurrency); each trial is served its recorded
run (:class:`klsweep.trainers.tabular.TabularTrainer`) and judged step by step by the file's health rules
(:class:`klsweep.health.HealthEngine`, as the sweep's stopper does); a stopped trial is told to Optuna as PRUNED and
saves its remaining steps. Per file it prints the fraction of trial-steps saved (saved ÷ (saved + used), mean over
sweeps with a bootstrap 95 % interval), the stopped trials whose full run would have ended in the upper half of the
range of their sweep's objective values (false stops, with a Wilson 95 % interval; the range, not the median: on the
embedded task most stopped runs collapse to a gold accuracy of 0-0.01, which puts a sweep's median there), and the
sweeps whose best-scoring trial (by the objective's last value on its full run, health ignored) the rules stopped.
The health rules judge a recorded run the same way every time, so these count what the rules themselves cost, not
seed noise. After the health rules, the objective stopper (``stopping.objective``,
:mod:`klsweep.orchestrate.objective_stop`, the same class the live sweep uses) judges every step: as the file says
(``--objective file``), with its defaults (``on``) or not at all (``off``); its stops and their false stops are
counted apart, and each file's stops and false stops per rule. The clairvoyant bound (every lower-half trial stopped
at its first objective report) says how much any stopper judging the objective could save on these sweeps without a
false stop; the ceiling (every trial that does not end in the upper half stopped at step 1, the earliest any stopper
can act; all others run to their end) how much any stopper at all could, and with 5 % of its stops false (the
issue's allowance: upper-half trials other than the best stopped at step 1 as well), per file and pooled.

    python benchmarks/early_stop_savings.py [--trials 12] [--steps 80] [--health default]
    python benchmarks/early_stop_savings.py --table [--sweeps 20] [--first-seed 0] [--objective file|on|off]
        [--set KEY=VALUE ...] [TABLE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

from _bench import REPO, machine, sweep_run, trials

from klsweep.results import STOP_KIND_OBJECTIVE
from klsweep.spec.schema import ObjectiveStop

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


def table_sweep(table: Path, seed: int, health: str | None, extra: tuple[str, ...] = (),
                objective_stop: bool | ObjectiveStop = True) -> list[dict]:
    """One sweep of the table's file with ``seed=seed`` and the sweep-file overrides ``extra`` (see the module
    docstring); per trial: ``point``, ``total`` and ``used`` steps, ``stopped``, ``rule`` (the health rule, or
    ``objective``), ``final`` (the objective's last value on the full recorded run).

    ``objective_stop``: True stops on the objective as the file's ``stopping.objective`` says (off when the file
    has none), False never, an :class:`~klsweep.spec.schema.ObjectiveStop` with those knobs."""
    import optuna

    from klsweep.health import HealthEngine, load_ruleset
    from klsweep.orchestrate.objective_stop import ObjectiveRule
    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.spec import load_sweep
    from klsweep.spec.space import define_space, seed_params, trial_overrides
    from klsweep.trainers.tabular import TabularTrainer, load_table, recorded_values

    header = load_table(str(table)).header
    args = [f"seed={seed}", *extra] + ([f"health={health}"] if health else [])
    sweep = load_sweep(REPO / header["source"], args)
    sweep = load_sweep(REPO / header["source"], [*args, *recorded_values(sweep, header)])  # categories recorded
    objective = sweep.objectives[0]
    rules = load_ruleset(sweep.health)
    study = optuna.create_study(direction="maximize" if objective.mode == "max" else "minimize",
                                sampler=build_sampler(sweep))
    for params in seed_params(sweep):
        study.enqueue_trial(params)
    space = define_space(sweep)
    settings = sweep.stopping.objective if objective_stop is True else (objective_stop or None)
    judge = ObjectiveRule([(o.metric, o.mode) for o in sweep.objectives], sweep.budget.max_steps,
                          settings) if settings else None
    out = []
    for _ in range(sweep.budget.trials):
        trial = study.ask()
        constants = space(trial)  # suggests: trial.params is filled only now
        overrides = trial_overrides(sweep, {**trial.params, **constants})
        trainer = TabularTrainer(overrides, table=table)
        engine = HealthEngine(rules, overrides)
        used, rule = trainer.total_steps, None
        while trainer.global_step < trainer.total_steps:
            metrics = trainer.train_step()
            if objective.metric in metrics:
                trial.report(metrics[objective.metric], trainer.global_step)
            verdict = engine.update(trainer.global_step, metrics)
            if verdict.stop:
                used, rule = trainer.global_step, verdict.reason.rule
                break
            if judge is not None and judge.update(str(trial.number), trainer.global_step, metrics):
                used, rule = trainer.global_step, STOP_KIND_OBJECTIVE
                break
        final = next((m[objective.metric] for _, m in reversed(trainer.reports) if objective.metric in m), math.nan)
        first = next((s for s, m in trainer.reports if objective.metric in m), trainer.total_steps)
        out.append({"point": trainer.point, "total": trainer.total_steps, "used": used, "stopped": rule is not None,
                    "rule": rule, "final": final, "sign": 1.0 if objective.mode == "max" else -1.0, "first": first})
        try:
            if rule is not None:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            elif math.isfinite(final):
                study.tell(trial, final)
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except RuntimeError as e:  # GridSampler.after_trial calls study.stop() once every grid point ran: sweep over
            if "Study.stop" not in str(e):
                raise
            break
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion k/n (Wilson 1927)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (
        1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap 95 % interval of the mean (seeded: the same interval on every run)."""
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def ceiling(sweeps: list[list[tuple[int, bool, bool]]], false_share: float = 0.0) -> tuple[list[float], int]:
    """The most any stopper could save on these sweeps: per sweep, the fraction of trial-steps saved had every trial
    that does not end in the upper half of its sweep's range (the false-stop definition) been stopped at step 1, the
    earliest a stopper can act (saving ``steps − 1``), and every upper-half trial run to its end.

    ``false_share`` > 0 also stops upper-half trials at step 1, at most ``false_share`` of all stops (``⌊f K /
    (1 − f)⌋`` with ``K`` lower-half trials), never a sweep's best-scoring trial, choosing those that add most to
    the mean over sweeps (the largest ``(steps − 1) / sweep steps``): exact for these trial lists.

    Args:
        sweeps: per sweep, per trial ``(steps of its full run, ends in the upper half, is the best-scoring)``.
        false_share: the share of the stops allowed to be false (0.05: the issue's goal).

    Returns:
        (fraction saved per sweep, the number of false stops added).
    """
    fractions = [sum(steps - 1 for steps, up, _ in sweep if not up) / sum(steps for steps, _, _ in sweep)
                 for sweep in sweeps]
    stops = sum(not up for sweep in sweeps for _, up, _ in sweep)
    allowed = math.floor(false_share * stops / (1 - false_share) + 1e-9)
    gains = sorted((((steps - 1) / sum(s for s, _, _ in sweep), i) for i, sweep in enumerate(sweeps)
                    for steps, up, best in sweep if up and not best), reverse=True)[:allowed]
    for gain, i in gains:
        fractions[i] += gain
    return fractions, len(gains)


def bounds_text(clairvoyant: list[float], runs: list[list[tuple[int, bool, bool]]]) -> str:
    """One line: the clairvoyant bound and the :func:`ceiling` without and with 5 % false stops, each the mean over
    sweeps with its bootstrap 95 % interval."""
    parts = [f"clairvoyant bound (every lower-half trial stopped at its first objective report) "
             f"{statistics.fmean(clairvoyant):.3f} [{bootstrap_mean(clairvoyant)[0]:.3f}, "
             f"{bootstrap_mean(clairvoyant)[1]:.3f}]"]
    for share in (0.0, 0.05):
        fractions, added = ceiling(runs, share)
        lo, hi = bootstrap_mean(fractions)
        label = ("ceiling (every trial not ending in the upper half stopped at step 1)" if not share
                 else f"with {share:.0%} of the stops false ({added} upper-half trials stopped at step 1)")
        parts.append(f"{label} {statistics.fmean(fractions):.3f} [{lo:.3f}, {hi:.3f}]")
    return "; ".join(parts)


def table_main(tables: list[Path], seeds: range, health: str | None, objective_stop: bool | ObjectiveStop,
               extra: tuple[str, ...] = ()) -> None:
    """``--table``: many sweeps per table file; prints the savings line per file, the pooled figure last.

    Besides the savings it prints, per file and pooled, the clairvoyant bound: the fraction saved had every trial
    whose full run ends in the lower half of its sweep's range been stopped at its first objective report (and
    nothing else stopped that the health rules did not): no stopper that judges on the objective can save more
    without false stops; and the ceiling (:func:`ceiling`): every trial but the upper-half ones stopped at step 1,
    without false stops and with 5 % of the stops false, which no stopper can beat on these trial lists."""
    all_saved: list[float] = []
    bound: list[float] = []
    all_runs: list[list[tuple[int, bool, bool]]] = []
    false_stops = stopped_total = best_stopped = objective_stops = objective_false = 0
    for table in tables:
        start = time.perf_counter()
        saved, file_false, file_stopped, file_best, file_objective, file_objective_false = [], 0, 0, 0, 0, 0
        by_rule: dict[str, list[int]] = {}  # rule -> [stops, false stops]
        file_bound: list[float] = []
        runs: list[list[tuple[int, bool, bool]]] = []
        missed = 0
        for seed in seeds:
            trials_ = table_sweep(table, seed, health, extra, objective_stop=objective_stop)
            total = sum(t["total"] for t in trials_)
            saved.append(sum(t["total"] - t["used"] for t in trials_) / total)
            scores = sorted(t["sign"] * t["final"] for t in trials_ if math.isfinite(t["final"]))
            middle = (scores[0] + scores[-1]) / 2 if scores else math.inf  # of the range: collapsed runs tie
            upper = [math.isfinite(t["final"]) and t["sign"] * t["final"] > middle for t in trials_]
            file_bound.append(sum(t["total"] - (t["used"] if up else min(t["used"], t["first"]))
                                  for t, up in zip(trials_, upper)) / total)
            stops = [(t, up) for t, up in zip(trials_, upper) if t["stopped"]]
            file_stopped += len(stops)
            file_false += sum(up for _, up in stops)
            file_objective += sum(t["rule"] == STOP_KIND_OBJECTIVE for t, _ in stops)
            file_objective_false += sum(up and t["rule"] == STOP_KIND_OBJECTIVE for t, up in stops)
            for t, up in stops:
                counts = by_rule.setdefault(t["rule"], [0, 0])
                counts[0] += 1
                counts[1] += up
            best = max(trials_, key=lambda t: t["sign"] * t["final"] if math.isfinite(t["final"]) else -math.inf)
            file_best += best["stopped"]
            missed += sum(not up and not t["stopped"] for t, up in zip(trials_, upper))
            runs.append([(t["total"], up, t is best) for t, up in zip(trials_, upper)])
        lo, hi = bootstrap_mean(saved)
        print(f"{table.name}: {len(seeds)} sweeps in {time.perf_counter() - start:.0f} s; trial-steps saved "
              f"{statistics.fmean(saved):.3f} [{lo:.3f}, {hi:.3f}]; {file_stopped} trials stopped "
              f"({file_objective} on the objective), {file_false} of them in the upper half of their sweep's range "
              f"({file_objective_false} on the objective); best-scoring trial stopped in {file_best} of {len(seeds)} "
              f"sweeps; {missed} lower-half trials ran to their end")
        print("  stops by rule (false stops): " + ", ".join(
            f"{rule} {n} ({false})" for rule, (n, false) in sorted(by_rule.items(), key=lambda kv: -kv[1][0])))
        print(f"  {bounds_text(file_bound, runs)}")
        all_saved += saved
        bound += file_bound
        all_runs += runs
        false_stops, stopped_total, best_stopped = (false_stops + file_false, stopped_total + file_stopped,
                                                    best_stopped + file_best)
        objective_stops, objective_false = objective_stops + file_objective, objective_false + file_objective_false
    lo, hi = bootstrap_mean(all_saved)
    flo, fhi = wilson(false_stops, stopped_total)
    olo, ohi = wilson(objective_false, objective_stops)
    print(f"sweep seeds {seeds.start}-{seeds.stop - 1}, pooled: {bounds_text(bound, all_runs)}")
    print(f"false stops: {false_stops} of {stopped_total} stopped trials [{flo:.3f}, {fhi:.3f}] (goal ≤ 0.05); "
          f"on the objective {objective_false} of {objective_stops} [{olo:.3f}, {ohi:.3f}]; "
          f"best-scoring trial stopped in {best_stopped} of {len(all_saved)} sweeps (goal 0)")
    print(f"trial-steps saved: {statistics.fmean(all_saved):.3f} [{lo:.3f}, {hi:.3f}] over {len(all_saved)} "
          "tabular sweeps (goal ≥ 0.55)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--health", help="a health preset instead of the file's (default, conservative, ...)")
    parser.add_argument("--table", action="store_true", help="many sweeps on benchmarks/tabular/")
    parser.add_argument("--sweeps", type=int, default=20, help="--table: sweeps (seeds) per table file")
    parser.add_argument("--first-seed", type=int, default=0, help="--table: the first sweep seed (tuned on 0-19)")
    parser.add_argument("--objective", choices=("file", "on", "off"), default="file",
                        help="--table: stop on the objective as the file says (stopping.objective), with the "
                        "defaults, or not at all")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="--table: a sweep-file override of every sweep ('stopping={objective: {margin: 3}}')")
    parser.add_argument("tables", nargs="*", type=Path, help="--table: table files (default: benchmarks/tabular/*)")
    args = parser.parse_args()
    if args.table:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        print(f"machine: {machine()}")
        objective_stop = {"file": True, "on": ObjectiveStop(), "off": False}[args.objective]
        table_main(args.tables or sorted((REPO / "benchmarks" / "tabular").glob("*.jsonl.gz")),
                   range(args.first_seed, args.first_seed + args.sweeps), args.health, objective_stop,
                   tuple(args.set))
        return
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
