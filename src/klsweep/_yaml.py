"""YAML with line numbers, and pydantic validation errors explained one line each with that line.

YAML is read with YAML 1.2 scalars. Only ``true``/``false`` are booleans; ``on``, ``off``, ``yes``, ``no`` stay
strings, as verl expects strings there. ``1e-3`` is a float, and dates stay strings. A key given twice is an error.
Errors read ``FILE:LINE: field.path: what is wrong (value) — fix``.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from klsweep.errors import SweepFileError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

#: Field path (keys and list indices as strings) → ``"FILE:LINE"`` where it is written.
Lines = dict[tuple[str, ...], str]

#: Fields a user writes inline instead of under their own key: model → (the field, the keys written in its place
#: besides the fields of its elements' models). A health rule's ``conditions``: ``all``, ``any``, or one inline.
Inline = Mapping[type, tuple[str, tuple[str, ...]]]

_FLOAT_1_2 = (
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and floats, no timestamps, and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value, not a list or mapping", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {seen[key]})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[1] not in ("bool", "float", "timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT_1_2), list("-+0123456789."))


def read(path: Path) -> tuple[Any, Lines]:
    """Read and parse the YAML file ``path``.

    Returns:
        ``(data, lines)``: the parsed value and the ``FILE:LINE`` of each field path.

    Raises:
        SweepFileError: the file is missing, a directory, unreadable, not UTF-8, or not valid YAML.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SweepFileError([f"{path}: no such file — check the path (shipped sweeps are in sweeps/)"]) from None
    except IsADirectoryError:
        raise SweepFileError([f"{path}: is a directory — give a sweep file (.yaml)"]) from None
    except OSError as e:
        raise SweepFileError([f"{path}: cannot be read ({e.strerror}) — check the path and permissions"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SweepFileError([f"{path}: byte {e.start} is not UTF-8 text — a sweep file is a YAML text file"]) from None
    return parse(text, str(path))


def parse(text: str, name: str) -> tuple[Any, Lines]:
    """Parse YAML ``text``, named ``name`` in messages and in the ``FILE:LINE`` of each field.

    Returns:
        ``(data, lines)``: the parsed value and the ``name:LINE`` of each field path.

    Raises:
        SweepFileError: the YAML is invalid (one line naming the line and the fix) or nests too deeply.
    """
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        if mark is not None:
            line = mark.line + 1
        else:  # a ReaderError (unprintable character) has only a character position
            line = text[: getattr(e, "position", 0)].count("\n") + 1
        what = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e).splitlines()[0]
        fix = "indent with spaces, YAML does not allow tabs" if "\\t" in what or "\t" in what else "fix the YAML syntax"
        raise SweepFileError([f"{name}:{line}: {what} — {fix}"]) from None
    except RecursionError:
        raise SweepFileError([f"{name}:1: the YAML nests too deeply to be a sweep file"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: Lines = {}
    if node is not None:
        _mark_lines(node, (), name, lines, set())
    return data, lines


def _mark_lines(node, path: tuple[str, ...], name: str, lines: Lines, seen: set[int]) -> None:
    if id(node) in seen or len(path) > 50:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            lines[path + (key,)] = f"{name}:{key_node.start_mark.line + 1}"
            _mark_lines(value_node, path + (key,), name, lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (str(i),)] = f"{name}:{item.start_mark.line + 1}"
            _mark_lines(item, path + (str(i),), name, lines, seen)


def explain(error: ValidationError, data: Any, lines: Lines, name: str, model: type[BaseModel],
            inline: Inline | None = None) -> list[tuple[tuple[str, ...], str]]:
    """Explain the pydantic ``error`` of validating ``data`` (read from ``name``) as ``model``.

    Returns:
        ``(field path, "FILE:LINE: field.path: what is wrong (value) — fix")``, one per field.
    """
    out: list[tuple[tuple[str, ...], str]] = []
    done: set[tuple] = set()
    errors = error.errors(include_url=False)
    for err in errors:
        if echoes_deeper(err, errors):
            continue
        path = data_path(data, err["loc"], keep_last=err["type"] == "missing", inline=inline)
        if path in done:
            continue
        done.add(path)
        kind, message = err["type"], err["msg"].removeprefix("Value error, ")
        typos, cascade = typo_cascade(model, data, path, kind, message, inline or {})
        for typo in typos:
            if typo not in done:
                done.add(typo)
                where = next((lines[typo[:n]] for n in range(len(typo), 0, -1) if typo[:n] in lines), f"{name}:1")
                out.append((typo, f"{where}: {'.'.join(typo)}: unknown field — "
                                  f"{unknown_field_fix(model, typo, inline)}"))
        if cascade:
            continue
        where = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), f"{name}:1")
        dotted = ".".join(path) or "(top level)"
        if kind == "extra_forbidden":
            out.append((path, f"{where}: {dotted}: unknown field — {unknown_field_fix(model, path, inline)}"))
        elif kind == "missing":
            out.append((path, f"{where}: {dotted}: required field is missing — add `{path[-1]}:` "
                              f"({_description(model, path) or 'see the sweep-file reference'})"))
        else:
            value = err.get("input")
            shown = "" if isinstance(value, (dict, list)) else f" (got {value!r:.60})"
            expected = _description(model, path)
            fix = f" — expected: {expected}" if expected else ""
            if kind == "string_type" and isinstance(value, (int, float, bool)):  # YAML read `name: 123` as a number
                text = str(value).lower() if isinstance(value, bool) else str(value)
                fix += f"{'. ' if fix else ' — '}Quote it to make it a string: {path[-1]}: \"{text}\""
            out.append((path, f"{where}: {dotted}: {message}{shown}{fix}"))
    return out


def typo_cascade(model: type[BaseModel], data: Any, path: tuple[str, ...], kind: str, message: str,
                 inline: Inline) -> tuple[list[tuple[str, ...]], bool]:
    """The misspelt fields behind one pydantic error, and whether the error is only their echo.

    A misspelt required field (``acton:`` for ``action:``) also makes pydantic say the field is missing; a model's
    own check of the mapping (a rule needs ``metric``, ``all`` or ``any``) may fail before the misspelling is
    reported at all. Takes the error's ``kind`` and ``message`` at ``path`` in ``data`` (read as ``model``).
    Returns the paths of the unknown fields in the mapping the error concerns whose closest valid field the error
    names, and True when the error names only those (drop it: the unknown field's line says the fix)."""
    parent = path[:-1] if kind in ("missing", "extra_forbidden") else path
    node: Any = data
    for part in parent:
        node = node.get(part) if isinstance(node, dict) else (
            node[int(part)] if isinstance(node, list) and part.isdigit() and int(part) < len(node) else None)
    if kind == "extra_forbidden" or not isinstance(node, dict):
        return [], False
    valid = _fields_at(model, parent, inline)
    if not valid:
        return [], False
    typos = []
    for key in node:
        hint = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6) if key not in valid else []
        if hint and (hint[0] == path[-1] if kind == "missing" else f"'{hint[0]}'" in message):
            typos.append(parent + (str(key),))
    return typos, bool(typos)


