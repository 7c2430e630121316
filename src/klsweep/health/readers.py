"""Read training logs into (step, metrics) reports: verl file-logger jsonl, verl console logs, W&B CSV exports,
Ray Tune ``progress.csv`` / ``result.json``.

Formats, by content (then by file name):

- verl file logger (``VERL_FILE_LOGGER_PATH``): one ``{"step": N, "data": {...}}`` per line.
- Ray Tune ``result.json``: one result dict per line with ``training_iteration`` (and ``config``).
- verl console log: lines containing ``step:N - key:value - key:value ...``, possibly prefixed by Ray's
  ``(main_task pid=...)`` and ANSI colour codes, values possibly printed as ``np.float32(0.5)``; other lines
  (config dumps, sample generations) are skipped. Values are rounded to 3 decimals.
- CSV (Tune ``progress.csv`` or a W&B export): a step column (``step``, ``_step``, ``Step``, ``global_step``,
  ``training_iteration``); W&B's ``"<run> - metric"`` headers and ``__MIN``/``__MAX`` columns are handled (a W&B
  export holding several runs is read one run at a time: ``run=``); Tune's ``config/...`` columns give the run config.

This module is the one decoder of the metric stream: ``sweep health check``, the ``replay`` trainer and the live
``trainer: verl`` path (:class:`klsweep.launchers.process._MetricsTail`, one :func:`decode_json_line` per line) all
read through it. Non-finite values as each writer spells them:

- verl 0.9.1 ``FileLogger.log`` (``verl/utils/tracking.py``) writes with ``orjson``: NaN, inf and -inf become
  ``null``; a ``null`` metric in a file-logger line is NaN (the sign is lost), not a metric left out.
- Python's ``json`` (a file-logger jsonl written by other tools; Ray Tune's ``result.json`` for Python floats):
  ``NaN``, ``Infinity``, ``-Infinity``.
- Ray Tune's ``SafeFallbackEncoder`` (``ray/air/_internal/json.py``) writes a numpy NaN as the *string* ``"null"``:
  in a ``result.json`` metric that string, and ``"nan"``/``"inf"`` strings, are non-finite; a JSON ``null`` there is a
  value reported as None, not logged.
- Text (console lines, Tune ``progress.csv``, W&B CSV exports): ``nan``, ``inf``, ``-inf``, ``NaN``, ``Infinity``,
  ``-Infinity``, also wrapped (``np.float32(nan)``, ``tensor(nan)``). An empty CSV cell is "not logged".
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from klsweep.errors import TraceReadError
from klsweep.results import SWEEP_FILE, TUNE_DIR, SweepRecord
from klsweep.verl.metrics import flat_verl_config

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STEP_LINE = re.compile(r"(?:^|[\s\]])step:(\d+) - (.*)$")
_WRAPPED = re.compile(r"^(?:np\.)?(?:float\d*|int\d*|tensor)\((.*?)(?:,.*)?\)$")
_STEP_COLUMNS = ("step", "_step", "Step", "global_step", "training_iteration")
_MSGSPEC = msgspec.json.Decoder()
_DECIMALS = re.compile(r"\.(\d+)(?:[eE]|$)")


@dataclass
class Trace:
    """A log read into reports.

    Attributes:
        path: the file.
        format: ``verl-jsonl``, ``tune-result-json``, ``verl-console``, ``csv``.
        reports: (step, metrics) in file order; step None when the log has none.
        rounded: no value has more than 3 decimals (verl's console logger rounds; jsonl converted from console lines).
        config: the run's flat verl overrides when the log holds them (Tune), else None.
        skipped_lines: (1-based line number, why) of each of those lines, in file order (:func:`skip_reason`).
        runs: the run names of a W&B export (``"<run> - <metric>"`` headers), in column order; [] for other logs.
        run: the run whose reports these are (a W&B export), else None.
    """

    path: Path
    format: str
    reports: list[tuple[int | None, dict[str, Any]]] = field(default_factory=list)
    rounded: bool = False
    config: dict[str, Any] | None = None
    skipped_lines: list[tuple[int, str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    run: str | None = None

    @property
    def skipped(self) -> int:
        """How many lines could not be read as reports."""
        return len(self.skipped_lines)


def parse_value(text: str) -> float | str:
    """``"0.123"`` → 0.123, ``"np.float32(0.5)"`` → 0.5; ``"nan"``, ``"NaN"``, ``"inf"``, ``"-Infinity"`` (any case,
    also wrapped: ``"np.float32(nan)"``) → the non-finite float; anything else is returned as is."""
    text = text.strip()
    m = _WRAPPED.match(text)
    if m:
        text = m.group(1).strip()
    try:
        return float(text)
    except ValueError:
        return text


def read_trace(path: str | Path, run: str | None = None) -> Trace:
    """Read a training log.

    Args:
        path: the log (formats in the module docstring).
        run: the run to read from a W&B export holding several (``"<run> - <metric>"`` headers); None reads a log of
            one run.

    Raises:
        TraceReadError: missing or unreadable file, no step found in it (the message names the formats tried), a W&B
            export of several runs without ``run`` or ``run`` not among its runs (the message lists them).
    """
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise TraceReadError(f"cannot read trace {path}: {e.strerror or e}") from None
    first = text.lstrip()[:1]
    if path.suffix.lower() == ".csv":
        trace = _read_csv(path, text, run)
    else:
        if run is not None:
            _pick_run(path, [], run)
        trace = _read_json_lines(path, text) if first == "{" else _read_console(path, text)
    if not trace.reports:
        raise TraceReadError(
            f"no training steps found in {path} (read as {trace.format}): expected a verl file-logger jsonl "
            '({"step": N, "data": {...}} per line), a verl console log (step:N - key:value - ...), a W&B CSV export '
            "or a Ray Tune progress.csv/result.json"
        )
    trace.rounded = _looks_rounded(trace.reports)
    trace.config = _run_config(path, trace.config)
    return trace


def _run_config(path: Path, config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's verl overrides in full, or None where the log does not hold them.

    A Ray Tune log's config is the trial's searched parameters only. For a klsweep trial
    (``<run dir>/tune/<trial>/result.json`` or ``progress.csv``) the sweep's saved file completes it: the trial's
    overrides as the sweep ran them (:func:`klsweep.space.trial_overrides`). Elsewhere a config that does not say
    whether a KL mechanism is on is not used: verl's defaults for the missing keys would call the KL off and leave
    the KL rules idle on a run that logs its KL.
    """
    if not config:
        return None
    run_dir = path.parent.parent.parent
    if path.parent.parent.name == TUNE_DIR and (run_dir / SWEEP_FILE).is_file():
        from klsweep.errors import KlsweepError
        from klsweep.space import trial_overrides
        from klsweep.spec.schema import Sweep

        try:
            sweep = Sweep.model_validate(SweepRecord.read(run_dir).sweep)
            return trial_overrides(sweep, {k: v for k, v in config.items() if "." in k})  # verl keys, not remedies
        except (KlsweepError, ValueError, KeyError):
            pass  # a sweep file of another klsweep version: the log's own config, as for any Tune run
    if not {"actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward"} & config.keys():
        return None
    return config


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


def decode_json_line(line: str | bytes) -> JsonRecord:
    """Decode one line of a verl file-logger jsonl or a Ray Tune ``result.json``.

    msgspec (a klsweep dependency) is ~3x faster than json; lines with Python json's ``NaN``/``Infinity`` (not
    strict JSON) fall back to json.

    Raises:
        ValueError: the line is not JSON, or not a ``{"step": N, "data": {...}}`` record nor a Tune result
            (a dict with ``training_iteration``).
    """
    try:
        obj = _MSGSPEC.decode(line)
    except msgspec.DecodeError:
        obj = json.loads(line)  # json.JSONDecodeError is a ValueError
    if isinstance(obj, dict) and isinstance(obj.get("data"), dict):
        return JsonRecord("verl-jsonl", _int(obj.get("step")), _nulls_as_nan(obj["data"]), None)
    if isinstance(obj, dict) and "training_iteration" in obj:
        config = None
        if isinstance(obj.get("config"), dict):
            config = flat_verl_config(obj["config"]) or None
        step = _int(obj.get("step", obj.get("training_iteration")))
        return JsonRecord("tune-result-json", step, _tune_nonfinite(obj), config)
    raise NotARecord('neither a verl file-logger record {"step": N, "data": {...}} nor a Ray Tune result')


class NotARecord(ValueError):
    """A JSON line that is neither a verl file-logger record nor a Ray Tune result."""


def skip_reason(line: str, error: ValueError, last: bool, unfinished: bool = False) -> str:
    """Why :func:`decode_json_line` refused ``line``, in words: ``truncated ...`` for a record cut short,
    ``not JSON``, or ``JSON but not a verl record``.

    Args:
        line: the refused line.
        error: what :func:`decode_json_line` raised for it.
        last: it is the file's last non-empty line.
        unfinished: the file does not end with a newline after it.

    A record is cut short when msgspec reports the input truncated, or when it is an unfinished last line that opens
    like one (``{``). verl's ``FileLogger`` writes each record with its newline, so a cut last line is a write still
    under way (the run is running) or one a kill interrupted.
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


def _read_json_lines(path: Path, text: str) -> Trace:
    trace = Trace(path, "verl-jsonl")
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    unfinished = not text.endswith(("\n", "\r"))
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = decode_json_line(line)
        except ValueError as e:
            trace.skipped_lines.append((number, skip_reason(line, e, number == last, unfinished and number == last)))
            continue
        if record.format == "tune-result-json":
            trace.format = record.format
            if trace.config is None:
                trace.config = record.config
        trace.reports.append((record.step, record.metrics))
    return trace


def _read_console(path: Path, text: str) -> Trace:
    trace = Trace(path, "verl-console")
    for line in text.splitlines():
        if "step:" not in line:
            continue
        m = _STEP_LINE.search(_ANSI.sub("", line).rstrip())
        if not m:
            continue
        metrics: dict[str, Any] = {}
        for part in m.group(2).split(" - "):
            key, sep, value = part.rpartition(":")
            if sep and key.strip():
                metrics[key.strip()] = parse_value(value)
        trace.reports.append((int(m.group(1)), metrics))
    return trace


def _read_csv(path: Path, text: str, run: str | None) -> Trace:
    trace = Trace(path, "csv")
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        return trace
    runs, header = zip(*(_wandb_column(h) for h in rows[0]))
    trace.runs = list(dict.fromkeys(r for r in runs if r is not None))
    trace.run = _pick_run(path, trace.runs, run)
    step_col = next((header.index(c) for c in _STEP_COLUMNS if c in header), None)
    keep = [
        i for i, h in enumerate(header)
        if h and not h.endswith(("__MIN", "__MAX")) and i != step_col and runs[i] in (None, trace.run)
    ]
    config: dict[str, Any] = {}
    for row in rows[1:]:
        if not row:
            continue
        metrics: dict[str, Any] = {}
        for i in keep:
            if i < len(row) and row[i] != "":
                name = header[i]
                if name.startswith("config/"):
                    config.setdefault(name.removeprefix("config/").replace("/", "."), _scalar(row[i]))
                else:
                    metrics[name] = parse_value(row[i])
        if trace.runs and not metrics:
            continue  # a W&B export's row where this run logged nothing (another run's step)
        step = _int(parse_value(row[step_col])) if step_col is not None and step_col < len(row) else None
        trace.reports.append((step, metrics))
    trace.config = {k: v for k, v in config.items() if "." in k} or None
    return trace


def _wandb_column(header: str) -> tuple[str | None, str]:
    """W&B UI export headers are ``"<run name> - <metric>"`` (metric names never hold " - "): (run, metric);
    (None, header) for any other column."""
    run, sep, metric = header.rpartition(" - ")
    return (run.strip(), metric.strip()) if sep and run.strip() else (None, header.strip())


def _pick_run(path: Path, runs: list[str], run: str | None) -> str | None:
    """The run to read from a W&B export: ``run``, or its only run. A verdict is per run, never merged."""
    if run is None and len(runs) <= 1:
        return runs[0] if runs else None
    if run is not None and run in runs:
        return run
    names = ", ".join(runs) if runs else "none (it holds one unnamed run)"
    if run is None:
        raise TraceReadError(
            f"{path} holds {len(runs)} runs ({names}): a verdict is per run, never one for their merged metrics. "
            "Pick one with --run NAME (sweep health check), or export one run"
        )
    raise TraceReadError(f"--run {run!r} is not a run of {path}; its runs: {names}. Give one of them or drop --run")


def _scalar(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    value = parse_value(text)
    return value


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _looks_rounded(reports: list[tuple[int | None, dict[str, Any]]]) -> bool:
    """True when the first 50 reports that hold a finite non-integer float hold none with more than 3 decimals (a log
    converted from console lines); False when no report holds one (all NaN, integers: nothing says it was rounded)."""
    checked = 0
    for _, metrics in reports:
        fractional = False
        for value in metrics.values():
            if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
                m = _DECIMALS.search(repr(value))
                if m is None or len(m.group(1)) > 3 or "e" in repr(value).lower():
                    return False
                fractional = True
        checked += fractional
        if checked == 50:
            break
    return checked > 0
