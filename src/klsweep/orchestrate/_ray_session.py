"""The private local Ray of a sweep driver, recorded in the results directory so that the next start there ends what a
killed driver left of it.

What survives a SIGKILL of a driver that started a local Ray (``ray.init(address="local")``), with Ray 2.60.0 on
Linux:

- GCS, raylet, log monitor, autoscaler monitor and dashboard head die at once. Ray starts them with
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (``ray._private.services.start_ray_process(fate_share=True)``).
- Workers exit within ~3 s when their raylet connection drops.
- ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` notice the raylet's death at once, through a pipe (raylet
  sets ``RAY_enable_pipe_based_agent_to_parent_health_check=1`` for them). They then publish the raylet's log tail
  to the dead GCS with a fixed 60 s timeout (``ray._private.process_watcher.report_raylet_error_logs`` →
  ``publish_error_to_driver(..., 60)``), and live ~60 s more. No Ray setting shortens that, so a resume within that
  minute meets them.

Public reports of the same leaks: ray#2005 (processes of ``ray.init()`` outlive a killed parent), ray#39092 (runtime
env agent leaked when the raylet dies), ray#52385 (agent does not die after the raylet dies).

So klsweep records its session in ``<out>/ray_session.json`` (:func:`record_session`, right after ``ray.init``).
The next ``sweep run --resume``, ``sweep resume`` or ``sweep run --overwrite`` in that directory ends every process
of that session still alive, before it starts a Ray of its own (:func:`end_orphaned_session`). It does not when the
recording driver itself still runs. A process belongs to the recorded session when

- its pid and start time are in the record (Ray's daemons: ``Node.live_processes()``), or
- one of its command-line arguments names the session directory: Ray starts its daemons and agents with
  ``--session-dir=<dir>``, ``--log_dir=<dir>/logs``, ``--raylet_socket_name=<dir>/sockets/raylet``, ... ; or
- its command line is Ray's process title ``ray::<name>`` (agents and workers call ``setproctitle``, which drops the
  arguments) and it holds a file under the session directory open (its ``<dir>/logs/*.out|err`` files).

Another Ray session's processes (another sweep, the tests' own Ray, ``ray start``) name another directory and are
never touched.

Ray internals relied on, checked against **Ray 2.60.0** (``pyproject.toml`` pins it; re-check this module when it
moves):

- ``ray._private.worker._global_node`` with ``get_session_dir_path()``, ``session_name`` and ``live_processes()``
  (``ray/_private/node.py``);
- the command-line shapes above (``ray/_private/services.py``);
- the ``ray::`` process titles (``ray_constants.AGENT_PROCESS_TYPE_*``, ``ray._raylet.setproctitle``).

Linux only (``/proc``), like :mod:`klsweep.launchers.supervisor`; elsewhere nothing is recorded or ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import ray

from klsweep.errors import ClusterError
from klsweep.launchers.supervisor import descendants, proc_stat
from klsweep.results import RAY_SESSION_FILE

#: Seconds between SIGTERM and SIGKILL when ending an orphaned session (Ray's own reaper waits 1 s,
#: ``ray/_private/ray_process_reaper.py``; the agents, blocked on the dead GCS, need the SIGKILL).
GRACE_S = 1.0
#: Ray's process title prefix (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``, ``ray::IDLE``, ``ray::<task>``).
_RAY_TITLE = "ray::"
#: A Ray session directory's name: ``session_<%Y-%m-%d_%H-%M-%S_%f>_<pid of the process that started it>``
#: (``ray/_private/node.py``). A record naming anything else (``/tmp``) would match unrelated processes: refused.
_SESSION_NAME = re.compile(r"session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_\d+")


#: The start of Ray's exception when a new node's raylet does not register with the GCS within 30 s (a constant in
#: ``ray/_private/node.py``, Ray 2.60): on an overloaded machine.
_STARTUP_TIMEOUT = "The current node timed out during startup"


def start_local_ray(*, attempts: int = 3, **init_kwargs: Any) -> None:
    """``ray.init(address="local", **init_kwargs)``, started again when Ray's node start timed out.

    A timed-out start leaves the daemons it spawned running; they are ended (SIGTERM, then SIGKILL) before the next
    attempt, and a warning says so on stderr.

    Raises:
        ClusterError: every one of ``attempts`` starts timed out.
    """
    for attempt in range(1, attempts + 1):
        before = _children()
        try:
            ray.init(address="local", **init_kwargs)
            return
        except Exception as e:  # Ray raises a bare Exception for it
            if _STARTUP_TIMEOUT not in str(e):
                raise
            _terminate({pid: (ticks, "ray daemon") for pid, ticks in _children().items() if before.get(pid) != ticks},
                       GRACE_S)
            ray.shutdown()
            if attempt == attempts:
                load = os.getloadavg()[0]
                raise ClusterError(
                    f"Ray's local node did not start: its raylet did not register with the GCS within Ray's 30 s, "
                    f"{attempts} times (load {load:.1f} on {os.cpu_count()} cores). Run it again when the machine is "
                    "less busy, or on a running cluster with --address") from None
            print(f"warning: Ray's local node did not start within Ray's 30 s (load {os.getloadavg()[0]:.1f}); "
                  "ended what it started, starting it again", file=sys.stderr)


def _children() -> dict[int, int]:
    """This process's live descendants: pid → start ticks."""
    return {pid: ticks for pid in descendants(os.getpid()) if (ticks := _start_ticks(pid)) is not None}


