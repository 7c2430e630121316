"""Failure kinds from the stderr tail of a real verl trial: each kind from the lines that ended the process, never
from a warning or a log line that merely mentions NCCL, ``ProcessGroupNCCL`` or ``ActorDiedError``.

The tails follow the formats of verl 0.9.1's driver (Hydra's ``Error executing job``, a ``ray.get`` on the
TaskRunner actor), Ray 2.60 (worker prefixes, ``RayTaskError(...)``, ``ActorDiedError`` and its context lines,
``Unhandled error``), torch's c10 log (``[rank0]:[E1023 ... ProcessGroupNCCL.cpp:632]``), NCCL and vLLM's engine log
(``(EngineCore_DP0 pid=...) ERROR ... [core.py:708]``), as printed in public verl, vLLM and PyTorch issue reports
(e.g. verl-project/verl#4921, #302; pytorch/pytorch#126275; vllm-project/vllm#23176)."""

from __future__ import annotations

import signal

import pytest

from klsweep.launchers.failures import TAIL_CHARS, classify

HYDRA_NOTICE = "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"

DRIVER_TRACEBACK = """\
Error executing job with overrides: ['algorithm.adv_estimator=grpo', 'trainer.total_training_steps=80']
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 42, in main
    run_ppo(config)
  File "/opt/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 96, in run_ppo
    ray.get(runner.run.remote(config))
  File "/opt/venv/lib/python3.11/site-packages/ray/_private/auto_init_hook.py", line 22, in auto_init_wrapper
    return fn(*args, **kwargs)
  File "/opt/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 2961, in get
    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)
  File "/opt/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1026, in get_objects
    raise value.as_instanceof_cause()
"""

#: What a healthy verl run prints on its way: torch's NCCL warnings (at process-group start, barrier and shutdown),
#: torch's and NCCL's info lines naming ProcessGroupNCCL, vLLM's warnings, and a Ray warning about a task retried
#: after an ActorDiedError.
ROUTINE_NOISE = """\
(WorkerDict pid=48213) [rank0]:[I1023 10:02:11.402114527 ProcessGroupNCCL.cpp:939] [PG ID 0 PG GUID 0 Rank 0] \
ProcessGroupNCCL initialization options: size: 2, global rank: 0, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0
(WorkerDict pid=48213) [rank0]:[W1023 10:02:12.118004210 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 0]  \
using GPU 0 to perform barrier as devices used by this process are currently unknown. This can potentially cause a \
hang if this rank to GPU mapping is incorrect.
(WorkerDict pid=48213) gpu-node-3:48213:48870 [0] NCCL INFO ProcessGroupNCCL comm 0x55d1c3a0 rank 0 nranks 2 \
cudaDev 0 nvmlDev 0 busId 18000 commId 0x5e8f1a2b - Init COMPLETE
(WorkerDict pid=48213) WARNING 10-23 10:03:40 [utils.py:2671] Methods determine_num_available_blocks not \
implemented in <vllm.v1.worker.gpu_worker.Worker object at 0x7f2b1c1a5d50>
(TaskRunner pid=47990) 2025-10-23 10:05:02,117\tWARNING actor_manager.py:183 -- Task reward_fn() failed with \
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task. Retrying (1/3).
(WorkerDict pid=48213) [rank0]:[W1023 10:14:09.552311874 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group \
has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call \
destroy_process_group to ensure that any pending NCCL operations have finished in this process. In rare cases this \
process can exit before this point and block the progress of another member of the process group. This constraint \
has always been present,  but this warning has only been added since PyTorch 2.4 (function operator())
W1023 10:14:10.001000 47812 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 48213 closing \
signal SIGTERM
"""

ACTOR_DIED = """\
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict
\tactor_id: 5066c201b724a3936948a11201000000
\tpid: 48213
\tname: 07GxnAWorkerDict_0:0
\tnamespace: b8860f81-d334-496c-a8f4-c7ed6a6b49f3
\tip: 10.0.0.5
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the process was \
killed by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed \
unexpectedly due to SIGSEGV or another unexpected error.
"""

