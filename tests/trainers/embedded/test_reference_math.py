"""The embedded trainer's numbers against references it does not share code with.

``test_losses.py`` rebuilds the expected losses from the same ``core_algos`` calls and the same global-batch settings
as ``trainers/embedded/trainer.py``, so an error shared by both (batch info, masks, which function is called) passes
there. The references here are independent of that wiring:

- verl's own end-to-end actor loss, ``ppo_loss`` in ``verl/workers/utils/losses.py``, fed the way verl's FSDP engine
  feeds it (``verl/workers/engine/fsdp/transformer_impl.py`` ``forward_backward_batch``: no-padding model output,
  ``batch_num_tokens`` = the mini-batch's response tokens, ``dp_size``; ``verl/trainer/ppo/ray_trainer.py``
  ``_update_actor``: ``global_batch_size`` = ``ppo_mini_batch_size × rollout.n`` sequences), also split into
  micro-batches whose losses verl sums;
- hand-derived closed forms on a 2×3 batch: the PPO clipped loss with dual clip (Schulman et al. 2017; Ye et al.
  2019, ``clip_ratio_c``), the k1/k2/k3 KL estimators (Schulman 2020, http://joschu.net/blog/kl-approx.html) and
  every ``loss_agg_mode``;
- plain-Python re-derivations on a batch the real :class:`EmbeddedTrainer` made: the response mask and proxy score
  from the tokens, KL in the reward, GAE (Schulman et al. 2015, "High-Dimensional Continuous Control Using
  Generalized Advantage Estimation", eq. 16, then verl's batch whitening), GRPO (Shao et al. 2024, "DeepSeekMath",
  §4.1.2: group mean and standard deviation) and Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training":
  no division by the standard deviation), and the actor update's per-mini-batch losses.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from klsweep.trainers.embedded.trainer import EmbeddedTrainer, actor_loss
from klsweep.verl.config import KL_ESTIMATORS, LOSS_AGG_MODES

A = "actor_rollout_ref.actor"
PROMPT_TOKENS = 6  # the embedded task's prompts: "aa+bb="
EOS = 12  # the embedded task's EOS token id


def _actor_config(loss_agg_mode: str, kl_loss_type: str = "k1", *, entropy_coeff: float = 0.01,
                  kl_loss_coef: float = 0.3):
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=4, rollout_n=2, clip_ratio=0.2,
        loss_agg_mode=loss_agg_mode, entropy_coeff=entropy_coeff,
        use_kl_loss=True, kl_loss_coef=kl_loss_coef, kl_loss_type=kl_loss_type,
    )


# ---------------------------------------------------------------- verl's ppo_loss, as its engine calls it


def _verl_ppo_loss(log_prob, entropy, old, ref, advantages, mask, config, rows: slice, batch_num_tokens: int,
                   global_batch_size: int):
    """verl's ``ppo_loss`` on the micro-batch ``rows``, its model output in verl's no-padding layout.

    The engine's model output is one flat tensor over each sequence's prompt and response tokens, the log-prob of
    response token ``t`` at position ``prompt_len - 1 + t`` (``no_padding_2_padding`` shifts it back).
    """
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    lengths = mask[rows].sum(dim=1).long().tolist()

    def flat(t):
        pad = t.new_zeros(PROMPT_TOKENS - 1)
        return torch.cat([torch.cat([pad, row[:n], t.new_zeros(1)]) for row, n in zip(t[rows], lengths)])

    n = len(lengths)
    data = TensorDict({
        "prompts": torch.ones(n, PROMPT_TOKENS, dtype=torch.long),
        "responses": torch.ones(n, mask.shape[1], dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(n, PROMPT_TOKENS), mask[rows]], dim=1).long(),
        "response_mask": mask[rows], "old_log_probs": old[rows], "advantages": advantages[rows],
        "ref_log_prob": ref[rows],
    }, batch_size=[n])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
    loss, metrics = ppo_loss(config, {"log_probs": flat(log_prob), "entropy": flat(entropy)}, data)
    return loss, {k: v.values[0] if hasattr(v, "values") else v for k, v in metrics.items()}


def _random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = (4, 5)
    log_prob = -torch.rand(shape, generator=g) * 2
    old = log_prob + 0.3 * torch.randn(shape, generator=g)
    ref = log_prob + 0.5 * torch.randn(shape, generator=g)
    entropy = torch.rand(shape, generator=g)
    advantages = torch.randn(shape, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.float)
    return log_prob, entropy, old, ref, advantages, mask


@pytest.mark.parametrize("loss_agg_mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("kl_loss_type", KL_ESTIMATORS)
def test_actor_loss_equals_verls_ppo_loss_whole_and_in_micro_batches(loss_agg_mode, kl_loss_type):
    log_prob, entropy, old, ref, advantages, mask = _random_batch(0)
    tokens, sequences = int(mask.sum()), 4  # the mini-batch: 13 response tokens in 4 sequences

    ours_lp = log_prob.clone().requires_grad_(True)
    loss, metrics = actor_loss(ours_lp, entropy, old, ref, advantages, mask, _actor_config(loss_agg_mode, kl_loss_type))
    (grad,) = torch.autograd.grad(loss, ours_lp)

    verl_lp = log_prob.clone().requires_grad_(True)
    expected, verl_metrics = _verl_ppo_loss(verl_lp, entropy, old, ref, advantages, mask,
                                            _actor_config(loss_agg_mode, kl_loss_type), slice(0, 4), tokens, sequences)
    (expected_grad,) = torch.autograd.grad(expected, verl_lp)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert metrics["actor/pg_loss"] == pytest.approx(verl_metrics["actor/pg_loss"])
    assert metrics["actor/kl_loss"] == pytest.approx(verl_metrics["kl_loss"])
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert metrics[key] == pytest.approx(verl_metrics[key])

    # verl splits a mini-batch into micro-batches (rows 0-1, 2-3) normalised by the whole mini-batch and sums their
    # gradients: the one-pass loss of the trainer must equal that sum
    micro_lp = log_prob.clone().requires_grad_(True)
    summed = sum(
        _verl_ppo_loss(micro_lp, entropy, old, ref, advantages, mask, _actor_config(loss_agg_mode, kl_loss_type),
                       rows, tokens, sequences)[0]
        for rows in (slice(0, 2), slice(2, 4))
    )
    (summed_grad,) = torch.autograd.grad(summed, micro_lp)
    torch.testing.assert_close(loss, summed)
    torch.testing.assert_close(grad, summed_grad)


# ---------------------------------------------------------------- closed forms on a 2x3 batch
#
# mask [[1, 1, 0], [1, 1, 1]]: 5 response tokens, sequence lengths 2 and 3, response width 3.
# ratio r = exp(log_prob - old), clip range 0.8..1.2, dual clip c = 3 (verl's clip_ratio_c default).
# per-token loss: max(-rA, -clip(r)A), and for A < 0 at most -cA:
#   row 0: r=1.5, A= 1 -> max(-1.5, -1.2) = -1.2 (clipped, pg_clipfrac)   r=1.0, A=-2 -> max(2, 2) = 2
#          (token 3 masked: r=2, A=5)
#   row 1: r=0.5, A=-1 -> max(0.5, 0.8) = 0.8 (clipped, pg_clipfrac)      r=1.1, A=2 -> max(-2.2, -2.2) = -2.2
#          r=4.0, A=-1 -> max(4, 1.2) = 4, dual clip min(4, 3) = 3 (pg_clipfrac_lower)
#   sequence sums: row 0 -1.2 + 2 = 0.8; row 1 0.8 - 2.2 + 3 = 1.6; all tokens 2.4
# d = log_prob - ref: row 0 [ln 2, 0, (9)], row 1 [-ln 2, ln 4, 0]
#   k1 = d: row sums ln 2 and ln 2 + 0 = ln 2 ... row 1: -ln 2 + ln 4 = ln 2
#   k2 = d²/2: row sums ln²2/2 and (ln²2 + 4 ln²2)/2 = 5 ln²2/2
#   k3 = exp(-d) + d - 1: row 0 (1/2 + ln 2 - 1) + 0 = ln 2 - 1/2;
#        row 1 (2 - ln 2 - 1) + (1/4 + ln 4 - 1) + 0 = ln 2 + 1/4
# entropy: row 0 [1, 2, (9)], row 1 [3, 0, 1]: row sums 3 and 4
LN2 = math.log(2)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
RATIO = torch.tensor([[1.5, 1.0, 2.0], [0.5, 1.1, 4.0]])
ADV = torch.tensor([[1.0, -2.0, 5.0], [-1.0, 2.0, -1.0]])
LOG_PROB = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.5, -2.5]])
OLD = LOG_PROB - RATIO.log()
REF = LOG_PROB - torch.tensor([[LN2, 0.0, 9.0], [-LN2, 2 * LN2, 0.0]])
ENTROPY = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 1.0]])
ROW_SUMS = {"pg": (0.8, 1.6), "k1": (LN2, LN2), "k2": (LN2**2 / 2, 5 * LN2**2 / 2), "k3": (LN2 - 0.5, LN2 + 0.25),
            "entropy": (3.0, 4.0)}


def _aggregate(loss_agg_mode: str, sums: list[float], lengths: list[int], width: int) -> float:
    """``loss_agg_mode`` by hand from each sequence's token sum and length (``width``: the response width).

    On the 2×3 batch (lengths 2 and 3): token-mean (s0 + s1) / 5, token-sum s0 + s1, seq-mean-token-sum
    (s0 + s1) / 2, seq-mean-token-mean (s0 / 2 + s1 / 3) / 2, seq-mean-token-sum-norm (s0 + s1) / 2 / 3.
    """
    return {
        "token-mean": sum(sums) / sum(lengths),
        "token-sum": sum(sums),
        "seq-mean-token-sum": sum(sums) / len(sums),
        "seq-mean-token-mean": statistics.fmean(s / n for s, n in zip(sums, lengths)),
        "seq-mean-token-sum-norm": sum(sums) / len(sums) / width,  # loss_scale_factor None: the response width
    }[loss_agg_mode]


def _by_hand(loss_agg_mode: str, row_sums: tuple[float, float]) -> float:
    """:func:`_aggregate` on the 2×3 batch."""
    return _aggregate(loss_agg_mode, list(row_sums), [2, 3], 3)


@pytest.mark.parametrize("loss_agg_mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("kl_loss_type,kl", [("k1", "k1"), ("kl", "k1"), ("k2", "k2"), ("mse", "k2"),
                                             ("k3", "k3"), ("low_var_kl", "k3"), ("k3+", "k3"), ("k1+", "k1")])
def test_actor_loss_closed_form(loss_agg_mode, kl_loss_type, kl):
    config = _actor_config(loss_agg_mode, kl_loss_type, entropy_coeff=0.1, kl_loss_coef=0.5)
    loss, metrics = actor_loss(LOG_PROB, ENTROPY, OLD, REF, ADV, MASK, config)
    pg = _by_hand(loss_agg_mode, ROW_SUMS["pg"])
    kl_loss = _by_hand(loss_agg_mode, ROW_SUMS[kl])
    assert metrics["actor/pg_loss"] == pytest.approx(pg, rel=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(kl_loss, rel=1e-5)
    assert loss.item() == pytest.approx(pg - 0.1 * _by_hand(loss_agg_mode, ROW_SUMS["entropy"]) + 0.5 * kl_loss,
                                        rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # row 0 token 0, row 1 token 0
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)  # row 1 token 2
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(1.5 * 1.0 * 0.5 * 1.1 * 4.0) / 5, rel=1e-5)
    assert metrics["actor/kl_coef"] == 0.5


@pytest.mark.parametrize("kl_loss_type,kl_grad", [
    ("k1", [[1, 1, 0], [1, 1, 1]]),  # d k1 / d log_prob = 1
    ("k3", [[1 - 1 / 2, 0, 0], [1 - 2, 1 - 1 / 4, 0]]),  # d k3 / d log_prob = 1 - exp(-d)
    ("k3+", [[LN2, 0, 0], [-LN2, 2 * LN2, 0]]),  # straight-through: the gradient of k2, d
])
def test_actor_loss_gradient_closed_form_token_mean(kl_loss_type, kl_grad):
    # token-mean over 5 tokens. PPO: the unclipped tokens carry d(-rA)/d log_prob = -rA (row 0 token 1: 2, row 1
    # token 1: -2.2); clipped and dual-clipped tokens carry none. KL: 0.5 × its per-token derivative.
    config = _actor_config("token-mean", kl_loss_type, entropy_coeff=0.1, kl_loss_coef=0.5)
    log_prob = LOG_PROB.clone().requires_grad_(True)
    loss, _ = actor_loss(log_prob, ENTROPY, OLD, REF, ADV, MASK, config)
    (grad,) = torch.autograd.grad(loss, log_prob)
    pg_grad = torch.tensor([[0.0, 2.0, 0.0], [0.0, -2.2, 0.0]])
    torch.testing.assert_close(grad, (pg_grad + 0.5 * torch.tensor(kl_grad) * MASK) / 5)


# ---------------------------------------------------------------- the real trainer's batch, re-derived


def _trainer(**extra) -> EmbeddedTrainer:
    """A small trainer (4 prompts × 4 samples) whose actor is moved off the reference (fixed Gaussian noise on its
    weights): at step 1 the actor is the reference, every KL is 0 and a KL term could have any sign or scale."""
    trainer = EmbeddedTrainer({"trainer.total_training_steps": 4, "trainer.test_freq": -1,
                               "trainer.val_before_train": False, "data.train_batch_size": 4,
                               "actor_rollout_ref.rollout.n": 4, **extra})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer.actor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return trainer


def _mask_and_scores(prompts: torch.Tensor, responses: torch.Tensor) -> tuple[list[int], list[float]]:
    """Per sequence, in plain Python: verl's response length (tokens up to and including the first EOS) and the
    embedded task's proxy score (answer digits in place / answer digits + 0.3 × length / width)."""
    lengths, scores = [], []
    for prompt, response in zip(prompts.tolist(), responses.tolist()):
        answer = str((10 * prompt[0] + prompt[1]) + (10 * prompt[3] + prompt[4]))
        length = response.index(EOS) + 1 if EOS in response else len(response)
        right = sum(1 for i, digit in enumerate(answer) if i < len(response) and response[i] == int(digit))
        lengths.append(length)
        scores.append(right / len(answer) + 0.3 * length / len(response))
    return lengths, scores


