"""A synthetic sweep directory built with the real libraries: an Optuna study in sqlite (trials with the user
attributes :class:`klsweep.orchestrate.searcher.KlsweepSearch` writes) and one Ray Tune ``result.json`` per trial.

Layout and names are the ones ``sweep run`` writes (``sweep.json``, ``study.db``, ``tune/<trial dir>/result.json``),
so :mod:`klsweep.analysis` reads it exactly as it reads a real sweep.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest

KL_COEF = "actor_rollout_ref.actor.kl_loss_coef"
KL_TYPE = "actor_rollout_ref.actor.kl_loss_type"
AGG = "actor_rollout_ref.actor.loss_agg_mode"
OBJECTIVES = [{"metric": "critic/score/mean", "mode": "max"}, {"metric": "actor/kl_loss", "mode": "min"}]
DISTRIBUTIONS = {
    KL_COEF: optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
    KL_TYPE: optuna.distributions.CategoricalDistribution(["low_var_kl", "kl", "k2", "abs", "mse", "low_var_kl+"]),
    AGG: optuna.distributions.CategoricalDistribution(["token-mean", "seq-mean-token-sum-norm", "seq-mean-token-mean"]),
    "data.seed": optuna.distributions.IntDistribution(0, 9),
}
#: Fixed overrides of every trial, with the value kinds real sweeps store (lists, None).
FIXED = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.use_kl_loss": True,
         "actor_rollout_ref.actor.loss_scale_factor": None, "trainer.logger": ["console", "file"]}


def curve(params: dict[str, Any], step: int) -> dict[str, float]:
    """Metrics of a trial at ``step`` (1-based): KL grows as kl_coef shrinks, score grows with KL."""
    drift = 0.02 / math.sqrt(params[KL_COEF])
    kl = drift * step / 100
    return {
        "actor/kl_loss": kl,
        "actor/entropy": 1.0 / (1.0 + kl * step),
        "critic/score/mean": 1.0 - math.exp(-kl * 3),
        "actor/pg_loss": -0.01 * step,
    }


def trial_spec(i: int, max_steps: int) -> dict[str, Any]:
    """Trial ``i`` of a generated sweep: every 4th trial stopped by a health rule at step max_steps // 2."""
    params = {KL_COEF: 10 ** (-4 + 3 * ((i * 7) % 13) / 12), KL_TYPE: ("low_var_kl", "kl", "k2")[i % 3],
              AGG: ("token-mean", "seq-mean-token-sum-norm")[(i // 3) % 2]}
    stopped = i % 4 == 3
    return {"params": params, "steps": max_steps // 2 if stopped else max_steps,
            "health": "stopped" if stopped else "healthy",
            "stop_reason": "kl_blowup: ref_kl > 0.5 for 3 reports" if stopped else ""}


def make_sweep(root: Path, trials: int | list[dict[str, Any]], *, max_steps: int = 10, gpu: float = 1.0,
               health: str = "conservative", objectives: list[dict[str, str]] = OBJECTIVES,
               step_seconds: float = 2.0) -> Path:
    """Write a sweep directory under ``root``; returns it.

    Each trial spec: ``params`` (verl overrides searched), ``steps``, ``health``, ``stop_reason``, optional
    ``state`` (default COMPLETE), ``metrics`` (a function of (params, step) → dict; default :func:`curve`) and
    ``remedies`` (the schedule :class:`klsweep.orchestrate.remedy_tune.RemedyScheduler` records, a list of dicts) and
    ``confirm_of`` (a confirmation re-run of that trial number, with ``params["data.seed"]`` its seed).
    Trials' told values are their last reported objectives (what KlsweepSearch tells Optuna); PRUNED/FAIL get none,
    unless ``told`` (a one-objective PRUNED trial: Optuna keeps its last intermediate value, as it does for a remedied
    trial's).
    """
    specs = [trial_spec(i, max_steps) for i in range(trials)] if isinstance(trials, int) else trials
    root.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{root / 'study.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=root.name, storage=storage,
                                directions=[o["mode"] + "imize" for o in objectives])
    frozen = []
    for i, spec in enumerate(specs):
        trial_id = f"t{i:05d}"
        metrics_of = spec.get("metrics", curve)
        rows = []
        for step in range(1, spec["steps"] + 1):
            row = {**metrics_of(spec["params"], step), "training_iteration": step,
                   "time_total_s": step * step_seconds, "trial_id": trial_id, "health": "healthy", "stop_reason": ""}
            rows.append(row)
        rows[-1].update(health=spec["health"], stop_reason=spec["stop_reason"])
        trial_dir = root / "tune" / f"trainable_{trial_id}_{i}"
        trial_dir.mkdir(parents=True)
        (trial_dir / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        state = optuna.trial.TrialState[spec.get("state", "COMPLETE")]
        told = state == optuna.trial.TrialState.COMPLETE or spec.get("told", False)
        values = [rows[-1][o["metric"]] for o in objectives] if told else None
        frozen.append(optuna.trial.create_trial(
            state=state, values=values, params=spec["params"],
            distributions={k: DISTRIBUTIONS[k] for k in spec["params"]},
            user_attrs={"ray_trial_id": trial_id, "health": spec["health"], "stop_reason": spec["stop_reason"],
                        "steps": spec["steps"], "constraint": 1.0 if spec["health"] == "stopped" else -1.0,
                        "verl_overrides": json.dumps({**FIXED, **spec["params"]}),
                        **({"remedies": json.dumps(spec["remedies"])} if spec.get("remedies") else {}),
                        **({"confirm_of": spec["confirm_of"], "confirm_seed": spec["params"]["data.seed"]}
                           if "confirm_of" in spec else {})},
        ))
    study.add_trials(frozen)
    sweep = {"name": root.name, "algorithm": "grpo", "trainer": "embedded", "overrides": FIXED,
             "objective": objectives, "health": {"preset": health, "rules": [], "builtin": {}},
             "budget": {"trials": len(specs), "max_concurrent": 2, "max_steps": max_steps,
                        "resources": {"cpu": 1.0, "gpu": gpu}}}
    info = {"name": root.name, "sweep_file": str(root / "sweep.yaml"), "study_name": root.name, "storage": storage,
            "objectives": objectives, "sweep": sweep, "overrides": []}
    (root / "sweep.json").write_text(json.dumps(info, indent=2))
    return root


#: A validation score of the Gao RL law (Gao et al. 2022, eq. 2) with alpha 1, beta 0.5 over a reference of 0.2:
#: peak at d* = exp(alpha / beta - 1) = e, KL* = e**2 = 7.389 nats/sequence, peak score 0.2 + 0.5 e = 1.559. A score
#: above 1 is no accuracy (verl's ``acc`` is 0/1 correctness, its means lie in [0, 1] and the frontier clips them
#: there), so it is logged as verl's validation ``reward``, the reward function's own scale (the core metric of a
#: data source whose reward function returns no ``acc``, ``_val_metrics_update`` in verl/trainer/ppo/ray_trainer.py).
VAL = "val-core/gsm8k/reward/mean@1"
GAO_ALPHA, GAO_BETA, GAO_REFERENCE, RESPONSE_TOKENS = 1.0, 0.5, 0.2, 100.0
FRONTIER_OBJECTIVES = [{"metric": VAL, "mode": "max"}, {"metric": "actor/kl_loss", "mode": "min"}]


def gao_metrics(final_kl_seq: float, max_steps: int, score=None, metric: str = VAL):
    """Metrics of a trial whose per-sequence KL grows linearly from 0 (step 1) to ``final_kl_seq`` (last step),
    logged per token as verl does (``actor/kl_loss`` = KL_seq / ``response_length/mean``), its validation score on
    the Gao RL law above (or ``score`` at the last step: a trial off the law), logged as ``metric``."""

    def metrics(params: dict[str, Any], step: int) -> dict[str, float]:
        kl_seq = final_kl_seq * (step - 1) / (max_steps - 1)
        d = math.sqrt(kl_seq)
        val = GAO_REFERENCE + (d * (GAO_ALPHA - GAO_BETA * math.log(d)) if d > 0 else 0.0)
        if score is not None and step == max_steps:
            val = score
        return {"actor/kl_loss": kl_seq / RESPONSE_TOKENS, "response_length/mean": RESPONSE_TOKENS, metric: val,
                "actor/entropy": 1.0, "critic/score/mean": 0.5}

    return metrics


def frontier_specs(final_kls, max_steps: int = 5, *, stopped: dict[int, float] | None = None, seeds=None,
                   metric: str = VAL):
    """Trial specs of a KL sweep with one estimator (low_var_kl, token-mean) whose trial ``i`` ends at per-sequence
    KL ``final_kls[i]``; ``stopped``: trial index → its last score, stopped by a health rule (off the law);
    ``seeds``: trial index → ``data.seed``; ``metric``: the validation score's name."""
    stopped, seeds = stopped or {}, seeds or {}
    specs = []
    for i, kl in enumerate(final_kls):
        params = {KL_COEF: 10 ** (-3 + i % 3), KL_TYPE: "low_var_kl", AGG: "token-mean"}
        if i in seeds:
            params["data.seed"] = seeds[i]
        specs.append({"params": params, "steps": max_steps, "health": "stopped" if i in stopped else "healthy",
                      "stop_reason": "kl_runaway: actor/kl_loss > 0.5" if i in stopped else "",
                      "metrics": gao_metrics(kl, max_steps, stopped.get(i), metric)})
    return specs


@pytest.fixture
def synthetic_sweep(tmp_path):
    """Factory: ``synthetic_sweep(n_trials or specs, **make_sweep options)`` → a sweep directory in tmp_path."""

    def make(trials: int | list[dict[str, Any]] = 8, name: str = "synthetic", **kwargs) -> Path:
        return make_sweep(tmp_path / name, trials, **kwargs)

    return make
