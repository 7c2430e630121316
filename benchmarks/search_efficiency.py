"""Search efficiency: Optuna TPE vs random vs grid on the embedded GRPO KL sweep, 5 sampler seeds.

The sweep is ``sweeps/grpo_kl.yaml`` (kl_loss_coef 0.001-10 log, kl_loss_type × 5, loss_agg_mode × 4, the verl
preset as seed trial). Every config a sampler can propose is trained once, up front, into a table (a tabular
benchmark: the same config always gives the same run, ``data.seed`` fixed), with kl_coef on 5 log-spaced points
(0.001, 0.01, 0.1, 1, 10): 100 configs. TPE and random search the file's continuous range, snapped to the nearest
point in log space; grid gets the 5 points as ``values``. Each proposal goes through the sweep's own sampler
(:func:`klsweep.orchestrate.samplers.build_sampler`, seeded) and search space, as ``sweep run`` asks them.

Per config: gold validation accuracy at the last step (``val-core/arith/acc/mean@1``), and the KL of the trained
actor to the reference measured the same way for every estimator (k1 token mean on a fresh rollout of the training
prompts). KL budget: the median of that KL over the table (half the space is over budget). A trial over budget is
told to Optuna as a health stop would be (PRUNED, constraint ``health`` violated); one within it, COMPLETE with its
accuracy. Target: 95 % of the best accuracy within the budget. Cost: trial-steps (``--steps`` per trial, no early
stopping) until the first trial within budget at or above the target; a search that never gets there in 100 trials
counts its 100 trials (a lower bound, marked ``>``).

Prints per sampler the steps of each seed and their mean; the last line gives the ratios random ÷ TPE and grid ÷ TPE
(goal ≥ 2 and ≥ 3) for the 95 % target; ``--targets 0.95 0.99`` adds stricter targets (printed before it).

The samplers are built as ``sweep run`` builds them for the file's budget (12 trials: TPE's random start-up phase is
3 trials); a search may take up to 100. When many configs reach the target, any sampler finds one within its first
few trials and the ratios say more about the landscape than about the sampler: the ``hits`` line shows how many do.

Scaled down for 2 cores in 10 minutes: 30 steps per trial of 8 prompts × 8 samples (the sweep's: 80 steps of 16),
kl_coef on 5 points, one training seed; the table takes most of the time (2 processes).

    python benchmarks/search_efficiency.py [--steps 30] [--batch 8] [--seeds 5]

``--table`` uses the tabular benchmark (benchmarks/tabular/) instead of training: for each table file and
searcher, ``--seeds`` sweeps of ``--trials`` trials (sweep seeds ``--first-seed`` on; the sweep seed is also the
trial's training seed) run as ``early_stop_savings.py --table`` runs them (the file's space, seed trials, health
rules and objective stopper as the file says, ``--objective on`` with its defaults, ``off`` without it; one trial at
a time; a stopped trial costs its steps up to the stop; the files' median and fate stopping are not applied:
``peers.py`` measures the same cost with the shipped stopping, on every arm's draws). Searchers: the file's own
sampler; random (the file's seed trials, then Optuna's RandomSampler); a grid as a user writes it for the budget
(:func:`user_grid`: no seed trials, every recorded category, ``k`` round values per range evenly spaced in its own
scale with ``k`` the largest that fits the budget, in GridSampler's shuffled order); and the oracle, a lower bound
for any sampler (the file's seed trials, then straight to the answer). Two measures:

* single objective: trial-steps until the first trial that ends healthy at a grid point within noise of the true
  best (healthy in every seed, mean ≥ best mean − best seed sd, ``reference.py``);
* two objectives (the file's objective and its KL metric ↓, as ``objective: [...]`` in the file; tables with a KL
  metric only), health a constraint as ``sweep run`` records it: trial-steps until the points of the trials that
  ended healthy, scored by their means over the table's seeds (healthy points only), reach 95 % of the hypervolume
  of all healthy points (reference point: the worst mean of each objective over the table).

A sweep that never gets there counts all its steps (a lower bound). The last lines give, per measure, the ratios
random ÷ file's sampler, grid ÷ file's sampler and oracle ÷ file's sampler of the mean cost pooled over the files
(bootstrap 95 % intervals over sweeps), and random ÷ oracle and grid ÷ oracle: the most any sampler could show
against random and grid here.

    python benchmarks/search_efficiency.py --table [--trials 16] [--seeds 20] [--first-seed 0]
        [--objective file|on|off] [--set KEY=VALUE ...] [TABLE ...]

``--table --trace`` prints no ratio: where the file's sampler and random search send their trials, by trial number
(:func:`trace_main`), the diagnosis of why TPE loses to random on conservative and grpo_kl (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from _bench import REPO, machine

SWEEP = str(Path(__file__).resolve().parents[1] / "sweeps" / "grpo_kl.yaml")
KL_POINTS = (0.001, 0.01, 0.1, 1.0, 10.0)
KEYS = ("actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type",
        "actor_rollout_ref.actor.loss_agg_mode")
SAMPLERS = ("tpe", "random", "grid")
TARGET_VOLUME = 0.95
"""--table, two objectives: the fraction of the reference hypervolume a sweep must reach."""
MAX_TRIALS = 100
"""Trials a search may take; its sampler is still built for the file's budget (TPE: 3 random start-up trials)."""


