"""Preflight: reject a trial config verl would reject (or silently misuse) before any trial starts.

One call per distinct trial config. It composes verl 0.9.1's own config with the overrides; unknown keys fail with
the closest valid key. It then checks:

- that each value has the type of verl's default for its key (:func:`type_problems`);
- the values verl only rejects after the first rollout (:func:`klsweep.verl.config.check_values`);
- the batch arithmetic (verl#2505);
- the values that break verl's KL controller or loss aggregation at the first update
  (:func:`klsweep.verl.numerics.numeric_problems`);
- the keys a real verl run needs, as ``verl.utils.config.validate_config`` and the actor/critic configs'
  ``__post_init__`` require them;
- that the models' attention implementation is installed;
- that the local data files and model folders it names exist (:func:`missing_files`);
- what fails a verl trial late (:mod:`klsweep.verl.late_failures`): a rollout engine wider than the trial's GPUs,
  ``max_model_len`` below prompt + response, ``~`` or relative paths, ``trainer.total_epochs`` ending the trial
  before its steps, and for a Megatron actor verl's own ``validate_config``;
- for a multi-node trial (``trainer.nnodes`` > 1), what the Ray cluster must have
  (:func:`klsweep.verl.late_failures.multinode_requirements`: nodes, GPUs and CPUs per node, shared paths), as a
  warning: only ``sweep run`` sees the cluster;
- the installed verl version.

Cost: ~10 ms per config after the first. The first takes ~1 s, and ~8 s more when a trial uses the adaptive KL
controller, which imports verl's core_algos.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from klsweep.errors import OverrideError, PreflightError
from klsweep.verl.config import ENGINE_KEY, check_values, compose, default_keys, engine_of
from klsweep.verl.late_failures import (
    epoch_problems,
    megatron_problems,
    multinode_requirements,
    path_problems,
    paths_of,
    rollout_problems,
)
from klsweep.verl.managed import checkpoint_cadence_warnings, managed_key_problems
from klsweep.verl.numerics import numeric_problems

VERL_VERSION = "0.9.1"

A = "actor_rollout_ref."


def preflight(
    overrides: Mapping[str, Any],
    *,
    runs_verl: bool,
    allow_negative_kl: bool = False,
    where: Mapping[str, str] | None = None,
    has_flash_attn: bool | None = None,
    files_here: bool = False,
) -> list[str]:
    """Check one trial's flat verl overrides.

    Args:
        overrides: the trial's full override dict (e.g. from :func:`klsweep.spec.space.trial_overrides`).
        runs_verl: the trials are verl's own ``main_ppo`` (the trainer's ``TrainerKind.runs_verl``): GPU counts from
            ``trainer.nnodes`` × ``trainer.n_gpus_per_node``, and the keys a real run needs. False: one device.
        allow_negative_kl: the sweep's opt-in for negative KL coefficients.
        where: verl key → ``FILE:LINE`` of the sweep-file entry it came from, put in front of each message.
        has_flash_attn: whether the ``flash_attn`` package is importable where the trials run; None (the default)
            looks in this Python (``importlib.util.find_spec("flash_attn")``). Only ``runs_verl`` uses it.
        files_here: the trials run on this machine (a private local Ray): a local data file or model folder that is
            missing here (:func:`missing_files`) is a problem; otherwise a warning (the trials' nodes may have it).

    Returns:
        warnings (one line each), e.g. a KL mechanism on with coefficient 0 (verl#6519), a missing local file.

    Raises:
        PreflightError: every problem, one per line.
    """
    where = where or {}

    def at(key: str, message: str) -> str:
        line = where.get(key) or where.get(f"+{key}")
        return f"{line}: {message}" if line else message

    problems: list[str] = []
    warnings: list[str] = []
    installed = _installed_verl()
    if installed != VERL_VERSION:
        problems.append(f"verl {installed} is installed but klsweep knows verl {VERL_VERSION}'s config and "
                        f"functions: pip install verl=={VERL_VERSION}")
    try:
        cfg = compose(overrides)
    except OverrideError as e:
        key = next((k for k in overrides if f"'{k.lstrip('+')}'" in str(e)), "")
        raise PreflightError("\n".join(problems + [at(key, str(e))])) from None
    mistyped = type_problems(cfg, overrides)
    if mistyped:  # the checks below compute with the values: they check the rest, with verl's defaults in their place
        problems += [at(k, m) for k, m in mistyped]
        bad = {k for k, _ in mistyped}
        overrides = {k: v for k, v in overrides.items() if k.lstrip("+") not in bad}
        cfg = compose(overrides)
    try:
        check_values(cfg, allow_negative_kl=allow_negative_kl)
    except OverrideError as e:
        for part in e.problems:  # each starts with "KEY=VALUE"
            key = part.split("=", 1)[0]
            problems.append(at(key, part))
    value = functools.partial(_select, cfg)
    problems += [at(k, m) for k, m in _batch_problems(value, runs_verl)]
    problems += [at(k, m) for k, m in numeric_problems(value)]
    if runs_verl:
        problems += [at(k, m) for k, m in _required(overrides, value)]
        if has_flash_attn is None:
            has_flash_attn = importlib.util.find_spec("flash_attn") is not None
        if not has_flash_attn:
            problems += [at(k, m) for k, m in _attention(value)]
        problems += [at(k, m) for k, m in rollout_problems(overrides, value) + path_problems(overrides)]
        epoch_errors, epoch_warnings = epoch_problems(overrides, value)
        problems += [at(k, m) for k, m in epoch_errors]
        warnings += [at(k, m) for k, m in epoch_warnings]
        missing = [at(k, m) for k, m in missing_files(overrides, here=files_here)]
        (problems if files_here else warnings).extend(missing)
        warnings += [at("trainer.nnodes", m) for m in multinode_requirements(value)]
    problems += [at(k, m) for k, m in managed_key_problems(overrides, runs_verl=runs_verl, launcher_keys=False)]
    if runs_verl and not problems and engine_of(overrides) == "megatron":  # verl stops at its first refusal
        uses_reference = bool(value(A + "actor.use_kl_loss") or value("algorithm.use_kl_in_reward"))
        problems += [at(k, m) for k, m in megatron_problems(cfg, uses_reference, _uses_critic(value))]
    if problems:
        raise PreflightError("\n".join(problems))
    cadence = checkpoint_cadence_warnings(overrides, runs_verl=runs_verl)
    return warnings + [at(k, m) for k, m in _zero_coef(value) + cadence]


def _installed_verl() -> str:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return "(none)"


def _select(cfg, key: str) -> Any:
    from omegaconf import OmegaConf  # on use: ~0.25 s to import, more than klsweep.spec

    return OmegaConf.select(cfg, key, throw_on_missing=False, default=None)


def type_problems(cfg, keys: Iterable[str]) -> list[tuple[str, str]]:
    """``(key, message)`` for each of ``keys`` whose value in ``cfg`` has another type than verl's default there.

    A bool default takes only true/false: verl's plain-YAML config takes any type, and a string where verl has a bool
    is always truthy. A number default (int or float) takes any number, not a bool or a string; a whole number may
    stand for a float, as verl's yaml writes some float fields (``entropy_coeff: 0``). A string default takes no
    number or bool. Not checked: a null, list or mapping default, a key verl lacks (``+key``), a null value.

    Args:
        cfg: a composed verl config (:func:`klsweep.verl.config.compose`); its ``model_engine`` picks the defaults.
        keys: the override keys, with or without Hydra's ``+``.
    """
    defaults = _default_values(str(_select(cfg, ENGINE_KEY) or "dp"))
    out: list[tuple[str, str]] = []
    for key in dict.fromkeys(k.lstrip("+") for k in keys):
        default = defaults.get(key)
        try:
            value = _select(cfg, key)
        except Exception:  # an interpolation that does not resolve here: left to verl's own error
            continue
        want, got = _kind(default), _kind(value)
        if want is None or value is None or got == want or (want == "string" and got is None):
            continue
        if want == "bool":
            out.append((key, f"{key}={value!r} is not true/false but verl reads it as a bool (any non-empty string "
                             "counts as true): write true or false"))
        elif want == "number":
            fix = "write a number without quotes" if got == "string" else "write a number, not true/false"
            out.append((key, f"{key}={value!r} is not a number but verl computes with it (its default is "
                             f"{default!r}), so every trial would fail when verl reads it: {fix}, e.g. {default!r}"))
        else:
            out.append((key, f"{key}={value!r} is a {got} but verl reads it as a string (its default is {default!r}): "
                             f"write the text in quotes, e.g. '{value}'"))
    return out


def _kind(value: Any) -> str | None:
    """``bool``, ``number``, ``string`` or None (null, a list, a mapping): the types :func:`type_problems` tells."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else None


@functools.lru_cache(maxsize=None)
def _default_values(engine: str) -> dict[str, Any]:
    """verl's default value of each key (interpolations resolved) under the ``model_engine`` ``engine``."""
    from omegaconf import OmegaConf  # on use: ~0.25 s to import, more than klsweep.spec

    cfg = compose({ENGINE_KEY: engine} if engine != "dp" else {})
    return {k: OmegaConf.select(cfg, k, throw_on_resolution_failure=False) for k in default_keys(engine)}


def _batch_problems(value, on_gpus: bool) -> list[tuple[str, str]]:
    """Batch arithmetic verl checks late or not at all (verl#2505; verl.utils.config.validate_config)."""
    if value(A + "actor.use_dynamic_bsz"):
        return []
    nnodes, per_node = value("trainer.nnodes"), value("trainer.n_gpus_per_node")
    n_gpus = nnodes * per_node if on_gpus else 1
    gpus = f"(trainer.nnodes × trainer.n_gpus_per_node = {nnodes} × {per_node})" if on_gpus else "(1 device)"
    ranks = "GPUs"
    if on_gpus and value(A + "actor.strategy") == "megatron":  # data-parallel ranks (verl's validate_config)
        group = math.prod(value(A + f"actor.megatron.{k}_parallel_size") or 1
                          for k in ("tensor_model", "pipeline_model", "context"))
        if n_gpus % group:
            return []  # megatron_problems: verl's own refusal
        n_gpus //= group
        ranks = "data-parallel ranks"
        gpus = (f"(Megatron data-parallel ranks = {nnodes} × {per_node} GPUs / tensor × pipeline × context parallel "
                f"{group})")
    batch, n = value("data.train_batch_size"), value(A + "rollout.n")
    out: list[tuple[str, str]] = []
    if (batch * n) % n_gpus:
        out.append(("data.train_batch_size", f"data.train_batch_size × rollout.n = {batch} × {n} = {batch * n} "
                    f"sequences do not split evenly over {n_gpus} GPUs {gpus}: make it a multiple of {n_gpus}"))
    for role, mini_key, micro_key in (
        ("actor", A + "actor.ppo_mini_batch_size", A + "actor.ppo_micro_batch_size_per_gpu"),
        ("critic", "critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    ):
        if role == "critic" and value("algorithm.adv_estimator") != "gae":
            continue
        mini, micro = value(mini_key), value(micro_key)
        if batch < mini:
            out.append((mini_key, f"{mini_key} ({mini}) is larger than data.train_batch_size ({batch}): "
                        "lower it to at most the batch"))
            continue
        if batch % mini:
            out.append((mini_key, f"data.train_batch_size ({batch}) is not a multiple of {mini_key} ({mini}): the "
                        "last mini-batch of each step would be short. Use a divisor of the batch"))
        share, rest = divmod(mini * n, n_gpus)
        arithmetic = (f"{role} mini-batch per GPU = ppo_mini_batch_size × rollout.n / {ranks} = {mini} × {n} / "
                      f"{n_gpus}")
        if rest:
            out.append((mini_key, f"{arithmetic} is not a whole number {gpus}: make {mini * n} a multiple of {n_gpus}"))
        elif micro is not None and micro > share:
            out.append((micro_key, f"{micro_key} ({micro}) is larger than the {arithmetic} = {share}: "
                        f"verl would train on padded/empty micro-batches (NaN losses, verl#2505). Use at most {share}"))
        elif micro is not None and share % micro:
            out.append((micro_key, f"{micro_key} ({micro}) does not divide the {arithmetic} = {share}: a remainder "
                                         "would leave one micro-batch short; use a divisor"))
    return out


def _required(overrides: Mapping[str, Any], value) -> list[tuple[str, str]]:
    """Keys a real verl run needs that verl's defaults do not give (placeholders such as ~/models/...).

    Also the micro-batch sizes verl requires: exactly one of ``X_micro_batch_size`` (deprecated) and
    ``X_micro_batch_size_per_gpu``. The actor update, the rollout's log-prob pass and, with KL on, the reference's
    need one unless ``actor.use_dynamic_bsz`` (``verl.utils.config.validate_config``, ``ActorConfig.__post_init__``).
    The critic update needs one unless ``critic.use_dynamic_bsz`` (``CriticConfig.__post_init__``,
    verl/workers/config)."""
    need = {
        A + "rollout.name": "the inference engine: vllm, sglang or trtllm (verl has no CPU rollout)",
        A + "model.path": "the actor model (a Hugging Face id or local path); the reference model is the same",
        "data.train_files": "the training parquet file(s)",
        "data.val_files": "the validation parquet file(s)",
    }
    critic = _uses_critic(value)
    if critic:
        need["critic.model.path"] = ("the critic model: verl builds a critic (gae, or critic.enable) and does "
                                     "not default it to the actor's")
    out = [(key, f"{key} is required with trainer: verl — {why}; set it in overrides")
           for key, why in need.items() if key not in overrides and f"+{key}" not in overrides]

    dynamic = A + "actor.use_dynamic_bsz"
    micro: list[tuple[str, str, str]] = []  # (deprecated key, what it sizes, the switch that makes it unnecessary)
    if not value(dynamic):
        micro.append((A + "actor.ppo_micro_batch_size", "micro-batch of the actor update", dynamic))
        micro.append((A + "rollout.log_prob_micro_batch_size", "micro-batch of the rollout's log-prob pass", dynamic))
        if value(A + "actor.use_kl_loss") or value("algorithm.use_kl_in_reward"):
            micro.append((A + "ref.log_prob_micro_batch_size", "micro-batch of the reference log-prob pass (KL is on)",
                          dynamic))
    if critic and not value("critic.use_dynamic_bsz"):
        micro.append(("critic.ppo_micro_batch_size", "micro-batch of the critic update", "critic.use_dynamic_bsz"))
    for old, why, switch in micro:
        per_gpu = old + "_per_gpu"
        old_value, per_gpu_value = value(old), value(per_gpu)
        if old_value is None and per_gpu_value is None:
            out.append((per_gpu, f"{per_gpu} is required with trainer: verl — {why}; verl refuses to start without "
                        f"it unless {switch}=true. Set it in overrides (or set {switch}=true)"))
        elif old_value is not None and per_gpu_value is not None:
            out.append((old, f"{old}={old_value} and {per_gpu}={per_gpu_value} are both set: verl refuses both "
                        f"(the former is deprecated). Remove {old} and keep {per_gpu}"))
    return out


#: The verl keys that name local files or folders: data files (one path or a list) and models (a local folder or a
#: Hugging Face id), as verl reads them (``verl.utils.fs.copy_to_local`` passes a local path through as is).
_PATH_KEYS = {"data.train_files": "data file", "data.val_files": "data file", A + "model.path": "model",
              "critic.model.path": "model"}


def missing_files(overrides: Mapping[str, Any], *, here: bool = False) -> list[tuple[str, str]]:
    """``(key, message)`` for each absolute local path of a verl trial that does not exist on this machine.

    The paths checked are the data files (``data.train_files``/``val_files``, a path or a list) and the model folders
    (``actor_rollout_ref.model.path``, ``critic.model.path``). Hugging Face ids (``Qwen/Qwen2.5-0.5B-Instruct``),
    remote URLs (``hdfs://``, ``s3://``), ``~`` and relative paths are not checked here: verl reads those as given in
    the trial's directory (:func:`klsweep.verl.late_failures.path_problems`).

    Args:
        overrides: the trial's flat verl overrides (keys with or without Hydra's ``+``).
        here: the trials run on this machine; the message then says every trial would fail, else that the nodes
            that run the trials need it.
    """
    out = []
    for key, what in _PATH_KEYS.items():
        for path in paths_of(overrides, key):
            if "://" in path or not os.path.isabs(path) or os.path.exists(path):
                continue  # ~ and relative paths: late_failures.path_problems
            then = ("every trial would fail when verl loads it. Fix the path, or run the sweep with --address on a "
                    "cluster whose nodes have it" if here else
                    "the nodes that run the trials must have it, or every trial fails when verl loads it")
            out.append((key, f"{key}: the {what} {path} does not exist on this machine: {then}"))
    return out


def _uses_critic(value) -> bool:
    """Whether verl builds a critic: ``critic.enable`` if set, else gae (``verl.trainer.ppo.utils.need_critic``)."""
    enable = value("critic.enable")
    return bool(enable) if enable is not None else value("algorithm.adv_estimator") == "gae"


_INSTALL = "pip install flash-attn --no-build-isolation (on every node that runs trials)"


def _attention(value) -> list[tuple[str, str]]:
    """Without the ``flash_attn`` package, a model that asks for flash attention fails to build (transformers raises
    ImportError at ``from_pretrained``), so every trial dies at model init; ``klsweep[gpu]`` does not install it.

    The actor's model (also the reference's) asks for ``actor_rollout_ref.model.override_config.attn_implementation``,
    default ``flash_attention_2`` (``HFModelConfig``, verl/workers/config/model.py), and ``use_remove_padding``
    defaults to true (verl/trainer/config/model/hf_model.yaml). Both fall back: ``sdpa`` attention with
    ``use_remove_padding=false`` (the padding-free path packs sequences for flash-attn's variable-length kernels).
    The critic has no fallback in verl 0.9.1: its value model is loaded with ``attn_implementation=
    "flash_attention_2"`` hard-coded (``verl.utils.model.load_valuehead_model``), whatever
    ``critic.model.override_config`` says. (transformers' own fallback, the ``kernels`` package fetching a flash
    kernel from the Hugging Face Hub, is not installed by klsweep and needs network access on the trial's node.)
    """
    out: list[tuple[str, str]] = []
    if value(A + "actor.strategy") in ("fsdp", "fsdp2"):
        attn_key = A + "model.override_config.attn_implementation"
        attn = value(attn_key) or "flash_attention_2"
        padding_key = A + "model.use_remove_padding"
        fix = (f"{_INSTALL}, or run without it: set +{attn_key}=sdpa and {padding_key}=false in overrides "
               "(padded batches: slower, same math)")
        if str(attn).startswith("flash_attention"):
            default = " (verl's default)" if value(attn_key) is None else ""
            out.append((attn_key, f"{attn_key} is {attn}{default} but flash-attn is not installed "
                        "(klsweep[gpu] does not install it): every trial would fail when the actor and reference "
                        f"models are built. {fix}"))
        elif value(padding_key):
            out.append((padding_key, f"{padding_key}=true but flash-attn is not installed: verl's padding-free "
                        "path packs the batch's sequences for flash-attn's variable-length attention. "
                        f"Set {padding_key}=false in overrides, or {_INSTALL}"))
    if _uses_critic(value) and value("critic.strategy") in ("fsdp", "fsdp2"):
        out.append(("critic.model.path", "the critic (algorithm.adv_estimator=gae, or critic.enable) needs "
                    "flash-attn, which is not installed: verl 0.9.1 loads the value model with "
                    "attn_implementation=flash_attention_2 hard-coded (verl/utils/model.py load_valuehead_model; "
                    "critic.model.override_config does not change it), so every trial would fail when the critic is "
                    f"built. {_INSTALL}"))
    return out


def _zero_coef(value) -> list[tuple[str, str]]:
    """A KL mechanism switched on with coefficient 0 pays for the reference forward pass for nothing (verl#6519)."""
    out = []
    for switch, coef in ((A + "actor.use_kl_loss", A + "actor.kl_loss_coef"),
                         ("algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef")):
        if value(switch) and value(coef) == 0:
            out.append((coef, f"{switch}=True with {coef}=0: the reference model's forward pass costs compute for no "
                        "effect (an adaptive controller cannot move a coefficient of 0). Use a coefficient > 0 or turn "
                        "this KL off"))
    return out
