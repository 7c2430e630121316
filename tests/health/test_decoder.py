"""One decoder of the metric stream: every writer's spelling of a non-finite value, written by the real
writers (verl 0.9.1's ``FileLogger``, orjson, Python's json, Ray Tune's result encoder, the csv module as Ray's CSV
logger uses it, a W&B export in its real column shape), read the same by ``sweep health check``, the ``replay`` trainer
and the live trial's metrics tail."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from klsweep.cli import main
from klsweep.errors import TraceReadError
from klsweep.health import load_ruleset
from klsweep.health.check import backtest
from klsweep.health.readers import read_trace
from klsweep.verl.stream import MetricsTail
from tests.conftest import NONFINITE, trace

#: Written by verl's own FileLogger with :func:`file_logger_log` (tests/data/README.md).


def file_logger_log(root, monkeypatch) -> object:
    """Write a 25-step GRPO-shaped metric stream with verl 0.9.1's ``verl.utils.tracking.FileLogger``, the way a verl
    run does: without ``VERL_FILE_LOGGER_PATH`` it writes ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``.
    From step 18 ``actor/pg_loss`` and ``actor/kl_loss`` are NaN and ``actor/grad_norm`` is inf (orjson writes all
    three as ``null``). Validation every 5 steps. Returns the file's path."""
    from verl.utils.tracking import FileLogger

    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(root))
    logger = FileLogger("klsweep", "nonfinite")
    for step in range(1, 26):
        broken = step >= 18
        data = {
            "actor/entropy": round(0.9 - 0.01 * step, 4),
            "actor/pg_loss": math.nan if broken else round(0.01 - 0.001 * step, 4),
            "actor/kl_loss": np.float32("nan") if broken else round(0.002 * step, 4),
            "actor/grad_norm": math.inf if broken else 0.4,
            "critic/score/mean": round(0.2 + 0.01 * step, 4),
            "critic/score/max": 1.0,
            "critic/score/min": 0.0,
            "response_length/mean": 140.0 + step % 3,
        }
        if step % 5 == 0:
            data["val-core/openai/gsm8k/reward/mean@1"] = round(0.3 + 0.01 * step, 4)
        logger.log(data, step=step)
    logger.finish()
    return root / "klsweep" / "nonfinite.jsonl"


def test_the_stored_trace_is_what_verls_file_logger_writes(tmp_path, monkeypatch):
    path = file_logger_log(tmp_path, monkeypatch)
    assert path.read_bytes() == trace(NONFINITE).read_bytes()
    line18 = path.read_bytes().splitlines()[17]
    assert b'"actor/pg_loss":null' in line18 and b'"actor/grad_norm":null' in line18


def test_health_check_stops_the_file_logger_run_at_step_18_as_non_finite(capsys):
    t = read_trace(trace(NONFINITE))
    assert t.format == "verl-jsonl" and [s for s, _ in t.reports] == list(range(1, 26))
    assert math.isnan(t.reports[17][1]["actor/grad_norm"]) and t.reports[16][1]["actor/grad_norm"] == 0.4
    _, summary = backtest(t, load_ruleset("default"))
    assert (summary["verdict"], summary["stop_kind"], summary["stop_step"]) == ("stopped", "nonfinite", 18)
    assert summary["reason"]["rule"] == "builtin.nonfinite_loss"
    assert main(["health", "check", str(trace(NONFINITE))]) == 1
    assert "verdict: STOPPED: nonfinite at step 18" in capsys.readouterr().out


def test_the_live_tail_and_the_log_readers_decode_every_line_alike(tmp_path):
    """The live trial path reads the file logger's bytes as `health check` and `replay` do: one decoder."""
    tail = MetricsTail(tmp_path / "metrics.jsonl")
    lines = trace(NONFINITE).read_bytes() + json.dumps({"step": 26, "data": {"actor/pg_loss": -math.inf}}).encode()
    tail.path.write_bytes(lines + b"\n")
    (tmp_path / "log.jsonl").write_bytes(lines + b"\n")
    live = tail.read_new()
    read = read_trace(tmp_path / "log.jsonl").reports
    assert [s for s, _ in live] == [s for s, _ in read] == list(range(1, 27))
    assert repr(live) == repr(read)  # NaN != NaN: compare the spelled-out values
    assert live[-1][1] == {"actor/pg_loss": -math.inf}  # Python json's -Infinity


def test_tune_result_json_non_finite_as_rays_encoder_writes_it(tmp_path):
    # Ray Tune's JsonLoggerCallback writes each result with json.dump(result, cls=SafeFallbackEncoder): a Python
    # float NaN as NaN, a numpy NaN as the *string* "null" (its nan_str), a numpy inf as Infinity.
    from ray.tune.utils.util import SafeFallbackEncoder

    results = [
        {"actor/pg_loss": 0.01, "actor/grad_norm": 0.4, "training_iteration": 1, "step": 1},
        {"actor/pg_loss": np.float32("nan"), "actor/grad_norm": np.float32("inf"), "training_iteration": 2, "step": 2},
        {"actor/pg_loss": math.nan, "note": "text", "training_iteration": 3, "step": 3},
    ]
    path = tmp_path / "result.json"
    path.write_text("".join(json.dumps(r, cls=SafeFallbackEncoder) + "\n" for r in results))
    assert '"actor/pg_loss": "null"' in path.read_text()
    t = read_trace(path)
    assert t.format == "tune-result-json"
    (_, first), (_, second), (_, third) = t.reports
    assert first["actor/pg_loss"] == 0.01
    assert math.isnan(second["actor/pg_loss"]) and second["actor/grad_norm"] == math.inf
    assert math.isnan(third["actor/pg_loss"]) and third["note"] == "text"
    _, summary = backtest(t, load_ruleset("default"))
    assert (summary["stop_kind"], summary["stop_step"]) == ("nonfinite", 2)


