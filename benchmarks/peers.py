"""klsweep's early stopping against the stoppers a user would pick instead, on the tabular benchmark.

Every arm runs the same sweeps: per shipped file with a table (``benchmarks/tabular/``) and sweep seed S, the file
with ``seed=S`` asked one trial at a time, each trial served its recorded run
(:class:`klsweep.trainers.tabular.TabularTrainer`) step by step. The arms differ in sampler and stopper:

* ``klsweep``: the file's sampler and seed trials, its health rules (:class:`klsweep.health.HealthEngine`, as the
  sweep's stopper judges) and its ``stopping`` (the objective stopper; the paths of the trials the rules stopped:
  :class:`klsweep.orchestrate.fate_stop.FateStopper`; the median of the trials that finished healthy:
  :class:`klsweep.orchestrate.median_stop.MedianRule`); a stopped trial is told PRUNED.
  ``klsweep-rules``: the health rules alone; ``klsweep+median``: ``stopping: {median: on}`` alone (the files
  before ``fate``).
* ``klsweep+asha`` / ``klsweep+asha-stock``: the same with ``scheduler: asha`` (grace 10, reduction factor 3):
  :class:`klsweep.orchestrate.asha.HealthAwareASHA`, or Ray Tune's stock ``ASHAScheduler`` as klsweep used it before.
  Both are Ray's real scheduler objects, driven with each validation step's result.
* Optuna users: TPE (seeded, Optuna's defaults) with ``SuccessiveHalvingPruner(min_resource=10,
  reduction_factor=3)``, ``HyperbandPruner(min_resource=10, max_resource=80, reduction_factor=3)``,
  ``MedianPruner(n_warmup_steps=10)``, ``WilcoxonPruner(p_threshold=0.1)`` or no pruner; random sampling with
  SuccessiveHalving (ASHA) or none. ``trial.report`` at every validation step, ``should_prune`` after it; no health
  rules and no seed trials (a user of Optuna has neither).

Every arm reports the best trial that ran its whole budget (Optuna's ``best_trial``: COMPLETE trials only). Per arm,
over all sweeps (mean with a bootstrap 95 % interval, rates with Wilson 95 % intervals):

* saved: the share of trial-steps not run (saved ÷ the steps of every trial run to its end);
* regret: the true best's mean objective − the true mean of the reported config (``benchmarks/tabular/reference.py``:
  the healthy grid point with the best mean over the table's seeds); sweeps with no finished trial have no answer
  and are counted apart ("no answer"); the floor is the regret of running every grid point once in the sweep's seed
  and reporting the best;
* unhealthy: the share of answers whose config is not healthy in every seed of the table (it reward-hacks or
  collapses);
* best stopped: among sweeps in which some trial was served the true best config, those that stopped it;
* false stops (printed for the ``klsweep`` arm, per stopper): stopped trials whose full recorded run ends in the
  upper half of the range of their sweep's final values (``early_stop_savings.py``'s measure);
* to within noise: trial-steps until the first trial that ran its whole budget healthy at a grid point within seed
  noise of the true best (healthy in every seed, mean ≥ best mean − best seed sd: ``search_efficiency.py``'s
  measure); a sweep that never gets there counts all its steps (a lower bound). The last line of each trial count
  gives random ÷ klsweep of its mean (bootstrap 95 % interval), then per file: klsweep's and random's means, where
  klsweep's steps before that trial went (health-stopped trials, trials its other stoppers stopped, trials that ran
  their whole budget off the target), and its bound: the same trials with every one before the hit stopped at its
  first validation (a clairvoyant stopper under klsweep's sampler).

The clairvoyant line: on the ``klsweep`` arm's trials, every trial whose full run ends in the lower half of its
sweep's range stopped at its first validation.

    python benchmarks/peers.py [--sweeps 40] [--first-seed 0] [--trials 16 32] [--arms klsweep tpe ...]
        [--set KEY=VALUE ...] [TABLE ...]

``--set``: sweep-file overrides of klsweep's arms (e.g. ``'stopping={median: on, fate: {margin: 0}}'``), to
try a setting against the same peers; a ``sampler=`` override leaves a ``sampler: grid`` file's grid alone.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from _bench import REPO, machine
from early_stop_savings import bootstrap_mean, wilson
from ray.tune.schedulers import ASHAScheduler
from search_efficiency import ratio_interval

sys.path.insert(0, str(REPO / "benchmarks" / "tabular"))
from reference import reference  # noqa: E402

from klsweep.health import HealthEngine, load_ruleset  # noqa: E402
from klsweep.orchestrate.asha import HealthAwareASHA  # noqa: E402
from klsweep.orchestrate.fate_stop import FateStopper  # noqa: E402
from klsweep.orchestrate.median_stop import MedianRule  # noqa: E402
from klsweep.orchestrate.objective_stop import ObjectiveRule  # noqa: E402
from klsweep.orchestrate.samplers import build_sampler  # noqa: E402
from klsweep.results import HEALTH, STEP, STOP_KIND  # noqa: E402
from klsweep.spec import load_sweep  # noqa: E402
from klsweep.spec.space import define_space, seed_params, trial_overrides  # noqa: E402
from klsweep.trainers.tabular import TabularTrainer, load_table, recorded_values  # noqa: E402

GRACE, RF = 10, 3


@dataclass
class Arm:
    """One way of running a sweep: its sampler, whether klsweep's rules judge, and its pruner or scheduler."""

    name: str
    sampler: str  # file | tpe | random
    health: bool
    stopper: Callable[[int], Any] | None = None  # max_t → an Optuna pruner or a Ray ASHA scheduler
    stopping: tuple[str, ...] = ()  # sweep-file overrides of klsweep's arms (``stopping={median: on}``)


