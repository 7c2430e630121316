"""verl trials on one host that cannot collide: a private ``/tmp`` per trial, vLLM start-ups one at a time per GPU.

**The weight-sync socket.** verl 0.9.1 names the ZMQ socket that carries the actor's weights to its vLLM engine
``ipc:///tmp/rl-colocate-zmq-{job_id}-replica-{r}-rank-{k}.sock``, with ``job_id`` the Ray job id
(``verl/workers/rollout/vllm_rollout/vllm_rollout.py``; the vLLM side reads it from ``VERL_RAY_JOB_ID``,
``vllm_rollout/utils.py``). Each sync removes that path and binds it again
(``vllm_rollout/bucketed_weight_transfer.py``, ``_init_socket``). klsweep gives every verl trial its own Ray
(``+ray_kwargs.ray_init.address=local``), and the first job of a fresh Ray is always ``01000000``: every trial on a
host would use the same path. Ray cannot be told another job id. So :func:`private_tmp` runs the trial's process in
its own mount namespace, with a fresh directory bound over ``/tmp`` that holds what the host's ``/tmp`` held when the
trial started; verl's own Ray, its workers and vLLM are its descendants and see that ``/tmp``, so the sockets they
create there are theirs alone. Where the host refuses the namespace (``unshare`` needs unprivileged user
namespaces, or root), :class:`HostSlot` refuses a second verl trial on the host, with the reason and the fix.

**vLLM start-up.** vLLM sizes its KV cache from the device's free memory before and after its start-up profiling,
and asserts that free memory did not grow (``determine_available_memory`` in vllm/v1/worker/gpu_worker.py, "Error in
memory profiling ... other processes sharing the same container release GPU memory while vLLM is profiling",
vllm#55827, #56830). :class:`StartupLocks` holds a lock file per GPU from the start of a trial's process until its
first metrics line (verl logs its first step after its engines are up), so two trials sharing a GPU never start their
engines at the same time. An engine that starts while another trial's engine wakes or sleeps in its steady state is
not covered: pinning ``actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes`` (passed to vLLM
verbatim, ``vllm_async_server.py``) avoids the profiling altogether.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from klsweep.launchers.failures import TrialFailed

#: Where the host-wide lock files and the trials' private ``/tmp`` folders go (default ``/tmp``, local to the host;
#: unix sockets do not work on NFS).
LOCK_DIR_ENV = "KLSWEEP_LOCK_DIR"
#: Set to ``0`` to run verl trials without a private ``/tmp`` (then one verl trial per host, :class:`HostSlot`).
PRIVATE_TMP_ENV = "KLSWEEP_PRIVATE_TMP"
#: verl's socket path pattern, for messages (``vllm_rollout.py``).
SOCKET_PATTERN = "/tmp/rl-colocate-zmq-{ray job id}-replica-{r}-rank-{k}.sock"
#: Seconds between two tries of a lock another trial holds.
LOCK_POLL_S = 0.1

#: ``python -c _BIND <tmp dir> <argv...>``: give the fresh directory what the host's ``/tmp`` holds now (each directory
#: and regular file bound in, each symbolic link copied), bind it over ``/tmp``, exec the command. Paths under ``/tmp``
#: the trial names (its results, data, a model) stay where they are; what any process creates directly in ``/tmp``
#: from then on (verl's sockets) is the trial's own, and what others create there stays unseen. One process makes
#: every mount (``mount(2)`` through ctypes: MS_BIND = 4096, MS_REC = 16384 in <linux/mount.h>); an entry removed
#: meanwhile is skipped.
_BIND = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def bind(src, dst):
    if libc.mount(src.encode(), dst.encode(), None, 4096 | 16384, None) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.ENOENT:
        return False
    sys.exit(f"klsweep private /tmp: cannot bind {src} to {dst}: {os.strerror(code)}")
tmp = os.path.realpath(sys.argv[1])
for name in os.listdir("/tmp"):
    src, dst = os.path.join("/tmp", name), os.path.join(tmp, name)
    try:
        if os.path.realpath(src) == tmp:
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            bind(src, dst) or os.rmdir(dst)
        elif os.path.isfile(src):
            open(dst, "w").close()
            bind(src, dst) or os.remove(dst)
    except FileNotFoundError:
        continue
bind(tmp, "/tmp") or sys.exit(f"klsweep private /tmp: {tmp} is gone")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _variants(uid: int, gid: int) -> list[list[str]]:
    """``unshare`` prefixes to try, best first; each is followed by ``python -c _BIND tmp_dir argv...``.

    Root needs only a mount namespace. Anyone else needs a user namespace where they are root (to mount), then a
    nested one that maps them back to their own uid and gid (util-linux ≥ 2.38 ``--map-user``); failing that, the
    command runs as the namespace's root, which is still the user outside it."""
    mount = ["unshare", "--mount", "--propagation", "private", "--"]
    as_root = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--"]
    back = ["unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", "--"]
    found = [mount] if uid == 0 else []
    return found + [as_root + ["__back__", *back], as_root]