def load(steps: int, batch: int, extra: list[str] = ()):
    from klsweep.spec import load_sweep

    return load_sweep(SWEEP, [f"budget.max_steps={steps}", f"overrides.data.train_batch_size={batch}", *extra])


def evaluate(args: tuple[int, int, tuple]) -> tuple[tuple, float, float]:
    """Train one config of the table: (config, final validation accuracy, k1 KL to the reference per token)."""
    steps, batch, config = args
    from klsweep.spec.space import trial_overrides
    from klsweep.trainers.embedded import VAL_METRIC, EmbeddedTrainer

    trainer = EmbeddedTrainer(trial_overrides(load(steps, batch), dict(zip(KEYS, config))))
    while trainer.global_step < trainer.total_steps:
        metrics = trainer.train_step()
    experience, _ = trainer.make_experience()  # a fresh rollout of the trained actor
    mask = experience["response_mask"]
    kl = ((experience["old_log_prob"] - experience["ref_log_prob"]) * mask).sum() / mask.sum()
    return config, metrics[VAL_METRIC], kl.item()


def table(steps: int, batch: int) -> dict[tuple, tuple[float, float]]:
    from klsweep.spec.space import parameters

    space = parameters(load(steps, batch))
    configs = [(c, t, a) for c in KL_POINTS for t in space[KEYS[1]].values for a in space[KEYS[2]].values]
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        return {config: (acc, kl) for config, acc, kl in pool.map(evaluate, [(steps, batch, c) for c in configs])}


def snap(coef: float) -> float:
    return min(KL_POINTS, key=lambda p: abs(math.log(p) - math.log(coef)))