def _ray_asha(cls: type, max_t: int) -> Any:
    """Ray's ``ASHAScheduler`` (or ``cls``, a subclass) as ``scheduler: asha`` builds it, on the signed objective."""
    return cls(time_attr="training_iteration", metric="value", mode="max", max_t=max_t, grace_period=GRACE,
               reduction_factor=RF)


def _asha_stock(max_t: int) -> Any:
    return _ray_asha(ASHAScheduler, max_t)


ARMS = {a.name: a for a in [
    Arm("klsweep", "file", True),
    Arm("klsweep-rules", "file", True, stopping=("stopping={objective: off, median: off}",)),
    Arm("klsweep+median", "file", True, stopping=("stopping={median: on}",)),
    Arm("klsweep+asha", "file", True, lambda t: _ray_asha(HealthAwareASHA, t)),
    Arm("klsweep+asha-stock", "file", True, _asha_stock),
    Arm("tpe+sha", "tpe", False, lambda t: optuna.pruners.SuccessiveHalvingPruner(min_resource=GRACE,
                                                                                  reduction_factor=RF)),
    Arm("tpe+hyperband", "tpe", False, lambda t: optuna.pruners.HyperbandPruner(min_resource=GRACE, max_resource=t,
                                                                                reduction_factor=RF)),
    Arm("tpe+median", "tpe", False, lambda t: optuna.pruners.MedianPruner(n_warmup_steps=GRACE)),
    Arm("tpe+wilcoxon", "tpe", False, lambda t: optuna.pruners.WilcoxonPruner(p_threshold=0.1)),
    Arm("tpe", "tpe", False),
    Arm("random+sha", "random", False, lambda t: optuna.pruners.SuccessiveHalvingPruner(min_resource=GRACE,
                                                                                       reduction_factor=RF)),
    Arm("random", "random", False),
]}


#: ``--set``: sweep-file overrides of the arms that run the file's own sampler (klsweep's)
SETTINGS: list[str] = []


@dataclass
class _Trial:
    """What Ray's ASHA reads of a trial."""

    trial_id: str
    config: dict = field(default_factory=dict)


