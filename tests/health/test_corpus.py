"""The verdict corpus (tests/data/verdicts/corpus.yaml): real public verl runs judged by the shipped presets.

Every healthy run is left alone by ``default``, ``conservative`` and ``aggressive``; every failure is stopped in
its window (after ``not_before``, by ``by``) with its kind, by ``default`` and ``conservative``."""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import pytest
import yaml

from klsweep.health import HealthEngine, load_ruleset
from klsweep.health.readers import read_trace
from klsweep.health.signals import first_present
from klsweep.verl.metrics import ALIASES

DATA = Path(__file__).resolve().parents[1] / "data"
CORPUS = yaml.safe_load((DATA / "verdicts" / "corpus.yaml").read_text())["runs"]
FIELDS = {"id", "file", "source", "group", "model", "scale_b", "algorithm", "task", "verdict", "why"}


@functools.cache
def _trace(file: str):
    return read_trace(DATA / file)


def _summary(entry, preset):
    trace = _trace(entry["file"])
    engine = HealthEngine(load_ruleset(preset), trace.config, rounded=trace.rounded)
    for step, metrics in trace.reports:
        engine.update(step, metrics)
    return engine.summary()


def test_every_run_names_its_source_and_verdict():
    assert len({e["id"] for e in CORPUS}) == len(CORPUS)
    for entry in CORPUS:
        assert FIELDS <= set(entry), entry["id"]
        assert (DATA / entry["file"]).is_file(), entry["file"]
        assert entry["verdict"] in ("healthy", "stop")
        if entry["verdict"] == "stop":
            assert entry["kind"] and entry["not_before"] <= entry["by"], entry["id"]


def _healthy_cases():
    """(entry, preset) for every healthy run and preset."""
    for entry in (e for e in CORPUS if e["verdict"] == "healthy"):
        for preset in ("default", "conservative", "aggressive"):
            yield pytest.param(entry, preset, id=f"{entry['id']}-{preset}")


@pytest.mark.parametrize(("entry", "preset"), list(_healthy_cases()))
def test_healthy_real_runs_are_not_stopped(entry, preset):
    summary = _summary(entry, preset)
    assert summary["verdict"] != "stopped", summary["stop_reason"]


@pytest.mark.parametrize("preset", ["default", "conservative"])
@pytest.mark.parametrize("entry", [e for e in CORPUS if e["verdict"] == "stop"], ids=lambda e: e["id"])
def test_real_failures_are_stopped_in_their_window_with_their_kind(entry, preset):
    summary = _summary(entry, preset)
    assert entry["not_before"] <= summary["stop_step"] <= entry["by"], summary["stop_reason"]
    assert summary["stop_kind"] == entry["kind"]


def test_the_gpg_length_blowup_is_stopped_for_its_length_not_at_the_math_dip():
    """verl's GPG baseline on Qwen2-7B: response length triples from step 156 with a third to half of the responses
    at the 1024-token cap; the MATH validation dips once at step 115 and recovers."""
    entry = next(e for e in CORPUS if e["id"] == "gpg_qwen2_7b_math_length_blowup")
    rows = dict(_trace(entry["file"]).reports)
    before = statistics.median(rows[s]["response_length/mean"] for s in range(106, 156))
    assert rows[165]["response_length/mean"] / before > 2.5
    assert max(rows[s]["response_length/clip_ratio"] for s in range(21, 156)) < 0.02
    assert min(rows[s]["response_length/clip_ratio"] for s in range(165, 211)) > 0.3
    for preset in ("default", "conservative", "aggressive"):
        summary = _summary(entry, preset)
        assert summary["reason"]["rule"] == "length_blowup" and 156 <= summary["stop_step"] <= 171, preset
        assert "response_length/mean" in summary["stop_reason"] and "response_length/clip_ratio" in summary[
            "stop_reason"]
        assert summary["fired"].get("reward_hacking", {}).get("action") in (None, "warn")


