"""Search efficiency (issue 8): Optuna TPE vs random vs grid on the embedded GRPO KL sweep, 5 sampler seeds.

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

``--table`` (issue 16) uses the tabular benchmark (benchmarks/tabular/) instead of training: for each table file
and sampler (the file's own, random, grid over the table's grid points without the file's seed trials), ``--seeds``
sweeps of ``--trials`` trials run as ``early_stop_savings.py --table`` runs them (the file's space, seed trials and
health rules, trials served from the table, stopped trials cost their steps up to the stop). The grid knows where
the table's points are, which no grid over a real space does: it is a lower bound on a real grid's cost.
Target: a trial served a grid point within noise of the true best, i.e. healthy in every seed with a mean objective
≥ best mean − best seed sd (``reference.py``).
Cost: trial-steps until the first such trial that ends healthy (a sweep that never gets there counts all its steps,
a lower bound). The last line gives the ratios random ÷ file's sampler and grid ÷ file's sampler of the mean cost,
pooled over the files, with bootstrap 95 % intervals over sweeps.

    python benchmarks/search_efficiency.py --table [--trials 16] [--seeds 20] [TABLE ...]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from _bench import REPO, machine

SWEEP = str(Path(__file__).resolve().parents[1] / "sweeps" / "grpo_kl.yaml")
KL_POINTS = (0.001, 0.01, 0.1, 1.0, 10.0)
KEYS = ("actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type",
        "actor_rollout_ref.actor.loss_agg_mode")
SAMPLERS = ("tpe", "random", "grid")
MAX_TRIALS = 100
"""Trials a search may take; its sampler is still built for the file's budget (TPE: 3 random start-up trials)."""


def load(steps: int, batch: int, extra: list[str] = ()):
    from klsweep.spec import load_sweep

    return load_sweep(SWEEP, [f"budget.max_steps={steps}", f"overrides.data.train_batch_size={batch}", *extra])


def evaluate(args: tuple[int, int, tuple]) -> tuple[tuple, float, float]:
    """Train one config of the table: (config, final validation accuracy, k1 KL to the reference per token)."""
    steps, batch, config = args
    from klsweep.space import trial_overrides
    from klsweep.trainers.embedded import VAL_METRIC, EmbeddedTrainer

    trainer = EmbeddedTrainer(trial_overrides(load(steps, batch), dict(zip(KEYS, config))))
    while trainer.global_step < trainer.total_steps:
        metrics = trainer.train_step()
    experience, _ = trainer.make_experience()  # a fresh rollout of the trained actor
    mask = experience["response_mask"]
    kl = ((experience["old_log_prob"] - experience["ref_log_prob"]) * mask).sum() / mask.sum()
    return config, metrics[VAL_METRIC], kl.item()


def table(steps: int, batch: int) -> dict[tuple, tuple[float, float]]:
    from klsweep.space import parameters

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
    from klsweep.space import define_space, seed_params

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


def table_costs(table: Path, sampler: str, trials: int, seeds: int) -> tuple[list[int], list[bool]]:
    """Per sweep seed: trial-steps until the first healthy trial at a within-noise point, and whether it got there."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "tabular"))
    from early_stop_savings import table_sweep
    from reference import reference

    from klsweep.spec import load_sweep
    from klsweep.trainers.tabular import load_table

    ref, header = reference(table), load_table(str(table)).header
    best = ref["best"]
    floor = best["mean"] - (best["std"] if math.isfinite(best["std"]) else 0.0)
    sign = 1.0 if ref["mode"] == "max" else -1.0
    good = [p["params"] for p in ref["points"] if p["healthy"] and sign * p["mean"] >= sign * floor]
    extra = [f"budget.trials={trials}"]
    if sampler == "grid":  # ranges become the table's grid points (a grid sampler needs values), no seed trials
        sweep = load_sweep(REPO / header["source"])
        extra.append("seed_trials=[]")
        axes = header["parameters"]
        for name, key in zip(sweep.parameters, axes):
            if axes[key]["scale"] != "categorical":
                extra.append(f"parameters.{name}={{values: [{', '.join(map(str, axes[key]['grid']))}]}}")
    if sampler != "file":
        extra.append(f"sampler={sampler}")
    costs, reached = [], []
    for seed in range(seeds):
        used = 0
        for t in table_sweep(table, seed, None, tuple(extra)):
            used += t["used"]
            if not t["stopped"] and t["point"] in good:
                reached.append(True)
                break
        else:
            reached.append(False)
        costs.append(used)
    return costs, reached


def ratio_interval(num: list[int], den: list[int], draws: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap 95 % interval of mean(num) ÷ mean(den), resampling sweeps of each independently."""
    rng = random.Random(0)
    ratios = sorted(statistics.fmean(rng.choices(num, k=len(num))) / statistics.fmean(rng.choices(den, k=len(den)))
                    for _ in range(draws))
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def table_main(tables: list[Path], trials: int, seeds: int) -> None:
    """``--table``: cost to reach a within-noise config per file and sampler; pooled ratios last."""
    pooled: dict[str, list[int]] = {name: [] for name in ("file", "random", "grid")}
    for table in tables:
        start = time.perf_counter()
        line = []
        for name in pooled:
            costs, reached = table_costs(table, name, trials, seeds)
            pooled[name] += costs
            line.append(f"{name} {statistics.fmean(costs):.0f} ({sum(reached)}/{seeds} reached)")
        print(f"{table.name}: mean trial-steps to a within-noise config, {trials} trials: {'; '.join(line)} "
              f"[{time.perf_counter() - start:.0f} s]")
    ratios = {}
    for name in ("random", "grid"):
        ratios[name] = statistics.fmean(pooled[name]) / statistics.fmean(pooled["file"])
        lo, hi = ratio_interval(pooled[name], pooled["file"])
        print(f"{name} ÷ file's sampler: {ratios[name]:.2f} [{lo:.2f}, {hi:.2f}] (bootstrap 95 %)")
    print(f"trial-steps ratio random/file-sampler {ratios['random']:.2f} (goal ≥ 3), grid/file-sampler "
          f"{ratios['grid']:.2f} (goal ≥ 4)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.95],
                        help="fractions of the best accuracy within budget to reach; the first is the headline")
    parser.add_argument("--table", action="store_true", help="sweeps on the tabular benchmark (issue 16)")
    parser.add_argument("--trials", type=int, default=16, help="--table: trials per sweep")
    parser.add_argument("tables", nargs="*", type=Path, help="--table: table files (default: benchmarks/tabular/*)")
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"machine: {machine()}")
    if args.table:
        table_main(args.tables or sorted((REPO / "benchmarks" / "tabular").glob("*.jsonl.gz")), args.trials,
                   args.seeds)
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
