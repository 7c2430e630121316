"""Read training logs into (step, metrics) reports: verl file-logger jsonl, verl console logs, W&B CSV exports,
Ray Tune ``progress.csv`` / ``result.json``.

Formats, by content (then by file name):

- verl file logger (``VERL_FILE_LOGGER_PATH``): one ``{"step": N, "data": {...}}`` per line.
- Ray Tune ``result.json``: one result dict per line with ``training_iteration`` (and ``config``).
- verl console log: lines containing ``step:N - key:value - key:value ...``, possibly prefixed by Ray's
  ``(main_task pid=...)`` and ANSI colour codes, values possibly printed as ``np.float32(0.5)``; other lines
  (config dumps, sample generations) are skipped. Values are rounded to 3 decimals.
- CSV (Tune ``progress.csv``, which may lack columns: :func:`tune_progress`; or a W&B export): a step column
  (``step``, ``_step``, ``Step``, ``global_step``, ``training_iteration``); W&B's ``"<run> - metric"`` headers and
  ``__MIN``/``__MAX`` columns are handled (a W&B export holding several runs is read one run at a time: ``run=``);
  Tune's ``config/...`` columns give the run config.

JSON lines are decoded by :func:`klsweep.verl.stream.decode_json_line`, as live trials read them
(:mod:`klsweep.verl.stream` gives each writer's spelling of a non-finite value). Text (console lines, Tune
``progress.csv``, W&B CSV exports) spells them ``nan``, ``inf``, ``-inf``, ``NaN``, ``Infinity``, ``-Infinity``,
also wrapped (``np.float32(nan)``, ``tensor(nan)``). An empty CSV cell is "not logged".
"""

from __future__ import annotations

import csv
import gzip
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep.errors import TraceReadError
from klsweep.verl.stream import decode_json_line, skip_reason, step_number

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STEP_LINE = re.compile(r"(?:^|[\s\]])step:(\d+) - (.*)$")
_WRAPPED = re.compile(r"^(?:np\.)?(?:float\d*|int\d*|tensor)\((.*?)(?:,.*)?\)$")
_STEP_COLUMNS = ("step", "_step", "Step", "global_step", "training_iteration")
_DECIMALS = re.compile(r"\.(\d+)(?:[eE]|$)")

#: The file of a Ray Tune trial that holds every result whole (``EXPR_RESULT_FILE`` of ``ray.air.constants``).
TUNE_RESULT = "result.json"

#: ``(log path, the log's own config) -> the run's whole verl overrides``, or None where it cannot tell.
FullConfig = Callable[[Path, Mapping[str, Any]], dict[str, Any] | None]


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


def tune_progress(path: Path) -> bool:
    """Whether ``path`` is a Ray Tune ``progress.csv``: a ``.csv`` whose header holds Tune's own result keys
    ``training_iteration`` and ``time_total_s``.

    Such a file may lack metrics. Tune's CSV logger (``CSVLoggerCallback.log_trial_result`` in
    ``ray/tune/logger/csv.py``, Ray 2.x) makes its ``csv.DictWriter`` from the keys of the trial's first result and
    writes only those fields of every later result. A metric first reported after that has no column: verl's
    validation metrics, every ``trainer.test_freq`` steps, unless the run validates before training. The trial's
    ``result.json`` beside it (:data:`TUNE_RESULT`; ``JsonLoggerCallback`` in ``ray/tune/logger/json.py``) holds
    every result whole.
    """
    if not path.name.lower().endswith(".csv"):
        return False
    try:
        with path.open(errors="replace") as f:
            header = next(csv.reader([f.readline()]), [])
    except OSError:
        return False
    return {"training_iteration", "time_total_s"} <= {h.strip() for h in header}


def read_trace(path: str | Path, run: str | None = None, full_config: FullConfig | None = None) -> Trace:
    """Read a training log.

    Args:
        path: the log (formats in the module docstring); ``.gz``: gzip-compressed, read as the file inside.
        run: the run to read from a W&B export holding several (``"<run> - <metric>"`` headers); None reads a log of
            one run.
        full_config: completes the log's own config (a Tune log's holds only the searched parameters): called with
            the log's path and that config, it returns the run's whole overrides, or None where it cannot tell
            (:func:`klsweep.spec.trial_log.trial_log_overrides` for a klsweep trial).

    Raises:
        TraceReadError: missing or unreadable file, no step found in it (the message names the formats tried), a W&B
            export of several runs without ``run`` or ``run`` not among its runs (the message lists them).
    """
    path = Path(path)
    if path.is_dir():
        logs = [p for p in (path / "result.json", path / "progress.csv") if p.is_file()]
        fix = f"give its log: {logs[0]}" if logs else "give a log file, not a directory"
        raise TraceReadError(f"cannot read trace {path}: it is a directory; {fix}")
    try:
        if path.suffix.lower() == ".gz":
            with gzip.open(path, "rt", errors="replace") as f:
                text = f.read()
        else:
            text = path.read_text(errors="replace")
    except (OSError, EOFError) as e:
        raise TraceReadError(f"cannot read trace {path}: {getattr(e, 'strerror', None) or e}") from None
    first = text.lstrip()[:1]
    if path.name.lower().removesuffix(".gz").endswith(".csv"):
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
    trace.config = _run_config(path, trace.config, full_config)
    return trace


def _run_config(path: Path, config: dict[str, Any] | None, full_config: FullConfig | None) -> dict[str, Any] | None:
    """The run's verl overrides in full, or None where the log does not hold them.

    ``full_config(path, config)`` completes a config first, where it can. Otherwise, a config that does not say
    whether a KL mechanism is on is not used. verl's defaults for the missing keys would call the KL off. That would
    leave the KL rules idle on a run that logs its KL.
    """
    if not config:
        return None
    if full_config is not None and (full := full_config(path, config)) is not None:
        return full
    if not {"actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward"} & config.keys():
        return None
    return config


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
        step = step_number(parse_value(row[step_col])) if step_col is not None and step_col < len(row) else None
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


def _looks_rounded(reports: list[tuple[int | None, dict[str, Any]]]) -> bool:
    """True when the first 50 reports that hold a finite non-integer float hold none with more than 3 decimals.

    Such a log was converted from console lines. False when no report holds one (all NaN, integers): nothing says
    it was rounded."""
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