def record_session(out_dir: Path) -> dict | None:
    """Write ``out_dir/ray_session.json`` for the local Ray this process started; the record, or None off Linux.

    Call it right after ``ray.init(address="local", ...)``: the record names the session directory, this driver (pid
    and start time) and Ray's daemons as started.
    """
    node = ray._private.worker._global_node
    me = _start_ticks(os.getpid())
    if node is None or me is None:
        return None
    processes = []
    for kind, process in node.live_processes():
        ticks = _start_ticks(process.pid)
        if ticks is not None:
            processes.append({"pid": process.pid, "start_ticks": ticks, "name": kind})
    record = {
        "session_dir": node.get_session_dir_path(),
        "session_name": node.session_name,
        "driver": {"pid": os.getpid(), "start_ticks": me},
        "processes": processes,
        "ray_version": ray.__version__,
    }
    path = Path(out_dir) / RAY_SESSION_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)
    return record


def dead_session_dir(out_dir: Path) -> Path | None:
    """The session directory recorded in ``out_dir`` when its driver is gone; None without a readable record or
    while that driver runs. A killed driver's files that Tune had not synced yet are still there
    (:func:`klsweep.orchestrate._repair.copy_staged_results`)."""
    record = _read_record(Path(out_dir) / RAY_SESSION_FILE, warn=False)
    return None if record is None or _driver_alive(record) else Path(record["session_dir"])


def _read_record(path: Path, *, warn: bool) -> dict | None:
    """The session record at ``path`` once checked (a Ray session directory, its driver's pid and start ticks); None
    when there is none, or when it is unreadable (with ``warn``, one line on stderr says so)."""
    try:
        record = json.loads(path.read_text())
        session_dir = str(record["session_dir"])
        int(record["driver"]["pid"]), int(record["driver"]["start_ticks"])
        name = Path(session_dir).name
        if not (Path(session_dir).is_absolute() and _SESSION_NAME.fullmatch(name) and name == record["session_name"]):
            raise ValueError(f"session_dir {session_dir!r} is not a Ray session directory")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        if warn:
            print(f"warning: {path} is unreadable ({e}); the Ray session it names is not cleaned up", file=sys.stderr)
        return None
    return record


def _driver_alive(record: dict) -> bool:
    """Whether the driver that wrote the session ``record`` still runs (its pid with its start time)."""
    return _start_ticks(int(record["driver"]["pid"])) == int(record["driver"]["start_ticks"])


