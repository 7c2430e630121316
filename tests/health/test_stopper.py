"""HealthStopper in a real (tiny) Ray Tune run: the sick trial stops at the right iteration, with its reason."""

from __future__ import annotations

import pytest
from ray import tune

from klsweep.health import HealthStopper, load_ruleset

STEPS = 12
#: reference KL per iteration: crosses 1.0 at iteration 6, so default's kl_blowup (> 1 for 3 steps) fires at 8
DIVERGING_KL = [0.01, 0.02, 0.05, 0.1, 0.5, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]


def scripted(config):
    """Reports verl-named metrics; the stream is chosen by the trial's ``scenario``."""
    for i in range(STEPS):
        kl = DIVERGING_KL[i] if config["scenario"] == "diverge" else 0.01 + 0.001 * i
        tune.report(
            {
                "actor/kl_loss": kl,
                "actor/entropy": 0.3,
                "actor/pg_loss": 0.01,
                "critic/score/mean": 0.5,
                "critic/advantages/max": 1.0,
                "critic/advantages/min": -1.0,
                "step": i + 1,
            }
        )


@pytest.mark.slow
def test_stopper_stops_the_diverging_trial_at_the_right_iteration(ray_local, tmp_path):
    stopper = HealthStopper(load_ruleset("default"))
    tuner = tune.Tuner(
        scripted,
        param_space={"scenario": tune.grid_search(["healthy", "diverge"]), "actor_rollout_ref.actor.use_kl_loss": True},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="health", stop=stopper, verbose=0),
    )
    df = tuner.fit().get_dataframe().set_index("config/scenario")
    sick, ok = df.loc["diverge"], df.loc["healthy"]
    assert sick["training_iteration"] == 8 and sick["health"] == "stopped" and sick["stop_kind"] == "diverged"
    assert sick["stop_reason"].startswith("diverged at step 8 by kl_blowup: actor/kl_loss = 2.5")
    assert ok["training_iteration"] == STEPS and ok["health"] == "healthy" and ok["stop_reason"] == ""
    assert not stopper.stop_all()
    # the run config came from the trial's Tune config: KL in the loss, so kl_dead and kl_explosion were judged
    summary = next(stopper.summary(t) for t in stopper.engines if stopper.summary(t)["verdict"] == "healthy")
    assert "builtin.kl_dead" not in summary["not_applicable"]


def test_stopper_without_ray_tune_writes_health_and_stop_reason():
    stopper = HealthStopper(
        load_ruleset("default"), run_config_of=lambda c: {"actor_rollout_ref.actor.use_kl_loss": c["kl_on"]}
    )
    results = [{"actor/kl_loss": 0.0, "training_iteration": i, "config": {"kl_on": True}} for i in range(1, 15)]
    stops = [stopper("t1", r) for r in results]
    assert stops.index(True) == 12  # kl exactly 0 after step 10 for 3 steps: iteration 13
    assert results[12]["health"] == "stopped" and "builtin.kl_dead" in results[12]["stop_reason"]
    assert results[12]["stop_kind"] == "misconfigured" and results[11]["stop_kind"] == ""
    assert results[0]["health"] == "healthy" and results[0]["stop_reason"] == ""
