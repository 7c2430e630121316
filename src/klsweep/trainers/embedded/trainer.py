"""The embedded RL trainer: verl's PPO step (rollout, rewards, KL, advantages, critic and actor updates) on CPU.

One :meth:`EmbeddedTrainer.train_step` follows ``RayPPOTrainer.fit`` in ``verl/trainer/ppo/ray_trainer.py``:

1. rollout: ``data.train_batch_size`` prompts, each sampled ``rollout.n`` times (``rollout.temperature``);
2. score: the task's proxy reward, placed on the last valid response token (verl's reward manager does the same);
3. old log-probs and entropy of the actor (``actor/entropy``), reference log-probs when a KL mechanism is on,
   critic values for ``gae``;
4. KL in the reward (``algorithm.use_kl_in_reward``): :func:`apply_kl_penalty`, verl's function of that name;
5. advantages: ``core_algos.compute_gae_advantage_return`` or ``compute_grpo_outcome_advantage``;
6. critic update (``core_algos.compute_value_loss``), then actor update (:func:`actor_loss`, verl's ``ppo_loss``)
   over ``ppo_epochs`` × mini-batches of ``ppo_mini_batch_size`` prompts;
7. metrics: verl's ``compute_data_metrics`` on the batch, the update metrics (means over mini-batches), greedy
   validation on held-out prompts every ``trainer.test_freq`` steps and at the last step (``VAL_METRIC``),
   ``timing_s/step``; diagnostics verl does not have go under ``embedded/``.

verl is imported lazily (it takes seconds), in the constructor.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klsweep.trainers.embedded import task
from klsweep.trainers.embedded.config import VAL_METRIC, Settings, settings_from_overrides
from klsweep.trainers.embedded.model import TinyTransformer, generate
from klsweep.trainers.embedded.reference import load_reference

CHECKPOINT_FILE = "embedded_trainer.pt"


def actor_loss(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor loss the trainer backpropagates, as ``ppo_loss`` in ``verl/workers/utils/losses.py``.

    ``loss = pg_loss − entropy_coeff·entropy + kl_loss_coef·kl_loss``; the KL term only with ``use_kl_loss``.
    ``pg_loss`` comes from ``core_algos.get_policy_loss_fn("vanilla")``: PPO clip, dual clip ``clip_ratio_c``.
    ``kl_loss`` is ``core_algos.kl_penalty(log_prob, ref_log_prob, config.kl_loss_type)``. Every term is aggregated
    by ``core_algos.agg_loss`` with ``config.loss_agg_mode``. One process, no micro-batches: verl's global batch info
    is this mini-batch (``dp_size`` 1, its token and sequence counts).

    Args:
        log_prob, entropy: ``(batch, response_len)`` from the current actor (``log_prob`` carries the gradient).
        old_log_prob: ``(batch, response_len)`` from the actor that sampled the batch (nats).
        ref_log_prob: ``(batch, response_len)`` from the reference, or None when ``use_kl_loss`` is off.
        advantages: ``(batch, response_len)``.
        response_mask: ``(batch, response_len)``, 1 for response tokens up to and including EOS.
        config: verl's ``ActorConfig`` (see :class:`~klsweep.trainers.embedded.config.Settings`).

    Returns:
        The scalar loss and verl's metrics (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
        ``actor/pg_clipfrac_lower``, and ``actor/kl_loss``, ``actor/kl_coef`` with ``use_kl_loss``).
    """
    from verl.trainer.ppo import core_algos

    mask = response_mask.bool()
    config.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=int(mask.sum()),
        global_batch_size=int(mask.shape[0]),
        loss_scale_factor=config.loss_scale_factor,
    )
    policy_loss_fn = core_algos.get_policy_loss_fn("vanilla")
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
    )
    metrics = {**pg_metrics, "actor/pg_loss": pg_loss.item()}
    entropy_loss = core_algos.agg_loss(
        loss_mat=entropy, loss_mask=mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
    )
    loss = pg_loss - config.entropy_coeff * entropy_loss
    if config.use_kl_loss:
        kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=config.kl_loss_type)
        kl_loss = core_algos.agg_loss(
            loss_mat=kld, loss_mask=mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
        )
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["actor/kl_loss"] = kl_loss.item()
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return loss, metrics


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: Any,
    kl_penalty: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward, line by line ``apply_kl_penalty`` of ``verl/trainer/ppo/ray_trainer.py`` (0.9.1).

    ``token_level_rewards = token_level_scores − β·kl``, with ``kl = core_algos.kl_penalty(old, ref, kl_penalty)``
    per token (masked). β is the controller's value *before* this step's update. The controller is then updated
    with the batch mean of each sequence's token-mean KL, and ``n_steps`` = sequences in the batch. The adaptive
    controller is Ziegler et al. 2019's. verl's own function needs a DataProto and ray_trainer's heavy imports; a
    test checks this one against it.

    Args:
        token_level_scores, old_log_prob, ref_log_prob, response_mask: ``(batch, response_len)``.
        kl_ctrl: a ``core_algos.FixedKLController`` or ``AdaptiveKLController`` (updated in place).

    Returns:
        ``token_level_rewards`` ``(batch, response_len)`` and ``actor/reward_kl_penalty`` (nats per token, batch
        mean), ``actor/reward_kl_penalty_coeff`` (β used at this step).
    """
    from verl.trainer.ppo import core_algos
    from verl.utils.torch_functional import masked_mean

    kld = core_algos.kl_penalty(old_log_prob, ref_log_prob, kl_penalty=kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, mask=response_mask, axis=-1)
    current_kl = torch.mean(current_kl, dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def log_prob_and_entropy(
    model: TinyTransformer, prompts: torch.Tensor, responses: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probability of each response token and the policy entropy there, ``(batch, response_len)``.

    Logits are divided by the rollout temperature first, as verl's actor does. Formulas: log-softmax then gather
    (verl's ``torch_functional.logprobs_from_logits`` without flash-attn, in one call rather than its row loop)
    and verl's ``entropy_from_logits``.
    """
    from verl.utils.torch_functional import entropy_from_logits

    tokens = torch.cat([prompts, responses], dim=1)[:, :-1]
    logits = model(tokens)[:, prompts.shape[1] - 1 :] / temperature
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    return log_prob, entropy_from_logits(logits)


