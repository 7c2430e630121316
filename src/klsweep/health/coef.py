"""``builtin.kl_coef_jump``: the logged KL coefficient moved further between two reports than verl can move it.

verl's adaptive controller (``trainer/ppo/core_algos.py::AdaptiveKLController.update``, called once per step by
``ray_trainer.py::apply_kl_penalty`` with ``n_steps`` = the step's sequences) multiplies the coefficient by
``1 + clip(kl / target − 1, −0.2, 0.2) · n_steps / horizon``: at most a factor ``m = 1 + 0.2 · n / horizon`` per step
(n = ``data.train_batch_size × rollout.n``; verl 0.9.1 defaults 1024 × 1 and ``algorithm.kl_ctrl.horizon`` 10000:
m = 1.0205). The fixed controller never moves it; the KL-loss coefficient (``actor/kl_coef``) is a constant. A larger
move over g steps than m^g (with the console logger's rounding to 3 decimals allowed for) is not the controller: a
resume from another run's checkpoint, a log that joins two runs, or a run of an older verl. The finding is advice:
it is noted in the verdict and never stops a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from klsweep.health.signals import number
from klsweep.health.verdict import Event

#: The largest proportional error the adaptive controller applies (``np.clip(current_kl / target - 1, -0.2, 0.2)``).
MAX_ERROR = 0.2
#: verl 0.9.1 defaults of the keys that size the controller's step (``_generated_ppo_trainer.yaml``).
_DEFAULTS = {"data.train_batch_size": 1024, "actor_rollout_ref.rollout.n": 1, "algorithm.kl_ctrl.horizon": 10000}
#: Half the last digit of verl's console logger (3 decimals).
_ROUNDING = 5e-4


def max_step_factor(run_config: Mapping[str, Any] | None) -> float:
    """``1 + 0.2 · n / horizon``: the most the adaptive controller multiplies the coefficient by in one step."""
    config = {**_DEFAULTS, **(run_config or {})}
    n = (number(config["data.train_batch_size"]) or 0.0) * (number(config["actor_rollout_ref.rollout.n"]) or 1.0)
    horizon = number(config["algorithm.kl_ctrl.horizon"]) or 0.0
    return 1 + MAX_ERROR * n / horizon if horizon > 0 and n > 0 else math.inf


class KlCoefJump:
    """Notes each jump of the logged KL coefficient (``values["kl_coef"]``) beyond what verl's controller can do.

    Args:
        run_config: the trial's flat verl overrides (missing keys: verl 0.9.1's defaults).
        rounded: the log printed 3 decimals: a move within the rounding is no jump.
    """

    name = "builtin.kl_coef_jump"
    action = "advise"

    def __init__(self, run_config: Mapping[str, Any] | None, rounded: bool = False):
        self.factor = max_step_factor(run_config)
        self.slack = _ROUNDING if rounded else 0.0
        self.last: tuple[int, str, float] | None = None  # (step, verl key, value) of the last logged coefficient

    def check(
        self, step: int, metrics: Mapping[str, Any], values: Mapping[str, tuple[str, float] | None]
    ) -> Event | None:
        """The finding at ``step``, or None."""
        hit = values.get("kl_coef")
        if hit is None or hit[0].startswith("config:") or not math.isfinite(hit[1]) or hit[1] <= 0:
            return None
        key, value = hit
        last, self.last = self.last, (step, key, value)
        if last is None or step <= last[0] or key != last[1]:
            return None
        try:  # a factor > 1 over a long gap between logged steps can exceed a float: no move is then a jump
            bound = self.factor ** (step - last[0]) if math.isfinite(self.factor) else math.inf
        except OverflowError:
            bound = math.inf
        before = last[2]
        slack = self.slack  # a printed value stands for any value within half its last digit
        if (before - slack) / bound <= value + slack and value - slack <= (before + slack) * bound:
            return None
        return Event(
            rule=self.name,
            kind="misconfigured",
            step=step,
            values={f"{key} before": before, key: value},
            advice="check that the run resumed from its own checkpoint with its own KL settings",
            message=(
                f"{key} jumped {before:g} → {value:g} (×{value / before:.2f}) between steps {last[0]} and {step}; "
                f"verl's adaptive controller moves it by at most ×{bound:.3g} over {step - last[0]} step(s): a resume "
                "from another run's checkpoint, two runs in one log, or an older verl"
            ),
            action=self.action,
        )
