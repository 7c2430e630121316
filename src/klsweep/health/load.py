"""Build a :class:`RuleSet` from a preset name, a sweep file's ``health:`` value, or a YAML rules file."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from klsweep._yaml import Inline, data_path, echoes_deeper, typo_cascade, unknown_field_fix
from klsweep.errors import SweepFileError
from klsweep.health.rules import PRESETS, BuiltinConfig, HealthConfig, PresetFile, Rule, RuleSet

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def validation_problems(error: ValidationError, where: str, data: Any = None) -> list[str]:
    """One line per pydantic error: ``"<where>: rules.0.conditions.0: <message> (got <input>)"``; an unknown field
    gets the closest valid one and the valid fields there (as a rules file writes them: ``for``, ``metric``, ...).
    Given the validated ``data``, an error that only echoes a misspelt field (``acton:``: "action is missing") is
    left out for the misspelt field's own line."""
    lines: dict[str, str] = {}  # field path → its line: a misspelt field is said once
    inline: Inline = {Rule: ("conditions", ("all", "any"))}

    def unknown(path: tuple[str, ...], got: Any) -> str:
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        return f"{where}: {'.'.join(path)}: unknown field{shown} — {unknown_field_fix(HealthConfig, path, inline)}"

    errors = error.errors()
    for e in errors:
        if echoes_deeper(e, errors):
            continue
        path = (data_path(data, e["loc"], keep_last=e["type"] == "missing", inline=inline) if data is not None
                else tuple(str(p) for p in e["loc"] if not str(p).startswith("function-")))
        loc = ".".join(path)
        msg = e["msg"].removeprefix("Value error, ")
        typos, cascade = typo_cascade(HealthConfig, data, path, e["type"], msg, inline)  # a misspelt field's echo
        for typo in typos:
            lines.setdefault(".".join(typo), unknown(typo, _value_at(data, typo)))
        if cascade:
            continue
        got = e.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        if e["type"] == "extra_forbidden":
            lines.setdefault(loc, unknown(path, got))
        else:
            lines.setdefault(loc or f"#{len(lines)}", f"{where}: {loc}: {msg}{shown}" if loc else f"{where}: {msg}")
    return list(lines.values())


def _value_at(data: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` (keys and list indices as strings) in ``data``; None where there is none."""
    for part in path:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


@functools.cache
def preset(name: str) -> PresetFile:
    """The shipped preset ``name`` (klsweep/health/presets/<name>.yaml).

    Raises:
        SweepFileError: unknown name (the message lists the presets).
    """
    if name not in PRESETS:
        raise SweepFileError([f"unknown health preset {name!r}: valid presets are {', '.join(PRESETS)}, none"])
    text = resources.files("klsweep.health").joinpath("presets", f"{name}.yaml").read_text()
    return PresetFile.model_validate(yaml.load(text, Loader=_LOADER))


def _from_config(config: HealthConfig, name: str | None = None) -> RuleSet:
    base_rules: tuple[Rule, ...]
    if config.preset == "none":
        base_rules, builtin, description = (), BuiltinConfig(), "custom rules"
    else:
        base = preset(config.preset)
        base_rules, builtin, description = base.rules, base.builtin, base.description
    own = {rule.name: rule for rule in config.rules}
    rules = [own.pop(rule.name, rule) for rule in base_rules] + list(own.values())
    if config.builtin:
        builtin = BuiltinConfig.model_validate({**builtin.model_dump(), **config.builtin})
    label = name or (config.preset + ("+custom" if config.rules or config.builtin else ""))
    return RuleSet(name=label, rules=tuple(rules), builtin=builtin, description=description,
                   validation=config.validation)


def load_ruleset(spec: str | Path | HealthConfig | Mapping[str, Any] | list | None = None) -> RuleSet:
    """The rule set a trial is judged with.

    Args:
        spec: a preset name (``default``, ``seed``, ``conservative``, ``aggressive``, ``none``); a path to a YAML
            file holding a ``health:`` value (a preset name, a list of rules, or ``{preset, rules, builtin}``) or a
            sweep file with a ``health:`` field;
            a :class:`HealthConfig`; or the raw ``health:`` value. None means ``default``.

    Raises:
        SweepFileError: unknown preset, unreadable file, or invalid rules (every problem, one per line, with the
            dotted path of the field).
    """
    if spec is None:
        spec = "default"
    if isinstance(spec, HealthConfig):
        return _from_config(spec)
    if isinstance(spec, str) and (spec in PRESETS or spec == "none"):
        return _from_config(HealthConfig(preset=spec))
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            raise SweepFileError(
                [
                    f"unknown health preset {str(spec)!r} (and no such file): valid presets are "
                    f"{', '.join(PRESETS)}, none; or give the path of a YAML rules file"
                ]
            )
        try:
            data = yaml.load(path.read_text(), Loader=_LOADER)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise SweepFileError([f"{path}: cannot read YAML rules: {e}"]) from None
        own = {"preset", "rules", "builtin", "validation"}
        if isinstance(data, Mapping) and "health" in data and not own & set(data):
            data = data["health"]  # a sweep file, or a file holding only its health: field
        try:
            return _from_config(HealthConfig.model_validate(data), name=path.name)
        except ValidationError as e:
            raise SweepFileError(validation_problems(e, str(path), data)) from None
    try:
        return _from_config(HealthConfig.model_validate(spec))
    except ValidationError as e:
        raise SweepFileError(validation_problems(e, "health", spec)) from None
