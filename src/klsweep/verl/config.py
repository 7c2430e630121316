"""verl 0.9.1's own configuration: compose it with a trial's overrides, and check values verl only rejects late.

Every trial config klsweep produces, and every override the embedded trainer accepts, goes through two checks:

- :func:`compose`: verl's ``ppo_trainer`` Hydra config from the installed package. Unknown keys fail exactly as they
  would in ``python -m verl.trainer.main_ppo``.
- :func:`check_values`: the values verl's own ``core_algos`` functions accept. It catches values Hydra accepts but
  verl only rejects after the first rollout.

Overrides are a flat mapping of dotted verl keys to Python values, e.g.
``{"actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "algorithm.kl_ctrl.kl_coef": 0.002}``.
A ``+`` is never added to a key on our own: a key verl lacks is an error, not a silently unused value (verl#4262).
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

from klsweep.errors import OverrideError

#: The KL estimators ``core_algos.kl_penalty`` computes in verl 0.9.1, with the ``+`` (straight-through k2 gradient)
#: variants. ``full`` is accepted by verl's config but raises NotImplementedError in the loss, so it is not here.
KL_ESTIMATORS: tuple[str, ...] = tuple(
    name + plus for plus in ("", "+") for name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
)

#: ``core_algos.agg_loss`` modes in verl 0.9.1; any other string raises ValueError there.
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

#: ``algorithm.adv_estimator`` values in verl 0.9.1's ``core_algos.ADV_ESTIMATOR_REGISTRY`` (``get_adv_estimator_fn``
#: raises ValueError for any other).
ADV_ESTIMATORS: tuple[str, ...] = (
    "gae", "gdpo", "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "optimal_token_baseline",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized",
    "tir_optimal_token_baseline",
)

#: Keys whose value names a KL estimator.
KL_ESTIMATOR_KEYS = ("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty")
#: KL coefficients that must not be negative unless the sweep opts in (Logic-RL#58, rllm#15: runs with one).
KL_COEF_KEYS = ("actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef")

_SAFE_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_BARE_WORDS = {"true", "false", "null", "none", "nan", "inf", "on", "off", "yes", "no"}
_BACKSLASHES_BEFORE_QUOTE = re.compile(r"\\+(?='|\Z)")


def format_value(value: Any) -> str:
    """Render a Python value as a Hydra override value that verl parses back to the same value.

    Strings are quoted unless they are plain identifiers, so YAML-ish words (``on``, ``off``, ``yes``, ``null``)
    stay strings and values such as ``k3+`` survive. Lists become ``[a,b]``.

    Raises:
        OverrideError: for values Hydra cannot represent (dicts, NaN).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise OverrideError(f"value {value!r} cannot be passed to verl: use a finite number")
        return repr(value)
    if isinstance(value, str):
        if _SAFE_BARE.fullmatch(value) and value.lower() not in _BARE_WORDS:
            return value
        return _quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    raise OverrideError(f"value {value!r} of type {type(value).__name__} cannot be passed to verl as an override")


def _quote(value: str) -> str:
    """``value`` as a single-quoted Hydra string.

    In a quoted value, Hydra reads a backslash literally unless it precedes a quote or the closing quote. There,
    ``\\`` is one backslash and ``\\'`` a quote. Only those runs of backslashes are doubled, so ``C:\\data`` keeps one
    backslash. Source: Hydra's unescaping of quoted strings (hydra/core/override_parser/overrides_visitor.py; docs
    "Override grammar: escaped characters in quoted values")."""
    escaped = _BACKSLASHES_BEFORE_QUOTE.sub(lambda m: m.group(0) * 2, value)
    return "'" + escaped.replace("'", "\\'") + "'"


def format_overrides(overrides: Mapping[str, Any]) -> list[str]:
    """``{"a.b": 1}`` → ``["a.b=1"]``, in the mapping's order; the command-line form of verl's main_ppo."""
    return [f"{key}={format_value(value)}" for key, value in overrides.items()]


def verl_command(overrides: Mapping[str, Any], module: str = "verl.trainer.main_ppo") -> str:
    """The shell command that runs these overrides: ``python3 -m verl.trainer.main_ppo k=v ...`` (or ``module``,
    e.g. ``klsweep.trainers.embedded``, which takes the same overrides)."""
    import shlex

    return " ".join([f"python3 -m {module}", *(shlex.quote(o) for o in format_overrides(overrides))])


def config_dir() -> str:
    """Directory of verl's Hydra configs in the installed package (``<verl>/trainer/config``).

    Found without importing verl (its import pulls in torch and tensordict: seconds).

    Raises:
        OverrideError: verl is not installed.
    """
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise OverrideError("verl is not installed: pip install verl==0.9.1 (klsweep's own dependency)")
    return os.path.join(spec.submodule_search_locations[0], "trainer", "config")


