"""One attempt of a trial's process: started under its supervisor, tailed until it ends, judged.

The attempt runs isolated from the other trials of its host (:mod:`klsweep.launchers.isolation`): a verl trial
that starts its own Ray gets a private ``/tmp`` (or is the host's only such trial) and a free port for that Ray's
dashboard agent (:mod:`klsweep.launchers.own_ray`), and its process starts only while no other trial's engine starts
on its GPUs. :func:`stop_running_trials` ends every attempt running in this process.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from klsweep.launchers import multinode, own_ray, supervisor
from klsweep.launchers._watch import DirectoryWatch
from klsweep.launchers.failures import TAIL_CHARS, Failure, TrialFailed, classify
from klsweep.launchers.isolation import HostSlot, StartupLocks, lock_dir, private_tmp, private_tmp_available
from klsweep.verl.stream import MetricsTail, StepReports

#: Longest wait between two reads of the metrics file; a write to it, or the exit record, wakes the tail at once
#: (where inotify is missing, this is the polling period).
TAIL_POLL_S = 0.1


#: The trial attempts running in this process (a Tune trial actor runs one at a time): (handle, grace_s).
_RUNNING: dict[int, tuple[supervisor.Supervised, float]] = {}
_RUNNING_LOCK = threading.Lock()


def stop_running_trials() -> None:
    """End the process tree of every trial attempt running in this process, and wait until each is gone.

    For the trial actor's ``cleanup`` (:class:`klsweep.orchestrate.trainable.EndsWithItsProcess`). Tune frees a
    stopped trial's resources (its GPUs) when the actor's ``stop`` returns. Ray's function trainable does not wait
    for the trial's function there (``FunctionTrainable.cleanup``: ``session.finish(timeout=0)``). Without this, the
    next trial could start on GPUs the stopped trial's verl still holds. Waits up to the longest ``grace_s`` + 7 s.
    """
    with _RUNNING_LOCK:
        running = list(_RUNNING.values())
    for handle, _ in running:
        handle.stop()
    deadline = time.monotonic() + max((grace_s for _, grace_s in running), default=0.0) + 7.0
    while any(handle.exit_record() is None for handle, _ in running) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_attempt(
    argv: list[str],
    env: dict[str, str],
    run_dir: Path,
    steps: StepReports,
    *,
    timeout_s: float | None,
    grace_s: float,
    isolate: bool = False,
    startup_gpus: Sequence[str] = (),
    record_node: bool = False,
) -> Failure | None:
    """One start of the trial's process: tail its metrics until it ends; its failure, or None.

    ``isolate`` (a verl trial that starts its own Ray): run it through :mod:`klsweep.launchers.own_ray` (its Ray's
    dashboard agent on a free port) with a private ``/tmp``, else hold the host's :class:`HostSlot`. The supervisor
    removes the private ``/tmp`` once the tree is gone, also after a SIGKILL of this process.
    ``startup_gpus``: hold their :class:`StartupLocks` from the start to the first metrics line. ``record_node``
    (a multi-node trial): write this node's Ray id into ``node.json`` first
    (:func:`klsweep.launchers.multinode.record_node`)."""
    run_dir.mkdir(parents=True)
    if record_node:
        multinode.record_node(run_dir)
    tmp_dir, slot, locks = None, None, StartupLocks(startup_gpus)
    if isolate:
        argv = own_ray.wrap(argv)
        available, why = private_tmp_available()
        if available:
            tmp_dir = Path(tempfile.mkdtemp(prefix=f"klsweep-{run_dir.parent.name[:40]}-", dir=lock_dir()))
            argv = private_tmp(argv, tmp_dir) or argv
        else:
            try:
                slot = HostSlot(run_dir.parent, why)
            except TrialFailed as e:
                return Failure(e.kind, None, e.message)
    try:
        locks.acquire()
        return _tail_attempt(argv, env, run_dir, steps, timeout_s=timeout_s, grace_s=grace_s, locks=locks,
                             remove_after=[tmp_dir] if tmp_dir is not None else [])
    finally:
        locks.release()
        if slot is not None:
            slot.release()
        if tmp_dir is not None and not (run_dir / "supervisor.json").exists():  # else the supervisor removes it
            shutil.rmtree(tmp_dir, ignore_errors=True)


def _tail_attempt(
    argv: list[str],
    env: dict[str, str],
    run_dir: Path,
    steps: StepReports,
    *,
    timeout_s: float | None,
    grace_s: float,
    locks: StartupLocks,
    remove_after: list[Path],
) -> Failure | None:
    handle = supervisor.start(argv, env=env, cwd=run_dir, run_dir=run_dir, grace_s=grace_s, remove_after=remove_after)
    with _RUNNING_LOCK:
        _RUNNING[id(handle)] = (handle, grace_s)
    metrics = MetricsTail(Path(env["VERL_FILE_LOGGER_PATH"]))
    watch = DirectoryWatch(run_dir, (metrics.path.name, "exit.json"))  # what was written before: the first read
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            record = handle.exit_record()
            for step, data in metrics.read_new():
                locks.release()  # verl logs a step once its engines are up
                steps.line(step, data)
            if record is not None:
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                record = handle.stop(wait_s=grace_s + 5.0)
                break
            watch.wait(TAIL_POLL_S)
    finally:
        watch.close()
        try:
            if handle.exit_record() is None:
                handle.stop(wait_s=grace_s + 2.0)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(id(handle), None)
    returncode = record["returncode"] if record else None
    stderr_path = run_dir / "stderr.log"
    stderr = stderr_path.read_text(errors="replace") if stderr_path.exists() else ""
    if timed_out:
        return Failure("timeout", returncode, f"timed out after {timeout_s:g} s: the process ran past its time limit "
                       "(budget.trial_timeout_s) and its whole tree was stopped", stderr[-TAIL_CHARS:])
    if returncode == 0:
        if metrics.lines == 0:
            return Failure("error", 0, f"the process exited 0 but wrote no metrics to {metrics.path}")
        return None
    if record is not None and record.get("reason") == "stopped":
        return Failure("stopped", returncode, "klsweep stopped the trial's process tree (exit.json reason 'stopped': "
                       "the trial was stopped, or the sweep interrupted); not retried", stderr[-TAIL_CHARS:])
    return classify(returncode, stderr)