def test_text_spellings_in_csv_and_an_empty_cell_stays_not_logged(tmp_path):
    import csv

    # Ray Tune's CSVLoggerCallback writes rows with csv.DictWriter: str(nan) == "nan", str(np.float32(inf)) == "inf"
    path = tmp_path / "progress.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["actor/pg_loss", "actor/grad_norm", "training_iteration"])
        writer.writeheader()
        writer.writerow({"actor/pg_loss": 0.01, "actor/grad_norm": "", "training_iteration": 1})
        writer.writerow({"actor/pg_loss": math.nan, "actor/grad_norm": np.float32("-inf"), "training_iteration": 2})
    assert path.read_text().splitlines()[1:] == ["0.01,,1", "nan,-inf,2"]
    (_, first), (_, second) = read_trace(path).reports
    assert first == {"actor/pg_loss": 0.01}  # the empty cell is not a value
    assert math.isnan(second["actor/pg_loss"]) and second["actor/grad_norm"] == -math.inf


# A W&B chart export ("Download CSV"): "Step", then per run "<run name> - <metric>" with "__MIN"/"__MAX" columns
# (the sampled range of each point), quoted cells, NaN/Infinity spelled as JavaScript prints them; a run that did not
# log a step has empty cells there.
WANDB_TWO_RUNS = (
    '"Step","sweep-a-t03 - actor/pg_loss","sweep-a-t03 - actor/pg_loss__MIN","sweep-a-t03 - actor/pg_loss__MAX",'
    '"sweep-a-t07 - actor/pg_loss","sweep-a-t07 - actor/pg_loss__MIN","sweep-a-t07 - actor/pg_loss__MAX"\n'
    '"1","0.01","0.01","0.01","0.02","0.02","0.02"\n'
    '"2","0.01","0.01","0.01","NaN","NaN","NaN"\n'
    '"3","0.01","0.01","0.01","Infinity","Infinity","Infinity"\n'
    '"4","0.01","0.01","0.01","","",""\n'
)


def test_a_wandb_export_of_several_runs_is_read_one_run_at_a_time(tmp_path):
    path = tmp_path / "wandb_export.csv"
    path.write_text(WANDB_TWO_RUNS)
    with pytest.raises(TraceReadError, match=r"holds 2 runs \(sweep-a-t03, sweep-a-t07\).*--run NAME"):
        read_trace(path)
    t07 = read_trace(path, run="sweep-a-t07")
    assert t07.runs == ["sweep-a-t03", "sweep-a-t07"] and t07.run == "sweep-a-t07"
    assert [s for s, _ in t07.reports] == [1, 2, 3]  # step 4: empty cells, not logged by this run
    assert t07.reports[0][1] == {"actor/pg_loss": 0.02}  # __MIN/__MAX are not metrics of their own
    assert math.isnan(t07.reports[1][1]["actor/pg_loss"]) and t07.reports[2][1]["actor/pg_loss"] == math.inf
    t03 = read_trace(path, run="sweep-a-t03")
    assert t03.reports == [(s, {"actor/pg_loss": 0.01}) for s in (1, 2, 3, 4)]
    with pytest.raises(TraceReadError, match=r"--run 't99' is not a run of .*its runs: sweep-a-t03, sweep-a-t07"):
        read_trace(path, run="t99")
    with pytest.raises(TraceReadError, match="one unnamed run"):
        read_trace(trace(NONFINITE), run="sweep-a-t03")


def test_console_lines_printed_by_verls_console_logger(tmp_path, capsys):
    # verl 0.9.1's console backend (verl/utils/logger/aggregate_logger.py LocalLogger): "step:N - key:pformat(value)",
    # so numpy 2 scalars print as np.float32(nan); a Ray worker prefixes the line with "(TaskRunner pid=...)"
    from verl.utils.logger.aggregate_logger import LocalLogger

    logger = LocalLogger()
    logger.log({"actor/pg_loss": 0.5, "actor/grad_norm": np.float32(0.25)}, step=1)
    logger.log({"actor/pg_loss": math.nan, "actor/grad_norm": np.float32("inf"), "actor/kl_loss": np.float64("-inf")},
               step=2)
    printed = capsys.readouterr().out
    assert "actor/grad_norm:np.float32(inf)" in printed
    log = tmp_path / "console.log"
    log.write_text("".join(f"(TaskRunner pid=7) {line}\n" for line in printed.splitlines()))
    (_, first), (_, second) = read_trace(log).reports
    assert first == {"actor/pg_loss": 0.5, "actor/grad_norm": 0.25}
    assert math.isnan(second["actor/pg_loss"]) and second["actor/grad_norm"] == math.inf
    assert second["actor/kl_loss"] == -math.inf
    _, summary = backtest(read_trace(log), load_ruleset("default"))
    assert (summary["stop_kind"], summary["stop_step"]) == ("nonfinite", 2)
