"""Generate the tabular benchmark of the embedded task: every grid point × training seed of each shipped
sweep, every logged metric at every step, one ``benchmarks/tabular/<sweep>.jsonl.gz`` per sweep.

Each run is exactly what a trial of the sweep trains: the overrides come from klsweep's own loader and
:func:`klsweep.spec.space.trial_overrides` (preset, fixed overrides, trainer defaults, ``budget.max_steps``), with
``data.seed`` set to the training seed, and :class:`klsweep.trainers.embedded.EmbeddedTrainer` is stepped as the Tune
trainable steps it (``train_step`` until ``total_steps``: steps 1..max_steps, no step-0 validation).

The file is written one run at a time (a gzip member per record, :mod:`klsweep.trainers.tabular` reads the format),
so an interrupted generation keeps every finished run and a rerun trains only the missing ones. Grids are in each
parameter's own scale: geometric for ``log_uniform_values``, linear for other ranges, listed values for categorical
parameters (:data:`GRIDS`).

Usage (from the repository root): ``nice -n 10 .venv/bin/python benchmarks/tabular/generate.py [--workers 2]
[--sweeps conservative ...] [--seeds 0 1 2]``.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: Grid per sweep file: a number of points per range, or the listed values of a categorical parameter (all of them
#: when omitted). Sized to generate in about an hour on 2 cores shared with other work (an 80-step run costs ~5 s of
#: CPU for GRPO, ~10 s for PPO with its critic): 4 points per decade of kl_coef and 4 of target_kl for the PPO files
#: (which keep their seed trial's horizon), 2 per decade of kl_loss_coef × every kl_loss_type for grpo_kl (GRPO's
#: token-mean aggregation; drgrpo_vs_grpo has the others without KL). Each grid holds the coarser one before it, so
#: a regeneration keeps those runs (:func:`reusable_runs`).
GRIDS: dict[str, dict[str, int | list[Any]]] = {  # cheapest first: an interrupted generation keeps whole tables
    "drgrpo_vs_grpo": {},
    "grpo_kl": {"kl_coef": 9, "loss_agg_mode": ["token-mean"]},
    "conservative": {"kl_coef": 13, "target_kl": 4, "horizon": [5000]},
    "aggressive": {"kl_coef": 13, "target_kl": 4, "horizon": [20000]},
}
SEEDS = (0, 1, 2)


def axis(p: Any, spec: int | list[Any] | None) -> list[Any]:
    """The grid values of one parameter (a :class:`klsweep.spec.schema.Choice` or ``Range``).

    ``spec`` is a number of points for a range (geometric for ``log_uniform_values``, integers for ``int_uniform``)
    or a list of a categorical parameter's values (None: all of them).
    """
    from klsweep.spec.schema import Choice

    if isinstance(p, Choice):
        return list(p.values) if spec is None else list(spec)
    n = int(spec) if isinstance(spec, int) else 3
    if p.distribution == "log_uniform_values":
        values = np.geomspace(p.min, p.max, n)
    else:
        values = np.linspace(p.min, p.max, n)
    if p.distribution == "int_uniform":
        return sorted({int(round(v)) for v in values})
    return [float(f"{v:.6g}") for v in values]


def plan(name: str, seeds: tuple[int, ...]) -> tuple[dict[str, Any], list[tuple[dict[str, Any], int]]]:
    """The header of ``name``'s table and its (params, seed) runs, params keyed by verl key, in grid order."""
    from klsweep.spec.load import load_sweep
    from klsweep.spec.schema import Choice
    from klsweep.spec.space import fixed_overrides, parameters

    path = ROOT / "sweeps" / f"{name}.yaml"
    sweep = load_sweep(path)
    params = parameters(sweep)
    by_alias = dict(zip(sweep.parameters, params))
    grid_spec = {by_alias[k]: v for k, v in GRIDS[name].items()}
    axes: dict[str, dict[str, Any]] = {}
    for key, p in params.items():
        if isinstance(p, Choice):
            axes[key] = {"scale": "categorical", "values": list(p.values), "grid": axis(p, grid_spec.get(key))}
        else:
            scale = "log" if p.distribution == "log_uniform_values" else "linear"
            axes[key] = {"scale": scale, "min": p.min, "max": p.max, "grid": axis(p, grid_spec.get(key))}
    header = {
        "sweep": name, "source": f"sweeps/{name}.yaml", "max_steps": sweep.budget.max_steps,
        "objective": [o.model_dump(mode="json") for o in sweep.objectives],
        "parameters": axes, "seeds": list(seeds), "fixed": fixed_overrides(sweep),
    }
    points = [dict(zip(axes, values)) for values in itertools.product(*(a["grid"] for a in axes.values()))]
    return header, [(point, seed) for point in points for seed in seeds]


