"""Acceptance: the KL knobs shape a real over-optimisation curve (Gao et al. 2022) on the embedded task.

Over the same steps, without a KL constraint the proxy score ends higher and the gold validation accuracy lower
than with a moderate coefficient (the policy pads right answers with junk for the proxy's length bias), and a very
large coefficient ends with the lowest KL. Checked for GRPO (KL in the loss) and PPO/gae (KL in the reward).
Fixed seeds; the trainer is deterministic on CPU.
"""

import numpy as np
import pytest

from klsweep.trainers.embedded import VAL_METRIC, run

A = "actor_rollout_ref.actor"
STEPS = 60  # hacking is complete by step ~50 without KL at the default settings
CASES = {
    "grpo": ({"algorithm.adv_estimator": "grpo", f"{A}.use_kl_loss": True}, f"{A}.kl_loss_coef",
             "actor/kl_loss", (0.0, 1.0, 10.0)),
    "gae": ({"algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": True}, "algorithm.kl_ctrl.kl_coef",
            "actor/reward_kl_penalty", (0.0, 0.1, 10.0)),
}


def _final(overrides):
    history = run({**overrides, "trainer.total_training_steps": STEPS, "trainer.test_freq": STEPS,
                   "trainer.val_before_train": False})
    tail = history[-10:]
    return {
        "proxy": float(np.mean([m["critic/score/mean"] for m in tail])),
        "gold": history[-1][VAL_METRIC],
        "length": float(np.mean([m["response_length/mean"] for m in tail])),
    }, tail


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_no_kl_hacks_the_proxy_moderate_kl_keeps_gold_large_kl_stays_closest(algorithm):
    base, coef_key, kl_metric, (none, moderate, large) = CASES[algorithm]
    results = {}
    for coef in (none, moderate, large):
        final, tail = _final({**base, coef_key: coef})
        final["kl"] = float(np.mean([m[kl_metric] for m in tail]))
        results[coef] = final
    print(algorithm, results)  # the numbers behind the shipped sweeps' ranges (pytest -s)
    assert results[none]["proxy"] > results[moderate]["proxy"]
    assert results[none]["gold"] < results[moderate]["gold"]
    assert results[none]["length"] > results[moderate]["length"]  # the reward-hacking signature
    assert results[large]["kl"] < min(results[moderate]["kl"], results[none]["kl"])
