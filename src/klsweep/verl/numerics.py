"""Values verl's config accepts that break its math at the first update: found by running verl's own code.

verl 0.9.1 composes ``algorithm.kl_ctrl.target_kl: 0``, ``horizon: 200`` with 1,024 responses per step, or
``loss_scale_factor: 0`` without a word. The trial then dies at its first update (ZeroDivisionError), or trains on a
KL coefficient that is frozen at 0 or has turned negative (a KL *bonus*).

:func:`numeric_problems` runs the controller, loss aggregation and policy loss a trial would use, on the trial's
values. From ``verl.trainer.ppo.core_algos`` it runs ``get_kl_controller`` → ``AdaptiveKLController.update``,
``agg_loss`` and the dual-clip ``compute_policy_loss_vanilla``. It runs them at the trial's real ``n_steps``: verl's
``apply_kl_penalty`` (verl/trainer/ppo/ray_trainer.py) passes the batch's responses,
``data.train_batch_size × actor_rollout_ref.rollout.n``. It also runs both ends of the controller's clipped error
(±0.2). OpenRLHF#1289 is the same fault in another trainer. verl is imported only when a trial uses one of these
paths with a value other than verl's default (~8 s with torch); the adaptive controller's check runs
verl's controller source alone (:func:`verl_kl_controller_factory`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy

A = "actor_rollout_ref."

#: verl's ``AdaptiveKLController.update`` clips the proportional error ``current_kl / target_kl - 1`` to ±CLIP.
CLIP = 0.2


def numeric_problems(value: Callable[[str], Any]) -> list[tuple[str, str]]:
    """Problems of one composed trial config whose numbers verl accepts but its first update cannot use.

    Args:
        value: verl key → the trial's composed value (``OmegaConf.select`` on the composed config).

    Returns:
        ``(verl key, message)`` pairs; each message names the key, the value, what verl's code does with it and the
        safe range.
    """
    out: list[tuple[str, str]] = []
    if value("algorithm.use_kl_in_reward") and value("algorithm.kl_ctrl.type") == "adaptive":
        out += _adaptive_controller(value)
    if value(A + "actor.loss_agg_mode") == "seq-mean-token-sum-norm":
        out += _loss_scale_factor(value)
    out += _dual_clip(value)
    return out


def _adaptive_controller(value: Callable[[str], Any]) -> list[tuple[str, str]]:
    """Run ``get_kl_controller`` and one ``update`` below and one above the target, as ``apply_kl_penalty`` does.

    ``update`` multiplies the coefficient by ``1 + clip(current_kl / target_kl - 1, -0.2, 0.2) × n_steps / horizon``.

    - ``target_kl = 0`` divides by zero.
    - ``target_kl < 0`` clips every error to -0.2, so the coefficient only shrinks.
    - ``kl_coef = 0`` stays 0.
    - ``horizon <= 0.2 × n_steps`` makes the factor ``<= 0`` after one step under target.
    """
    coef_key, target_key, horizon_key = (f"algorithm.kl_ctrl.{k}" for k in ("kl_coef", "target_kl", "horizon"))
    coef, target, horizon = value(coef_key), value(target_key), value(horizon_key)
    batch, n = value("data.train_batch_size"), value(A + "rollout.n")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (coef, target, horizon, batch, n)):
        return []  # a wrong type is reported by the config checks
    n_steps = batch * n
    shortest = CLIP * n_steps
    responses = (f"{n_steps} responses per step (data.train_batch_size × rollout.n = {batch} × {n}; verl's "
                 "apply_kl_penalty passes them as n_steps)")
    try:
        below = _factor(target, horizon, 0.0, n_steps)
    except AssertionError:
        return [(horizon_key, f"{horizon_key}={horizon}: verl's get_kl_controller asserts horizon > 0 (the trial "
                 f"fails when the trainer starts). Safe range: {horizon_key} > {shortest:g} for {responses}")]
    except ZeroDivisionError:
        return [(target_key, f"{target_key}={target}: verl's AdaptiveKLController.update divides the measured KL "
                 "by target_kl (ZeroDivisionError at the first update). Safe range: target_kl > 0")]
    above = _factor(target, horizon, 10 * abs(target), n_steps)
    out: list[tuple[str, str]] = []
    if target < 0:
        out.append((target_key, f"{target_key}={target}: verl's AdaptiveKLController clips kl / target_kl - 1 to "
                    f"[-{CLIP}, {CLIP}], and with a negative target it is -{CLIP} whatever the KL, so the coefficient "
                    f"only shrinks (x{above:.3g} per step at any KL). Safe range: target_kl > 0"))
    if coef == 0:
        out.append((coef_key, f"{coef_key}={coef} with the adaptive controller: verl's AdaptiveKLController.update "
                    "multiplies the coefficient, so it stays 0 for the whole run whatever the KL (no KL penalty, and "
                    "the reference model's forward pass for nothing). Safe range: kl_coef > 0, e.g. verl's 0.001"))
    elif below <= 0:
        out.append((horizon_key, f"{horizon_key}={horizon} is too short for {responses}: one update of verl's "
                    f"AdaptiveKLController with the KL under target multiplies kl_coef by 1 - {CLIP} × {n_steps} / "
                    f"{horizon} = {below:.3g}, so the coefficient becomes {'0' if below == 0 else 'negative'} "
                    f"(a KL bonus). Safe range: {horizon_key} > {shortest:g} ({CLIP} × n_steps)"))
    return out


@functools.cache
def verl_kl_controller_factory() -> Callable[[Any], Any]:
    """verl's ``core_algos.get_kl_controller``, run from the installed ``verl/trainer/ppo/core_algos.py``.

    Only that function and the ``*KLController`` classes are executed, with numpy as their ``np``: importing
    ``core_algos`` itself imports verl's package, torch, tensordict and transformers (~5 s).

    Raises:
        ImportError: verl is not installed, or its ``core_algos.py`` no longer defines them.
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("verl is not installed")
    path = Path(spec.submodule_search_locations[0]) / "trainer" / "ppo" / "core_algos.py"
    tree = ast.parse(path.read_text(), str(path))
    wanted: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("KLController")
              or isinstance(n, ast.FunctionDef) and n.name == "get_kl_controller"]
    if len(wanted) < 3:
        raise ImportError(f"{path} no longer defines get_kl_controller and its KL controllers")
    namespace: dict[str, Any] = {"np": numpy}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["get_kl_controller"]