def token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence's score ``(batch,)`` on its last valid response token ``(batch, response_len)``."""
    out = torch.zeros_like(response_mask)
    last = response_mask.sum(dim=1).long() - 1
    out[torch.arange(len(scores)), last] = scores
    return out


class EmbeddedTrainer:
    """verl's PPO/GRPO/DrGRPO training loop on the embedded task, configured by verl override keys.

    Args:
        overrides: flat verl override dict, e.g. ``{"algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.1}``.
        allow_negative_kl: accept negative KL coefficients (refused by default).

    Raises:
        OverrideError: an unknown key or an invalid value, before anything is trained.

    The constructor sets ``torch.set_num_threads(1)`` for the process. The matrices are tiny, and one thread is
    faster than two on them. Concurrent trials each get a core. Results do not depend on the machine's core count.

    Attributes:
        settings: the values read from verl's composed config.
        total_steps: ``trainer.total_training_steps``.
        global_step: steps done (0 before the first ``train_step``; verl numbers steps from 1).
    """

    def __init__(self, overrides: Mapping[str, Any], *, allow_negative_kl: bool = False):
        from verl.trainer.ppo import core_algos

        torch.set_num_threads(1)
        self.core_algos = core_algos
        self.settings: Settings = settings_from_overrides(overrides, allow_negative_kl=allow_negative_kl)
        s = self.settings
        self.total_steps = s.total_training_steps
        self.global_step = 0
        self.generator = torch.Generator().manual_seed(s.seed)

        self.reference = load_reference().requires_grad_(False)
        self.actor = copy.deepcopy(self.reference).requires_grad_(True)
        self.actor_optimizer = torch.optim.AdamW(
            self.actor.parameters(), lr=s.actor_lr, betas=s.actor_betas, weight_decay=s.actor_weight_decay
        )
        self.critic = copy.deepcopy(self.reference).requires_grad_(True) if s.use_critic else None
        self.critic_optimizer = (
            torch.optim.AdamW(
                self.critic.parameters(), lr=s.critic_lr, betas=s.critic_betas, weight_decay=s.critic_weight_decay
            )
            if self.critic is not None
            else None
        )
        self.kl_ctrl = core_algos.get_kl_controller(s.kl_ctrl) if s.use_kl_in_reward else None
        self.validation = task.validation_batch()

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        """Run one training step and return its metrics (verl names; ``embedded/...`` for extras)."""
        start = time.perf_counter()
        self.global_step += 1
        batch, metrics = self.make_experience()
        metrics.update(self.update(batch))
        last = self.global_step >= self.total_steps
        if self.settings.test_freq > 0 and (last or self.global_step % self.settings.test_freq == 0):
            metrics.update(self.validate())
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    def make_experience(self) -> tuple[dict[str, Any], dict[str, float]]:
        """Steps 1-5 of the module docstring: rollout, scores, log-probs, values, KL in reward, advantages.

        Returns:
            The batch, a dict of tensors ``(sequences, ...)`` with ``sequences = train_batch_size * rollout.n``:
            ``prompts`` ``(seq, 6)``, and ``(seq, response_len)``: ``responses``, ``response_mask``,
            ``old_log_prob``, ``ref_log_prob`` (None without a KL mechanism), ``values`` (None without a critic),
            ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns``; plus ``uid``
            ``(seq,)`` (the prompt index, GRPO's groups). And the metrics computed on the way.
        """
        s = self.settings
        metrics: dict[str, float] = {}
        batch = task.sample_train(s.train_batch_size, self.generator).repeat(s.rollout_n)
        uid = np.arange(s.train_batch_size).repeat(s.rollout_n)
        self.actor.eval()
        responses = generate(
            self.actor, batch.prompts, s.max_response_length, task.EOS, task.PAD, s.temperature, self.generator
        )
        mask = task.response_mask(responses)
        token_level_scores = token_level(task.proxy_score(responses, batch), mask)
        metrics["embedded/gold_score/mean"] = task.gold_score(responses, batch).mean().item()

        with torch.no_grad():
            old_log_prob, entropy = log_prob_and_entropy(self.actor, batch.prompts, responses, s.temperature)
            metrics["actor/entropy"] = self.core_algos.agg_loss(
                loss_mat=entropy, loss_mask=mask, loss_agg_mode=s.actor.loss_agg_mode,
                loss_scale_factor=s.actor.loss_scale_factor,
            ).item()
            ref_log_prob = None
            if s.use_reference:
                ref_log_prob, _ = log_prob_and_entropy(self.reference, batch.prompts, responses, s.temperature)
            values = self._values(batch.prompts, responses) if self.critic is not None else None

        token_level_rewards = token_level_scores
        if self.kl_ctrl is not None:
            token_level_rewards, kl_metrics = apply_kl_penalty(
                token_level_scores, old_log_prob, ref_log_prob, mask, self.kl_ctrl, s.kl_penalty
            )
            metrics.update(kl_metrics)

        if s.adv_estimator == "gae":
            advantages, returns = self.core_algos.compute_gae_advantage_return(
                token_level_rewards=token_level_rewards, values=values, response_mask=mask, gamma=s.gamma, lam=s.lam
            )
        else:
            advantages, returns = self.core_algos.compute_grpo_outcome_advantage(
                token_level_rewards=token_level_rewards, response_mask=mask, index=uid,
                norm_adv_by_std_in_grpo=s.norm_adv_by_std_in_grpo,
            )
        experience = dict(
            prompts=batch.prompts, responses=responses, response_mask=mask, old_log_prob=old_log_prob,
            ref_log_prob=ref_log_prob, values=values, token_level_scores=token_level_scores,
            token_level_rewards=token_level_rewards, advantages=advantages, returns=returns, uid=uid,
        )
        metrics.update(self._data_metrics(experience))
        return experience, metrics

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """Step 6: the critic update, then the actor update unless ``trainer.critic_warmup > global_step`` (as verl)."""
        metrics: dict[str, float] = {}
        if self.critic is not None:
            metrics.update(self._update_critic(batch))
        if self.global_step >= self.settings.critic_warmup:
            metrics.update(self._update_actor(batch))
        return metrics

    def validate(self) -> dict[str, float]:
        """Greedy gold accuracy on the held-out prompts (``VAL_METRIC``) and their mean response length."""
        self.actor.eval()
        responses = generate(self.actor, self.validation.prompts, self.settings.max_response_length, task.EOS, task.PAD)
        return {
            VAL_METRIC: task.gold_score(responses, self.validation).mean().item(),
            "embedded/val_response_length/mean": task.response_mask(responses).sum(dim=1).mean().item(),
        }

    # ------------------------------------------------------------------ updates
    def _mini_batches(self, n_sequences: int) -> list[slice]:
        size = self.settings.ppo_mini_batch_size * self.settings.rollout_n
        return [slice(i, i + size) for i in range(0, n_sequences, size)]

    def _update_actor(self, t: dict[str, Any]) -> dict[str, float]:
        s = self.settings
        self.actor.train()
        collected: dict[str, list[float]] = {}
        for _ in range(s.actor.ppo_epochs):
            for mb in self._mini_batches(t["responses"].shape[0]):
                log_prob, entropy = log_prob_and_entropy(
                    self.actor, t["prompts"][mb], t["responses"][mb], s.temperature
                )
                ref = t["ref_log_prob"][mb] if t["ref_log_prob"] is not None else None
                loss, step_metrics = actor_loss(
                    log_prob, entropy, t["old_log_prob"][mb], ref, t["advantages"][mb], t["response_mask"][mb], s.actor
                )
                step_metrics["actor/grad_norm"] = self._optimizer_step(
                    loss, self.actor, self.actor_optimizer, s.actor_grad_clip
                )
                for key, value in step_metrics.items():
                    collected.setdefault(key, []).append(value)
        metrics = {key: float(np.mean(values)) for key, values in collected.items()}
        metrics["actor/lr"] = s.actor_lr
        return metrics

    def _update_critic(self, t: dict[str, Any]) -> dict[str, float]:
        s = self.settings
        self.critic.train()
        collected: dict[str, list[float]] = {}
        for _ in range(s.critic_ppo_epochs):
            for mb in self._mini_batches(t["responses"].shape[0]):
                mask = t["response_mask"][mb]
                vf_loss, vf_clipfrac = self.core_algos.compute_value_loss(
                    vpreds=self._values(t["prompts"][mb], t["responses"][mb]),
                    returns=t["returns"][mb], values=t["values"][mb], response_mask=mask,
                    cliprange_value=s.critic_cliprange_value, loss_agg_mode=s.critic_loss_agg_mode,
                    batch_num_tokens=int(mask.sum()), global_batch_size=int(mask.shape[0]),
                    loss_scale_factor=s.critic_loss_scale_factor,
                )
                grad_norm = self._optimizer_step(vf_loss, self.critic, self.critic_optimizer, s.critic_grad_clip)
                for key, value in (("critic/vf_loss", vf_loss.item()), ("critic/vf_clipfrac", vf_clipfrac.item()),
                                   ("critic/grad_norm", grad_norm)):
                    collected.setdefault(key, []).append(value)
        metrics = {key: float(np.mean(values)) for key, values in collected.items()}
        metrics["critic/lr"] = s.critic_lr
        return metrics

    @staticmethod
    def _optimizer_step(
        loss: torch.Tensor, model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip: float
    ) -> float:
        """Backward, clip the gradient norm, step; skip the step on a non-finite norm (as verl's actor does)."""
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        if torch.isfinite(grad_norm):
            optimizer.step()
        else:
            optimizer.zero_grad()
        return grad_norm.item()

    def _values(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Critic values ``(batch, response_len)``: the value of the state before each response token (as verl)."""
        tokens = torch.cat([prompts, responses], dim=1)[:, :-1]
        return self.critic.values(tokens)[:, prompts.shape[1] - 1 :]

    def _data_metrics(self, t: dict[str, Any]) -> dict[str, float]:
        """verl's ``metric_utils.compute_data_metrics`` (score, rewards, advantages, returns, values, lengths)."""
        from verl import DataProto
        from verl.trainer.ppo.metric_utils import compute_data_metrics

        tensors = {
            "prompts": t["prompts"], "responses": t["responses"], "response_mask": t["response_mask"],
            "attention_mask": torch.cat([torch.ones_like(t["prompts"]), t["response_mask"].long()], dim=1),
            "token_level_scores": t["token_level_scores"], "token_level_rewards": t["token_level_rewards"],
            "advantages": t["advantages"], "returns": t["returns"],
        }
        if t["values"] is not None:
            tensors["values"] = t["values"]
        data = DataProto.from_dict(tensors=tensors)
        return {k: float(v) for k, v in compute_data_metrics(data, use_critic=self.critic is not None).items()}

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str | os.PathLike) -> Path:
        """Write everything needed to continue bit-for-bit to ``directory/embedded_trainer.pt`` (atomic rename)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "global_step": self.global_step,
            "actor": self.actor.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": self.critic_optimizer.state_dict() if self.critic_optimizer is not None else None,
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "generator": self.generator.get_state(),
        }
        path = directory / CHECKPOINT_FILE
        with tempfile.NamedTemporaryFile(dir=directory, prefix=CHECKPOINT_FILE, suffix=".tmp", delete=False) as tmp:
            torch.save(state, tmp)
        os.replace(tmp.name, path)
        return path

    def load(self, directory: str | os.PathLike) -> None:
        """Restore a :meth:`save` of a trainer built with the same overrides."""
        state = torch.load(Path(directory) / CHECKPOINT_FILE, weights_only=False)
        self.global_step = state["global_step"]
        self.actor.load_state_dict(state["actor"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.kl_ctrl is not None:
            self.kl_ctrl.value = state["kl_coef"]
        self.generator.set_state(state["generator"])


def run(
    overrides: Mapping[str, Any],
    report: Callable[[int, dict[str, float]], bool | None] | None = None,
    *,
    trainer: EmbeddedTrainer | None = None,
) -> list[dict[str, float]]:
    """Train to ``trainer.total_training_steps`` (or until ``report`` returns True) and return each step's metrics.

    With ``trainer.val_before_train`` (verl's default) the first entry is step 0's validation, as verl logs it.

    Args:
        overrides: flat verl override dict.
        report: called as ``report(step, metrics)`` after each step; returning True stops the run early.
        trainer: an already built (e.g. restored) trainer to continue; ``overrides`` is then not re-read.

    Returns:
        ``[{"step": N, **metrics}, ...]`` in step order.

    Raises:
        OverrideError: bad overrides, before any training.
    """
    trainer = trainer if trainer is not None else EmbeddedTrainer(overrides)
    history: list[dict[str, float]] = []
    if trainer.global_step == 0 and trainer.settings.val_before_train:
        metrics = trainer.validate()
        history.append({"step": 0, **metrics})
        if report is not None and report(0, metrics):
            return history
    while trainer.global_step < trainer.total_steps:
        metrics = trainer.train_step()
        history.append({"step": trainer.global_step, **metrics})
        if report is not None and report(trainer.global_step, metrics):
            break
    return history