OOM_IN_UPDATE = ROUTINE_NOISE + DRIVER_TRACEBACK + """\
ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=47990, ip=10.0.0.5, \
actor_id=36b6798a692f88dfb0e149e301000000, repr=<verl.trainer.main_ppo.TaskRunner object at 0x7f3e766c0ca0>)
  File "/opt/venv/lib/python3.11/site-packages/verl/trainer/ppo/ray_trainer.py", line 1210, in fit
    actor_output = self.actor_rollout_wg.update_actor(batch)
ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() (pid=48213, \
ip=10.0.0.5, actor_id=b2ba64f62469495ea505301701000000, repr=<verl.single_controller.ray.base.WorkerDict object>)
  File "/opt/venv/lib/python3.11/site-packages/verl/workers/actor/dp_actor.py", line 466, in update_policy
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 79.11 GiB \
of which 1.05 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. Of the allocated \
memory 74.20 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
""" + HYDRA_NOTICE + """\
(WorkerDict pid=48214) [rank1]:[W1023 10:14:09.552311874 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group \
has NOT been destroyed before we destruct ProcessGroupNCCL. (function operator())
"""

#: Rank 1 runs out of memory; rank 0, waiting in the collective, gets NCCL errors and the driver sees the actor die.
OOM_ON_A_PEER_RANK = """\
(WorkerDict pid=48214) Traceback (most recent call last):
(WorkerDict pid=48214)   File "/opt/venv/lib/python3.11/site-packages/verl/workers/actor/dp_actor.py", line 466
(WorkerDict pid=48214) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.17 GiB. GPU 1 has a total \
capacity of 79.11 GiB of which 612.00 MiB is free.
(WorkerDict pid=48213) [rank0]:[E1023 10:24:40.871512104 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) \
Rank 0] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a \
network error, NCCL version 2.26.2
""" + DRIVER_TRACEBACK + ACTOR_DIED + HYDRA_NOTICE

#: vLLM's engine process fails to fit the KV cache; the rollout server reports "see root cause above".
VLLM_CACHE_BLOCKS = """\
(vLLMHttpServer pid=5957) (EngineCore_DP0 pid=6120) ERROR 10-23 10:03:41 [core.py:708] EngineCore failed to start.
(vLLMHttpServer pid=5957) (EngineCore_DP0 pid=6120) ERROR 10-23 10:03:41 [core.py:708] Traceback (most recent call \
last):
(vLLMHttpServer pid=5957) (EngineCore_DP0 pid=6120) ERROR 10-23 10:03:41 [core.py:708]   File \
"/opt/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 83, in __init__
(vLLMHttpServer pid=5957) (EngineCore_DP0 pid=6120) ERROR 10-23 10:03:41 [core.py:708] ValueError: No available \
memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
""" + DRIVER_TRACEBACK + """\
ray.exceptions.RayTaskError(RuntimeError): ray::vLLMHttpServer.launch_server() (pid=5957, ip=10.0.0.5, \
actor_id=b9579ec8b1b88dd3297546b402000000)
  File "/opt/venv/lib/python3.11/site-packages/vllm/v1/engine/core_client.py", line 484, in _wait_for_engine_startup
    raise RuntimeError("Engine core initialization failed. "
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
""" + HYDRA_NOTICE

#: torch's NCCL watchdog takes the worker down (SIGABRT); the driver sees the actor die.
NCCL_WATCHDOG = ROUTINE_NOISE + """\
(WorkerDict pid=51877) [rank1]:[E1023 11:02:40.871120593 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught \
collective operation timeout: WorkNCCL(SeqNum=2041, OpType=_ALLGATHER_BASE, NumelIn=6553600, NumelOut=13107200, \
Timeout(ms)=600000) ran for 600089 milliseconds before timing out.
(WorkerDict pid=51877) [rank1]:[E1023 11:02:40.871512104 ProcessGroupNCCL.cpp:2271] [PG ID 0 PG GUID 0(default_pg) \
Rank 1]  failure detected by watchdog at work sequence id: 2041 PG status: last enqueued work: 2041, last completed \
work: 2040
(WorkerDict pid=51877) [rank1]:[E1023 11:02:40.871633208 ProcessGroupNCCL.cpp:698] [Rank 1] To avoid data \
inconsistency, we are taking the entire process down.
(WorkerDict pid=51877) terminate called after throwing an instance of 'c10::DistBackendError'
(WorkerDict pid=51877) *** SIGABRT received at time=1761217360 on cpu 12 ***
""" + DRIVER_TRACEBACK + ACTOR_DIED + HYDRA_NOTICE