def _factor(target: float, horizon: float, current_kl: float, n_steps: int) -> float:
    """What one ``update(current_kl, n_steps)`` of verl's own controller (built by ``get_kl_controller``) does to a
    coefficient of 1. Raises what verl raises: AssertionError (horizon <= 0), ZeroDivisionError (target_kl 0)."""
    get_kl_controller = verl_kl_controller_factory()
    controller = get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=1.0, target_kl=target, horizon=horizon))
    controller.update(current_kl=current_kl, n_steps=n_steps)
    return float(controller.value)


def _loss_scale_factor(value: Callable[[str], Any]) -> list[tuple[str, str]]:
    """``agg_loss(..., "seq-mean-token-sum-norm", loss_scale_factor=F)`` divides the loss by F: 0 gives an infinite
    loss, a negative F flips the gradient (verl only replaces None by the response length)."""
    import torch
    from verl.trainer.ppo.core_algos import agg_loss

    key = A + "actor.loss_scale_factor"
    factor = value(key)
    if factor is None or isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return []
    loss = agg_loss(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm",
                    loss_scale_factor=factor)  # type: ignore[arg-type]  # verl types it int; it divides by a float too
    if math.isfinite(loss.item()) and loss.item() > 0:
        return []
    return [(key, f"{key}={factor}: verl's agg_loss (seq-mean-token-sum-norm) divides the loss by it, giving a loss "
             f"of {loss.item():g} for a unit loss. Safe range: loss_scale_factor > 0 (DrGRPO uses the maximum "
             "response length, data.max_response_length)")]


class _ActorConfig(dict):
    """The fields of verl's ``ActorConfig`` that ``compute_policy_loss_vanilla`` reads, as attributes and ``get``."""

    __getattr__ = dict.__getitem__


#: verl 0.9.1's ``actor.clip_ratio_c`` (verl/trainer/config/actor/actor.yaml), which its own assert accepts; other
#: values are run through verl's policy loss (importing torch and verl only then).
VERL_CLIP_RATIO_C = 3.0


def _dual_clip(value: Callable[[str], Any]) -> list[tuple[str, str]]:
    """One step of verl's PPO policy loss (``compute_policy_loss_vanilla``, dual-clip PPO) with the trial's clip
    ratios.

    verl asserts ``clip_ratio_c > 1`` at the first update; it is the lower bound of the ratio for negative
    advantages."""
    key = A + "actor.clip_ratio_c"
    clip = {k: value(f"{A}actor.{k}") for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")}
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                  for v in (clip["clip_ratio"], clip["clip_ratio_c"]))
    if not numbers or clip["clip_ratio_c"] == VERL_CLIP_RATIO_C:
        return []
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    zeros, ones = torch.zeros(1, 2), torch.ones(1, 2)
    try:  # "vanilla" is compute_policy_loss_vanilla, as verl's actor (and the embedded trainer) looks it up
        get_policy_loss_fn("vanilla")(zeros, zeros, ones, ones, config=_ActorConfig(clip, global_batch_info={}))
    except AssertionError:
        return [(key, f"{key}={clip['clip_ratio_c']}: verl's compute_policy_loss_vanilla asserts clip_ratio_c > 1, "
                 "the lower bound of the ratio in dual-clip PPO (AssertionError at the first actor update). Safe "
                 "range: clip_ratio_c > 1 (verl's default 3.0)")]
    return []