def _check_mask_and_scores(batch) -> tuple[list[int], list[float]]:
    lengths, scores = _mask_and_scores(batch["prompts"], batch["responses"])
    width = batch["responses"].shape[1]
    expected_mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    torch.testing.assert_close(batch["response_mask"].float(), expected_mask)
    expected_scores = torch.zeros_like(expected_mask)
    for i, (n, score) in enumerate(zip(lengths, scores)):
        expected_scores[i, n - 1] = score
    torch.testing.assert_close(batch["token_level_scores"], expected_scores)
    assert len(set(lengths)) > 1  # the batch has responses of different lengths: a mask error would show
    return lengths, scores


def test_gae_with_kl_in_reward_equals_the_papers_recursion():
    gamma, lam, beta = 0.9, 0.8, 0.05
    trainer = _trainer(**{"algorithm.adv_estimator": "gae", "algorithm.gamma": gamma, "algorithm.lam": lam,
                          "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "fixed",
                          "algorithm.kl_ctrl.kl_coef": beta, "algorithm.kl_penalty": "kl"})
    batch, metrics = trainer.make_experience()
    lengths, scores = _check_mask_and_scores(batch)
    old, ref, values = batch["old_log_prob"], batch["ref_log_prob"], batch["values"]

    raw: list[list[float]] = []  # GAE before whitening, valid tokens only
    seq_kl = []
    for i, n in enumerate(lengths):
        kl = [(old[i, t] - ref[i, t]).item() for t in range(n)]  # k1 of the sampling policy against the reference
        seq_kl.append(sum(kl) / n)
        rewards = [-beta * kl[t] + (scores[i] if t == n - 1 else 0.0) for t in range(n)]
        torch.testing.assert_close(batch["token_level_rewards"][i, :n], torch.tensor(rewards))
        v = [values[i, t].item() for t in range(n)] + [0.0]  # V after the last token: 0 (episode ends)
        adv, running = [0.0] * n, 0.0
        for t in reversed(range(n)):  # A_t = delta_t + gamma*lam*A_{t+1}, delta_t = r_t + gamma*V_{t+1} - V_t
            running = rewards[t] + gamma * v[t + 1] - v[t] + gamma * lam * running
            adv[t] = running
        raw.append(adv)
        torch.testing.assert_close(batch["returns"][i, :n], torch.tensor(adv) + values[i, :n], rtol=1e-5, atol=1e-6)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(statistics.fmean(seq_kl), rel=1e-5)
    assert all(abs(kl) > 1e-4 for kl in seq_kl)  # the actor is off the reference: the KL term is tested
    assert metrics["actor/reward_kl_penalty_coeff"] == beta

    flat = [a for adv in raw for a in adv]  # verl whitens over the batch's valid tokens (unbiased variance)
    mean, var = statistics.fmean(flat), statistics.variance(flat)
    mask = batch["response_mask"].bool()
    expected = torch.tensor([(a - mean) / math.sqrt(var + 1e-8) for a in flat])
    torch.testing.assert_close(batch["advantages"][mask], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_by_std", [True, False], ids=["grpo", "drgrpo"])
def test_grpo_and_drgrpo_advantages_equal_the_papers(norm_by_std):
    trainer = _trainer(**{"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": norm_by_std})
    batch, _ = trainer.make_experience()
    lengths, scores = _check_mask_and_scores(batch)
    for prompt in range(4):  # rollout.n = 4 samples of each prompt, in a row
        rows = range(4 * prompt, 4 * prompt + 4)
        assert len({tuple(batch["prompts"][i].tolist()) for i in rows}) == 1
        group = [scores[i] for i in rows]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        for i in rows:
            a = (scores[i] - mean) / (std + 1e-6) if norm_by_std else scores[i] - mean
            n = lengths[i]
            torch.testing.assert_close(batch["advantages"][i], torch.tensor([a] * n + [0.0] * (8 - n)))


@pytest.mark.parametrize("loss_agg_mode", LOSS_AGG_MODES)
def test_update_normalises_each_mini_batch_by_its_own_tokens_and_sequences(loss_agg_mode):
    # lr 0: the actor never moves, so every mini-batch sees ratio 1 and the logged losses are closed forms of the
    # experience: pg_loss = agg(-A), kl_loss = agg(old - ref) (k1). 4 prompts × 4 samples, 2 prompts per
    # mini-batch: 2 mini-batches of 8 sequences, each normalised by its own tokens and its 8 sequences (verl's
    # global batch is the mini-batch); the logged value is their mean.
    trainer = _trainer(**{"algorithm.adv_estimator": "grpo", f"{A}.optim.lr": 0.0, f"{A}.ppo_mini_batch_size": 2,
                          f"{A}.use_kl_loss": True, f"{A}.kl_loss_type": "k1", f"{A}.kl_loss_coef": 0.5,
                          f"{A}.loss_agg_mode": loss_agg_mode})
    trainer.global_step = 1
    batch, _ = trainer.make_experience()
    lengths, _ = _check_mask_and_scores(batch)
    adv, kl = batch["advantages"], batch["old_log_prob"] - batch["ref_log_prob"]
    pg_means, kl_means = [], []
    for rows in (range(0, 8), range(8, 16)):
        pg_sums = [-adv[i, : lengths[i]].sum().item() for i in rows]
        kl_sums = [kl[i, : lengths[i]].sum().item() for i in rows]
        pg_means.append(_aggregate(loss_agg_mode, pg_sums, [lengths[i] for i in rows], 8))
        kl_means.append(_aggregate(loss_agg_mode, kl_sums, [lengths[i] for i in rows], 8))
    metrics = trainer.update(batch)
    assert metrics["actor/pg_loss"] == pytest.approx(statistics.fmean(pg_means), abs=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(statistics.fmean(kl_means), rel=1e-5)
    assert abs(metrics["actor/kl_loss"]) > 1e-4  # the actor is off the reference: the KL term is tested
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert not np.isclose(pg_means[0], pg_means[1])  # the two mini-batches differ: a mix-up would show
