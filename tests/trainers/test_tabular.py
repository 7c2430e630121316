"""The tabular trainer: nearest grid point and seed, the served curve against the committed table
(benchmarks/tabular/), a live embedded run served back from a table, and a tabular sweep through `sweep run`."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from klsweep.cli import main
from klsweep.errors import OverrideError, SweepFileError, TraceReadError
from klsweep.spec import load_sweep
from klsweep.spec.space import trial_overrides
from klsweep.trainers import Trainer
from klsweep.trainers.tabular import Table, TabularTrainer, load_table
from tests.conftest import REPO

DRGRPO_TABLE = REPO / "benchmarks" / "tabular" / "drgrpo_vs_grpo.jsonl.gz"
DRGRPO_SWEEP = REPO / "sweeps" / "drgrpo_vs_grpo.yaml"
VAL = "val-core/arith/acc/mean@1"


def raw_records(path: Path) -> tuple[dict, list[dict]]:
    """The table's lines read with gzip + json only (not through klsweep's reader)."""
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    return lines[0]["header"], lines[1:]


def raw_steps(record: dict) -> list[tuple[int, dict[str, float]]]:
    """A record's (step, metrics), decoded by hand: null = not logged, "nan"/"inf"/"-inf" = non-finite."""
    return [(step, {k: float(v[i]) for k, v in record["metrics"].items() if v[i] is not None})
            for i, step in enumerate(record["steps"])]


def serve(trainer: Trainer) -> list[tuple[int, dict[str, float]]]:
    """Drive the trainer as the Tune trainable does (orchestrate/trainable.py)."""
    out = []
    while trainer.global_step < trainer.total_steps:
        metrics = trainer.train_step()
        out.append((trainer.global_step, metrics))
    return out


def toy_table() -> Table:
    """A log axis 0.001..10 (grid 0.001, 0.1, 10) × a categorical axis a..d (grid a, c), seeds 0-2."""
    header = {"parameters": {
        "c": {"scale": "log", "min": 0.001, "max": 10.0, "grid": [0.001, 0.1, 10.0]},
        "t": {"scale": "categorical", "values": ["a", "b", "c", "d"], "grid": ["a", "c"]},
    }}
    points = tuple({"c": c, "t": t} for c in (0.001, 0.1, 10.0) for t in ("a", "c"))
    runs = {(i, seed): [(1, {"x": float(i)})] for i in range(len(points)) for seed in (0, 1, 2)}
    return Table(Path("toy.jsonl.gz"), header, points, runs)


def test_nearest_point_uses_log_distance_and_category_positions():
    table = toy_table()
    # c=0.02: log10 position (log10 0.02 + 3) / 4 = 0.325, 0.175 from 0.1 (0.5) and 0.325 from 0.001 (0): 0.1 wins,
    # though 0.02 is linearly nearer to 0.001 (0.019 against 0.08).
    assert table.points[table.nearest({"c": 0.02, "t": "c"})] == {"c": 0.1, "t": "c"}
    # c=0.009: position 0.239, nearer 0 than 0.5
    assert table.points[table.nearest({"c": 0.009, "t": "a"})] == {"c": 0.001, "t": "a"}
    assert table.points[table.nearest({"c": 5.0, "t": "c"})] == {"c": 10.0, "t": "c"}
    # a category the sweep lists but the table did not record has no nearest run: another category's run would be
    # judged and scored in its place (a loss_agg_mode served another mode's curve, on another scale)
    with pytest.raises(OverrideError, match=r"t='d' was not recorded in toy.jsonl.gz \(its grid holds \['a', 'c'\]\)"):
        table.nearest({"c": 0.1, "t": "d"})
    with pytest.raises(OverrideError, match=r"t='z' is not one of the table's values \['a', 'b', 'c', 'd'\]"):
        table.nearest({"c": 0.1, "t": "z"})
    with pytest.raises(OverrideError, match="the trial sets no value for t"):
        table.nearest({"c": 0.1})


def test_seed_is_the_trials_data_seed_or_cycles_over_the_recorded_ones():
    table = toy_table()
    assert [table.seed_for(s) for s in (0, 1, 2, 3, 4, 7)] == [0, 1, 2, 0, 1, 1]


def test_served_curve_of_a_grid_point_equals_the_recorded_run():
    header, records = raw_records(DRGRPO_TABLE)
    sweep = load_sweep(DRGRPO_SWEEP)
    record = records[-1]
    overrides = {**trial_overrides(sweep, record["params"]), "data.seed": record["seed"]}
    trainer = TabularTrainer(overrides, table=DRGRPO_TABLE)
    assert (trainer.point, trainer.seed) == (record["params"], record["seed"])
    served = serve(trainer)
    assert served == raw_steps(record)
    assert [step for step, _ in served] == list(range(1, header["max_steps"] + 1))  # 1..80, as the trainable steps


