"""Every refusal of a sweep file a user can see, triggered through ``load_sweep`` (what ``sweep validate`` and ``sweep
run`` call), each asserted to name the file and line, the field, the value and the fix.

One row per message of ``spec/*checks.py`` (keys, `when` conditions, seed trials, GRPO's group size, inert knobs of
``verl/liveness.py``), ``spec/schema.py`` (parameter and top-level validators) and ``spec/load.py`` (YAML and
command-line overrides). The inert-knob rows follow verl 0.9.1's source: ``algorithm.gamma``/``lam`` are read only by
``core_algos.compute_gae_advantage_return``, ``norm_adv_by_std_in_grpo`` only by ``compute_grpo_outcome_advantage``,
``critic.*`` only when ``adv_estimator`` is gae, ``loss_scale_factor`` only by ``agg_loss`` under
``seq-mean-token-sum-norm``."""

from __future__ import annotations

import pytest

from klsweep.cli import main
from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep

#: id → (algorithm, sweep-file text after the 3-line header, line of the problem, field path, parts of the message).
#: The header is ``name``, ``algorithm``, ``objective``: the body's first line is line 4.
REFUSALS = {
    "two parameters name one verl key": (
        "grpo", "parameters:\n  kl_coef: {values: [0.01]}\n  actor_rollout_ref.actor.kl_loss_coef: {values: [0.02]}\n",
        6, "parameters.actor_rollout_ref.actor.kl_loss_coef",
        ["names the same verl key actor_rollout_ref.actor.kl_loss_coef as parameter 'kl_coef'", "keep one"]),
    "a key both fixed and searched": (
        "grpo", "overrides:\n  actor_rollout_ref.actor.entropy_coeff: 0.0\nparameters:\n"
                "  entropy_coeff: {values: [0.0, 0.001]}\n",
        7, "parameters.entropy_coeff",
        ["actor_rollout_ref.actor.entropy_coeff is both fixed in overrides and searched", "remove one"]),
    "when names a parameter defined later": (
        "grpo", "parameters:\n  kl_coef: {values: [0.01], when: {loss_agg_mode: token-mean}}\n"
                "  loss_agg_mode: {values: [token-mean, seq-mean-token-mean]}\n",
        5, "parameters.kl_coef.when.loss_agg_mode",
        ["loss_agg_mode is a parameter defined after this one", "move this parameter below it"]),
    "when names a key neither searched nor fixed": (
        "grpo", "parameters:\n  kl_coef: {values: [0.01], when: {actor_rollout_ref.actor.optim.weight_decay: 0.1}}\n",
        5, "parameters.kl_coef.when.actor_rollout_ref.actor.optim.weight_decay",
        ["actor_rollout_ref.actor.optim.weight_decay is neither a parameter defined earlier nor fixed",
         "set it in overrides or define it as a parameter above"]),
    "when asks for a value the earlier parameter never takes": (
        "grpo", "parameters:\n  loss_agg_mode: {values: [token-mean, seq-mean-token-mean]}\n"
                "  kl_coef: {values: [0.01], when: {loss_agg_mode: token-sum}}\n",
        6, "parameters.kl_coef.when.loss_agg_mode",
        ["condition loss_agg_mode in ['token-sum'] never holds",
         "parameter 'loss_agg_mode' takes ['token-mean', 'seq-mean-token-mean']"]),
    "when asks for a value the fixed key never has": (
        "grpo", "overrides:\n  actor_rollout_ref.actor.loss_agg_mode: token-mean\nparameters:\n"
                "  kl_coef: {values: [0.01], when: {loss_agg_mode: seq-mean-token-mean}}\n",
        7, "parameters.kl_coef.when.loss_agg_mode",
        ["condition loss_agg_mode in ['seq-mean-token-mean'] never holds",
         "actor_rollout_ref.actor.loss_agg_mode is fixed to 'token-mean'", "Fix the value or search the key"]),
    "when names an alias with no key under kl_placement none": (
        "grpo", "kl_placement: none\nparameters:\n  entropy_coeff: {values: [0.0, 0.01], when: {kl_coef: 0.01}}\n",
        6, "parameters.entropy_coeff.when.kl_coef",
        ["alias 'kl_coef' has no effect with kl_placement none", "set kl_placement: loss or reward"]),
    "seed trial names no parameter": (
        "grpo", "parameters:\n  kl_coef: {values: [0.01, 0.02]}\nseed_trials:\n  - {kl_coeff: 0.01}\n",
        7, "seed_trials.0.kl_coeff",
        ["kl_coeff is not a parameter of this sweep", "did you mean 'kl_coef'?", "Parameters: kl_coef"]),
    "seed trial outside the range": (
        "grpo", "parameters:\n  kl_coef: {distribution: log_uniform_values, min: 0.001, max: 0.01}\n"
                "seed_trials:\n  - {kl_coef: 0.5}\n",
        7, "seed_trials.0.kl_coef", ["0.5 is outside the parameter's range [0.001, 0.01]", "widen the range"]),
    "seed trial gives a word for a range": (
        "grpo", "parameters:\n  kl_coef: {distribution: log_uniform_values, min: 0.001, max: 0.01}\n"
                "seed_trials:\n  - {kl_coef: high}\n",
        7, "seed_trials.0.kl_coef", ["'high' is not a number but the parameter is a range [0.001, 0.01]",
                                     "give a number in the range"]),
    "seed trial not among the values": (
        "grpo", "parameters:\n  kl_coef: {values: [0.01, 0.02]}\nseed_trials:\n  - {kl_coef: 0.03}\n",
        7, "seed_trials.0.kl_coef", ["0.03 is not one of the parameter's values [0.01, 0.02]", "add it to values"]),
    "seed trial differs from a constant": (
        "grpo", "parameters:\n  kl_coef: {value: 0.01}\nseed_trials:\n  - {kl_coef: 0.03}\n",
        7, "seed_trials.0.kl_coef", ["0.03 differs from the parameter's constant value 0.01",
                                  "set it to 0.01 or drop it"]),
    "seed trial names an alias with no key under kl_placement none": (
        "grpo", "kl_placement: none\nparameters:\n  entropy_coeff: {values: [0.0, 0.01]}\n"
                "seed_trials:\n  - {kl_coef: 0.01}\n",
        8, "seed_trials.0.kl_coef", ["alias 'kl_coef' has no effect with kl_placement none",
                                     "set kl_placement: loss or reward, or remove 'kl_coef'"]),
    "seed trial value that is a list": (
        "grpo", "parameters:\n  entropy_coeff: {values: [0.0, 0.01]}\nseed_trials:\n  - {entropy_coeff: [1, 2]}\n",
        7, "seed_trials.0.entropy_coeff", ["must be a number, a string, true/false or null, not a list"]),
    "more seed trials than trials": (
        "grpo", "budget: {trials: 1}\nparameters:\n  kl_coef: {values: [0.01, 0.02]}\n"
                "seed_trials:\n  - {kl_coef: 0.01}\n  - {kl_coef: 0.02}\n",
        1, "(top level)", ["seed_trials has 2 entries but budget.trials is 1", "raise budget.trials or drop seed"]),
    "GRPO with rollout.n 1": (
        "grpo", "overrides:\n  actor_rollout_ref.rollout.n: 1\n",
        5, "overrides.actor_rollout_ref.rollout.n",
        ["actor_rollout_ref.rollout.n=1", "a group of 1 has no baseline", "Use rollout.n >= 2"]),
    "an alias in overrides": (
        "grpo", "overrides:\n  kl_coef: 0.01\n", 5, "overrides.kl_coef",
        ["'kl_coef' is an alias, which only `parameters` and `when` take",
         "write 'actor_rollout_ref.actor.kl_loss_coef'"]),
    "an alias searched under kl_placement none": (
        "grpo", "kl_placement: none\nparameters:\n  kl_coef: {values: [0.01, 0.02]}\n", 6, "parameters.kl_coef",
        ["alias 'kl_coef' has no effect with kl_placement none", "set kl_placement: loss or reward"]),
    "a key owned by another field": (
        "grpo", "overrides:\n  algorithm.adv_estimator: gae\n", 5, "overrides.algorithm.adv_estimator",
        ["algorithm.adv_estimator is set by the sweep file's `algorithm` field", "set that field instead"]),
    "a negative KL coefficient in overrides": (
        "grpo", "overrides:\n  actor_rollout_ref.actor.kl_loss_coef: -0.1\n",
        5, "overrides.actor_rollout_ref.actor.kl_loss_coef",
        ["actor_rollout_ref.actor.kl_loss_coef=-0.1", "rewards moving away from the reference policy",
         "set allow_negative_kl: true"]),
    "gamma searched under GRPO": (
        "grpo", "parameters:\n  algorithm.gamma: {values: [0.99, 1.0]}\n", 5, "parameters.algorithm.gamma",
        ["algorithm.gamma is searched but has no effect in any trial",
         "only the gae advantage estimator uses it, this sweep's is 'grpo'", "Remove the key"]),
    "lam fixed under GRPO": (
        "grpo", "overrides:\n  algorithm.lam: 0.9\n", 5, "overrides.algorithm.lam",
        ["algorithm.lam has no effect", "only the gae advantage estimator uses it, this sweep's is 'grpo'",
         "Remove the key"]),
    "norm_adv_by_std_in_grpo searched under PPO": (
        "ppo", "parameters:\n  algorithm.norm_adv_by_std_in_grpo: {values: [true, false]}\n",
        5, "parameters.algorithm.norm_adv_by_std_in_grpo",
        ["has no effect in any trial", "only the grpo advantage estimator uses it, this sweep's is 'gae'",
         "Remove the key"]),
    "a critic knob without a critic": (
        "grpo", "parameters:\n  critic.optim.lr: {values: [0.00001, 0.00002]}\n", 5, "parameters.critic.optim.lr",
        ["critic.optim.lr is searched but has no effect in any trial",
         "there is no critic: the advantage estimator is 'grpo'", "Remove the key"]),
    "loss_scale_factor under token-mean": (
        "grpo", "parameters:\n  actor_rollout_ref.actor.loss_scale_factor: {values: [512, 1024]}\n",
        5, "parameters.actor_rollout_ref.actor.loss_scale_factor",
        ["only loss_agg_mode seq-mean-token-sum-norm divides by it, this config's is 'token-mean'",
         "Remove the key or set that loss_agg_mode"]),
    "the KL-loss estimator searched with the KL in the reward": (
        "grpo", "kl_placement: reward\nparameters:\n  actor_rollout_ref.actor.kl_loss_type: {values: [k1, k3]}\n",
        6, "parameters.actor_rollout_ref.actor.kl_loss_type",
        ["the KL loss is off (actor_rollout_ref.actor.use_kl_loss=False)", "Set kl_placement: loss (or both)",
         "(the KL in the reward uses algorithm.kl_penalty)"]),
    "the in-reward controller type fixed with the KL in the loss": (
        "grpo", "overrides:\n  algorithm.kl_ctrl.type: adaptive\n", 5, "overrides.algorithm.kl_ctrl.type",
        ["algorithm.kl_ctrl.type has no effect: the KL penalty in the reward is off "
         "(algorithm.use_kl_in_reward=False)", "Set kl_placement: reward (or both), or remove the key"]),
    "a GPU count searched": (
        "grpo", "trainer: verl\nparameters:\n  trainer.n_gpus_per_node: {values: [1, 2]}\n",
        6, "parameters.trainer.n_gpus_per_node",
        ["trainer.n_gpus_per_node is searched", "the GPU count is a resource, not a hyperparameter",
         "Fix trainer.n_gpus_per_node in overrides and set budget.resources.gpu to match"]),
    "values that repeat": (
        "grpo", "parameters:\n  kl_coef: {values: [0.01, 0.01]}\n", 5, "parameters.kl_coef.values",
        ["values [0.01, 0.01] repeat an entry", "list each value once"]),
    "log_uniform_values from 0": (
        "grpo", "parameters:\n  kl_coef: {distribution: log_uniform_values, min: 0.0, max: 0.01}\n",
        5, "parameters.kl_coef", ["log_uniform_values needs min > 0 but got min=0.0", "e.g. min: 0.0001"]),
    "int_uniform with a fractional bound": (
        "grpo", "parameters:\n  actor_rollout_ref.actor.ppo_epochs: {distribution: int_uniform, min: 1.5, max: 4}\n",
        5, "parameters.actor_rollout_ref.actor.ppo_epochs", ["int_uniform needs integer bounds but got min=1.5"]),
    "q without q_uniform": (
        "grpo", "parameters:\n  kl_coef: {distribution: uniform, min: 0.001, max: 0.01, q: 0.001}\n",
        5, "parameters.kl_coef", ["q is only used by distribution q_uniform, not uniform", "remove q"]),
    "a number where a name goes": (  # YAML reads an unquoted 2024 as a number
        "grpo", "search_space: 2024\n", 4, "search_space",
        ["Input should be a valid string (got 2024)", 'Quote it to make it a string: search_space: "2024"']),
    "a mapping as an override value": (
        "grpo", "overrides:\n  actor_rollout_ref.actor.entropy_coeff: {a: 1}\n",
        5, "overrides.actor_rollout_ref.actor.entropy_coeff",
        ["not a mapping", "write each nested key as its own flat dotted key (a.b.c: value)"]),
}