NCCL_ERROR = DRIVER_TRACEBACK + """\
ray.exceptions.RayTaskError(DistBackendError): ray::WorkerDict.actor_rollout_update_actor() (pid=48213, \
ip=10.0.0.5, actor_id=b2ba64f62469495ea505301701000000)
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2806, in all_reduce
    work = group.allreduce([tensor], opts)
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, \
unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
Last error:
socketStartConnect: Connect to 10.0.0.6<45123> failed : Software caused connection abort
""" + HYDRA_NOTICE

MISSING_MODULE = DRIVER_TRACEBACK + """\
ray.exceptions.RayTaskError(ModuleNotFoundError): ray::TaskRunner.run() (pid=47990, ip=10.0.0.5)
  File "/opt/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 301, in run
    from verl.experimental.transfer_queue import TransferQueueClient
ModuleNotFoundError: No module named 'transfer_queue'
""" + HYDRA_NOTICE

#: flash-attn built against another torch: the actor dies in its creation task (Ray puts the cause last).
FLASH_ATTN_ABI = DRIVER_TRACEBACK + """\
ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, \
ray::WorkerDict.__init__() (pid=48213, ip=10.0.0.5, actor_id=5066c201b724a3936948a11201000000)
  File "/opt/venv/lib/python3.11/site-packages/flash_attn/flash_attn_interface.py", line 15, in <module>
    import flash_attn_2_cuda as flash_attn_gpu
ImportError: /opt/venv/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined \
symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE
""" + HYDRA_NOTICE

NAN = ROUTINE_NOISE + DRIVER_TRACEBACK + """\
ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_generate_sequences() (pid=48213)
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/_contextlib.py", line 116, in decorate_context
    return func(*args, **kwargs)
RuntimeError: probability tensor contains either `inf`, `nan` or element < 0
""" + HYDRA_NOTICE

CONFIG_OVERRIDE = """\
Could not override 'actor_rollout_ref.actor.kl_los_type'.
To append to your config use +actor_rollout_ref.actor.kl_los_type=k3
Key 'kl_los_type' is not in struct
    full_key: actor_rollout_ref.actor.kl_los_type
    object_type=dict
""" + HYDRA_NOTICE

CONFIG_GPUS = ROUTINE_NOISE + DRIVER_TRACEBACK + """\
ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() (pid=47990, ip=10.0.0.5)
  File "/opt/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 182, in _check_resource
    raise ValueError(
ValueError: Total available GPUs 0 is less than total desired GPUs 1
""" + HYDRA_NOTICE

#: The trial's actor died unexpectedly and nothing above says why: killed from outside (host OOM killer, preemption).
KILLED = ROUTINE_NOISE + """\
(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the \
problem, check the logs for the dead worker. Worker PID: 48213 Worker exit type: SYSTEM_ERROR
""" + DRIVER_TRACEBACK + ACTOR_DIED + HYDRA_NOTICE

HOST_OOM = DRIVER_TRACEBACK + """\
ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.
Memory on the node (IP: 10.0.0.5, ID: 0b5e...) where the task (actor ID: 5066c201b724a3936948a11201000000, \
name=WorkerDict.__init__, pid=48213, memory used=61.20GB) was running was 241.30GB / 251.50GB (0.959), which exceeds \
the memory usage threshold of 0.95. Ray killed this worker (ID: 9a1e...) because it was the most recently scheduled \
task; to see more information about memory usage on this node, use `ray logs raylet.out -ip 10.0.0.5`.
""" + HYDRA_NOTICE

