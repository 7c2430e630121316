"""verl's metric names, their aliases across verl versions, and the KL settings a metric stream is read with.

Shared by the health rules and the analysis. Sources:

- the installed verl 0.9.1. ``verl/workers/utils/losses.py`` logs ``actor/pg_loss``, ``actor/entropy_loss`` (the
  entropy itself, not a loss term), ``actor/kl_loss`` and ``actor/kl_coef``. ``verl/trainer/ppo/ray_trainer.py``
  logs ``actor/reward_kl_penalty[_coeff]`` and ``actor/entropy``;
- public logs of older verl. Dec 2024: ``critic/kl``, ``critic/kl_coeff``, ``val/test_score/<source>``. Early 2025:
  ``test_score/<source>``.

An alias is resolved per report: the first candidate present in that report wins. One table thus reads every
version's logs, e.g. ``actor/entropy_loss`` in Dec 2024 logs and ``actor/entropy`` today.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Alias → verl metric names it may be logged under, newest name first.
ALIASES: dict[str, tuple[str, ...]] = {
    # policy entropy (nats per token, aggregated with the run's loss_agg_mode)
    "entropy": ("actor/entropy", "actor/entropy_loss"),
    "actor/entropy": ("actor/entropy", "actor/entropy_loss"),
    # reference KL, whichever mechanism is on: KL in the actor loss, KL in the reward (new and old names)
    "ref_kl": ("actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"),
    "actor/reward_kl_penalty": ("actor/reward_kl_penalty", "critic/kl"),
    # KL coefficient: kl_loss_coef (constant) or the in-reward controller's β
    "kl_coef": ("actor/kl_coef", "actor/reward_kl_penalty_coeff", "critic/kl_coeff"),
    "actor/reward_kl_penalty_coeff": ("actor/reward_kl_penalty_coeff", "critic/kl_coeff"),
    # training reward
    "score": ("critic/score/mean",),
}

#: The embedded trainer's training (proxy) score and gold score of the same batch (``trainers/embedded/trainer.py``):
#: fate stopping's ``proxy_gap`` is the first minus the second, read where a trainer logs both.
PROXY_GAP: tuple[str, str] = ("critic/score/mean", "embedded/gold_score/mean")

#: Validation score: the first key (sorted) matching one of these patterns, in order.
VAL_SCORE_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^val-core/.+/mean@\d+$"),
    re.compile(r"^val/test_score/.+$"),
    re.compile(r"^test_score/.+$"),
)
VAL_SCORE = "val_score"

#: Reference KL per mechanism, newest name first.
KL_IN_LOSS_METRICS = ("actor/kl_loss",)
KL_IN_REWARD_METRICS = ("actor/reward_kl_penalty", "critic/kl")
KL_IN_LOSS_COEF_METRICS = ("actor/kl_coef",)
KL_IN_REWARD_COEF_METRICS = ("actor/reward_kl_penalty_coeff", "critic/kl_coeff")

#: Losses whose non-finite value means the update is already broken (actor and critic).
LOSS_METRICS = ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss")
GRAD_NORM_METRICS = ("actor/grad_norm", "critic/grad_norm")
#: Whitened (GAE, REINFORCE++) or group-normalised (GRPO, RLOO) advantages have mean 0, so max == min == 0 means
#: every advantage is 0 and the policy gradient is 0.
ADVANTAGE_METRICS = ("critic/advantages/max", "critic/advantages/min")
SCORE_RANGE_METRICS = ("critic/score/max", "critic/score/min")

#: verl 0.9.1 defaults of the keys that decide how KL is read (checked against verl's composed ``ppo_trainer``
#: config in tests/verl/test_metrics.py). A missing key in a trial's overrides means this value.
KL_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_penalty": "kl",
}

#: Estimators whose per-token value is ≥ 0 by construction (verl ``core_algos.kl_penalty``): a negative batch mean
#: is a bug. ``kl``/``k1`` (log-ratio) may be negative. A trailing ``+`` keeps the base estimator's forward value.
NONNEGATIVE_ESTIMATORS = frozenset({"abs", "mse", "k2", "low_var_kl", "k3"})
#: ``low_var_kl``/``k3`` clamp each token's value to [-10, 10] (verl ``core_algos.kl_penalty``).
CLAMPED_ESTIMATORS = frozenset({"low_var_kl", "k3"})
K3_CLAMP = 10.0


def resolve(metrics: Mapping[str, Any], name: str) -> str | None:
    """The key under which ``name`` (a verl metric name or an alias) is logged in ``metrics``, or None."""
    if name == VAL_SCORE:
        for pattern in VAL_SCORE_PATTERNS:
            hits = sorted(k for k in metrics if pattern.match(k))
            if hits:
                return hits[0]
        return None
    for candidate in ALIASES.get(name, (name,)):
        if candidate in metrics:
            return candidate
    return None


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


@dataclass(frozen=True)
class KlSetup:
    """How KL enters a run, from its flat verl overrides (missing keys: verl 0.9.1 defaults, :data:`KL_DEFAULTS`).

    ``known`` is False when no overrides were given (a log backtest): mechanism, estimator and coefficients are
    then unknown (None) unless the metrics show them.

    Attributes:
        known: whether the run's configuration was given.
        kl_in_loss / kl_in_reward: the two KL mechanisms (``actor.use_kl_loss``, ``algorithm.use_kl_in_reward``).
        loss_estimator / reward_estimator: ``actor.kl_loss_type`` / ``algorithm.kl_penalty``.
        kl_loss_coef / reward_kl_coef: ``actor.kl_loss_coef`` / ``algorithm.kl_ctrl.kl_coef`` (initial β).
        entropy_coeff: ``actor.entropy_coeff``.
    """

    known: bool
    kl_in_loss: bool | None = None
    kl_in_reward: bool | None = None
    loss_estimator: str | None = None
    reward_estimator: str | None = None
    kl_loss_coef: float | None = None
    reward_kl_coef: float | None = None
    entropy_coeff: float | None = None

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None) -> KlSetup:
        """Read the KL settings from a flat verl override dict; None or {} gives an unknown setup."""
        if not overrides:
            return cls(known=False)

        def get(key: str) -> Any:
            return overrides.get(key, KL_DEFAULTS[key])

        def number(key: str) -> float | None:
            try:
                return float(get(key))
            except (TypeError, ValueError):
                return None

        return cls(
            known=True,
            kl_in_loss=_truthy(get("actor_rollout_ref.actor.use_kl_loss")),
            kl_in_reward=_truthy(get("algorithm.use_kl_in_reward")),
            loss_estimator=str(get("actor_rollout_ref.actor.kl_loss_type")),
            reward_estimator=str(get("algorithm.kl_penalty")),
            kl_loss_coef=number("actor_rollout_ref.actor.kl_loss_coef"),
            reward_kl_coef=number("algorithm.kl_ctrl.kl_coef"),
            entropy_coeff=number("actor_rollout_ref.actor.entropy_coeff"),
        )

    @property
    def kl_off(self) -> bool:
        """True only when the configuration says neither KL mechanism is on."""
        return self.known and not self.kl_in_loss and not self.kl_in_reward


def base_estimator(name: str | None) -> str | None:
    """``"k3+"`` → ``"k3"``: the straight-through variant has the base estimator's forward value."""
    return None if name is None else name.rstrip("+")


def flat_verl_config(config: Any) -> dict[str, Any]:
    """The dotted verl keys of a Tune trial config (``{"actor_rollout_ref.actor.kl_loss_coef": 0.01, ...}``).

    Nested dicts (Optuna names with ``/`` become nested config dicts) are flattened with dots; keys without a dot
    at the end are not verl keys and are dropped.
    """
    out: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                walk(value, f"{name}.")
            elif "." in name:
                out[name] = value

    if isinstance(config, Mapping):
        walk(config, "")
    return out