def reusable_runs(old_header: dict[str, Any], header: dict[str, Any], old_runs: list[dict[str, Any]]
                  ) -> list[dict[str, Any]] | None:
    """The runs of an existing table that lie on the grid now planned, or None when the tables differ in more.

    Two headers may differ only in their parameters' ``grid`` lists (and ``fixed``); a run is kept when each of its
    values is on the new grid (floats compared to 6 significant digits, as :func:`axis` writes them).
    """
    def without_grid(h: dict[str, Any]) -> dict[str, Any]:
        params = {k: {f: v for f, v in a.items() if f != "grid"} for k, a in h["parameters"].items()}
        return {**{k: v for k, v in h.items() if k != "fixed"}, "parameters": params}

    if without_grid(old_header) != without_grid(header):
        return None
    grids = {k: {repr(v) for v in a["grid"]} for k, a in header["parameters"].items()}
    return [r for r in old_runs if all(repr(r["params"][k]) in grid for k, grid in grids.items())]


def train(job: tuple[str, dict[str, Any], int]) -> dict[str, Any]:
    """Train one run of the table: sweep ``name`` at ``params`` with ``data.seed=seed``; returns its record."""
    from klsweep.spec.load import load_sweep
    from klsweep.spec.space import trial_overrides
    from klsweep.trainers.embedded import EmbeddedTrainer
    from klsweep.trainers.tabular import encode_run

    name, params, seed = job
    sweep = load_sweep(ROOT / "sweeps" / f"{name}.yaml")
    overrides = {**trial_overrides(sweep, params), "data.seed": seed}
    start = time.process_time()
    trainer = EmbeddedTrainer(overrides)
    history = []
    while trainer.global_step < trainer.total_steps:
        history.append((trainer.global_step + 1, trainer.train_step()))
    return {**encode_run(params, seed, history), "cpu_s": round(time.process_time() - start, 2), "sweep_name": name}


def main(argv: list[str] | None = None) -> int:
    """Generate (or complete) the tables; prints each finished run and the total wall time."""
    from klsweep.trainers.tabular import append_record, read_table_records

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--workers", type=int, default=2, help="processes (at most 2 on a shared 2-core machine)")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    jobs: list[tuple[str, dict[str, Any], int]] = []
    for name in args.sweeps:
        header, runs = plan(name, tuple(args.seeds))
        path = args.out / f"{name}.jsonl.gz"
        done: set[tuple[str, int]] = set()
        if path.exists():
            old_header, old_runs = read_table_records(path)
            if old_header != header:
                kept = reusable_runs(old_header, header, old_runs)
                if kept is None:
                    print(f"{path}: its header differs from the grid now planned in more than the grid: delete it "
                          "to regenerate", file=sys.stderr)
                    return 2
                path.unlink()  # rewritten with the new header and the runs on the new grid
                for record in [{"header": header}, *kept]:
                    append_record(path, record)
                print(f"{path}: {len(kept)} of {len(old_runs)} runs kept on the new grid", flush=True)
                old_runs = kept
            done = {(repr(sorted(r["params"].items())), r["seed"]) for r in old_runs}
        else:
            append_record(path, {"header": header})
        jobs += [(name, p, s) for p, s in runs if (repr(sorted(p.items())), s) not in done]
    print(f"{len(jobs)} runs to train with {args.workers} workers", flush=True)
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for i, record in enumerate(pool.imap_unordered(train, jobs), start=1):
            name = record.pop("sweep_name")
            append_record(args.out / f"{name}.jsonl.gz", record)
            print(f"[{i}/{len(jobs)}] {name} {record['params']} seed {record['seed']}: {record['cpu_s']} s CPU, "
                  f"{time.perf_counter() - start:.0f} s wall", flush=True)
    print(f"wall {time.perf_counter() - start:.0f} s, load at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
