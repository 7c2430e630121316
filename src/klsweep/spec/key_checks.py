"""The keys a sweep sets: verl keys or aliases, not owned by another field, each set once, with `when` that can hold.

Each problem is ``(path, message)`` with ``path`` the tuple of the sweep-file field it concerns, so the loader can
put the file and line in front.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from klsweep.spec.schema import Choice, Constant, Sweep
from klsweep.spec.space import fixed_overrides, wandb_logger_problem
from klsweep.verl import presets
from klsweep.verl.config import MEGATRON_FIX, closest_key, default_keys, engine_of

#: A problem: the sweep-file field path it concerns, and the message (what is wrong, why, the fix).
Problem = tuple[tuple[Any, ...], str]

#: Keys owned by the sweep file's own fields, never set in ``overrides`` or ``parameters``.
_OWNED = {
    presets.USE_KL_LOSS: "kl_placement",
    presets.USE_KL_IN_REWARD: "kl_placement",
    "algorithm.adv_estimator": "algorithm",
    "trainer.total_training_steps": "budget.max_steps",
    "data.seed": "seed",
}


def check_keys(sweep: Sweep) -> list[Problem]:
    """The problems of a schema-valid sweep's keys alone: the first stage of :func:`klsweep.spec.checks.check_sweep`.

    The other checks need every key to be a verl key. Reported:

    - unknown keys, with the closest or the full verl key;
    - aliases in overrides, or without a live key under the kl_placement;
    - keys owned by other fields;
    - ``wandb`` in ``trainer.logger`` (:func:`klsweep.spec.space.wandb_logger_problem`);
    - a key both fixed and searched;
    - `when` keys that are not fixed or earlier parameters, or that can never hold.
    """
    return check_keys_resolved(sweep)[0]


def check_keys_resolved(sweep: Sweep) -> tuple[list[Problem], dict[str, str]]:
    """The problems of :func:`check_keys`, and each parameter's verl key → its name (the ones that resolve)."""
    errors: list[Problem] = []
    placement = sweep.placement
    engine = engine_of(sweep.overrides)
    for key in sweep.overrides:
        errors.extend((("overrides", key), m) for m in _key_problems(key, placement, engine))
    logger = wandb_logger_problem(sweep.overrides)
    if logger:  # here, not when the first trial config is built: the rest of the file is still checked
        errors.append((("overrides", "trainer.logger"), logger))
    resolved: dict[str, str] = {}  # verl key -> parameter name
    for name, p in sweep.parameters.items():
        try:
            key = presets.resolve_key(name, placement)
        except ValueError as e:
            errors.append((("parameters", name), str(e)))
            continue
        errors.extend((("parameters", name), m) for m in _key_problems(key, None, engine))
        if key in resolved:
            errors.append(
                (("parameters", name), f"names the same verl key {key} as parameter {resolved[key]!r}: keep one")
            )
        if key in sweep.overrides:
            errors.append((("parameters", name), f"{key} is both fixed in overrides and searched: remove one"))
        errors.extend((("parameters", name, "when") + sub, m) for sub, m in _when_problems(sweep, p.when, resolved))
        resolved[key] = name
    return errors, resolved


def label(name: str, key: str) -> str:
    """A parameter as messages name it: its verl key, or ``name (key)`` when it is written as an alias."""
    return key if name == key else f"{name} ({key})"


def _key_problems(key: str, placement: str | None = None, engine: str = "dp") -> list[str]:
    """Why ``key`` is not a verl key a sweep may set, with the fix.

    Keys are those of verl's config with the sweep's ``model_engine`` (``engine``: ``dp``, or ``megatron`` for
    verl's Megatron worker). The fix names the closest verl key, or the full key of a bare leaf name
    (``kl_loss_coef``), or the switch to the Megatron config. With ``placement`` set, it names the full key of an
    alias given in ``overrides``: aliases are for parameters."""
    if key in _OWNED:
        return [f"{key} is set by the sweep file's `{_OWNED[key]}` field: set that field instead"]
    if key.startswith("+") or key in default_keys(engine):
        return []
    if engine == "dp" and key in default_keys("megatron"):
        return [f"{key!r} is not a key of verl 0.9.1's ppo_trainer config with its default FSDP worker: "
                f"{MEGATRON_FIX}"]
    if placement is not None and key in presets.ALIASES:
        try:
            full = f"write {presets.resolve_key(key, placement)!r}"
        except ValueError as e:
            full = str(e)
        return [f"{key!r} is an alias, which only `parameters` and `when` take; overrides take verl's full keys: "
                f"{full}"]
    closest = closest_key(key, engine)
    hints = [closest] if closest else _full_keys(key)
    aliases = ", ".join(presets.ALIASES)
    fix = (f"did you mean {' or '.join(map(repr, hints))}?" if hints
           else f"use a key of verl's ppo_trainer config or an alias ({aliases})")
    return [f"{key!r} is not a key of verl 0.9.1's ppo_trainer config: {fix}"]


def _full_keys(name: str) -> list[str]:
    """The verl keys whose last parts are ``name`` or close to it (``kl_loss_coef`` →
    ``actor_rollout_ref.actor.kl_loss_coef``; ``lr`` → both learning rates)."""
    keys = default_keys()
    found = [k for k in keys if k.endswith("." + name)]
    if not found:
        depth = name.count(".") + 1
        tails = {".".join(k.split(".")[-depth:]): k for k in keys}
        close = difflib.get_close_matches(name, list(tails), n=1, cutoff=0.8)
        found = [k for k in keys if close and k.endswith("." + close[0])]
    return sorted(found)


def _when_problems(sweep: Sweep, when: dict | None, earlier: dict[str, str]) -> Iterator[Problem]:
    if not when:
        return
    fixed = None
    for name, allowed in when.items():
        try:
            key = presets.resolve_key(name, sweep.placement)
        except ValueError as e:
            yield (name,), str(e)
            continue
        if key in earlier:
            p = sweep.parameters[earlier[key]]
            options = p.values if isinstance(p, Choice) else [p.value] if isinstance(p, Constant) else None
            wanted = allowed if isinstance(allowed, list) else [allowed]
            if options is not None and not set(map(repr, wanted)) & set(map(repr, options)):
                yield (name,), f"condition {name} in {wanted} never holds: parameter {earlier[key]!r} takes {options}"
            continue
        if key in sweep.parameters or any(presets.resolve_key(n, sweep.placement) == key for n in sweep.parameters):
            yield (name,), f"{name} is a parameter defined after this one: move this parameter below it"
            continue
        fixed = fixed if fixed is not None else fixed_overrides(sweep)
        if key not in fixed:
            yield (name,), (f"{name} is neither a parameter defined earlier nor fixed by the preset or overrides: "
                            "set it in overrides or define it as a parameter above")
            continue
        wanted = allowed if isinstance(allowed, list) else [allowed]
        if fixed[key] not in wanted:
            yield (name,), (f"condition {name} in {wanted} never holds: {key} is fixed to {fixed[key]!r}, so this "
                            "parameter is never sampled. Fix the value or search the key")
