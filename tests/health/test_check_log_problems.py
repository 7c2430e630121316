"""`sweep health check` on hand-written verl file-logger logs with the problems a killed or broken run leaves: lines
that are not records (a truncated last line, a non-JSON line), and metrics written as `null` (verl 0.9.1's
``FileLogger`` writes NaN and ±inf with orjson, which spells them `null`)."""

from __future__ import annotations

import json
import math

import orjson

from klsweep.cli import main
from klsweep.health import HealthEngine, load_ruleset
from klsweep.health.readers import read_trace


def _data(step: int) -> dict[str, float]:
    """A healthy GRPO-shaped report (KL in the loss, every metric the default preset reads but validation)."""
    return {
        "actor/pg_loss": 0.01,
        "actor/kl_loss": 0.001 * step,
        "actor/entropy": 0.5,
        "actor/grad_norm": 0.3,
        "critic/score/mean": 0.1 + 0.01 * step,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/advantages/max": 1.2,
        "critic/advantages/min": -1.1,
        "response_length/mean": 200.0,
    }


def _lines(rows) -> list[bytes]:
    """File-logger lines as verl 0.9.1 writes them: ``orjson.dumps({"step", "data"})`` (NaN/inf → null)."""
    return [orjson.dumps({"step": step, "data": data}) for step, data in rows]


def _check(capsys, path, *args) -> tuple[int, str]:
    code = main(["health", "check", str(path), *args])
    return code, capsys.readouterr().out


def test_a_truncated_last_line_and_a_non_json_line_are_named_in_the_text(tmp_path, capsys):
    lines = _lines((s, _data(s)) for s in range(1, 31))
    # line 11 is not JSON; the last line (32) is a record cut mid-write, with no newline after it
    text = b"\n".join([*lines[:10], b"Traceback (most recent call last):", *lines[10:]]) + b"\n" + lines[-1][:40]
    log = tmp_path / "run.jsonl"
    log.write_bytes(text)
    assert len(text.splitlines()) == 32 and not text.endswith(b"\n")
    code, out = _check(capsys, log)
    assert code == 0 and "verdict: HEALTHY" in out
    assert (
        "skipped 2 lines, not read as reports: line 11 (not JSON), line 32 (truncated last line: a verl run still "
        "writing, or killed mid-write, leaves one)"
    ) in out
    _, out = _check(capsys, log, "--json")
    report = json.loads(out)
    assert report["skipped_lines"] == 2 and report["reports"] == 30
    assert [s["line"] for s in report["skipped"]] == [11, 32]


def test_only_the_first_skipped_lines_are_named_and_the_rest_counted(tmp_path, capsys):
    lines = _lines((s, _data(s)) for s in range(1, 11))
    bad = [b"{}", b"[1, 2]", b'"text"', b"{}", b"{}", b"{}", b"{}"]  # JSON, none of them a record
    log = tmp_path / "run.jsonl"
    log.write_bytes(b"\n".join([*lines, *bad]) + b"\n")
    _, out = _check(capsys, log)
    names = ", ".join(f"line {n} (JSON but not a verl record)" for n in range(11, 16))
    assert f"skipped 7 lines, not read as reports: {names} and 2 more (--json lists them all)" in out
    _, out = _check(capsys, log, "--json")
    assert [s["line"] for s in json.loads(out)["skipped"]] == list(range(11, 18))


def _null_score_log(tmp_path):
    rows = []
    for step in range(1, 31):
        data = _data(step)
        if step >= 10:
            data["critic/score/mean"] = math.nan  # orjson writes null
        rows.append((step, data))
    log = tmp_path / "run.jsonl"
    log.write_bytes(b"\n".join(_lines(rows)) + b"\n")
    return log


