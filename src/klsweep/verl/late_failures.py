"""What fails a verl trial late, after its GPUs are held, found in its config before a sweep starts.

Each check takes the trial's flat overrides and ``value`` (a dotted key → its value in the composed config) and
returns ``(key, message)`` pairs; each message names the key, the value, why it fails and the fix. Checked against
verl 0.9.1's source:

- :func:`rollout_problems`: a rollout engine wider than the trial's GPUs starts no vLLM server
  (``verl/workers/rollout/llm_server.py``), and a ``max_model_len`` below prompt + response cuts responses short
  (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``).
- :func:`path_problems`: ``~`` and relative data and model paths, which verl reads as given
  (``verl.utils.fs.copy_to_local``) in the trial's own working directory (``attempt-N/``).
- :func:`epoch_problems`: ``trainer.total_epochs`` ending a trial before ``trainer.total_training_steps``
  (``verl/trainer/ppo/v1/trainer_base.py``).
- :func:`megatron_problems`: verl's own ``validate_config`` and config dataclasses for a Megatron actor.

And what a multi-node trial (``trainer.nnodes`` > 1) needs of the Ray cluster it runs on, which only the cluster
can tell: :func:`ray_cpus`, :func:`multinode_requirements`, :func:`job_submit_command`.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from klsweep.verl.config import verl_command

R = "actor_rollout_ref.rollout."
#: CPUs verl reserves per GPU: each GPU bundle of its placement groups is ``{"CPU": max_colocate_count, "GPU": 1}``
#: with ``ResourcePoolManager.max_colocate_count`` 3 (verl/single_controller/ray/base.py).
CPUS_PER_GPU = 3

#: A key → its value in the composed verl config (None when absent).
Value = Callable[[str], Any]
Problem = tuple[str, str]


def rollout_problems(overrides: Mapping[str, Any], value: Value) -> list[Problem]:
    """The rollout engines a trial's GPUs cannot hold, and responses ``max_model_len`` cuts short.

    verl starts ``world_size // (tensor × data × pipeline parallel size)`` vLLM servers, ``world_size`` being
    ``trainer.nnodes × trainer.n_gpus_per_node`` (``LLMServerManager``, verl/workers/rollout/llm_server.py). An engine
    wider than the trial gives 0 servers: the trial holds its GPUs and never generates. verl's default
    ``tensor_model_parallel_size`` is 2, so a 1-GPU trial must set it.

    vLLM serves at most ``max_model_len`` tokens, prompt included: verl caps a response at ``max_model_len`` minus
    its prompt's tokens and raises ValueError for a prompt that leaves no room
    (``vLLMHttpServer.generate``, verl/workers/rollout/vllm_rollout/vllm_async_server.py). ``null`` (verl's default)
    is the model's ``max_position_embeddings``.
    """
    out: list[Problem] = []
    nnodes, per_node = value("trainer.nnodes"), value("trainer.n_gpus_per_node")
    sizes = {name: value(R + name) for name in ("tensor_model_parallel_size", "data_parallel_size",
                                                 "pipeline_model_parallel_size")}
    if _ints(nnodes, per_node, *sizes.values()):
        gpus, width = nnodes * per_node, math.prod(sizes.values())
        if width > gpus:
            key = R + "tensor_model_parallel_size"
            tp = sizes["tensor_model_parallel_size"]
            origin = "" if key in overrides else " (verl's default)"
            fit = max(1, gpus // (width // tp))
            out.append((key, f"{key}={tp}{origin}: each vLLM engine spans tensor × data × pipeline parallel = "
                        f"{' × '.join(map(str, sizes.values()))} = {width} GPUs but a trial has {gpus} "
                        f"(trainer.nnodes × trainer.n_gpus_per_node = {nnodes} × {per_node}), so verl starts "
                        f"{gpus} // {width} = 0 vLLM servers (verl/workers/rollout/llm_server.py) and the trial "
                        f"holds its GPUs without generating. Set {key}: {fit} in overrides"))
    limit = value(R + "max_model_len")
    prompt, response = value("data.max_prompt_length"), value("data.max_response_length")
    if _ints(limit, prompt, response) and limit < prompt + response:
        key = R + "max_model_len"
        out.append((key, f"{key}={limit} is below data.max_prompt_length + data.max_response_length = {prompt} + "
                    f"{response} = {prompt + response}: vLLM cuts a response at {key} minus its prompt's tokens "
                    "(verl's vllm_async_server.py), so long prompts get responses shorter than "
                    "data.max_response_length that response_length/clip_ratio never counts as truncated, and a "
                    f"prompt of {limit} tokens or more fails the trial (ValueError). Set {key}: {prompt + response} "
                    "or more, or remove it (verl then uses the model's max_position_embeddings)"))
    return out


#: The verl keys that name data files or models, as verl reads them.
PATH_KEYS = {"data.train_files": "data file", "data.val_files": "data file",
             "actor_rollout_ref.model.path": "model", "critic.model.path": "model"}
#: A Hugging Face model id: ``org/name``.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def paths_of(overrides: Mapping[str, Any], key: str) -> list[str]:
    """The paths a data or model key names (one path, a list, or Hydra's ``[a,b]``), with or without ``+``."""
    raw = overrides.get(key, overrides.get(f"+{key}"))
    if raw is None:
        return []
    if isinstance(raw, (list, tuple)):
        return [str(p) for p in raw]
    text = str(raw).strip()
    if text.startswith("[") and text.endswith("]"):
        return [p.strip().strip("'\"") for p in text[1:-1].split(",") if p.strip()]
    return [text]


def path_problems(overrides: Mapping[str, Any]) -> list[Problem]:
    """``~`` and relative data and model paths, which fail in the trial and not here.

    verl passes a local path through as given (``verl.utils.fs.copy_to_local``; the data files go to
    ``datasets.load_dataset("parquet")``): ``~`` is not expanded, and a relative path is read from the trial's
    working directory, its own ``attempt-N/`` under the sweep's results. A Hugging Face id (``Qwen/Qwen2.5-0.5B``)
    is a model path that is neither, unless a folder of that name exists here.
    """
    out: list[Problem] = []
    for key, what in PATH_KEYS.items():
        for path in paths_of(overrides, key):
            if "://" in path or os.path.isabs(path) or "${" in path:  # an OmegaConf interpolation resolves in verl
                continue
            if path.startswith("~"):
                out.append((key, f"{key}: the {what} path {path} starts with ~, which verl does not expand "
                            "(verl.utils.fs.copy_to_local reads the path as given): every trial fails when it "
                            f"loads it. Write the absolute path (here: {os.path.expanduser(path)})"))
                continue
            if what == "model" and _HUB_ID.fullmatch(path) and not os.path.isdir(path):
                continue
            out.append((key, f"{key}: the {what} path {path} is relative, and verl reads it from the trial's "
                        "working directory (its own attempt-N/ folder under the sweep's results), where it is not: "
                        f"every trial fails when it loads it. Write the absolute path (from here: "
                        f"{os.path.abspath(path)})"))
    return out


def epoch_problems(overrides: Mapping[str, Any], value: Value) -> tuple[list[Problem], list[Problem]]:
    """``trainer.total_epochs`` ending a trial before ``trainer.total_training_steps``: (problems, warnings).

    verl's trainer runs ``len(train_dataset) // data.train_batch_size`` steps an epoch (its loader drops the last
    partial batch) and stops after ``trainer.total_epochs`` epochs (default 30) or at
    ``trainer.total_training_steps``, whichever comes first (``RayPPOTrainer`` in verl/trainer/ppo/v1/trainer_base.py).
    The rows are counted in the parquet files ``data.train_files`` names when they all are here (pyarrow's footer,
    no data read); verl's optional ``data.filter_overlong_prompts`` can only drop rows, so the steps are an upper
    bound. A file not here gives a warning that it could not be checked.
    """
    steps, epochs, batch = (value(k) for k in ("trainer.total_training_steps", "trainer.total_epochs",
                                               "data.train_batch_size"))
    files = paths_of(overrides, "data.train_files")
    if not _ints(steps, epochs, batch) or steps <= 0 or batch <= 0 or not files:
        return [], []
    key = "trainer.total_epochs"
    if not all(os.path.isabs(f) and os.path.isfile(f) for f in files):
        return [], [(key, f"{key}={epochs} could not be checked against trainer.total_training_steps ({steps}): "
                     f"data.train_files ({', '.join(files)}) is not on this machine, so its rows are unknown here. "
                     f"verl ends a trial after {epochs} epochs of len(data) // data.train_batch_size steps: make "
                     f"sure {epochs} × that is at least {steps}, or set {key} in overrides")]
    try:
        rows = _parquet_rows(files)
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid (not parquet, empty) or OSError
        return [], [(key, f"{key}={epochs} could not be checked against trainer.total_training_steps ({steps}): "
                     f"data.train_files ({', '.join(files)}) could not be read as parquet here ({e}); verl reads "
                     "it with the same library, so check the file")]
    per_epoch = rows // batch
    origin = "" if key in overrides else " (verl's default)"
    if per_epoch == 0:
        return [("data.train_batch_size", f"data.train_batch_size={batch} is more than the {rows} rows of "
                 f"data.train_files ({', '.join(files)}): verl's loader drops the partial batch, so an epoch has 0 "
                 "steps and every trial ends before its first. Use a batch of at most the rows")], []
    if epochs * per_epoch >= steps:
        return [], []
    needed = math.ceil(steps / per_epoch)
    return [(key, f"{key}={epochs}{origin} × {per_epoch} steps an epoch ({rows} rows of data.train_files // "
             f"data.train_batch_size {batch}) = {epochs * per_epoch} steps, fewer than trainer.total_training_steps "
             f"= budget.max_steps = {steps}: verl ends every trial at step {epochs * per_epoch}, before its budget, "
             f"and the trial is recorded as stopped early. Set {key}: {needed} in overrides, or budget.max_steps: "
             f"{epochs * per_epoch}")], []


def _parquet_rows(files: list[str]) -> int:
    import pyarrow.parquet as pq  # on use: a verl dependency, ~0.2 s to import

    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def megatron_problems(cfg, uses_reference: bool, uses_critic: bool) -> list[Problem]:
    """What verl 0.9.1 itself refuses in a Megatron trial's config, before any GPU is used.

    Runs verl's own ``verl.utils.config.validate_config`` (what ``main_ppo`` runs first): the GPUs must divide into
    tensor × pipeline × context parallel groups, the batch into the Megatron data-parallel ranks' micro-batches; the
    actor's config dataclasses (``McoreActorConfig``, ``McoreEngineConfig``: dtype bfloat16 or float16, a positive
    ``max_seqlen_per_dp_cp_rank`` with ``dynamic_context_parallel``, a known ``loss_agg_mode``) and the critic's.
    verl stops at the first refusal, so one problem at most. Importing verl's config classes takes ~6 s.

    Args:
        cfg: the composed verl config (``model_engine: megatron``).
        uses_reference: KL is on (verl's ``need_reference_policy``).
        uses_critic: verl builds a critic (verl's ``need_critic``).
    """
    from verl.utils.config import validate_config  # on use: torch and verl's workers, ~6 s

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # verl prints its checks' progress
            validate_config(config=cfg, use_reference_policy=uses_reference, use_critic=uses_critic)
    except Exception as e:  # noqa: BLE001 - verl raises AssertionError, ValueError or Hydra's InstantiationException
        reason = " ".join(str(e).split()) or type(e).__name__
        key = _named_key(reason)
        return [(key, f"verl 0.9.1 refuses this Megatron config (verl.utils.config.validate_config, which main_ppo "
                 f"runs first): {type(e).__name__}: {reason}. Fix {key} in overrides")]
    return []


def _named_key(reason: str) -> str:
    """The verl key a refusal of ``validate_config`` is about, as best told from its text."""
    full = re.search(r"full_key: ([\w.]+)", reason)
    if full:
        return full.group(1)
    for word, key in (("context_parallel_size", "actor_rollout_ref.actor.megatron.context_parallel_size"),
                      ("model_parallel_size", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"),
                      ("real_train_batch_size", "data.train_batch_size"),
                      ("ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size")):
        if word in reason:
            return key
    return "actor_rollout_ref.actor.megatron"


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


#: Ray's job submission port on the head node (``ray job submit --address http://HEAD:8265``).
DASHBOARD_PORT = 8265


def ray_cpus(value: Value, gpus: int) -> tuple[int, str]:
    """The CPUs a verl run of ``gpus`` GPUs reserves in Ray, and how that number is made up.

    :data:`CPUS_PER_GPU` per GPU, plus, for verl's default v1 trainer (``trainer.use_v1``) with TransferQueue's
    ``SimpleStorage``, its controller and ``transfer_queue.backend.SimpleStorage.num_data_storage_units`` storage
    units (default 8), one CPU each (``@ray.remote(num_cpus=1)`` in transfer_queue/controller.py and
    storage/simple_storage.py): 3 per GPU + 9, 33 for 8 GPUs.
    """
    need, parts = CPUS_PER_GPU * gpus, f"{CPUS_PER_GPU} per GPU × {gpus}"
    if value("trainer.use_v1") and value("transfer_queue.backend.storage_backend") == "SimpleStorage":
        units = value("transfer_queue.backend.SimpleStorage.num_data_storage_units")
        if isinstance(units, int):
            need += 1 + units
            parts += f" + TransferQueue's controller and {units} storage units"
    return need, parts


def multinode_requirements(value: Value) -> list[str]:
    """What the Ray cluster must have for a trial of ``trainer.nnodes`` > 1 (none for one node), one line.

    verl places one placement group per node of ``n_gpus_per_node`` bundles ``{"CPU": 3, "GPU": 1}``,
    ``STRICT_PACK`` (``RayResourcePool.get_placement_groups``, verl/single_controller/ray/base.py), and waits for
    them with no timeout; its TransferQueue actors go on any node (:func:`ray_cpus`). Every node reads the trial's
    data and model paths, and klsweep's trial files (metrics, checkpoints) live in the results directory."""
    nnodes, per_node = value("trainer.nnodes"), value("trainer.n_gpus_per_node")
    if not _ints(nnodes, per_node) or nnodes <= 1:
        return []
    need, parts = ray_cpus(value, nnodes * per_node)
    extra = need - CPUS_PER_GPU * nnodes * per_node
    return [f"multi-node trials: each trial is one Ray job of trainer.nnodes × trainer.n_gpus_per_node = {nnodes} × "
            f"{per_node} GPUs on the sweep's Ray cluster (sweep run --address, or launcher ray-cluster, kuberay, "
            f"slurm; launchers/README.md). The cluster must have at least {nnodes} nodes with {per_node} GPUs and "
            f"{CPUS_PER_GPU * per_node} CPUs free each for verl's workers (one placement group per node of {per_node} "
            f"bundles {{CPU: {CPUS_PER_GPU}, GPU: 1}}, verl/single_controller/ray/base.py), {extra} more CPUs on any "
            f"node ({need} per trial: {parts}) plus budget.resources.cpu for the trial's own actor, and the results "
            f"directory (--out) and the data and model paths at the same path on every node. sweep run checks the "
            f"nodes before any trial starts and runs at most as many trials at once as the cluster holds"]


def job_submit_command(overrides: Mapping[str, Any], head: str = "HEAD") -> str:
    """The ``ray job submit`` line that runs a multi-node trial's verl on a cluster by hand (Ray's job API on the head
    node's dashboard port, :data:`DASHBOARD_PORT`): ``ray job submit --address http://HEAD:8265 -- python3 -m
    verl.trainer.main_ppo k=v ...`` (:func:`klsweep.verl.config.verl_command`)."""
    return f"ray job submit --address http://{head}:{DASHBOARD_PORT} -- {verl_command(overrides)}"