@pytest.mark.parametrize(("algorithm", "body", "line", "field", "parts"), REFUSALS.values(), ids=REFUSALS)
def test_each_refusal_names_the_line_the_field_the_value_and_the_fix(sweep_file, algorithm, body, line, field,
                                                                     parts):
    path = sweep_file(body, algorithm=algorithm)
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    (problem,) = e.value.problems
    assert problem.startswith(f"{path}:{line}: {field}: "), problem
    for part in parts:
        assert part in problem, (part, problem)


#: YAML-level refusals: no field path (the file cannot be read as a mapping), the line of the problem.
YAML_REFUSALS = {
    "a key given twice": ("overrides:\n  trainer.project_name: a\n  trainer.project_name: b\n", 6,
                          ["key 'trainer.project_name' is given twice (first on line 5)"]),
    "a list as a mapping key": ("overrides:\n  [a, b]: 1\n", 5,
                                ["a mapping key must be a plain value, not a list or mapping"]),
}


@pytest.mark.parametrize(("body", "line", "parts"), YAML_REFUSALS.values(), ids=YAML_REFUSALS)
def test_yaml_refusals_name_the_line(sweep_file, body, line, parts):
    path = sweep_file(body)
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    (problem,) = e.value.problems
    assert problem.startswith(f"{path}:{line}: ") and problem.endswith("— fix the YAML syntax"), problem
    for part in parts:
        assert part in problem, (part, problem)


