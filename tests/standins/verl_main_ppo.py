"""A CPU stand-in for ``python -m verl.trainer.main_ppo`` (verl 0.9.1), for running ``benchmarks/gpu_smoke.sh`` in CI.

``sitecustomize.py`` of this directory runs it in place of verl's module. It takes verl's Hydra overrides, parsed by
Hydra's own override parser as ``main_ppo`` does, and follows verl's synchronous colocated trainer minus the model
and the CUDA work:

- start (``RayPPOTrainer.init_workers``, ``verl/trainer/ppo/v1/trainer_base.py``): the data files
  (``data.train_files``, ``data.val_files``) and the model's ``config.json`` must exist, or it fails as verl does
  when it loads them. One rollout worker process holds the trial's GPU memory: a child in its own session, as
  verl's Ray workers are, so a killed trial's memory is freed only when that process ends. The vLLM engine starts
  awake, then ``checkpoint_manager.sleep_replicas()``, then ``_load_checkpoint`` with ``trainer.resume_mode``
  (``auto``: the step in ``trainer.default_local_dir/latest_checkpointed_iteration.txt``; ``disable``: none), then
  ``on_init_end`` wakes it to sync weights (``PPOTrainerSync``, ``verl/trainer/ppo/v1/trainer_sync.py``).
- ``trainer.val_before_train`` (verl's default true): a validation line at the start step.
- each step ``global_steps + 1 .. trainer.total_training_steps`` (``fit``): generate (awake), ``on_sample_end``
  sleeps the engine (its KV cache freed), train, save when ``trainer.save_freq > 0`` and the step is a multiple of
  it or the last one (``global_step_N/actor/``, ``global_step_N/data.pt``, then
  ``latest_checkpointed_iteration.txt``; ``trainer.max_actor_ckpt_to_keep`` removes this process's older
  ``actor/`` folders, verl's ``BaseCheckpointManager``), ``on_step_end`` wakes it (``update_weights``), validation
  at ``trainer.test_freq`` and the last step, then one logger line: verl's own ``FileLogger``
  (``verl/utils/tracking.py``, loaded from the installed file) to ``$VERL_FILE_LOGGER_PATH`` when ``trainer.logger``
  has ``file``, and the console's ``step:N - key:value`` line.
- metrics of a step, with verl's names: ``critic/score/mean`` (``0.2 + 0.05 × step − kl_loss_coef``), and with
  ``actor_rollout_ref.actor.use_kl_loss``: ``actor/kl_loss`` (``0.02 × step / (1 + 100 × kl_loss_coef)``) and
  ``actor/kl_coef``. verl records ``kl_coef`` once per micro-batch (``verl/workers/utils/losses.py``) and averages
  the list with ``np.mean`` (``reduce_metrics``, ``verl/utils/metric/utils.py``), so ``actor/kl_coef`` is the mean of
  ``ceil(data.train_batch_size × rollout.n × ppo_epochs / ppo_micro_batch_size_per_gpu)`` equal values (one GPU):
  10 values of 0.001 give 0.0010000000000000002. Validation: ``val-core/<data_source>/acc/mean@1``.

With ``trainer.nnodes`` > 1 (a multi-node run on a Ray cluster) there is no local rollout worker: as
``run_ppo`` (``verl/trainer/main_ppo.py``) does, it calls ``ray.init()``, which joins ``$RAY_ADDRESS``, then
:class:`ClusterWorkers` reserves and places the workers as ``RayResourcePool.get_placement_groups`` and
``RayWorkerGroup._init_with_resource_pool`` (``verl/single_controller/ray/base.py``) do: one placement group per node
of ``trainer.n_gpus_per_node`` bundles ``{"CPU": 3, "GPU": 1}`` (``max_colocate_count`` 3), ``STRICT_PACK``, waited
on with ``ray.get(pg.ready())`` and no timeout, then one worker actor per bundle. Each worker touches
``<hydra.run.dir>/beat-<pid>`` every 0.1 s while it lives (its last write is when it died), and the run writes
``<hydra.run.dir>/workers.json``: ``{"placed": time, "workers": [{"pid", "node_id"}, ...]}``.

GPU memory goes to ``$STANDIN_GPU_DIR/<worker pid>.json`` (``{"pid", "gpu", "mib"}``, read by ``bin/nvidia-smi``):
2048 MiB for the actor, plus ``rollout.gpu_memory_utilization × $STANDIN_GPU_TOTAL_MIB`` while the engine is awake,
on the first GPU of ``CUDA_VISIBLE_DEVICES``; an empty ``CUDA_VISIBLE_DEVICES`` fails as verl does without a GPU.

Knobs of the test (environment), standing in for a GPU step's length: ``STANDIN_STEP_S`` seconds per step (default
0); ``STANDIN_RENDEZVOUS=N``: after its first step, wait (at most 60 s) until N stand-ins have started, counted by
the ``started-<pid>`` files each leaves in ``$STANDIN_GPU_DIR``, as trials that run for minutes on a GPU overlap.
(After, not before: klsweep holds a second trial on the GPU until the first one's first metrics line.)
"""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from hydra.core.override_parser.overrides_parser import OverridesParser

