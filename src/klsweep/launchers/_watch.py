"""Wake a waiting reader as soon as a file in a directory is written: Linux ``inotify(7)`` through ctypes.

Why the trial's metrics tail (:mod:`klsweep.launchers.process`) does not just poll: reading the metrics file every
0.1 s reports a line up to 0.1 s after it was written. The supervisor polls every 0.2 s. It can record the exit of a
process that ended right after its last line before the tail has read that line. With a watch on the attempt
directory, the tail wakes when the metrics file grows or ``exit.json`` is moved in, within scheduler latency.

The watch is on the directory, not on the file: the metrics file does not exist until the trainer opens it, and
``exit.json`` is created by ``os.replace``. Events for other files of the directory (``stdout.log``, which verl writes
often) are read and dropped without waking the caller. Where inotify is missing (not Linux, or no watch left:
``fs.inotify.max_user_watches``), :meth:`DirectoryWatch.wait` sleeps its timeout, i.e. the caller polls.

Event layout and flag values: ``struct inotify_event`` and ``<sys/inotify.h>`` (man 7 inotify).
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import time
from collections.abc import Iterable
from pathlib import Path

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
#: ``struct inotify_event {int wd; uint32_t mask; uint32_t cookie; uint32_t len; char name[len];}``
_EVENT = struct.Struct("iIII")


class DirectoryWatch:
    """Waits for a write to, or the creation of, one of ``names`` in ``directory``. Close it (or use ``with``)."""

    def __init__(self, directory: Path, names: Iterable[str]):
        self._names = {os.fsencode(name) for name in names}
        self._fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)  # IN_NONBLOCK, IN_CLOEXEC
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(directory), IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0:
            os.close(fd)
            return
        self._fd = fd

    @property
    def active(self) -> bool:
        """Whether writes wake :meth:`wait` (False: it only sleeps)."""
        return self._fd >= 0

    def wait(self, timeout: float) -> None:
        """Return once one of the names was written, created or moved in since the last call, or after ``timeout``
        seconds."""
        if self._fd < 0:
            time.sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready or self._drain():
                return

    def _drain(self) -> bool:
        """Read the pending events; whether one concerns a watched name (or events were lost)."""
        hit = False
        while True:
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return hit
            if not buf:
                return hit
            offset = 0
            while offset < len(buf):
                _wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
                name = buf[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                hit = hit or bool(mask & IN_Q_OVERFLOW) or name in self._names
                offset += _EVENT.size + length

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