def test_repeated_objective_metrics(sweep_file):
    path = sweep_file("name: t\nalgorithm: grpo\nobjective:\n  - {metric: a, mode: max}\n  - {metric: a, mode: min}\n",
                      header=False)
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    assert e.value.problems == [f"{path}:3: objective: objective metrics repeat (a, a): list each metric once — "
                                "expected: metric + mode, or a list of them for a multi-objective (Pareto) sweep"]


def test_optunas_maximize_and_minimize_are_read_as_max_and_min(sweep_file):
    """A user of Optuna writes `mode: maximize`; it was refused, and being in a required field it hid every problem
    of the rest of the file until it was fixed."""
    sweep = load_sweep(sweep_file("name: t\nalgorithm: grpo\nobjective:\n"
                                  "  - {metric: critic/score/mean, mode: maximize}\n"
                                  "  - {metric: actor/kl_loss, mode: minimize}\n", header=False))
    assert [o.mode for o in sweep.objectives] == ["max", "min"]
    assert sweep.model_dump(mode="json")["objective"][0]["mode"] == "max"  # sweep.json holds Ray Tune's names


def test_validating_a_search_space_file_says_how_to_use_it(capsys):
    """`sweep validate search_spaces/grpo_kl_loss.yaml` asked to add name, algorithm and objective and called its
    `description` an unknown field; it is a search space, included from a sweep file."""
    assert main(["validate", "search_spaces/grpo_kl_loss.yaml"]) == 2
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  error: search_spaces/grpo_kl_loss.yaml:1: this is a search space (`parameters` only), not a sweep file: "
        "include it from a sweep file with `search_space: grpo_kl_loss` and validate that file (sweeps/grpo_kl.yaml "
        "does)"]