#: verl's ``model_engine`` config group: ``dp`` (FSDP, the default) or ``megatron`` (verl/trainer/config/model_engine/);
#: verl's ``ppo_megatron_trainer.yaml`` is ``ppo_trainer`` with ``model_engine: megatron``.
ENGINE_KEY = "model_engine"
_STRATEGY_KEY = "actor_rollout_ref.actor.strategy"


#: The fix for a key of verl's Megatron config in a sweep that did not ask for it.
MEGATRON_FIX = (f"it is a key of verl's Megatron config: set {_STRATEGY_KEY}: megatron (klsweep then composes, and "
                f"runs, verl's ppo_trainer with {ENGINE_KEY}=megatron, as ppo_megatron_trainer.yaml does)")


def engine_of(overrides: Mapping[str, Any]) -> str:
    """The ``model_engine`` a trial's overrides select: theirs, else ``megatron`` when
    ``actor_rollout_ref.actor.strategy`` is ``megatron``, else verl's default ``dp``."""
    engine = overrides.get(ENGINE_KEY)
    if engine is not None:
        return str(engine)
    return "megatron" if overrides.get(_STRATEGY_KEY) == "megatron" else "dp"


def with_engine(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` with ``model_engine: megatron`` first when they ask for verl's Megatron actor
    (``actor_rollout_ref.actor.strategy: megatron``) without selecting its config group.

    verl's Megatron keys (``actor_rollout_ref.actor.megatron.*``) exist only in that group; ``main_ppo`` composes the
    trial's config from the same overrides, so the trial runs the config checked here."""
    if engine_of(overrides) == "megatron" and ENGINE_KEY not in overrides:
        return {ENGINE_KEY: "megatron", **overrides}
    return dict(overrides)


@functools.lru_cache(maxsize=None)
def default_keys(engine: str = "dp") -> frozenset[str]:
    """Every dotted key of verl's default ``ppo_trainer`` config (leaves and empty mappings), ~900 keys, with the
    ``model_engine`` config group ``engine`` (``dp`` or ``megatron``: :func:`engine_of`)."""
    from omegaconf import OmegaConf

    # a DictConfig's container is a dict (to_container is typed for any node)
    container = cast(dict[str, Any], OmegaConf.to_container(_default_config(engine), resolve=False))
    return frozenset(_flatten(container))


def _flatten(node: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def closest_key(key: str, engine: str = "dp") -> str | None:
    """The valid verl key most similar to ``key`` (difflib ratio ≥ 0.8) under the ``model_engine`` ``engine``, or
    None."""
    keys = default_keys(engine)
    same_parent = [k for k in keys if k.rsplit(".", 1)[0] == key.rsplit(".", 1)[0]]
    for pool in (same_parent, keys):
        match = difflib.get_close_matches(key, pool, n=1, cutoff=0.8)
        if match:
            return match[0]
    return None


def _compose_raw(override_strings: tuple[str, ...]):
    """verl's config with the overrides.

    When no override selects a config group: the cached default config plus Hydra's own override step (~10 ms).
    Otherwise, or when that step fails (to get Hydra's own error): a full compose."""
    if not override_strings:
        return copy.deepcopy(_default_config("dp"))
    fast = _apply_value_overrides(override_strings)
    return fast if fast is not None else _hydra_compose(override_strings)


def _hydra_compose(override_strings: tuple[str, ...]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return hydra_compose("ppo_trainer", overrides=list(override_strings))


@functools.lru_cache(maxsize=None)
def _default_config(engine: str):
    return _hydra_compose(() if engine == "dp" else (f"{ENGINE_KEY}={engine}",))


def _apply_value_overrides(override_strings: tuple[str, ...]):
    """What ``hydra.compose`` returns for overrides that only set values.

    That is a copy of the default config with Hydra's ``ConfigLoaderImpl._apply_overrides_to_config`` applied, the
    step compose ends with. None in three cases: an override names a config group (``actor_rollout_ref/actor=...``,
    a ``@package``, a group directory of verl's config); an override names Hydra's own node (``++hydra.run.dir``:
    compose drops that node after applying it); or the step raises. The caller then composes in full, which selects
    the group or raises Hydra's error."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(override_strings))
    except HydraException:
        return None
    root = config_dir()
    engine = "dp"
    for override in list(parsed):
        key = override.key_or_group
        if key == ENGINE_KEY and override.package is None and override.value() in ("dp", "megatron"):
            engine = str(override.value())  # the cached default config of that group
            parsed.remove(override)
        elif (override.package is not None or override.is_hydra_override() or "/" in key
                or os.path.isdir(os.path.join(root, *key.split(".")))):
            return None
    cfg = copy.deepcopy(_default_config(engine))
    try:
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    except (HydraException, OmegaConfBaseException):
        return None
    return cfg


def compose(overrides: Mapping[str, Any]):
    """Compose verl's ``ppo_trainer`` config with ``overrides``, as ``main_ppo`` would on the command line.

    The first call composes verl's defaults (~1 s, importing Hydra); later ones copy them and apply the overrides
    as Hydra does (~10 ms), unless an override selects a config group. Keys may carry verl's own ``+`` (new key) or
    ``++`` prefix.

    Returns:
        omegaconf.DictConfig: the composed config (interpolations unresolved, as verl receives it).

    Raises:
        OverrideError: a key is not in verl's config (naming the closest valid key), or a value does not parse.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    strings = tuple(format_overrides(with_engine(overrides)))
    try:
        return _compose_raw(strings)
    except (HydraException, OmegaConfBaseException) as e:
        raise _explain(overrides, e) from None


def _explain(overrides: Mapping[str, Any], error: Exception) -> OverrideError:
    text = str(error)
    engine = engine_of(overrides)
    keys = default_keys(engine)
    for key in overrides:
        bare = key.lstrip("+")
        if key.startswith("+") or f"'{bare}'" not in text:
            continue
        if bare not in keys and not any(k.startswith(bare + ".") for k in keys):
            hint = closest_key(bare, engine)
            fix = (MEGATRON_FIX if engine == "dp" and bare in default_keys("megatron")
                   else f"did you mean '{hint}'?" if hint else "check the key against verl's ppo_trainer.yaml")
            return OverrideError(
                f"'{bare}' is not a key of verl 0.9.1's ppo_trainer config: {fix} "
                f"(klsweep never adds '+' on its own: a new key would be silently unused)"
            )
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return OverrideError(f"verl's config rejects the overrides: {first_line}")


def check_values(cfg, *, allow_negative_kl: bool = False) -> None:
    """Check the values verl 0.9.1 accepts at compose time but rejects (or misuses) only after the first rollout.

    ``actor.kl_loss_type`` and ``algorithm.kl_penalty`` must be in :data:`KL_ESTIMATORS`, ``algorithm.adv_estimator``
    in :data:`ADV_ESTIMATORS`, ``actor.loss_agg_mode`` in :data:`LOSS_AGG_MODES`: the values verl's own
    ``core_algos.kl_penalty``, ``get_adv_estimator_fn`` and ``agg_loss`` accept, which ``tests/verl`` keep exact by
    calling those functions on every value. Checked without importing verl (torch, tensordict and transformers: ~10 s
    of a ``sweep run``). Negative KL coefficients are refused unless ``allow_negative_kl``.

    Args:
        cfg: a composed verl config (from :func:`compose`).

    Raises:
        OverrideError: one message listing every bad value with the valid values.
    """
    problems: list[str] = []
    for key in KL_ESTIMATOR_KEYS:
        name = _select(cfg, key)
        if name == "full" or name == "full+":
            problems.append(
                f"{key}={name} is accepted by verl's config but not implemented by core_algos.kl_penalty "
                f"(NotImplementedError at the first update); use one of: {', '.join(KL_ESTIMATORS)}"
            )
        elif name not in KL_ESTIMATORS:
            problems.append(f"{key}={name!r} is not a KL estimator of verl 0.9.1; valid: {', '.join(KL_ESTIMATORS)}")

    estimator = _select(cfg, "algorithm.adv_estimator")
    if estimator not in ADV_ESTIMATORS:
        extra = ""
        if estimator == "drgrpo":
            extra = " (DrGRPO is grpo with norm_adv_by_std_in_grpo=False: use `algorithm: drgrpo`)"
        problems.append(
            f"algorithm.adv_estimator={estimator!r} is not registered in verl 0.9.1; "
            f"valid: {', '.join(ADV_ESTIMATORS)}{extra}"
        )

    mode = _select(cfg, "actor_rollout_ref.actor.loss_agg_mode")
    if mode not in LOSS_AGG_MODES:
        problems.append(
            f"actor_rollout_ref.actor.loss_agg_mode={mode!r} is not valid; use one of: {', '.join(LOSS_AGG_MODES)}"
        )

    if not allow_negative_kl:
        for key in KL_COEF_KEYS:
            value = _select(cfg, key)
            if isinstance(value, (int, float)) and value < 0:
                problems.append(
                    f"{key}={value} is negative: it rewards drifting away from the reference policy. "
                    f"Use a value >= 0, or set allow_negative_kl: true in the sweep file if you mean it"
                )
    if problems:
        raise OverrideError("; ".join(problems), problems)


def _select(cfg, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, throw_on_missing=False)


def to_json(overrides: Mapping[str, Any]) -> str:
    """Overrides as a stable JSON object string (sorted keys), for trial attributes and result files."""
    return json.dumps(dict(overrides), sort_keys=True)