def test_7b_entropy_far_below_its_start_with_validation_rising_is_not_stopped():
    """The GRPO reference (Qwen2-7B), the GPG Megatron run and the deepseek-7B GRPO Megatron run end at a fifth to a
    quarter of their starting entropy while validation holds near its best: absolute entropy floors stopped such
    runs; the scale-free rules do not."""
    for run_id in ("grpo_qwen2_7b_gsm8k", "gpg_qwen2_7b_megatron_gsm8k", "grpo_deepseek7b_megatron_gsm8k_math"):
        entry = next(e for e in CORPUS if e["id"] == run_id)
        reports = _trace(entry["file"]).reports
        entropy = [hit[1] for _, m in reports if (hit := first_present(m, ALIASES["entropy"]))]
        assert entropy[-1] / statistics.median(entropy[:20]) < 0.3
        summary = _summary(entry, "conservative")
        assert summary["verdict"] != "stopped"


def test_deepseek7b_grpo_megatron_transcript_matches_its_summary_and_is_left_alone():
    """verl-data's deepseek-llm-7b-chat GRPO Megatron run (GSM8K + MATH): every step line transcribed (steps 0-210);
    the last one agrees with the run summary W&B printed at the end, the step-0 line with the initial validation
    metrics. GSM8K validation 0.319 -> 0.700 while MATH stays low (0.147 -> 0.197): no preset stops or warns."""
    entry = next(e for e in CORPUS if e["id"] == "grpo_deepseek7b_megatron_gsm8k_math")
    rows = dict(_trace(entry["file"]).reports)
    assert sorted(rows) == list(range(211))
    wandb_summary = {"actor/entropy_loss": 0.07022, "actor/kl_loss": 0.06638, "critic/score/mean": 0.68418,
                     "response_length/mean": 179.33926, "response_length/clip_ratio": 0.00684,
                     "val/test_score/openai/gsm8k": 0.69295,
                     "val/test_score/DigitalLearningGmbH/MATH-lighteval": 0.19576}
    for key, value in wandb_summary.items():
        assert rows[210][key] == round(value, 3), key
    assert rows[0] == {"val/test_score/openai/gsm8k": round(0.3191811978771797, 3),
                       "val/test_score/DigitalLearningGmbH/MATH-lighteval": round(0.1465172137710168, 3)}
    validated = [s for s in rows if "val/test_score/openai/gsm8k" in rows[s]]
    assert validated == list(range(0, 211, 5))
    for preset in ("default", "conservative", "aggressive"):
        summary = _summary(entry, preset)
        assert summary["verdict"] == "healthy", (preset, summary["fired"])


def test_72b_lora_run_with_solved_batches_is_warned_of_not_stopped():
    """verl's GRPO-LoRA baseline at 72B: at 94-98 % training accuracy some batches have every group unanimous, so
    every advantage is 0 (steps 31, 38, 39, 75, 81) while validation holds at 0.95-0.96 and each batch scores 0..1.
    ``builtin.no_signal`` warns at step 39 (steps 38-39, ``no_signal_for: 2``) in ``default`` and ``conservative``
    and stops none: two steps are short of ``uniform_groups_for`` (5); ``aggressive`` (4 steps) says nothing.
    The last transcribed line agrees with the run summary W&B printed at the end of the log."""
    entry = next(e for e in CORPUS if e["id"] == "grpo_lora_qwen25_72b_gsm8k")
    rows = dict(_trace(entry["file"]).reports)
    wandb_summary = {"actor/entropy_loss": 0.17688, "actor/kl_loss": 0.05339, "critic/score/mean": 0.91562,
                     "actor/grad_norm": 0.00358, "response_length/mean": 264.58749,
                     "val-core/openai/gsm8k/reward/mean@1": 0.95982}
    for key, value in wandb_summary.items():
        assert rows[116][key] == round(value, 3), key
    solved = [s for s in sorted(rows)
              if s and rows[s]["critic/advantages/max"] == rows[s]["critic/advantages/min"] == 0]
    assert solved == [31, 38, 39, 75, 81] and min(rows[s]["critic/score/mean"] for s in solved) > 0.9
    assert min(m["val-core/openai/gsm8k/reward/mean@1"] for s, m in rows.items() if s and s >= 20
               and "val-core/openai/gsm8k/reward/mean@1" in m) > 0.95
    entropy = [rows[s]["actor/entropy_loss"] for s in sorted(rows) if s]
    assert entropy[-1] / statistics.median(entropy[:20]) > 1.6  # entropy rises while validation holds
    for preset in ("default", "conservative"):
        summary = _summary(entry, preset)
        assert summary["verdict"] == "warned", summary["stop_reason"]
        fired = summary["fired"]["builtin.no_signal"]
        assert (fired["action"], fired["count"], fired["first_step"]) == ("warn", 1, 39), preset
    assert "builtin.no_signal" not in _summary(entry, "aggressive")["fired"]


