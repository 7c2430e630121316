"""Relative paths in a sweep file (search_space, replay.trace, tabular.table) and overrides of included parameters:
one rule for every path field, the sweep file's folder first, then the working directory."""

from __future__ import annotations

import shutil

import pytest
import yaml

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from tests.conftest import REPO

SPACE = "parameters:\n  kl_coef: {distribution: log_uniform_values, min: 0.0001, max: 0.01}\n"
HEADER = "name: t\nalgorithm: grpo\nobjective: {metric: val-core/arith/acc/mean@1, mode: max}\n"
DRGRPO_TABLE = REPO / "benchmarks" / "tabular" / "drgrpo_vs_grpo.jsonl.gz"


def _problems(path, overrides=()) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path, overrides)
    return e.value.problems


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A sweep-file folder ``tmp_path/other/sub`` and a working directory ``tmp_path/cwd`` that is not it."""
    folder, cwd = tmp_path / "other" / "sub", tmp_path / "cwd"
    folder.mkdir(parents=True)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return folder, cwd


def test_a_search_space_named_without_yaml_is_found_next_to_the_sweep_file(elsewhere):
    folder, _ = elsewhere
    (folder / "my_space.yaml").write_text(SPACE)
    (folder / "sweep.yaml").write_text(HEADER + "search_space: my_space\n")
    sweep = load_sweep(folder / "sweep.yaml")
    assert (sweep.parameters["kl_coef"].min, sweep.parameters["kl_coef"].max) == (0.0001, 0.01)
    assert sweep.where("parameters", "kl_coef") == f"{folder / 'my_space.yaml'}:2"


def test_a_missing_search_space_names_both_file_names_and_every_folder_in_the_order_searched(elsewhere):
    folder, cwd = elsewhere
    (folder / "sweep.yaml").write_text(HEADER + "search_space: my_space\n")
    [problem] = [p for p in _problems(folder / "sweep.yaml") if "search_space" in p]
    assert "search_space: no file 'my_space' or 'my_space.yaml' (looked in " in problem
    looked = problem.split("(looked in ", 1)[1].split(")", 1)[0].split(", ")
    # the sweep file's folder, the working directory, then the search_spaces/ folders (in the sweep file's folder,
    # beside it, in the working directory, klsweep's own)
    assert looked[:5] == [str(folder), str(cwd), str(folder / "search_spaces"), str(folder.parent / "search_spaces"),
                          str(cwd / "search_spaces")]
    assert looked[5] == str(REPO / "search_spaces") and len(looked) == 6


def test_a_search_space_in_the_sweep_files_own_search_spaces_folder_is_found_from_any_working_directory(elsewhere):
    folder, cwd = elsewhere
    (folder / "search_spaces").mkdir()
    (folder / "search_spaces" / "mine.yaml").write_text(SPACE)
    (folder / "sweep.yaml").write_text(HEADER + "search_space: mine\n")
    sweep = load_sweep(folder / "sweep.yaml")  # the working directory is elsewhere (cwd), as for a resume from /tmp
    assert sweep.parameters["kl_coef"].max == 0.01
    assert sweep.where("parameters", "kl_coef") == f"{folder / 'search_spaces' / 'mine.yaml'}:2"


def test_a_search_space_next_to_the_sweep_file_wins_over_one_in_the_working_directory(elsewhere):
    folder, cwd = elsewhere
    (folder / "space.yaml").write_text(SPACE)
    (cwd / "space.yaml").write_text(SPACE.replace("0.01}", "0.5}"))
    (folder / "sweep.yaml").write_text(HEADER + "search_space: space.yaml\n")
    assert load_sweep(folder / "sweep.yaml").parameters["kl_coef"].max == 0.01


def test_a_replay_trace_next_to_the_sweep_file_wins_over_one_in_the_working_directory(elsewhere):
    folder, cwd = elsewhere
    for where in (folder, cwd):
        (where / "run.jsonl").write_text('{"step": 1, "data": {"actor/kl_loss": 0.1}}\n')
    (folder / "sweep.yaml").write_text(HEADER + "trainer: replay\nreplay: {trace: run.jsonl}\n")
    assert load_sweep(folder / "sweep.yaml").replay.trace == str(folder / "run.jsonl")
    (folder / "run.jsonl").unlink()  # the working directory still works, for files that relied on it
    assert load_sweep(folder / "sweep.yaml").replay.trace == str(cwd / "run.jsonl")


def _tabular_sweep(folder, table: str):
    data = yaml.safe_load((REPO / "sweeps" / "drgrpo_vs_grpo.yaml").read_text())
    path = folder / "drgrpo.yaml"
    path.write_text(yaml.safe_dump({**data, "trainer": "tabular", "tabular": {"table": table}}))
    return path


def test_a_table_next_to_the_sweep_file_is_found_from_another_working_directory(elsewhere):
    folder, cwd = elsewhere
    shutil.copy(DRGRPO_TABLE, folder / "t.jsonl.gz")
    sweep = load_sweep(_tabular_sweep(folder, "t.jsonl.gz"))
    assert sweep.tabular.table == str(folder / "t.jsonl.gz")  # absolute: Ray workers run in another directory


def test_a_missing_table_names_the_places_looked_in_and_is_one_problem(elsewhere):
    folder, cwd = elsewhere
    [problem] = _problems(_tabular_sweep(folder, "t.jsonl.gz"))
    assert f"tabular.table: no file 't.jsonl.gz' (looked in {folder}, {cwd})" in problem
    assert "benchmarks/tabular/generate.py" in problem


def test_a_missing_trace_names_the_places_looked_in(elsewhere):
    folder, cwd = elsewhere
    (folder / "sweep.yaml").write_text(HEADER + "trainer: replay\nreplay: {trace: logs/run.jsonl}\n")
    [problem] = _problems(folder / "sweep.yaml")
    assert f"replay.trace: no file 'logs/run.jsonl' (looked in {folder / 'logs'}, {cwd / 'logs'})" in problem


def test_the_shipped_table_paths_still_work_from_the_repository_root(monkeypatch):
    # the docs' and the tests' form: a path from the repository root with a shipped sweep file in sweeps/
    monkeypatch.chdir(REPO)
    sweep = load_sweep("sweeps/drgrpo_vs_grpo.yaml",
                       ["trainer=tabular", "tabular={table: benchmarks/tabular/drgrpo_vs_grpo.jsonl.gz}"])
    assert sweep.tabular.table == str(DRGRPO_TABLE)


def test_an_override_of_an_included_parameters_field_merges_into_it():
    # grpo_kl includes kl_coef from search_spaces/grpo_kl_loss.yaml (min 0.001, max 10)
    sweep = load_sweep(REPO / "sweeps" / "grpo_kl.yaml", ["parameters.kl_coef.max=0.5"])
    kl_coef = sweep.parameters["kl_coef"]
    assert (kl_coef.distribution, kl_coef.min, kl_coef.max) == ("log_uniform_values", 0.001, 0.5)
    assert sweep.where("parameters", "kl_coef", "max") == "command line 'parameters.kl_coef.max=0.5'"
    assert sweep.where("parameters", "kl_coef", "min") == f"{REPO / 'search_spaces' / 'grpo_kl_loss.yaml'}:4"
    assert set(sweep.parameters) == {"kl_coef", "kl_loss_type", "loss_agg_mode"}


def test_an_override_applies_to_the_search_space_the_command_line_names(tmp_path):
    (tmp_path / "a.yaml").write_text(SPACE)
    (tmp_path / "b.yaml").write_text("parameters:\n  entropy_coeff: {min: 0.0, max: 0.01}\n")
    path = tmp_path / "sweep.yaml"
    path.write_text(HEADER + "search_space: a\n")
    sweep = load_sweep(path, ["parameters.entropy_coeff.max=0.002", "search_space=b"])
    assert list(sweep.parameters) == ["entropy_coeff"] and sweep.parameters["entropy_coeff"].max == 0.002
    [problem] = _problems(path, ["search_space=c"])
    assert problem.startswith("command line 'search_space=c': search_space: no file 'c' or 'c.yaml'")
