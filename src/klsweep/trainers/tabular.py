"""The tabular trainer: serves a trial the recorded embedded-trainer curve of the nearest grid point.

A table is ``benchmarks/tabular/<sweep>.jsonl.gz``, written by ``benchmarks/tabular/generate.py``. It covers every
point of a grid over a sweep's space and each of several training seeds (``data.seed``). For each, it holds every
metric the embedded trainer logged at every step, as HPOBench, LCBench and Syne Tune's simulator tabulate their
tasks. A sweep with ``trainer: tabular`` and ``tabular: {table: PATH}`` runs each trial on the recorded run of

* the grid point nearest to the trial's parameters: the sum over the table's parameters of the distance in each
  parameter's own scale, as a fraction of its searched range (log10 for ``log_uniform_values``, linear for other
  ranges, the position in the file's ``values`` list for categorical parameters, whose value must be one the table
  recorded: another category's run is never served in its place); ties go to the first point in grid order;
* the training seed ``data.seed`` when the table has it, else ``seeds[data.seed mod len(seeds)]``.

Each recorded step becomes one Ray Tune report, so the health rules, stoppers, searcher and results table see what
a live embedded trial would show, thousands of times faster.

File format: a gzip file of JSON lines, one gzip member appended per line, so generation can stop and resume.

- The first line is ``{"header": {sweep, source, max_steps, objective, parameters: {verl key: {scale, grid,
  values | min, max}}, seeds, fixed}}``.
- Each other line is one run: ``{params, seed, steps: [1..N], metrics: {name: [value per step]}}``.
- A metric not logged at a step is ``null``. Non-finite values are the strings ``"nan"``, ``"inf"``, ``"-inf"``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import OverrideError, TraceReadError

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

CHECKPOINT_FILE = "tabular_trainer.json"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _encode(value: float) -> float | str:
    return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def _decode(value: float | str) -> float:
    return _NON_FINITE[value] if isinstance(value, str) else float(value)


def encode_run(params: Mapping[str, Any], seed: int, history: Sequence[tuple[int, Mapping[str, float]]]) -> dict:
    """One run's table record from its ``[(step, metrics)]`` (metrics as ``train_step`` returned them)."""
    names = sorted({k for _, metrics in history for k in metrics})
    return {
        "params": dict(params), "seed": seed, "steps": [step for step, _ in history],
        "metrics": {k: [None if k not in m else _encode(float(m[k])) for _, m in history] for k in names},
    }


