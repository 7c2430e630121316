"""Turn a flat verl override dict into the embedded trainer's settings.

The overrides are composed with verl 0.9.1's own ``ppo_trainer`` config (:func:`klsweep.verl.config.compose`) and
checked with :func:`klsweep.verl.preflight.type_problems` (each value of the type of verl's default) and
:func:`klsweep.verl.config.check_values`. The trainer thus accepts exactly verl's keys and values.
Every setting not overridden takes verl's default, except the few in :data:`EMBEDDED_DEFAULTS`, where verl's
defaults assume a 7B model on GPUs. Those are applied *below* the user's overrides:

================================================  ===========  ==========  ==========================================
key                                               verl         embedded    why
================================================  ===========  ==========  ==========================================
``data.train_batch_size``                         1024         16          prompts per step; tiny model, 1 CPU core
``data.max_response_length``                      512          8           answers are 2-4 tokens; room to over-write
``data.seed``                                     null         1           null = unseeded in verl; here seed = run
``actor_rollout_ref.rollout.n``                   1            8           samples per prompt (GRPO groups; all algos)
``actor_rollout_ref.actor.optim.lr``              1e-6         3e-4        a 100k-parameter model, not 7B
``actor_rollout_ref.actor.ppo_mini_batch_size``   256          (batch)     = ``data.train_batch_size``: one update
``critic.optim.lr``                               1e-5         1e-3        the critic must fit within a few steps
``trainer.total_training_steps``                  null         100         verl derives it from epochs of a dataset
``trainer.test_freq``                             -1           10          validation every 10 steps and at the end
================================================  ===========  ==========  ==========================================

Seeding: ``data.seed`` seeds everything random in a run (prompt sampling, response sampling); the reference policy
does not depend on it. Same overrides ⇒ same metrics on CPU.

Keys that only concern GPUs, parallelism, paths, logging or features the embedded trainer does not model are
accepted and listed in one log line (:func:`ignored_keys`). The keys the trainer reads are :data:`HONOURED_KEYS`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from klsweep.errors import OverrideError
from klsweep.verl.config import check_values, compose
from klsweep.verl.preflight import type_problems

logger = logging.getLogger(__name__)

ACTOR = "actor_rollout_ref.actor"

TASK_NAME = "arith"
"""The embedded task's name, verl's ``data_source``: the middle of the validation metric."""
VAL_METRIC = f"val-core/{TASK_NAME}/acc/mean@1"
"""The validation metric: greedy gold accuracy on held-out prompts (fraction), verl's ``val-core`` naming."""
MAX_RESPONSE_LENGTH = 26
"""Longest ``data.max_response_length`` the model's position embedding covers (prompt 6 + 26 = 32 positions)."""

EMBEDDED_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 16,
    "data.max_response_length": 8,
    "data.seed": 1,
    "actor_rollout_ref.rollout.n": 8,
    f"{ACTOR}.optim.lr": 3e-4,
    "critic.optim.lr": 1e-3,
    "trainer.total_training_steps": 100,
    "trainer.test_freq": 10,
}
"""Defaults that replace verl's for the tiny CPU task (see the module docstring); user overrides win."""

EMBEDDED_SIZES: frozenset[str] = frozenset(EMBEDDED_DEFAULTS) | {
    f"{ACTOR}.ppo_mini_batch_size", "critic.ppo_mini_batch_size", "data.max_prompt_length",
}
"""Keys whose embedded values are sized for the tiny CPU task: left out of the verl command of an embedded trial."""