def _rising_entropy(score_falls: bool):
    """verl's 7B PPO baseline (ppo_deepseek7b_gsm8k_megatron.jsonl) for its first 40 steps, then the shape of a
    policy going random: entropy from 0.06 to 6 nats over 40 steps (x1.12 a step), the score either falling
    0.85 -> 0.45 (never half its best within 20 steps: not a score collapse) or holding."""
    entry = next(e for e in CORPUS if e["id"] == "ppo_deepseek7b_gsm8k_megatron")
    rows = [(s, dict(m)) for s, m in _trace(entry["file"]).reports if s is not None and 1 <= s <= 40]
    for k in range(1, 41):
        metrics = dict(rows[-1][1])
        metrics["actor/entropy_loss"] = round(min(6.0, 0.06 * 1.12 ** k), 3)
        metrics["critic/score/mean"] = round(0.85 - 0.01 * k, 3) if score_falls else 0.85
        rows.append((40 + k, metrics))
    return rows


def test_entropy_rising_while_the_score_falls_is_stopped_and_alone_is_a_warning():
    stopped = HealthEngine(load_ruleset("default"), rounded=True)
    for step, metrics in _rising_entropy(score_falls=True):
        if stopped.update(step, metrics).stop:
            break
    reason = stopped.summary()["reason"]
    assert reason["rule"] == "entropy_rise" and reason["kind"] == "diverged"
    early = statistics.median(m["actor/entropy_loss"] for s, m in _rising_entropy(True) if 1 <= s <= 20)
    ratio = reason["values"]["ratio_to_early20(mean10 actor/entropy_loss)"]
    assert ratio > 3.0 and early == 0.141
    assert reason["values"]["drop_from_max50(critic/score/mean)"] > 0.3
    assert 41 < reason["step"] <= 80
    warned = HealthEngine(load_ruleset("default"), rounded=True)
    for step, metrics in _rising_entropy(score_falls=False):
        warned.update(step, metrics)
    summary = warned.summary()
    assert summary["verdict"] == "warned" and summary["fired"]["entropy_high"]["action"] == "warn"


def test_aggressive_stops_the_zero_reward_run_of_rllm54_as_no_signal_at_its_second_report():
    entry = next(e for e in CORPUS if e["id"] == "grpo_no_signal_rllm54")
    summary = _summary(entry, "aggressive")
    # reports at steps 4 and 7, every advantage 0 at both: a streak of 4 steps (4-7), aggressive's no_signal_for
    assert (summary["stop_step"], summary["stop_kind"]) == (7, "no_signal"), summary["stop_reason"]
    assert summary["reason"]["rule"] == "builtin.no_signal"


def test_absolute_kl_bounds_sit_above_every_healthy_runs_peak():
    # KL in nats per token against the run's own reference: the healthy runs (0.5B-7.6B, PPO and GRPO) peak at
    # 0.073-0.349, so an absolute bound needs no scale; each preset's kl_blowup must clear the highest peak
    peaks = []
    for entry in (e for e in CORPUS if e["verdict"] == "healthy"):
        values = [hit[1] for _, m in _trace(entry["file"]).reports
                  if (hit := first_present(m, ALIASES["ref_kl"])) is not None]
        if values:
            peaks.append(max(values))
    assert len(peaks) >= 8 and 0.3 < max(peaks) < 0.4, peaks
    for preset in ("default", "conservative", "aggressive"):
        blowup = next(r for r in load_ruleset(preset).rules if r.name == "kl_blowup")
        assert blowup.conditions[0].above > max(peaks), (preset, blowup.conditions[0].above)
