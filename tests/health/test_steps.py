"""Windows, ``for`` and ``after`` count training steps, not reports: a log with one row every k steps gets
the verdict of the full log within k steps, and each finding says the steps it looked at."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from klsweep.health import HealthConfig, HealthEngine, load_ruleset

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
#: One report every 25 steps (a sampled W&B history); the length halves by step 175 with score max pinned at 0.1.
SAMPLED = SHAPES / "sampled_every_25_steps_length_collapse.jsonl"


def _stream(path: Path) -> list[tuple[int, dict]]:
    return [(row["step"], row["data"]) for row in map(json.loads, path.read_text().splitlines())]


def _summary(ruleset, stream, run_config=None) -> dict:
    engine = HealthEngine(ruleset, run_config)
    for step, metrics in stream:
        engine.update(step, metrics)
    return engine.summary()


def _every_step(stream: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """The full log a sampled one was taken from, values interpolated linearly between its rows."""
    full = []
    for (s0, m0), (s1, m1) in zip(stream, stream[1:], strict=False):
        for s in range(s0, s1):
            full.append((s, {k: m0[k] + (m1[k] - m0[k]) * (s - s0) / (s1 - s0) for k in m0}))
    return full + [stream[-1]]


def test_a_log_sampled_every_25_steps_stops_when_the_full_log_does():
    sampled = _stream(SAMPLED)
    summary = _summary(load_ruleset("default"), sampled)
    # length 190 at step 100 (the last report at or before 175 - 100 + 1 = 76 is step 75, length 190), 70 at step 175:
    # drop 0.63 > 0.5 over 100 steps; score max 0.1 at steps 150 and 175 (std 0 over 10 steps). Counted in reports
    # (a window of 20 reports, "for 3 reports") the stop came at step 275.
    assert (summary["stop_step"], summary["reason"]["rule"]) == (175, "length_collapse")
    assert summary["reason"]["values"]["drop_from_max100(response_length/mean)"] == (190 - 70) / 190
    assert "over steps 75-175" in summary["stop_reason"]
    full = _summary(load_ruleset("default"), _every_step(sampled))
    assert full["reason"]["rule"] == "length_collapse" and abs(full["stop_step"] - 175) < 25
    # every step: length 110 - 1.6 × (s - 150) falls below 95 (half of 190) at step 160; held for 3 steps at 162
    assert full["stop_step"] == 162 and "over steps 63-162" in full["stop_reason"]


def test_a_window_needs_its_steps_covered_with_two_reports():
    rule = {"name": "avg", "metric": "m", "stat": "mean", "window": 10, "above": 0.5, "action": "stop"}
    ruleset = load_ruleset(HealthConfig(preset="none", rules=[rule]))
    engine = HealthEngine(ruleset)
    first = engine.update(1, {"m": 1.0})
    second = engine.update(26, {"m": 2.0})  # 10 steps ending at 26 start at 17: the report at step 1 covers them
    assert not first.stop and second.stop
    assert second.reason.values == {"mean10(m)": (1.0 + 2.0) / 2} and "over steps 1-26" in second.reason.message
    engine = HealthEngine(ruleset)
    for step in range(1, 6):
        engine.update(step, {"m": 1.0})
    assert engine.summary()["not_applicable"]["avg"] == (
        "mean10(m) needs 10 steps covered (at least two reports), the run covered 5 (steps 1-5, 5 reports)"
    )


def test_for_and_after_are_steps_on_a_sampled_log():
    rule = {"name": "high", "metric": "m", "above": 1.0, "for": 30, "after": 40, "action": "stop"}
    ruleset = load_ruleset(HealthConfig(preset="none", rules=[rule]))
    # reports every 25 steps, m high from step 1: the warm-up ends at 40, so the streak starts at step 41;
    # at step 51 it has held 11 steps, at step 76 it has held 36 >= 30
    summary = _summary(ruleset, [(s, {"m": 2.0}) for s in range(1, 200, 25)])
    assert summary["stop_step"] == 76 and "over steps 41-76" in summary["stop_reason"]
    assert "m > 1 for 30 steps after step 40" in summary["stop_reason"]
    # the full log: steps 41..70 are 30 steps
    assert _summary(ruleset, [(s, {"m": 2.0}) for s in range(1, 200)])["stop_step"] == 70


# ---- the property ---------------------------------------------------------------------------------------------------
LENGTH = 320  # longer than any stop the strategy below can produce (onset 200 + after 50 + for 40) plus one interval


def _shape(kind: str, onset: int | None, for_: int, after: int):
    """(ruleset, run config, metrics at step s) of a full log whose condition becomes true at ``onset`` and stays."""
    off = {"no_signal_for": 0, "no_update_for": 0, "kl_dead_for": 0}
    rules: list[dict] = []
    builtin = dict(off)
    config = None
    if kind in ("value", "ratio_to_first", "drop_from_max"):
        before, now, bound = {"value": (0.0, 2.0, 1.0), "ratio_to_first": (1.0, 3.0, 2.0),
                              "drop_from_max": (1.0, 0.2, 0.5)}[kind]
        rules = [{"name": kind, "metric": "m", "stat": kind, "above": bound, "for": for_, "after": after,
                  "action": "stop"}]

        def metrics(s: int) -> dict:
            return {"m": now if onset is not None and s >= onset else before}
    else:
        builtin[f"{kind}_for"] = for_
        if kind == "kl_dead":
            builtin["kl_dead_after"] = after
        config = {"actor_rollout_ref.actor.use_kl_loss": True}

        def metrics(s: int) -> dict:
            on = onset is not None and s >= onset
            return {
                "actor/kl_loss": 0.0 if on and kind in ("kl_dead", "no_update") else 0.05,
                "actor/grad_norm": 0.0 if on and kind == "no_update" else 0.5,
                "critic/advantages/max": 0.0 if on and kind == "no_signal" else 1.0,
                "critic/advantages/min": 0.0 if on and kind == "no_signal" else -1.0,
            }
    return load_ruleset(HealthConfig(preset="none", rules=rules, builtin=builtin)), config, metrics


@given(
    kind=st.sampled_from(["value", "ratio_to_first", "drop_from_max", "kl_dead", "no_signal", "no_update"]),
    onset=st.none() | st.integers(1, 200),
    every=st.integers(2, 30),
    for_=st.integers(1, 40),
    after=st.integers(0, 50),
)
def test_a_log_sampled_every_k_steps_gets_the_full_logs_verdict_within_k_steps(kind, onset, every, for_, after):
    """Holds for conditions on a report's own value (``value``, ``ratio_to_first``, ``drop_from_max`` over the whole
    run) and the streaks of the built-in checks, whenever the condition, once true, stays true.

    It cannot hold for window statistics (``mean``/``std``/``var``/``min``/``max``/``slope`` and ``drop_from_max``
    with a window): a sampled window averages 2 reports where the full log averages W, and the report that covers
    the window's first step keeps a value from before a change up to k steps longer (a ``min``/``max`` crossing can
    come up to 2k late); nor for a condition that flickers between two reports (true for fewer steps than k), which
    a sampled log may never see, or see only at its true reports.
    """
    ruleset, config, metrics = _shape(kind, onset, for_, after)
    full = _summary(ruleset, [(s, metrics(s)) for s in range(1, LENGTH + 1)], config)
    sampled = _summary(ruleset, [(s, metrics(s)) for s in range(1, LENGTH + 1, every)], config)
    if full["stop_step"] is None:
        assert sampled["stop_step"] is None
        return
    assert sampled["reason"] is not None and sampled["reason"]["rule"] == full["reason"]["rule"]
    assert abs(sampled["stop_step"] - full["stop_step"]) < every, (full["stop_reason"], sampled["stop_reason"])


def test_a_log_that_restarts_its_step_count_restarts_the_streak():
    rule = {"name": "high", "metric": "m", "above": 1.0, "for": 3, "action": "stop"}
    ruleset = load_ruleset(HealthConfig(preset="none", rules=[rule]))
    # steps 100, 101 hold (2 steps), then the log restarts at step 1: a streak from 100 would never reach 3 steps
    summary = _summary(ruleset, [(100, {"m": 2.0}), (101, {"m": 2.0}), (1, {"m": 2.0}), (2, {"m": 2.0}),
                                 (3, {"m": 2.0})])
    assert summary["stop_step"] == 3 and "over steps 1-3" in summary["stop_reason"]
