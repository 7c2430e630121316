"""Algorithm presets (ppo, grpo, drgrpo) as verl 0.9.1's exact overrides, and the sweep-file aliases.

A preset is the flat override dict every trial of that algorithm starts from. It names every algorithm-relevant
knob (:data:`KNOBS`) explicitly. Where the preset does not set a knob, verl's own default is read from the installed
``ppo_trainer`` config. Two trials thus differ only where the sweep says they differ (verl#781, #5953: hidden
defaults).

Source of the algorithm definitions: verl docs ``algo/grpo`` and ``algo/ppo``; DrGRPO = Liu et al. 2025,
"Understanding R1-Zero-Like Training", as verl implements it (``norm_adv_by_std_in_grpo=False`` +
``loss_agg_mode=seq-mean-token-sum-norm``, no KL).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, cast

ACTOR = "actor_rollout_ref.actor."

#: Keys of the KL switches; they follow ``kl_placement`` and are never searched.
USE_KL_LOSS = ACTOR + "use_kl_loss"
USE_KL_IN_REWARD = "algorithm.use_kl_in_reward"

#: Every knob that changes what the RL algorithm computes; each trial's overrides name all of them.
KNOBS: tuple[str, ...] = (
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.gamma",
    "algorithm.lam",
    USE_KL_IN_REWARD,
    "algorithm.kl_penalty",
    "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.kl_coef",
    "algorithm.kl_ctrl.target_kl",
    "algorithm.kl_ctrl.horizon",
    USE_KL_LOSS,
    ACTOR + "kl_loss_coef",
    ACTOR + "kl_loss_type",
    ACTOR + "entropy_coeff",
    ACTOR + "clip_ratio",
    ACTOR + "clip_ratio_low",
    ACTOR + "clip_ratio_high",
    ACTOR + "clip_ratio_c",
    ACTOR + "loss_agg_mode",
    ACTOR + "loss_scale_factor",
    ACTOR + "ppo_epochs",
    ACTOR + "ppo_mini_batch_size",
    ACTOR + "optim.lr",
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
)

#: Knobs of the critic, emitted only for gae (ppo): without a critic they are unused.
CRITIC_KNOBS: tuple[str, ...] = (
    "critic.optim.lr", "critic.ppo_epochs", "critic.ppo_mini_batch_size", "critic.cliprange_value",
)

#: What each preset sets on top of verl's defaults, before ``kl_placement`` sets the two KL switches.
PRESETS: dict[str, dict[str, Any]] = {
    "ppo": {"algorithm.adv_estimator": "gae"},
    "grpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": True,
        "actor_rollout_ref.rollout.n": 5,
    },
    "drgrpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "actor_rollout_ref.rollout.n": 5,
        ACTOR + "loss_agg_mode": "seq-mean-token-sum-norm",
    },
}

#: Where the KL to the reference acts, per algorithm, when the sweep file does not say.
DEFAULT_PLACEMENT = {"ppo": "reward", "grpo": "loss", "drgrpo": "none"}

#: kl_placement → (use_kl_loss, use_kl_in_reward)
PLACEMENTS = {"loss": (True, False), "reward": (False, True), "none": (False, False), "both": (True, True)}

#: Sweep-file aliases → the verl key that is live for each kl_placement. A placement missing from the inner dict
#: means the alias has no live key there (error); a plain string means one key whatever the placement.
ALIASES: dict[str, str | dict[str, str]] = {
    "kl_coef": {"loss": ACTOR + "kl_loss_coef", "reward": "algorithm.kl_ctrl.kl_coef"},
    "kl_loss_type": {"loss": ACTOR + "kl_loss_type", "reward": "algorithm.kl_penalty"},
    "target_kl": "algorithm.kl_ctrl.target_kl",
    "horizon": "algorithm.kl_ctrl.horizon",
    "loss_agg_mode": ACTOR + "loss_agg_mode",
    "entropy_coeff": ACTOR + "entropy_coeff",
}


def resolve_key(key: str, placement: str) -> str:
    """The verl key a parameter/`when` key names: aliases resolved for ``placement``, verl keys unchanged.

    Raises:
        ValueError: the alias has no single live key under this placement (message names the fix).
    """
    target = ALIASES.get(key)
    if target is None:
        return key
    if isinstance(target, str):
        return target
    if placement in target:
        return target[placement]
    if placement == "both":
        return_keys = " or ".join(target.values())
        raise ValueError(
            f"alias {key!r} is ambiguous with kl_placement both (KL in the loss and in the reward): "
            f"use the full key, {return_keys}"
        )
    raise ValueError(
        f"alias {key!r} has no effect with kl_placement {placement} (no KL to the reference): "
        f"set kl_placement: loss or reward, or remove {key!r}"
    )


@functools.lru_cache(maxsize=1)
def _raw_defaults() -> dict[str, Any]:
    """verl's ``ppo_trainer`` defaults for :data:`KNOBS` and :data:`CRITIC_KNOBS`, interpolations unresolved."""
    from omegaconf import OmegaConf

    from klsweep.verl.config import compose

    cfg = compose({})
    out = {}
    for key in (*KNOBS, *CRITIC_KNOBS):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent)  # a DictConfig: its container is a dict
        out[key] = cast(dict[str, Any], OmegaConf.to_container(node, resolve=False))[leaf]
    return out


