"""What verl's checkpoints cost a sweep, and which finished trial keeps one.

**When verl saves.** With ``trainer.save_freq`` > 0, verl 0.9.1 saves after every step that is a multiple of it and
after the last step, whatever the cadence (``verl/trainer/ppo/v1/trainer_base.py``, ``fit``: ``is_last_step or
global_steps % save_freq == 0``). The last-step save cannot be turned off without turning off every save; a resume
never uses it, since the trial is done. It pays off only when that checkpoint is kept for later use. A periodic save
just before the last step is wasted too: verl's GRPO reference run saved after steps 20, 40, ..., 100 and 105, and the
save after step 100 protects 5 steps for the price of about 15. :func:`trial_save_freq` moves klsweep's own cadence
off such a save (:func:`wasted_save`).

**What a save weighs.** verl's FSDP checkpoint holds the model, the optimizer and the extra state
(``checkpoint.save_contents`` default ``[model, optimizer, extra]``): fp32 weights and AdamW's two fp32 moments,
12 bytes per parameter (Rajbhandari et al. 2020, ZeRO, the "K = 12" of mixed-precision Adam), one copy for the actor
and one for a critic (``gae``). For a 7.6 B-parameter actor that is 85 GiB per save. verl writes a new save before it
removes the old one when it keeps one (``ensure_checkpoint_capacity`` and ``register_checkpoint`` in
``verl/utils/checkpoint/checkpoint_manager.py``): two on disk at once during a save. A save step took about
15 normal steps in verl's GRPO reference log (2,500 s against 170 s; grpo_qwen7b_gsm8k in tests/data/README.md).

**Retention** (:func:`retain_finished`), for a trial that ran to its last step: ``best`` (the default) keeps the
checkpoint of the best finished trial so far on the sweep's objective (every trial of the Pareto front when there are
several objectives) and deletes the others'; ``all`` keeps every one; ``none`` deletes each. A trial that did not
finish keeps its checkpoint whatever the policy: a retry, ``sweep resume`` or a remedy (a restart from an earlier
step) continues from it. A confirmation run re-runs its configuration from step 1 and needs no checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.launchers.resume import CHECKPOINTS_KEPT, SAVE_FREQ_KEY, logged_steps, save_freq

#: Bytes a save holds per parameter of each saved model: fp32 weights + AdamW's exp_avg and exp_avg_sq (ZeRO's K=12).
BYTES_PER_PARAMETER = 12
#: A save step's duration in normal steps, in verl's GRPO reference log (2,500 s against 170 s).
SAVE_STEP_COST = 15
#: The retention policies of :func:`retain_finished`; the environment variable that chooses one.
POLICIES = ("best", "all", "none")
POLICY_ENV = "KLSWEEP_KEEP_CHECKPOINTS"
#: The sweep-wide record of the finished trials whose checkpoint is kept (in the trials' parent directory).
KEPT_FILE = "kept_checkpoints.json"
#: safetensors' element sizes, for :func:`parameter_count`'s header reading.
_DTYPE_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def checkpoint_steps(total_steps: int, freq: int) -> list[int]:
    """The steps after which verl saves a checkpoint in a run of ``total_steps`` with ``trainer.save_freq`` ``freq``:
    every multiple of ``freq``, and the last step. None when ``freq`` ≤ 0."""
    if freq <= 0 or total_steps <= 0:
        return []
    return sorted({s for s in range(freq, total_steps + 1, freq)} | {total_steps})


def wasted_save(total_steps: int, freq: int) -> int | None:
    """The last periodic save before the last step when it is wasted, else None.

    It is wasted when the steps it protects (those after it, up to the last) are fewer than a save step costs
    (:data:`SAVE_STEP_COST`) and fewer than half of what every other save protects (``freq``)."""
    below = [s for s in checkpoint_steps(total_steps, freq) if s < total_steps]
    if not below:
        return None
    gap = total_steps - below[-1]
    return below[-1] if gap < SAVE_STEP_COST and gap < freq / 2 else None


def trial_save_freq(overrides: Mapping[str, Any]) -> int:
    """``trainer.save_freq`` klsweep runs a verl trial with.

    The trial's own ``trainer.save_freq``, or its ``trainer.test_freq``, as given
    (:func:`klsweep.launchers.resume.save_freq`). Otherwise klsweep's cadence, a fifth of the run, moved up by the
    fewest steps (at most doubled) that leaves no :func:`wasted_save`: 58 steps give 12 (saves after 12, 24, 36, 48,
    58), not 11 (11, ..., 55, 58)."""
    freq = save_freq(overrides)
    total = overrides.get("trainer.total_training_steps")
    if freq <= 0 or not total or SAVE_FREQ_KEY in overrides or int(overrides.get("trainer.test_freq") or -1) > 0:
        return freq
    for candidate in range(freq, 2 * freq + 1):
        if wasted_save(int(total), candidate) is None:
            return candidate
    return freq


def parameter_count(model_dir: Path) -> int | None:
    """Parameters of the model in a local folder, from the headers of its ``*.safetensors`` files (each begins with
    an 8-byte little-endian header length and a JSON header of tensor dtypes and byte offsets); None when the folder
    holds none or a header cannot be read."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    total = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error):
            return None
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            start, end = tensor["data_offsets"]
            total += (end - start) // _DTYPE_SIZES.get(tensor["dtype"], 1)
    return total or None