CLI_REFUSALS = {
    "no equals sign": ("", "budget.trials", "not FIELD=VALUE — e.g. budget.trials=4"),
    "a value that is not YAML": ("", "budget.trials=[1", "the value '[1' is not valid YAML (expected ',' or ']'"),
    "an index past the list": ("parameters:\n  kl_coef: {values: [0.01, 0.1]}\nseed_trials:\n  - {}\n",
                               "seed_trials.3.kl_coef=0.1", "seed_trials is a list of 1: '3' is not an index of it"),
    "a field inside a scalar list entry": ("seed_trials:\n  - 5\n", "seed_trials.0.kl_coef=0.1",
                                           "seed_trials.0 is a int, not a mapping: cannot set kl_coef in it"),
}


@pytest.mark.parametrize(("body", "override", "expected"), CLI_REFUSALS.values(), ids=CLI_REFUSALS)
def test_command_line_override_refusals_name_the_override(sweep_file, body, override, expected):
    with pytest.raises(SweepFileError) as e:
        load_sweep(sweep_file(body), [override])
    assert e.value.problems[0].startswith(f"command line {override!r}: {expected}"), e.value.problems


def test_a_file_that_is_not_utf8_or_not_a_mapping(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"name: caf\xe9\n")  # byte 9 is Latin-1 e-acute
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    for path, expected in ((latin1, f"{latin1}: byte 9 is not UTF-8 text — a sweep file is a YAML text file"),
                           (listed, f"{listed}:1: the file is a list, not a mapping — a sweep file is a YAML mapping")):
        with pytest.raises(SweepFileError) as e:
            load_sweep(path)
        (problem,) = e.value.problems
        assert problem.startswith(expected), problem


