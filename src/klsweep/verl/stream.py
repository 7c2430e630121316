"""verl's metric stream: its JSON lines decoded, the tail of a growing file-logger jsonl, one report per step.

verl's file logger (``verl.utils.tracking.FileLogger``, ``$VERL_FILE_LOGGER_PATH``) writes one
``{"step": N, "data": {...}}`` per line. A Ray Tune ``result.json`` holds one result dict per line with
``training_iteration``. :func:`decode_json_line` reads both. ``sweep health check``, the ``replay`` trainer
(:mod:`klsweep.health.readers`) and live ``trainer: verl`` trials (:class:`MetricsTail`) decode every line with it.

Non-finite values in these lines, as each writer spells them:

- verl 0.9.1 ``FileLogger.log`` (``verl/utils/tracking.py``) writes with ``orjson``: NaN, inf and -inf become
  ``null``. A ``null`` metric in a file-logger line is NaN (the sign is lost), not a metric left out.
- Python's ``json`` (a file-logger jsonl written by other tools; Ray Tune's ``result.json`` for Python floats):
  ``NaN``, ``Infinity``, ``-Infinity``.
- Ray Tune's ``SafeFallbackEncoder`` (``ray/air/_internal/json.py``) writes a numpy NaN as the *string* ``"null"``.
  In a ``result.json`` metric, that string and the ``"nan"``/``"inf"`` strings are non-finite. A JSON ``null`` there
  is a value reported as None, not logged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from klsweep.verl.metrics import flat_verl_config

_MSGSPEC = msgspec.json.Decoder()


class JsonRecord(NamedTuple):
    """One decoded JSON line of a metric stream.

    Attributes:
        format: ``verl-jsonl`` (a file-logger line) or ``tune-result-json`` (a Ray Tune result).
        step: the training step (Tune: ``step``, else ``training_iteration``); None when the line has no integer one.
        metrics: metric name → value, non-finite values as floats (see the module docstring); a Tune result keeps its
            other keys (``config``, ``training_iteration``, ...), which the rules ignore.
        config: a Tune result's flat verl overrides (from its ``config``), else None.
    """

    format: str
    step: int | None
    metrics: dict[str, Any]
    config: dict[str, Any] | None


class NotARecord(ValueError):
    """A JSON line that is neither a verl file-logger record nor a Ray Tune result."""


def decode_json_line(line: str | bytes) -> JsonRecord:
    """Decode one line of a verl file-logger jsonl or a Ray Tune ``result.json``.

    Decodes with msgspec; a line with Python json's ``NaN``/``Infinity`` (not strict JSON) falls back to json.

    Raises:
        ValueError: the line is not JSON, or (:class:`NotARecord`) not a ``{"step": N, "data": {...}}`` record nor a
            Tune result (a dict with ``training_iteration``).
    """
    try:
        obj = _MSGSPEC.decode(line)
    except msgspec.DecodeError:
        obj = json.loads(line)  # json.JSONDecodeError is a ValueError
    if isinstance(obj, dict) and isinstance(obj.get("data"), dict):
        return JsonRecord("verl-jsonl", step_number(obj.get("step")), _nulls_as_nan(obj["data"]), None)
    if isinstance(obj, dict) and "training_iteration" in obj:
        config = None
        if isinstance(obj.get("config"), dict):
            config = flat_verl_config(obj["config"]) or None
        step = step_number(obj.get("step", obj.get("training_iteration")))
        return JsonRecord("tune-result-json", step, _tune_nonfinite(obj), config)
    raise NotARecord('neither a verl file-logger record {"step": N, "data": {...}} nor a Ray Tune result')


def skip_reason(line: str, error: ValueError, last: bool, unfinished: bool = False) -> str:
    """Why :func:`decode_json_line` refused ``line``, in words: ``truncated ...`` for a record cut short,
    ``not JSON``, or ``JSON but not a verl record``.

    Args:
        line: the refused line.
        error: what :func:`decode_json_line` raised for it.
        last: it is the file's last non-empty line.
        unfinished: the file does not end with a newline after it.

    A record is cut short when msgspec reports the input truncated, or when it is an unfinished last line that opens
    like one (``{``). verl's ``FileLogger`` writes each record with its newline. A cut last line is thus a write
    still under way (the run is running) or one a kill interrupted.
    """
    if isinstance(error, NotARecord):
        return "JSON but not a verl record"
    truncated = unfinished and line.startswith("{")
    if not truncated:
        try:
            _MSGSPEC.decode(line)
        except msgspec.DecodeError as e:
            truncated = "truncated" in str(e)
    if not truncated:
        return "not JSON"
    if last:
        return "truncated last line: a verl run still writing, or killed mid-write, leaves one"
    return "truncated record mid-file: a run killed mid-write and resumed into the same file leaves one"


def step_number(value: Any) -> int | None:
    """A logged step as an int: an int, or a finite float with no fraction; None for anything else (bools too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _nulls_as_nan(data: dict[str, Any]) -> dict[str, Any]:
    """A ``null`` in a verl file-logger line is orjson's NaN/inf/-inf; NaN stands for all three (every health rule
    reads it as non-finite)."""
    if None not in data.values():
        return data
    return {k: math.nan if v is None else v for k, v in data.items()}


def _tune_nonfinite(result: dict[str, Any]) -> dict[str, Any]:
    """Ray's ``SafeFallbackEncoder`` writes a numpy NaN as the string ``"null"``; strings that spell a non-finite
    number become that float. Other strings stay strings."""
    out = result
    for key, value in result.items():
        if isinstance(value, str) and (number := _nonfinite_text(value)) is not None:
            if out is result:
                out = dict(result)
            out[key] = number
    return out


def _nonfinite_text(text: str) -> float | None:
    lowered = text.strip().lower()
    if lowered == "null":
        return math.nan
    try:
        value = float(lowered)
    except ValueError:
        return None
    return None if math.isfinite(value) else value


class MetricsTail:
    """Reads the complete lines appended to verl's file-logger jsonl since the last call.

    A last line without its newline is not written yet: a writer's line can reach the file in more than one write,
    and a process killed mid-write leaves half a line. Such a line is kept until its newline comes, and never
    parsed.

    Attributes:
        path: the file-logger jsonl.
        lines: how many records were read so far.
    """

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""
        self._line_number = 0  # complete lines read so far, blank ones included
        self.lines = 0

    def read_new(self) -> list[tuple[int, dict[str, Any]]]:
        """``[(step, data), ...]`` of the lines completed since the last call, each decoded by
        :func:`decode_json_line` (a ``null`` comes back as NaN); ``[]`` while the file does not exist.

        Raises:
            ValueError: a complete line is not a file-logger record ``{"step": N, "data": {...}}`` (the message names
                the file and line).
        """
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        out = []
        for line in lines:
            self._line_number += 1
            if not line.strip():
                continue
            try:
                record = decode_json_line(line)
                if record.format != "verl-jsonl" or record.step is None:
                    raise ValueError('not {"step": N, "data": {...}} with an integer step')
                out.append((record.step, record.metrics))
            except ValueError as e:
                raise ValueError(
                    f"{self.path}, line {self._line_number}: not a verl file-logger record ({type(e).__name__}: {e}): "
                    f"{line[:200]!r}"
                ) from None
        self.lines += len(out)
        return out


class StepReports:
    """verl's file-logger lines → one report per training step, each step once and in order.

    verl logs validation before training as step 0 (``verl/trainer/ppo/v1/trainer_base.py``). That line is merged
    into step 1's report, step 1's own values winning. A step at or before the last one reported is not reported
    again (a retry resumed from an older checkpoint logs it again).

    Args:
        report: called with ``data | {"step": N}`` once per reported step.
        last_step: the last training step already reported (by an earlier attempt); 0 for none.
    """

    def __init__(self, report: Callable[[dict[str, Any]], Any], last_step: int = 0):
        self._report = report
        self.last_step = last_step
        self._before_training: dict[str, Any] | None = None  # step 0's data, until step 1 comes

    def line(self, step: int, data: dict[str, Any]) -> None:
        """Take one file-logger line: its step and its data."""
        if step == 0:  # a retry that starts afresh logs step 0 again
            if self.last_step == 0:  # after training steps were reported it is a repeat, and no step 1 follows
                self._before_training = data
        elif step > self.last_step:
            merged = (self._before_training or {}) | data
            self._before_training = None
            self._report(merged | {"step": step})
            self.last_step = step

    def finish(self) -> None:
        """The run ended cleanly: a step-0 line that no step followed (``trainer.val_only``) is reported alone."""
        if self._before_training is not None:
            data, self._before_training = self._before_training, None
            self._report(data | {"step": 0})
