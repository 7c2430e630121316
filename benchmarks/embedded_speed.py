"""Speed of the embedded CPU trainer at its default size: RL steps per second, reference warm-up and load.

Prints, for GRPO with KL in the loss and for PPO (gae) with KL in the reward, the steps per second of ``train_step``
(default settings: 16 prompts x 8 samples, responses up to 8 tokens, validation every 10 steps included) in wall
time and in CPU time of this process (the number to compare on a machine shared with other jobs, where wall time
also counts waiting for a core), and the ratio to the 10 steps/s goal (ratio >= 1 meets it). Then the reference
warm-up time on first use (in a temporary cache dir) and the cache load time (goals: < 60 s and < 1 s).
The last line is the GRPO steps per second (CPU time) and its ratio to the goal.

    python benchmarks/embedded_speed.py [--steps 50] [--skip-warm-up]
"""

from __future__ import annotations

import argparse
import time

GOAL_STEPS_PER_S = 10.0
A = "actor_rollout_ref.actor"
ALGORITHMS = {
    "grpo (kl in loss)": {"algorithm.adv_estimator": "grpo", f"{A}.use_kl_loss": True, f"{A}.kl_loss_coef": 1.0},
    "ppo/gae (kl in reward)": {"algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": True,
                               "algorithm.kl_ctrl.kl_coef": 0.1},
}


def steps_per_second(overrides: dict, steps: int) -> tuple[float, float]:
    """(wall, CPU) steps per second of ``train_step`` after 3 warm-up steps."""
    from klsweep.trainers.embedded import EmbeddedTrainer

    trainer = EmbeddedTrainer({**overrides, "trainer.total_training_steps": steps + 3})
    for _ in range(3):
        trainer.train_step()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.train_step()
    return steps / (time.perf_counter() - wall), steps / (time.process_time() - cpu)


def warm_up_and_load() -> tuple[float, float]:
    """Seconds to build the reference (:func:`warm_up`), then to load the shipped one."""
    from klsweep.trainers.embedded.reference import load_reference, warm_up

    start = time.perf_counter()
    warm_up()
    built = time.perf_counter() - start
    start = time.perf_counter()
    load_reference()
    return built, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--skip-warm-up", action="store_true", help="do not time the reference warm-up (~30 s)")
    args = parser.parse_args()
    import torch

    results = {}
    for name, overrides in ALGORITHMS.items():
        wall, cpu = steps_per_second(overrides, args.steps)
        results[name] = cpu
        ratio = cpu / GOAL_STEPS_PER_S
        print(f"{name:24s} {wall:6.1f} steps/s wall  {cpu:6.1f} steps/s CPU  ratio to goal {ratio:.2f}")
    print(f"torch threads in the trainer: {torch.get_num_threads()}")
    if not args.skip_warm_up:
        built, loaded = warm_up_and_load()
        print(f"reference warm-up {built:.1f} s (ratio to 60 s: {built / 60:.2f}), "
              f"load {loaded:.3f} s (ratio to 1 s: {loaded:.3f})")
    grpo = results["grpo (kl in loss)"]
    print(f"grpo {grpo:.1f} steps/s (CPU time): "
          f"ratio to the {GOAL_STEPS_PER_S:g} steps/s goal {grpo / GOAL_STEPS_PER_S:.2f}")


if __name__ == "__main__":
    main()