_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?([A-Za-z0-9_.]+)(?:,[^}]*)?\}$")


def verl_default(key: str, values: Mapping[str, Any]) -> Any:
    """verl's default for ``key``; an interpolation such as ``${oc.select:actor_rollout_ref.actor.ppo_epochs,1}``
    takes the value ``values`` (or verl's default) gives the key it points to, as verl would resolve it."""
    raw = _raw_defaults()[key]
    match = _INTERPOLATION.match(raw) if isinstance(raw, str) else None
    if match:
        target = match.group(1)
        return values[target] if target in values else verl_default(target, values)
    return raw


def preset_overrides(algorithm: str, placement: str, *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The full override dict of an algorithm preset: every :data:`KNOBS` key (plus the critic's for gae).

    Precedence per knob: ``base`` (the trainer's own defaults and the sweep's values) over the preset over verl's
    default; the two KL switches always follow ``placement``. DrGRPO's ``loss_scale_factor`` defaults to
    ``data.max_response_length`` (a constant divisor, so the loss scale does not move with the batch's lengths).

    Args:
        algorithm: ``ppo`` | ``grpo`` | ``drgrpo``.
        placement: ``loss`` | ``reward`` | ``none`` | ``both``: sets ``actor.use_kl_loss`` and
            ``algorithm.use_kl_in_reward`` (:data:`PLACEMENTS`).
        base: values that win over the preset and verl's defaults; interpolated defaults follow them.

    Returns:
        dict in :data:`KNOBS` order (then :data:`CRITIC_KNOBS` for gae); values are verl-typed Python scalars.
    """
    base = dict(base or {})
    use_kl_loss, use_kl_in_reward = PLACEMENTS[placement]
    preset = PRESETS[algorithm]
    estimator = base.get("algorithm.adv_estimator", preset["algorithm.adv_estimator"])
    out: dict[str, Any] = {}
    for key in KNOBS + (CRITIC_KNOBS if estimator == "gae" else ()):
        if key in base:
            out[key] = base[key]
        elif key in preset:
            out[key] = preset[key]
        else:
            out[key] = verl_default(key, {**out, **base})
    out[USE_KL_LOSS], out[USE_KL_IN_REWARD] = use_kl_loss, use_kl_in_reward
    if algorithm == "drgrpo" and out[ACTOR + "loss_scale_factor"] is None:
        out[ACTOR + "loss_scale_factor"] = out["data.max_response_length"]
    return out
