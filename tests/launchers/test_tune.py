"""The trial process path through real Ray Tune: a stop ends the tree, a crash is an ERROR trial and the sweep goes
on, a SIGKILLed driver leaves nothing behind, and trials on a 2-node cluster never share a GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from ray import tune

from klsweep.launchers.process import attempt_dir

from .conftest import HERE, alive, ran, seconds_until_gone
from .tune_trials import fake_trial, sweep_trial

pytestmark = pytest.mark.slow

NCCL = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
        "unhandled cuda error, NCCL version 2.21.5")


def _pids(trial_dir: Path) -> set[int]:
    run_dir = attempt_dir(trial_dir, 1)
    return set(json.loads((run_dir / "tree.json").read_text()).values()) | {
        json.loads((run_dir / "supervisor.json").read_text())["supervisor_pid"]
    }


def test_stop_and_crash_through_tune(ray_local, tmp_path):
    """The first trial crashes (ERROR, NCCL, retried once) and the sweep goes on; Tune stops the second at step 3
    (as the health stopper does); both trees are gone."""
    long = {"steps": 1000, "interval": 0.05, "grandchildren": 1}
    crash = {"steps": 2, "crash": 1, "grandchildren": 1, "stderr": NCCL}
    tuner = tune.Tuner(
        fake_trial,
        param_space=tune.grid_search([crash, long]),
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="t", stop={"step": 3}, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    results = {("crash" in r.config): r for r in tuner.fit()}
    stopped, crashed = results[False], results[True]

    assert stopped.error is None and stopped.metrics["step"] == 3
    assert [row["step"] for _, row in stopped.metrics_dataframe.iterrows()] == [1, 2, 3]
    assert "nccl: torch.distributed.DistBackendError: NCCL error" in str(crashed.error)
    assert json.loads((Path(crashed.path) / "failure.json").read_text())["kind"] == "nccl"
    assert (attempt_dir(Path(crashed.path), 2) / "exit.json").exists()  # NCCL is retried once (retries=1)
    for name, result in (("stopped", stopped), ("crashed", crashed)):
        print(f"{name} trial: tree gone {seconds_until_gone(_pids(Path(result.path))):.2f} s after fit() returned")


@pytest.mark.fault
def test_sigkill_of_the_sweep_driver(tmp_path):
    """SIGKILL of a real Tune driver: the trial's whole trainer tree is gone within seconds.

    (Ray 2.60's own DashboardAgent and RuntimeEnvAgent of a SIGKILLed driver outlive it, spinning and ignoring
    SIGTERM; not the trial's tree, but this test SIGKILLs them so that it leaves nothing behind either.)
    """
    env = os.environ | {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(HERE.parents[1])}
    driver = subprocess.Popen([sys.executable, str(HERE / "tune_trials.py"), "driver", str(tmp_path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ray_processes: set[int] = set()
    try:
        tree_files: list[Path] = []
        while not tree_files:
            assert driver.poll() is None, "the driver ended before its trial started"
            time.sleep(0.2)
            tree_files = list(tmp_path.glob("killed/*/attempt-1/tree.json"))
        trial = _pids(tree_files[0].parents[1])
        ray_processes = {p.pid for p in psutil.Process(driver.pid).children(recursive=True)} - trial
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        seconds = seconds_until_gone(trial, timeout=30)
        print(f"kill-to-gone driver SIGKILL through Tune: {seconds:.2f} s")
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in ray_processes:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_trials_on_a_two_node_cluster_never_share_a_gpu(tmp_path):
    """2 nodes × 2 logical GPUs, 4 trials of {"gpu": 1} at once: one GPU each, spread over both nodes; every trial's
    files are in the sweep's results directory (Tune's storage_path), the worker node's included (not in Ray's
    node-local staging directory); a trial's process starts its own Ray, not a client of the cluster's."""
    env = os.environ | {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(HERE.parents[1])}
    out = subprocess.run([sys.executable, str(HERE / "tune_trials.py"), "placement", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[0]["nodes_without"] == [], out.stderr[-3000:]  # one machine: both nodes see tmp_path
    trials = lines[1:]
    assert len(trials) == 4, out.stderr[-3000:]
    assert all(t["error"] is None for t in trials)
    assert len({t["node"] for t in trials}) == 2
    for t in trials:
        trial_dir = Path(t["trial_dir"])
        assert trial_dir.parent == tmp_path / "placement"
        assert [len((a / "metrics.jsonl").read_text().splitlines()) for a in ran(trial_dir)] == [4]
    (own,) = [Path(t["trial_dir"]) for t in trials if t["config"]["seed"] == 0]
    own_gcs = json.loads((ran(own)[0] / "ray.json").read_text())["gcs_address"]
    assert own_gcs != lines[0]["gcs"]
    for t in trials:
        assert len(t["gpu_ids"].split(",")) == 1
        assert t["child_cvd"] == t["worker_cvd"] == t["gpu_ids"]  # the process sees exactly the trial's GPU
    concurrent_on_a_node = 0
    for a in trials:
        for b in trials:
            overlap = a is not b and a["start"] < b["end"] and b["start"] < a["end"]
            if overlap and a["node"] == b["node"]:
                concurrent_on_a_node += 1
                assert a["gpu_ids"] != b["gpu_ids"], (a, b)
    assert concurrent_on_a_node > 0  # the check above was exercised (the trials wait for each other to start)
    per_node = {}
    for t in trials:
        per_node.setdefault(t["node"], set()).add(t["gpu_ids"])
    assert all(ids == {"0", "1"} for ids in per_node.values())


def test_a_node_without_the_results_directory_is_refused(tmp_path):
    """A 2-node cluster whose worker node does not see the results directory (its own mount namespace with an empty
    tmpfs over it, as a machine without the shared filesystem): the sweep is refused before it starts, naming the
    node and the fix, and a trial placed on that node fails saying so instead of keeping its files there."""
    env = os.environ | {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(HERE.parents[1])}
    out = subprocess.run([sys.executable, str(HERE / "tune_trials.py"), "unshared", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 3, out.stderr[-3000:]
    (node,) = lines[0]["nodes_without"]
    assert lines[0]["nodes"] == 2
    assert lines[1]["refused"].startswith(f"the results directory {tmp_path} is not visible on node(s) {node} ")
    assert "put the results directory (--out) on a filesystem every node of the cluster mounts" in lines[1]["refused"]
    assert f"ClusterError: the sweep's results directory {tmp_path} is not visible on node {node}, where this " \
           "trial runs" in lines[2]["trial_error"]


def _stop_the_slow_one(trial_id: str, result: dict) -> bool:
    """Stops the trial whose process ignores SIGTERM at its step 2 (as the health stopper or ASHA would)."""
    return bool(result["config"].get("ignore_term")) and result.get("step", 0) >= 2


def test_a_stopped_process_trial_does_not_lose_the_next_one(ray_local, fake_trainer, tmp_path):
    """Two trials one after the other, each holding the whole (2-CPU) Ray as a verl trial holds its GPUs; Tune stops
    the first while its process ignores SIGTERM, so its tree ends only at SIGKILL after the supervisor's grace period
    (5 s, more than the 2 s Ray's reset_config waits for a reused actor's previous trial,
    TUNE_FUNCTION_THREAD_TIMEOUT_S). The second trial runs to its end (not ERROR 'Could not re-use actor' without
    running, with fit() never returning), and starts only once the first trial's tree is gone (Tune gives the
    slot, on a GPU node its GPUs, to the next trial when the stopped actor's stop returns)."""
    from klsweep.orchestrate.tuner import reuse_actors

    assert reuse_actors("embedded") and not reuse_actors("verl") and not reuse_actors(fake_trainer)
    slow_to_stop = {"steps": 1000, "interval": 0.05, "ignore_term": 1}
    all_cpus = ray_local.cluster_resources()["CPU"]  # one slot: the next trial waits for the first one's resources
    tuner = tune.Tuner(
        tune.with_resources(fake_trial, {"cpu": all_cpus}),
        param_space=tune.grid_search([slow_to_stop, {"steps": 3}]),
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=reuse_actors(fake_trainer),
                                    time_budget_s=120),  # a lost trial would leave fit() waiting forever
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="reuse", stop=_stop_the_slow_one, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    stopped, second = sorted(tuner.fit(), key=lambda r: not r.config.get("ignore_term"))

    assert stopped.error is None
    assert [row["step"] for _, row in stopped.metrics_dataframe.iterrows()] == [1, 2]
    assert second.error is None, second.error
    assert [row["step"] for _, row in second.metrics_dataframe.iterrows()] == [1, 2, 3, -1]  # -1: fake_trial's own
    first_run = attempt_dir(Path(stopped.path), 1)  # the trial's files are in the results directory (storage_path)
    assert (first_run / "exit.json").exists(), "the stopped trial's tree outlived its trial"
    first_exit = json.loads((first_run / "exit.json").read_text())
    assert (first_exit["reason"], first_exit["returncode"]) == ("stopped", -signal.SIGKILL)
    tree_gone = (first_run / "exit.json").stat().st_mtime
    print(f"second trial started {second.metrics['start'] - tree_gone:.2f} s after the first trial's tree was gone")
    assert second.metrics["start"] >= tree_gone