HONOURED_KEYS: frozenset[str] = frozenset(
    {
        "algorithm.adv_estimator",
        "algorithm.gamma",
        "algorithm.lam",
        "algorithm.norm_adv_by_std_in_grpo",
        "algorithm.use_kl_in_reward",
        "algorithm.kl_penalty",
        "algorithm.kl_ctrl.type",
        "algorithm.kl_ctrl.kl_coef",
        "algorithm.kl_ctrl.target_kl",
        "algorithm.kl_ctrl.horizon",
        f"{ACTOR}.use_kl_loss",
        f"{ACTOR}.kl_loss_coef",
        f"{ACTOR}.kl_loss_type",
        f"{ACTOR}.loss_agg_mode",
        f"{ACTOR}.loss_scale_factor",
        f"{ACTOR}.entropy_coeff",
        f"{ACTOR}.clip_ratio",
        f"{ACTOR}.clip_ratio_low",
        f"{ACTOR}.clip_ratio_high",
        f"{ACTOR}.clip_ratio_c",
        f"{ACTOR}.ppo_epochs",
        f"{ACTOR}.ppo_mini_batch_size",
        f"{ACTOR}.grad_clip",
        f"{ACTOR}.optim.lr",
        f"{ACTOR}.optim.weight_decay",
        f"{ACTOR}.optim.betas",
        f"{ACTOR}.policy_loss.loss_mode",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.temperature",
        "critic.optim.lr",
        "critic.optim.weight_decay",
        "critic.optim.betas",
        "critic.grad_clip",
        "critic.cliprange_value",
        "critic.ppo_epochs",
        "critic.loss_agg_mode",
        "critic.loss_scale_factor",
        "data.train_batch_size",
        "data.max_response_length",
        "data.seed",
        "trainer.total_training_steps",
        "trainer.test_freq",
        "trainer.val_before_train",
        "trainer.critic_warmup",
    }
)
"""verl keys whose values the embedded trainer uses; any other valid key is accepted and ignored."""

SUPPORTED_ESTIMATORS = ("gae", "grpo")


@dataclass(frozen=True)
class Settings:
    """The values the embedded trainer reads, from the composed verl config (units in comments).

    ``actor`` is verl's own ``ActorConfig`` dataclass (clip ratios, loss_agg_mode, KL loss, entropy_coeff), passed
    as is to ``core_algos.get_policy_loss_fn("vanilla")``; ``kl_ctrl`` is verl's ``algorithm.kl_ctrl`` node, passed
    as is to ``core_algos.get_kl_controller``.
    """

    actor: Any
    kl_ctrl: Any
    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    actor_lr: float
    actor_weight_decay: float
    actor_betas: tuple[float, float]
    actor_grad_clip: float
    critic_lr: float
    critic_weight_decay: float
    critic_betas: tuple[float, float]
    critic_grad_clip: float
    critic_cliprange_value: float
    critic_ppo_epochs: int
    critic_loss_agg_mode: str
    critic_loss_scale_factor: float | None
    rollout_n: int  # sequences per prompt
    temperature: float
    train_batch_size: int  # prompts per step
    ppo_mini_batch_size: int  # prompts per actor/critic update
    max_response_length: int  # tokens
    seed: int
    total_training_steps: int
    test_freq: int  # steps; validation at multiples and at the last step; <= 0: never (as verl)
    val_before_train: bool
    critic_warmup: int  # the actor is updated from this step on (verl: skipped while critic_warmup > step)

    @property
    def use_critic(self) -> bool:
        return self.adv_estimator == "gae"

    @property
    def use_reference(self) -> bool:
        """verl builds the reference policy only when a KL mechanism is on."""
        return self.use_kl_in_reward or bool(self.actor.use_kl_loss)