def test_served_curve_stops_at_total_training_steps_and_resumes_from_a_checkpoint(tmp_path):
    _, records = raw_records(DRGRPO_TABLE)
    record = records[0]
    sweep = load_sweep(DRGRPO_SWEEP)
    overrides = {**trial_overrides(sweep, record["params"]), "data.seed": record["seed"],
                 "trainer.total_training_steps": 20}
    first = TabularTrainer(overrides, table=DRGRPO_TABLE)
    head = [first.train_step() for _ in range(7)]
    first.save(tmp_path)
    second = TabularTrainer(overrides, table=DRGRPO_TABLE)
    second.load(tmp_path)
    tail = serve(second)
    assert [m for m in head] + [m for _, m in tail] == [m for _, m in raw_steps(record)[:20]]
    assert second.total_steps == 20 and tail[0][0] == 8


def test_a_table_that_lacks_the_run_or_is_not_a_table_names_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(TraceReadError, match="bad.jsonl.gz: cannot read the tabular benchmark table"):
        load_table(str(bad))
    header, records = raw_records(DRGRPO_TABLE)
    first = records[0]
    other = next(r for r in records if r["params"] != first["params"] and r["seed"] != first["seed"])
    partial = tmp_path / "partial.jsonl.gz"  # point A with seed a, point B with seed b: no run of A with seed b
    with gzip.open(partial, "wt") as f:
        for line in ({"header": header}, first, other):
            f.write(json.dumps(line) + "\n")
    sweep = load_sweep(DRGRPO_SWEEP)
    overrides = {**trial_overrides(sweep, first["params"]), "data.seed": other["seed"]}
    with pytest.raises(TraceReadError, match="finish the table with benchmarks/tabular/generate.py"):
        TabularTrainer(overrides, table=partial)


@pytest.mark.slow
def test_a_table_serves_the_live_embedded_run_of_its_grid_point_and_seed(tmp_path):
    """A live embedded run, recorded as benchmarks/tabular/generate.py records it, is served back bit for bit.

    The committed table's values are not compared: its reference policy was trained on another CPU, and float
    kernels differ between CPUs (AVX2, AVX-512, AMX). Its record must still have the live run's steps and metrics.
    """
    from klsweep.trainers.embedded import EmbeddedTrainer
    from klsweep.trainers.tabular import encode_run

    header, records = raw_records(DRGRPO_TABLE)
    record = records[1]
    sweep = load_sweep(DRGRPO_SWEEP)
    overrides = {**trial_overrides(sweep, record["params"]), "data.seed": record["seed"]}
    live = serve(EmbeddedTrainer(overrides))  # same stepping as the trainable
    table = tmp_path / "one_run.jsonl.gz"
    with gzip.open(table, "wt") as f:
        for line in ({"header": header}, encode_run(record["params"], record["seed"], live)):
            f.write(json.dumps(line) + "\n")
    served = serve(TabularTrainer(overrides, table=table))
    assert [s for s, _ in served] == [s for s, _ in live] == [s for s, _ in raw_steps(record)]
    for (_, got), (_, want) in zip(served, live):
        del got["timing_s/step"], want["timing_s/step"]  # wall time, the one metric a rerun changes
        assert got == want  # equal to the last bit
    assert set(record["metrics"]) == set(want) | {"timing_s/step"}


def test_sweep_file_declares_the_table_and_names_a_missing_one(tmp_path):
    sweep = yaml.safe_load(DRGRPO_SWEEP.read_text())
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**sweep, "trainer": "tabular"}))
    with pytest.raises(SweepFileError, match=r"trainer tabular needs the table to serve: add `tabular: \{table: PATH"):
        load_sweep(path)
    path.write_text(yaml.safe_dump({**sweep, "trainer": "tabular", "tabular": {"table": "nope.jsonl.gz"}}))
    with pytest.raises(SweepFileError, match="no file 'nope.jsonl.gz'"):
        load_sweep(path)
    path.write_text(yaml.safe_dump({**sweep, "tabular": {"table": str(DRGRPO_TABLE)}}))
    with pytest.raises(SweepFileError, match="tabular is only read by trainer: tabular, but trainer is embedded"):
        load_sweep(path)


@pytest.mark.slow
def test_sweep_run_with_the_tabular_trainer_records_the_served_runs(ray_local, tmp_path):
    sweep = yaml.safe_load(DRGRPO_SWEEP.read_text())
    sweep.update(name="tabular_drgrpo", trainer="tabular", tabular={"table": str(DRGRPO_TABLE)},
                 budget={"trials": 2, "max_concurrent": 1, "max_steps": 20})
    path = tmp_path / "tabular.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    trials = pd.read_csv(tmp_path / "out" / "trials.csv").sort_values("number").to_dict("records")
    _, records = raw_records(DRGRPO_TABLE)
    assert len(trials) == 2
    for trial, seed_trial in zip(trials, sweep["seed_trials"]):  # the two seed trials, data.seed = the file's seed 0
        [record] = [r for r in records if r["seed"] == 0 and r["params"] == {
            "algorithm.norm_adv_by_std_in_grpo": seed_trial["algorithm.norm_adv_by_std_in_grpo"],
            "actor_rollout_ref.actor.loss_agg_mode": seed_trial["loss_agg_mode"],
            "actor_rollout_ref.actor.optim.lr": seed_trial["actor_rollout_ref.actor.optim.lr"]}]
        want = [m[VAL] for _, m in raw_steps(record)[:20] if VAL in m][-1]  # validation at step 20
        assert trial["state"] == "COMPLETE" and trial["steps"] == 20
        assert math.isclose(trial[f"value/{VAL}"], want, rel_tol=0, abs_tol=0)


