"""Every verl key klsweep writes into a trial's command, and what becomes of a value the sweep sets for it.

The sweep's value is merged with klsweep's, kept, or refused before anything starts. A refusal names the sweep field
or option that controls the key. None is replaced without a word.

===============================  ==========================================  =========================================
key                              klsweep writes                              a value in the sweep's overrides
===============================  ==========================================  =========================================
``trainer.logger``               ``[console, file]`` (every trainer)         merged: added after console and file;
                                                                             ``wandb`` refused (sweep field ``wandb``)
``trainer.total_training_steps`` ``budget.max_steps``                        refused: ``budget.max_steps``
``data.seed``                    ``seed``                                    refused: ``seed``
``trainer.project_name``         ``wandb.project``, else ``name``            refused: ``wandb.project``
``trainer.experiment_name``      the trial directory's name (verl)           refused: one name per trial
``trainer.default_local_dir``    ``<trial dir>/checkpoints`` (verl)          refused: ``--out``
``hydra.run.dir``                ``<trial dir>/attempt-N/hydra`` (verl)      refused: ``--out``
``ray_kwargs.ray_init.address``  ``local`` (verl)                            kept if ``local``, else refused
``trainer.resume_mode``          nothing: verl's ``auto`` (verl)             kept if ``auto``, else refused
``trainer.save_freq``            validation cadence, else a fifth (verl)     kept (a warning when it is <= 0)
``trainer.max_*_ckpt_to_keep``   1 (verl)                                    kept
``algorithm.kl_ctrl.kl_coef``    on a resumed attempt, the coefficient       kept as the first attempt's value
                                 the controller had at the checkpoint
===============================  ==========================================  =========================================

The algorithm's own keys (``algorithm.adv_estimator``, ``use_kl_loss``, ``use_kl_in_reward``) are refused in
``overrides`` by :mod:`klsweep.spec.key_checks` with the fields ``algorithm`` and ``kl_placement``, with
``trainer.total_training_steps`` and ``data.seed``. Writers: :func:`klsweep.spec.space.launcher_overrides` (every
trainer), :func:`klsweep.launchers.process.trial_command` and :mod:`klsweep.launchers.resume` (``trainer: verl``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Keys klsweep sets for every trial of the sweep, whatever the sweep's overrides say: key → (why, the fix).
REFUSED: dict[str, tuple[str, str]] = {
    "trainer.project_name": (
        "klsweep names verl's project (and the W&B project of the sweep's trials) from the sweep field wandb.project, "
        "else the sweep's name",
        "set `wandb: {project: VALUE}` (it names the project with W&B off too) and remove this override",
    ),
}
#: Keys klsweep sets for every ``trainer: verl`` trial: key → (why, the fix).
REFUSED_VERL: dict[str, tuple[str, str]] = {
    "trainer.experiment_name": (
        "every trial gets its own experiment name, its trial directory's (two trials of one name would share verl's "
        "logs, and W&B and tensorboard runs)",
        "remove it; the sweep's `name` names the sweep",
    ),
    "trainer.default_local_dir": (
        "each trial checkpoints into its own directory under the sweep's results directory "
        "(<out>/tune/<trial>/checkpoints), where a retried or resumed trial finds its own checkpoint "
        "(trainer.resume_mode=auto) and never another trial's",
        "remove it; choose where the results go with `sweep run --out DIR`",
    ),
    "hydra.run.dir": (
        "each start of a trial writes Hydra's files into its own attempt directory under the sweep's results "
        "directory",
        "remove it; choose where the results go with `sweep run --out DIR`",
    ),
}
#: verl keys a ``trainer: verl`` sweep may set only to the value klsweep needs: key → (value, why).
ONLY_VERL: dict[str, tuple[Any, str]] = {
    "ray_kwargs.ray_init.address": (
        "local",
        "each trial's verl starts its own Ray; on the sweep's cluster its placement groups would wait for the "
        "resources the trial itself holds, forever (ray#25239)",
    ),
    "trainer.resume_mode": (
        "auto",
        "a retried or resumed trial continues from its own last checkpoint in trainer.default_local_dir",
    ),
}


def managed_key_problems(overrides: Mapping[str, Any], searched: Mapping[str, str] | None = None, *,
                         runs_verl: bool, launcher_keys: bool = True) -> list[tuple[str, str]]:
    """The sweep's values for keys klsweep writes itself, where klsweep would replace them.

    Args:
        overrides: verl keys (a ``+``/``++`` prefix allowed) → values: the sweep's fixed ``overrides``, or a whole
            trial config (:func:`klsweep.verl.preflight.preflight`, with ``launcher_keys=False``: there
            ``trainer.project_name`` is klsweep's own).
        searched: the verl key of each parameter → the parameter's name in the sweep file.
        runs_verl: the sweep's trainer runs verl's own ``main_ppo`` (``TrainerKind.runs_verl``): the keys of
            :data:`REFUSED_VERL` and :data:`ONLY_VERL` are checked too.
        launcher_keys: also check the keys of :data:`REFUSED`, which klsweep writes into every trial config.

    Returns:
        ``[(key or parameter name, message)]``; each message names the key, the value, why klsweep sets it and the
        fix.
    """
    refused = (REFUSED if launcher_keys else {}) | (REFUSED_VERL if runs_verl else {})
    only = ONLY_VERL if runs_verl else {}
    entries = [(k, k, repr(v), v) for k, v in overrides.items()]
    entries += [(name, key, "searched", None) for key, name in (searched or {}).items()]
    problems: list[tuple[str, str]] = []
    for where, raw, shown, value in entries:
        key = raw.lstrip("+")
        if key in refused:
            why, fix = refused[key]
            problems.append((where, f"{key} ({shown}) is set by klsweep: {why}. Fix: {fix}"))
        elif key in only and (shown == "searched" or value != only[key][0]):
            needed, why = only[key]
            problems.append((where, f"{key} ({shown}) must be {needed!r} for trainer verl: {why}. "
                                    f"Fix: remove it (klsweep sets {needed!r})"))
    return problems


def checkpoint_cadence_warnings(overrides: Mapping[str, Any], *, runs_verl: bool) -> list[tuple[str, str]]:
    """A ``trainer: verl`` sweep whose trials never checkpoint: ``trainer.save_freq`` <= 0 in ``overrides`` (verl's
    ``-1``). A trial retried after an NCCL error or a kill, or continued by ``sweep resume``, then starts again at
    step 1 (:mod:`klsweep.launchers.resume`). Without the override, klsweep chooses a cadence itself.

    Returns:
        ``[("trainer.save_freq", message)]`` or ``[]``.
    """
    value = overrides.get("trainer.save_freq")
    if not runs_verl or value is None or not isinstance(value, (int, float)) or value > 0:
        return []
    return [("trainer.save_freq",
             f"trainer.save_freq ({value!r}) saves no checkpoint: a trial retried after an NCCL error or a kill, or "
             "continued by `sweep resume`, starts again at step 1 and spends its GPU time twice. Fix: remove it "
             "(klsweep checkpoints at the validation cadence, trainer.test_freq, else every fifth of the run) or "
             "set it > 0")]
