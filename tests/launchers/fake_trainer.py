"""A stand-in for ``python -m verl.trainer.main_ppo`` in the launcher tests: ``python -m fake_trainer key=value ...``.

It takes verl's Hydra overrides and does what verl 0.9.1's v1 trainer (``verl/trainer/ppo/v1/trainer_base.py``,
``RayPPOTrainer.fit``) does with them, minus the model:

- ``trainer.logger`` (default ``[console,file]``): ``file`` writes through verl's own ``FileLogger``
  (``verl/utils/tracking.py``, loaded from the installed file without importing the rest of verl and its torch
  imports) to ``$VERL_FILE_LOGGER_PATH``; ``console`` prints verl's ``step:N - key:value`` line.
- ``trainer.total_training_steps`` (the test knob ``steps=N`` wins; default 3): steps ``global_steps + 1 .. N``, each
  logging ``actor/kl_loss = step / 100`` and ``actor/entropy = 1 / step``.
- ``trainer.val_before_train=true`` (or ``val_before_train=1``): first a validation line
  ``val-core/fake/acc/mean@1 = 0.25`` at step ``global_steps`` (0, or the resumed step). The stand-in's default is
  false, verl's is true.
- ``algorithm.use_kl_in_reward=true``: ``algorithm.kl_ctrl`` (``type``, ``kl_coef``, ``target_kl``, ``horizon``) builds
  verl's own ``AdaptiveKLController`` or ``FixedKLController`` (their class source from ``core_algos.py``, run with
  numpy only); each step logs ``actor/reward_kl_penalty`` (``kl=``, default 0.2) and ``actor/reward_kl_penalty_coeff``
  (the coefficient before the step's update) and updates it with ``n_steps = data.train_batch_size ×
  actor_rollout_ref.rollout.n``, as ``ray_trainer.apply_kl_penalty`` does. The controller is never checkpointed.
  With the test knob ``kl_rise=R`` the step's KL is a runaway that a larger coefficient holds back: ``R × step ×
  0.01 / β`` (β the coefficient used at the step).
- ``trainer.save_freq`` > 0 with ``trainer.default_local_dir``: every save_freq steps and at the last step, before the
  step's line is logged (verl's order), ``global_step_N/actor/`` and ``global_step_N/data.pt``, then
  ``latest_checkpointed_iteration.txt``; with ``trainer.max_actor_ckpt_to_keep=K`` the ``actor/`` folders of this
  process's saves before the last K are removed (verl's ``BaseCheckpointManager``, which only knows its own saves).
- ``trainer.resume_mode=auto`` (verl's default): resumes from ``latest_checkpointed_iteration.txt`` in
  ``trainer.default_local_dir``; ``resume_path``: from ``trainer.resume_from_path`` (``.../global_step_N``, which must
  exist, as verl's ``_load_checkpoint`` asserts); ``disable`` starts from step 1.
- ``+ray_kwargs.ray_init.address=local``: starts its own Ray (``ray.init(address="local")``, one CPU, no dashboard:
  a GCS, a raylet and workers under it, as verl's main_ppo does) and shuts it down at the end; the GCS address goes
  to ``$PWD/ray.json``. (The session-detached child is ``grandchildren=1``'s.) With ``FAKE_RAY_TIMEOUT_ONCE=1`` in
  the environment, a trial's first such start fails as Ray's own start-up timeout does on a loaded host (the message
  of ``ray/_private/node.py``), so a test can be run again to check it reads the attempts that ran.

Test knobs (plain ``key=value``), for misbehaviour and for what two trials on one host do to each other:

- always: writes ``$PWD/env.json`` with the ``CUDA_VISIBLE_DEVICES`` and ``OMP_NUM_THREADS`` it got.
- ``rendezvous=DIR``: after starting its Ray, writes ``DIR/<pid>`` and waits until two such files exist (at most
  ``rendezvous_s``, default 10 s), so that two trials started together run their steps at the same time.
- ``score=X``: each step also logs ``X`` under ``score_metric`` (default ``critic/score/mean``), an objective the
  retention tests rank trials by.
- ``agent_port=1`` (with its own Ray): waits (at most 20 s) for the port its Ray's dashboard agent records in the
  session directory (``dashboard_agent_listen_port_<node id>``: the port bound, -1 when it could not bind, as
  ray/dashboard/agent.py writes it) and writes it to ``$PWD/agent.json``.
- ``own_ray=0``: starts no Ray even where verl would (a test of what happens before Ray matters).
- ``engine_start=S`` (with ``$FAKE_GPU_DIR``): vLLM's start-up on each GPU of ``CUDA_VISIBLE_DEVICES``, S seconds long,
  before the first step. vLLM measures the device's free memory before and after its profiling and asserts it did
  not grow (``determine_available_memory`` in vllm/v1/worker/gpu_worker.py). The stand-in holds
  ``$FAKE_GPU_DIR/gpu-<id>/starting-<pid>`` for the window and fails with vLLM's ``AssertionError: Error in memory
  profiling ...`` when another engine's window on the GPU overlapped it; each window goes to
  ``$FAKE_GPU_DIR/windows.jsonl`` (``gpu``, ``pid``, ``start``, ``end``: ``time.time()``).
- ``weight_sync=S`` (with its own Ray): each step syncs the weights as verl 0.9.1's colocated vLLM rollout does:
  the socket ``/tmp/rl-colocate-zmq-{job id}-replica-0-rank-0.sock``, the job id from
  ``ray.get_runtime_context().get_job_id()`` (``vllm_rollout/vllm_rollout.py``), is removed if present and bound
  again, held S seconds, then closed and removed (``BucketedWeightSender._init_socket``/``cleanup`` in
  ``vllm_rollout/bucketed_weight_transfer.py``). Where verl would cross-connect two trials or hang, the stand-in
  fails: ``RuntimeError: weight-sync socket ... collision`` when the path answered another live process before the
  removal, or stopped being its own socket before the close. The path goes to ``$PWD/socket.json``.
- ``interval=S``: seconds between steps.
- ``lockstep=1`` (with ``trainer.default_local_dir``): after logging step N, waits (at most 60 s) until the file
  ``judged`` in the trial directory (the checkpoint folder's parent) names step N or later: a test's Tune callback
  writes it once the driver's stopper and scheduler saw the step (``tests/launchers/tune_trials.Judged``). A real verl
  step takes minutes, so verl never runs steps ahead of the driver; the stand-in's 0.02 s steps would, and remove
  checkpoints a remedy planned at an earlier step restarts from.
- ``half_line=1``: after the steps, the first half of one more line, without its newline (a writer killed mid-line).
- ``grandchildren=1``: first starts three sleeping descendants, as verl's own Ray does: a plain child, a child in its
  own session (escapes ``killpg``), and an orphan (its parent exits at once). Their pids go to ``$PWD/tree.json``.
- ``ignore_term=1``: ignores SIGTERM (only SIGKILL ends it).
- ``linger=S``: stays S seconds after the last step before it exits (verl closes its loggers and shuts its own Ray
  down after the last step; a process that exits right after its last line ends before any reader can see it).
- ``hang=1``: sleeps forever after the last step.
- ``crash=1``: after the steps (or after step ``crash_after_step=K``), writes ``$FAKE_TRAINER_STDERR`` to stderr and
  exits with ``exit=`` (default 1); ``crash=SIGKILL`` kills itself with SIGKILL instead; ``crash=once``: crashes only
  in the trial's first attempt.
"""

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time


