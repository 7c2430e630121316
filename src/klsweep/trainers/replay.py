"""The replay trainer: plays back a recorded training log step by step, with the embedded trainer's interface.

A sweep with ``trainer: replay`` and ``replay: {trace: PATH, speed: S}`` runs every trial on the same recorded metric
stream. Each logged step becomes one Ray Tune report with verl's metric names. The health rules, the stopper, the
searcher and the results table thus see what they would see from a live run. Use it to try a rule set on real logs
inside ``sweep run``, or to exercise the orchestrator at scale without training (``benchmarks/scale_sim.py``).

The log is read by :func:`klsweep.health.readers.read_trace`, as ``sweep health check`` reads it: verl file-logger
jsonl, verl console log, W&B CSV export, Ray Tune ``progress.csv`` / ``result.json``. JSON lines go through the
decoder live trials use (:mod:`klsweep.verl.stream`). Non-finite values count as each writer spells them, verl's
``null`` included, so a run whose losses went NaN is stopped, never played to COMPLETE. The trial's parameters do not
change what is played back.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.tune.result import AUTO_RESULT_KEYS

from klsweep.errors import OverrideError, TraceReadError
from klsweep.health.readers import read_trace

CHECKPOINT_FILE = "replay_trainer.json"


def played_reports(reports: list[tuple[int | None, dict[str, Any]]], total_steps: int | None) -> list[tuple[int, dict]]:
    """The (step, metrics) a replay reports, in step order.

    Steps are the log's own; a log without steps (any report with step None) is numbered 1, 2, ... in file order.
    A step logged twice (a resumed run's log) keeps its last report. Reports after ``total_steps`` are dropped
    (verl's ``trainer.total_training_steps``; None keeps all). Metrics keep numbers only (not bools), without the
    keys Ray Tune fills in itself (``training_iteration``, ``time_total_s``, ...: :data:`AUTO_RESULT_KEYS`).
    """
    if any(step is None for step, _ in reports):
        reports = [(i, metrics) for i, (_, metrics) in enumerate(reports, start=1)]
    by_step: dict[int, dict[str, float]] = {}
    for step, metrics in reports:
        if total_steps is None or step <= total_steps:
            by_step[step] = {k: v for k, v in metrics.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in AUTO_RESULT_KEYS}
    return sorted(by_step.items())


def last_step(trace: str | os.PathLike, run: str | None = None) -> int:
    """The last step a replay of ``trace`` plays with no step limit, in the log's own numbering, as
    :attr:`ReplayTrainer.total_steps`: the step every trial ends at when ``budget.max_steps`` is larger.

    Raises:
        TraceReadError: the log cannot be read or holds no report (see :func:`klsweep.health.readers.read_trace`).
    """
    reports = played_reports(read_trace(Path(trace), run=run).reports, None)
    if not reports:
        raise TraceReadError(f"{trace} holds no report to play back")
    return reports[-1][0]


class ReplayTrainer:
    """Plays back a training log, one logged step per :meth:`train_step`.

    Args:
        overrides: the trial's flat verl overrides; only ``trainer.total_training_steps`` is read (the last step
            played; None or ≤ 0 plays the whole log).
        trace: the log (see the module docstring).
        speed: training steps per second of playback: the report of step s comes (s − previous step) / speed
            seconds after the previous one (the first one at once); 0 plays as fast as possible.
        run: the run to play from a W&B export holding several; None for a log of one run.

    Raises:
        TraceReadError: the log cannot be read, has no step at or before ``trainer.total_training_steps``, or is a
            W&B export of several runs and ``run`` names none of them.
        OverrideError: ``trainer.total_training_steps`` is not an integer.

    Attributes:
        total_steps: the last step played (the log's own numbering).
        global_step: the step of the last report played; 0 before the first.
    """

    def __init__(
        self, overrides: Mapping[str, Any], *, trace: str | os.PathLike, speed: float = 0.0, run: str | None = None
    ):
        limit = overrides.get("trainer.total_training_steps")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise OverrideError(f"trainer.total_training_steps={limit!r} is not an integer: give a number of steps")
        if not (speed >= 0 and math.isfinite(speed)):
            raise ValueError(f"speed must be a finite number of steps per second ≥ 0, not {speed!r}")
        self.trace = Path(trace)
        self.reports = played_reports(read_trace(self.trace, run=run).reports, limit if limit and limit > 0 else None)
        if not self.reports:
            raise TraceReadError(f"{self.trace} has no step at or before trainer.total_training_steps={limit}: raise "
                                 "budget.max_steps or replay a longer log")
        if self.reports[-1][0] < 1:
            raise TraceReadError(f"{self.trace} holds no training step (step 1 or later) to play back")
        self.speed = speed
        self.total_steps = self.reports[-1][0]
        self.global_step = 0
        self._next = 0  # index in self.reports of the next report to play
        self._due: float | None = None  # perf_counter time the next report is due (speed > 0)

    @property
    def done(self) -> bool:
        """Every report has been played."""
        return self._next >= len(self.reports)

    def train_step(self) -> dict[str, float]:
        """The next logged step's metrics (a copy), after waiting for its time when ``speed`` > 0.

        Raises:
            StopIteration: the whole log has been played.
        """
        if self.done:
            raise StopIteration(f"{self.trace}: all {len(self.reports)} reports have been played")
        step, metrics = self.reports[self._next]
        if self.speed > 0:
            now = time.perf_counter()
            if self._due is None:
                self._due = now
            elif self._due > now:
                time.sleep(self._due - now)
            if self._next + 1 < len(self.reports):
                self._due += (self.reports[self._next + 1][0] - step) / self.speed
        self._next += 1
        self.global_step = step
        return dict(metrics)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the playback position to ``directory/replay_trainer.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CHECKPOINT_FILE
        path.write_text(json.dumps({"trace": str(self.trace), "next": self._next, "global_step": self.global_step}))
        return path

    def load(self, directory: str | os.PathLike) -> None:
        """Continue from a :meth:`save` of a replay of the same log."""
        state = json.loads((Path(directory) / CHECKPOINT_FILE).read_text())
        self._next, self.global_step = state["next"], state["global_step"]
        self._due = None
