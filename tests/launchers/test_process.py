"""The trial process path on CPU: metrics streamed step by step, the whole tree gone on stop, failures classified."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from klsweep.launchers.failures import TrialFailed
from klsweep.launchers.isolation import private_tmp_available
from klsweep.launchers.process import attempt_dir, run_process_trial, stop_running_trials, trial_command

from .conftest import seconds_until_gone, tree_of, wait_for

#: kill-to-gone seconds measured by the tests of this module (printed with -s).
MEASURED: dict[str, float] = {}


def test_metrics_stream_step_by_step(fake_trainer, tmp_path):
    """Each step reaches report while the process still runs (no exit record yet), the last one too: the fake trainer
    lingers after its last line as verl does (a line written by a process in its last instant can only be read after
    it ended). The tail wakes on the write, so this holds with the machine's cores busy."""
    seen = []

    def report(metrics):
        seen.append(dict(metrics))
        assert alive_still(), f"step {metrics['step']} was reported only after the process ended"

    def alive_still():
        return not (attempt_dir(tmp_path, 1) / "exit.json").exists()

    run_process_trial({"steps": 5, "interval": 0.15, "linger": 0.5}, trainer=fake_trainer, trial_dir=tmp_path,
                      report=report)

    written = [json.loads(line) for line in (attempt_dir(tmp_path, 1) / "metrics.jsonl").read_text().splitlines()]
    assert seen == [line["data"] | {"step": line["step"]} for line in written]
    assert [m["step"] for m in seen] == [1, 2, 3, 4, 5]
    assert seen[3]["actor/kl_loss"] == 4 / 100 and seen[3]["actor/entropy"] == 1 / 4
    assert not (tmp_path / "failure.json").exists()
    assert "step:5 - actor/kl_loss:0.050" in (attempt_dir(tmp_path, 1) / "stdout.log").read_text()


@pytest.mark.slow
def test_embedded_trainer_process_streams_and_stops(tmp_path):
    """The real embedded trainer as the trial process: each line it wrote reaches report once and in order, step 0
    (validation before training, as verl logs it) merged into step 1's report; a stop at step 2 ends the process."""
    overrides = {"algorithm.adv_estimator": "grpo", "trainer.total_training_steps": 50, "data.train_batch_size": 4}
    seen, stopped_at = [], []

    def report(metrics):
        seen.append(dict(metrics))
        if metrics["step"] == 2:
            stopped_at.append(time.monotonic())
            raise SystemExit(0)

    with pytest.raises(SystemExit):
        run_process_trial(overrides, trainer="embedded", trial_dir=tmp_path, report=report)
    run_dir = attempt_dir(tmp_path, 1)
    info = json.loads((run_dir / "supervisor.json").read_text())
    MEASURED["stop (embedded trainer)"] = seconds_until_gone({info["pid"], info["supervisor_pid"]}) + (
        time.monotonic() - stopped_at[0])
    assert json.loads((run_dir / "exit.json").read_text())["reason"] == "stopped"
    written = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in seen] == [1, 2]
    assert [line["step"] for line in written[:3]] == [0, 1, 2]
    assert seen == [written[0]["data"] | written[1]["data"] | {"step": 1}, written[2]["data"] | {"step": 2}]
    assert "actor/pg_loss" in seen[0] and "val-core/arith/acc/mean@1" in seen[0]


