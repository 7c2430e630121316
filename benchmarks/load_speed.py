"""How long ``klsweep.analysis.load`` takes on a 1,000-trial sweep directory, as a ratio to the 5 s target (issue 7).

Builds the directory once (~1-2 min) with the test suite's synthetic sweep (a real Optuna sqlite study with the
searcher's user attributes and one Ray Tune result.json per trial), then times ``load`` and ``load_history``. A ratio
below 1 meets the target.

    python benchmarks/load_speed.py [--trials 1000] [--steps 80] [--dir /tmp/klsweep_load_speed]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.analysis import load, load_history  # noqa: E402
from tests.analysis.conftest import make_sweep  # noqa: E402

TARGET_S = 5.0


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
        make_sweep(run_dir, args.trials, max_steps=args.steps)
        print(f"built {run_dir} in {time.perf_counter() - start:.1f} s")
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
