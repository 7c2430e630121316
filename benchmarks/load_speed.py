"""How long ``klsweep.analysis.load`` takes on a 1,000-trial sweep directory, as a ratio to the 5 s target.

Builds the directory once with the test suite's synthetic sweep (a real Optuna sqlite study with the searcher's user
attributes and one Ray Tune result.json per trial), then times ``load`` and ``load_history``. A ratio below 1 meets
the target. Each result.json row has the key set of a real embedded PPO trial's row (:data:`REAL_ROW`: 49 trainer
metrics, Ray Tune's own fields, the trial config and klsweep's health fields, ~2.2 KB), not only the few metrics the
analysis tests need: parsing the rows is most of ``load``'s work.

    python benchmarks/load_speed.py [--trials 1000] [--steps 80] [--dir /tmp/klsweep_load_speed]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.analysis import load, load_history  # noqa: E402
from tests.analysis.conftest import curve, make_sweep, trial_spec  # noqa: E402

TARGET_S = 5.0

#: Keys of step 3 of a real embedded PPO trial's result.json row (``sweep run`` of the adaptive-controller sweep,
#: Ray Tune 2.60, klsweep's trainable): 63 keys, 2,249 bytes. Metric keys in the order the trainer reports them.
REAL_ROW_METRICS = (
    "embedded/gold_score/mean", "actor/entropy", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
    "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/rewards/max",
    "critic/rewards/min", "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
    "critic/returns/mean", "critic/returns/max", "critic/returns/min", "critic/values/mean", "critic/values/max",
    "critic/values/min", "critic/vf_explained_var", "response_length/mean", "response_length/max",
    "response_length/min", "response_length/clip_ratio", "response_length_non_aborted/mean",
    "response_length_non_aborted/max", "response_length_non_aborted/min", "response_length_non_aborted/clip_ratio",
    "response/aborted_ratio", "prompt_length/mean", "prompt_length/max", "prompt_length/min",
    "prompt_length/clip_ratio", "critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/lr",
    "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/pg_loss", "actor/grad_norm", "actor/lr",
    "timing_s/step",
)
REAL_ROW_BYTES = 2249


def real_row(params: dict, step: int, max_steps: int = 80) -> dict:
    """A result.json row with the real row's keys and value kinds at ``step``: the synthetic sweep's objective
    curves (:func:`tests.analysis.conftest.curve`), every other trainer metric as a full-precision float, and
    Tune's and klsweep's fields (``make_sweep`` adds ``training_iteration``, ``time_total_s``, ``trial_id``,
    ``health`` and ``stop_reason``)."""
    row = {key: math.sin(step * 0.37 + i) * (1 + i % 5) for i, key in enumerate(REAL_ROW_METRICS)}
    row.update(curve(params, step))
    return {
        **row, "step": step, "total_steps": max_steps, "timestamp": 1796093651 + step, "checkpoint_dir_name": None,
        "done": False, "date": "2026-12-01_02-54-11", "time_this_iter_s": 0.10708117485046387 + step * 1e-9,
        "pid": 27207, "hostname": "vm", "node_ip": "192.0.2.2", "config": params,
        "time_since_restore": 0.3737783432006836 * step, "iterations_since_restore": step, "stop_kind": "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=80, help="steps per trial (budget.max_steps; stopped trials half)")
    parser.add_argument("--dir", default="/tmp/klsweep_load_speed")
    args = parser.parse_args()
    run_dir = Path(args.dir) / f"sweep_{args.trials}x{args.steps}"
    if not (run_dir / "sweep.json").is_file():
        shutil.rmtree(run_dir, ignore_errors=True)
        start = time.perf_counter()
        specs = [{**trial_spec(i, args.steps), "metrics": lambda p, step: real_row(p, step, args.steps)}
                 for i in range(args.trials)]
        make_sweep(run_dir, specs, max_steps=args.steps)
        print(f"built {run_dir} in {time.perf_counter() - start:.1f} s")
    row = json.loads(next(run_dir.glob("tune/*/result.json")).read_text().splitlines()[0])
    print(f"result.json rows: {len(row)} keys, {len(json.dumps(row))} bytes each "
          f"(a real embedded trial's row: 63 keys, {REAL_ROW_BYTES:,} bytes)")
    start = time.perf_counter()
    df = load(run_dir)
    cold_s = time.perf_counter() - start  # includes importing Optuna's RDB storage (SQLAlchemy, alembic)
    start = time.perf_counter()
    load(run_dir)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    history = load_history(run_dir)
    history_s = time.perf_counter() - start
    print(f"load, first call in this process: {len(df)} trials in {cold_s:.2f} s, ratio to {TARGET_S:g} s target: "
          f"{cold_s / TARGET_S:.2f}")
    print(f"load, again: {load_s:.2f} s, ratio: {load_s / TARGET_S:.2f}")
    print(f"load_history: {len(history)} rows in {history_s:.2f} s, "
          f"ratio to {TARGET_S:g} s: {history_s / TARGET_S:.2f}")


if __name__ == "__main__":
    main()