def _fake_sweep(*overrides: str):
    """A shipped sweep file whose trials run the fake trainer (the schema knows no such trainer: set after loading)."""
    from klsweep.spec import load_sweep

    return load_sweep(HERE.parents[1] / "sweeps" / "grpo_kl.yaml", overrides).model_copy(update={"trainer": "fake"})


def test_one_tune_result_per_training_step(ray_local, fake_trainer, tmp_path):
    """verl logs step 0 (validation before training), then steps 1..N: Tune gets N results, training_iteration ==
    step, step 0's validation value in step 1's result; so ASHA with max_t = N (as `sweep run` sets it from
    budget.max_steps) stops a trial at step N, not N - 1."""
    from ray.tune.schedulers import ASHAScheduler

    asha = ASHAScheduler(time_attr="training_iteration", metric="actor/entropy", mode="max", max_t=4, grace_period=4)
    tuner = tune.Tuner(
        tune.with_parameters(sweep_trial, sweep=_fake_sweep()),
        param_space={"steps": 6, "interval": 0.05, "val_before_train": 1},
        tune_config=tune.TuneConfig(scheduler=asha),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="steps", verbose=0),
    )
    (result,) = tuner.fit()

    assert result.error is None
    rows = result.metrics_dataframe
    assert list(rows["step"]) == [1, 2, 3, 4]
    assert list(rows["training_iteration"]) == [1, 2, 3, 4]
    assert rows["val-core/fake/acc/mean@1"].tolist()[0] == 0.25 and rows["actor/kl_loss"].tolist()[0] == 0.01


