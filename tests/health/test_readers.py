"""Log readers: verl console logs, verl jsonl, W&B CSV exports, Ray Tune progress.csv / result.json."""

from __future__ import annotations

import json
import math

import pytest

from klsweep.errors import TraceReadError
from klsweep.health import load_ruleset
from klsweep.health.check import backtest
from klsweep.health.readers import parse_value, read_trace
from tests.conftest import GRPO, PPO_CONSOLE, trace


def test_console_log_reads_all_435_steps_of_the_ppo_baseline():
    t = read_trace(trace(PPO_CONSOLE))
    assert t.format == "verl-console" and t.rounded
    assert [s for s, _ in t.reports] == list(range(435))
    first = t.reports[0][1]
    assert first["critic/kl"] == 0.0 and first["actor/entropy_loss"] == 0.526 and first["critic/lr(1e-4)"] == 0.1
    assert t.reports[9][1]["val/test_score/openai/gsm8k"] == 0.013


def test_console_line_with_ansi_numpy_values_and_nan(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "some header\n"
        "\x1b[36m(TaskRunner pid=1)\x1b[0m step:1 - actor/kl_loss:np.float32(0.012) - actor/entropy:0.500 - "
        "actor/grad_norm:nan - critic/score/mean:np.float64(-0.25) - training/epoch:0\n"
        "a generation that mentions step:2 but is not a metric line\n"
        "step:2 - actor/kl_loss:0.013 - actor/pg_loss:inf\n"
    )
    t = read_trace(log)
    assert [s for s, _ in t.reports] == [1, 2]
    m1 = t.reports[0][1]
    assert m1["actor/kl_loss"] == 0.012 and m1["critic/score/mean"] == -0.25 and math.isnan(m1["actor/grad_norm"])
    assert t.reports[1][1]["actor/pg_loss"] == math.inf
    assert t.rounded
    log.write_text("step:1 - actor/kl_loss:np.float32(0.0123456)\n")  # numpy 2 repr at full precision
    assert not read_trace(log).rounded


@pytest.mark.parametrize(
    "text,value",
    [("0.125", 0.125), ("np.float32(0.5)", 0.5), ("tensor(2.0)", 2.0), ("-inf", -math.inf), ("abc", "abc")],
)
def test_parse_value(text, value):
    assert parse_value(text) == value


def test_jsonl_full_precision_is_not_rounded_and_bad_lines_are_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    rows = [{"step": s, "data": {"actor/kl_loss": 0.0123456789 * s}} for s in (1, 2)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 3, "da')
    t = read_trace(path)
    assert t.format == "verl-jsonl" and not t.rounded and t.skipped == 1
    assert t.reports == [(1, rows[0]["data"]), (2, rows[1]["data"])]
    assert read_trace(trace(GRPO)).rounded  # converted from 3-decimal console lines


def test_wandb_csv_export(tmp_path):
    path = tmp_path / "wandb_export.csv"
    path.write_text(
        'Step,"run-7 - actor/kl_loss","run-7 - actor/kl_loss__MIN","run-7 - actor/kl_loss__MAX",'
        '"run-7 - actor/entropy"\n'
        "1,0.01234,0.01,0.02,0.5\n"
        "2,,,,0.45\n"
    )
    t = read_trace(path)
    assert t.reports == [(1, {"actor/kl_loss": 0.01234, "actor/entropy": 0.5}), (2, {"actor/entropy": 0.45})]


def test_tune_progress_csv_and_result_json_give_metrics_and_run_config(tmp_path):
    progress = tmp_path / "progress.csv"
    progress.write_text(
        "actor/kl_loss,training_iteration,config/actor_rollout_ref/actor/use_kl_loss,config/seed\n"
        "0.01,1,True,3\n0.02,2,True,3\n"
    )
    t = read_trace(progress)
    assert t.reports == [(1, {"actor/kl_loss": 0.01}), (2, {"actor/kl_loss": 0.02})]
    assert t.config == {"actor_rollout_ref.actor.use_kl_loss": True}
    result = tmp_path / "result.json"
    rows = [
        {
            "actor/kl_loss": 0.01 * i,
            "training_iteration": i,
            "step": i + 10,
            "config": {"actor_rollout_ref.actor.use_kl_loss": True, "lr": 1},
        }
        for i in (1, 2)
    ]
    result.write_text("\n".join(json.dumps(r) for r in rows))
    t = read_trace(result)
    assert t.format == "tune-result-json" and [s for s, _ in t.reports] == [11, 12]
    assert t.config == {"actor_rollout_ref.actor.use_kl_loss": True}


def test_unreadable_inputs_raise_trace_read_error(tmp_path):
    with pytest.raises(TraceReadError, match="cannot read trace"):
        read_trace(tmp_path / "missing.log")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceReadError, match="no training steps found"):
        read_trace(empty)
    (tmp_path / "dir.log").mkdir()
    with pytest.raises(TraceReadError):
        read_trace(tmp_path / "dir.log")


def test_jsonl_with_nan_and_infinity_as_pythons_json_writes_them(tmp_path):
    path = tmp_path / "run.jsonl"
    rows = [
        {"step": 1, "data": {"actor/grad_norm": math.nan, "actor/pg_loss": 0.5}},
        {"step": 2, "data": {"actor/pg_loss": -math.inf}},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))  # json.dumps writes NaN / -Infinity
    t = read_trace(path)
    assert math.isnan(t.reports[0][1]["actor/grad_norm"]) and t.reports[1][1]["actor/pg_loss"] == -math.inf


def test_nan_and_infinity_written_by_verls_own_file_logger_are_non_finite(tmp_path, monkeypatch):
    # verl 0.9.1's FileLogger writes with orjson, which spells NaN, inf and -inf as null
    from verl.utils.tracking import FileLogger

    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("p", "e")
    logger.log({"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}, step=1)
    logger.log({"actor/pg_loss": math.nan, "actor/grad_norm": math.inf, "actor/kl_loss": -math.inf}, step=2)
    logger.finish()
    assert b"null" in path.read_bytes()
    (_, first), (_, second) = read_trace(path).reports
    assert first == {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0}
    assert set(second) == {"actor/pg_loss", "actor/grad_norm", "actor/kl_loss"}
    assert all(math.isnan(v) for v in second.values())

    _, summary = backtest(read_trace(path), load_ruleset("default"))
    assert summary["verdict"] == "stopped" and summary["stop_step"] == 2 and "nonfinite" in summary["stop_reason"]


def test_a_tune_trial_directory_names_the_log_to_give(tmp_path):
    trial = tmp_path / "run_trial_1"
    trial.mkdir()
    with pytest.raises(TraceReadError) as e:
        read_trace(trial)
    assert str(e.value) == f"cannot read trace {trial}: it is a directory; give a log file, not a directory"
    (trial / "progress.csv").write_text("training_iteration,time_total_s\n1,1.0\n")
    (trial / "result.json").write_text('{"training_iteration": 1, "time_total_s": 1.0}\n')
    with pytest.raises(TraceReadError) as e:
        read_trace(trial)
    assert str(e.value) == f"cannot read trace {trial}: it is a directory; give its log: {trial / 'result.json'}"
