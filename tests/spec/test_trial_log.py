"""klsweep.spec.trial_log: a klsweep trial's Tune log is judged with the trial's whole overrides."""

from __future__ import annotations

import json

from klsweep.cli import main
from klsweep.health import load_ruleset
from klsweep.health.check import backtest
from klsweep.health.readers import read_trace
from klsweep.results import SweepRecord
from klsweep.spec.trial_log import trial_log_overrides


def _kl_in_loss_blowup(config: dict) -> str:
    """A Ray Tune result.json of a GRPO run with the KL in the loss whose actor/kl_loss climbs 0.05 a step from 0.1
    (every line carries the trial's Tune config: its searched parameters only)."""
    rows = [{"training_iteration": s, "step": s, "actor/kl_loss": 0.1 + 0.05 * s, "actor/entropy": 1.0,
             "critic/score/mean": 0.5, "response_length/mean": 10.0, "config": config} for s in range(1, 41)]
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_klsweep_trials_tune_log_is_judged_with_the_trials_whole_config(tmp_path, capsys):
    """A klsweep trial's result.json holds only the searched kl_loss_coef in its config; the sweep's sweep.json in
    its run directory says use_kl_loss is on (GRPO). Read alone, verl's defaults would call the KL off and leave every
    KL rule idle on a log whose KL climbs to 2.1: the trial's whole overrides are rebuilt from the sweep instead."""
    run_dir = tmp_path / "runs" / "grpo"
    trial = run_dir / "tune" / "run_trial_0001"
    trial.mkdir(parents=True)
    sweep = {"name": "grpo", "algorithm": "grpo", "trainer": "embedded",
             "parameters": {"kl_coef": {"values": [0.01, 0.1]}},
             "objective": {"metric": "critic/score/mean", "mode": "max"}}
    SweepRecord(name="grpo", sweep_file="grpo.yaml", study_name="grpo", storage="sqlite:///study.db",
                objectives=[{"metric": "critic/score/mean", "mode": "max"}], sweep=sweep, overrides=[]).write(run_dir)
    log = trial / "result.json"
    log.write_text(_kl_in_loss_blowup({"actor_rollout_ref.actor.kl_loss_coef": 0.01}))
    t = read_trace(log, full_config=trial_log_overrides)
    assert t.config["actor_rollout_ref.actor.use_kl_loss"] is True  # from the sweep's GRPO preset
    assert t.config["actor_rollout_ref.actor.kl_loss_coef"] == 0.01  # the trial's own value
    _, summary = backtest(t, load_ruleset("default"))
    assert summary["verdict"] == "stopped" and "KL is off" not in json.dumps(summary["not_applicable"])
    assert main(["health", "check", str(log), "--json"]) == 1  # the command completes the config the same way
    assert json.loads(capsys.readouterr().out)["run_config"] == t.config

    bare = tmp_path / "result.json"  # the same log outside a sweep directory: a config that does not say
    bare.write_text(log.read_text())  # whether KL is on is not used, so the KL rules judge the logged KL
    t = read_trace(bare, full_config=trial_log_overrides)
    assert t.config is None
    _, summary = backtest(t, load_ruleset("default"))
    assert summary["verdict"] == "stopped"
