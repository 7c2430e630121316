"""Which KL coefficient and learning rate a trial runs with after it loads a checkpoint: one rule for every trainer.

A trial starts again from its checkpoint of step N on a Ray Tune retry, a ``sweep resume``, an in-trial retry, or a
health rule's remedy that restarts it from there with knobs changed (:mod:`klsweep.orchestrate.remedy`). The rule
(:func:`knobs_after_load`): it continues with the values the run had at step N (carried), except the knobs of the
remedies that restart the trial from exactly step N, which take their remedied values (the trial's overrides).

Where the carried values come from differs by trainer. verl rebuilds its in-reward KL controller from
``algorithm.kl_ctrl.kl_coef`` at every start (``RayPPOTrainer.__init__`` in verl/trainer/ppo/ray_trainer.py,
``core_algos.get_kl_controller``), so the verl launcher reads the coefficient from the trial's logs and passes it as
that key (:func:`klsweep.launchers.resume.resume_overrides`). The embedded trainer's ``load`` restores the controller
and the AdamW learning rate from its checkpoint, so what it holds after a load is carried, and
:func:`restore_knobs` sets only what the rule changes (:func:`reapply_after_load`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klsweep.results import Restart

#: verl's initial in-reward KL coefficient (``core_algos.get_kl_controller`` reads it at every start).
KL_COEF_KEY = "algorithm.kl_ctrl.kl_coef"
#: verl's actor learning rate.
ACTOR_LR_KEY = "actor_rollout_ref.actor.optim.lr"
#: The knobs :func:`knobs_after_load` decides: those a trainer's state after a load may hold a value of.
RESTORED_KEYS = (KL_COEF_KEY, ACTOR_LR_KEY)


def restarting_from(step: int, remedies: Sequence[Restart]) -> list[Restart]:
    """The remedies that restart the trial from its checkpoint of ``step`` and still lead to its current run.

    Those with ``from_step == step``, oldest first, less those a later remedy abandoned by restarting from an
    earlier step (the trial's checkpoint of ``step`` is then one its later run saved, after the restart).

    Args:
        step: the training step of the checkpoint loaded.
        remedies: the trial's restarts, oldest first (:func:`klsweep.results.restarts`).
    """
    current: list[Restart] = []
    for restart in sorted(remedies, key=lambda r: r.number):
        if restart.from_step < step:
            current = []
        elif restart.from_step == step:
            current.append(restart)
    return current


def knobs_after_load(step: int, carried: Mapping[str, Any], overrides: Mapping[str, Any],
                     remedies: Sequence[Restart]) -> dict[str, Any]:
    """The values of :data:`RESTORED_KEYS` a trial runs with after loading its checkpoint of ``step``.

    A key a remedy restarting from ``step`` changed (:func:`restarting_from`) takes its value in ``overrides``
    (the remedied one); every other key takes its value in ``carried`` (what the run had at ``step``). A key
    without a value in the mapping it would come from is left out.

    Args:
        step: the training step of the checkpoint loaded.
        carried: the values the run had at ``step``, by verl key (the checkpoint's, or the coefficient logged).
        overrides: the trial's flat verl overrides, with every remedy's values.
        remedies: the trial's restarts, oldest first (:func:`klsweep.results.restarts`).

    Returns:
        ``{verl key: value}`` for the keys of :data:`RESTORED_KEYS` that have one.
    """
    remedied = {key for restart in restarting_from(step, remedies) for key in restart.changes}
    values = {}
    for key in RESTORED_KEYS:
        source = overrides if key in remedied else carried
        if key in source:
            values[key] = source[key]
    return values


def held_knobs(trainer: Any) -> dict[str, float]:
    """The KL coefficient and actor learning rate ``trainer`` holds now (after a load: its checkpoint's).

    A trainer without ``kl_ctrl`` (no KL in the reward) or ``actor_optimizer`` has no value for that key.
    """
    held = {}
    kl_ctrl = getattr(trainer, "kl_ctrl", None)
    if kl_ctrl is not None:
        held[KL_COEF_KEY] = float(kl_ctrl.value)
    optimizer = getattr(trainer, "actor_optimizer", None)
    if optimizer is not None and optimizer.param_groups:
        held[ACTOR_LR_KEY] = float(optimizer.param_groups[0]["lr"])
    return held


def restore_knobs(trainer: Any, step: int, overrides: Mapping[str, Any], remedies: Sequence[Restart]) -> None:
    """After ``trainer`` loaded its checkpoint of ``step``, set its knobs by :func:`knobs_after_load`.

    The carried values are those the checkpoint restored (:func:`held_knobs`), so only the knobs of the remedies
    restarting from ``step`` change. ``overrides``: the trial's flat verl overrides; ``remedies``: its restarts.
    """
    values = knobs_after_load(step, held_knobs(trainer), overrides, remedies)
    reapply_after_load(trainer, values, values)


def reapply_after_load(trainer: Any, overrides: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Set the trainer's KL coefficient and actor learning rate to ``overrides`` after a checkpoint load.

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
