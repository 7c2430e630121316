"""Fixtures of the health tests: the real verl traces in ../shared/traces (next to the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


def trace(name: str) -> Path:
    """Path of a shared trace; skips the test when the shared folder is absent."""
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"shared trace {name} not found at {TRACES.resolve()} (clone the repo next to shared/)")
    return path


T1_CONSOLE = "T1_ppo_qwen05b_gsm8k_console.log"
T1_JSONL = "T1_ppo_qwen05b_healthy.jsonl"
T4 = "T4_grpo_qwen7b_gsm8k_full.jsonl"
T5 = "T5_grpo_no_signal.jsonl"
