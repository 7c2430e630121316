"""`sweep validate` warns when budget.max_steps runs past the last step of the log a replay sweep plays back: every
trial would end at the log's last step, short of the budget."""

from __future__ import annotations

from klsweep.spec import load_sweep
from klsweep.trainers.replay import ReplayTrainer, last_step
from tests.conftest import GRPO, TRACES


def _budget_warnings(path) -> list[str]:
    return [w for w in load_sweep(path).warnings if "budget.max_steps" in w]


def _replay_file(sweep_file, max_steps: int):
    return sweep_file(f"trainer: replay\nreplay: {{trace: {TRACES / GRPO}, speed: 0}}\n"
                      f"budget: {{trials: 3, max_steps: {max_steps}}}\n")


def test_last_step_is_the_last_step_a_replay_plays():
    """verl's GRPO log: step 0 (validation before training) to 105."""
    assert last_step(TRACES / GRPO) == 105
    assert ReplayTrainer({"trainer.total_training_steps": 200}, trace=TRACES / GRPO).total_steps == 105


def test_max_steps_past_the_logs_last_step_is_a_warning_with_its_line_and_fix(sweep_file):
    path = _replay_file(sweep_file, 200)
    assert _budget_warnings(path) == [
        f"{path}:6: budget.max_steps: 200 is longer than the replayed log {TRACES / GRPO}, whose last step is 105: "
        "every trial ends at step 105, and the budget's steps past it are neither run nor saved. Lower "
        "budget.max_steps to 105, or replay a longer log"]


def test_max_steps_within_the_log_is_not_warned(sweep_file):
    assert _budget_warnings(_replay_file(sweep_file, 105)) == []
    assert _budget_warnings(_replay_file(sweep_file, 80)) == []
