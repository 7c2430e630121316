"""Run a trial's command so that its whole process tree dies with the trial.

Ray kills only a trial worker's direct children. verl's own Ray (raylet, GCS, workers) and the vLLM servers started
by ``python -m verl.trainer.main_ppo`` would outlive a stopped trial. Every process survives when the sweep driver
is SIGKILLed (ray#23971, ray#34125). The design, which tests/launchers/test_process.py checks on a stopped trial, a
SIGKILLed driver and verl's own Ray:

1. :func:`start` launches ``python -m klsweep.launchers.supervisor SPEC`` in a new session. That process forks and
   exits, so the supervisor is neither a direct child of the Ray worker nor in its process group or session.
2. The supervisor makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux ≥ 3.4). Every descendant
   whose parent exits is re-parented to it rather than to init. No descendant escapes its view, not even one that
   called ``setsid``, as Ray's own daemons do.
3. It starts the command in a new session and polls the watched (trial worker) pid every :data:`POLL_S` seconds.
   It stops the tree when the worker is gone, when it receives SIGTERM, or when the command ends. It sends SIGTERM
   to every descendant and the command's process group, waits ``grace_s``, and sends SIGKILL to what is left. It
   then reaps and writes ``exit.json``.
4. The trial side (:class:`Supervised`) also ``killpg``\\ s the command's group in its ``finally``.

Files in the run directory:

- ``spec.json``: what to run, and the directories to remove after it; the environment is inherited, never written
  to disk;
- ``supervisor.json``: pids, written once the command started;
- ``stdout.log`` / ``stderr.log``: the command's;
- ``supervisor.log``;
- ``exit.json``: ``{"returncode": int | null, "reason": "exited" | "stopped" | "worker_gone", "cleanup_s": float}``.

Linux only (``/proc`` and ``prctl``), like the GPU nodes verl runs on.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Seconds between two checks of the watched pid and the command.
POLL_S = 0.2
#: ``prctl`` option number from <linux/prctl.h>.
PR_SET_CHILD_SUBREAPER = 36


def descendants(pid: int) -> list[int]:
    """Pids of every live (non-zombie) descendant of ``pid``, read from ``/proc/*/stat``, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry.name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        kids = [kid for parent in frontier for kid in children.get(parent, [])]
        found.extend(kids)
        frontier = kids
    return found


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of ``pid`` from ``/proc/<pid>/stat``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def _alive(pid: int, start_ticks: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[2] == start_ticks


class Supervised:
    """Handle on a command started by :func:`start`, held by the trial.

    Attributes:
        run_dir: the directory of the run's files (module docstring).
        pid, pgid, supervisor_pid: the command's pid and process group, and the supervisor's pid.
    """

    def __init__(self, run_dir: Path, info: Mapping[str, int]):
        self.run_dir = run_dir
        self.pid = int(info["pid"])
        self.pgid = int(info["pgid"])
        self.supervisor_pid = int(info["supervisor_pid"])

    def exit_record(self) -> dict | None:
        """``exit.json`` once the supervisor has finished (command ended and its tree cleaned up), else None."""
        path = self.run_dir / "exit.json"
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def stop(self, wait_s: float = 0.0) -> dict | None:
        """Ask the supervisor to end the command's tree (SIGTERM, then SIGKILL after its grace period).

        Also sends SIGTERM to the command's process group directly, in case the supervisor is gone. Waits up to
        ``wait_s`` seconds for ``exit.json`` and returns it (None if not written yet; the supervisor goes on alone).
        """
        for kill, target in ((os.kill, self.supervisor_pid), (os.killpg, self.pgid)):  # supervisor first: "stopped"
            try:
                kill(target, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while True:
            record = self.exit_record()
            if record is not None or time.monotonic() >= deadline:
                return record
            time.sleep(0.05)


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    run_dir: Path,
    watch_pid: int | None = None,
    grace_s: float = 5.0,
    start_timeout_s: float = 30.0,
    remove_after: Sequence[Path] = (),
) -> Supervised:
    """Start ``argv`` under a detached supervisor that kills its whole tree when ``watch_pid`` dies.

    Args:
        argv: the command (``[sys.executable, "-m", ...]``).
        env: its complete environment.
        cwd: its working directory.
        run_dir: where the run's files go (created); stdout/stderr go to ``stdout.log``/``stderr.log`` there.
        watch_pid: the process whose death ends the command (default: the caller, i.e. the Ray trial worker).
        grace_s: seconds between SIGTERM and SIGKILL.
        start_timeout_s: seconds to wait for the supervisor to report the command's pid.
        remove_after: directories the supervisor removes once the tree is gone, before it writes ``exit.json``
            (the trial's private ``/tmp``), also when the watched process died first.

    Returns:
        A :class:`Supervised` handle once the command runs.

    Raises:
        RuntimeError: the supervisor did not start the command (its ``supervisor.log`` says why).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    watch_pid = os.getpid() if watch_pid is None else watch_pid
    watch_stat = proc_stat(watch_pid)
    if watch_stat is None:
        raise RuntimeError(f"cannot supervise: the watched process {watch_pid} does not exist")
    spec = {
        "argv": list(argv),
        "cwd": str(cwd),
        "watch_pid": watch_pid,
        "watch_start": watch_stat[2],
        "grace_s": grace_s,
        "remove_after": [str(d) for d in remove_after],
    }
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    with open(run_dir / "supervisor.log", "ab") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "klsweep.launchers.supervisor", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(env),  # inherited by the command: no environment (tokens, keys) is written to disk
            start_new_session=True,
            close_fds=True,
        )
    launcher.wait()  # it forks the supervisor and exits at once
    info_path = run_dir / "supervisor.json"
    deadline = time.monotonic() + start_timeout_s
    while not info_path.exists():
        if time.monotonic() > deadline or (run_dir / "exit.json").exists():
            log_text = (run_dir / "supervisor.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the trial supervisor did not start {argv[:3]}...: {log_text or 'no output'}")
        time.sleep(0.02)
    return Supervised(run_dir, json.loads(info_path.read_text()))


def _write_json(path: Path, record: Mapping) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


class _Supervisor:
    """The detached process: runs the command, watches the worker, cleans up the tree (module docstring)."""

    def __init__(self, spec_path: Path):
        self.run_dir = spec_path.parent
        self.spec = json.loads(spec_path.read_text())
        self.stop_requested = False
        self.command_status: int | None = None

    def run(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            print(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}", flush=True)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)
        spec = self.spec
        with open(self.run_dir / "stdout.log", "ab") as out, open(self.run_dir / "stderr.log", "ab") as err:
            command = subprocess.Popen(
                spec["argv"],
                cwd=spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        self.command_pid = command.pid
        _write_json(
            self.run_dir / "supervisor.json",
            {"supervisor_pid": os.getpid(), "pid": command.pid, "pgid": command.pid},
        )
        reason = self._watch(spec["watch_pid"], spec["watch_start"])
        started = time.monotonic()
        self._kill_tree(float(spec["grace_s"]))
        command.returncode = self.command_status  # reaped here, never by Popen
        for folder in spec.get("remove_after", []):
            shutil.rmtree(folder, ignore_errors=True)
        _write_json(
            self.run_dir / "exit.json",
            {"returncode": self.command_status, "reason": reason, "cleanup_s": round(time.monotonic() - started, 3)},
        )

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_requested = True

    def _watch(self, watch_pid: int, watch_start: int) -> str:
        while True:
            self._reap()
            if self.stop_requested:
                return "stopped"
            if self.command_status is not None:
                return "exited"
            if not _alive(watch_pid, watch_start):
                return "worker_gone"
            time.sleep(POLL_S)

    def _reap(self) -> None:
        """Collect every exited child (orphans are re-parented here), recording the command's exit code."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.command_pid:
                self.command_status = os.waitstatus_to_exitcode(status)

    def _signal_all(self, signum: int) -> list[int]:
        targets = descendants(os.getpid())
        try:
            os.killpg(self.command_pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in targets:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        return targets

    def _kill_tree(self, grace_s: float) -> None:
        if not self._signal_all(signal.SIGTERM):
            self._reap()
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._reap()
            if not descendants(os.getpid()):
                return
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            self._reap()
            if not descendants(os.getpid()):
                break
            time.sleep(0.05)
        self._reap()


def _main(spec_path: str) -> None:
    if os.fork() > 0:
        os._exit(0)  # the launcher exits; the supervisor lives on, re-parented away from the Ray worker
    try:
        _Supervisor(Path(spec_path)).run()
    except BaseException as e:  # the trial reads supervisor.log and exit.json
        print(f"supervisor failed: {type(e).__name__}: {e}", flush=True)
        _write_json(Path(spec_path).parent / "exit.json", {"returncode": None, "reason": f"supervisor_error: {e}"})
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv[1])