GET_TIMEOUT = DRIVER_TRACEBACK + """\
ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.
""" + HYDRA_NOTICE

#: A trial process whose own ``ray.init`` found its local Ray not up after Ray's fixed 30 s (a fresh-clone test run
#: on a loaded 2-core host, 2026-12-03; paths shortened).
RAY_START = """\
Traceback (most recent call last):
  File "tests/launchers/fake_trainer.py", line 152, in <module>
    ray.init(address=args["ray_kwargs.ray_init.address"], num_cpus=1, include_dashboard=False, log_to_driver=False,
  File ".venv/lib/python3.11/site-packages/ray/_private/client_mode_hook.py", line 134, in wrapper
    return func(*args, **kwargs)
  File ".venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1927, in init
    _global_node = ray._private.node.Node(
  File ".venv/lib/python3.11/site-packages/ray/_private/node.py", line 440, in __init__
    raise Exception(
Exception: The current node timed out during startup. This could happen because some of the raylet failed to \
startup or the GCS has become overloaded.
"""

REAL_FAILURES = {
    "cuda_oom in the actor update, NCCL shutdown warnings after": (OOM_IN_UPDATE, 1, "cuda_oom",
                                                                  "torch.OutOfMemoryError: CUDA out of memory"),
    "cuda_oom on a peer rank wins over the NCCL errors it causes": (OOM_ON_A_PEER_RANK, 1, "cuda_oom",
                                                                    "GPU 1 has a total capacity"),
    "cuda_oom in vLLM's engine under 'see root cause above'": (VLLM_CACHE_BLOCKS, 1, "cuda_oom",
                                                               "No available memory for the cache blocks"),
    "nccl watchdog timeout in a worker, ActorDiedError at the driver": (NCCL_WATCHDOG, 1, "nccl",
                                                                         "Watchdog caught collective operation"),
    "nccl watchdog, worker aborted, driver exits 134": (NCCL_WATCHDOG, 128 + signal.SIGABRT, "nccl", "Watchdog"),
    "nccl error from a collective": (NCCL_ERROR, 1, "nccl", "torch.distributed.DistBackendError: NCCL error in:"),
    "missing module": (MISSING_MODULE, 1, "missing_module", "No module named 'transfer_queue'"),
    "flash-attn built against another torch": (FLASH_ATTN_ABI, 1, "missing_module", "undefined symbol"),
    "nan logits at sampling": (NAN, 1, "nan", "probability tensor contains"),
    "hydra override": (CONFIG_OVERRIDE, 1, "config", "Key 'kl_los_type' is not in struct"),
    "verl resource check": (CONFIG_GPUS, 1, "config", "Total available GPUs 0"),
    "actor died unexpectedly": (KILLED, 1, "killed", "ray.exceptions.ActorDiedError: The actor died unexpectedly"),
    "ray's host memory monitor": (HOST_OOM, 1, "killed", "node running low on memory"),
    "ray.get timeout": (GET_TIMEOUT, 1, "timeout", "GetTimeoutError"),
    "a trial's own Ray not up in 30 s": (RAY_START, 1, "ray_start", "The current node timed out during startup"),
}


@pytest.mark.parametrize(("stderr", "returncode", "kind", "message"), REAL_FAILURES.values(), ids=REAL_FAILURES)
def test_a_real_failure_gets_its_kind(stderr, returncode, kind, message):
    failure = classify(returncode, stderr)
    assert failure.kind == kind, failure.message
    assert message in failure.message
    assert "HYDRA_FULL_ERROR" not in failure.message
    assert failure.retryable == (kind in ("nccl", "killed", "ray_start"))


