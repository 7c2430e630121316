"""`sweep health check` on public logs of real verl runs (tests/data/traces), its exit codes and JSON output."""

from __future__ import annotations

import json
import re

import pytest

from klsweep.cli import main
from klsweep.health import load_ruleset
from klsweep.health.check import backtest
from klsweep.health.readers import read_trace
from tests.conftest import GRPO, NO_SIGNAL, PPO_CONSOLE, PPO_JSONL, trace
from tests.orchestrate import conftest as orchestrate_conftest


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


def _write_jsonl(path, rows):
    """A verl file-logger jsonl as verl writes it (orjson, one {"step", "data"} per line)."""
    import orjson

    path.write_bytes(b"".join(orjson.dumps({"step": s, "data": d}) + b"\n" for s, d in rows))
    return path


def test_a_log_no_rule_can_read_is_inconclusive_not_healthy(tmp_path, capsys):
    # metrics of another trainer's log (HF Trainer names): no rule or built-in check reads any of them
    log = _write_jsonl(
        tmp_path / "other.jsonl",
        [(s, {"train/loss": 1.2 - 0.01 * s, "train/lr": 1e-6, "eval/accuracy": 0.3 + 0.002 * s}) for s in range(1, 41)],
    )
    assert main(["health", "check", str(log), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "inconclusive" and out["judged"] == 0 and out["stop_judged"] == 0
    # every rule and check was listed as not applicable by the engine: the total counts exactly those
    assert out["total"] == len(out["not_applicable"]) > len(load_ruleset("default").rules)
    assert main(["health", "check", str(log)]) == 3
    text = capsys.readouterr().out
    counts = f"judged by 0 of {out['total']} rules and built-in checks (0 of the {out['stop_total']} that can stop"
    assert counts in text
    assert "verdict: INCONCLUSIVE" in text and "HEALTHY" not in text


def test_every_verdict_says_how_many_rules_judged_the_log(capsys):
    assert main(["health", "check", str(trace(GRPO)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "healthy" and out["kl_not_logged"] == []
    assert out["judged"] == out["total"] - len(out["not_applicable"]) > 0
    assert 0 < out["stop_judged"] <= out["judged"]
    assert main(["health", "check", str(trace(GRPO))]) == 0
    assert f"judged by {out['judged']} of {out['total']} rules and built-in checks" in capsys.readouterr().out


def test_a_warn_only_judgement_is_inconclusive(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "preset: none\n"
        "builtin: {nonfinite_loss: false}\n"
        "rules:\n"
        "  - {name: score_watch, metric: critic/score/mean, below: 0.5, action: warn}\n"
    )
    log = _write_jsonl(tmp_path / "score.jsonl", [(s, {"critic/score/mean": 0.1}) for s in (1, 2, 3)])
    assert main(["health", "check", str(log), "--rules", str(rules), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "inconclusive" and out["fired"]["score_watch"]["action"] == "warn"
    # the rule and builtin.nonfinite_metric (it read critic/score/mean, all finite) judged it; neither can stop
    assert set(out["judges"]) - set(out["not_applicable"]) == {"score_watch", "builtin.nonfinite_metric"}
    assert out["judges"]["builtin.nonfinite_metric"] == "warn"
    assert out["judged"] == 2 and out["stop_judged"] == 0


def test_kl_on_in_the_run_config_without_a_kl_metric_is_said(tmp_path, capsys):
    # a Ray Tune progress.csv whose config turns the KL loss on, while the log has no actor/kl_loss
    progress = tmp_path / "progress.csv"
    progress.write_text(
        "actor/pg_loss,actor/entropy,critic/score/mean,training_iteration,config/actor_rollout_ref/actor/use_kl_loss\n"
        + "".join(f"0.01,0.5,0.4,{s},True\n" for s in range(1, 6))
    )
    assert main(["health", "check", str(progress)]) == 0
    out = capsys.readouterr().out
    assert "note: the run's config sets actor_rollout_ref.actor.use_kl_loss=True but the log has no actor/kl_loss" \
        in out
    progress.write_text(progress.read_text().replace("True", "False"))
    assert main(["health", "check", str(progress), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kl_not_logged"] == []


def _wandb_export(path):
    """A W&B chart export ("Export CSV") of two runs in its real column shape: "Step", then per run and metric
    "<run> - <metric>", "__MIN", "__MAX", every cell quoted; run t07's losses go NaN at step 12, t03 stays finite."""
    import csv

    runs, metrics = ("sweep-a-t03", "sweep-a-t07"), ("actor/pg_loss", "actor/kl_loss", "critic/score/mean")
    header = ["Step"] + [f"{r} - {m}{suffix}" for r in runs for m in metrics for suffix in ("", "__MIN", "__MAX")]
    with path.open("w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(header)
        for step in range(1, 21):
            row = [step]
            for run in runs:
                nan = run.endswith("t07") and step >= 12
                for value in ("NaN" if nan else 0.01, "NaN" if nan else 0.001 * step, 0.3 + 0.01 * step):
                    row += [value] * 3
            writer.writerow(row)
    return path


def test_a_wandb_export_of_two_runs_asks_for_run_and_judges_each_alone(tmp_path, capsys):
    path = _wandb_export(tmp_path / "wandb_export.csv")
    assert main(["health", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "holds 2 runs (sweep-a-t03, sweep-a-t07)" in err and "--run NAME" in err
    assert main(["health", "check", str(path), "--run", "sweep-a-t07", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["run"], out["stop_kind"], out["stop_step"]) == ("sweep-a-t07", "nonfinite", 12)
    assert out["reports"] == 20
    assert main(["health", "check", str(path), "--run", "sweep-a-t03"]) == 0
    assert "wandb_export.csv (run sweep-a-t03): csv, 20 reports (steps 1-20)" in capsys.readouterr().out
    assert main(["health", "check", str(path), "--run", "t99"]) == 2
    assert "its runs: sweep-a-t03, sweep-a-t07" in capsys.readouterr().err


#: A finished real sweep (tests/orchestrate/conftest.py): embedded PPO trials of 4 steps, validation at steps 2 and 4.
pareto_run = orchestrate_conftest.pareto_run


@pytest.mark.slow
def test_a_tune_progress_csv_is_judged_from_the_result_json_beside_it(pareto_run, tmp_path, capsys):
    # Ray Tune writes progress.csv's header from a trial's first report: the validation metric, first reported at
    # step 2, has no column in it; result.json holds every report whole
    val = orchestrate_conftest.VAL
    trial = sorted(p.parent for p in (pareto_run / "tune").glob("*/result.json"))[0]
    header = (trial / "progress.csv").read_text().splitlines()[0].split(",")
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert val not in header and [r["training_iteration"] for r in rows if val in r][0] == 2
    rules = tmp_path / "rules.yaml"
    rules.write_text("preset: default\nrules:\n"
                     "  - {name: val_low, metric: val_score, below: 2, action: stop, kind: diverged}\n")
    assert main(["health", "check", str(trial / "progress.csv"), "--rules", str(rules)]) == 1
    out, err = capsys.readouterr()
    assert "verdict: STOPPED: diverged at step 2 by val_low" in out
    assert f"reading {trial / 'result.json'}" in err
    # progress.csv alone: judged as it is, with a warning naming what the rules read that it lacks
    alone = tmp_path / "trial" / "progress.csv"
    alone.parent.mkdir()
    alone.write_text((trial / "progress.csv").read_text())
    assert main(["health", "check", str(alone), "--rules", str(rules), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["not_applicable"]["val_low"].startswith("val_score: never logged")
    assert "no result.json beside it" in err and "val_score (val-core/*/mean@N" in err