def run_sweep(table: Path, seed: int, trials: int, arm: Arm) -> list[dict]:
    """One sweep of the table's file with ``seed=seed`` and ``trials`` trials under ``arm``; per trial: ``point``
    (grid index), ``total`` and ``used`` steps, ``stopped`` (by whom, or None), ``final`` (the objective's last value
    of the full recorded run, times the objective's sign: higher is better), ``first`` (its first validation step),
    ``reason`` (a median or fate stop's text, else None)."""
    header = load_table(str(table)).header
    args = [f"seed={seed}", f"budget.trials={trials}", *arm.stopping]
    if arm.sampler == "file":
        grid = load_sweep(REPO / header["source"]).sampler.name == "grid"
        args += [o for o in SETTINGS if not (grid and o.startswith("sampler="))]
    sweep = load_sweep(REPO / header["source"], args)
    sweep = load_sweep(REPO / header["source"], [*args, *recorded_values(sweep, header)])
    objective = sweep.objectives[0]
    sign = 1.0 if objective.mode == "max" else -1.0
    sampler = {"file": lambda: build_sampler(sweep), "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
               "random": lambda: optuna.samplers.RandomSampler(seed=seed)}[arm.sampler]()
    stopper = arm.stopper(sweep.budget.max_steps) if arm.stopper else None
    pruner = stopper if isinstance(stopper, optuna.pruners.BasePruner) else optuna.pruners.NopPruner()
    asha = None if isinstance(stopper, optuna.pruners.BasePruner) else stopper
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    if arm.health:
        for params in seed_params(sweep):
            study.enqueue_trial(params)
    rules = load_ruleset(sweep.health) if arm.health else None
    space = define_space(sweep)
    settings = sweep.stopping.objective if arm.health else None
    judge = ObjectiveRule([(o.metric, o.mode) for o in sweep.objectives], sweep.budget.max_steps,
                          settings) if settings else None
    median = MedianRule([(o.metric, o.mode) for o in sweep.objectives], sweep.budget.max_steps,
                        sweep.stopping.median) if arm.health and sweep.stopping.median else None
    current: dict = {}  # the asked trial's verl overrides, for the fate stopper's KL scale
    fate = FateStopper([(o.metric, o.mode) for o in sweep.objectives], sweep.budget.max_steps, sweep.placement,
                       sweep.stopping.fate, run_config_of=lambda _config: current["overrides"]) \
        if arm.health and sweep.stopping.fate else None
    table_ = load_table(str(table))
    out = []
    for _ in range(trials):
        trial = study.ask()
        constants = space(trial)
        overrides = current["overrides"] = trial_overrides(sweep, {**trial.params, **constants})
        trainer = TabularTrainer(overrides, table=table)
        engine = HealthEngine(rules, overrides) if rules else None
        handle = _Trial(str(trial.number))
        if asha is not None:
            asha.on_trial_add(None, handle)
        used, stopped, last, reason = trainer.total_steps, None, {}, None
        while trainer.global_step < trainer.total_steps:
            metrics = trainer.train_step()
            step = trainer.global_step
            if engine is not None and engine.update(step, metrics).stop:
                used, stopped = step, "health"
                if fate is not None:
                    fate.stopped(str(trial.number), {**metrics, STEP: step, HEALTH: "stopped"})
                break
            if fate is not None and (reason := fate.judge(str(trial.number), step, metrics)):
                used, stopped = step, "fate"
                break
            if judge is not None and judge.update(str(trial.number), step, metrics):
                used, stopped = step, "objective"
                break
            if median is not None and (reason := median.update(str(trial.number), step, metrics)):
                used, stopped = step, "objective"
                break
            if objective.metric not in metrics or not math.isfinite(metrics[objective.metric]):
                continue
            value = sign * metrics[objective.metric]
            last = {"training_iteration": step, "value": value}
            if asha is not None and asha.on_trial_result(None, handle, last) == "STOP" and step < trainer.total_steps:
                used, stopped = step, "asha"
                break
            trial.report(value, step)
            if trial.should_prune():
                used, stopped = step, "pruner"
                break
        if median is not None and stopped is None:
            median.finish(str(trial.number))
        if fate is not None:
            fate.rule.finish(str(trial.number)) if stopped is None else fate.rule.forget(str(trial.number))
        if asha is not None:
            end = {**last, HEALTH: "stopped" if stopped == "health" else "healthy",
                   STOP_KIND: "objective" if stopped in ("objective", "fate") else ""}
            asha.on_trial_complete(None, handle, end) if last else asha.on_trial_remove(None, handle)
        final = next((m[objective.metric] for _, m in reversed(trainer.reports) if objective.metric in m), math.nan)
        first = next((s for s, m in trainer.reports if objective.metric in m), trainer.total_steps)
        out.append({"point": table_.nearest(overrides), "total": trainer.total_steps, "used": used,
                    "stopped": stopped, "reason": reason, "final": sign * final, "first": first})
        try:
            if stopped:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            elif math.isfinite(final):
                study.tell(trial, sign * final)
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except RuntimeError as e:  # GridSampler.after_trial calls study.stop() once every grid point ran
            if "Study.stop" not in str(e):
                raise
            break
    return out


