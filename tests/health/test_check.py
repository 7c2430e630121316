"""`sweep health check` on public logs of real verl runs (tests/data/traces; acceptance of issue 3), its exit codes
and JSON output."""

from __future__ import annotations

import json
import re

import pytest

from klsweep.cli import main
from klsweep.health import load_ruleset
from klsweep.health.check import backtest
from klsweep.health.readers import read_trace
from tests.conftest import GRPO, NO_SIGNAL, PPO_CONSOLE, PPO_JSONL, trace


def _first_step_where(path, predicate):
    """Independent reading of the console log: the first step whose parsed metrics satisfy ``predicate``."""
    for line in path.read_text(errors="replace").splitlines():
        m = re.search(r"step:(\d+) - (.*)$", re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            metrics = dict(p.rsplit(":", 1) for p in m.group(2).split(" - "))
            if predicate(metrics):
                return int(m.group(1))
    return None


@pytest.mark.parametrize("name", [PPO_CONSOLE, PPO_JSONL, GRPO])
def test_healthy_baselines_are_not_stopped_by_default(name):
    timeline, summary = backtest(read_trace(trace(name)), load_ruleset("default"))
    assert summary["verdict"] == "healthy", summary["stop_reason"]
    assert all(span["action"] == "advise" for span in timeline)


@pytest.mark.parametrize("name", [PPO_CONSOLE, PPO_JSONL, GRPO])
def test_healthy_baselines_pass_conservative_and_aggressive_too(name):
    for preset in ("conservative", "aggressive"):
        _, summary = backtest(read_trace(trace(name)), load_ruleset(preset))
        assert summary["verdict"] == "healthy", (preset, summary["stop_reason"])


def test_seed_stops_the_ppo_baseline_at_115_by_entropy_and_its_timeline_shows_kl_at_337():
    path = trace(PPO_CONSOLE)
    # the README's steps, re-derived from the log itself
    entropy_step = _first_step_where(path, lambda m: float(m["actor/entropy_loss"]) < 0.1)
    assert entropy_step == 115
    timeline, summary = backtest(read_trace(path), load_ruleset("seed"))
    assert summary["verdict"] == "stopped"
    assert (summary["stop_step"], summary["reason"]["rule"], summary["stop_kind"]) == (115, "entropy_low", "collapsed")
    kl_spans = [s for s in timeline if s["rule"] == "kl_sustained"]
    assert kl_spans[0]["first_step"] == 337 and kl_spans[0]["action"] == "stop"
    assert "collapsed at step 115" in summary["stop_reason"]


def test_seed_stops_the_sampled_ppo_baseline_at_115():
    _, summary = backtest(read_trace(trace(PPO_JSONL)), load_ruleset("seed"))
    assert summary["stop_step"] == 115 and summary["reason"]["rule"] == "entropy_low"


def test_zero_reward_run_is_stopped_as_no_signal_not_divergence():
    _, summary = backtest(read_trace(trace(NO_SIGNAL)), load_ruleset("default"))
    assert summary["verdict"] == "stopped"
    assert summary["stop_kind"] == "no_signal"
    assert summary["reason"]["rule"] == "builtin.no_signal"
    assert summary["stop_step"] == 7  # the second of its two reports, both with advantages 0


def test_exit_codes_and_json_output(tmp_path, capsys):
    assert main(["health", "check", str(trace(GRPO))]) == 0
    capsys.readouterr()
    assert main(["health", "check", str(trace(NO_SIGNAL)), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "stopped" and out["stop_kind"] == "no_signal" and out["format"] == "verl-jsonl"
    assert out["timeline"][0]["rule"] == "builtin.no_signal"
    garbage = tmp_path / "notes.txt"
    garbage.write_text("no step lines here\n")
    assert main(["health", "check", str(garbage)]) == 2
    assert "no training steps found" in capsys.readouterr().err
    assert main(["health", "check", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["health", "check", str(trace(GRPO)), "--preset", "strict"]) == 2
    assert "valid presets are" in capsys.readouterr().err


def test_text_output_lists_timeline_not_applicable_and_verdict(capsys):
    assert main(["health", "check", str(trace(PPO_CONSOLE)), "--preset", "seed"]) == 1
    out = capsys.readouterr().out
    assert "435 reports (steps 0-434)" in out
    assert re.search(r"steps 337-\d+ +STOP +kl_sustained", out)
    assert "not applicable:" in out and "builtin.kl_dead: the log prints rounded values" in out
    assert "verdict: STOPPED: collapsed at step 115 by entropy_low" in out


def test_rules_file(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "preset: none\n"
        "rules:\n"
        "  - {name: score_floor, metric: critic/score/mean, below: 0.5, after: 10, for: 3, action: stop}\n"
    )
    assert main(["health", "check", str(trace(GRPO)), "--rules", str(rules), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ruleset"] == "rules.yaml"
    rules.write_text("rules:\n  - {name: x, metric: ref_kl, above: 1, action: explode}\n")
    assert main(["health", "check", str(trace(GRPO)), "--rules", str(rules)]) == 2
    assert "rules.0.action" in capsys.readouterr().err