ACTOR_MIB = 2048


def overrides(argv):
    """``{key: value}`` of verl's command line, by Hydra's override parser (``+key`` as ``key``)."""
    return {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(argv)}


def verl_file(*parts):
    """A file of the installed verl (``sitecustomize`` made ``verl`` a bare module over its directory)."""
    return os.path.join(sys.modules["verl"].__path__[0], *parts)


def file_logger(project, experiment):
    """``verl.utils.tracking.FileLogger`` from the installed verl (the module needs only orjson and packaging)."""
    spec = importlib.util.spec_from_file_location("verl_tracking", verl_file("utils", "tracking.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FileLogger(project, experiment)


class Rollout:
    """The colocated vLLM engine's GPU memory, held by a worker process, asleep or awake."""

    def __init__(self, utilization):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and not visible.strip():
            raise RuntimeError("Total available GPUs 0 is less than total desired GPUs 1")  # verl's resource check
        self.gpu = int((visible or "0").split(",")[0])
        self.awake_mib = int(utilization * int(os.environ.get("STANDIN_GPU_TOTAL_MIB", "143771")))
        self.worker = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"],
                                       start_new_session=True)
        where = os.environ.get("STANDIN_GPU_DIR")
        self.path = os.path.join(where, f"{self.worker.pid}.json") if where else None
        if where:
            open(os.path.join(where, f"started-{os.getpid()}"), "w").close()

    def hold(self, awake):
        if self.path:
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as f:
                json.dump({"pid": self.worker.pid, "gpu": self.gpu,
                           "mib": ACTOR_MIB + (self.awake_mib if awake else 0)}, f)
            os.replace(tmp, self.path)

    def close(self):
        self.worker.kill()
        self.worker.wait()
        if self.path and os.path.exists(self.path):
            os.remove(self.path)


class ClusterWorkers:
    """A multi-node run's workers, placed across the cluster's nodes as verl places them (module docstring)."""

    def __init__(self, nnodes, per_node, run_dir):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        os.makedirs(run_dir, exist_ok=True)
        ray.init(logging_level="ERROR", log_to_driver=False)  # joins $RAY_ADDRESS, as verl's run_ppo
        bundle = {"CPU": 3, "GPU": 1}
        pgs = [placement_group([dict(bundle) for _ in range(per_node)], strategy="STRICT_PACK")
               for _ in range(nnodes)]
        ray.get([pg.ready() for pg in pgs])  # verl waits with no timeout
        worker = ray.remote(num_cpus=0, num_gpus=1)(Worker)
        self.actors = [worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=i)).remote(run_dir) for pg in pgs for i in range(per_node)]
        placed = ray.get([a.where.remote() for a in self.actors])
        with open(os.path.join(run_dir, "workers.json"), "w") as f:
            json.dump({"placed": time.time(), "workers": placed}, f)

    def hold(self, awake):
        pass

    def close(self):
        pass  # the driver's exit ends its job: Ray kills its actors and removes its placement groups on every node


class Worker:
    """One worker actor: where it runs, and a beat file it touches while it lives."""

    def __init__(self, run_dir):
        import threading

        self.path = os.path.join(run_dir, f"beat-{os.getpid()}")
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self):
        while True:
            with open(self.path, "w") as f:
                f.write(str(time.time()))
            time.sleep(0.1)

    def where(self):
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


def rendezvous(count):
    where, deadline = os.environ.get("STANDIN_GPU_DIR"), time.monotonic() + 60
    while count and where and time.monotonic() < deadline:
        if sum(n.startswith("started-") for n in os.listdir(where)) >= count:
            return
        time.sleep(0.05)


def latest_step(checkpoints):
    """The tracker's step, read as verl's ``find_latest_ckpt_path`` reads it (``int(f.read().decode())``,
    verl/utils/checkpoint/checkpoint_manager.py): 0 without a tracker, ValueError for an empty one."""
    try:
        with open(os.path.join(checkpoints, "latest_checkpointed_iteration.txt"), "rb") as f:
            return int(f.read().decode())
    except FileNotFoundError:
        return 0


