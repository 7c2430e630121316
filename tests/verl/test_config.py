"""klsweep.verl.config: verl's own agg_loss through the valid modes, unknown keys, override rendering."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from klsweep.errors import OverrideError
from klsweep.verl.config import (
    ADV_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    check_values,
    compose,
    format_overrides,
)

A = "actor_rollout_ref.actor."


def test_agg_loss_modes_on_a_worked_example():
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


def test_the_value_lists_are_what_verls_own_functions_accept():
    """check_values tests membership without importing verl: these lists must be exactly verl 0.9.1's."""
    from verl.trainer.ppo import core_algos

    logprob, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    for name in KL_ESTIMATORS:
        assert torch.isfinite(core_algos.kl_penalty(logprob, ref, kl_penalty=name)).all()
    for name in ("full", "drgrpo", "k4", "KL", "low_var_kl++"):
        with pytest.raises((NotImplementedError, ValueError, AttributeError, TypeError)):
            core_algos.kl_penalty(logprob, ref, kl_penalty=name)
    assert set(ADV_ESTIMATORS) == {str(k) for k in core_algos.ADV_ESTIMATOR_REGISTRY}
    for mode in LOSS_AGG_MODES:
        core_algos.agg_loss(torch.ones(2, 3), torch.ones(2, 3), loss_agg_mode=mode)
    with pytest.raises((ValueError, NotImplementedError)):
        core_algos.agg_loss(torch.ones(2, 3), torch.ones(2, 3), loss_agg_mode="seq-sum")


def _quoted(function) -> set[str]:
    """The string literals in the body of a verl function (after its docstring): the names it dispatches on."""
    import inspect
    import re

    return set(re.findall(r'"([A-Za-z0-9_+-]+)"', inspect.getsource(function).split('"""')[-1]))


def test_the_value_lists_hold_every_value_verl_accepts():
    """The other direction: a name verl's functions dispatch on and accept, which klsweep would refuse, fails here
    (read from the installed verl's source, so a verl that adds an estimator or a mode makes this test fail)."""
    from verl.trainer.ppo import core_algos

    logprob, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    names = _quoted(core_algos.kl_penalty_forward)
    accepted = set()
    for name in names | {n + "+" for n in names}:
        try:
            core_algos.kl_penalty(logprob, ref, kl_penalty=name)
        except (NotImplementedError, ValueError):
            continue
        accepted.add(name)
    assert accepted == set(KL_ESTIMATORS)
    assert _quoted(core_algos.agg_loss) == set(LOSS_AGG_MODES)


def test_check_values_accepts_exactly_the_valid_values():
    for mode in LOSS_AGG_MODES:
        check_values(compose({A + "loss_agg_mode": mode}))
    for name in KL_ESTIMATORS:
        check_values(compose({A + "kl_loss_type": name, "algorithm.kl_penalty": name}))
    for name in ADV_ESTIMATORS:
        check_values(compose({"algorithm.adv_estimator": name}))
    with pytest.raises(OverrideError) as e:
        check_values(compose({A + "loss_agg_mode": "seq-sum", A + "kl_loss_type": "full", "algorithm.kl_penalty": "k4",
                              "algorithm.adv_estimator": "drgrpo", "algorithm.kl_ctrl.kl_coef": -0.1}))
    assert [p.split("=")[0] for p in e.value.problems] == [
        A + "kl_loss_type", "algorithm.kl_penalty", "algorithm.adv_estimator", A + "loss_agg_mode",
        "algorithm.kl_ctrl.kl_coef"]
    assert "use `algorithm: drgrpo`" in str(e.value) and "NotImplementedError" in str(e.value)


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


def _shipped_trial_configs():
    from pathlib import Path

    from klsweep.orchestrate.plan import preflight_configs
    from klsweep.spec import load_sweep

    root = Path(__file__).resolve().parents[2] / "sweeps"
    return [o for f in sorted(root.glob("*.yaml")) for o in preflight_configs(load_sweep(f))]


@pytest.mark.parametrize(
    "overrides",
    [
        *_shipped_trial_configs(),
        {"+trainer.klsweep_tag": "x", "++trainer.experiment_name": "e", A + "checkpoint.save_contents": ["model"]},
        {"trainer.logger": ["console", "file"], "algorithm.kl_ctrl.type": "adaptive", "trainer.experiment_name": "on"},
    ],
)
def test_value_overrides_compose_exactly_as_hydra_does(overrides):
    """The fast path (cached defaults + Hydra's own override step) gives what a full ``hydra.compose`` gives."""
    from klsweep.verl.config import _apply_value_overrides, _hydra_compose

    strings = tuple(format_overrides(overrides))
    fast = _apply_value_overrides(strings)
    assert fast is not None
    full = _hydra_compose(strings)
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(full)
    assert OmegaConf.is_struct(fast) == OmegaConf.is_struct(full)


@pytest.mark.parametrize(
    "strings",
    [("actor@actor_rollout_ref.actor=dp_actor",), ("actor=dp_actor",), ("algorithm.kl_ctrl.kl_coeff=0.1",),
     ("++hydra.run.dir=x",), ("+hydra.foo=1",)],
)
def test_group_selections_and_errors_take_the_full_compose(strings):
    from klsweep.verl.config import _apply_value_overrides

    assert _apply_value_overrides(strings) is None


def test_hydra_node_overrides_leave_no_hydra_node():
    assert "hydra" not in compose({"++hydra.run.dir": "outputs/x", "algorithm.kl_ctrl.kl_coef": 0.01})


def test_a_mistyped_key_fails_the_same_after_the_defaults_are_cached():
    compose({})
    with pytest.raises(OverrideError, match=r"'algorithm\.kl_ctrl\.kl_coeff' is not a key .* did you mean"):
        compose({"algorithm.kl_ctrl.kl_coeff": 0.1})
