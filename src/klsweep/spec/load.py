"""Load a sweep file: command-line overrides, search-space includes, file paths, validation and checks.

Every problem is collected and raised together as one :class:`~klsweep.errors.SweepFileError`, one line each::

    sweeps/x.yaml:12: parameters.kl_coef.min: min (0.1) must be below max (0.01) — fix the range

The YAML itself is read by :mod:`klsweep._yaml` (YAML 1.2 scalars, line numbers, duplicate keys refused).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from klsweep._yaml import Inline, Lines, explain, parse, read
from klsweep.errors import SweepFileError
from klsweep.health.rules import Rule
from klsweep.spec.checks import check_sweep
from klsweep.spec.key_checks import check_keys
from klsweep.spec.schema import _SECTION_HINT, Parameter, Sweep
from klsweep.verl.config import KL_COEF_KEYS
from klsweep.verl.managed import ONLY_VERL, REFUSED, REFUSED_VERL

#: A health rule's conditions are written inline: ``all:``/``any:`` lists, or one condition's fields.
_INLINE: Inline = {Rule: ("conditions", ("all", "any"))}

class _SearchSpaceFile(BaseModel):
    """A file in search_spaces/: a reusable ``parameters`` block."""

    model_config = ConfigDict(extra="forbid")

    description: str | None = Field(None, description="what the space is for")
    parameters: dict[str, Parameter] = Field(description="parameters, as in a sweep file")


def load_sweep(path: str | Path, cli_overrides: Iterable[str] = ()) -> Sweep:
    """Load, override and validate a sweep file.

    Args:
        path: the YAML sweep file.
        cli_overrides: ``FIELD=VALUE`` strings (dotted sweep-file paths, values parsed as YAML), e.g.
            ``budget.trials=4``, ``overrides.actor_rollout_ref.actor.kl_loss_coef=0.01``,
            ``parameters.kl_coef.max=0.1`` (applied after the ``search_space`` include: it changes an included
            parameter's field as it changes one the file defines). Relative paths (``search_space``,
            ``replay.trace``, ``tabular.table``): :func:`find_file`.

    Returns:
        the validated :class:`Sweep`; ``sweep.warnings`` holds non-fatal findings, ``sweep.where(*path)`` the
        ``FILE:LINE`` of each field.

    Raises:
        SweepFileError: every problem found, one line each (file, line, dotted field path, value, fix).
    """
    sweep, problems = load_partial(path, cli_overrides)
    if problems or sweep is None:
        raise SweepFileError(problems)
    return sweep


#: Top-level fields without a default: a problem in one of them leaves nothing to check the rest against.
_REQUIRED = ("name", "algorithm", "objective")


def load_partial(path: str | Path, cli_overrides: Iterable[str] = ()) -> tuple[Sweep | None, list[str]]:
    """Every problem of a sweep file that does not depend on another, for ``sweep validate``.

    Each round validates the file, then removes the entries that have problems, and validates again until the rest
    is clean. An entry is a parameter, an override, or an optional top-level field, which falls back to its default.
    A problem in a required field (``name``, ``algorithm``, ``objective``) or in the whole file ends the rounds.
    Removing a parameter also removes it from the seed trials and ``when`` conditions. A later round never reports a
    field an earlier round reported or removed. So a problem is listed once, and none is an echo of another.

    Returns:
        ``(sweep, problems)``: the sweep without the entries that have problems (None when nothing valid is left to
        check further), and every problem, one line each as :class:`~klsweep.errors.SweepFileError` lists them.

    Raises:
        SweepFileError: the file cannot be read or is not a YAML mapping.
    """
    path = Path(path)
    data, lines = read(path)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
        raise SweepFileError([f"{path}:1: the file is {kind} — a sweep file is a YAML mapping with at least "
                              "`name`, `algorithm` and `objective` (see sweeps/conservative.yaml)"])
    if "parameters" in data and set(data) <= {"parameters", "description"} and not cli_overrides:
        raise SweepFileError([f"{path}:1: this is a search space (`parameters` only), not a sweep file: include it "
                              f"from a sweep file with `search_space: {path.stem}` and validate that file "
                              "(sweeps/grpo_kl.yaml does)"])
    problems: list[str] = []
    reported: set[tuple[str, ...]] = set()
    # the search space the file names after the overrides, included first: an override of an included parameter's
    # field (parameters.kl_coef.max=0.5) then merges into it, as into a parameter of the file's own
    overridden, overridden_lines = copy.deepcopy(data), dict(lines)
    for text in cli_overrides:
        _apply_override(overridden, text, overridden_lines)
    if isinstance(overridden.get("search_space"), str):
        where = overridden_lines.get(("search_space",), str(path))
        problems.extend(_include_search_space(path, data, lines, overridden["search_space"], where))
    for text in cli_overrides:
        problem = _apply_override(data, text, lines)
        if problem:
            problems.append(f"command line {text!r}: {problem}")
    for section, key, fix in _PATH_FIELDS:
        block = data.get(section)
        if not isinstance(block, dict) or not isinstance(block.get(key), str) or not block[key]:
            continue
        file, looked = find_file(block[key], path)
        if file is not None:
            block[key] = str(file)  # absolute: trials run in Ray workers with another working directory
            continue
        where = lines.get((section, key), str(path))
        problems.append(f"{where}: {section}.{key}: no file {block[key]!r} (looked in {', '.join(looked)}) — {fix}")
        data.pop(section)  # reported: not also "trainer ... needs" it, nor a check that reads the missing file
        reported.add((section,))
    for _ in range(5):  # each round removes at least one entry; real files settle in two or three
        try:
            sweep = Sweep.model_validate(data)
        except ValidationError as e:
            found = [f for f in _explain(e, data, lines, str(path), Sweep) if not _missing_echo(f, reported)]
        except RecursionError:
            return None, problems + [f"{path}:1: the file nests too deeply to be a sweep file"]
        else:
            sweep._source = str(path)
            sweep._where = lines
            errors, warnings = check_sweep(sweep)
            if not errors:
                sweep._warnings = tuple(_line(sweep, p, m) for p, m in warnings)
                return sweep, problems
            found = [(tuple(map(str, p)), _line(sweep, p, m)) for p, m in errors]
            if not check_keys(sweep):  # the last stage: every check ran, on keys that are all verl's
                problems.extend(m for p, m in found if not _under(p, reported))
                rest = _without(data, [p for p, _ in found], lines, str(path))
                if rest is not None:
                    rest._warnings = tuple(_line(sweep, p, m) for p, m in warnings)
                return rest, problems
        fresh = [(p, m) for p, m in found if not _under(p, reported)]
        problems.extend(m for _, m in fresh)
        reported.update(p for p, _ in fresh)
        removed = _remove(data, [p for p, _ in fresh]) if fresh else None
        if not removed:
            return None, problems
        reported.update(removed)  # what is checked next is the default there, not the user's value
    return None, problems


def _missing_echo(problem: tuple[tuple[str, ...], str], reported: set[tuple[str, ...]]) -> bool:
    """Whether ``problem`` is the schema's "trainer T needs SECTION" for a section an earlier round removed.

    That round reported the section for its own errors: it is not missing, it failed to parse."""
    path, message = problem
    return not path and any((section,) in reported and f"needs {hint}" in message
                            for section, hint in _SECTION_HINT.items())


def _under(path: tuple[str, ...], done: set[tuple[str, ...]]) -> bool:
    return any(path[:len(d)] == d for d in done)


def _without(data: dict, paths: list[tuple[str, ...]], lines: Lines, name: str) -> Sweep | None:
    """The sweep for the checks that follow (sampler, preflight), without the entries those checks would echo.

    Removed: the parameters and the seed trials at ``paths``, and the fixed overrides at ``paths`` that the preflight
    checks again (a KL coefficient, a key klsweep sets: :data:`_ECHOED`); klsweep's or the preset's value then takes
    their place, which raises nothing. Every other entry is kept with its value: the preflight does not check it
    again (an inert knob, a budget field), and removing it would change what it does check (a batch size, a GPU
    count, a required path). So every independent problem of a file is found in one run.

    Returns:
        the sweep, or None when what is left is not a valid sweep.
    """
    for path in paths:
        if path[:1] == ("parameters",) and len(path) > 1:
            _remove(data, [path[:2]])
        elif path[:1] == ("seed_trials",):
            data.pop("seed_trials", None)
        elif path[:1] == ("overrides",) and len(path) > 1 and str(path[1]).lstrip("+") in _ECHOED:
            _remove(data, [path[:2]])
    try:
        sweep = Sweep.model_validate(data)
    except ValidationError:
        return None
    sweep._source, sweep._where = name, lines
    return sweep


#: Fixed overrides the preflight checks again (a negative KL coefficient; a key klsweep writes itself).
_ECHOED = frozenset((*KL_COEF_KEYS, *REFUSED, *REFUSED_VERL, *ONLY_VERL))


def _remove(data: dict, paths: list[tuple[str, ...]]) -> list[tuple[str, ...]] | None:
    """Remove the entries at ``paths`` from the sweep file's ``data`` so that the rest can be checked.

    Returns:
        the paths removed (a parameter, an override, or a whole optional field), or None when a path
        is the whole file or a required field (nothing left to check against).
    """
    removed: list[tuple[str, ...]] = []
    for path in paths:
        if not path or path[0] in _REQUIRED:
            return None
        field = path[0]
        if field in ("parameters", "overrides") and len(path) > 1 and isinstance(data.get(field), dict):
            data[field].pop(path[1], None)
            removed.append(path[:2])
            if field == "parameters":  # seed trials and conditions that name it would only echo its problem
                seeds: list[Any] = data["seed_trials"] if isinstance(data.get("seed_trials"), list) else []
                whens = [p.get("when") for p in data["parameters"].values() if isinstance(p, dict)]
                for entry in [*seeds, *whens]:
                    if isinstance(entry, dict):
                        entry.pop(path[1], None)
        elif path[:2] == ("health", "rules") and len(path) >= 5 and path[3] == "remedy" and _pop_remedy(data, path):
            removed.append(path[:5])  # one prescription: the rule's other ones are still checked
        else:  # an optional field (seed_trials as a whole: one round reports every seed trial's problems)
            data.pop(field, None)
            removed.append((field,))
    return removed


def _pop_remedy(data: dict, path: tuple[str, ...]) -> bool:
    """Remove the prescription ``health.rules.I.remedy.KEY`` at ``path`` from ``data``; False when it is not there."""
    rules = data["health"].get("rules") if isinstance(data.get("health"), dict) else None
    i = int(path[2]) if path[2].isdigit() else -1
    rule = rules[i] if isinstance(rules, list) and 0 <= i < len(rules) else None
    remedy = rule.get("remedy") if isinstance(rule, dict) else None
    return isinstance(remedy, dict) and remedy.pop(path[4], None) is not None


def _line(sweep: Sweep, path: tuple, message: str) -> str:
    return f"{_overridden(sweep._where, path, str(sweep.where(*path)))}: {'.'.join(map(str, path))}: {message}"


#: How ``lines`` locates a field a command-line override set: ``command line 'FIELD=VALUE'``.
_COMMAND_LINE = "command line "


def _overridden(lines: Lines, path: tuple, where: str) -> str:
    """Where the problem of the field at ``path`` comes from: ``where`` (its line, or its nearest parent's), or the
    command-line overrides that set a field inside it when ``where`` is a line of the file.

    A check of the whole field (a range's min below its max) reads the overridden value, which that line of the file
    does not hold."""
    parts = tuple(map(str, path))
    inside = [w.removeprefix(_COMMAND_LINE) for k, w in lines.items()
              if len(k) > len(parts) and k[:len(parts)] == parts and w.startswith(_COMMAND_LINE)]
    if not parts or not inside or where.startswith(_COMMAND_LINE):
        return where
    return _COMMAND_LINE + ", ".join(dict.fromkeys(inside))


_FLAT_KEYED = (("overrides",), ("parameters",))
#: The fields whose short form is a string (``sampler: tpe``, ``scheduler: asha``, ``health: conservative``): the key
#: that string stands for, in the models' ``_short_form`` validators.
_SHORT_FORMS: dict[tuple[str, ...], str] = {("sampler",): "name", ("scheduler",): "type", ("health",): "preset"}


def _apply_override(data: dict, text: str, lines: Lines) -> str | None:
    """Set one ``FIELD=VALUE`` in ``data``; returns a problem text or None."""
    field, sep, raw = text.partition("=")
    if not sep or not field:
        return "not FIELD=VALUE — e.g. budget.trials=4 or overrides.actor_rollout_ref.actor.kl_loss_coef=0.01"
    try:
        value, _ = parse(raw, "value")
    except SweepFileError as e:
        return f"the value {raw!r} is not valid YAML ({e.problems[0].split(': ', 1)[1]})"
    parts = field.split(".")
    node: Any = data
    trail: tuple[str, ...] = ()
    key: int | str  # an index into a list, or a (possibly dotted) mapping key
    i = 0
    while True:
        rest = parts[i:]
        if isinstance(node, list):
            if not rest[0].isdigit() or int(rest[0]) >= len(node):
                return f"{'.'.join(trail)} is a list of {len(node)}: {rest[0]!r} is not an index of it"
            j, key = 1, int(rest[0])
        elif isinstance(node, dict):
            j = next((n for n in range(len(rest), 0, -1) if ".".join(rest[:n]) in node), 0)
            if j == 0:
                flat = trail in _FLAT_KEYED or (len(trail) == 3 and trail[0] == "parameters" and trail[2] == "when") \
                    or (len(trail) == 2 and trail[0] == "seed_trials")
                j = len(rest) if flat else 1
            key = ".".join(rest[:j])
        else:
            return f"{'.'.join(trail)} is a {type(node).__name__}, not a mapping: cannot set {'.'.join(rest)} in it"
        trail = trail + (str(key),)
        if i + j == len(parts):
            node[key] = value
            for known in [k for k in lines if k[: len(trail)] == trail]:
                del lines[known]
            lines[trail] = f"command line {text!r}"
            return None
        if isinstance(node, dict) and not isinstance(node.get(key), (dict, list)):
            short = _SHORT_FORMS.get(trail)  # `scheduler: asha` is {type: asha}: a setting under it keeps the type
            node[key] = {short: node[key]} if short and isinstance(node.get(key), str) else {}
            lines[trail] = f"command line {text!r}"  # a mapping the override made: its problems are the override's
        node = node[key]
        i += j


#: The sweep-file fields that name a file, read with :func:`find_file` (the search space has its own folders too):
#: (section, key, what to give instead of a missing file).
_PATH_FIELDS = (
    ("replay", "trace", "give the path of a verl jsonl, console log, W&B CSV or Tune progress.csv"),
    ("tabular", "table", "give a table written by benchmarks/tabular/generate.py, e.g. "
                         "benchmarks/tabular/grpo_kl.jsonl.gz"),
)


def find_file(name: str, sweep_file: Path, *, then: Iterable[Path] = (), suffix: str = "") -> tuple[Path | None,
                                                                                                    list[str]]:
    """The file a path written in a sweep file names: the one rule of every path field.

    The path fields are ``search_space``, ``replay.trace`` and ``tabular.table``. A relative path is looked for in
    the sweep file's folder (as Hydra reads a config's relative paths), then the working directory, then ``then``.
    An absolute path is itself.

    Args:
        name: the path as written.
        sweep_file: the sweep file that names it.
        then: further folders to look in, in order (the search space's ``search_spaces/`` folders).
        suffix: also looked for as ``name + suffix`` in each place (``.yaml``: a search space given by its name),
            unless ``name`` ends with it.

    Returns:
        ``(file, folders)``: the first file found, absolute with links resolved (None when none is found), and the
        folders looked in, in order, as absolute paths for an error message.
    """
    names = [name] + ([name + suffix] if suffix and not name.endswith(suffix) else [])
    candidates = [folder / n for folder in (sweep_file.parent, Path.cwd(), *then) for n in names]
    found = next((c for c in candidates if _is_file(c)), None)
    looked = dict.fromkeys(os.path.abspath(c.parent) for c in candidates)
    return (found.resolve() if found is not None else None), list(looked)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _include_search_space(sweep_path: Path, data: dict, lines: Lines, name: str, where: str) -> list[str]:
    """Merge the ``parameters`` of the search space ``name`` (written at ``where``) under the sweep's own parameters.

    ``name`` is found by :func:`find_file`, as ``name`` or ``name.yaml``. The places are, in order: next to the sweep
    file; the working directory; then a ``search_spaces/`` folder in the sweep file's folder, beside it (sweeps/
    beside search_spaces/), in the working directory, and in klsweep's own checkout. So a sweep file finds its
    spaces from any working directory, and a shipped sweep file copied elsewhere still finds the shipped spaces."""
    shipped = Path(__file__).resolve().parents[3] / "search_spaces"
    folders = (sweep_path.parent / "search_spaces", sweep_path.parent.parent / "search_spaces",
               Path("search_spaces"), shipped)
    found, looked = find_file(name, sweep_path, then=folders, suffix=".yaml")
    if found is None:
        names = repr(name) + (f" or {name + '.yaml'!r}" if not name.endswith(".yaml") else "")
        return [f"{where}: search_space: no file {names} (looked in {', '.join(looked)})"
                " — give a name from search_spaces/ or a path, or copy the search space next to the sweep file"]
    try:
        space_data, space_lines = read(found)
    except SweepFileError as e:
        return e.problems
    if not isinstance(space_data, dict):
        return [f"{found}:1: a search-space file is a mapping with `parameters:` — got {type(space_data).__name__}"]
    try:
        _SearchSpaceFile.model_validate(space_data)
    except ValidationError as e:
        return [m for _, m in _explain(e, space_data, space_lines, str(found), _SearchSpaceFile)]
    own = data.get("parameters") or {}
    if not isinstance(own, dict):
        return []  # the schema reports it
    data["parameters"] = {**space_data["parameters"], **own}
    for key, line in space_lines.items():
        if key[:1] == ("parameters",) and (len(key) < 2 or key[1] not in own):
            lines.setdefault(key, line)
    return []


def _explain(error: ValidationError, data: Any, lines: Lines, name: str,
             model: type[BaseModel]) -> list[tuple[tuple[str, ...], str]]:
    """Pydantic errors as ``(field path, "FILE:LINE: field.path: what is wrong (value) — fix")``, one per field; an
    error of a field the command line set a field inside is located there (:func:`_overridden`)."""
    out = []
    for path, message in explain(error, data, lines, name, model, _INLINE):
        where = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), f"{name}:1")  # explain's
        blamed = _overridden(lines, path, where)
        out.append((path, blamed + message[len(where):] if message.startswith(f"{where}: ") else message))
    return out