def save(checkpoints, step, keep, saved):
    folder = os.path.join(checkpoints, f"global_step_{step}")
    print(f"Saving checkpoint to {folder}", flush=True)  # verl's _save_checkpoint logs this line
    os.makedirs(os.path.join(folder, "actor"), exist_ok=True)
    with open(os.path.join(folder, "actor", "model_world_size_1_rank_0.pt"), "wb") as f:
        f.write(b"\0" * 1024)
    with open(os.path.join(folder, "data.pt"), "wb") as f:
        f.write(b"\0" * 64)
    with open(os.path.join(checkpoints, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(step))
    saved.append(folder)
    while keep and keep > 0 and len(saved) > keep:
        shutil.rmtree(os.path.join(saved.pop(0), "actor"), ignore_errors=True)


def data_source(files):
    import pyarrow.parquet as pq

    return str(pq.read_table(files[0], columns=["data_source"]).column(0)[0])


def main(argv):
    cfg = overrides(argv)
    a = "actor_rollout_ref."
    train, val = cfg.get("data.train_files"), cfg.get("data.val_files")
    train, val = ([f] if isinstance(f, str) else list(f or []) for f in (train, val))
    for f in train + val:
        if not os.path.exists(f):
            raise FileNotFoundError(f"{f} (data.train_files / data.val_files)")
    model = str(cfg.get(a + "model.path"))
    if not os.path.exists(os.path.join(model, "config.json")):
        raise OSError(f"{model} does not appear to have a file named config.json")
    steps = int(cfg.get("trainer.total_training_steps") or 1)
    save_freq, test_freq = int(cfg.get("trainer.save_freq", -1)), int(cfg.get("trainer.test_freq", -1))
    checkpoints = cfg.get("trainer.default_local_dir") or "checkpoints"
    use_kl_loss = bool(cfg.get(a + "actor.use_kl_loss", False))
    coef = float(cfg.get(a + "actor.kl_loss_coef", 0.001))
    responses = int(cfg.get("data.train_batch_size", 1024)) * int(cfg.get(a + "rollout.n", 1))
    micro = math.ceil(responses * int(cfg.get(a + "actor.ppo_epochs", 1))
                      / int(cfg.get(a + "actor.ppo_micro_batch_size_per_gpu")))
    loggers = cfg.get("trainer.logger", ["console"])
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    log = None
    if "file" in loggers:
        log = file_logger(cfg.get("trainer.project_name"), cfg.get("trainer.experiment_name"))

    def record(metrics, step):
        if log is not None:
            log.log(data=metrics, step=step)
        print(f"step:{step} - " + " - ".join(f"{k}:{v:.3f}" for k, v in metrics.items()), flush=True)

    def validate():
        return {f"val-core/{data_source(val)}/acc/mean@1": 0.25}

    nnodes = int(cfg.get("trainer.nnodes", 1))
    if nnodes > 1:
        rollout = ClusterWorkers(nnodes, int(cfg.get("trainer.n_gpus_per_node", 8)), cfg.get("hydra.run.dir", "."))
    else:
        rollout = Rollout(float(cfg.get(a + "rollout.gpu_memory_utilization", 0.5)))
    try:
        rollout.hold(awake=True)  # the engine starts with its weights and KV cache
        rollout.hold(awake=False)  # sleep_replicas before _load_checkpoint
        start = 0 if cfg.get("trainer.resume_mode", "auto") == "disable" else latest_step(checkpoints)
        rollout.hold(awake=True)  # on_init_end: update_weights
        if cfg.get("trainer.val_before_train", True):
            record(validate(), start)
        saved = []
        for step in range(start + 1, steps + 1):
            began = time.monotonic()
            rollout.hold(awake=False)  # on_sample_end: sleep_replicas after generation
            metrics = {"critic/score/mean": 0.2 + 0.05 * step - coef, "actor/pg_loss": -0.01,
                       "response_length/mean": 100.0}
            if use_kl_loss:
                metrics["actor/kl_loss"] = 0.02 * step / (1 + 100 * coef)
                metrics["actor/kl_coef"] = float(np.mean([coef] * micro))
            if save_freq > 0 and (step == steps or step % save_freq == 0):
                save(checkpoints, step, cfg.get("trainer.max_actor_ckpt_to_keep"), saved)
            rollout.hold(awake=True)  # on_step_end: update_weights
            if test_freq > 0 and (step == steps or step % test_freq == 0):
                metrics.update(validate())
            time.sleep(float(os.environ.get("STANDIN_STEP_S", "0")))
            metrics["timing_s/step"] = time.monotonic() - began
            record(metrics, step)
            if step == start + 1:
                rendezvous(int(os.environ.get("STANDIN_RENDEZVOUS", "0")))
    finally:
        rollout.close()
        if log is not None:
            log.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