def _answer(trials: list[dict]) -> dict | None:
    """The trial an arm reports: the best final value among trials that ran their whole budget."""
    done = [t for t in trials if t["stopped"] is None and math.isfinite(t["final"])]
    return max(done, key=lambda t: t["final"]) if done else None


def _interval(values: list[float]) -> str:
    if not values:
        return "n/a"
    lo, hi = bootstrap_mean(values)
    return f"{statistics.fmean(values):.4f} [{lo:.4f}, {hi:.4f}]"


def _rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=40, help="sweep seeds per table file")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override of klsweep's arms")
    parser.add_argument("tables", nargs="*", type=Path)
    args = parser.parse_args(argv)
    SETTINGS[:] = args.set
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # WilcoxonPruner
    tables = args.tables or sorted((REPO / "benchmarks" / "tabular").glob("*.jsonl.gz"))
    seeds = range(args.first_seed, args.first_seed + args.sweeps)
    print(f"machine: {machine()}; {len(tables)} tables × seeds {seeds.start}-{seeds.stop - 1} × trials {args.trials}")
    refs, good = {}, {}
    for table in tables:
        ref = reference(table)
        sign = 1.0 if ref["mode"] == "max" else -1.0
        refs[table] = (sign * ref["best"]["mean"], [sign * p["mean"] for p in ref["points"]],
                       [p["healthy"] for p in ref["points"]], ref["points"].index(ref["best"]))
        spread = ref["best"]["std"] if math.isfinite(ref["best"]["std"]) else 0.0
        good[table] = {i for i, p in enumerate(ref["points"])
                       if p["healthy"] and sign * p["mean"] >= sign * ref["best"]["mean"] - spread}
    for trials in args.trials:
        print(f"\n{trials} trials per sweep")
        print("| arm | saved | regret | no answer | unhealthy answer | best stopped | to within noise | s |")
        print("|---|---|---|---|---|---|---|---|")
        to_good: dict[str, list[float]] = {}
        floors: list[float] = []
        clairvoyant: list[float] = []
        false_stops: dict[str, list[int]] = {}  # stopper → [false, all] on the klsweep arm
        per_file: dict[str, dict[str, list[float]]] = {}  # file → klsweep / random / split and bound of klsweep's
        for name in args.arms:
            start = time.perf_counter()
            saved, regret, no_answer, unhealthy, answers, best_tried, best_stopped = [], [], 0, 0, 0, 0, 0
            costs = to_good.setdefault(name, [])
            for table in tables:
                best, means, healthy, best_point = refs[table]
                for seed in seeds:
                    sweep = run_sweep(table, seed, trials, ARMS[name])
                    saved.append(sum(t["total"] - t["used"] for t in sweep) / sum(t["total"] for t in sweep))
                    answer = _answer(sweep)
                    if answer is None:
                        no_answer += 1
                    else:
                        answers += 1
                        regret.append(best - means[answer["point"]])
                        unhealthy += not healthy[answer["point"]]
                    costs.append(_steps_to(sweep, good[table]))
                    row = per_file.setdefault(table.name.split(".")[0], {})
                    row.setdefault(name, []).append(costs[-1])
                    if name == "klsweep":
                        for key, value in _before_hit(sweep, good[table]).items():
                            row.setdefault(key, []).append(value)
                    tried = [t for t in sweep if t["point"] == best_point]
                    best_tried += bool(tried)
                    best_stopped += any(t["stopped"] for t in tried)
                    if name == "klsweep":
                        floors.append(best - means[_floor_point(table, seed)])
                        scores = [t["final"] for t in sweep if math.isfinite(t["final"])]
                        middle = (min(scores) + max(scores)) / 2 if scores else math.inf
                        for t in sweep:
                            if t["stopped"]:
                                count = false_stops.setdefault(t["stopped"], [0, 0])
                                count[0] += t["final"] > middle
                                count[1] += 1
                        clairvoyant.append(sum(t["total"] - (min(t["used"], t["first"]) if t["final"] <= middle
                                                             else t["used"]) for t in sweep)
                                           / sum(t["total"] for t in sweep))
            print(f"| {name} | {_interval(saved)} | {_interval(regret)} | {_rate(no_answer, len(saved))} | "
                  f"{_rate(unhealthy, answers)} | {_rate(best_stopped, best_tried)} | {_interval(costs)} | "
                  f"{time.perf_counter() - start:.0f} |", flush=True)
        if floors:
            print(f"regret floor (every grid point once in the sweep's seed, the best reported): {_interval(floors)}")
            print(f"clairvoyant on klsweep's trials (lower half stopped at its first validation): "
                  f"saved {_interval(clairvoyant)}")
        if false_stops:
            print("klsweep's false stops (full run in the upper half of its sweep's range): " + ", ".join(
                f"{kind} {_rate(k, n)}" for kind, (k, n) in sorted(false_stops.items())))
        if "klsweep" in to_good and "random" in to_good:
            lo, hi = ratio_interval(to_good["random"], to_good["klsweep"])
            ratio = statistics.fmean(to_good["random"]) / statistics.fmean(to_good["klsweep"])
            print(f"trial-steps to a within-noise config, random ÷ klsweep: {ratio:.2f} [{lo:.2f}, {hi:.2f}]")
            bound = [v for row in per_file.values() for v in row["bound"]]
            lo, hi = ratio_interval(to_good["random"], bound)
            print(f"  bound (klsweep's trials, each before the hit stopped at its first validation): random ÷ "
                  f"{statistics.fmean(to_good['random']) / statistics.fmean(bound):.2f} [{lo:.2f}, {hi:.2f}]")
            print("  | file | klsweep | random | health-stopped | other stops | off target | the hit | bound |")
            for file, row in per_file.items():
                print(f"  | {file} | " + " | ".join(f"{statistics.fmean(row[k]):.0f}" for k in (
                    "klsweep", "random", "health", "stopped", "finished", "hit", "bound")) + " |")
    return 0


