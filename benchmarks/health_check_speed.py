"""Time ``sweep health check`` on a 10,000-step verl jsonl (full-precision values, ~60 metrics per step).

Prints the wall time of the whole command (a fresh Python process: imports, reading, judging, printing) and its
ratio to the 2 s budget in BENCHMARKS.md (ratio < 1 passes), and the CPU time of that process (user + sys),
which is what to compare on a machine shared with other jobs, where wall time also counts waiting for a core.

    python benchmarks/health_check_speed.py [--steps 10000]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 2.0


def write_trace(path: Path, steps: int) -> None:
    """A GRPO-shaped healthy run: KL in the loss rising slowly, entropy falling, score rising; verl metric names."""
    rng = random.Random(0)
    with path.open("w") as f:
        for step in range(1, steps + 1):
            t = step / steps
            data = {
                "actor/kl_loss": 0.002 + 0.08 * t + rng.gauss(0, 0.003),
                "actor/kl_coef": 0.001,
                "actor/entropy": 0.4 * math.exp(-2 * t) + 0.05 + rng.gauss(0, 0.005),
                "actor/pg_loss": rng.gauss(0, 0.01),
                "actor/pg_clipfrac": abs(rng.gauss(0.002, 0.001)),
                "actor/ppo_kl": rng.gauss(0, 1e-4),
                "actor/grad_norm": abs(rng.gauss(0.2, 0.05)),
                "actor/lr": 1e-6,
                "critic/score/mean": min(1.0, 0.3 + 0.6 * t + rng.gauss(0, 0.02)),
                "critic/score/max": 1.0,
                "critic/score/min": 0.0,
                "critic/rewards/mean": min(1.0, 0.3 + 0.6 * t),
                "critic/advantages/mean": rng.gauss(0, 0.01),
                "critic/advantages/max": 1.789,
                "critic/advantages/min": -1.789,
                "response_length/mean": 200 - 50 * t + rng.gauss(0, 3),
                "response_length/max": 1024.0,
                "response_length/min": 20.0,
                "timing_s/step": 180 + rng.gauss(0, 5),
            }
            data.update({f"perf/extra_{i}": rng.random() for i in range(40)})
            if step % 10 == 0:
                data["val-core/openai/gsm8k/acc/mean@1"] = 0.3 + 0.6 * t
            f.write(json.dumps({"step": step, "data": data}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "run.jsonl"
        write_trace(trace, args.steps)
        command = [sys.executable, "-m", "klsweep.cli", "health", "check", str(trace)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        sys.exit(f"sweep health check failed ({done.returncode}): {done.stderr}")
    print(
        f"sweep health check, {args.steps} steps: wall {elapsed:.2f} s, ratio to the {BUDGET_S:g} s budget "
        f"{elapsed / BUDGET_S:.2f} ({'ok' if elapsed < BUDGET_S else 'TOO SLOW'}); "
        f"CPU {cpu:.2f} s, ratio {cpu / BUDGET_S:.2f}"
    )


if __name__ == "__main__":
    main()
