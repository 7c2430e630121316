"""klsweep.verl.stream: file-logger and Tune lines decoded, the file tail, one report per step."""

from __future__ import annotations

import json
import math

import pytest

from klsweep.verl.stream import MetricsTail, StepReports, decode_json_line, skip_reason


@pytest.mark.parametrize(
    "line,value",
    [
        (b'{"step":3,"data":{"actor/pg_loss":null}}', math.nan),  # orjson (verl's FileLogger)
        (b'{"step": 3, "data": {"actor/pg_loss": NaN}}', math.nan),  # Python json
        (b'{"step": 3, "data": {"actor/pg_loss": Infinity}}', math.inf),
        (b'{"step": 3, "data": {"actor/pg_loss": -Infinity}}', -math.inf),
    ],
)
def test_file_logger_lines_spell_non_finite_values_as_their_writers_do(line, value):
    record = decode_json_line(line)
    assert (record.format, record.step) == ("verl-jsonl", 3)
    got = record.metrics["actor/pg_loss"]
    assert math.isnan(got) if math.isnan(value) else got == value


@pytest.mark.parametrize(
    "line,last,unfinished,why",
    [
        ('{"step": 3, "data": {"a": 0.1', True, True, "truncated last line"),
        ('{"step": 3, "data": {"a": 0.', True, True, "truncated last line"),  # msgspec: malformed number
        ('{"step": 3, "data": {"a": 0.1', False, False, "truncated record mid-file"),
        ("garbage", True, True, "not JSON"),
        ('{"step": 3} trailing', False, False, "not JSON"),
        ('{"step": 3, "metrics": {}}', False, False, "JSON but not a verl record"),
    ],
)
def test_skip_reason(line, last, unfinished, why):
    with pytest.raises(ValueError) as refused:
        decode_json_line(line)
    assert skip_reason(line, refused.value, last, unfinished).startswith(why)


def test_an_unfinished_last_line_waits_for_its_end(tmp_path):
    """A line without its newline is not written yet, even when the process has ended (a writer's line can take more
    than one write; a killed writer leaves half a line): read once complete, never parsed half."""
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    line = json.dumps({"step": 1, "data": {"actor/kl_loss": 0.01, "actor/entropy": None}}).encode()
    with open(path, "wb", buffering=0) as f:
        f.write(line[:20])
        assert tail.read_new() == []
        assert tail.read_new() == []  # read again, as the tail does after the exit record
        f.write(line[20:] + b"\n")
        ((step, data),) = tail.read_new()
    assert step == 1 and data["actor/kl_loss"] == 0.01 and math.isnan(data["actor/entropy"])
    assert tail.lines == 1


def test_a_complete_line_that_is_not_a_record_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "data": {}}\n\n{"step": 2, "data": {"a\n')
    tail = MetricsTail(path)
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 3: not a verl file-logger record .*'\{\"step\": 2"):
        tail.read_new()
    (tmp_path / "other.jsonl").write_bytes(b'{"data": {"a": 1}}\n')
    with pytest.raises(ValueError, match="line 1: not a verl file-logger record"):
        MetricsTail(tmp_path / "other.jsonl").read_new()


def test_step_0_merges_into_step_1_and_older_steps_are_not_reported_again():
    seen: list[dict] = []
    steps = StepReports(seen.append)
    steps.line(0, {"val": 0.25, "a": 1.0})
    steps.line(1, {"a": 2.0})
    steps.line(1, {"a": 3.0})  # a retry resumed from an older checkpoint logs step 1 again
    steps.line(0, {"val": 0.5})  # after step 1 a step-0 line is a repeat
    steps.finish()
    assert seen == [{"val": 0.25, "a": 2.0, "step": 1}]
    only_validation: list[dict] = []
    steps = StepReports(only_validation.append)
    steps.line(0, {"val": 0.25})
    steps.finish()
    assert only_validation == [{"val": 0.25, "step": 0}]