def _steps_to(sweep: list[dict], good: set[int]) -> float:
    """Trial-steps until the first trial that ran its whole budget at a point of ``good``; all the sweep's steps
    when none did."""
    used = 0
    for t in sweep:
        used += t["used"]
        if t["stopped"] is None and t["point"] in good:
            break
    return used


def _before_hit(sweep: list[dict], good: set[int]) -> dict[str, float]:
    """Where :func:`_steps_to`'s steps went: ``health`` (health-stopped trials), ``stopped`` (other stops), ``finished``
    (run to their end off ``good``), ``hit``; ``bound``: each trial before the hit stopped at its first validation."""
    split = dict.fromkeys(("health", "stopped", "finished", "hit", "bound"), 0.0)
    for i, t in enumerate(sweep):
        if t["stopped"] is None and t["point"] in good:
            split["hit"] = t["used"]
            split["bound"] = t["used"] + sum(min(u["used"], u["first"]) for u in sweep[:i])
            break
        split["health" if t["stopped"] == "health" else "stopped" if t["stopped"] else "finished"] += t["used"]
    else:
        split["bound"] = sum(t["used"] for t in sweep)
    return split


def _floor_point(table: Path, seed: int) -> int:
    """The grid point with the best final value in the sweep's training seed: what running every point once finds."""
    t = load_table(str(table))
    header = t.header
    sweep = load_sweep(REPO / header["source"], [f"seed={seed}"])
    objective = sweep.objectives[0]
    sign = 1.0 if objective.mode == "max" else -1.0
    data_seed = t.seed_for(sweep.seed)
    best, best_value = 0, -math.inf
    for i in range(len(t.points)):
        run = t.runs.get((i, data_seed))
        value = next((m[objective.metric] for _, m in reversed(run or []) if objective.metric in m), math.nan)
        if math.isfinite(value) and sign * value > best_value:
            best, best_value = i, sign * value
    return best


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())
