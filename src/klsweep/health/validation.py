"""Validation sets: which ``val-core/...`` keys a rule on ``val_score`` judges, and how their findings combine.

verl logs one score per validation data source (``trainer/ppo/ray_trainer.py::_validate`` →
``process_validation_metrics``: ``val-core/<data_source>/<reward key>/mean@N``). A run validated on GSM8K and MATH
has two. Each set is judged on its own. A finding that every set reporting at that step shares keeps the rule's
action. A finding on some sets only (a single-set dip the others do not share) is a warning, and its message says
what the other sets did.

``health: {validation: KEY}`` judges one key only, the user's choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from klsweep.health.signals import number
from klsweep.health.verdict import Event
from klsweep.verl.metrics import VAL_SCORE_PATTERNS


def source_of(key: str) -> str:
    """The validation data source a key scores: ``val-core/openai/gsm8k/reward/mean@1`` → ``openai/gsm8k``;
    ``val/test_score/openai/gsm8k`` → ``openai/gsm8k``."""
    for prefix in ("val-core/", "val/test_score/", "test_score/"):
        if key.startswith(prefix):
            rest = key[len(prefix):]
            return rest.rsplit("/", 2)[0] if prefix == "val-core/" and rest.count("/") >= 2 else rest
    return key


def validation_sets(metrics: Mapping[str, Any], choice: str | None = None) -> dict[str, float]:
    """``{key: value}``: one validation score per data source in this report (the first key by name of the first
    pattern of :data:`klsweep.verl.metrics.VAL_SCORE_PATTERNS` that matches), or only ``choice`` when given.

    Values may be NaN or ±inf; absent or non-numeric values are left out."""
    if choice is not None:
        value = number(metrics.get(choice))
        return {} if value is None else {choice: value}
    out: dict[str, float] = {}
    for pattern in VAL_SCORE_PATTERNS:
        hits = sorted(k for k in metrics if pattern.match(k))
        if not hits:
            continue
        for key in hits:
            value = number(metrics[key])
            if value is not None and source_of(key) not in {source_of(k) for k in out}:
                out[key] = value
        break
    return out


def combine(rule_action: str, fired: Mapping[str, Event], reporting: Sequence[str],
            others: Mapping[str, tuple[float, float]]) -> Event | None:
    """One finding from the per-set findings of one rule at one report.

    Args:
        rule_action: the rule's action.
        fired: validation key → the rule's finding on that set at this report.
        reporting: the keys with a value at this report.
        others: key → (this report's value, the set's best so far), for the sets that did not fire.

    Returns:
        None when no set fired; the rule's action when every reporting set fired; else ``warn`` in place of
        ``stop`` (a single-set dip), its message naming what the other sets did.
    """
    if not fired:
        return None
    first = next(iter(fired.values()))
    values = {k: v for e in fired.values() for k, v in e.values.items()}
    message = "; ".join(e.message for e in fired.values())
    action = rule_action
    quiet = [k for k in reporting if k not in fired]
    if quiet:
        action = "warn" if rule_action == "stop" else rule_action
        said = []
        for key in quiet:
            value, best = others[key]
            drop = (best - value) / best if best > 0 and math.isfinite(best) else 0.0
            said.append(f"{key} = {value:.4g}, {drop:.0%} below its best {best:.4g}")
        message += (f"; only {len(fired)} of {len(fired) + len(quiet)} validation sets: {'; '.join(said)} "
                    "(a dip the other sets do not share: a warning, not a stop)")
    return Event(rule=first.rule, kind=first.kind, step=first.step, values=values, advice=first.advice,
                 message=message, action=action)
