"""The conservative preset on the committed tabular benchmark (benchmarks/tabular/conservative.jsonl.gz, 156 runs of
the embedded task): its rules stop every run whose gold validation accuracy collapses, and no run that ends at least
as accurate as it was at its first validation (a verdict that kills a good run is the worst one a user sees)."""

from __future__ import annotations

from klsweep.health import HealthEngine, load_ruleset
from klsweep.trainers.tabular import load_table
from tests.conftest import REPO

VAL = "val-core/arith/acc/mean@1"


def test_conservative_stops_the_collapsed_runs_of_its_table_and_none_that_end_no_worse_than_they_began():
    table = load_table(REPO / "benchmarks" / "tabular" / "conservative.jsonl.gz")
    rules = load_ruleset("conservative")
    collapsed, kept, wrongly_stopped, missed = 0, 0, [], []
    for (point, seed), run in table.runs.items():
        engine = HealthEngine(rules, {**table.header["fixed"], **table.points[point], "data.seed": seed})
        stopped = False
        for step, metrics in run:
            if engine.update(step, metrics).stop:
                stopped = True
                break
        validations = [m[VAL] for _, m in run if VAL in m]
        if validations[-1] < 0.1:  # reward hacking ran its course: gold accuracy from 0.54-0.66 to under 0.1
            collapsed += 1
            if not stopped:
                missed.append((table.points[point], seed))
        elif validations[-1] >= validations[0]:  # ends at least as accurate as at step 10
            kept += 1
            if stopped:
                wrongly_stopped.append((table.points[point], seed, engine.reason.rule, engine.reason.step))
    assert not missed and not wrongly_stopped, (missed, wrongly_stopped)
    assert (collapsed, kept) == (59, 72)  # both groups are populated: the check is not vacuous
