"""The reference policy's score: where every trial of a sweep starts, and what the KL term pulls it back towards.

A validation objective above it means training helped. Below it, the policy learned to please the training reward
at the expense of the task: the embedded task's proxy-up, gold-down signature (klsweep.trainers.embedded.task).

For the embedded trainer, the reference policy is the warmed-up model every trial starts from
(klsweep.trainers.embedded.reference). Its validation score is that of any trial at step 0, as verl's
``trainer.val_before_train`` logs it. A verl trial's step-0 validation reaches Tune merged into its step-1 result
(klsweep.launchers.process). There it cannot be told from a step-1 validation, so verl sweeps get no baseline here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep.analysis.sweep_dir import overrides_of
from klsweep.errors import KlsweepError
from klsweep.results import REFERENCE_FILE
from klsweep.trainers import trainer_kind
from klsweep.trainers.embedded.config import VAL_METRIC as EMBEDDED_VAL_METRIC  # no torch: config only

if TYPE_CHECKING:
    import pandas as pd


def reference_scores(trainer: str, metrics: Sequence[str], df: pd.DataFrame,
                     cache_dir: str | Path | None = None) -> dict[str, float]:
    """``{metric: the reference policy's value}`` for those of ``metrics`` the reference policy can be scored on.

    That is the embedded trainer's validation accuracy (``val-core/arith/acc/mean@1``).
    It is computed under the validation settings of the sweep's first trial (its ``data.max_response_length``).
    Empty for other trainers and metrics, a sweep without trials, or overrides that no longer build a trainer.

    Args:
        trainer: the sweep's ``trainer:``.
        metrics: the sweep's objective metrics.
        df: :func:`klsweep.analysis.sweep_dir.load` of the sweep (its first row's ``config/`` overrides are used).
        cache_dir: the sweep directory: the score is kept in its ``reference_scores.json`` with the overrides it was
            computed under, so ``sweep status`` and ``sweep report`` build the reference policy once per sweep
            (seconds), not once per call.
    """
    if not trainer_kind(trainer).scores_reference or EMBEDDED_VAL_METRIC not in metrics or df.empty:
        return {}
    overrides = overrides_of(df.iloc[0])
    key = json.dumps(overrides, sort_keys=True, default=str)
    cache = Path(cache_dir, REFERENCE_FILE) if cache_dir is not None else None
    if cache is not None and cache.is_file():
        try:
            saved = json.loads(cache.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("overrides") == key and EMBEDDED_VAL_METRIC in saved.get("scores", {}):
            return {EMBEDDED_VAL_METRIC: float(saved["scores"][EMBEDDED_VAL_METRIC])}
    from klsweep.trainers.embedded.trainer import EmbeddedTrainer

    try:
        reference = EmbeddedTrainer(overrides, allow_negative_kl=True)
    except KlsweepError:
        return {}
    scores = {EMBEDDED_VAL_METRIC: reference.validate()[EMBEDDED_VAL_METRIC]}
    if cache is not None:
        try:
            tmp = cache.with_name(cache.name + ".tmp")
            tmp.write_text(json.dumps({"overrides": key, "scores": scores}))
            os.replace(tmp, cache)
        except OSError:  # a read-only copy of a sweep: computed again next time
            pass
    return scores