def search(name: str, seed: int, results: dict, budget: float, target: float, steps: int, batch: int) -> int | None:
    """Trial-steps until ``name`` (seeded) proposes a config within the KL budget at or above target, else None."""
    import optuna

    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.orchestrate.searcher import HEALTH_CONSTRAINT
    from klsweep.spec.space import define_space, seed_params

    grid = [f"parameters.kl_coef={{values: [{', '.join(map(str, KL_POINTS))}]}}"] if name == "grid" else []
    sweep = load(steps, batch, [f"sampler={name}", f"seed={seed}", *grid])
    study = optuna.create_study(direction="maximize", sampler=build_sampler(sweep))
    for params in seed_params(sweep):
        study.enqueue_trial(params)
    space = define_space(sweep)
    for n in range(1, MAX_TRIALS + 1):
        trial = study.ask()
        space(trial)
        p = trial.params
        acc, kl = results[(snap(p[KEYS[0]]), p[KEYS[1]], p[KEYS[2]])]
        if kl > budget:
            trial.set_constraint(HEALTH_CONSTRAINT, 1.0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        trial.set_constraint(HEALTH_CONSTRAINT, -1.0)
        study.tell(trial, acc)
        if acc >= target:
            return n * steps
    return None


def within_noise(ref: dict) -> list[dict]:
    """The grid points within seed noise of the true best: healthy in every seed, mean ≥ best mean − best seed sd."""
    best = ref["best"]
    sign = 1.0 if ref["mode"] == "max" else -1.0
    floor = best["mean"] - sign * (best["std"] if math.isfinite(best["std"]) else 0.0)
    return [p["params"] for p in ref["points"] if p["healthy"] and sign * p["mean"] >= sign * floor]


def user_grid(table: Path, trials: int) -> list[str]:
    """Sweep-file overrides of the grid a user writes for a budget of ``trials``: every categorical value the table
    recorded, and the same number ``k`` of values per range, evenly spaced in the range's own scale (log10 for
    ``log_uniform_values``) from its min to its max and rounded to one significant digit as a blog table prints them,
    with ``k`` the largest that keeps the grid within the budget (at least 2); no seed trials. Run in the order
    Optuna's GridSampler draws (shuffled by the sweep seed)."""
    from klsweep.spec import load_sweep
    from klsweep.trainers.tabular import load_table, recorded_values

    header = load_table(str(table)).header
    sweep = load_sweep(REPO / header["source"])
    sweep = load_sweep(REPO / header["source"], recorded_values(sweep, header))
    ranges = {n: p for n, p in sweep.parameters.items() if not hasattr(p, "values") and not hasattr(p, "value")}
    combos = math.prod(len(p.values) for p in sweep.parameters.values() if hasattr(p, "values"))
    k = 2
    while ranges and combos * (k + 1) ** len(ranges) <= trials:
        k += 1
    extra = ["seed_trials=[]"]
    for name, p in ranges.items():
        log = p.distribution == "log_uniform_values"
        lo, hi = (math.log10(p.min), math.log10(p.max)) if log else (p.min, p.max)
        values = sorted({float(f"{(10 ** x if log else x):.1g}") for x in (lo + i * (hi - lo) / (k - 1)
                                                                          for i in range(k))})
        extra.append(f"parameters.{name}={{values: [{', '.join(map(str, values))}]}}")
    return extra


#: ``--set``: sweep-file overrides of the ``file`` searcher only (e.g. ``sampler={name: gp}``), to try a sampler
#: or its options against the same baselines
FILE_OVERRIDES: list[str] = []


def sampler_extra(table: Path, sampler: str, trials: int) -> tuple[str, ...]:
    """The sweep-file overrides of one searcher: ``file`` (the file's own sampler, with ``--set``'s overrides),
    ``random``, ``grid`` (:func:`user_grid`)."""
    extra = [f"budget.trials={trials}", *(FILE_OVERRIDES if sampler == "file" else [])]
    if sampler == "grid":
        extra += user_grid(table, trials)
    if sampler != "file":
        extra.append(f"sampler={sampler}")
    return tuple(extra)


def single_costs(table: Path, sampler: str, trials: int, seeds: range, stop: Any) -> list[int]:
    """Per sweep seed: trial-steps until the first trial that ends healthy at a within-noise point (a sweep that
    never gets there counts all its steps: a lower bound)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "tabular"))
    from early_stop_savings import table_sweep
    from reference import reference

    good = within_noise(reference(table))
    costs = []
    for seed in seeds:
        used = 0
        for t in table_sweep(table, seed, None, sampler_extra(table, sampler, trials), objective_stop=stop):
            used += t["used"]
            if not t["stopped"] and t["point"] in good:
                break
        costs.append(used)
    return costs


def pareto_problem(table: Path) -> dict | None:
    """The two-objective problem of a table (objective ↑ or ↓ as the file says, its KL metric ↓): the objective
    override, the point means, which points are healthy in every seed, the nadir of the point means (reference
    point) and the hypervolume of the healthy points (the reference hypervolume); None without a KL metric."""
    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parent / "tabular"))
    from reference import reference

    from klsweep.analysis.pareto import hypervolume

    ref = reference(table)
    if ref["kl_metric"] is None:
        return None
    objectives = [("value", ref["mode"]), ("kl", "min")]
    values = {json.dumps(p["params"], sort_keys=True): (p["mean"], p["kl_mean"]) for p in ref["points"]}
    healthy = {json.dumps(p["params"], sort_keys=True) for p in ref["points"] if p["healthy"]}
    worst = min if ref["mode"] == "max" else max
    nadir = (worst(v for v, _ in values.values()), max(k for _, k in values.values()))

    def volume(points: set[str]) -> float:
        rows = [values[p] for p in points if p in healthy]
        df = pd.DataFrame({"value": [v for v, _ in rows], "kl": [k for _, k in rows], "state": "COMPLETE"})
        return hypervolume(df, objectives, nadir) if rows else 0.0

    return {"objective": f"objective=[{{metric: {ref['objective']}, mode: {ref['mode']}}}, "
                         f"{{metric: {ref['kl_metric']}, mode: min}}]",
            "volume": volume, "reference": volume(healthy), "healthy": healthy, "nadir": nadir}


def pareto_sweep(table: Path, seed: int, extra: tuple[str, ...], stop: Any) -> list[dict]:
    """One two-objective sweep of the table's file (the overrides ``extra`` include the objective list), as
    ``sweep run`` records it (:class:`klsweep.orchestrate.searcher.KlsweepSearch`): a health stop is COMPLETE with
    its last values and the constraint ``health`` violated (FAIL without both values), an objective stop PRUNED, a
    healthy trial COMPLETE and feasible. Per trial: ``point`` (JSON of the served grid point), ``used`` steps,
    ``healthy``."""
    import optuna

    from klsweep.health import HealthEngine, load_ruleset
    from klsweep.orchestrate.objective_stop import ObjectiveRule
    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.results import HEALTH_CONSTRAINT
    from klsweep.spec import load_sweep
    from klsweep.spec.space import define_space, seed_params, trial_overrides
    from klsweep.trainers.tabular import TabularTrainer, load_table, recorded_values

    header = load_table(str(table)).header
    sweep = load_sweep(REPO / header["source"], [f"seed={seed}", *extra])
    sweep = load_sweep(REPO / header["source"], [f"seed={seed}", *extra, *recorded_values(sweep, header)])
    metrics_of = [(o.metric, o.mode) for o in sweep.objectives]
    study = optuna.create_study(directions=["maximize" if m == "max" else "minimize" for _, m in metrics_of],
                                sampler=build_sampler(sweep))
    for params in seed_params(sweep):
        study.enqueue_trial(params)
    space, rules = define_space(sweep), load_ruleset(sweep.health)
    settings = sweep.stopping.objective if stop is True else (stop or None)
    judge = ObjectiveRule(metrics_of, sweep.budget.max_steps, settings) if settings else None
    out = []
    for _ in range(sweep.budget.trials):
        trial = study.ask()
        constants = space(trial)  # suggests: trial.params is filled only now
        overrides = trial_overrides(sweep, {**trial.params, **constants})
        trainer, engine = TabularTrainer(overrides, table=table), HealthEngine(rules, overrides)
        used, kind = trainer.total_steps, None
        while trainer.global_step < trainer.total_steps:
            metrics = trainer.train_step()
            if engine.update(trainer.global_step, metrics).stop:
                used, kind = trainer.global_step, "health"
                break
            if judge is not None and judge.update(str(trial.number), trainer.global_step, metrics):
                used, kind = trainer.global_step, "objective"
                break
        last = [next((m[k] for _, m in reversed(trainer.reports) if k in m), math.nan) for k, _ in metrics_of]
        out.append({"point": json.dumps(trainer.point, sort_keys=True), "used": used, "healthy": kind is None})
        finite = all(math.isfinite(v) for v in last)
        trial.set_constraint(HEALTH_CONSTRAINT, 1.0 if kind == "health" else -1.0)
        try:
            if kind == "objective":
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            elif finite:
                study.tell(trial, last)
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except RuntimeError as e:  # GridSampler's Study.stop() once every grid point ran: the sweep is over
            if "Study.stop" not in str(e):
                raise
            break
    return out


def pareto_costs(table: Path, problem: dict, sampler: str, trials: int, seeds: range, stop: Any) -> list[int]:
    """Per sweep seed: trial-steps until the healthy-ended trials' points (scored by their means over the table's
    seeds, healthy points only) reach 95 % of the reference hypervolume (else all the sweep's steps)."""
    costs = []
    for seed in seeds:
        used, found = 0, set()
        for t in pareto_sweep(table, seed, (*sampler_extra(table, sampler, trials), problem["objective"]), stop):
            used += t["used"]
            if t["healthy"]:
                found.add(t["point"])
                if problem["volume"](found) >= TARGET_VOLUME * problem["reference"]:
                    break
        costs.append(used)
    return costs


def oracle_costs(table: Path, problem: dict | None, seeds: range) -> list[int]:
    """Per sweep seed, the least any sampler can pay: the file's seed trials (as served and stopped in that sweep)
    then, for the single objective, one full run of a within-noise point; for two objectives (``problem``), the
    fewest full runs of healthy points whose hypervolume reaches the target."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "tabular"))
    from early_stop_savings import table_sweep

    from klsweep.spec import load_sweep
    from klsweep.trainers.tabular import load_table

    header = load_table(str(table)).header
    sweep = load_sweep(REPO / header["source"])
    runs = 1
    if problem is not None:
        points = sorted(problem["healthy"])
        runs = next(n for n in range(1, len(points) + 1) if any(
            problem["volume"](set(c)) >= TARGET_VOLUME * problem["reference"]
            for c in itertools.combinations(points, n)))
    costs = []
    for seed in seeds:
        start = sum(t["used"] for t in table_sweep(table, seed, None, (f"budget.trials={len(sweep.seed_trials)}",),
                                                   objective_stop=False))
        costs.append(start + runs * sweep.budget.max_steps)
    return costs


def ratio_interval(num: list[int], den: list[int], draws: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap 95 % interval of mean(num) ÷ mean(den), resampling sweeps of each independently."""
    rng = random.Random(0)
    ratios = sorted(statistics.fmean(rng.choices(num, k=len(num))) / statistics.fmean(rng.choices(den, k=len(den)))
                    for _ in range(draws))
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def table_main(tables: list[Path], trials: int, seeds: range, stop: Any) -> None:
    """``--table``: per file and searcher, the mean cost of both measures; pooled ratios with intervals last.
    ``stop``: True (the objective stopper as each file says), False (off) or an ``ObjectiveStop`` (those knobs)."""
    names = ("file", "random", "grid", "oracle")
    pooled: dict[str, dict[str, list[int]]] = {m: {n: [] for n in names} for m in ("single", "pareto")}
    for table in tables:
        start = time.perf_counter()
        problem = pareto_problem(table)
        for measure in ("single", "pareto"):
            if measure == "pareto" and problem is None:
                print(f"{table.name}: no KL metric, single objective only")
                continue
            line = []
            for name in names:
                if name == "oracle":
                    costs = oracle_costs(table, problem if measure == "pareto" else None, seeds)
                elif measure == "single":
                    costs = single_costs(table, name, trials, seeds, stop)
                else:
                    costs = pareto_costs(table, problem, name, trials, seeds, stop)
                pooled[measure][name] += costs
                line.append(f"{name} {statistics.fmean(costs):.0f}")
            print(f"{table.name} {measure}: mean trial-steps, {trials} trials: {'; '.join(line)} "
                  f"[{time.perf_counter() - start:.0f} s]")
    last = []
    for measure, costs in pooled.items():
        for name in ("random", "grid", "oracle"):
            ratio = statistics.fmean(costs[name]) / statistics.fmean(costs["file"])
            lo, hi = ratio_interval(costs[name], costs["file"])
            print(f"{measure}: {name} ÷ file's sampler {ratio:.2f} [{lo:.2f}, {hi:.2f}] (bootstrap 95 %, "
                  f"{len(costs['file'])} sweeps)")
            if name != "oracle":
                last.append(f"{measure} {name}/file {ratio:.2f}")
        for name in ("random", "grid"):
            ceiling = statistics.fmean(costs[name]) / statistics.fmean(costs["oracle"])
            lo, hi = ratio_interval(costs[name], costs["oracle"])
            print(f"{measure}: {name} ÷ oracle {ceiling:.2f} [{lo:.2f}, {hi:.2f}] (the most any sampler could show "
                  f"against {name})")
    print(f"trial-steps ratios {', '.join(last)} (goal: random ≥ 3, grid ≥ 4)")


def trace_main(tables: list[Path], trials: int, seeds: range, stop: Any) -> None:
    """``--trace``: where the file's sampler and random search send their trials, over the sweeps of ``seeds``.

    Per table, measure and searcher: per trial number, the percentage of sweeps whose trial ended healthy (``h%``)
    and, single objective, healthy at a within-noise point (``g%``); the sweeps whose trial 2 (the first model
    trial of tpe and gp at the default start-up of 2) was served the grid point of the seed trial again; and the
    served KL coefficient of each trial of the first sweep (``x``: stopped, ``*``: healthy at a within-noise point).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent / "tabular"))
    from early_stop_savings import table_sweep
    from reference import reference

    for table in tables:
        problem = pareto_problem(table)
        good = {json.dumps(p, sort_keys=True) for p in within_noise(reference(table))}
        for measure in ("single", "pareto") if problem else ("single",):
            for name in ("file", "random"):
                sweeps = []
                for seed in seeds:
                    extra = sampler_extra(table, name, trials)
                    if measure == "single":
                        sweeps.append([{"point": json.dumps(t["point"], sort_keys=True), "healthy": not t["stopped"]}
                                       for t in table_sweep(table, seed, None, extra, objective_stop=stop)])
                    else:
                        sweeps.append(pareto_sweep(table, seed, (*extra, problem["objective"]), stop))
                label = f"{table.name} {measure} {name}"
                for key, hit in (("h%", lambda t: t["healthy"]), ("g%", lambda t: t["healthy"] and t["point"] in good)):
                    if key == "g%" and measure == "pareto":
                        continue
                    shares = [100 * sum(hit(s[i]) for s in sweeps if i < len(s)) // len(sweeps) for i in range(trials)]
                    print(f"{label} {key} by trial: {' '.join(f'{v:3d}' for v in shares)}")
                again = sum(len(s) > 2 and s[2]["point"] == s[0]["point"] for s in sweeps)
                first = []
                for t in sweeps[0]:
                    point = json.loads(t["point"]).items()
                    coef = next((v for k, v in point if k.endswith(("kl_coef", "kl_loss_coef"))), None)
                    mark = "" if t["healthy"] else "x"
                    mark = "*" if t["healthy"] and t["point"] in good else mark
                    first.append("?" if coef is None else f"{coef:.3g}{mark}")
                print(f"{label}: trial 2 served the seed trial's point in {again} of {len(sweeps)} sweeps; sweep "
                      f"{seeds[0]}: {' '.join(first)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.95],
                        help="fractions of the best accuracy within budget to reach; the first is the headline")
    parser.add_argument("--table", action="store_true", help="sweeps on the tabular benchmark (benchmarks/tabular/)")
    parser.add_argument("--trials", type=int, default=16, help="--table: trials per sweep")
    parser.add_argument("--first-seed", type=int, default=0, help="--table: seed of the first sweep")
    parser.add_argument("--objective", choices=("file", "on", "off"), default="file",
                        help="--table: the objective stopper as the file's stopping.objective says, with its "
                             "defaults, or off")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="--table: a sweep-file override of the file's searcher only ('sampler={name: gp}')")
    parser.add_argument("--trace", action="store_true",
                        help="--table: where the file's sampler and random search send their trials, by trial number")
    parser.add_argument("tables", nargs="*", type=Path, help="--table: table files (default: benchmarks/tabular/*)")
    args = parser.parse_args()
    FILE_OVERRIDES.extend(args.set)
    import optuna

    from klsweep.spec.schema import ObjectiveStop

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"machine: {machine()}" + (f"; file's sampler with {' '.join(args.set)}" if args.set else ""))
    if args.table:
        (trace_main if args.trace else table_main)(
            args.tables or sorted((REPO / "benchmarks" / "tabular").glob("*.jsonl.gz")), args.trials,
            range(args.first_seed, args.first_seed + args.seeds),
            {"file": True, "on": ObjectiveStop(), "off": False}[args.objective])
        return
    start = time.perf_counter()
    results = table(args.steps, args.batch)
    kls = sorted(kl for _, kl in results.values())
    budget = statistics.median(kls)
    best = max(acc for acc, kl in results.values() if kl <= budget)
    print(f"table: {len(results)} configs × {args.steps} steps in {time.perf_counter() - start:.0f} s; accuracy "
          f"{min(a for a, _ in results.values()):.3f}-{max(a for a, _ in results.values()):.3f}, KL budget "
          f"{budget:.4f} nats/token (median), best within budget {best:.3f}")
    ratios = {}
    for fraction in reversed(args.targets):
        target = fraction * best
        hits = sum(acc >= target and kl <= budget for acc, kl in results.values())
        print(f"target {fraction:.0%} of the best = {target:.3f}: {hits} of {len(results)} configs reach it")
        means = {}
        for name in SAMPLERS:
            costs = [search(name, seed, results, budget, target, args.steps, args.batch) for seed in range(args.seeds)]
            shown = [f">{MAX_TRIALS * args.steps}" if c is None else str(c) for c in costs]
            means[name] = statistics.mean(MAX_TRIALS * args.steps if c is None else c for c in costs)
            print(f"  {name:6s} trial-steps to target per seed: {', '.join(shown)}; mean {means[name]:.0f}")
        ratios[fraction] = (means["random"] / means["tpe"], means["grid"] / means["tpe"])
    print(f"machine after: {machine()}")
    for fraction in reversed(args.targets):
        random_ratio, grid_ratio = ratios[fraction]
        print(f"target {fraction:.0%}: trial-steps ratio random/tpe {random_ratio:.2f} (goal ≥ 2), "
              f"grid/tpe {grid_ratio:.2f} (goal ≥ 3)")

if __name__ == "__main__":
    main()