def test_sweep_validate_prints_the_refusal_and_exits_2_without_a_traceback(sweep_file, capsys):
    path = sweep_file("overrides:\n  actor_rollout_ref.rollout.n: 1\n")
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"{path}:5: overrides.actor_rollout_ref.rollout.n: actor_rollout_ref.rollout.n=1" in text
    assert "Traceback" not in text


def test_sweep_validate_refuses_a_value_of_another_type_than_verls_default_at_its_line(sweep_file, capsys):
    path = sweep_file("kl_placement: reward\noverrides:\n  algorithm.kl_ctrl.type: adaptive\n"
                      "  algorithm.kl_ctrl.horizon: xyz\nparameters:\n  kl_coef: {values: [0.002, high]}\n"
                      "  target_kl: {values: [0.03, true]}\n", algorithm="ppo")
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    fails = "so every trial would fail when verl reads it"
    assert out.out.splitlines()[1:] == [
        f"  error: {path}:7: algorithm.kl_ctrl.horizon='xyz' is not a number but verl computes with it (its default "
        f"is 10000), {fails}: write a number without quotes, e.g. 10000",
        f"  error: {path}:9: algorithm.kl_ctrl.kl_coef='high' is not a number but verl computes with it (its default "
        f"is 0.001), {fails}: write a number without quotes, e.g. 0.001",
        f"  error: {path}:10: algorithm.kl_ctrl.target_kl=True is not a number but verl computes with it (its "
        f"default is 0.1), {fails}: write a number, not true/false, e.g. 0.1",
    ]
    assert "Traceback" not in out.out + out.err


def test_sweep_validate_lists_a_mistyped_value_and_the_other_values_problems_in_one_run(sweep_file, capsys):
    """A value of the wrong type hid every value check after it: a new user fixed `horizon: "lots"` and only then
    learnt that a negative target_kl is refused too. The rest of the config is now checked with verl's defaults in
    the mistyped keys' place."""
    path = sweep_file("kl_placement: reward\noverrides:\n  algorithm.kl_ctrl.type: adaptive\n"
                      "  algorithm.kl_ctrl.horizon: lots\nparameters:\n  target_kl: {min: -0.1, max: 0.3}\n",
                      algorithm="ppo")
    assert main(["validate", str(path)]) == 2
    errors = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  error: ")]
    assert [e.split(": ")[1] for e in errors] == [f"{path}:7", f"{path}:9"], errors
    assert "algorithm.kl_ctrl.horizon='lots' is not a number" in errors[0]
    assert "algorithm.kl_ctrl.target_kl=-0.1: verl's AdaptiveKLController clips" in errors[1]


def test_a_knob_inert_in_some_trials_is_a_warning_that_names_the_when_fix(sweep_file):
    sweep = load_sweep(sweep_file("parameters:\n  loss_agg_mode: {values: [token-mean, seq-mean-token-sum-norm]}\n"
                                  "  actor_rollout_ref.actor.loss_scale_factor: {values: [512, 1024]}\n"))
    (warning,) = sweep.warnings
    assert ":6: parameters.actor_rollout_ref.actor.loss_scale_factor: " in warning
    assert "has no effect in some trials" in warning and "this config's is 'token-mean'" in warning
    assert warning.endswith("Add a `when` condition so it is only sampled where it acts")


def test_a_seed_trial_may_leave_parameters_to_the_sampler(sweep_file):
    # Optuna's enqueue_trial samples the parameters a seed trial does not give: a partial seed is not a problem
    sweep = load_sweep(sweep_file("parameters:\n  kl_coef: {values: [0.01, 0.02]}\n"
                                  "  entropy_coeff: {values: [0.0, 0.001]}\nseed_trials:\n  - {kl_coef: 0.02}\n"))
    assert sweep.seed_trials == [{"kl_coef": 0.02}]


def test_confirm_top_above_the_trial_budget_is_a_warning_that_names_the_field_and_the_fix(sweep_file):
    sweep = load_sweep(sweep_file("parameters:\n  kl_coef: {values: [0.01, 0.02]}\n"
                                  "budget:\n  trials: 3\n  confirm: {top: 5, seeds: 2}\n"))
    (warning,) = sweep.warnings
    assert "budget.confirm.top: top 5 is more than budget.trials (3): at most 3 search trials can be re-run" in warning
    assert warning.endswith("Lower budget.confirm.top to 3 or less, or raise budget.trials")
    ok = load_sweep(sweep_file("parameters:\n  kl_coef: {values: [0.01, 0.02]}\n"
                               "budget:\n  trials: 3\n  confirm: {top: 3, seeds: 2}\n", name="ok.yaml"))
    assert not ok.warnings