def _command(variant: list[str], tmp_dir: Path, argv: Sequence[str]) -> list[str]:
    bind = [sys.executable, "-c", _BIND, str(tmp_dir)]
    if "__back__" in variant:
        cut = variant.index("__back__")
        return [*variant[:cut], *bind, *variant[cut + 1:], *argv]
    return [*variant, *bind, *argv]


def lock_dir() -> Path:
    """``$KLSWEEP_LOCK_DIR``, else ``/tmp``."""
    return Path(os.environ.get(LOCK_DIR_ENV) or "/tmp")


@functools.cache
def _working_variant() -> tuple[tuple[str, ...] | None, str]:
    """The first prefix of :func:`_variants` that runs ``test -d /tmp/klsweep-probe`` in a bound ``/tmp``, and why
    none did (the last error)."""
    if os.environ.get(PRIVATE_TMP_ENV) == "0":
        return None, f"{PRIVATE_TMP_ENV}=0 is set"
    if shutil.which("unshare") is None:
        return None, "the unshare command (util-linux) is not installed"
    error = ""
    with tempfile.TemporaryDirectory(prefix="klsweep-probe-", dir=lock_dir()) as tmp:
        Path(tmp, "klsweep-probe").mkdir()
        for variant in _variants(os.getuid(), os.getgid()):
            try:
                done = subprocess.run(_command(variant, Path(tmp), ["test", "-d", "/tmp/klsweep-probe"]),
                                      capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired) as e:
                error = str(e)
                continue
            if done.returncode == 0:
                return tuple(variant), ""
            error = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return None, f"unshare failed: {error}"


def private_tmp_available() -> tuple[bool, str]:
    """Whether this host runs a command with its own ``/tmp``; if not, why (one line). Probed once per process."""
    variant, why = _working_variant()
    return variant is not None, why


def private_tmp(argv: Sequence[str], tmp_dir: Path) -> list[str] | None:
    """``argv`` run in its own mount namespace with ``tmp_dir`` bound over ``/tmp`` (:data:`_BIND`); None when the
    host refuses it.

    Args:
        argv: the trial's command.
        tmp_dir: an empty directory on a local file system (unix sockets do not work on NFS); the caller removes it.
    """
    variant, _ = _working_variant()
    return None if variant is None else _command(list(variant), Path(tmp_dir), argv)


def _lock(path: Path, *, wait: bool) -> int | None:
    """An open descriptor holding ``flock(LOCK_EX)`` on ``path``; None when ``wait`` is False and another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if not wait:
                os.close(fd)
                return None
            time.sleep(LOCK_POLL_S)


class HostSlot:
    """The one verl trial of a host that has no private ``/tmp``: a lock on ``lock_dir()/klsweep-verl-socket.lock``.

    Raises :class:`~klsweep.launchers.failures.TrialFailed` (kind ``config``, not retried) when another trial holds
    it: the message names the trial holding it, the reason and the fix. Released by :meth:`release` or when the
    holding process dies (``flock``)."""

    def __init__(self, trial_dir: Path, why_no_private_tmp: str):
        self.path = lock_dir() / "klsweep-verl-socket.lock"
        fd = _lock(self.path, wait=False)
        if fd is None:
            holder = self.path.read_text(errors="replace").strip() or "unknown"
            raise TrialFailed("config", (
                f"another verl trial runs on this host ({holder}) and this host gives no private /tmp "
                f"({why_no_private_tmp}). verl 0.9.1 names its weight-sync socket {SOCKET_PATTERN}, and each "
                "trial's own Ray gives its first job the id 01000000, so two trials would bind the same socket "
                "(one trial's weights loaded into the other's vLLM, or a sync that never ends). Fix: run one verl "
                "trial per node (give each trial all of a node's GPUs), or allow unprivileged user namespaces "
                "(sysctl user.max_user_namespaces > 0; on Ubuntu 24.04 "
                "kernel.apparmor_restrict_unprivileged_userns=0) so that klsweep gives each trial its own /tmp"))
        self._fd: int | None = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, trial {trial_dir}".encode())

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class StartupLocks:
    """Exclusive locks ``lock_dir()/klsweep-gpu-<id>.startup.lock`` on each of a trial's GPUs, taken in sorted order
    (no deadlock between trials sharing several GPUs), waiting while another trial holds one.

    Args:
        gpu_ids: the node's ids of the trial's GPUs (``ray.get_gpu_ids()``).
    """

    def __init__(self, gpu_ids: Sequence[str | int]):
        self.paths = [lock_dir() / f"klsweep-gpu-{g}.startup.lock" for g in sorted({str(g) for g in gpu_ids})]
        self._fds: list[int] = []

    def acquire(self) -> None:
        """Take every lock, waiting for each as long as another trial holds it."""
        for path in self.paths:
            fd = _lock(path, wait=True)
            assert fd is not None
            self._fds.append(fd)

    def release(self) -> None:
        """Release every lock held (again: nothing)."""
        while self._fds:
            os.close(self._fds.pop())
