"""Ctrl-C and SIGTERM during a sweep: Tune's fit ends, its trials are saved, and the sweep says how to continue.

:func:`interrupted_fit` tells whether a SIGINT ended ``Tuner.fit``; :func:`sigterm_as_ctrl_c` makes SIGTERM end the
sweep the same way; :func:`report_interrupted` prints the last lines and returns the exit status;
:func:`shutdown_ray` ends the sweep's Ray whatever Ctrl-C comes meanwhile.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from klsweep._format import arg, console
from klsweep.analysis.summary import counts_line, print_summary
from klsweep.analysis.trials_csv import write_trials_csv

if TYPE_CHECKING:
    from ray import tune

    from klsweep.spec.schema import Sweep

#: The signal that interrupted the sweep (SIGINT or SIGTERM), for :func:`report_interrupted`'s lines and exit status.
_ended_by = [signal.SIGINT]


def interrupted_fit(tuner: tune.Tuner) -> bool:
    """Run ``tuner.fit()``; returns True when Ctrl-C (SIGINT) ended it.

    Tune takes the first SIGINT itself: it stops the trials, saves the experiment, returns from ``fit`` and puts back
    the handler it found. That handler is :func:`_second_sigint`, installed here, so it is still in place after
    ``fit`` exactly when Tune took a SIGINT; a second SIGINT during Tune's shutdown raises ``KeyboardInterrupt``.
    """
    if threading.current_thread() is not threading.main_thread():  # no signal handlers there, Tune's neither
        tuner.fit()
        return False
    previous = signal.signal(signal.SIGINT, _second_sigint)
    try:
        tuner.fit()
        return signal.getsignal(signal.SIGINT) is _second_sigint
    finally:
        signal.signal(signal.SIGINT, previous)


def _second_sigint(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM ends the sweep as Ctrl-C does, with exit status 143 (128 + SIGTERM).

    SIGTERM is how SLURM, Kubernetes, ``timeout`` and ``kill`` end a sweep. ``ray.init`` installs abseil's failure
    handler for it, which ends the driver without Tune saving its experiment. Enter the block after ``ray.init``:
    it replaces that handler by a SIGINT to this process, and puts it back on exit. Main thread only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _ended_by[:] = [signal.SIGINT]

    def as_sigint(signum: int, frame: Any) -> None:
        _ended_by[:] = [signal.SIGTERM]
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_interrupted(sweep: Sweep, out_dir: Path) -> int:
    """After Ctrl-C or SIGTERM: write ``trials.csv``, print what finished and the command that continues the sweep.

    Returns 130 (128 + SIGINT, as a shell reports Ctrl-C), or 143 after SIGTERM. Further Ctrl-C are ignored meanwhile.
    """
    main_thread = threading.current_thread() is threading.main_thread()
    # the last lines are printed whole, even on a third Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        df = write_trials_csv(out_dir)
        print_summary(sweep, df, out_dir, ended=False)
        out = console()
        how = "Ctrl-C" if _ended_by[0] == signal.SIGINT else _ended_by[0].name
        out.print(f"\ninterrupted ({how}): {counts_line(sweep, df)}", highlight=False)
        out.print(f"continue with: sweep resume {arg(_shown(out_dir))}", highlight=False)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    return 128 + _ended_by[0]


def shutdown_ray() -> None:
    """``ray.shutdown()`` with Ctrl-C ignored until it returns (main thread only; SIGTERM still ends the process).

    Left to Ray's exit hook, the shutdown runs after the sweep's last line, where a late or second Ctrl-C interrupts
    it (its first step is a 0.5 s sleep, ``ray.shutdown`` in ray/_private/worker.py): a traceback, and Ray's
    dashboard and runtime-env agents left running.
    """
    if not ray.is_initialized():
        return
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        ray.shutdown()
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def _shown(path: Path) -> str:
    """``path`` as the user would type it here: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