def with_embedded_defaults(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``EMBEDDED_DEFAULTS`` with the user's overrides on top, plus the mini-batch default (= train batch)."""
    merged = {**EMBEDDED_DEFAULTS, **overrides}
    merged.setdefault(f"{ACTOR}.ppo_mini_batch_size", merged["data.train_batch_size"])
    return merged


#: verl's checkpoint keys: the process mode saves and resumes with them (``klsweep.trainers.embedded.__main__``), a
#: Tune trial's trainable saves at ``trainer.save_freq`` and restores itself.
CHECKPOINT_KEYS = frozenset({"trainer.save_freq", "trainer.default_local_dir", "trainer.resume_mode",
                             "trainer.resume_from_path"})


def ignored_keys(overrides: Mapping[str, Any]) -> list[str]:
    """The user's override keys the embedded trainer accepts but does not use (GPU, parallelism, paths, ...)."""
    return sorted(k.lstrip("+") for k in overrides if k.lstrip("+") not in HONOURED_KEYS | CHECKPOINT_KEYS)


def settings_from_overrides(overrides: Mapping[str, Any], *, allow_negative_kl: bool = False) -> Settings:
    """Validate ``overrides`` against verl's config and read the embedded trainer's settings.

    Raises:
        OverrideError: unknown key (with the closest valid key), a value of another type than verl's default, a
            value verl rejects (with the valid values), or a value the embedded trainer cannot run (with the reason
            and the fix).
    """
    cfg = compose(with_embedded_defaults(overrides))
    mistyped = [message for _, message in type_problems(cfg, overrides)]
    if mistyped:
        raise OverrideError("; ".join(mistyped), mistyped)
    check_values(cfg, allow_negative_kl=allow_negative_kl)
    settings = _read(cfg)
    _check_runnable(settings, cfg)
    skipped = ignored_keys(overrides)
    if skipped:
        logger.info(
            "embedded trainer: accepted but not used (GPU, parallelism, paths, logging): %s", ", ".join(skipped)
        )
    return settings


def _read(cfg) -> Settings:
    from verl.workers.config import ActorConfig  # verl imports torch: only when a trainer is built

    a = cfg.actor_rollout_ref.actor
    algo, critic, data, trainer = cfg.algorithm, cfg.critic, cfg.data, cfg.trainer
    n = as_int(cfg.actor_rollout_ref.rollout.n, "actor_rollout_ref.rollout.n")
    mini_batch = as_int(a.ppo_mini_batch_size, f"{ACTOR}.ppo_mini_batch_size")
    actor = ActorConfig(
        strategy="fsdp",  # required field; the embedded trainer runs one process, no sharding
        ppo_mini_batch_size=mini_batch,
        ppo_micro_batch_size_per_gpu=mini_batch * n,  # no gradient accumulation
        rollout_n=n,
        clip_ratio=as_float(a.clip_ratio, f"{ACTOR}.clip_ratio"),
        clip_ratio_low=_optional_float(a.clip_ratio_low, f"{ACTOR}.clip_ratio_low"),
        clip_ratio_high=_optional_float(a.clip_ratio_high, f"{ACTOR}.clip_ratio_high"),
        clip_ratio_c=as_float(a.clip_ratio_c, f"{ACTOR}.clip_ratio_c"),
        loss_agg_mode=str(a.loss_agg_mode),
        loss_scale_factor=a.loss_scale_factor,
        entropy_coeff=as_float(a.entropy_coeff, f"{ACTOR}.entropy_coeff"),
        use_kl_loss=bool(a.use_kl_loss),
        kl_loss_coef=as_float(a.kl_loss_coef, f"{ACTOR}.kl_loss_coef"),
        kl_loss_type=str(a.kl_loss_type),
        ppo_epochs=as_int(a.ppo_epochs, f"{ACTOR}.ppo_epochs"),
    )
    return Settings(
        actor=actor,
        kl_ctrl=algo.kl_ctrl,
        adv_estimator=str(algo.adv_estimator),
        gamma=as_float(algo.gamma, "algorithm.gamma"),
        lam=as_float(algo.lam, "algorithm.lam"),
        norm_adv_by_std_in_grpo=bool(algo.norm_adv_by_std_in_grpo),
        use_kl_in_reward=bool(algo.use_kl_in_reward),
        kl_penalty=str(algo.kl_penalty),
        actor_lr=as_float(a.optim.lr, f"{ACTOR}.optim.lr"),
        actor_weight_decay=as_float(a.optim.weight_decay, f"{ACTOR}.optim.weight_decay"),
        actor_betas=_betas(a.optim.betas, f"{ACTOR}.optim.betas"),
        actor_grad_clip=as_float(a.grad_clip, f"{ACTOR}.grad_clip"),
        critic_lr=as_float(critic.optim.lr, "critic.optim.lr"),
        critic_weight_decay=as_float(critic.optim.weight_decay, "critic.optim.weight_decay"),
        critic_betas=_betas(critic.optim.betas, "critic.optim.betas"),
        critic_grad_clip=as_float(critic.grad_clip, "critic.grad_clip"),
        critic_cliprange_value=as_float(critic.cliprange_value, "critic.cliprange_value"),
        critic_ppo_epochs=as_int(critic.ppo_epochs, "critic.ppo_epochs"),
        critic_loss_agg_mode=str(critic.loss_agg_mode),
        critic_loss_scale_factor=critic.loss_scale_factor,
        rollout_n=n,
        temperature=as_float(cfg.actor_rollout_ref.rollout.temperature, "actor_rollout_ref.rollout.temperature"),
        train_batch_size=as_int(data.train_batch_size, "data.train_batch_size"),
        ppo_mini_batch_size=mini_batch,
        max_response_length=as_int(data.max_response_length, "data.max_response_length"),
        seed=as_int(data.seed, "data.seed"),
        total_training_steps=as_int(trainer.total_training_steps, "trainer.total_training_steps"),
        test_freq=as_int(trainer.test_freq, "trainer.test_freq"),
        val_before_train=bool(trainer.val_before_train),
        critic_warmup=as_int(trainer.critic_warmup, "trainer.critic_warmup"),
    )


def _show(value: Any) -> str:
    """A value as the user wrote it on verl's command line: ``null``, ``true``, ``'abc'``, ``1.5``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _fix(what: str, value: Any, key: str) -> str:
    """``write a number without quotes, e.g. 1``: the fix for a value that is not ``what``."""
    quotes = " without quotes" if isinstance(value, str) else ""
    return f"write {what}{quotes}" + (f", e.g. {EMBEDDED_DEFAULTS[key]}" if key in EMBEDDED_DEFAULTS else "")


def as_int(value: Any, key: str) -> int:
    """``value`` of the override ``key`` as an int: an int, a whole float or a string of one.

    Raises:
        OverrideError: anything else (a word, null, true/false, 1.5, a list), naming the key, the value and what
            the embedded trainer needs.
    """
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                pass
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    if isinstance(number, float) and number.is_integer():
        return int(number)
    raise OverrideError(f"{key}={_show(value)} is not an integer, but the embedded trainer counts with it: "
                        f"{_fix('a whole number', value, key)}")


def as_float(value: Any, key: str) -> float:
    """``value`` of the override ``key`` as a float: an int, a float or a string of one.

    Raises:
        OverrideError: anything else (a word, null, true/false, a list), naming the key, the value and what the
            embedded trainer needs.
    """
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    raise OverrideError(f"{key}={_show(value)} is not a number, but the embedded trainer computes with it: "
                        f"{_fix('a number', value, key)}")


def _optional_float(value: Any, key: str) -> float | None:
    return None if value is None else as_float(value, key)


def _betas(value: Any, key: str) -> tuple[float, float]:
    """``value`` of the override ``key`` as Adam's two betas.

    Raises:
        OverrideError: not a list of two numbers.
    """
    if isinstance(value, str) or not hasattr(value, "__len__") or len(value) != 2:
        raise OverrideError(f"{key}={_show(value)} is not a pair of numbers, but the embedded trainer reads Adam's "
                            f"two betas from it: write a list of two numbers, e.g. [0.9, 0.999]")
    return as_float(value[0], f"{key}[0]"), as_float(value[1], f"{key}[1]")


def _check_runnable(s: Settings, cfg) -> None:
    problems = []
    if s.adv_estimator not in SUPPORTED_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={s.adv_estimator!r} is valid in verl but the embedded trainer implements "
            f"{' and '.join(SUPPORTED_ESTIMATORS)} (DrGRPO = grpo with norm_adv_by_std_in_grpo=False)"
        )
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss_mode != "vanilla":
        problems.append(f"{ACTOR}.policy_loss.loss_mode={loss_mode!r}: the embedded trainer implements 'vanilla' only")
    if not 1 <= s.max_response_length <= MAX_RESPONSE_LENGTH:
        problems.append(
            f"data.max_response_length={s.max_response_length}: the embedded model covers 1 to "
            f"{MAX_RESPONSE_LENGTH} response tokens"
        )
    for key, value in (
        ("data.train_batch_size", s.train_batch_size),
        (f"{ACTOR}.ppo_mini_batch_size", s.ppo_mini_batch_size),
        ("actor_rollout_ref.rollout.n", s.rollout_n),
        ("trainer.total_training_steps", s.total_training_steps),
        (f"{ACTOR}.ppo_epochs", s.actor.ppo_epochs),
    ):
        if value < 1:
            problems.append(f"{key}={value} must be at least 1")
    if s.ppo_mini_batch_size >= 1 and s.train_batch_size % s.ppo_mini_batch_size:
        problems.append(
            f"data.train_batch_size ({s.train_batch_size}) must be divisible by {ACTOR}.ppo_mini_batch_size "
            f"({s.ppo_mini_batch_size}), as in verl"
        )
    if s.temperature <= 0:
        problems.append(f"actor_rollout_ref.rollout.temperature={s.temperature} must be > 0")
    adaptive = s.use_kl_in_reward and s.kl_ctrl.type == "adaptive"
    if adaptive and as_float(s.kl_ctrl.horizon, "algorithm.kl_ctrl.horizon") <= 0:
        problems.append(f"algorithm.kl_ctrl.horizon={s.kl_ctrl.horizon} must be > 0 (verl asserts it)")
    if s.use_kl_in_reward and s.kl_ctrl.type not in ("fixed", "adaptive"):
        problems.append(f"algorithm.kl_ctrl.type={s.kl_ctrl.type!r}: valid values are fixed, adaptive")
    if problems:
        raise OverrideError("; ".join(problems))
