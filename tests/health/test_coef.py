"""``builtin.kl_coef_jump``: a logged KL coefficient that moves further than verl's adaptive controller can."""

from __future__ import annotations

import json

import pytest
from verl.trainer.ppo.core_algos import AdaptiveKLController

from klsweep.cli import main
from klsweep.health import HealthEngine, load_ruleset
from klsweep.health.coef import max_step_factor

COEF = "actor/reward_kl_penalty_coeff"
ADAPTIVE = {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive", "data.train_batch_size": 1024,
            "algorithm.kl_ctrl.horizon": 10000}


def _stream(coefs):
    return [(s, {COEF: c, "actor/reward_kl_penalty": 0.05, "critic/score/mean": 0.5}) for s, c in enumerate(coefs, 1)]


def _jumps(stream, run_config=ADAPTIVE):
    engine = HealthEngine(load_ruleset("default"), run_config)
    return [e for step, metrics in stream for e in engine.update(step, metrics).events
            if e.rule == "builtin.kl_coef_jump"], engine


def test_verls_own_adaptive_controller_at_its_fastest_is_no_jump():
    controller = AdaptiveKLController(0.0021, 0.02, 10000)  # verl's own class: KL 50x the target clips the error
    coefs = []
    for _ in range(30):
        coefs.append(controller.value)
        controller.update(current_kl=1.0, n_steps=1024)  # what apply_kl_penalty passes: the batch's sequences
    jumps, engine = _jumps(_stream(coefs))
    assert coefs[-1] / coefs[0] == pytest.approx(1.02048 ** 29)
    assert jumps == [] and engine.summary()["verdict"] == "healthy"


def test_a_coefficient_that_drops_at_a_resume_is_noted_and_the_run_stays_healthy():
    # the log: 0.0021 until step 40, 0.0010 from the resume at step 41 (another run's checkpoint)
    jumps, engine = _jumps(_stream([0.0021] * 40 + [0.0010] * 10))
    assert [e.step for e in jumps] == [41]
    assert jumps[0].action == "advise"
    assert "actor/reward_kl_penalty_coeff jumped 0.0021 → 0.001 (×0.48) between steps 40 and 41" in jumps[0].message
    assert engine.summary()["verdict"] == "healthy"


def test_the_controllers_step_bound_follows_the_run_config():
    assert max_step_factor(None) == pytest.approx(1 + 0.2 * 1024 / 10000)
    config = {"data.train_batch_size": 64, "actor_rollout_ref.rollout.n": 8, "algorithm.kl_ctrl.horizon": 1000}
    assert max_step_factor(config) == pytest.approx(1 + 0.2 * 512 / 1000)
    # a x1.1 move in one step is within that run's controller (x1.1024), not within the default one (x1.0205)
    stream = _stream([0.01, 0.011])
    assert _jumps(stream, {**ADAPTIVE, **config})[0] == []
    assert [e.step for e in _jumps(stream)[0]] == [2]


def test_a_log_rounded_to_3_decimals_moves_within_its_rounding():
    engine = HealthEngine(load_ruleset("default"), None, rounded=True)
    events = [e for s, c in enumerate([0.001, 0.002, 0.001], 1) for e in engine.update(s, {COEF: c}).events]
    assert events == []


def test_health_check_notes_the_jump_next_to_its_verdict(tmp_path, capsys):
    log = tmp_path / "resumed.jsonl"
    log.write_text("".join(json.dumps({"step": s, "data": m}) + "\n"
                           for s, m in _stream([0.0021] * 40 + [0.0010] * 10)))
    assert main(["health", "check", str(log)]) == 0
    out = capsys.readouterr().out
    assert ("note: actor/reward_kl_penalty_coeff jumped 0.0021 → 0.001 (×0.48) between steps 40 and 41"
            in out and "(step 41, builtin.kl_coef_jump)" in out)
    assert "verdict: HEALTHY" in out