def echoes_deeper(err: Mapping[str, Any], errors: list[Any]) -> bool:
    """Whether pydantic's error ``err`` only echoes another of ``errors`` inside it: a tuple whose one item failed is
    also "too short" (``rules.0.conditions: Tuple should have at least 1 item after validation, not 0``)."""
    loc = tuple(err["loc"])
    return err["type"] == "too_short" and any(len(o["loc"]) > len(loc) and tuple(o["loc"][:len(loc)]) == loc
                                              for o in errors)


def data_path(data: Any, loc: tuple, keep_last: bool, inline: Inline | None = None) -> tuple[str, ...]:
    """The error location as a path through the data, without pydantic's union/discriminator tags (a missing
    field, the only element not in the data that is not a tag, is kept when ``keep_last``). A field the data writes
    under another name (``inline``: a rule's ``conditions`` as ``all``/``any``) takes the name the data uses."""
    renamed = {field: aliases for field, aliases in (inline or {}).values()}
    path: list[str] = []
    node = data
    for n, part in enumerate(loc):
        alias = next((a for a in renamed.get(part, ()) if a in node), None) if isinstance(node, dict) else None
        if alias is not None and part not in node:
            node = node[alias]
            path.append(alias)
            continue
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif n < len(loc) - 1 or not keep_last:
            continue
        path.append(str(part))
    return tuple(path)


def _is_model(member: Any) -> bool:
    """Whether ``member`` is a pydantic model class (pydantic is imported only for annotations here)."""
    return isinstance(member, type) and isinstance(getattr(member, "model_fields", None), dict)


def _annotations_at(model: type[BaseModel], path: tuple[str, ...]) -> list[tuple[Any, Any]]:
    """(annotation, FieldInfo) pairs the value at ``path`` may have, following models, lists and dicts."""
    current: list[tuple[Any, Any]] = [(model, None)]
    for part in path:
        nxt: list[tuple[Any, Any]] = []
        for ann, _ in current:
            for member in _members(ann):
                origin = typing.get_origin(member)
                if _is_model(member) and part in member.model_fields:
                    info = member.model_fields[part]
                    nxt.append((info.annotation, info))
                elif origin in (list, tuple) and part.isdigit():  # list[X], tuple[X, ...]
                    nxt.append((typing.get_args(member)[0], None))
                elif origin is dict:
                    nxt.append((typing.get_args(member)[1], None))
        current = nxt
    return current


def _members(ann: Any) -> list[Any]:
    if typing.get_origin(ann) is typing.Annotated:
        return _members(typing.get_args(ann)[0])
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(ann) for m in _members(a)]
    return [ann]


def _written_fields(model: type[BaseModel], inline: Inline) -> list[str]:
    """The field names a user writes for ``model``: aliases (``for``, not ``for_``); for a model in ``inline``, the
    keys written in place of its inline field and the fields of that field's element models."""
    names = [info.alias or n for n, info in model.model_fields.items()]
    if model in inline:
        field, keys = inline[model]
        elements = [m for ann, _ in _annotations_at(model, (field, "0")) for m in _members(ann) if _is_model(m)]
        names = [n for n in names if n != field] + list(keys) + [n for m in elements for n in m.model_fields]
    return list(dict.fromkeys(names))


def unknown_field_fix(model: type[BaseModel], path: tuple[str, ...], inline: Inline | None = None) -> str:
    """The fix for the unknown field at ``path`` (field names and list indices as strings) of ``model``.

    Returns:
        the closest valid field, if any, and the valid fields at that place as a user writes them (``inline``).
    """
    valid = _fields_at(model, path[:-1], inline or {})
    hint = difflib.get_close_matches(path[-1], valid, n=1, cutoff=0.6)
    return (f"did you mean {hint[0]!r}? " if hint else "") + f"Valid fields here: {', '.join(valid)}"


def _fields_at(model: type[BaseModel], path: tuple[str, ...], inline: Inline) -> list[str]:
    names: list[str] = []
    for ann, _ in _annotations_at(model, path):
        for member in _members(ann):
            if _is_model(member):
                names += [n for n in _written_fields(member, inline) if n not in names]
    return names


def _description(model: type[BaseModel], path: tuple[str, ...]) -> str | None:
    infos = [info for _, info in _annotations_at(model, path) if info is not None and info.description]
    return infos[0].description if infos else None
