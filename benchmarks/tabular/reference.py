"""The honest reference of a tabular benchmark table: the true best config, the true Pareto front and
which grid points end healthy, computed from every recorded run.

For each run (grid point × seed) of ``benchmarks/tabular/<sweep>.jsonl.gz``:

* its health under the sweep file's ``health:`` rules: :class:`klsweep.health.HealthEngine` fed every recorded step,
  with the trial's own overrides (``klsweep.spec.space.trial_overrides`` + ``data.seed``) as the run config, exactly
  what the sweep's stopper judges; a stopped run keeps the step and the rule that stopped it;
* its objective values: the last logged value of each objective metric of the file (what the searcher tells Optuna
  for a trial that ran its budget), and its KL to the reference: the last ``actor/kl_loss`` or
  ``actor/reward_kl_penalty`` (verl's names for the KL in the loss and in the reward).

Per grid point: mean and sample standard deviation over seeds, and ``healthy`` = no seed was stopped.

* **best**: the healthy point with the best mean objective (all points when none is healthy);
* **front**: the Pareto front of the healthy points, objective mean up (or down, by its mode) and KL mean down,
  computed by :func:`klsweep.analysis.pareto.pareto_front` (Optuna's non-dominated sort); a file without a KL metric
  (KL off) has a one-objective front.

Usage: ``.venv/bin/python benchmarks/tabular/reference.py benchmarks/tabular/*.jsonl.gz`` (prints a summary per
table; ``--json`` prints the full reference).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: verl's metric of the KL to the reference: in the actor loss, else as a reward penalty (klsweep.verl.metrics).
KL_METRICS = ("actor/kl_loss", "actor/reward_kl_penalty")


def judge_run(engine: Any, run: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    """Feed a recorded run to a fresh ``HealthEngine``; ``{health, stop_step, stop_rule}`` at the end (or the stop)."""
    for step, metrics in run:
        verdict = engine.update(step, metrics)
        if verdict.stop:
            return {"health": "stopped", "stop_step": step, "stop_rule": verdict.reason.rule}
    return {"health": verdict.health, "stop_step": None, "stop_rule": None}


def last_value(run: list[tuple[int, dict[str, float]]], metric: str) -> float:
    """The last finite-or-not logged value of ``metric`` in a run; NaN when never logged."""
    return next((m[metric] for _, m in reversed(run) if metric in m), math.nan)


def reference(table_path: str | Path) -> dict[str, Any]:
    """The reference of one table: ``{sweep, objective, kl_metric, points: [...], best, front}``.

    Each entry of ``points``: ``params``, ``runs`` (per seed: seed, health, stop_step, stop_rule, value, kl),
    ``mean``, ``std`` (over seeds; NaN with one seed), ``kl_mean``, ``healthy`` (no seed stopped),
    ``healthy_seeds``. ``best`` is one of ``points``; ``front`` the list of indices in ``points`` on the front.

    Raises:
        TraceReadError: the table cannot be read (:func:`klsweep.trainers.tabular.load_table`).
        SweepFileError: the sweep file the table names (``header.source``) no longer loads.
    """
    import pandas as pd

    from klsweep.analysis.pareto import pareto_front
    from klsweep.health import HealthEngine, load_ruleset
    from klsweep.spec.load import load_sweep
    from klsweep.spec.space import trial_overrides
    from klsweep.trainers.tabular import load_table

    table = load_table(str(table_path))
    sweep = load_sweep(ROOT / table.header["source"])
    rules = load_ruleset(sweep.health)
    objective = sweep.objectives[0]
    any_run = next(iter(table.runs.values()))
    kl_metric = next((k for k in KL_METRICS if any(k in m for _, m in any_run)), None)
    points = []
    for i, params in enumerate(table.points):
        runs = []
        for seed in table.seeds:
            if (i, seed) not in table.runs:
                continue
            run = table.runs[(i, seed)]
            engine = HealthEngine(rules, {**trial_overrides(sweep, params), "data.seed": seed})
            runs.append({"seed": seed, **judge_run(engine, run), "value": last_value(run, objective.metric),
                         "kl": last_value(run, kl_metric) if kl_metric else math.nan})
        values = [r["value"] for r in runs]
        points.append({
            "params": params, "runs": runs, "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else math.nan,
            "kl_mean": statistics.fmean(r["kl"] for r in runs),
            "healthy": all(r["health"] != "stopped" for r in runs),
            "healthy_seeds": sum(r["health"] != "stopped" for r in runs),
        })
    sign = 1.0 if objective.mode == "max" else -1.0
    pool = [p for p in points if p["healthy"]] or points
    best = max(pool, key=lambda p: sign * p["mean"])
    df = pd.DataFrame({
        "number": range(len(points)), "state": "COMPLETE",
        "health": ["healthy" if p["healthy"] else "stopped" for p in points],
        "value": [p["mean"] for p in points], "kl": [p["kl_mean"] for p in points],
    })
    objectives = [("value", objective.mode)] + ([("kl", "min")] if kl_metric else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty front is reported as [] below; KL scales: see the module docstring
        front = pareto_front(df, objectives)
    return {"sweep": table.header["sweep"], "objective": objective.metric, "mode": objective.mode,
            "kl_metric": kl_metric, "points": points, "best": best, "front": [int(n) for n in front["number"]]}


def summary(ref: dict[str, Any]) -> str:
    """A few lines for a person: best config with its spread, the front, how many points end healthy."""
    best, points = ref["best"], ref["points"]
    short = {k.rsplit(".", 1)[-1]: v for k, v in best["params"].items()}
    lines = [
        f"{ref['sweep']}: {len(points)} grid points, {sum(p['healthy'] for p in points)} healthy in every seed",
        f"  best {ref['objective']}{'' if best['healthy'] else ' (no point is healthy: best of all)'}: "
        f"{best['mean']:.3f} ± {best['std']:.3f} (mean ± sd over {len(best['runs'])} seeds) at {short}",
        f"  Pareto front of the healthy points ({ref['objective']} {ref['mode']}, {ref['kl_metric'] or 'no KL'} min): "
        + ("; ".join(f"{points[i]['mean']:.3f} / {points[i]['kl_mean']:.4g}" for i in ref["front"]) or "empty"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the reference of each table given."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="print the full reference as JSON")
    args = ap.parse_args(argv)
    for path in args.tables:
        ref = reference(path)
        print(json.dumps(ref, default=str) if args.json else summary(ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