#: Failures of other kinds in runs whose logs mention NCCL, ProcessGroupNCCL or ActorDiedError on the way.
MENTIONS_ONLY = {
    "a plain error after routine NCCL and Ray noise": (
        ROUTINE_NOISE + DRIVER_TRACEBACK + "ray.exceptions.RayTaskError(KeyError): ray::TaskRunner.run() (pid=47990)\n"
        "  File \"/opt/venv/lib/python3.11/site-packages/verl/trainer/ppo/metric_utils.py\", line 301\n"
        "KeyError: 'acc'\n" + HYDRA_NOTICE, 1, "error", "KeyError: 'acc'"),
    "ProcessGroupNCCL's own check that there is no GPU is not an NCCL failure": (
        DRIVER_TRACEBACK + "ray.exceptions.RayTaskError(ValueError): ray::WorkerDict.__init__() (pid=48213)\n"
        "  File \"/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py\", line 1864\n"
        "    backend_class = ProcessGroupNCCL(backend_prefix_store, group_rank, group_size, pg_options)\n"
        "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!\n" + HYDRA_NOTICE,
        1, "error", "no GPUs found"),
    "an ActorDiedError a worker logged and retried, then a plain error": (
        "(TaskRunner pid=47990) Traceback (most recent call last):\n"
        "(TaskRunner pid=47990)   File \"/opt/venv/lib/python3.11/site-packages/verl/utils/reward_score.py\", line 88\n"
        "(TaskRunner pid=47990) ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this "
        "task.\n" + DRIVER_TRACEBACK + "KeyError: 'acc'\n" + HYDRA_NOTICE, 1, "error", "KeyError: 'acc'"),
    "an ActorDiedError a worker logged and retried, then a config error": (
        "(TaskRunner pid=47990) ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this "
        "task.\n" + ROUTINE_NOISE + DRIVER_TRACEBACK
        + "AssertionError: real_train_batch_size (12) must be divisible by minimal possible batch size (8)\n"
        + HYDRA_NOTICE, 1, "config", "must be divisible by"),
    "Ray's unhandled-error report after the failure is not the failure": (
        DRIVER_TRACEBACK + "RuntimeError: reward function returned 3 scores for 4 responses\n" + HYDRA_NOTICE
        + "2025-10-23 10:20:03,001\tERROR worker.py:440 -- Unhandled error (suppress with "
        "'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::WorkerDict.actor_rollout_generate_sequences() (pid=48213)\n"
        "  File \"/opt/venv/lib/python3.11/site-packages/ray/_private/worker.py\", line 1026, in get_objects\n"
        + ACTOR_DIED, 1, "error", "reward function returned 3 scores"),
    "an exception in __del__ at exit is not the failure": (
        DRIVER_TRACEBACK + "RuntimeError: reward function returned 3 scores for 4 responses\n" + HYDRA_NOTICE
        + "Exception ignored in: <function RayWorkerGroup.__del__ at 0x7f2b1c1a5d50>\n"
        "Traceback (most recent call last):\n"
        "  File \"/opt/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py\", line 412, in __del__\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n",
        1, "error", "reward function returned 3 scores"),
    "warnings alone, exit 1": (ROUTINE_NOISE, 1, "error", ""),
    "a healthy run's tail read after exit 0": (ROUTINE_NOISE, 0, "error", ""),
    "a stop by SIGTERM during routine NCCL noise": (ROUTINE_NOISE, -signal.SIGTERM, "killed", "SIGTERM"),
}


@pytest.mark.parametrize(("stderr", "returncode", "kind", "message"), MENTIONS_ONLY.values(), ids=MENTIONS_ONLY)
def test_a_mention_is_not_a_failure_of_that_kind(stderr, returncode, kind, message):
    failure = classify(returncode, stderr)
    assert failure.kind == kind, failure.message
    assert message in failure.message


SIGNALS = {
    "-9": (-9, "killed", "killed by SIGKILL"),
    "-15": (-15, "killed", "killed by SIGTERM"),
    "137 from a shell (128+SIGKILL)": (137, "killed", "killed by SIGKILL"),
    "143 (128+SIGTERM)": (143, "killed", "killed by SIGTERM"),
    "130 (128+SIGINT)": (130, "killed", "killed by SIGINT"),
    "129 (128+SIGHUP)": (129, "killed", "killed by SIGHUP"),
    "134 (128+SIGABRT)": (134, "killed", "killed by SIGABRT"),
    "139 (128+SIGSEGV)": (139, "killed", "killed by SIGSEGV"),
    "138 (128+SIGUSR1) is an exit code": (138, "error", "exit code 138"),
    "255 is an exit code": (255, "error", "exit code 255"),
    "2 is a usage error": (2, "config", "exit code 2"),
    "1": (1, "error", "exit code 1"),
}