def test_a_trial_past_its_time_limit_fails_and_ends_its_tree(ray_local, fake_trainer, tmp_path):
    """budget.trial_timeout_s: a trial whose process hangs (as verl's start-up can, holding its GPUs) ends with its
    whole tree after that many seconds and is an ERROR trial (FAIL in the study) saying so."""
    sweep = _fake_sweep("budget.trial_timeout_s=2")
    assert sweep.budget.trial_timeout_s == 2
    start = time.monotonic()
    tuner = tune.Tuner(
        tune.with_parameters(sweep_trial, sweep=sweep),
        param_space={"steps": 1, "hang": 1, "grandchildren": 1},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="timeout", verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    (result,) = tuner.fit()

    assert "timeout: timed out after 2 s" in str(result.error)
    assert time.monotonic() - start < 60
    failure = json.loads((Path(result.path) / "failure.json").read_text())
    assert failure["kind"] == "timeout" and failure["message"].startswith("timed out after 2 s")
    assert not attempt_dir(Path(result.path), 2).exists()  # a timeout is not retried
    assert [row["step"] for _, row in result.metrics_dataframe.iterrows()] == [1]
    print(f"timed-out trial: tree gone {seconds_until_gone(_pids(Path(result.path))):.2f} s after fit() returned")


def test_a_trial_tune_retries_resumes_from_its_checkpoint(ray_local, tmp_path):
    """A verl trial that fails with a kind klsweep does not retry itself is retried by Tune (FailureConfig
    max_failures=1) in the same trial directory: it resumes from its checkpoint (step 6, save_freq 10 // 5 = 2), and
    Tune's results have each step once, in order, with training_iteration == step (not starting again at 1), the
    adaptive KL coefficient continuing where it was (verl does not checkpoint it: without the carry-over, step 8
    would use 0.1 × 1.02 instead of 0.1 × 1.02^7)."""
    from tests.launchers.test_resume import ADAPTIVE

    from .tune_trials import verl_trial

    config = ADAPTIVE | {"crash": "once", "crash_after_step": 7, "stderr": "Traceback (most recent call last):\n"
                         "ValueError: a failure klsweep does not retry"}
    tuner = tune.Tuner(
        verl_trial,
        param_space=config,
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="retry", verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    (result,) = tuner.fit()

    assert result.error is None
    rows = pd.read_csv(Path(result.path) / "progress.csv")  # every result of the trial (result.json restarts)
    assert list(rows["step"]) == list(range(1, 11))
    assert list(rows["actor/reward_kl_penalty_coeff"]) == pytest.approx([0.1 * 1.02 ** (s - 1) for s in range(1, 11)])
    trial_dir = Path(result.path)
    assert json.loads((trial_dir / "failure.json").read_text())["kind"] == "error"
    # the first run from step 1, Tune's retry from the step after checkpoint 6
    assert [json.loads((a / "metrics.jsonl").read_text().splitlines()[0])["step"] for a in ran(trial_dir)] == [1, 7]
    assert list(rows["training_iteration"]) == list(range(1, 11))  # restored from the step-7 result: 8, 9, 10


def test_a_verl_trial_is_remedied_from_verls_checkpoint_before_the_finding(ray_local, tmp_path):
    """A remedy on the trial process path: the stand-in's KL runs away (0.5 × step × 0.01 / β, β = kl_coef 0.1 under
    the fixed controller) and passes 0.3 at step 7; the remedy (kl_coef ×2) restarts the same Tune trial from the
    checkpoint before that step that verl still holds, 6 (save_freq 2, 2 kept), with resume_mode=resume_path, and the
    trial ends healthy at step 10 (KL 0.25) with one schedule entry and each step once in result.json, keeping its
    newest verl and Tune checkpoints only."""
    import functools

    from klsweep.health import HealthStopper, load_ruleset
    from klsweep.orchestrate.remedy import REMEDIES, overrides_of
    from klsweep.orchestrate.remedy_tune import KeepRestartPoints, RemedyScheduler
    from klsweep.orchestrate.result_json import ResultsFromCheckpoint
    from klsweep.spec import load_sweep
    from klsweep.trainers.restore import KL_COEF_KEY
    from tests.orchestrate.conftest import sweep_file

    from .tune_trials import Judged, verl_sweep_trial

    rule = {"name": "kl_high", "metric": "actor/reward_kl_penalty", "above": 0.3, "action": "stop",
            "kind": "diverged", "remedy": {"kl_coef": "*2"}, "max_remedies": 1}
    embedded = load_sweep(sweep_file(tmp_path, budget={"max_steps": 10, "trials": 1},
                                     parameters={"kl_coef": {"values": [0.1]}},
                                     health={"preset": "none", "rules": [rule]}))
    # the stand-in's knob rides along with the verl overrides (a sweep file refuses a key that is not verl's)
    # it logs the sweep's objective (score), so the finished trial is the best one and keeps its last checkpoint
    sweep = embedded.model_copy(update={"trainer": "verl", "overrides": {
        **embedded.overrides, "kl_rise": 0.5, "trainer.save_freq": 2, "score": 0.5,
        "score_metric": embedded.objectives[0].metric, "lockstep": 1}})  # verl's steps never outrun the driver
    scheduler = RemedyScheduler(sweep)
    stopper = HealthStopper(load_ruleset(sweep.health), run_config_of=functools.partial(overrides_of, sweep),
                            remedies=scheduler)
    tuner = tune.Tuner(
        tune.with_parameters(verl_sweep_trial, sweep=sweep),
        param_space={"kl_coef": 0.1},
        tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=1, reuse_actors=False),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="remedy", verbose=0, stop=stopper,
                                  callbacks=[ResultsFromCheckpoint(), KeepRestartPoints(sweep),
                                             Judged()],
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    (result,) = tuner.fit()

    assert result.error is None and result.metrics["step"] == 10 and result.metrics["health"] == "healthy"
    [record] = result.config[REMEDIES]
    assert (record["step"], record["from_step"], record["key"]) == (7, 6, KL_COEF_KEY)
    assert (record["old"], record["new"]) == (0.1, pytest.approx(0.2))
    trial_dir = Path(result.path)
    argv = json.loads((ran(trial_dir)[1] / "spec.json").read_text())["argv"]
    assert f"trainer.resume_from_path='{trial_dir / 'checkpoints' / 'global_step_6'}'" in argv
    # kl_high (for 1, no window) restarts from the last checkpoint before its finding's step: with save_freq 2, the
    # finding's own step may hold 1 checkpoint, + the restart point before it: verl keeps 2
    assert "trainer.resume_mode=resume_path" in argv and "trainer.max_actor_ckpt_to_keep=2" in argv
    rows = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert [r["actor/reward_kl_penalty_coeff"] for r in rows] == pytest.approx([0.1] * 6 + [0.2] * 4)
    assert max(r["actor/reward_kl_penalty"] for r in rows[6:]) == pytest.approx(0.25)
    # ended, the best finished trial: verl's checkpoint its tracker names (step 10, the last) and Tune's newest are
    # all that is left
    assert sorted(p.name for p in (trial_dir / "checkpoints").glob("global_step_*")) == ["global_step_10"]
    assert len(list(trial_dir.glob("checkpoint_*"))) == 1
