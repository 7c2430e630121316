"""Which verl knobs are live (change training) and which are inert for a given config (verl#644, #2653, #3741).

verl accepts every key in its config whether or not the algorithm reads it. ``algorithm.kl_ctrl.kl_coef`` under
``use_kl_in_reward=False``, or ``kl_loss_coef`` under ``use_kl_loss=False``, are silently unused. A sweep that searches
such a knob spends its budget on noise, so klsweep refuses it before launch and names the live key.

Rules (verl 0.9.1 source: ``trainer/ppo/ray_trainer.py`` apply_kl_penalty / AdaptiveKLController,
``trainer/ppo/core_algos.py`` compute_policy_loss_vanilla, agg_loss, compute_grpo_outcome_advantage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klsweep.verl.presets import ACTOR, USE_KL_IN_REWARD, USE_KL_LOSS

_LOSS_KL_FIX = (
    "the KL loss is off (actor_rollout_ref.actor.use_kl_loss=False). Set kl_placement: loss (or both) to turn it on, "
    "or remove the key"
)
_REWARD_KL_FIX = (
    "the KL penalty in the reward is off (algorithm.use_kl_in_reward=False). Set kl_placement: reward (or both), "
    "or remove the key"
)


def inert_reason(key: str, config: Mapping[str, Any]) -> str | None:
    """Why ``key`` has no effect under ``config`` (a full flat override dict), or None when it is live.

    The text completes "KEY has no effect: ..." and ends with the fix, naming the live key when there is one.
    """
    use_kl_loss = bool(config.get(USE_KL_LOSS))
    use_kl_in_reward = bool(config.get(USE_KL_IN_REWARD))
    estimator = config.get("algorithm.adv_estimator")
    if key in (ACTOR + "kl_loss_coef", ACTOR + "kl_loss_type") and not use_kl_loss:
        live = {ACTOR + "kl_loss_coef": "algorithm.kl_ctrl.kl_coef", ACTOR + "kl_loss_type": "algorithm.kl_penalty"}
        hint = f" (the KL in the reward uses {live[key]})" if use_kl_in_reward else ""
        return _LOSS_KL_FIX + hint
    if key in ("algorithm.kl_ctrl.kl_coef", "algorithm.kl_penalty", "algorithm.kl_ctrl.type") and not use_kl_in_reward:
        live = {"algorithm.kl_ctrl.kl_coef": ACTOR + "kl_loss_coef", "algorithm.kl_penalty": ACTOR + "kl_loss_type"}
        hint = f" (the KL loss uses {live[key]})" if use_kl_loss and key in live else ""
        return _REWARD_KL_FIX + hint
    if key in ("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"):
        if not use_kl_in_reward:
            knob = key.rsplit(".", 1)[1]
            return f"{knob} only drives the adaptive controller of the KL in the reward; " + _REWARD_KL_FIX
        if config.get("algorithm.kl_ctrl.type") != "adaptive":
            return (
                f"{key.rsplit('.', 1)[1]} only drives the adaptive controller of the KL in the reward but "
                f"algorithm.kl_ctrl.type is {config.get('algorithm.kl_ctrl.type')!r}. Set algorithm.kl_ctrl.type: "
                "adaptive (in overrides, or a `when` condition), or remove the key"
            )
    if key in ("algorithm.gamma", "algorithm.lam") and estimator != "gae":
        return f"only the gae advantage estimator uses it, this sweep's is {estimator!r}. Remove the key"
    if key == "algorithm.norm_adv_by_std_in_grpo" and estimator != "grpo":
        return f"only the grpo advantage estimator uses it, this sweep's is {estimator!r}. Remove the key"
    if key.startswith("critic.") and estimator != "gae":
        return f"there is no critic: the advantage estimator is {estimator!r} (only gae trains one). Remove the key"
    if key == ACTOR + "loss_scale_factor" and config.get(ACTOR + "loss_agg_mode") != "seq-mean-token-sum-norm":
        return (
            "only loss_agg_mode seq-mean-token-sum-norm divides by it, this config's is "
            f"{config.get(ACTOR + 'loss_agg_mode')!r}. Remove the key or set that loss_agg_mode"
        )
    if key == ACTOR + "clip_ratio":
        low, high = config.get(ACTOR + "clip_ratio_low"), config.get(ACTOR + "clip_ratio_high")
        if low is not None and high is not None:
            return (
                "verl 0.9.1's vanilla policy loss uses clip_ratio only where clip_ratio_low/clip_ratio_high are null, "
                f"and they are {low} and {high}. Search actor_rollout_ref.actor.clip_ratio_low and clip_ratio_high "
                "instead, or set both to null"
            )
    return None
