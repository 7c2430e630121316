"""Why a trial process failed: one kind per failure, from its exit code and the tail of its stderr.

The kinds, and the messages each pattern was written against (verl 0.9.1, torch 2.x, vLLM, Ray 2.60, Hydra 1.3):

=================  ==========================================================================================
kind               real messages matched
=================  ==========================================================================================
``timeout``        the trial ran past the launcher's own ``timeout_s`` (no pattern); a ``ray.get`` timeout:
                   ``ray.exceptions.GetTimeoutError``
``killed``         the process ended by a signal (exit code ``-N``, or ``128+N`` from a shell); Ray killed a
                   worker: ``ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on
                   memory``, ``ray.exceptions.ActorDiedError: The actor died unexpectedly``,
                   ``ray.exceptions.WorkerCrashedError``
``cuda_oom``       ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB``,
                   ``RuntimeError: CUDA error: out of memory``, ``CUBLAS_STATUS_ALLOC_FAILED``,
                   vLLM: ``ValueError: No available memory for the cache blocks``
``nccl``           ``torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp``,
                   ``ncclUnhandledCudaError``, ``[Rank 0] Watchdog caught collective operation timeout:
                   WorkNCCL(SeqNum=1, OpType=ALLREDUCE, ...) ran for 600000 milliseconds before timing out``,
                   ``torch.distributed.DistNetworkError``, ``torch.distributed.DistStoreError: Timed out``
``missing_module`` ``ModuleNotFoundError: No module named 'transfer_queue'`` (a bare ``pip install verl``),
                   ``ImportError: cannot import name 'X' from 'Y'``
``nan``            ``RuntimeError: probability tensor contains either `inf`, `nan` or element < 0`` (sampling
                   from NaN logits), ``Function 'MulBackward0' returned nan values in its 0th output``,
                   ``FloatingPointError``
``config``         Hydra: ``Could not override 'actor_rollout_ref.actor.kl_los_type'``,
                   ``Key 'kl_los_type' is not in struct``, ``hydra.errors.ConfigCompositionException``,
                   verl's config dataclasses: ``Error in call to target 'verl.workers.config.actor.FSDPActorConfig':
                   AssertionError("[actor] Please set at least one of 'actor.ppo_micro_batch_size' or ...")``,
                   ``omegaconf.errors.ConfigAttributeError``; verl's late checks: ``Total available GPUs 0 is
                   less than total desired GPUs 1`` (single_controller/ray/base.py), ``must be divisible by``,
                   ``Invalid loss_agg_mode``; klsweep's ``OverrideError``; exit code 2 (argparse, klsweep's CLI)
``error``          anything else
=================  ==========================================================================================

The order of :data:`PATTERNS` is the order of the checks: a CUDA OOM raised inside a Ray actor reaches the driver as
a ``RayTaskError`` (or ``ActorDiedError``) wrapping the OOM text, so the specific kinds are checked first, then the
configuration patterns, then Ray's generic "actor died" messages. Hydra prints ``Set the environment variable
HYDRA_FULL_ERROR=1`` for *any* exception in ``main_ppo``, so that line says nothing by itself.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("timeout", "killed", "cuda_oom", "nccl", "missing_module", "nan", "config", "error")

#: Failure kinds worth a retry (Tune ``FailureConfig``): transient communication errors and processes killed from
#: outside (node memory pressure, preemption). A config error, a missing module, a CUDA OOM or a NaN repeats on retry.
RETRYABLE = frozenset({"nccl", "killed"})

PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        (
            "cuda_oom",
            r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|CUDA error: out of memory|"
            r"CUBLAS_STATUS_ALLOC_FAILED|No available memory for the cache blocks",
        ),
        (
            "nccl",
            r"NCCL error|nccl(Internal|System|UnhandledCuda|InvalidUsage|Remote)Error|ProcessGroupNCCL|"
            r"Watchdog caught collective operation timeout|DistNetworkError|DistStoreError|DistBackendError",
        ),
        ("missing_module", r"ModuleNotFoundError: No module named|ImportError: cannot import name"),
        (
            "nan",
            r"probability tensor contains either `inf`, `nan` or element < 0|returned nan values in its|"
            r"FloatingPointError",
        ),
        (
            "config",
            r"Could not override '|is not in struct|ConfigCompositionException|omegaconf\.errors\.|"
            r"Total available GPUs \d+ is less than total desired GPUs|must be divisible by|"
            r"Invalid loss_agg_mode|OverrideError|Error merging override|Error in call to target 'verl\.",
        ),
        ("killed", r"node running low on memory|ActorDiedError|WorkerCrashedError"),
        ("timeout", r"GetTimeoutError"),
    )
)

#: Hydra's line after any exception in a ``@hydra.main`` function: never the message of a failure.
_HYDRA_NOTICE = re.compile(r"Set the environment variable HYDRA_FULL_ERROR=1")

#: How many characters of stderr are kept in the failure record.
TAIL_CHARS = 4000


@dataclass(frozen=True)
class Failure:
    """Why a trial process failed.

    Attributes:
        kind: one of :data:`KINDS`.
        returncode: the process's exit code (``-N`` for a signal N), or None when it never started or never ended.
        message: one line: the matched stderr line, or what happened.
        stderr_tail: the last :data:`TAIL_CHARS` characters of stderr.
    """

    kind: str
    returncode: int | None
    message: str
    stderr_tail: str = ""

    @property
    def retryable(self) -> bool:
        """True for the kinds in :data:`RETRYABLE`."""
        return self.kind in RETRYABLE

    def save(self, path: Path) -> None:
        """Write this record as JSON (``failure.json`` in the trial directory)."""
        record = asdict(self) | {"retryable": self.retryable}
        Path(path).write_text(json.dumps(record, indent=2) + "\n")


class TrialFailed(RuntimeError):
    """Raised by the trial function when its process failed, so Ray Tune marks the trial ERROR.

    ``str(error)`` is ``"<kind>: <message>"``; Tune keeps it in the trial's ``error.txt``.
    """

    def __init__(self, kind: str, message: str):
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


def classify(returncode: int | None, stderr: str, *, timed_out: bool = False) -> Failure:
    """The :class:`Failure` of a process that ended with ``returncode`` and wrote ``stderr``.

    Args:
        returncode: exit code as :class:`subprocess.Popen` reports it (``-N``: killed by signal N); None if unknown.
        stderr: the process's stderr, or its tail.
        timed_out: the launcher stopped it for running past its time limit.

    Returns:
        The first matching kind of :data:`PATTERNS` (checked from the last stderr line up, so the final error wins
        over earlier warnings); ``killed`` for a signal; ``config`` for exit code 2; else ``error``.
    """
    tail = stderr[-TAIL_CHARS:]
    if timed_out:
        return Failure("timeout", returncode, "the trial ran past its time limit and was stopped", tail)
    lines = [line.strip() for line in tail.splitlines() if line.strip() and not _HYDRA_NOTICE.search(line)]
    for kind, pattern in PATTERNS:
        for i in range(len(lines) - 1, -1, -1):
            if pattern.search(lines[i]):
                message = lines[i] + (" " + lines[i + 1] if lines[i].endswith(":") and i + 1 < len(lines) else "")
                return Failure(kind, returncode, message[:500], tail)
    signum = _signal_of(returncode)
    if signum is not None:
        return Failure("killed", returncode, f"killed by {signal.Signals(signum).name}", tail)
    if returncode == 2:
        return Failure("config", returncode, lines[-1][:500] if lines else "exit code 2 (usage error)", tail)
    return Failure("error", returncode, lines[-1][:500] if lines else f"exit code {returncode}", tail)


def _signal_of(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    if returncode < 0:
        signum = -returncode
    elif returncode > 128 and returncode - 128 in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSEGV,
                                                   signal.SIGABRT, signal.SIGBUS, signal.SIGHUP):
        signum = returncode - 128
    else:
        return None
    try:
        signal.Signals(signum)
    except ValueError:
        return None
    return signum