def end_orphaned_session(out_dir: Path, *, grace_s: float = GRACE_S) -> list[str]:
    """End every living process of the Ray session recorded in ``out_dir`` once its driver is gone.

    SIGTERM, ``grace_s`` seconds, then SIGKILL. Prints one line to stderr naming what was ended, and removes the
    record. Nothing is done when there is no record. Nothing is done while the recording driver still runs: another
    ``sweep`` process works in ``out_dir``, and one line says so. ``sweep run`` and ``sweep resume`` refuse to start
    there before this (:mod:`klsweep.orchestrate.driver_lock`).

    Returns:
        The names of the processes ended (``raylet``, ``ray::DashboardAgent``, ...), empty if none.
    """
    path = Path(out_dir) / RAY_SESSION_FILE
    record = _read_record(path, warn=True)
    if record is None:
        return []
    session_dir = str(record["session_dir"])
    driver_pid = int(record["driver"]["pid"])
    if _driver_alive(record):
        if driver_pid != os.getpid():
            print(f"warning: the sweep driver {driver_pid} that recorded {path} still runs: its Ray session "
                  f"{record.get('session_name')} is left alone", file=sys.stderr)
        return []
    targets = _session_processes(session_dir)
    for entry in record.get("processes", []):
        pid, ticks = int(entry["pid"]), int(entry["start_ticks"])
        if _start_ticks(pid) == ticks:
            targets.setdefault(pid, (ticks, str(entry.get("name", "?"))))
    targets.pop(os.getpid(), None)
    ended = _terminate(targets, grace_s)
    path.unlink(missing_ok=True)
    if ended:
        print(f"ended {len(ended)} processes of Ray session {record['session_name']}, whose sweep driver "
              f"{driver_pid} is gone: {', '.join(sorted(ended))}", file=sys.stderr)
    return ended


def _session_processes(session_dir: str) -> dict[int, tuple[int, str]]:
    """``{pid: (start ticks, name)}`` of the live processes that belong to ``session_dir`` (module docstring)."""
    session_dir = session_dir.rstrip("/")
    names_it = re.compile(re.escape(session_dir) + r"(?![\w.-])")  # not session_..._123 for session_..._12
    found: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        ticks = _start_ticks(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if ticks is None or not argv:
            continue
        if any(names_it.search(arg) for arg in argv) or (
            argv[0].startswith(_RAY_TITLE) and _holds_file_under(pid, session_dir)
        ):
            found[pid] = (ticks, _name(argv))
    return found


def _name(argv: list[str]) -> str:
    """``ray::DashboardAgent``, ``raylet``, ``gcs_server``, ``log_monitor.py``, ..."""
    if argv[0].startswith(_RAY_TITLE):
        return argv[0].split()[0]
    script = next((a for a in argv[1:3] if a.endswith(".py")), argv[0])
    return Path(script).name


def _holds_file_under(pid: int, directory: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(directory + "/"):
            return True
    return False


def _terminate(targets: dict[int, tuple[int, str]], grace_s: float) -> list[str]:
    """SIGTERM each process that is still the one found (same start time), SIGKILL what is left after ``grace_s``;
    the names of those that were alive."""
    ended = [name for pid, (ticks, name) in targets.items() if _signal(pid, ticks, signal.SIGTERM)]
    if not _wait_gone(targets, grace_s):
        for pid, (ticks, _name) in targets.items():
            _signal(pid, ticks, signal.SIGKILL)
        _wait_gone(targets, 5.0)
    return ended


def _wait_gone(targets: dict[int, tuple[int, str]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_start_ticks(pid) == ticks for pid, (ticks, _name) in targets.items()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(pid: int, ticks: int, sig: int) -> bool:
    if _start_ticks(pid) != ticks:
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _start_ticks(pid: int) -> int | None:
    """The start time of a live (not zombie) process in clock ticks since boot (``/proc/<pid>/stat`` field 22): with
    the pid, it names one process even after the pid is reused. None if it is gone, a zombie, or off Linux."""
    stat = proc_stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[2]