def parse(argv):
    """``key=value`` overrides as verl's Hydra command line writes them (``klsweep.verl.config.format_overrides``):
    a leading ``+`` dropped, ``[a,b]`` lists, quoted strings, ints, floats, true/false."""
    def value(text):
        if text.startswith("[") and text.endswith("]"):
            return [value(v) for v in text[1:-1].split(",") if v]
        if len(text) >= 2 and text[0] == text[-1] == "'":
            return text[1:-1]
        if text in ("true", "false"):
            return text == "true"
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text
    return {k.lstrip("+"): value(v) for k, v in (a.split("=", 1) for a in argv)}


def verl_file(*parts):
    import importlib.util

    return os.path.join(importlib.util.find_spec("verl").submodule_search_locations[0], *parts)


def verl_file_logger(project, experiment):
    """``verl.utils.tracking.FileLogger`` from the installed verl (its module needs only orjson and packaging)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verl_tracking", verl_file("utils", "tracking.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FileLogger(project, experiment)


def verl_kl_controller(kl_ctrl):
    """verl 0.9.1's ``core_algos.get_kl_controller``: its two controller classes, executed from their source."""
    import numpy

    tree = ast.parse(open(verl_file("trainer", "ppo", "core_algos.py")).read())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("KLController")]
    namespace = {"np": numpy}
    exec(compile(ast.Module(body=classes, type_ignores=[]), "core_algos.py", "exec"), namespace)
    if kl_ctrl.get("type", "fixed") == "adaptive":
        return namespace["AdaptiveKLController"](kl_ctrl.get("kl_coef", 0.001), kl_ctrl.get("target_kl", 0.1),
                                                 kl_ctrl.get("horizon", 10000))
    return namespace["FixedKLController"](kl_ctrl.get("kl_coef", 0.001))


