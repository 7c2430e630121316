"""The embedded CPU trainer: verl's PPO/GRPO/DrGRPO on a small task, with verl's own KL and loss math.

In process: ``run(overrides, report)`` or ``EmbeddedTrainer(overrides).train_step()``; as a process with verl's
command-line shape: ``python -m klsweep.trainers.embedded key=value ...``. ``VAL_METRIC`` is the validation metric.
"""

from klsweep.trainers.embedded.trainer import VAL_METRIC, EmbeddedTrainer, run

__all__ = ["VAL_METRIC", "EmbeddedTrainer", "run"]
