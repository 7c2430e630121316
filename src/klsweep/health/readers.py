"""Read training logs into (step, metrics) reports: verl file-logger jsonl, verl console logs, W&B CSV exports,
Ray Tune ``progress.csv`` / ``result.json``.

Formats, by content (then by file name):

- verl file logger (``VERL_FILE_LOGGER_PATH``): one ``{"step": N, "data": {...}}`` per line.
- Ray Tune ``result.json``: one result dict per line with ``training_iteration`` (and ``config``).
- verl console log: lines containing ``step:N - key:value - key:value ...``, possibly prefixed by Ray's
  ``(main_task pid=...)`` and ANSI colour codes, values possibly printed as ``np.float32(0.5)``; other lines
  (config dumps, sample generations) are skipped. Values are rounded to 3 decimals.
- CSV (Tune ``progress.csv`` or a W&B export): a step column (``step``, ``_step``, ``Step``, ``global_step``,
  ``training_iteration``); W&B's ``"<run> - metric"`` headers and ``__MIN``/``__MAX`` columns are handled; Tune's
  ``config/...`` columns give the run config.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from klsweep.errors import TraceReadError
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
        skipped: lines that could not be parsed (e.g. a truncated last line).
    """

    path: Path
    format: str
    reports: list[tuple[int | None, dict[str, Any]]] = field(default_factory=list)
    rounded: bool = False
    config: dict[str, Any] | None = None
    skipped: int = 0


def parse_value(text: str) -> float | str:
    """``"0.123"`` → 0.123, ``"np.float32(0.5)"`` → 0.5, ``"nan"`` → nan; anything else is returned as is."""
    text = text.strip()
    m = _WRAPPED.match(text)
    if m:
        text = m.group(1).strip()
    try:
        return float(text)
    except ValueError:
        return text


def read_trace(path: str | Path) -> Trace:
    """Read a training log.

    Raises:
        TraceReadError: missing or unreadable file, or no step found in it (the message names the formats tried).
    """
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise TraceReadError(f"cannot read trace {path}: {e.strerror or e}") from None
    first = text.lstrip()[:1]
    if path.suffix.lower() == ".csv":
        trace = _read_csv(path, text)
    elif first == "{":
        trace = _read_json_lines(path, text)
    else:
        trace = _read_console(path, text)
    if not trace.reports:
        raise TraceReadError(
            f"no training steps found in {path} (read as {trace.format}): expected a verl file-logger jsonl "
            '({"step": N, "data": {...}} per line), a verl console log (step:N - key:value - ...), a W&B CSV export '
            "or a Ray Tune progress.csv/result.json"
        )
    trace.rounded = _looks_rounded(trace.reports)
    return trace


def _decode(line: str) -> Any:
    """One JSON line. msgspec (a klsweep dependency) is ~3x faster than json; verl's file logger writes NaN and
    Infinity as Python's json does (not strict JSON), which only json reads."""
    try:
        return _MSGSPEC.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)


def _nulls_as_nan(data: dict[str, Any]) -> dict[str, Any]:
    """verl 0.9.1's ``FileLogger.log`` (verl/utils/tracking.py) writes with ``orjson.dumps``, which writes NaN, inf
    and -inf as ``null``: in a verl file-logger line a ``null`` metric is a non-finite value (its sign is lost), not
    a metric left out. NaN stands for all three, which every health rule reads as non-finite."""
    if None not in data.values():
        return data
    return {k: math.nan if v is None else v for k, v in data.items()}


def _read_json_lines(path: Path, text: str) -> Trace:
    trace = Trace(path, "verl-jsonl")
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = _decode(line)
        except ValueError:  # json.JSONDecodeError is a ValueError
            trace.skipped += 1
            continue
        if not isinstance(obj, dict):
            trace.skipped += 1
            continue
        if isinstance(obj.get("data"), dict):
            trace.reports.append((_int(obj.get("step")), _nulls_as_nan(obj["data"])))
        elif "training_iteration" in obj:
            trace.format = "tune-result-json"
            if trace.config is None and isinstance(obj.get("config"), dict):
                trace.config = flat_verl_config(obj["config"]) or None
            trace.reports.append((_int(obj.get("step", obj.get("training_iteration"))), obj))
        else:
            trace.skipped += 1
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


def _read_csv(path: Path, text: str) -> Trace:
    trace = Trace(path, "csv")
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        return trace
    header = [_wandb_name(h) for h in rows[0]]
    step_col = next((header.index(c) for c in _STEP_COLUMNS if c in header), None)
    keep = [i for i, h in enumerate(header) if h and not h.endswith(("__MIN", "__MAX")) and i != step_col]
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
        step = _int(parse_value(row[step_col])) if step_col is not None and step_col < len(row) else None
        trace.reports.append((step, metrics))
    trace.config = {k: v for k, v in config.items() if "." in k} or None
    return trace


def _wandb_name(header: str) -> str:
    # W&B UI export: "<run name> - actor/kl_loss"; metric names never contain " - "
    return header.rsplit(" - ", 1)[-1].strip()


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
    """True when no float in the first 50 reports has more than 3 decimals (a log converted from console lines)."""
    for _, metrics in reports[:50]:
        for value in metrics.values():
            if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
                m = _DECIMALS.search(repr(value))
                if m is None or len(m.group(1)) > 3 or "e" in repr(value).lower():
                    return False
    return True
