"""klsweep.verl.config: verl's own agg_loss through the valid modes, unknown keys, override rendering."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from klsweep.errors import OverrideError
from klsweep.verl.config import LOSS_AGG_MODES, check_values, compose, format_overrides

A = "actor_rollout_ref.actor."


def test_agg_loss_example_from_verl_facts():
    from verl.trainer.ppo.core_algos import agg_loss

    loss = torch.arange(20, dtype=torch.float32).view(4, 5)
    mask = (torch.arange(5)[None, :] < torch.tensor([3, 5, 4, 5])[:, None]).float()
    # by hand: row token sums 3, 35, 46, 85 (total 169 over 17 tokens); row means 1, 7, 11.5, 17
    expected = {
        "token-mean": 169 / 17,
        "token-sum": 169.0,
        "seq-mean-token-sum": 169 / 4,
        "seq-mean-token-mean": (1 + 7 + 11.5 + 17) / 4,
        "seq-mean-token-sum-norm": 169 / 4 / 5,
    }
    assert set(LOSS_AGG_MODES) == set(expected)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(loss, mask, loss_agg_mode=mode).item() == pytest.approx(expected[mode], rel=1e-6)
    scaled = agg_loss(loss, mask, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=10)
    assert scaled.item() == pytest.approx(4.225)
    assert round(169 / 17, 3) == 9.941  # the rounded value verl-facts.md lists


@pytest.mark.slow
def test_check_values_accepts_exactly_the_valid_modes():
    for mode in LOSS_AGG_MODES:
        check_values(compose({A + "loss_agg_mode": mode}))
    with pytest.raises(OverrideError, match="'seq-sum' is not valid"):
        check_values(compose({A + "loss_agg_mode": "seq-sum"}))


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(OverrideError, match=r"did you mean 'actor_rollout_ref\.actor\.kl_loss_type'\?"):
        compose({A + "kl_los_type": "kl"})


@pytest.mark.parametrize(
    "key, value",
    [
        ("trainer.experiment_name", "on"),
        ("trainer.experiment_name", "off"),
        ("trainer.experiment_name", "yes"),
        ("trainer.experiment_name", "null"),
        ("trainer.experiment_name", "it's 1e-3"),
        (A + "kl_loss_type", "k3+"),
        ("trainer.logger", ["console", "file"]),
        (A + "use_kl_loss", True),
        (A + "loss_scale_factor", None),
        (A + "kl_loss_coef", 0.0005),
        ("data.train_batch_size", 16),
    ],
)
def test_format_value_round_trips_through_verl_compose(key, value):
    cfg = compose({key: value})
    got = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        got = got[part]
    assert got == value and type(got) is type(value)
    assert format_overrides({key: value})[0].startswith(f"{key}=")