@dataclass(frozen=True)
class CheckpointCost:
    """The checkpoint cost of one verl trial.

    Attributes:
        steps: the steps verl saves after (:func:`checkpoint_steps`); empty: no checkpoint.
        save_freq: ``trainer.save_freq``.
        bytes_per_save: disk per save (actor, plus critic for ``gae``), None when the model size is unknown.
        kept_while_running: ``trainer.max_actor_ckpt_to_keep``: saves kept while the trial runs (None: all).
    """

    steps: list[int]
    save_freq: int
    bytes_per_save: int | None
    kept_while_running: int | None

    def describe(self) -> str:
        """One line for ``sweep plan``."""
        if not self.steps:
            return ("no checkpoint (trainer.save_freq <= 0 or no trainer.total_training_steps): a retried trial starts "
                    "again at step 1")
        steps = ", ".join(map(str, self.steps))
        text = (f"{len(self.steps)} saves per trial, after steps {steps} (trainer.save_freq={self.save_freq}; verl "
                f"always saves after the last step too), each about {SAVE_STEP_COST} normal steps long: about "
                f"{len(self.steps) * SAVE_STEP_COST} steps' time on top of the run's {self.steps[-1]}")
        wasted = wasted_save(self.steps[-1], self.save_freq)
        if wasted is not None:
            text += (f"; the save after step {wasted} protects only {self.steps[-1] - wasted} steps: choose a "
                     f"trainer.save_freq that divides {self.steps[-1]}")
        if self.bytes_per_save is None:
            return text + "; disk per save unknown (no local model folder with *.safetensors)"
        kept = self.kept_while_running
        peak = None if kept is None else max(kept, 2)
        per_trial = "" if peak is None else f", at most {peak} on disk at once while a trial runs"
        return text + f"; {_size(self.bytes_per_save)} per save{per_trial}"


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def checkpoint_cost(overrides: Mapping[str, Any]) -> CheckpointCost:
    """The :class:`CheckpointCost` of a trial with the flat verl ``overrides`` klsweep runs it with (its
    ``trainer.save_freq`` is :func:`trial_save_freq`, its checkpoints kept while running
    :data:`klsweep.launchers.resume.CHECKPOINTS_KEPT` unless it sets its own)."""
    freq = trial_save_freq(overrides)
    total = overrides.get("trainer.total_training_steps")
    steps = checkpoint_steps(int(total), freq) if total else []
    params = parameter_count(Path(str(overrides.get("actor_rollout_ref.model.path", ""))))
    models = 2 if overrides.get("algorithm.adv_estimator") == "gae" else 1
    kept = (CHECKPOINTS_KEPT | dict(overrides)).get("trainer.max_actor_ckpt_to_keep")
    return CheckpointCost(steps, freq, None if params is None else params * BYTES_PER_PARAMETER * models,
                          None if kept is None else int(kept))


def policy(value: str | None = None) -> str:
    """The retention policy: ``value``, else ``$KLSWEEP_KEEP_CHECKPOINTS``, else ``best``.

    Raises:
        ValueError: not one of :data:`POLICIES` (the message names the value and the choices)."""
    chosen = value or os.environ.get(POLICY_ENV) or "best"
    if chosen not in POLICIES:
        raise ValueError(f"{POLICY_ENV}={chosen!r} is not a checkpoint retention policy: use one of "
                         f"{', '.join(POLICIES)}")
    return chosen


def _final_value(trial_dir: Path, metric: str) -> float | None:
    """The last finite value of ``metric`` the trial logged, or None."""
    for _, data in sorted(logged_steps(trial_dir).items(), reverse=True):
        value = data.get(metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def _dominates(a: Sequence[float], b: Sequence[float], modes: Sequence[str]) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one (``modes``: ``max``/``min``)."""
    signed = [(x, y) if m == "max" else (-x, -y) for x, y, m in zip(a, b, modes)]
    return all(x >= y for x, y in signed) and any(x > y for x, y in signed)


def retain_finished(trial_dir: Path, objectives: Sequence[tuple[str, str]], keep: str | None = None) -> bool:
    """Apply the retention policy to the checkpoint of a trial that ran to its last step; whether it is kept.

    Args:
        trial_dir: the trial's directory (its verl checkpoints in ``checkpoints/``, its metrics in ``attempt-*/``);
            its parent holds the other trials and :data:`KEPT_FILE`.
        objectives: the sweep's ``(metric, mode)`` pairs; the value of each is the last finite one the trial logged.
        keep: the policy (:func:`policy`).

    ``best``: the trial joins the kept set unless a kept trial dominates it; kept trials it dominates lose their
    checkpoint. A trial without every objective value loses its checkpoint. Trials finishing at once take turns
    (``flock`` on the kept file).
    """
    keep = policy(keep)
    trial_dir = Path(trial_dir)
    checkpoints = trial_dir / "checkpoints"
    if keep == "all" or not checkpoints.exists():
        return checkpoints.exists()
    values = [_final_value(trial_dir, metric) for metric, _ in objectives]
    if keep == "none" or not objectives or any(v is None for v in values):
        shutil.rmtree(checkpoints, ignore_errors=True)
        return False
    modes = [mode for _, mode in objectives]
    record_path = trial_dir.parent / KEPT_FILE
    with open(trial_dir.parent / (KEPT_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = json.loads(record_path.read_text()) if record_path.exists() else {}
        kept = {name: v for name, v in kept.items() if (trial_dir.parent / name / "checkpoints").exists()}
        mine = [float(v) for v in values if v is not None]
        if any(_dominates(v, mine, modes) for name, v in kept.items() if name != trial_dir.name):
            shutil.rmtree(checkpoints, ignore_errors=True)
            return False
        for name in [n for n, v in kept.items() if n != trial_dir.name and _dominates(mine, v, modes)]:
            shutil.rmtree(trial_dir.parent / name / "checkpoints", ignore_errors=True)
            del kept[name]
        kept[trial_dir.name] = mine
        tmp = record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(kept, indent=1))
        tmp.replace(record_path)
    return True
