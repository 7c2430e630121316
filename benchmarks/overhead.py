"""Orchestration overhead: the same 8 embedded trials bare and through ``sweep run`` with 2 at once.

(a) bare: the 8 trials one after another in this process, each ``EmbeddedTrainer(overrides)`` + ``train_step`` to
    the end, exactly the overrides ``sweep run`` gives them (:func:`klsweep.spec.space.trial_overrides`); verl is
    imported and the reference loaded once before timing, so the bare busy time is training only.
(b) ``sweep run sweeps/grpo_kl.yaml`` (a subprocess: Python start, imports, private Ray, Optuna, Tune, health
    engine, trials.csv and summary all counted) with ``budget.max_concurrent=2`` and the same 8 trials as seed trials.

Prints wall(b) ÷ (Σ bare busy ÷ 2): 1.0 would be a perfect 2-way split with no orchestration cost; goal ≤ 1.03.
Before it, the two parts of the cost: the steady-state per-trial ratio (median trial in Tune ÷ median bare trial) and
the fixed cost of (b) (Python and Ray start, preflight, each Ray worker's first import of torch + verl, summary),
which a sweep pays once, whatever the length of its trials.
With 2 cores both trials of (b) share the cores with the driver and Ray's own processes, so this is the overhead a
2-core user pays; on a larger machine the driver has its own cores.

Scaled down: health ``none`` with the built-in checks off, so both sides run the same steps (a health stop would
shorten (b)); the sweep's default size otherwise (80 steps of 16 prompts × 8 samples per trial). ``--steps`` makes
the trials longer, which amortises the fixed start-up cost.

    python benchmarks/overhead.py [--steps 80]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _bench import machine, sweep_run, trials

SWEEP = "sweeps/grpo_kl.yaml"
SEEDS = [{"kl_coef": c, "kl_loss_type": t, "loss_agg_mode": "token-mean"}
         for c in (0.001, 0.01, 0.1, 1.0) for t in ("low_var_kl", "kl")]
NO_HEALTH = ("health={preset: none, builtin: {nonfinite_loss: false, nonfinite_grad_norm_streak: 0, "
             "no_signal_for: 0, kl_dead_for: 0, kl_explosion: 0}}")


def overrides(steps: int) -> list[str]:
    seeds = ", ".join("{" + ", ".join(f"{k}: {v}" for k, v in s.items()) + "}" for s in SEEDS)
    return [f"budget.trials={len(SEEDS)}", "budget.max_concurrent=2", f"budget.max_steps={steps}", "sampler=random",
            f"seed_trials=[{seeds}]", NO_HEALTH]


def bare(steps: int) -> list[float]:
    """Busy seconds of each trial run bare, one after another."""
    from klsweep.spec import load_sweep
    from klsweep.spec.space import seed_params, trial_overrides
    from klsweep.trainers.embedded import EmbeddedTrainer

    sweep = load_sweep(Path(__file__).resolve().parents[1] / SWEEP, overrides(steps))
    EmbeddedTrainer(trial_overrides(sweep, seed_params(sweep)[0]))  # verl imports, reference cache: not timed
    busy = []
    for params in seed_params(sweep):
        start = time.perf_counter()
        trainer = EmbeddedTrainer(trial_overrides(sweep, params))
        while trainer.global_step < trainer.total_steps:
            trainer.train_step()
        busy.append(time.perf_counter() - start)
    return busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="training steps per trial (default 80, the sweep's)")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    busy = bare(args.steps)
    print(f"(a) bare: {len(busy)} trials × {args.steps} steps, busy {sum(busy):.1f} s "
          f"({', '.join(f'{b:.1f}' for b in busy)})")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        wall = sweep_run(SWEEP, overrides(args.steps), out)
        df = trials(out)
    steps_run = int(df["steps"].sum())
    print(f"(b) sweep run, 2 at once: wall {wall:.1f} s; trials' own time in Tune {df['wall_s'].sum():.1f} s "
          f"(Σ wall_s), steps {steps_run} of {len(busy) * args.steps}, states {df['state'].value_counts().to_dict()}")
    if steps_run != len(busy) * args.steps:
        print("warning: (b) did not run every step of (a): the ratio below understates the overhead")
    ideal = sum(busy) / 2
    print(f"ideal 2-way wall Σbusy/2 = {ideal:.1f} s; start-up and tail in (b) ≈ {wall - df['wall_s'].sum() / 2:.1f} s")
    # The first trial on each Ray worker also imports torch + verl and loads the reference model: the median trial
    # is the steady state a long sweep runs at.
    median_bare = sorted(busy)[len(busy) // 2]
    warm = df["wall_s"].median() / median_bare
    print(f"steady state: median trial in Tune {df['wall_s'].median():.1f} s vs bare {median_bare:.1f} s "
          f"(×{warm:.3f} per trial once the workers are warm); fixed cost of (b) ≈ {wall - warm * ideal:.0f} s")
    print(f"machine after: {machine()}")
    print(f"overhead ratio wall(b) / (Σ busy / 2): {wall / ideal:.3f} (goal ≤ 1.03)")


if __name__ == "__main__":
    main()
