"""Why a trial process failed: one kind per failure, from its exit code and the tail of its stderr.

A failed verl run prints much more than its failure: NCCL warnings at shutdown
(``[rank0]:[W1023 ... ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed ...``), Ray
worker logs that mention ``ActorDiedError`` while a task is retried, tracebacks Ray reports as ``Unhandled error``.
So the patterns are matched only against **failure lines**, never against any line that merely mentions a word.
A failure line is one of:

- an exception line: ``Name: message`` at the start of a line, as a traceback's last line
  (``torch.OutOfMemoryError: CUDA out of memory. ...``,
  ``ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() ...``);
- an error-severity record of torch's C++ log (``[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607]
  [Rank 0] Watchdog caught collective operation timeout: ...``), glog or Ray's C++ logs;
- a Python log record at ERROR whose message is an exception line
  (vLLM's ``ERROR 10-23 10:11:12 [core.py:708] ValueError: ...``);
- what C++ prints when an exception ends the process (``terminate called after throwing an instance of
  'c10::DistBackendError'``, ``what():  ...``);
- Hydra's own failure messages (``Could not override '...'``).

Warning, info and debug records are never failure lines, whatever they mention. Prefixes are read through: Ray's
worker prefix ``(WorkerDict pid=1234, ip=10.0.0.1)`` (with its colour codes), vLLM's ``(EngineCore_DP0 pid=4321)``,
torch's ``[rank0]:``.

The kinds, and the real messages each pattern was written against (verl 0.9.1, torch 2.x, NCCL 2.2x, vLLM, Ray 2.60,
Hydra 1.3):

=================  ==========================================================================================
kind               failure lines matched
=================  ==========================================================================================
``cuda_oom``       ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB``,
                   ``RuntimeError: CUDA error: out of memory``, ``CUBLAS_STATUS_ALLOC_FAILED``,
                   vLLM: ``ValueError: No available memory for the cache blocks``
``nccl``           ``torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp``,
                   ``ncclUnhandledCudaError``, ``[Rank 0] Watchdog caught collective operation timeout:
                   WorkNCCL(SeqNum=1, OpType=ALLREDUCE, ...) ran for 600000 milliseconds before timing out`` (matched
                   on any line that is not a warning: torch prints it only when the collective timed out),
                   ``ProcessGroupNCCL's watchdog got stuck``, ``Heartbeat monitor timed out``,
                   ``torch.distributed.DistNetworkError``, ``torch.distributed.DistStoreError: Timed out``
``missing_module`` ``ModuleNotFoundError: No module named 'transfer_queue'`` (a bare ``pip install verl``),
                   ``ImportError: cannot import name 'X' from 'Y'``, ``ImportError: ...so: undefined symbol: ...``
                   (an extension such as flash-attn built against another torch)
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
``killed``         the final exception is Ray's report of a process killed from outside:
                   ``ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.``,
                   ``ray.exceptions.WorkerCrashedError``, ``ray.exceptions.NodeDiedError``,
                   ``ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory``;
                   or no pattern matched and the process ended by a signal (exit code ``-N``, or ``128+N`` from a
                   shell for SIGHUP, SIGINT, SIGKILL, SIGTERM, SIGABRT, SIGSEGV, SIGBUS)
``stopped``        klsweep stopped the tree itself (``exit.json`` reason ``stopped``, :mod:`.process`): never retried
``ray_start``      the final exception is Ray's report that the trial's own local Ray did not come up in the
                   30 s ``ray.init`` waits for it (``raylet_start_wait_time_s`` in ray/_private/node.py, not
                   configurable): ``Exception: The current node timed out during startup`` (an overloaded host)
``timeout``        the trial ran past the launcher's own ``timeout_s`` (no pattern); the final exception is a
                   ``ray.get`` timeout: ``ray.exceptions.GetTimeoutError``
``error``          anything else
=================  ==========================================================================================

The order of :data:`PATTERNS` is the order of the checks; each check runs over every failure line of the tail.
A CUDA OOM or an NCCL failure in a Ray worker reaches verl's driver as an ``ActorDiedError``, a ``RayTaskError`` or
vLLM's ``RuntimeError: Engine core initialization failed. See root cause above``. The worker's own lines say why.
So the specific kinds come first, and out-of-memory first of all: a rank that runs out of memory leaves its peers
with NCCL errors.

:data:`FINAL_PATTERNS` (``killed``, ``timeout``, ``ray_start``) are Ray's generic reports. They count only as
**the final exception**: the last exception line of the trial process itself (lines without a worker prefix, when
there are any). That leaves out the exceptions Python reports as ``Exception ignored in`` and Ray as
``Unhandled error``.

Hydra prints ``Set the environment variable HYDRA_FULL_ERROR=1`` for *any* exception in ``main_ppo``, so that line
says nothing by itself.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("timeout", "stopped", "killed", "ray_start", "cuda_oom", "nccl", "missing_module", "nan", "config",
         "error")

#: Failure kinds worth a retry (Tune ``FailureConfig``): transient communication errors, processes killed from
#: outside (node memory pressure, preemption) and a local Ray that started too slowly on a loaded host (the sweep
#: driver retries its own Ray start alike). A config error, a missing module, a CUDA OOM or a NaN repeats on retry.
RETRYABLE = frozenset({"nccl", "killed", "ray_start"})

#: Specific kinds in precedence order, each with its patterns, matched against every failure line of the tail. A
#: kind's patterns are in the order of the message they give: the first one that matches names the failure
#: (NCCL's watchdog line, not the ``terminate called after throwing an instance of 'c10::DistBackendError'`` after it).
PATTERNS: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = tuple(
    (kind, tuple(re.compile(pattern) for pattern in patterns))
    for kind, patterns in (
        (
            "cuda_oom",
            (
                r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|(?i:CUDA error: out of memory)",
                r"No available memory for the cache blocks",
                r"CUBLAS_STATUS_ALLOC_FAILED",
            ),
        ),
        (
            "nccl",
            (
                r"Watchdog caught collective operation timeout",
                r"NCCL error",
                r"ProcessGroupNCCL's watchdog got stuck|Heartbeat monitor timed out",
                r"nccl(Internal|System|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)Error",
                r"DistNetworkError|DistStoreError|DistBackendError",
            ),
        ),
        (
            "missing_module",
            (r"ModuleNotFoundError: No module named|ImportError: cannot import name|ImportError: .*undefined symbol",),
        ),
        (
            "nan",
            (
                r"probability tensor contains either `inf`, `nan` or element < 0|returned nan values in its|"
                r"FloatingPointError",
            ),
        ),
        (
            "config",
            (
                r"Could not override '|is not in struct|ConfigCompositionException|omegaconf\.errors\.|"
                r"Total available GPUs \d+ is less than total desired GPUs|must be divisible by|"
                r"Invalid loss_agg_mode|OverrideError|Error merging override|Error in call to target 'verl\.",
            ),
        ),
    )
)

#: Ray's generic reports, matched against the final exception only.
FINAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("killed", re.compile(r"\b(ActorDiedError|WorkerCrashedError|NodeDiedError)\b|node running low on memory")),
    ("timeout", re.compile(r"\bGetTimeoutError\b")),
    ("ray_start", re.compile(r"The current node timed out during startup")),
)

#: Messages distinctive enough to count on any line that is not a warning: torch prints the watchdog timeout only
#: when a collective did time out, and in more than one shape (its C++ log, ``what():``, a re-raised exception).
_ANY_LINE = re.compile(r"Watchdog caught collective operation timeout")

#: Hydra's line after any exception in a ``@hydra.main`` function: never the message of a failure.
_HYDRA_NOTICE = re.compile(r"Set the environment variable HYDRA_FULL_ERROR=1")

#: Terminal colour codes (Ray colours its worker prefixes).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

#: Prefixes naming the process that printed a line: Ray's ``(WorkerDict pid=1234, ip=10.0.0.1)``, ``(raylet)``,
#: vLLM's ``(EngineCore_DP0 pid=4321)`` (nested under Ray's), torch's ``[rank0]:``.
_PROCESS_PREFIX = re.compile(r"^(?:\([^()]*?(?:pid=\d+|raylet|gcs_server)[^()]*\)\s*|\[rank\d+\]:\s*)+")

#: C++ log headers with a one-letter severity: torch's c10 log (``[E1206 18:44:12.715298746
#: ProcessGroupNCCL.cpp:607]``, older ``[E ProcessGroupNCCL.cpp:737]``), glog (``E1206 18:44:12.715298 123
#: file.cc:12]``), Ray's C++ log (``[2025-10-23 10:11:12,345 E 1234 5678] core_worker.cc:123:``).
_CPP_HEADERS = (
    re.compile(r"^\[?(?P<sev>[DIWEF])(?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?(?: +\d+)?)? ?[\w./<>-]+:\d+\]\s*"),
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (?P<sev>[DIWEF]) \d+ \d+\]\s*"),
)

#: Python log headers: vLLM's (``WARNING 10-23 10:11:12 [core.py:708]``), Ray's (``2025-10-23 10:11:12,345\tERROR
#: worker.py:440 --``), Hydra's (``[2025-10-23 10:11:12,345][verl][WARNING] -``), logging's default
#: (``WARNING:root:``).
_PY_HEADERS = (
    re.compile(r"^(?P<sev>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +\[[^\]]*\]\s*"),
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\s+(?P<sev>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+ -- "),
    re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[(?P<sev>DEBUG|INFO|WARNING|ERROR|CRITICAL)\] - "),
    re.compile(r"^(?P<sev>DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:"),
)

#: ``Name: message`` (or a bare ``Name``) at the start of a line: the last line of a Python traceback. Ray's wrapped
#: exceptions name the cause in parentheses: ``ray.exceptions.RayTaskError(OutOfMemoryError): ray::...``.
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)|Exception)(?:\([\w.]*\))?(?::(?:\s|$)|$)"
)

#: Failure messages that are not exception lines: C++ ``std::terminate`` and Hydra's own reports.
_OTHER_FAILURE = re.compile(
    r"^(?:terminate called after throwing an instance of|what\(\):|Could not (?:override|append to config|"
    r"delete from config|load)|Error merging override|Error in call to target|Key '[^']*' is not in struct)"
)

#: Lines after which the next exception line did not end the process: Python's report of an exception in
#: ``__del__`` or at interpreter exit, and Ray's report of a failed task whose result nobody asked for.
_NOT_FINAL_MARKER = re.compile(r"^Exception ignored in|Unhandled error \(suppress with 'RAY_IGNORE_UNHANDLED_ERRORS")

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

    def __reduce__(self):
        # Ray copies and pickles a trial's exception (copy.copy rebuilds it from self.args, one string): rebuild
        # it from both fields instead.
        return (type(self), (self.kind, self.message))


def classify(returncode: int | None, stderr: str, *, timed_out: bool = False) -> Failure:
    """The :class:`Failure` of a process that ended with ``returncode`` and wrote ``stderr``.

    Args:
        returncode: exit code as :class:`subprocess.Popen` reports it (``-N``: killed by signal N); None if unknown.
        stderr: the process's stderr, or its tail.
        timed_out: the launcher stopped it for running past its time limit.

    Returns:
        The first kind of :data:`PATTERNS` that matches a failure line (the message: the latest line its first
        matching pattern matches); else the kind of :data:`FINAL_PATTERNS` that matches the final exception;
        ``killed`` for a signal; ``config`` for exit code 2; else ``error`` (see the module docstring).
    """
    tail = stderr[-TAIL_CHARS:]
    if timed_out:
        return Failure("timeout", returncode, "the trial ran past its time limit and was stopped", tail)
    lines = _read_lines(tail)
    failures = [line for line in lines if line.failure]
    for kind, patterns in PATTERNS:
        for pattern in patterns:
            for line in reversed(failures):
                if pattern.search(line.body):
                    return Failure(kind, returncode, _message(lines, line), tail)
    final = _final_exception(lines)
    if final is not None:
        for kind, pattern in FINAL_PATTERNS:
            if pattern.search(final.body):
                return Failure(kind, returncode, _message(lines, final), tail)
    last = _message(lines, final) if final is not None else lines[-1].text[:500] if lines else ""
    signum = _signal_of(returncode)
    if signum is not None:
        return Failure("killed", returncode, f"killed by {signal.Signals(signum).name}", tail)
    if returncode == 2:
        return Failure("config", returncode, last or "exit code 2 (usage error)", tail)
    return Failure("error", returncode, last or f"exit code {returncode}", tail)


@dataclass(frozen=True)
class _Line:
    """One non-empty stderr line: ``text`` as printed (colour codes and outer blanks removed), ``body`` without the
    process prefix and log header; ``prefix`` the process prefix; whether it is a failure line, an exception line,
    and an exception that did not end the process."""

    index: int
    text: str
    body: str
    prefix: str
    failure: bool
    exception: bool
    not_final: bool


def _read_lines(tail: str) -> list[_Line]:
    out: list[_Line] = []
    pending_not_final: set[str] = set()  # prefixes whose next exception line was reported, not raised
    for raw in tail.splitlines():
        text = _ANSI.sub("", raw).strip()
        if not text or _HYDRA_NOTICE.search(text):
            continue
        match = _PROCESS_PREFIX.match(text)
        prefix = match.group(0).strip() if match else ""
        body = text[match.end():] if match else text
        severity, cpp = "", False
        for header in _CPP_HEADERS:
            if m := header.match(body):
                severity, cpp, body = m["sev"], True, body[m.end():]
                break
        else:
            for header in _PY_HEADERS:
                if m := header.match(body):
                    severity, body = m["sev"][0], body[m.end():]
                    break
        if severity in ("D", "I", "W"):  # a warning is never the failure, whatever it mentions
            out.append(_Line(len(out), text, body, prefix, False, False, False))
            continue
        exception = bool(_EXCEPTION.match(body))
        failure = exception or bool(_OTHER_FAILURE.match(body)) or cpp or bool(_ANY_LINE.search(body))
        not_final = exception and prefix in pending_not_final
        if not_final:
            pending_not_final.discard(prefix)
        if _NOT_FINAL_MARKER.search(body):
            pending_not_final.add(prefix)
        out.append(_Line(len(out), text, body, prefix, failure, exception, not_final))
    return out


def _final_exception(lines: list[_Line]) -> _Line | None:
    """The exception that ended the process: its own last exception line, else any process's last one."""
    raised = [line for line in lines if line.exception and not line.not_final]
    own = [line for line in raised if not line.prefix]
    return (own or raised or [None])[-1]


def _message(lines: list[_Line], line: _Line) -> str:
    """The line as printed, with the next one when it ends with ``:`` (Hydra's ``Error in call to target '...':``)."""
    message = line.text
    if message.endswith(":") and line.index + 1 < len(lines):
        message += " " + lines[line.index + 1].text
    return message[:500]


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
