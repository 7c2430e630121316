"""Tune trainables and driver scripts of the launcher tests (run as scripts too: ``python tune_trials.py MODE DIR``).

A trainable here runs :func:`klsweep.launchers.process.run_process_trial` with the stand-in ``fake_trainer``
exactly as ``klsweep.orchestrate.trainable.run_trial`` does with a real trainer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ray.tune import Callback

from klsweep.orchestrate.trainable import run_trial

if TYPE_CHECKING:
    from klsweep.spec import Sweep

HERE = Path(__file__).resolve().parent


def fake_trial(config):
    """Runs the fake trainer with ``config`` as overrides, then reports where it ran (node, GPUs, child's view).

    ``config["stderr"]``, if given, is what a crashing fake trainer writes to stderr. ``config["barrier"]``, if
    given, is a directory where each of ``config["parties"]`` trials signs in before its process starts, waiting
    for all the others (so that their runs overlap by construction, not by timing).
    """
    import ray
    from ray import tune

    from klsweep.launchers import process
    from klsweep.launchers.storage import trial_directory
    from klsweep.trainers import TRAINERS
    from tests.launchers.conftest import FAKE

    config = dict(config)
    os.environ["FAKE_TRAINER_STDERR"] = config.pop("stderr", "")
    barrier, parties = config.pop("barrier", None), config.pop("parties", 0)
    if barrier:
        Path(barrier, str(config["seed"])).touch()
        deadline = time.monotonic() + 120
        while len(list(Path(barrier).iterdir())) < parties and time.monotonic() < deadline:
            time.sleep(0.05)
    TRAINERS["fake"] = FAKE
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    start = time.time()
    process.run_process_trial(config, trainer="fake")
    trial_dir = trial_directory()  # where run_process_trial put the trial's files: in the results directory
    child = json.loads((process.attempt_dir(trial_dir, 1) / "env.json").read_text())
    tune.report({
        "step": -1,
        "node": ray.get_runtime_context().get_node_id(),
        "gpu_ids": ",".join(str(i) for i in ray.get_gpu_ids()),
        "worker_cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "child_cvd": child["CUDA_VISIBLE_DEVICES"],
        "start": start,
        "end": time.time(),
        "trial_dir": str(trial_dir),
    })


fake_trial.__mixins__ = run_trial.__mixins__  # as a sweep's trainable: a stopped trial's tree ends before Tune moves on


def verl_trial(config):
    """:func:`~klsweep.launchers.process.run_process_trial` of a ``trainer: verl`` trial whose main_ppo is the stand-in
    (``fake_trainer.py``), with ``config`` as its verl overrides; ``config["stderr"]`` as in :func:`fake_trial`."""
    import dataclasses

    from klsweep.launchers import process
    from klsweep.trainers import TRAINERS

    config = dict(config)
    os.environ["FAKE_TRAINER_STDERR"] = config.pop("stderr", "")
    TRAINERS["verl"] = dataclasses.replace(TRAINERS["verl"], module="fake_trainer")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    process.run_process_trial(config, trainer="verl")


verl_trial.__mixins__ = run_trial.__mixins__


class Judged(Callback):
    """Writes the step of each result the driver has judged (Tune calls its callbacks after the stopper and the
    scheduler) to ``judged`` in the trial's directory, where the stand-in's ``lockstep=1`` waits for it."""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        path = Path(trial.storage.trial_fs_path, "judged")
        path.with_name("judged.tmp").write_text(str(result["step"]))
        path.with_name("judged.tmp").replace(path)


def verl_sweep_trial(config, sweep: Sweep):
    """:func:`klsweep.orchestrate.trainable.run_trial` itself with ``sweep`` (whose ``trainer`` is ``verl``), the
    stand-in as verl's main_ppo: a remedied trial restarts it from verl's checkpoint."""
    import dataclasses

    from klsweep.trainers import TRAINERS

    TRAINERS["verl"] = dataclasses.replace(TRAINERS["verl"], module="fake_trainer")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    run_trial(config, sweep=sweep)


verl_sweep_trial.__mixins__ = run_trial.__mixins__


def sweep_trial(config, sweep: Sweep):
    """:func:`klsweep.orchestrate.trainable.run_trial` itself with ``sweep`` (whose ``trainer`` is ``fake``), as the
    sweep's Tuner runs it; ``config`` are the trial's params (for the fake trainer: ``steps``, ``hang``, ...)."""
    from klsweep.trainers import TRAINERS
    from tests.launchers.conftest import FAKE

    TRAINERS["fake"] = FAKE
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    run_trial(config, sweep=sweep)


sweep_trial.__mixins__ = run_trial.__mixins__


def placement(out_dir: str) -> None:
    """2 nodes × 2 logical GPUs, 4 concurrent trials of 1 GPU each (the first starts its own Ray, as verl's main_ppo
    does with ``+ray_kwargs.ray_init.address=local``): prints which nodes do not see ``out_dir``, the cluster's GCS
    address, then one JSON line per trial."""
    import ray
    from ray import tune
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2})
    cluster.add_node(num_cpus=2, num_gpus=2)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cluster.wait_for_nodes()
        from klsweep.launchers.storage import nodes_without

        print(json.dumps({"nodes_without": nodes_without(Path(out_dir)), "gcs": cluster.address}), flush=True)
        trainable = tune.with_resources(fake_trial, {"cpu": 1, "gpu": 1})
        barrier = Path(out_dir, "barrier")  # the 4 trials fit the 4 GPUs at once: each waits for the others
        barrier.mkdir()
        own_ray = {"+ray_kwargs.ray_init.address": "local"}
        tuner = tune.Tuner(
            trainable,
            param_space=tune.grid_search([{"steps": 4, "interval": 0.5, "seed": seed, "barrier": str(barrier),
                                           "parties": 4} | (own_ray if seed == 0 else {}) for seed in range(4)]),
            tune_config=tune.TuneConfig(max_concurrent_trials=4),
            run_config=tune.RunConfig(storage_path=out_dir, name="placement", verbose=0),
        )
        for result in tuner.fit():
            print(json.dumps(result.metrics | {"error": str(result.error) if result.error else None}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


def unshared(out_dir: str) -> None:
    """A 2-node cluster whose worker node does not see ``out_dir`` (it runs in its own mount namespace, ``unshare -m``,
    with an empty tmpfs over ``out_dir``, as a machine without the shared filesystem would): prints the nodes that do
    not see it, the refusal of :func:`require_shared_results`, and the error of a trial placed on that node."""
    import signal
    import subprocess

    import ray
    from ray import tune
    from ray.cluster_utils import Cluster

    from klsweep.errors import ClusterError
    from klsweep.launchers.storage import nodes_without, require_shared_results

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray_cli = str(Path(sys.executable).with_name("ray"))
    worker = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs none "$0" && exec "$1" start --address="$2" --num-cpus=1 '
         '--resources=\'{"isolated": 1}\' --block', out_dir, ray_cli, cluster.address],
        start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        deadline = time.monotonic() + 60
        while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        print(json.dumps({"nodes": sum(n["Alive"] for n in ray.nodes()),
                          "nodes_without": nodes_without(Path(out_dir))}), flush=True)
        try:
            require_shared_results(Path(out_dir))
            print(json.dumps({"refused": None}), flush=True)
        except ClusterError as e:
            print(json.dumps({"refused": str(e)}), flush=True)
        tuner = tune.Tuner(tune.with_resources(fake_trial, {"cpu": 1, "isolated": 1}), param_space={"steps": 1},
                           run_config=tune.RunConfig(storage_path=out_dir, name="unshared", verbose=0))
        (result,) = tuner.fit()
        print(json.dumps({"trial_error": str(result.error)}), flush=True)
    finally:
        ray.shutdown()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        cluster.shutdown()


def driver(out_dir: str) -> None:
    """A sweep driver with one hanging trial, to be SIGKILLed by the test."""
    import ray
    from ray import tune

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    tuner = tune.Tuner(
        fake_trial,
        param_space={"steps": 2, "hang": 1, "grandchildren": 1},
        run_config=tune.RunConfig(storage_path=out_dir, name="killed", verbose=0),
    )
    tuner.fit()


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    {"placement": placement, "unshared": unshared, "driver": driver}[sys.argv[1]](sys.argv[2])