@pytest.mark.parametrize(("returncode", "kind", "message"), SIGNALS.values(), ids=SIGNALS)
def test_exit_codes_and_signals(returncode, kind, message):
    failure = classify(returncode, "")
    assert (failure.kind, failure.returncode) == (kind, returncode)
    assert message in failure.message


def test_a_failure_line_wins_over_the_signal_and_a_time_limit_over_everything():
    assert classify(-signal.SIGABRT, NCCL_WATCHDOG).kind == "nccl"
    assert classify(-signal.SIGKILL, OOM_IN_UPDATE).kind == "cuda_oom"
    stopped = classify(-signal.SIGKILL, OOM_IN_UPDATE, timed_out=True)
    assert (stopped.kind, stopped.message) == ("timeout", "the trial ran past its time limit and was stopped")


def test_ray_colours_and_the_kept_tail():
    coloured = "\x1b[36m(WorkerDict pid=48213)\x1b[0m torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
    failure = classify(1, "x" * 10 * TAIL_CHARS + "\n" + coloured + "\n" + ACTOR_DIED)
    assert failure.kind == "cuda_oom" and failure.message.startswith("(WorkerDict pid=48213) torch.OutOfMemoryError")
    assert len(failure.stderr_tail) == TAIL_CHARS


def test_trial_failed_survives_copy_and_pickle_as_ray_handles_it():
    import copy
    import pickle

    from klsweep.launchers.failures import TrialFailed

    error = TrialFailed("timeout", "timed out after 2 s")
    for clone in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert (clone.kind, clone.message, str(clone)) == ("timeout", "timed out after 2 s", str(error))