def decode_run(record: Mapping[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """The ``[(step, metrics)]`` of a table record (inverse of :func:`encode_run`)."""
    columns = record["metrics"]
    return [(step, {k: _decode(v[i]) for k, v in columns.items() if v[i] is not None})
            for i, step in enumerate(record["steps"])]


def append_record(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Append one JSON line to the table at ``path`` as its own gzip member (readable even if a later write dies)."""
    with gzip.open(path, "ab") as f:
        f.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")


def read_table_records(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and run records of a table file.

    Raises:
        TraceReadError: the file is missing, not a gzip of JSON lines, or has no header line.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rt") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, ValueError) as e:
        raise TraceReadError(f"{path}: cannot read the tabular benchmark table ({e}): give a file written by "
                             "benchmarks/tabular/generate.py") from None
    if not lines or "header" not in lines[0]:
        raise TraceReadError(f"{path}: the first line is not a table header: give a file written by "
                             "benchmarks/tabular/generate.py")
    return lines[0]["header"], lines[1:]


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header of a table file, reading its first line only (for checks that scan several tables).

    Raises:
        TraceReadError: see :func:`read_table_records`.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rt") as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, EOFError, ValueError) as e:
        raise TraceReadError(f"{path}: cannot read the tabular benchmark table ({e}): give a file written by "
                             "benchmarks/tabular/generate.py") from None
    if not isinstance(first, dict) or "header" not in first:
        raise TraceReadError(f"{path}: the first line is not a table header: give a file written by "
                             "benchmarks/tabular/generate.py")
    return first["header"]


def recorded_for(header: Mapping[str, Any]) -> str:
    """``sweep NAME (SOURCE), which searches KEY, KEY, ...``: what a table's header says it was recorded for."""
    return (f"sweep {header.get('sweep')!r} ({header.get('source')}), which searches "
            f"{', '.join(header.get('parameters', {})) or 'nothing'}")


def header_mismatch(header: Mapping[str, Any], searched: Sequence[str], fixed: Mapping[str, Any]) -> str | None:
    """Why a table with ``header`` cannot serve a sweep that searches the verl keys ``searched`` with the fixed
    settings ``fixed`` (:func:`klsweep.spec.space.fixed_overrides`); None when it can.

    A table serves a sweep when two things hold. First, it was recorded over the same searched keys, since the
    nearest grid point is looked up in them. A searched key the table lacks would be ignored; a table key the sweep
    fixes would pick runs by the fixed value. Second, it was recorded with the same training settings: the knobs of
    :data:`klsweep.verl.presets.KNOBS` and :data:`~klsweep.verl.presets.CRITIC_KNOBS` that both fix, unless the knob
    has no effect in the sweep. A run recorded with another ``adv_estimator`` is another algorithm's curve.
    Bookkeeping keys (project name, ``trainer.total_training_steps``, ``data.seed``) may differ.
    """
    from klsweep.verl.liveness import inert_reason
    from klsweep.verl.presets import CRITIC_KNOBS, KNOBS

    keys = list(header.get("parameters", {}))
    if sorted(keys) != sorted(searched):
        return f"this sweep searches {', '.join(searched) or 'nothing'}"
    recorded = header.get("fixed", {})
    differ = [k for k in (*KNOBS, *CRITIC_KNOBS) if k in recorded and k in fixed and k not in keys
              and recorded[k] != fixed[k] and not inert_reason(k, fixed)]
    if differ:
        return "its runs were recorded with " + ", ".join(
            f"{k}={recorded[k]!r} (this sweep: {fixed[k]!r})" for k in differ[:3]) + (", ..." if differ[3:] else "")
    return None


@dataclass(frozen=True)
class Table:
    """A loaded table: its header, and every run keyed by (grid point index, seed).

    Attributes:
        header: the file's header (see the module docstring).
        points: the grid points present in the file, each ``{verl key: value}``, in file order.
        runs: ``(point index, seed) → [(step, metrics)]``.
    """

    path: Path
    header: dict[str, Any]
    points: tuple[dict[str, Any], ...]
    runs: dict[tuple[int, int], list[tuple[int, dict[str, float]]]]

    @property
    def seeds(self) -> list[int]:
        """The training seeds of the table (``data.seed`` values), sorted."""
        return sorted({seed for _, seed in self.runs})

    def _position(self, key: str, value: Any) -> float:
        """``value`` on ``key``'s axis as a fraction of its searched range (see the module docstring)."""
        axis = self.header["parameters"][key]
        if axis["scale"] == "categorical":
            values = axis["values"]
            if value not in values:
                raise OverrideError(f"{key}={value!r} is not one of the table's values {values}: the trial and "
                                    f"{self.path} come from different sweep files")
            return values.index(value) / max(len(values) - 1, 1)
        lo, hi, v = float(axis["min"]), float(axis["max"]), float(value)
        if axis["scale"] == "log":
            if v <= 0:
                raise OverrideError(f"{key}={value!r} must be > 0 on the table's log axis")
            lo, hi, v = math.log10(lo), math.log10(hi), math.log10(v)
        return (v - lo) / (hi - lo) if hi > lo else 0.0

    def nearest(self, params: Mapping[str, Any]) -> int:
        """The index in :attr:`points` of the grid point nearest to ``params`` (verl keys → values).

        Raises:
            OverrideError: a table parameter is missing from ``params`` or off its axis (a categorical value the
                table's sweep does not list, a non-positive value on a log axis).
        """
        missing = [k for k in self.header["parameters"] if k not in params]
        if missing:
            raise OverrideError(f"the trial sets no value for {', '.join(missing)}, a parameter of {self.path}: "
                                "run the table with the sweep file it was generated from")
        for key, axis in self.header["parameters"].items():
            grid = axis.get("grid", axis.get("values"))
            if axis["scale"] == "categorical" and params[key] in axis["values"] and params[key] not in grid:
                raise OverrideError(
                    f"{key}={params[key]!r} was not recorded in {self.path} (its grid holds {grid}): serving another "
                    f"value's run would judge and score the wrong run. Search only {grid} for {key} (a "
                    "`values:` override of the parameter), or generate a table with it (benchmarks/tabular/README.md)")
        where = {k: self._position(k, params[k]) for k in self.header["parameters"]}
        distances = [sum(abs(self._position(k, p[k]) - x) for k, x in where.items()) for p in self.points]
        return distances.index(min(distances))

    def seed_for(self, data_seed: int) -> int:
        """The table seed served to a trial with ``data.seed=data_seed``: itself when recorded, else cycled."""
        seeds = self.seeds
        return data_seed if data_seed in seeds else seeds[data_seed % len(seeds)]

    def run(self, params: Mapping[str, Any], data_seed: int) -> tuple[int, int, list[tuple[int, dict[str, float]]]]:
        """(point index, seed, recorded ``[(step, metrics)]``) served for a trial's params and ``data.seed``.

        Raises:
            OverrideError: see :meth:`nearest`.
            TraceReadError: the nearest point has no run for that seed (an unfinished table).
        """
        point, seed = self.nearest(params), self.seed_for(data_seed)
        if (point, seed) not in self.runs:
            raise TraceReadError(f"{self.path} has no run of {self.points[point]} with data.seed={seed}: finish "
                                 "the table with benchmarks/tabular/generate.py")
        return point, seed, self.runs[(point, seed)]


@lru_cache(maxsize=8)
def load_table(path: str | os.PathLike) -> Table:
    """Read a table file (cached per path: a trial process loads it once).

    Raises:
        TraceReadError: see :func:`read_table_records`.
    """
    header, records = read_table_records(path)
    points: list[dict[str, Any]] = []
    runs: dict[tuple[int, int], list[tuple[int, dict[str, float]]]] = {}
    for record in records:
        if record["params"] not in points:
            points.append(record["params"])
        runs[(points.index(record["params"]), int(record["seed"]))] = decode_run(record)
    if not runs:
        raise TraceReadError(f"{path}: the table holds no run yet: run benchmarks/tabular/generate.py")
    return Table(Path(path), header, tuple(points), runs)


class TabularTrainer:
    """Serves the recorded curve of the nearest grid point, one step per :meth:`train_step`.

    Args:
        overrides: the trial's flat verl overrides: the table's parameters, ``data.seed`` (the training seed) and
            ``trainer.total_training_steps`` (the last step served; None or ≤ 0 serves the whole record).
        table: the table file (see the module docstring).

    Raises:
        TraceReadError: the table cannot be read or lacks the run.
        OverrideError: see :meth:`Table.nearest`; ``data.seed`` or ``trainer.total_training_steps`` is not an integer.

    Attributes:
        point: the grid point served (``{verl key: value}``); seed: the table seed served.
        total_steps: the last step served; global_step: the step of the last report served (0 before the first).
    """

    def __init__(self, overrides: Mapping[str, Any], *, table: str | os.PathLike):
        limit, data_seed = overrides.get("trainer.total_training_steps"), overrides.get("data.seed", 0)
        for key, value in (("trainer.total_training_steps", limit), ("data.seed", data_seed)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise OverrideError(f"{key}={value!r} is not an integer: give a whole number")
        self.table = load_table(str(table))
        index, self.seed, run = self.table.run(overrides, data_seed or 0)
        self.point = self.table.points[index]
        self.reports = [(step, m) for step, m in run if not limit or limit <= 0 or step <= limit]
        if not self.reports:
            raise TraceReadError(f"{table} has no step at or before trainer.total_training_steps={limit}")
        self.total_steps = self.reports[-1][0]
        self.global_step = 0
        self._next = 0

    def train_step(self) -> dict[str, float]:
        """The next recorded step's metrics (a copy).

        Raises:
            StopIteration: the whole record has been served.
        """
        if self._next >= len(self.reports):
            raise StopIteration(f"all {len(self.reports)} steps of {self.point} seed {self.seed} have been served")
        step, metrics = self.reports[self._next]
        self._next += 1
        self.global_step = step
        return dict(metrics)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the serving position to ``directory/tabular_trainer.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CHECKPOINT_FILE
        path.write_text(json.dumps({"next": self._next, "global_step": self.global_step}))
        return path

    def load(self, directory: str | os.PathLike) -> None:
        """Continue from a :meth:`save` of the same trial."""
        state = json.loads((Path(directory) / CHECKPOINT_FILE).read_text())
        self._next, self.global_step = state["next"], state["global_step"]


def recorded_values(sweep: Sweep, header: Mapping[str, Any]) -> list[str]:
    """Sweep-file overrides (``parameters.NAME={values: [...]}``) that narrow each categorical parameter of ``sweep``
    to the values its table recorded (the header's ``grid``).

    For sweeps run on a table that holds fewer categories than the file searches; the trainer refuses the others."""
    out = []
    for name, key in sweep.parameter_keys.items():
        axis = header["parameters"].get(key, {})
        grid = axis.get("grid")
        if axis.get("scale") == "categorical" and grid is not None and grid != axis.get("values"):
            out.append(f"parameters.{name}={{values: [{', '.join(map(str, grid))}]}}")
    return out