args = parse(sys.argv[1:])
with open("env.json", "w") as f:  # what the launcher gave it
    json.dump({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "cwd": os.getcwd(),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}, f)
if args.get("ignore_term") == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.get("grandchildren") == 1:
    plain = subprocess.Popen(["sleep", "600"])
    session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    orphan_parent = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!"], stdout=subprocess.PIPE, text=True)
    orphan = int(orphan_parent.stdout.readline())
    orphan_parent.wait()
    with open("tree.json.tmp", "w") as f:  # written whole, then renamed: a reader never sees half of it
        json.dump({"trainer": os.getpid(), "plain": plain.pid, "session": session.pid, "orphan": orphan}, f)
    os.replace("tree.json.tmp", "tree.json")
own_ray = "ray_kwargs.ray_init.address" in args and args.get("own_ray") != 0
if own_ray and os.environ.get("FAKE_RAY_TIMEOUT_ONCE") == "1" and not os.path.exists("../ray-timed-out"):
    open("../ray-timed-out", "w").close()
    sys.stderr.write("Exception: The current node timed out during startup. This could happen because some of the "
                     "raylet failed to startup or the GCS has become overloaded.\n")
    sys.exit(1)
if own_ray:  # verl's main_ppo: ray.init(**ray_kwargs.ray_init) unless initialized
    import ray

    ray.init(address=args["ray_kwargs.ray_init.address"], num_cpus=1, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    with open("ray.json", "w") as f:
        json.dump({"gcs_address": ray.get_runtime_context().gcs_address}, f)
    job_id = ray.get_runtime_context().get_job_id()
    if args.get("agent_port") == 1:
        port_file = os.path.join(ray._private.worker.global_worker.node.get_session_dir_path(),
                                 f"dashboard_agent_listen_port_{ray.get_runtime_context().get_node_id()}")
        until = time.monotonic() + 20
        while not (os.path.exists(port_file) and open(port_file).read().strip()) and time.monotonic() < until:
            time.sleep(0.1)
        with open("agent.json", "w") as f:
            json.dump({"port": int(open(port_file).read()) if os.path.exists(port_file) else None}, f)
if "rendezvous" in args:
    open(os.path.join(args["rendezvous"], str(os.getpid())), "w").close()
    met = time.monotonic() + float(args.get("rendezvous_s", 10))
    while len(os.listdir(args["rendezvous"])) < 2 and time.monotonic() < met:
        time.sleep(0.02)


def fail(message):
    sys.stderr.write(message + "\n")
    sys.exit(1)


def engine_start(seconds):
    """vLLM's start-up profiling on each visible GPU (module docstring)."""
    root = os.environ["FAKE_GPU_DIR"]
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    mine = []
    for gpu in gpus:
        os.makedirs(os.path.join(root, f"gpu-{gpu}"), exist_ok=True)
        mine.append(os.path.join(root, f"gpu-{gpu}", f"starting-{os.getpid()}"))
        open(mine[-1], "w").close()
    start = time.time()
    others = {g: set(os.listdir(os.path.dirname(m))) - {os.path.basename(m)} for g, m in zip(gpus, mine)}
    time.sleep(seconds)
    end = time.time()
    for g, m in zip(gpus, mine):
        others[g] |= set(os.listdir(os.path.dirname(m))) - {os.path.basename(m)}
        os.remove(m)
        with open(os.path.join(root, "windows.jsonl"), "a") as f:
            f.write(json.dumps({"gpu": g, "pid": os.getpid(), "start": start, "end": end}) + "\n")
    if any(others.values()):
        fail("AssertionError: Error in memory profiling. Initial free memory 60.00 GiB, current free memory 116.00 "
             "GiB. This happens when other processes sharing the same container release GPU memory while vLLM is "
             f"profiling during initialization. (engines starting on the same GPU: {others})")


def weight_sync(seconds):
    """One weight sync through verl's socket path (module docstring)."""
    import socket

    path = f"/tmp/rl-colocate-zmq-{job_id}-replica-0-rank-0.sock"
    with open("socket.json", "w") as f:
        json.dump({"path": path}, f)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            fail(f"RuntimeError: weight-sync socket {path} collision: another process is bound to it")
        except OSError:
            pass  # a stale file, as verl removes it
        finally:
            probe.close()
        os.remove(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(1)
    inode = os.stat(path).st_ino
    time.sleep(seconds)
    try:
        still_mine = os.stat(path).st_ino == inode
    except FileNotFoundError:
        still_mine = False
    sock.close()
    if not still_mine:
        fail(f"RuntimeError: weight-sync socket {path} collision: another process removed or re-bound it")
    os.remove(path)

loggers = args.get("trainer.logger", ["console", "file"])
loggers = [loggers] if isinstance(loggers, str) else loggers
out = verl_file_logger(args.get("trainer.project_name", "verl_examples"),
                       args.get("trainer.experiment_name", "gsm8k")) if "file" in loggers else None


def log(data, step):
    if out is not None:
        out.log(data=data, step=step)
    if "console" in loggers:
        print(f"step:{step} - " + " - ".join(f"{k}:{v:.3f}" for k, v in data.items()), flush=True)


total = int(args.get("steps", args.get("trainer.total_training_steps", 3)))
save_freq = int(args.get("trainer.save_freq", -1))
checkpoints = args.get("trainer.default_local_dir")
tracker = os.path.join(checkpoints, "latest_checkpointed_iteration.txt") if checkpoints else None
global_steps = 0
if args.get("trainer.resume_mode", "auto") == "auto" and tracker and os.path.exists(tracker):
    global_steps = int(open(tracker).read())
elif args.get("trainer.resume_mode") == "resume_path":
    resume_from = args["trainer.resume_from_path"]
    assert "global_step_" in resume_from and os.path.isdir(resume_from), f"no checkpoint {resume_from}"
    global_steps = int(resume_from.rsplit("global_step_", 1)[1])
kl_ctrl = None
if args.get("algorithm.use_kl_in_reward") is True:
    kl_ctrl = verl_kl_controller({k.split(".")[-1]: v for k, v in args.items() if k.startswith("algorithm.kl_ctrl.")})
    responses = int(args.get("data.train_batch_size", 1024)) * int(args.get("actor_rollout_ref.rollout.n", 1))
crash = args.get("crash")
if crash == "once":
    crash = None if os.path.exists("../crashed-once") else 1
    open("../crashed-once", "w").close()


def judged(path, step, timeout=60.0):
    """Wait until the file ``path`` names ``step`` or a later one; give up after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if int(f.read() or 0) >= step:
                    return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)


def misbehave():
    if crash == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    if crash:
        sys.stderr.write(os.environ.get("FAKE_TRAINER_STDERR", "") + "\n")
        sys.exit(int(args.get("exit", 1)))


if "engine_start" in args:  # verl starts its vLLM servers in init_workers, before validation and step 1
    engine_start(float(args["engine_start"]))
if args.get("trainer.val_before_train", args.get("val_before_train")) in (True, 1):
    log({"val-core/fake/acc/mean@1": 0.25}, global_steps)
saved = []  # this process's checkpoints, oldest first
for step in range(global_steps + 1, total + 1):
    time.sleep(float(args.get("interval", 0.02)))
    if "weight_sync" in args:
        weight_sync(float(args["weight_sync"]))
    data = {"actor/kl_loss": step / 100, "actor/entropy": 1 / step}
    if "score" in args:
        data[args.get("score_metric", "critic/score/mean")] = float(args["score"])
    if kl_ctrl is not None:
        current_kl = float(args.get("kl", 0.2))
        if "kl_rise" in args:
            current_kl = float(args["kl_rise"]) * step * 0.01 / kl_ctrl.value
        data |= {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": kl_ctrl.value}
        kl_ctrl.update(current_kl=current_kl, n_steps=responses)
    if checkpoints and save_freq > 0 and (step == total or step % save_freq == 0):
        folder = os.path.join(checkpoints, f"global_step_{step}")
        os.makedirs(os.path.join(folder, "actor"), exist_ok=True)
        with open(os.path.join(folder, "data.pt"), "w") as f:
            json.dump({"global_steps": step}, f)
        with open(tracker, "w") as f:
            f.write(str(step))
        saved.append(os.path.join(folder, "actor"))
        keep = args.get("trainer.max_actor_ckpt_to_keep")
        while keep and len(saved) > int(keep):
            shutil.rmtree(saved.pop(0))
    log(data, step)
    if args.get("lockstep") == 1 and checkpoints:
        judged(os.path.join(os.path.dirname(os.path.abspath(checkpoints)), "judged"), step)
    if int(args.get("crash_after_step", 0)) == step:
        misbehave()

if args.get("half_line") == 1:
    line = json.dumps({"step": total + 1, "data": {"actor/kl_loss": 0.5}}).encode()
    out.fp.write(line[: len(line) // 2])
time.sleep(float(args.get("linger", 0)))
if args.get("hang") == 1:
    while True:
        time.sleep(1)
misbehave()
if own_ray:
    ray.shutdown()
