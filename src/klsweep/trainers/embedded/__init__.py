"""The embedded CPU trainer: verl's PPO/GRPO/DrGRPO on a small task, with verl's own KL and loss math.

In process: ``run(overrides, report)`` or ``EmbeddedTrainer(overrides).train_step()``; as a process with verl's
command-line shape: ``python -m klsweep.trainers.embedded key=value ...``. ``VAL_METRIC`` is the validation metric.
"""

from klsweep.trainers.embedded.config import VAL_METRIC

__all__ = ["VAL_METRIC", "EmbeddedTrainer", "run"]


def __getattr__(name: str):
    # The trainer imports torch (seconds): only those who use it pay for it, not `klsweep.trainers.embedded.config`.
    if name in ("EmbeddedTrainer", "run"):
        from klsweep.trainers.embedded import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'klsweep.trainers.embedded' has no attribute {name!r}")
