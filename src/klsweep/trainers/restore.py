"""The knobs a remedy may change that an in-process trainer's checkpoint also holds, and putting them back.

verl rebuilds its KL controller from the config at every start (``RayPPOTrainer.__init__``). The embedded trainer's
``load`` restores the controller and the AdamW learning rate from its checkpoint instead. After a load,
:func:`reapply_after_load` sets them to the trial's overrides again, so a remedied value is not undone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: verl's initial in-reward KL coefficient (``core_algos.get_kl_controller`` reads it at every start).
KL_COEF_KEY = "algorithm.kl_ctrl.kl_coef"
#: verl's actor learning rate.
ACTOR_LR_KEY = "actor_rollout_ref.actor.optim.lr"


def reapply_after_load(trainer: Any, overrides: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Set the trainer's KL coefficient and actor learning rate back to ``overrides`` after a checkpoint load.

    Only the keys in ``keys`` (:data:`KL_COEF_KEY`, :data:`ACTOR_LR_KEY`) are set; others are ignored.
    A trainer without ``kl_ctrl`` or ``actor_optimizer`` is left alone for that knob.
    """
    keys = set(keys)
    kl_ctrl = getattr(trainer, "kl_ctrl", None)
    if KL_COEF_KEY in keys and kl_ctrl is not None:
        kl_ctrl.value = float(overrides[KL_COEF_KEY])
    optimizer = getattr(trainer, "actor_optimizer", None)
    if ACTOR_LR_KEY in keys and optimizer is not None:
        for group in optimizer.param_groups:
            group["lr"] = float(overrides[ACTOR_LR_KEY])