def test_reference_best_is_the_healthy_point_with_the_best_seed_mean_and_stopped_points_are_the_collapsed_ones():
    import importlib.util
    import statistics

    from klsweep.health import HealthEngine, load_ruleset

    spec = importlib.util.spec_from_file_location("tabular_reference", REPO / "benchmarks" / "tabular" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ref = module.reference(DRGRPO_TABLE)
    _, records = raw_records(DRGRPO_TABLE)
    sweep = load_sweep(DRGRPO_SWEEP)
    rules = load_ruleset("default")  # the file's health: default
    by_point: dict[str, list[tuple[float, bool]]] = {}
    for r in records:
        engine = HealthEngine(rules, {**trial_overrides(sweep, r["params"]), "data.seed": r["seed"]})
        stopped = any(engine.update(step, m).stop for step, m in raw_steps(r))
        final = [m[VAL] for _, m in raw_steps(r) if VAL in m][-1]
        by_point.setdefault(json.dumps(r["params"], sort_keys=True), []).append((final, stopped))
    means = {k: statistics.fmean(f for f, _ in v) for k, v in by_point.items()}
    healthy = {k for k, v in by_point.items() if not any(s for _, s in v)}
    want = max(healthy, key=means.__getitem__)
    assert json.dumps(ref["best"]["params"], sort_keys=True) == want
    assert ref["best"]["mean"] == means[want] and ref["best"]["healthy"]
    assert ref["best"]["std"] == statistics.stdev(f for f, _ in by_point[want])
    assert {json.dumps(p["params"], sort_keys=True) for p in ref["points"] if p["healthy"]} == healthy
    assert 0 < len(healthy) < len(by_point)  # the rules stop some grid points (reward hacking) and not others
    # no KL metric with KL off: a one-objective front, the best healthy mean
    assert ref["kl_metric"] is None and [ref["points"][i]["params"] for i in ref["front"]] == [ref["best"]["params"]]


@pytest.mark.slow
def test_a_tabular_sweep_stops_a_flagged_trial_instead_of_remedying_it(ray_local, tmp_path, capsys):
    """The aggressive preset's reward_hacking has a remedy (kl_coef *4); under the tabular trainer the trial is
    stopped where the rules flag its recorded run, with no remedy recorded and no step re-run."""
    table = REPO / "benchmarks" / "tabular" / "aggressive.jsonl.gz"
    sweep = yaml.safe_load((REPO / "sweeps" / "aggressive.yaml").read_text())
    sweep["parameters"]["horizon"] = {"values": [20000]}
    sweep["seed_trials"].append({"kl_coef": 0.3, "target_kl": 1.0, "horizon": 20000})  # healthy: the sweep's rc 0
    sweep.update(name="tab_remedy", trainer="tabular", tabular={"table": str(table)},
                 budget={"trials": 2, "max_concurrent": 1, "max_steps": 80},
                 health={"preset": "aggressive", "remedies": True})  # the shipped file turns remedies off itself
    path = tmp_path / "tab_remedy.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert capsys.readouterr().err.count("trainer tabular: remedies off, a table holds no restarted runs") == 1
    # the seed trial (kl_coef 0.0005, target_kl 0.1) is served grid point kl_coef 0.0003, target_kl 0.02... by hand:
    # log10 distances |log(5e-4/3e-4)|/3 = 0.074 < |log(3e-3/5e-4)|/3 = 0.26; |log(0.1/0.02)|/1.7 = 0.41 < 0.59
    _, records = raw_records(table)
    [record] = [r for r in records if r["seed"] == 0 and r["params"] == {
        "algorithm.kl_ctrl.kl_coef": 0.0003, "algorithm.kl_ctrl.target_kl": 0.02, "algorithm.kl_ctrl.horizon": 20000}]
    from klsweep.health import HealthEngine, load_ruleset

    engine = HealthEngine(load_ruleset("aggressive"), trial_overrides(load_sweep(path), record["params"]))
    [first_stop] = [step for step, m in raw_steps(record) if engine.update(step, m).stop][:1]
    trial, healthy = pd.read_csv(tmp_path / "out" / "trials.csv").sort_values("number").to_dict("records")
    assert healthy["steps"] == 80 and healthy["state"] == "COMPLETE"
    assert trial["steps"] == first_stop < 80
    assert trial["stop_reason"].startswith(f"diverged at step {first_stop} by ")
    assert "remedied" not in trial["stop_reason"]
    assert pd.isna(trial.get("remedies"))  # no remedies column at all: no trial was restarted
