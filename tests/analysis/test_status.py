"""`sweep status` from the moment `sweep run` wrote sweep.json: before the study exists, with only running trials;
each trial's parameters and, for a running trial, its last step, KL, entropy and score; and output to a pipe that
keeps every command and table row on one line."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys

import optuna

from klsweep.cli import main
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import started_sweep_dir, sweep_file


def _started(tmp_path):
    """A results directory as `sweep run` leaves it before its first trial: sweep.json only."""
    path = sweep_file(tmp_path, budget={"trials": 3})
    return started_sweep_dir(tmp_path, path), load_sweep(path)


def test_status_before_the_study_exists_and_with_only_running_trials(tmp_path, capsys):
    out, sweep = _started(tmp_path)
    assert main(["status", str(out)]) == 0
    printed = capsys.readouterr()
    assert "tiny: 0 finished, 0 running (or interrupted), 3 not started" in printed.out
    assert "no trial has finished yet" in printed.out and "Traceback" not in printed.err
    assert main(["report", str(out)]) == 2  # nothing to report yet, said in one line
    assert "the study 'tiny' holds no trial yet; nothing to report" in capsys.readouterr().err

    study = optuna.create_study(study_name=sweep.name, storage=f"sqlite:///{out / 'study.db'}", direction="maximize")
    study.ask().suggest_float("x", 0, 1)  # the first trial, running
    assert main(["status", str(out)]) == 0
    printed = capsys.readouterr()
    assert "tiny: 0 finished, 1 running (or interrupted), 2 not started" in printed.out
    assert "no trial has finished yet" in printed.out and "Traceback" not in printed.err


KL_KEY = "algorithm.kl_ctrl.kl_coef"  # kl_coef of a PPO sweep with KL in the reward
REASON = ("diverged at step 2 by beta_high: actor/reward_kl_penalty_coeff = 0.05 (actor/reward_kl_penalty_coeff > "
          "0.01 after step 1) (advice: lower kl_coef)")


def _mid_sweep(tmp_path):
    """A sweep directory mid-run, as Optuna and Tune leave it: trial 0 stopped by a health rule at step 2, trial 1
    running at step 3 with its Tune result file (verl's metric names) as Tune's last save left it."""
    deep = tmp_path / ("d" * 60)  # a long path: longer than 80 columns with the command around it
    deep.mkdir()
    out, sweep = _started(deep)
    study = optuna.create_study(study_name=sweep.name, storage=f"sqlite:///{out / 'study.db'}", direction="maximize")
    stopped = study.ask({KL_KEY: optuna.distributions.FloatDistribution(0.0005, 0.1, log=True)})
    stopped.set_user_attr("stop_reason", REASON)
    stopped.set_user_attr("health", "stopped")
    stopped.set_user_attr("steps", 2)
    study.tell(stopped, state=optuna.trial.TrialState.PRUNED)
    study.enqueue_trial({KL_KEY: 0.002})
    running = study.ask({KL_KEY: optuna.distributions.FloatDistribution(0.0005, 0.1, log=True)})
    running.set_user_attr("ray_trial_id", "abc12345")
    trial_dir = out / "tune" / "run_trial_abc12345_2_kl=0.002"
    trial_dir.mkdir(parents=True)
    rows = [{"trial_id": "abc12345", "training_iteration": i, "step": i, "actor/reward_kl_penalty": kl,
             "actor/entropy": ent, "critic/score/mean": score}
            for i, kl, ent, score in ((1, 0.0, 1.5, 0.25), (2, 0.01234567, 1.25, 0.375), (3, 0.02345678, 1.125, 0.5))]
    (trial_dir / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_status_to_a_pipe_shows_parameters_and_running_trials_on_unwrapped_lines(tmp_path):
    out = _mid_sweep(tmp_path)
    run = subprocess.run([sys.executable, "-m", "klsweep.cli", "status", str(out)], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "COLUMNS"}, timeout=120)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    lines = [line.rstrip() for line in run.stdout.splitlines()]
    assert "tiny: 1 finished, 1 running (or interrupted), 1 not started (budget 3 trials × 4 steps)" in lines
    assert f"if its `sweep run` is no longer running, continue it with: sweep resume {out}" in lines
    # the trials table: the parameter by its verl leaf name, the running trial's last step, KL, entropy and score
    header = next(line for line in lines if line.startswith("trial"))
    assert [c.strip() for c in header.split("┃")][:7] == ["trial", "state", "kl_coef", "step", "KL", "entropy",
                                                          "score"]
    running = next(line for line in lines if line.startswith("1 "))
    assert [c.strip() for c in running.split("│")][:7] == ["1", "RUNNING", "0.002", "3", "0.02346", "1.125", "0.5"]
    # the stop table: the whole reason on the trial's one row
    assert any(line.split()[:5] == ["0", "│", "PRUNED", "│", "2"] and line.endswith(REASON) for line in lines)
    assert "no trial has completed healthy yet" in lines  # one trial still runs: not a failed sweep


def test_a_command_status_prints_for_a_path_with_a_space_is_one_a_shell_runs_as_it_is(tmp_path, capsys):
    (tmp_path / "my runs").mkdir()
    out = _mid_sweep(tmp_path / "my runs")
    assert main(["status", str(out)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "continue it with: " in line]
    assert shlex.split(line.split("continue it with: ", 1)[1]) == ["sweep", "resume", str(out)]


def test_status_forecasts_the_kl_frontier_once_four_trials_are_feasible(tmp_path, capsys):
    from tests.analysis.conftest import FRONTIER_OBJECTIVES, frontier_specs, make_sweep

    # trials on the Gao RL law alpha 1, beta 0.5 over 0.2 (tests/analysis/conftest.py): KL* = e**2 = 7.389
    # nats/sequence, peak 0.2 + 0.5 e = 1.559; trial 2 is stopped by a health rule and not counted
    three = make_sweep(tmp_path / "three", frontier_specs([1.0, 4.0, 9.0, 16.0], stopped={2: 3.0}),
                       objectives=FRONTIER_OBJECTIVES)
    assert main(["status", str(three)]) == 0
    assert "KL frontier" not in capsys.readouterr().out
    five = make_sweep(tmp_path / "five", frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 9.0], stopped={5: 3.0}),
                      objectives=FRONTIER_OBJECTIVES)
    assert main(["status", str(five)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("KL frontier (Gao RL form, 5 trials): KL* = 7.39 nats/sequence [7.39, 7.39] (80 %), peak score 1.56 "
            "[1.56, 1.56]") in lines
    # up to KL 4 nats/sequence only (d <= 2 < e): the forecast says its peak is extrapolated
    short = make_sweep(tmp_path / "short", frontier_specs([0.25, 1.0, 2.25, 4.0]), objectives=FRONTIER_OBJECTIVES)
    assert main(["status", str(short)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("KL frontier")]
    assert line.endswith("; ⚠ extrapolated: the peak lies beyond the largest KL reached (4 nats/sequence)")


def test_status_forecast_scores_d0_with_the_reference_policy_as_the_report_does(tmp_path, capsys):
    """An embedded sweep whose objective is the embedded task's validation accuracy: d = 0 is the reference policy's
    accuracy (the real embedded trainer, validated), not the median first logged score (0.2 here)."""
    from klsweep.analysis.baseline import reference_scores
    from klsweep.analysis.frontier_fit import fit_frontier
    from klsweep.analysis.sweep_dir import load
    from klsweep.trainers.embedded.config import VAL_METRIC
    from tests.analysis.conftest import frontier_specs, make_sweep

    kls = [1.0, 4.0, 9.0, 16.0, 25.0]
    run_dir = make_sweep(tmp_path / "embedded", frontier_specs(kls, metric=VAL_METRIC),
                         objectives=[{"metric": VAL_METRIC, "mode": "max"}])
    [reference] = reference_scores("embedded", [VAL_METRIC], load(run_dir)).values()
    assert 0.3 < reference < 1.0  # the warmed-up policy's accuracy, far from the trials' first score 0.2
    # the fit takes every step of each trial's path: its KL grows linearly from 0 to its final value over 5 steps
    path = [kl * s / 4 for kl in kls for s in range(5)]
    scores = [0.2 + (d * (1 - 0.5 * math.log(d)) if d else 0.0) for d in map(math.sqrt, path)]
    best = fit_frontier(path, scores, reference, trials=[kl for kl in kls for _ in range(5)], n_boot=10).best
    assert main(["status", str(run_dir)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("KL frontier")]
    assert line.startswith(f"KL frontier (Gao {'RL' if best.form == 'rl' else 'best-of-n'} form, 5 trials): "
                           f"KL* = {best.kl_star:.3g} nats/sequence")


def test_status_shows_each_remedied_trials_whole_schedule_beside_its_proposed_parameters(tmp_path):
    """Issue 17: a remedied trial ends "healthy"; its row says so and, in the remedies column, every restart (two
    here); its kl_coef cell shows the proposed value (the study's) and the one the last remedy set, a caption says
    which is which."""
    import io

    import pandas as pd
    from rich.console import Console

    from klsweep.analysis.status import trials_table

    key = "algorithm.kl_ctrl.kl_coef"
    first = {"restart": 1, "step": 43, "rule": "kl_runaway", "from_step": 28, "key": key, "old": 0.0023633,
             "new": 0.0035449}
    second = {"restart": 2, "step": 80, "rule": "reward_hacking", "from_step": 60, "key": key, "old": 0.004,
              "new": 0.006}
    df = pd.DataFrame([{"number": 0, "state": "COMPLETE", f"config/{key}": 0.002, "steps": 80, "health": "healthy",
                        "remedies": json.dumps([first, second])},
                       {"number": 1, "state": "COMPLETE", f"config/{key}": 0.05, "steps": 80, "health": "healthy"}])
    wide = Console(file=io.StringIO(), width=400)
    wide.print(trials_table(load_sweep(sweep_file(tmp_path)), df))
    header, _, remedied, plain = [line.rstrip() for line in wide.file.getvalue().splitlines()[:4]]
    assert [c.strip() for c in header.split("┃")][-2:] == ["health", "remedies"]
    assert [c.strip() for c in remedied.split("│")][:3] == ["0", "COMPLETE", "0.002→0.006"]
    assert [c.strip() for c in plain.split("│")][:3] == ["1", "COMPLETE", "0.05"]
    assert "a→b: a, the value the search proposed; b, the one the trial's last remedy restarted it with" in \
        wide.file.getvalue()
    assert [c.strip() for c in remedied.split("│")][-2:] == [
        "healthy", "2× kl_runaway@43 from 28 kl_coef 0.002363→0.003545; reward_hacking@80 from 60 kl_coef 0.004→0.006"]
    assert [c.strip() for c in plain.split("│")][-2:] == ["healthy", ""]
    # no trial remedied: no remedies column
    header = Console(file=io.StringIO(), width=400)
    header.print(trials_table(load_sweep(sweep_file(tmp_path)), df.drop(columns="remedies")))
    assert "remedies" not in header.file.getvalue() and "→" not in header.file.getvalue()


def test_status_marks_kl_and_entropy_measured_on_another_scale():
    """grpo_kl searches loss_agg_mode: under seq-mean-token-sum verl's actor/kl_loss and actor/entropy are sums over
    a sequence's tokens (agg_loss), 267.4 and 771.8 beside per-token 0.0123 and 1.25, and were shown unmarked. The
    rows on another scale than most are marked and the caption names both scales; KL of the k1 row is on a third
    scale (another estimator) while its entropy, aggregated by token-mean, is not marked. The most common scale is the
    unmarked one."""
    import io

    import pandas as pd
    from rich.console import Console

    from klsweep.analysis.status import trials_table

    sweep = load_sweep("sweeps/grpo_kl.yaml")
    agg, kl_type = "config/actor_rollout_ref.actor.loss_agg_mode", "config/actor_rollout_ref.actor.kl_loss_type"
    df = pd.DataFrame({"number": [0, 1, 2, 3, 4, 5], "state": ["COMPLETE"] * 6,
                       "config/actor_rollout_ref.actor.kl_loss_coef": [0.001, 0.002, 0.003, 0.004, 0.005, 0.006],
                       kl_type: ["low_var_kl", "low_var_kl", "low_var_kl", "kl", "low_var_kl", "low_var_kl"],
                       agg: ["token-mean", "seq-mean-token-sum", "token-mean", "token-mean", "seq-mean-token-sum",
                             "token-mean"],
                       "steps": [80] * 6, "last/ref_kl": [0.0123, 267.4, 0.0125, 0.0131, 301.0, 0.0119],
                       "last/entropy": [1.25, 771.8, 1.5, 1.0, 802.0, 1.125], "last/score": [0.5] * 6,
                       "kl_metric": ["actor/kl_loss"] * 6, "health": ["healthy"] * 6})
    console = Console(file=io.StringIO(), width=400)
    console.print(trials_table(sweep, df))
    lines = console.file.getvalue().splitlines()
    rows = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")] for line in lines if "│" in line}
    assert [rows[n][6:8] for n in "012345"] == [["0.0123", "1.25"], ["267.4†", "771.8†"], ["0.0125", "1.5"],
                                                ["0.0131‡", "1"], ["301†", "802†"], ["0.0119", "1.125"]]
    caption = " ".join(" ".join(line for line in lines if not set("│┃━") & set(line)).split())
    assert caption == ("KL on different scales, not comparable across them: unmarked actor/kl_loss (low_var_kl, "
                       "token-mean); KL†: actor/kl_loss (low_var_kl, seq-mean-token-sum); KL‡: actor/kl_loss "
                       "(kl, token-mean) entropy on different scales, not comparable across them: unmarked "
                       "loss_agg_mode token-mean; entropy†: loss_agg_mode seq-mean-token-sum")


def test_token_mean_and_seq_mean_token_mean_are_one_scale():
    """verl's token-mean and seq-mean-token-mean are both per-token means (core_algos.agg_loss), as `sweep validate`
    says: `sweep status` marks neither the KL nor the entropy of one against the other; seq-mean-token-sum is marked."""
    import io

    import pandas as pd
    from rich.console import Console

    from klsweep.analysis.status import trials_table

    sweep = load_sweep("sweeps/grpo_kl.yaml")
    agg = "config/actor_rollout_ref.actor.loss_agg_mode"
    df = pd.DataFrame({"number": [0, 1, 2], "state": ["COMPLETE"] * 3,
                       agg: ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"],
                       "config/actor_rollout_ref.actor.kl_loss_type": ["low_var_kl"] * 3,
                       "steps": [80] * 3, "last/ref_kl": [0.0123, 0.0125, 267.4], "last/entropy": [1.25, 1.5, 771.8],
                       "last/score": [0.5] * 3, "kl_metric": ["actor/kl_loss"] * 3, "health": ["healthy"] * 3})
    console = Console(file=io.StringIO(), width=400)
    console.print(trials_table(sweep, df))
    lines = console.file.getvalue().splitlines()
    rows = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")] for line in lines if "│" in line}
    assert [rows[n][-5:-3] for n in "012"] == [["0.0123", "1.25"], ["0.0125", "1.5"], ["267.4†", "771.8†"]]
    caption = " ".join(" ".join(line for line in lines if not set("│┃━") & set(line)).split())
    assert "unmarked actor/kl_loss (low_var_kl, token-mean); KL†: actor/kl_loss (low_var_kl, seq-mean-token-sum)" \
        in caption and "seq-mean-token-mean" not in caption


def test_kl_and_entropy_leave_the_same_rows_unmarked_when_scales_are_as_common():
    """One trial per scale: the KL column marked the token-mean trial (its scale "(low_var_kl, token-mean)" sorted
    after "(kl, token-sum)") and the entropy column the token-sum one. As common, the per-token mean is the unmarked
    scale in both columns."""
    import io

    import pandas as pd
    from rich.console import Console

    from klsweep.analysis.status import trials_table

    sweep = load_sweep("sweeps/grpo_kl.yaml")
    agg = "config/actor_rollout_ref.actor.loss_agg_mode"
    df = pd.DataFrame({"number": [0, 1], "state": ["COMPLETE"] * 2, agg: ["token-sum", "token-mean"],
                       "config/actor_rollout_ref.actor.kl_loss_type": ["kl", "low_var_kl"],
                       "steps": [80] * 2, "last/ref_kl": [267.4, 0.1918], "last/entropy": [771.8, 1.25],
                       "last/score": [0.5] * 2, "kl_metric": ["actor/kl_loss"] * 2, "health": ["healthy"] * 2})
    console = Console(file=io.StringIO(), width=400)
    console.print(trials_table(sweep, df))
    rows = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")]
            for line in console.file.getvalue().splitlines() if "│" in line}
    assert [rows[n][-5:-3] for n in "01"] == [["267.4†", "771.8†"], ["0.1918", "1.25"]]
