"""One sweep driver per results directory: ``sweep run`` (fresh, ``--resume``, ``--overwrite``) and ``sweep resume``
hold an exclusive lock on ``<out>/driver.lock`` while they work there, and a second driver is refused.

Two drivers on one directory would both restore Tune's experiment and tell the same Optuna trials their results. The
second would fail with ``optuna.exceptions.UpdateFinishedTrialError``, and Tune would rewrite trial files the first
still writes.

The lock is ``flock(LOCK_EX | LOCK_NB)`` (``fcntl.flock``, flock(2)). The kernel drops it when its holder exits,
SIGKILL included, so a dead driver's lock never blocks a resume. There is no stale-PID guess: the file keeps the PID
only to name the holder. On NFS, Linux maps flock onto NFS byte-range locks (flock(2), NOTES). Drivers on two nodes
sharing ``--out`` are thus kept apart as well.
Linux and macOS only (``fcntl``), like :mod:`klsweep.launchers.supervisor`.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from klsweep.errors import ResultsError

#: The lock file in a results directory (kept after the driver ends: removing it would let a driver that opened it
#: just before lock a file no other driver sees).
DRIVER_LOCK = "driver.lock"


@contextmanager
def driver_lock(out_dir: Path) -> Iterator[None]:
    """Hold the driver lock of the existing directory ``out_dir`` for the ``with`` block; writes this PID into it.

    Raises:
        ResultsError: another process holds it (a sweep driver still runs there): one line with its PID and the
            fix; nothing in ``out_dir`` is changed.
    """
    path = Path(out_dir) / DRIVER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "(unknown PID)"
            raise ResultsError(
                f"{out_dir}: its sweep driver (PID {holder}) still runs: a second driver would corrupt its "
                f"results. Wait for it to end, or stop it with `kill -INT {holder}` (it saves and says how to "
                f"continue), then run this again") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