#: One row per pattern alternative of ``PATTERNS`` and ``FINAL_PATTERNS`` the real tails above do not reach, each a
#: failure line as its library prints it (torch c10d/NCCL, Hydra 1.3's ``ConfigLoaderImpl`` and ``instantiate``,
#: omegaconf, verl 0.9.1's ``core_algos.agg_loss`` and ``workers/config/actor.py``, Ray 2.60's ``ray.exceptions``),
#: under the driver's traceback and Hydra's notice as a verl run prints it.
EACH_PATTERN = {
    "cuda_oom: CUDA error: out of memory": (
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other "
        "API call, so the stacktrace below might be incorrect.", "cuda_oom", "RuntimeError: CUDA error: out of memory"),
    "cuda_oom: torch.cuda.OutOfMemoryError": (
        "torch.cuda.OutOfMemoryError: Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.64 GiB",
        "cuda_oom", "torch.cuda.OutOfMemoryError: Tried to allocate 20.00 MiB"),
    "cuda_oom: cuBLAS cannot allocate its workspace": (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuda_oom", "CUBLAS_STATUS_ALLOC_FAILED"),
    "nccl: watchdog stuck": (
        "[rank0]:[E1023 11:10:02.120451873 ProcessGroupNCCL.cpp:1279] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives.", "nccl", "ProcessGroupNCCL's watchdog got stuck for 480 seconds"),
    "nccl: heartbeat monitor": (
        "[rank1]:[E1023 11:10:02.120451873 ProcessGroupNCCL.cpp:1401] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1",
        "nccl", "Heartbeat monitor timed out!"),
    "nccl: ncclRemoteError": (
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "nccl", "ncclRemoteError: A call failed"),
    "nccl: DistNetworkError": (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
        "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
        "nccl", "torch.distributed.DistNetworkError: The server socket"),
    "nccl: DistStoreError": (
        "torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/2 clients joined.",
        "nccl", "DistStoreError: Timed out after 1801 seconds"),
    "missing_module: cannot import name": (
        "ImportError: cannot import name 'AutoModelForVision2Seq' from 'transformers' "
        "(/opt/venv/lib/python3.11/site-packages/transformers/__init__.py)",
        "missing_module", "cannot import name 'AutoModelForVision2Seq'"),
    "nan: anomaly detection": (
        "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.",
        "nan", "Function 'MulBackward0' returned nan values"),
    "nan: FloatingPointError": (
        "FloatingPointError: invalid value encountered in divide", "nan", "FloatingPointError: invalid value"),
    "config: Hydra's composition": (
        "hydra.errors.ConfigCompositionException: Could not append to config. An item is already at "
        "'actor_rollout_ref.actor.kl_loss_coef'.", "config", "ConfigCompositionException"),
    "config: omegaconf": (
        "omegaconf.errors.ConfigAttributeError: Missing key kl_ctrl\n    full_key: algorithm.kl_ctrl\n"
        "    object_type=dict", "config", "omegaconf.errors.ConfigAttributeError: Missing key kl_ctrl"),
    "config: verl's loss_agg_mode check": (
        "ValueError: Invalid loss_agg_mode: token-means", "config", "Invalid loss_agg_mode: token-means"),
    "config: klsweep's OverrideError": (
        "klsweep.errors.OverrideError: value nan cannot be passed to verl: use a finite number",
        "config", "OverrideError: value nan"),
    "config: Hydra cannot merge an override": (
        "Error merging override actor_rollout_ref.actor.ppo_epochs=two\nValue 'two' could not be converted to Integer",
        "config", "Error merging override actor_rollout_ref.actor.ppo_epochs=two"),
    "config: verl's config dataclass, with the cause on the next line": (
        "hydra.errors.InstantiationException: Error in call to target 'verl.workers.config.actor.FSDPActorConfig':\n"
        "AssertionError(\"[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
        "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.\")", "config",
        "Error in call to target 'verl.workers.config.actor.FSDPActorConfig': AssertionError(\"[actor] Please set"),
    "killed: WorkerCrashedError": (
        "ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task. Check "
        "python-core-worker-*.log files for more information.", "killed", "WorkerCrashedError"),
    "killed: NodeDiedError": (
        "ray.exceptions.NodeDiedError: Task failed because the node (ip 10.0.0.6) it ran on is dead or unavailable.",
        "killed", "NodeDiedError"),
}


@pytest.mark.parametrize(("failure_lines", "kind", "message"), EACH_PATTERN.values(), ids=EACH_PATTERN)
def test_each_pattern_gives_its_kind(failure_lines, kind, message):
    failure = classify(1, ROUTINE_NOISE + DRIVER_TRACEBACK + failure_lines + "\n" + HYDRA_NOTICE)
    assert (failure.kind, failure.retryable) == (kind, kind in ("nccl", "killed")), failure.message
    assert message in failure.message


#: A generic traceback printed after the out-of-memory line: the driver's report and a worker's later error.
LATER_GENERIC = {
    "a driver RuntimeError": "RuntimeError: Engine core initialization failed. See root cause above.\n",
    "a driver KeyError": "KeyError: 'actor/pg_loss'\n",
    "an NCCL error on a peer after the OOM": (
        "(WorkerDict pid=48213) torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
        "c10d/NCCLUtils.cpp:77, remote process exited or there was a network error\n"),
}


@pytest.mark.parametrize("later", LATER_GENERIC.values(), ids=LATER_GENERIC)
@pytest.mark.parametrize("returncode", [1, 128 + signal.SIGKILL, -signal.SIGABRT])
def test_an_out_of_memory_line_wins_over_what_follows_it(later, returncode):
    stderr = ("(WorkerDict pid=48214) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.17 GiB.\n"
              + DRIVER_TRACEBACK + later + HYDRA_NOTICE)
    failure = classify(returncode, stderr)
    assert failure.kind == "cuda_oom", failure.message
    assert failure.message == stderr.splitlines()[0]