def test_a_null_score_is_a_warning_naming_its_steps_not_a_gap(tmp_path, capsys):
    log = _null_score_log(tmp_path)
    nulls = [json.loads(line)["step"] for line in log.read_text().splitlines() if '"critic/score/mean":null' in line]
    assert nulls == list(range(10, 31))
    code, out = _check(capsys, log, "--json")
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "warned"
    [span] = [s for s in report["timeline"] if s["rule"] == "builtin.nonfinite_metric"]
    assert (span["action"], span["first_step"], span["last_step"], span["reports"]) == ("warn", 10, 30, 21)
    assert span["values"] == {"critic/score/mean": "nan"}
    assert report["judges"]["builtin.nonfinite_metric"] == "warn"  # it never stops a run
    # the rule that needs 20 steps of the score saw 9 finite ones and says where the other 21 went
    assert report["not_applicable"]["score_collapse"].endswith(
        "the run covered 9 with finite values (steps 1-9, 9 reports); critic/score/mean non-finite in 21 reports "
        "(steps 10-30): see builtin.nonfinite_metric"
    )
    code, out = _check(capsys, log)
    assert "steps 10-30      WARN   builtin.nonfinite_metric (nonfinite) x21: critic/score/mean = nan" in out
    assert "verdict: WARNED (not stopped): builtin.nonfinite_metric" in out


def test_a_nan_loss_stays_nonfinite_losses_stop_without_a_second_finding():
    engine = HealthEngine(load_ruleset("default"))
    for step in range(1, 4):
        data = _data(step)
        data["actor/kl_loss"] = math.nan
        verdict = engine.update(step, data)
    assert verdict.stop and verdict.reason.rule == "builtin.nonfinite_loss"
    assert [e.rule for e in verdict.events] == ["builtin.nonfinite_loss"]


def test_an_all_null_log_says_its_metrics_were_logged_non_finite_not_never_logged(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    log.write_bytes(b"\n".join(_lines((s, dict.fromkeys(_data(s), math.nan)) for s in range(1, 31))) + b"\n")
    assert not read_trace(log).rounded  # no value at all: nothing says it was printed with 3 decimals
    code, out = _check(capsys, log, "--json")
    report = json.loads(out)
    assert code == 1 and report["reason"]["rule"] == "builtin.nonfinite_loss" and report["stop_step"] == 1
    why = report["not_applicable"]
    every = "logged in 30 reports (steps 1-30), non-finite at every one (NaN or ±inf; null in verl's file logger)"
    assert why["kl_blowup"] == f"ref_kl: actor/kl_loss {every}: no value to judge"
    assert why["entropy_collapse"] == f"entropy: actor/entropy {every}: no value to judge"
    assert why["builtin.kl_explosion"] == f"actor/kl_loss {every}: no value to judge"
    assert why["builtin.no_signal"].startswith("logged, but never finite (looked for critic/advantages/max")
    # only the metrics the log lacks (validation, critic/rewards/mean, response_length/clip_ratio) are "never logged"
    assert {name for name, text in why.items() if "never logged" in text} == {
        "reward_hacking", "reward_variance", "truncation_high"}
    _, out = _check(capsys, log)
    assert "rounded" not in out.splitlines()[0]


def test_a_rule_whose_metrics_were_finite_only_apart_says_non_finite_not_missing(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "preset: none\n"
        "rules:\n"
        "  - name: both\n"
        "    all: [{metric: critic/score/mean, below: 0.05}, {metric: actor/entropy, below: 0.1}]\n"
        "    action: stop\n"
    )
    # entropy is finite at odd steps and null at even ones; the score is logged at even steps only
    rows = [
        (s, {"actor/entropy": 0.5} if s % 2 else {"actor/entropy": math.nan, "critic/score/mean": 0.2})
        for s in range(1, 11)
    ]
    log = tmp_path / "run.jsonl"
    log.write_bytes(b"\n".join(_lines(rows)) + b"\n")
    assert main(["health", "check", str(log), "--rules", str(rules), "--json"]) == 3  # nothing that stops judged
    report = json.loads(capsys.readouterr().out)
    assert report["not_applicable"]["both"] == (
        "critic/score/mean, actor/entropy were never finite in the same report "
        "(actor/entropy non-finite in 5 reports (steps 2-10))"
    )
