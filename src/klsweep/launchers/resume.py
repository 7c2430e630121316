"""A verl trial that starts again (an in-trial retry, a Ray Tune retry, ``sweep resume``, a remedy's restart)
continues from its own checkpoint instead of step 1.

verl saves a checkpoint every ``trainer.save_freq`` steps (verl's default −1: never) into
``trainer.default_local_dir``: ``global_step_N/`` and ``latest_checkpointed_iteration.txt``
(``verl/trainer/ppo/v1/trainer_base.py``, ``_save_checkpoint``). With ``trainer.resume_mode=auto`` (verl's
default), a new start in the same directory resumes from there (``_load_checkpoint``). A remedy's restart loads the
checkpoint it names instead (:func:`rewind`).

What the checkpoint lacks is the in-reward KL controller. ``RayPPOTrainer`` builds it from
``algorithm.kl_ctrl.kl_coef`` at every start, so an adaptive coefficient would snap back to its initial value. The
rule of every trainer holds (:func:`klsweep.trainers.restore.knobs_after_load`): the run continues with the
coefficient it had at the checkpoint's step, unless a remedy restarting from exactly that step changed it, which
then takes its remedied value. :func:`resume_overrides` passes the coefficient that rule gives.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.trainers.restore import KL_COEF_KEY, knobs_after_load
from klsweep.verl.stream import MetricsTail

if TYPE_CHECKING:
    from klsweep.results import Restart

#: verl's checkpoint cadence key; a verl trial without one gets :func:`save_freq`.
SAVE_FREQ_KEY = "trainer.save_freq"
#: How many checkpoints verl keeps per trial unless the sweep says otherwise (verl's default null keeps all: with
#: klsweep's cadence, five full actor and critic checkpoints per trial); a resume needs only the latest.
CHECKPOINTS_KEPT = {"trainer.max_actor_ckpt_to_keep": 1, "trainer.max_critic_ckpt_to_keep": 1}
#: The coefficient ``ray_trainer.apply_kl_penalty`` used at a step: the controller's value before that step's update.
KL_COEFF_METRIC = "actor/reward_kl_penalty_coeff"
#: verl's checkpoint tracker in ``trainer.default_local_dir`` (``verl/utils/checkpoint/checkpoint_manager.py``).
TRACKER = "latest_checkpointed_iteration.txt"
#: Steps between checkpoints when neither ``trainer.save_freq`` nor ``trainer.test_freq`` is set: a fifth of the
#: run, the cadence of verl's GRPO reference run (tests/data/README.md). A checkpoint step is slow, so a shorter
#: cadence costs more than a retry saves.
DEFAULT_CHECKPOINTS_PER_RUN = 5


def save_freq(overrides: Mapping[str, Any]) -> int:
    """``trainer.save_freq`` of a verl trial.

    The trial's own value when it sets one; else the validation cadence ``trainer.test_freq`` when > 0; else a
    fifth of ``trainer.total_training_steps``, at least 1. −1 (verl's "never") when none of them is known."""
    if SAVE_FREQ_KEY in overrides:
        return int(overrides[SAVE_FREQ_KEY])
    test_freq = int(overrides.get("trainer.test_freq") or -1)
    if test_freq > 0:
        return test_freq
    total = overrides.get("trainer.total_training_steps")
    return max(1, int(total) // DEFAULT_CHECKPOINTS_PER_RUN) if total else -1


def checkpointed_step(checkpoint_dir: Path) -> int:
    """The step of the checkpoint verl's ``resume_mode=auto`` resumes from in ``checkpoint_dir`` (its tracker file,
    when the ``global_step_N`` folder it names exists, as ``find_latest_ckpt_path`` requires); 0 when none."""
    tracker = Path(checkpoint_dir) / TRACKER
    try:
        step = int(tracker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0
    return step if (Path(checkpoint_dir) / f"global_step_{step}").is_dir() else 0


def repair_tracker(checkpoint_dir: Path) -> int | None:
    """Point an unreadable checkpoint tracker at the newest checkpoint; the step it now names, or None if untouched.

    verl writes ``latest_checkpointed_iteration.txt`` with a plain ``open(..., "w")`` after a save
    (``_save_checkpoint`` in verl/trainer/ppo/v1/trainer_base.py), and reads it back with ``int(f.read())``
    (``find_latest_ckpt_path`` in verl/utils/checkpoint/checkpoint_manager.py). A process stopped between the two
    leaves the file empty, and every later start of the trial fails on it. The save before the tracker write is
    whole, so the newest ``global_step_N`` that still holds its actor (:func:`has_checkpoint`) is the one to name.
    Without one, the tracker is removed: the trial starts again at step 1.
    """
    tracker = Path(checkpoint_dir) / TRACKER
    try:
        int(tracker.read_text().strip())
        return None
    except FileNotFoundError:
        return None
    except ValueError:
        pass
    steps = [int(d.name[len("global_step_"):]) for d in Path(checkpoint_dir).glob("global_step_*")
             if d.name[len("global_step_"):].isdigit()]
    steps = [s for s in steps if has_checkpoint(checkpoint_dir, s)]
    if not steps:
        tracker.unlink()
        return None
    tmp = Path(checkpoint_dir) / (TRACKER + ".tmp")
    tmp.write_text(str(max(steps)))
    tmp.replace(tracker)
    return max(steps)


def logged_steps(trial_dir: Path) -> dict[int, dict[str, Any]]:
    """Every step the trial's earlier attempts logged (``attempt-*/metrics.jsonl``), the latest attempt's line winning
    where two logged the same step: ``{step: data}``. NaN where verl's file logger wrote ``null``."""
    steps: dict[int, dict[str, Any]] = {}
    attempts = sorted(Path(trial_dir).glob("attempt-*/metrics.jsonl"), key=lambda p: int(p.parent.name[8:]))
    for path in attempts:
        for step, data in MetricsTail(path).read_new():
            steps[step] = data
    return steps


def resume_overrides(trial_dir: Path, overrides: Mapping[str, Any], remedies: Sequence[Restart] = ()
                     ) -> dict[str, Any]:
    """The overrides a new attempt of a verl trial adds so that it continues where its checkpoint left off.

    Needs a checkpoint at step N in ``trial_dir/checkpoints`` (the one verl loads: its tracker's, which
    :func:`rewind` sets) and KL in the reward. It then sets :data:`KL_COEF_KEY` by
    :func:`klsweep.trainers.restore.knobs_after_load`: to the coefficient the controller held at step N, unless a
    remedy restarting from step N changed it, which keeps its value in ``overrides``. The coefficient held at step
    N is the one logged at step N + 1: it is used before that step's update, so it is the controller's value after
    step N's. When step N + 1 never got logged, it is the last value logged before it, one update earlier. Nothing
    is set when there is no checkpoint (the attempt starts at step 1 with the trial's own coefficient), no KL in
    the reward, or neither a logged coefficient nor a remedy of it.

    Args:
        trial_dir: the trial's directory (``checkpoints/`` = ``trainer.default_local_dir``, ``attempt-*/``).
        overrides: the trial's flat verl overrides, with every remedy's values.
        remedies: the trial's restarts, oldest first (:func:`klsweep.results.restarts`).

    Returns:
        ``{}`` or ``{"algorithm.kl_ctrl.kl_coef": value}``.
    """
    step = checkpointed_step(Path(trial_dir) / "checkpoints")
    if step == 0 or overrides.get("algorithm.use_kl_in_reward") is not True:
        return {}
    coefficients = {s: d[KL_COEFF_METRIC] for s, d in logged_steps(trial_dir).items()
                    if s <= step + 1 and isinstance(d.get(KL_COEFF_METRIC), (int, float))
                    and math.isfinite(d[KL_COEFF_METRIC])}
    carried = {KL_COEF_KEY: float(coefficients[max(coefficients)])} if coefficients else {}
    knobs = knobs_after_load(step, carried, overrides, remedies)
    return {KL_COEF_KEY: float(knobs[KL_COEF_KEY])} if KL_COEF_KEY in knobs else {}


def has_checkpoint(checkpoint_dir: Path, step: int) -> bool:
    """Whether verl still holds its checkpoint of ``step`` in ``checkpoint_dir``: ``global_step_<step>/actor/`` (verl
    removes that folder of a checkpoint past ``trainer.max_actor_ckpt_to_keep`` and leaves the rest,
    ``BaseCheckpointManager.remove_previous_save_local_path`` in verl/utils/checkpoint/checkpoint_manager.py)."""
    return (Path(checkpoint_dir) / f"global_step_{step}" / "actor").is_dir()


def rewind(checkpoint_dir: Path, step: int) -> dict[str, Any] | None:
    """Make verl's checkpoint at ``step`` the one a trial continues from.

    A remedy restarts the trial there, before the finding (:mod:`klsweep.orchestrate.remedy`). What it ran after
    ``step`` is superseded. The checkpoints after ``step`` belong to the run the restart abandons. They are removed
    and the tracker is set back to ``step``, so a later retry of the restarted run (``resume_mode=auto``) never
    resumes from them.

    Args:
        checkpoint_dir: the trial's ``trainer.default_local_dir``.
        step: the step of the remedy's restart (its Tune checkpoint's ``step``).

    Returns:
        ``{"trainer.resume_mode": "resume_path", "trainer.resume_from_path": ".../global_step_<step>"}`` (verl's
        ``_load_checkpoint`` loads exactly that folder), or None when verl no longer holds a checkpoint of ``step``
        (:func:`has_checkpoint`).
    """
    checkpoint_dir = Path(checkpoint_dir)
    folder = checkpoint_dir / f"global_step_{step}"
    if not has_checkpoint(checkpoint_dir, step):
        return None
    for later in checkpoint_dir.glob("global_step_*"):
        suffix = later.name[len("global_step_"):]
        if suffix.isdigit() and int(suffix) > step:
            shutil.rmtree(later)
    tmp = checkpoint_dir / (TRACKER + ".tmp")
    tmp.write_text(str(step))
    tmp.replace(checkpoint_dir / TRACKER)
    return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": str(folder)}