def test_each_attempt_gets_its_own_metrics_file(fake_trainer, tmp_path):
    for _ in range(2):
        run_process_trial({"steps": 2}, trainer=fake_trainer, trial_dir=tmp_path, report=lambda m: None)
    assert sorted(p.name for p in tmp_path.glob("attempt-*")) == ["attempt-1", "attempt-2"]
    for n in (1, 2):
        assert len((attempt_dir(tmp_path, n) / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("ignore_term", [0, 1], ids=["sigterm", "sigkill-after-grace"])
def test_stop_ends_the_whole_tree(fake_trainer, tmp_path, ignore_term):
    """Card K19: Tune stops a trial by raising SystemExit from tune.report; every descendant, grandchildren included
    (one in its own session, one orphaned), dies."""
    tree: set[int] = set()
    parents: dict[str, int] = {}
    stopped_at: list[float] = []

    def report(metrics):
        if metrics["step"] == 3:
            run_dir = attempt_dir(tmp_path, 1)
            tree.update(tree_of(run_dir))
            parents["orphan"] = psutil.Process(json.loads((run_dir / "tree.json").read_text())["orphan"]).ppid()
            parents["supervisor"] = json.loads((run_dir / "supervisor.json").read_text())["supervisor_pid"]
            stopped_at.append(time.monotonic())
            raise SystemExit(0)

    overrides = {"steps": 1000, "interval": 0.05, "grandchildren": 1, "ignore_term": ignore_term}
    with pytest.raises(SystemExit):
        run_process_trial(overrides, trainer=fake_trainer, trial_dir=tmp_path, report=report, grace_s=1.0)
    assert len(tree) == 5  # supervisor, trainer, plain child, session child, orphan
    assert parents["orphan"] == parents["supervisor"]  # the subreaper adopted the orphan
    gone = seconds_until_gone(tree) + (time.monotonic() - stopped_at[0])
    MEASURED[f"stop ({'SIGKILL after 1 s grace' if ignore_term else 'SIGTERM'})"] = gone
    record = json.loads((attempt_dir(tmp_path, 1) / "exit.json").read_text())
    assert record["reason"] == "stopped"
    assert record["returncode"] == (-signal.SIGKILL if ignore_term else -signal.SIGTERM)
    assert not (tmp_path / "failure.json").exists()  # a stop is not a failure


DRIVER = """
import sys
from klsweep.launchers import process
from klsweep.trainers import TRAINERS
from tests.launchers.conftest import FAKE
TRAINERS["fake"] = FAKE
process.run_process_trial({"steps": 2, "hang": 1, "grandchildren": 1}, trainer="fake", trial_dir=sys.argv[1],
                          report=lambda m: print(m, flush=True))
"""


@pytest.mark.fault
def test_sigkill_of_the_driver_leaves_no_descendant(fake_trainer, tmp_path):
    """Card K19: the process running the trial is SIGKILLed (as when the sweep driver dies): its trainer tree
    follows."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=os.environ.copy())
    run_dir = attempt_dir(tmp_path, 1)
    wait_for(run_dir / "tree.json")
    tree = tree_of(run_dir)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    MEASURED["driver SIGKILL"] = seconds_until_gone(tree)
    assert json.loads((run_dir / "exit.json").read_text())["reason"] == "worker_gone"


STANDIN_DRIVER = """
import dataclasses, sys
from klsweep.trainers import TRAINERS
TRAINERS["verl"] = dataclasses.replace(TRAINERS["verl"], module="fake_trainer")
from klsweep.launchers.process import run_process_trial
run_process_trial({"trainer.total_training_steps": 100, "interval": 0.1, "own_ray": 0}, trainer="verl",
                  trial_dir=sys.argv[1], report=print, retries=0)
"""


@pytest.mark.fault
def test_sigkill_of_the_driver_removes_the_trials_private_tmp(verl_standin, tmp_path):
    """The private /tmp of a verl trial (klsweep.launchers.isolation) goes with its tree, also when the process
    running the trial is SIGKILLed and never reaches its own cleanup: the supervisor removes it."""
    driver = subprocess.Popen([sys.executable, "-c", STANDIN_DRIVER, str(tmp_path)], env=os.environ.copy())
    run_dir = attempt_dir(tmp_path, 1)
    wait_for(run_dir / "metrics.jsonl")
    folders = json.loads((run_dir / "spec.json").read_text())["remove_after"]
    assert all(os.path.isdir(f) for f in folders)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    wait_for(run_dir / "exit.json")
    assert json.loads((run_dir / "exit.json").read_text())["reason"] == "worker_gone"
    assert len(folders) == (1 if private_tmp_available()[0] else 0)
    assert not any(os.path.exists(f) for f in folders)


VERL_DRIVER = """
import sys
from klsweep.launchers.process import run_process_trial
overrides = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.name": "vllm",
             "actor_rollout_ref.model.path": "/nonexistent/model", "trainer.n_gpus_per_node": 1,
             "trainer.total_training_steps": 2, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1}
run_process_trial(overrides, trainer="verl", trial_dir=sys.argv[1], report=print, retries=0)
"""


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_of_the_driver_ends_verls_own_ray(tmp_path):
    """Card K19 with real verl: `python -m verl.trainer.main_ppo` starts its own Ray (GCS, raylet, workers, agents,
    some in their own sessions); SIGKILL of the process running the trial ends all of it. (On this CPU machine verl
    never trains; it gets as far as its TaskRunner actor, which is all the tree this test needs.)"""
    env = os.environ | {"RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", VERL_DRIVER, str(tmp_path)], env=env)
    try:
        run_dir = attempt_dir(tmp_path, 1)
        wait_for(run_dir / "supervisor.json", timeout=60)
        supervisor_pid = json.loads((run_dir / "supervisor.json").read_text())["supervisor_pid"]
        deadline = time.monotonic() + 240
        tree: set[int] = set()
        while not any("raylet" in " ".join(_cmdline(p)) for p in tree):
            assert time.monotonic() < deadline and driver.poll() is None, "verl's Ray never started"
            time.sleep(0.5)
            tree = {p.pid for p in psutil.Process(supervisor_pid).children(recursive=True)}
        time.sleep(3)  # let verl's Ray start its workers and agents too
        tree |= {p.pid for p in psutil.Process(supervisor_pid).children(recursive=True)} | {supervisor_pid}
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        MEASURED[f"driver SIGKILL, real verl with its own Ray ({len(tree)} processes)"] = seconds_until_gone(tree)
    finally:
        if driver.poll() is None:
            driver.kill()


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


#: Real messages (see klsweep.launchers.failures) and the kind each must get.
CRASHES = [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "79.15 GiB of which 1.2 GiB is free.", 1, "cuda_oom"),
    ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor()\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB", 1, "cuda_oom"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "unhandled cuda error, NCCL version 2.21.5", 1, "nccl"),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1) ran "
     "for 600000 milliseconds before timing out.", 1, "nccl"),
    ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'transfer_queue'", 1,
     "missing_module"),
    ("RuntimeError: probability tensor contains either `inf`, `nan` or element < 0", 1, "nan"),
    ("Could not override 'actor_rollout_ref.actor.kl_los_type'.\nTo append to your config use "
     "+actor_rollout_ref.actor.kl_los_type=k3\nKey 'kl_los_type' is not in struct\n"
     "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", 1, "config"),
    ("ValueError: Total available GPUs 0 is less than total desired GPUs 1", 1, "config"),
    # verl 0.9.1 on this machine, without actor.ppo_micro_batch_size_per_gpu:
    ("Error executing job with overrides: ['algorithm.adv_estimator=grpo']\n"
     "Error in call to target 'verl.workers.config.actor.FSDPActorConfig':\n"
     "AssertionError(\"[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
     "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.\")\nfull_key: actor_rollout_ref.actor\n\n"
     "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", 1, "config"),
    ("usage: sweep [-h]\nsweep: error: unrecognized arguments", 2, "config"),
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", 1, "killed"),
    ("RuntimeError: something else went wrong", 1, "error"),
]


@pytest.mark.parametrize(("stderr", "exit_code", "kind"), CRASHES, ids=[c[2] + str(i) for i, c in enumerate(CRASHES)])
def test_a_crash_is_classified(fake_trainer, tmp_path, monkeypatch, stderr, exit_code, kind):
    monkeypatch.setenv("FAKE_TRAINER_STDERR", stderr)
    seen = []
    with pytest.raises(TrialFailed) as failed:
        run_process_trial({"steps": 2, "crash": 1, "exit": exit_code}, trainer=fake_trainer, trial_dir=tmp_path,
                          report=seen.append, retries=0)
    assert failed.value.kind == kind
    assert [m["step"] for m in seen] == [1, 2]  # the steps before the crash still reached Tune
    record = json.loads((tmp_path / "failure.json").read_text())
    assert record["kind"] == kind and record["returncode"] == exit_code
    assert record["retryable"] == (kind in ("nccl", "killed"))
    assert stderr.splitlines()[-1] in record["stderr_tail"]
    assert "HYDRA_FULL_ERROR" not in failed.value.message


def test_only_retryable_failures_get_a_new_attempt(fake_trainer, tmp_path, monkeypatch):
    """An NCCL failure gets a second attempt, which resumes; steps reported before are not reported twice."""
    monkeypatch.setenv("FAKE_TRAINER_STDERR", CRASHES[2][0])
    seen = []
    run_process_trial({"steps": 3, "crash": "once"}, trainer=fake_trainer, trial_dir=tmp_path / "nccl",
                      report=seen.append)
    assert [m["step"] for m in seen] == [1, 2, 3]
    assert json.loads((tmp_path / "nccl" / "failure.json").read_text())["kind"] == "nccl"
    assert (attempt_dir(tmp_path / "nccl", 2) / "exit.json").exists()

    monkeypatch.setenv("FAKE_TRAINER_STDERR", CRASHES[0][0])  # CUDA OOM: would fail again, no retry
    with pytest.raises(TrialFailed, match="cuda_oom"):
        run_process_trial({"steps": 3, "crash": "once"}, trainer=fake_trainer, trial_dir=tmp_path / "oom",
                          report=lambda m: None)
    assert not attempt_dir(tmp_path / "oom", 2).exists()


def test_a_local_ray_that_did_not_start_is_started_again_besides_the_retries(fake_trainer, tmp_path, monkeypatch):
    """Ray's ``ray.init`` gives its local node a fixed 30 s (ray/_private/node.py): on a loaded host the trial's own
    Ray may miss it. Such a start is tried again up to RAY_STARTS times without drawing on ``retries``."""
    from klsweep.launchers.process import RAY_STARTS

    monkeypatch.setenv("FAKE_TRAINER_STDERR", "Exception: The current node timed out during startup. This could "
                       "happen because some of the raylet failed to startup or the GCS has become overloaded.")
    seen: list[dict] = []
    run_process_trial({"steps": 2, "crash": "once"}, trainer=fake_trainer, trial_dir=tmp_path / "once",
                      report=seen.append, retries=0)
    assert [m["step"] for m in seen] == [1, 2]
    assert (attempt_dir(tmp_path / "once", 2) / "exit.json").exists()
    with pytest.raises(TrialFailed, match="ray_start"):
        run_process_trial({"steps": 1, "crash": 1}, trainer=fake_trainer, trial_dir=tmp_path / "always",
                          report=lambda m: None, retries=0)
    assert attempt_dir(tmp_path / "always", RAY_STARTS).exists()
    assert not attempt_dir(tmp_path / "always", RAY_STARTS + 1).exists()


def test_killed_by_a_signal_and_timeout_are_classified(fake_trainer, tmp_path):
    with pytest.raises(TrialFailed) as failed:
        run_process_trial({"steps": 1, "crash": "SIGKILL"}, trainer=fake_trainer, trial_dir=tmp_path / "k",
                          report=lambda m: None, retries=0)
    assert failed.value.kind == "killed" and "SIGKILL" in failed.value.message

    # the timeout runs from the supervisor's start: 5 s leaves a loaded machine the time to start the trainer and its
    # grandchildren and write tree.json before the hang is ended
    start = time.monotonic()
    with pytest.raises(TrialFailed) as failed:
        run_process_trial({"steps": 1, "hang": 1, "grandchildren": 1}, trainer=fake_trainer, trial_dir=tmp_path / "t",
                          report=lambda m: None, timeout_s=5.0, grace_s=1.0)
    assert failed.value.kind == "timeout" and "timed out after 5 s" in failed.value.message
    assert time.monotonic() - start < 60  # a hang is ended, not waited out (the speed is in MEASURED)
    tree = set(json.loads((attempt_dir(tmp_path / "t", 1) / "tree.json").read_text()).values())
    MEASURED["timeout"] = seconds_until_gone(tree)


def test_exit_zero_without_metrics_is_a_failure(fake_trainer, tmp_path):
    with pytest.raises(TrialFailed, match="wrote no metrics"):
        run_process_trial({"steps": 0}, trainer=fake_trainer, trial_dir=tmp_path, report=lambda m: None)


@pytest.mark.slow
def test_verl_command_composes_with_verls_own_config(tmp_path):
    """Card K18: the command line of a verl trial is accepted by verl 0.9.1's own Hydra config, with unique names and
    directories, the file logger, and verl's own Ray (`ray_init.address=local`); RAY_ADDRESS is not inherited."""
    from hydra import compose, initialize_config_dir

    from klsweep.verl.config import config_dir

    overrides = {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.actor.kl_loss_type": "k3+",
        "trainer.experiment_name": "the-sweep-file-name",  # replaced: two trials must never share it
        "trainer.logger": ["console", "wandb"],
    }
    trial_dir = tmp_path / "run_trial_1f2e_00003"
    argv, env = trial_command(overrides, trainer="verl", trial_dir=trial_dir, attempt=2, gpu_ids=[2, 3],
                              base_env={"RAY_ADDRESS": "10.0.0.1:6379", "RAY_RAYLET_PID": "4242", "HOME": "/root"})
    assert argv[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"]
    assert env == {"HOME": "/root", "CUDA_VISIBLE_DEVICES": "2,3", "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled",
                   "VERL_FILE_LOGGER_PATH": str(trial_dir / "attempt-2" / "metrics.jsonl")}
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose("ppo_trainer", overrides=argv[3:], return_hydra_config=True)
    assert cfg.hydra.run.dir == str(trial_dir / "attempt-2" / "hydra")
    assert cfg.trainer.experiment_name == "run_trial_1f2e_00003"
    assert cfg.trainer.default_local_dir == str(trial_dir / "checkpoints")
    assert list(cfg.trainer.logger) == ["console", "wandb", "file"]
    assert cfg.ray_kwargs.ray_init.address == "local"
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "k3+"


def test_ray_token_auth_is_off_unless_the_user_set_it(tmp_path):
    """Ray 2.60 turns token auth on for every new local cluster when RAY_AUTH_MODE is unset: each verl trial's own
    Ray would write ~/.ray/auth_token, racing the other trials' first starts. The trial sets it off, unless the
    user's environment chose a mode (then theirs is kept, token included)."""
    for trainer in ("verl", "embedded"):
        _, env = trial_command({}, trainer=trainer, trial_dir=tmp_path, base_env={"HOME": "/root"})
        assert env["RAY_AUTH_MODE"] == "disabled"
        _, env = trial_command({}, trainer=trainer, trial_dir=tmp_path,
                               base_env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t0k"})
        assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"]) == ("token", "t0k")


def test_a_step_0_line_is_merged_into_step_1(fake_trainer, tmp_path):
    """verl logs validation before training as step 0; it comes with step 1's report, not as a report of its own
    (one report per training step: Tune's training_iteration == step, see test_tune for Tune itself)."""
    seen: list[dict] = []
    run_process_trial({"steps": 3, "val_before_train": 1}, trainer=fake_trainer, trial_dir=tmp_path,
                      report=seen.append)
    assert [m["step"] for m in seen] == [1, 2, 3]
    assert seen[0] == {"val-core/fake/acc/mean@1": 0.25, "actor/kl_loss": 0.01, "actor/entropy": 1.0, "step": 1}
    assert all("val-core/fake/acc/mean@1" not in m for m in seen[1:])

    only_validation: list[dict] = []  # trainer.val_only: a clean run with nothing after step 0 still reports it
    run_process_trial({"steps": 0, "val_before_train": 1}, trainer=fake_trainer, trial_dir=tmp_path / "val_only",
                      report=only_validation.append)
    assert only_validation == [{"val-core/fake/acc/mean@1": 0.25, "step": 0}]


def test_a_line_cut_by_a_crash_leaves_the_crash_its_kind(fake_trainer, tmp_path, monkeypatch):
    """The process dies halfway through writing a line: the trial fails with the crash's own kind (here NCCL, retried
    once), not with a JSON error about the half line; the complete lines before it were reported."""
    monkeypatch.setenv("FAKE_TRAINER_STDERR", CRASHES[2][0])
    seen: list[dict] = []
    with pytest.raises(TrialFailed) as failed:
        run_process_trial({"steps": 2, "half_line": 1, "crash": 1}, trainer=fake_trainer, trial_dir=tmp_path,
                          report=seen.append)
    assert failed.value.kind == "nccl"
    assert [m["step"] for m in seen] == [1, 2]


def test_no_gpu_means_none_visible(tmp_path):
    _, env = trial_command({}, trainer="embedded", trial_dir=tmp_path, gpu_ids=[],
                           base_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(("cpus", "threads"), [(6, "6"), (2.5, "2"), (0.5, "1")])
def test_omp_threads_follow_the_trials_cpus(tmp_path, cpus, threads):
    """As Ray sets it for a worker (floor of its CPUs, at least 1), not what the sweep driver's shell had."""
    _, env = trial_command({}, trainer="embedded", trial_dir=tmp_path, cpus=cpus, base_env={"OMP_NUM_THREADS": "64"})
    assert env["OMP_NUM_THREADS"] == threads
    _, env = trial_command({}, trainer="embedded", trial_dir=tmp_path, base_env={"OMP_NUM_THREADS": "64"})
    assert env["OMP_NUM_THREADS"] == "64"  # no CPU count known: left as it was


def test_the_process_gets_the_omp_threads_of_its_cpus(fake_trainer, tmp_path):
    run_process_trial({"steps": 1}, trainer=fake_trainer, trial_dir=tmp_path, report=lambda m: None, cpus=3)
    assert json.loads((attempt_dir(tmp_path, 1) / "env.json").read_text())["OMP_NUM_THREADS"] == "3"


def test_a_tree_klsweep_stopped_is_not_retried(fake_trainer, tmp_path):
    """The trial actor's cleanup stops the tree while the tail loop runs (stop_running_trials): exit.json says
    "stopped", so the attempt fails with kind stopped and no second attempt starts in the dying actor."""
    failed = []

    def trial():
        try:
            run_process_trial({"steps": 100, "interval": 0.1}, trainer=fake_trainer, trial_dir=tmp_path,
                              report=lambda m: None, retries=2)
        except TrialFailed as e:
            failed.append(e)

    thread = threading.Thread(target=trial)
    thread.start()
    wait_for(attempt_dir(tmp_path, 1) / "metrics.jsonl")
    stop_running_trials()
    thread.join(30)
    assert not thread.is_alive()
    assert [e.kind for e in failed] == ["stopped"]
    assert json.loads((attempt_dir(tmp_path, 1) / "exit.json").read_text())["reason"] == "stopped"
    assert json.loads((tmp_path / "failure.json").read_text())["retryable"] is False
    assert not attempt_dir(tmp_path, 2).exists()


def teardown_module():
    for case, seconds in MEASURED.items():
        print(f"kill-to-gone {case}: {seconds:.2f} s")
