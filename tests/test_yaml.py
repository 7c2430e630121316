"""klsweep._yaml: YAML 1.2 scalars with the line of every field, and unknown fields explained as a user writes them."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from klsweep._yaml import explain, parse, read, unknown_field_fix
from klsweep.errors import SweepFileError


def test_yaml_1_2_scalars_and_the_line_of_every_field():
    data, lines = parse("a: on\nb:\n  c: 1e-3\n  d: [2024-01-01, true]\n", "f.yaml")
    assert data == {"a": "on", "b": {"c": 0.001, "d": ["2024-01-01", True]}}
    assert lines == {("a",): "f.yaml:1", ("b",): "f.yaml:2", ("b", "c"): "f.yaml:3", ("b", "d"): "f.yaml:4",
                     ("b", "d", "0"): "f.yaml:4", ("b", "d", "1"): "f.yaml:4"}


@pytest.mark.parametrize(("text", "expected"), [
    ("a: 1\na: 2\n", "f.yaml:2: key 'a' is given twice (first on line 1) — fix the YAML syntax"),
    ("a:\n\t- 1\n", "— indent with spaces, YAML does not allow tabs"),
])
def test_invalid_yaml_is_one_problem_with_its_line_and_fix(text, expected):
    with pytest.raises(SweepFileError) as e:
        parse(text, "f.yaml")
    (problem,) = e.value.problems
    assert problem.startswith("f.yaml:") and problem.endswith(expected), problem


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(SweepFileError) as e:
        read(tmp_path / "none.yaml")
    path = tmp_path / "none.yaml"
    assert e.value.problems == [f"{path}: no such file — check the path (shipped sweeps are in sweeps/)"]


class _Leaf(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="a metric name")


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    for_: int = Field(1, alias="for", description="steps")
    size: int = Field(1, description="a size")
    leaves: tuple[_Leaf, ...] = Field((), description="from 'metric:' or 'all:'")


class _Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[_Node] = Field(description="the nodes")


def test_unknown_field_fix_lists_aliases_and_inline_fields():
    assert unknown_field_fix(_Root, ("nodes", "0", "fro")) == "did you mean 'for'? Valid fields here: for, size, leaves"
    inline = {_Node: ("leaves", ("all",))}
    assert unknown_field_fix(_Root, ("nodes", "0", "metrc"), inline) == (
        "did you mean 'metric'? Valid fields here: for, size, all, metric")


def test_explain_gives_the_line_the_field_the_value_and_the_fix():
    data, lines = parse("nodes:\n  - size: x\n  - leaves: [{metric: m, extra: 1}]\n", "f.yaml")
    with pytest.raises(ValidationError) as e:
        _Root.model_validate(data)
    assert [m for _, m in explain(e.value, data, lines, "f.yaml", _Root)] == [
        "f.yaml:2: nodes.0.size: Input should be a valid integer, unable to parse string as an integer (got 'x')"
        " — expected: a size",
        "f.yaml:3: nodes.1.leaves.0.extra: unknown field — Valid fields here: metric",
    ]
