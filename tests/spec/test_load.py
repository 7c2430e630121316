"""Loading sweep files: YAML with lines, command-line overrides, search-space includes, one error per problem."""

from __future__ import annotations

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import Choice, Range, load_sweep
from tests.conftest import REPO


def _problems(path, overrides=()) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path, overrides)
    return e.value.problems


def test_minimal_file_gets_documented_defaults(sweep_file):
    sweep = load_sweep(sweep_file())
    assert sweep.trainer == "embedded"
    assert sweep.placement == "loss"  # grpo's default kl_placement
    assert sweep.wandb.mode == "disabled"
    assert sweep.launcher == "local"
    assert sweep.health.preset == "default"
    assert [o.metric for o in sweep.objectives] == ["val-core/arith/acc/mean@1"]


def test_yaml_1_2_scalars_floats_and_strings(sweep_file):
    path = sweep_file(
        """
        overrides:
          trainer.experiment_name: on
          actor_rollout_ref.actor.optim.weight_decay: 1e-3
        parameters:
          kl_coef: {distribution: log_uniform_values, min: 1e-4, max: 1.0e-2}
        """
    )
    sweep = load_sweep(path)
    assert sweep.overrides["trainer.experiment_name"] == "on"  # YAML 1.1 would make it True; verl expects a string
    assert sweep.overrides["actor_rollout_ref.actor.optim.weight_decay"] == 0.001
    p = sweep.parameters["kl_coef"]
    assert isinstance(p, Range) and p.distribution == "log_uniform_values" and (p.min, p.max) == (1e-4, 1e-2)


def test_w_and_bs_ambiguous_log_uniform_is_refused_with_both_fixes(sweep_file):
    # W&B's log_uniform takes natural-log exponents, not values: refused, naming both fixes
    path = sweep_file("parameters:\n  kl_coef: {distribution: log_uniform, min: -9.2, max: -4.6}\n")
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    (problem,) = e.value.problems
    assert problem.startswith(f"{path}:5: parameters.kl_coef: distribution log_uniform is ambiguous")
    assert "Write `distribution: log_uniform_values` with min/max in real units" in problem
    # exp(-9.2) = 0.000101039, exp(-4.6) = 0.0100518 (4 significant digits)
    assert "(min: 0.000101, max: 0.01005 for these bounds)" in problem


def test_w_and_b_range_without_distribution_follows_w_and_b(sweep_file):
    sweep = load_sweep(sweep_file("parameters:\n  actor_rollout_ref.actor.ppo_epochs: {min: 1, max: 4}\n"
                                  "  entropy_coeff: {min: 0.0, max: 0.01}\n"))
    assert sweep.parameters["actor_rollout_ref.actor.ppo_epochs"].distribution == "int_uniform"
    assert sweep.parameters["entropy_coeff"].distribution == "uniform"


def test_error_names_file_line_path_value_and_fix(sweep_file):
    path = sweep_file(
        """
        budget:
          trials: 0
          max_concurent: 2
        parameters:
          kl_coef: {distribution: log_uniform_values, min: 0.01, max: 0.001}
        """
    )
    problems = _problems(path)
    assert len(problems) == 3
    trials, typo, bounds = sorted(problems, key=lambda p: int(p.split(":")[1]))
    assert trials.startswith(f"{path}:6: budget.trials: ") and "(got 0)" in trials
    assert typo.startswith(f"{path}:7: budget.max_concurent: unknown field") and "'max_concurrent'" in typo
    assert bounds.startswith(f"{path}:9: parameters.kl_coef: ") and "must be below max" in bounds


def test_unknown_top_level_field_gets_closest_name(sweep_file):
    (problem,) = _problems(sweep_file("sead: 3\n"))
    assert "sead: unknown field" in problem and "did you mean 'seed'?" in problem


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "the file is empty"),
        (b"- a\n- b\n", "not a mapping"),
        (b"name: x\n\talgorithm: grpo\n", "indent with spaces"),
        (b"name: a\nname: b\n", "key 'name' is given twice (first on line 1)"),
        (b"\x00\x01\xff\xfe binary", "not UTF-8"),
        (b"name: [unclosed\n", "fix the YAML syntax"),
        (b"name: a\x07\n", "fix the YAML syntax"),
        (b"[" * 5000, "nests too deeply"),
    ],
)
def test_malformed_files_give_one_clear_problem(tmp_path, content, expected):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    problems = _problems(path)
    assert any(expected in p for p in problems), problems
    assert all(p.startswith(str(path)) for p in problems)


def test_missing_file_and_directory(tmp_path):
    assert "no such file" in _problems(tmp_path / "nope.yaml")[0]
    assert "is a directory" in _problems(tmp_path)[0]


def test_required_fields_are_all_reported(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("seed: 1\n")
    problems = _problems(path)
    assert {p.split(": ")[1] for p in problems} == {"name", "algorithm", "objective"}
    assert all("required field is missing" in p for p in problems)


def test_cli_overrides_set_nested_and_dotted_fields(sweep_file):
    path = sweep_file("parameters:\n  kl_coef: {distribution: log_uniform_values, min: 0.0001, max: 0.01}\n")
    sweep = load_sweep(
        path,
        [
            "budget.trials=4",
            "budget.max_steps=20",
            "overrides.actor_rollout_ref.rollout.n=4",
            "parameters.kl_coef.max=0.1",
            "parameters.loss_agg_mode={values: [token-mean, seq-mean-token-mean]}",
            "wandb.mode=offline",
        ],
    )
    assert (sweep.budget.trials, sweep.budget.max_steps) == (4, 20)
    assert sweep.overrides == {"actor_rollout_ref.rollout.n": 4}
    assert sweep.parameters["kl_coef"].max == 0.1
    assert isinstance(sweep.parameters["loss_agg_mode"], Choice)
    assert sweep.wandb.mode == "offline"
    assert sweep.where("budget", "trials") == "command line 'budget.trials=4'"


def test_cli_override_errors_name_the_override(sweep_file):
    problems = _problems(sweep_file(), ["budget.trials=many", "budget"])
    assert any(p.startswith("command line 'budget': not FIELD=VALUE") for p in problems)
    (after,) = _problems(sweep_file(), ["budget.trials=many"])
    assert after.startswith("command line 'budget.trials=many': budget.trials:") and "'many'" in after


def test_search_space_is_included_and_the_sweep_wins(sweep_file, tmp_path):
    spaces = tmp_path / "search_spaces"
    spaces.mkdir()
    (spaces / "kl.yaml").write_text(
        "parameters:\n"
        "  kl_coef: {distribution: log_uniform_values, min: 0.0001, max: 0.01}\n"
        "  kl_loss_type: {values: [low_var_kl, kl]}\n"
    )
    sub = tmp_path / "sweeps"
    sub.mkdir()
    path = sub / "s.yaml"
    path.write_text(sweep_file("search_space: kl\nparameters:\n  kl_loss_type: {values: [mse]}\n").read_text())
    sweep = load_sweep(path)
    assert sweep.parameters["kl_loss_type"].values == ["mse"]
    assert sweep.parameters["kl_coef"].max == 0.01
    assert sweep.where("parameters", "kl_coef") == f"{spaces / 'kl.yaml'}:2"


def test_search_space_missing_or_malformed(sweep_file, tmp_path):
    assert "search_space: no file 'nope'" in _problems(sweep_file("search_space: nope\n"))[0]
    bad = tmp_path / "space.yaml"
    bad.write_text("parameters:\n  kl_coef: {min: 1}\n")
    (problem,) = _problems(sweep_file(f"search_space: {bad}\n"))
    assert problem.startswith(f"{bad}:2: parameters.kl_coef")


def test_asha_with_multi_objective_is_refused(sweep_file):
    path = sweep_file("scheduler: asha\n", header=False)
    path.write_text(
        "name: t\nalgorithm: grpo\nscheduler: asha\nobjective:\n"
        "  - {metric: val-core/arith/acc/mean@1, mode: max}\n  - {metric: actor/kl_loss, mode: min}\n"
    )
    (problem,) = _problems(path)
    assert "asha needs a single objective" in problem


def test_parameter_without_kind_says_what_a_parameter_is(sweep_file):
    (problem,) = _problems(sweep_file("parameters:\n  kl_coef: 0.01\n"))
    assert "parameters.kl_coef" in problem and "`values: [...]`, `value: x`" in problem


def test_replay_trace_is_found_next_to_the_sweep_file_and_made_absolute(sweep_file, tmp_path, monkeypatch):
    (tmp_path / "run.jsonl").write_text('{"step": 1, "data": {"actor/kl_loss": 0.1}}\n')
    monkeypatch.chdir(tmp_path.parent)  # not the sweep file's folder: Ray workers run elsewhere too
    sweep = load_sweep(sweep_file("trainer: replay\nreplay: {trace: run.jsonl, speed: 2}\n"))
    assert (sweep.replay.trace, sweep.replay.speed) == (str((tmp_path / "run.jsonl").resolve()), 2.0)


def test_replay_section_and_trainer_must_agree(sweep_file, tmp_path):
    [missing] = _problems(sweep_file("trainer: replay\nreplay: {trace: absent.jsonl}\n"))
    assert "sweep.yaml:5: replay.trace: no file 'absent.jsonl'" in missing
    [without] = _problems(sweep_file("trainer: replay\n"))
    assert "trainer replay needs the log to play back" in without
    (tmp_path / "run.jsonl").write_text('{"step": 1, "data": {"actor/kl_loss": 0.1}}\n')
    [unused] = _problems(sweep_file(f"replay: {{trace: {tmp_path / 'run.jsonl'}}}\n"))
    assert "replay is only read by trainer: replay, but trainer is embedded" in unused


@pytest.mark.parametrize("field", ["search_space", "replay.trace"])
def test_a_file_name_too_long_for_the_file_system_is_a_missing_file(sweep_file, field):
    problems = _problems(sweep_file("trainer: replay\n"), [f"{field}={'x' * 600}"])
    assert f"{field}: no file" in problems[0]
    # search_space: the file also lacks the replay section trainer replay needs, reported in the same run
    assert len(problems) == {"search_space": 2, "replay.trace": 1}[field], problems


FIVE_MISTAKES = """
overrides:
  kl_loss_type: low_var_kl
  actor_rollout_ref.actor.entropy_coef: 0.001
parameters:
  kl_loss_coef: {values: [0.01, 0.1]}
  loss_agg_mode: {values: [token-mean, token-sum]}
  target_kl: {values: [0.1]}
  kl_coef: {values: [0.01, 0.1], when: {kl_loss_coef: 0.01}}
seed_trials:
  - {kl_loss_coef: 0.01, loss_agg_mod: token-mean}
budget: {trials: 4, max_concurent: 2}
health:
  rules:
    - {name: kl, metric: ref_kl, abvoe: 1, action: stop}
"""


def test_every_independent_problem_is_reported_in_one_load(sweep_file):
    # a file with several mistakes (schema, then keys, then knobs) reports them all in one load
    path = sweep_file(FIVE_MISTAKES)
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    fields = [p.split(": ")[1] for p in e.value.problems]
    assert fields == [
        "budget.max_concurent",  # the schema: unknown fields; not also the rule's "needs above or below", an echo
        "health.rules.0.abvoe",
        "overrides.kl_loss_type", "overrides.actor_rollout_ref.actor.entropy_coef", "parameters.kl_loss_coef",
        "seed_trials.0.loss_agg_mod",  # verl keys, then (without the entries above) seed trials and inert knobs
        "parameters.target_kl",
    ], e.value.problems
    # kl_coef's `when` names the removed kl_loss_coef: no echo of that problem (nor of the seed trial's kl_loss_coef)
    assert not any("parameters.kl_coef" in p or "seed_trials.0.kl_loss_coef" in p for p in e.value.problems)


def test_typo_fixes_name_the_full_key_the_alias_target_and_the_valid_fields(sweep_file):
    path = sweep_file(FIVE_MISTAKES)
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    by_field = {p.split(": ")[1]: p for p in e.value.problems}
    assert by_field["parameters.kl_loss_coef"].endswith("did you mean 'actor_rollout_ref.actor.kl_loss_coef'?")
    assert "overrides take verl's full keys: write 'actor_rollout_ref.actor.kl_loss_type'" in \
        by_field["overrides.kl_loss_type"]  # GRPO: the KL is in the loss
    assert "did you mean 'actor_rollout_ref.actor.entropy_coeff'?" in \
        by_field["overrides.actor_rollout_ref.actor.entropy_coef"]
    assert "did you mean 'max_concurrent'? Valid fields here: trials, max_concurrent, max_steps" in \
        by_field["budget.max_concurent"]
    # a health rule's fields as a user writes them (its condition inline, `for`), never an empty list
    rule = by_field["health.rules.0.abvoe"]
    assert "did you mean 'above'?" in rule and "Valid fields here: name, match, for, after, action" in rule
    assert "metric, above, below, stat, window" in rule
    assert "did you mean 'loss_agg_mode'?" in by_field["seed_trials.0.loss_agg_mod"]


def test_a_bare_leaf_shared_by_two_keys_names_both(sweep_file):
    with pytest.raises(SweepFileError) as e:
        load_sweep(sweep_file("parameters:\n  lr: {values: [0.001, 0.0003]}\n"))
    assert "did you mean 'actor_rollout_ref.actor.optim.lr' or 'critic.optim.lr'?" in e.value.problems[0]


def test_a_rules_file_typo_gets_the_closest_field_and_the_valid_ones(tmp_path):
    # `sweep health check --rules FILE` said only "Extra inputs are not permitted"
    from klsweep.health import load_ruleset

    rules = tmp_path / "rules.yaml"
    rules.write_text("preset: default\nrules:\n  - {name: kl, metric: ref_kl, above: 1, acton: stop}\n")
    with pytest.raises(SweepFileError) as e:
        load_ruleset(rules)
    # the typo alone: not also "rules.0.action: Field required", its echo
    assert e.value.problems == [
        f"{rules}: rules.0.acton: unknown field (got 'stop') — did you mean 'action'? Valid fields here: name, match, "
        "for, after, action, kind, advice, advice_without_kl, source, remedy, max_remedies, on_same_finding, all, any, "
        "metric, above, below, stat, window, peak_above, early"]


def test_a_misspelt_condition_field_is_said_instead_of_its_cascade(tmp_path, sweep_file):
    """``metrik:`` for ``metric:`` failed the rule's own check first ("needs exactly one of 'metric', 'all' or
    'any'; found none"), and the misspelling was never named; in a sweep file, ``acton:`` also gave "action: required
    field is missing" before the useful line."""
    from klsweep.health import load_ruleset

    rules = tmp_path / "rules.yaml"
    rules.write_text("preset: default\nrules:\n  - {name: kl, metrik: ref_kl, above: 1, action: stop}\n")
    with pytest.raises(SweepFileError) as e:
        load_ruleset(rules)
    [problem] = e.value.problems
    assert problem.startswith(f"{rules}: rules.0.metrik: unknown field (got 'ref_kl') — did you mean 'metric'?")

    for typo, meant in (("acton: stop", "action"), ("metrik: ref_kl", "metric")):
        rule = "{name: kl, metric: ref_kl, above: 1, action: stop}".replace(f"{meant}: {typo.split()[1]}", typo)
        path = sweep_file(f"health: {{preset: default, rules: [{rule}]}}\n")
        [problem] = _problems(path)
        line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("health:"))
        field = typo.split(":")[0]
        assert problem.startswith(f"{path}:{line}: health.rules.0.{field}: unknown field — did you mean '{meant}'?")


def test_an_unknown_field_on_the_command_line_is_blamed_on_the_command_line(sweep_file):
    [problem] = _problems(sweep_file(), ["budget.trialz=4"])
    assert problem.startswith("command line 'budget.trialz=4': budget.trialz: unknown field — did you mean 'trials'?")
    [problem] = _problems(sweep_file(), ["budgets.trials=4"])  # a top-level field the override made
    assert problem.startswith("command line 'budgets.trials=4': budgets: unknown field — did you mean 'budget'?")


def test_a_shipped_sweep_file_copied_elsewhere_still_finds_the_shipped_search_space(tmp_path):
    copied = tmp_path / "copied.yaml"
    copied.write_text((REPO / "sweeps" / "grpo_kl.yaml").read_text())
    sweep = load_sweep(copied)
    assert sweep.parameters == load_sweep(REPO / "sweeps" / "grpo_kl.yaml").parameters

    copied.write_text(copied.read_text().replace("search_space: grpo_kl_loss", "search_space: no_such_space"))
    with pytest.raises(SweepFileError) as e:
        load_sweep(copied)
    text = "\n".join(e.value.problems)
    assert "search_space: no file 'no_such_space' or 'no_such_space.yaml' (looked in " in text and str(tmp_path) in text
    assert "copy the search space next to the sweep file" in text
    assert "this sweep has no parameters" in text  # the seed trial's knock-on, not 'Parameters: ' and nothing


def test_every_bad_prescription_of_a_remedy_in_one_run(sweep_file):
    """An unknown key, a bad operation and the seed: three problems, one validate."""
    rule = ('health.rules=[{name: r1, metric: actor/ppo_kl, above: 1, action: stop, '
            'remedy: {kl_coeff: "*1.5", target_kl: "x2", seed: "=3", kl_coef: "*1.5"}}]')
    problems = _problems(sweep_file(), [rule])
    assert len(problems) == 3
    assert "health.rules.0.remedy.target_kl: 'x2' is not an operation" in problems[0]
    assert "health.rules.0.remedy.seed: remedy seed: the seed cannot be prescribed" in problems[1]
    assert "'kl_coeff' is not a key of verl 0.9.1's ppo_trainer config" in problems[2]


def test_a_trainer_section_with_its_own_error_is_not_also_reported_missing(sweep_file):
    table = REPO / "benchmarks/tabular/aggressive.jsonl.gz"
    problems = _problems(sweep_file(), ["trainer=tabular", f"tabular={{table: {table}}}", "tabular.speed=0.05"])
    assert len(problems) == 1 and "tabular.speed: unknown field — Valid fields here: table" in problems[0]
    # without the section at all, it is missing
    [missing] = _problems(sweep_file(), ["trainer=tabular"])
    assert "trainer tabular needs the table to serve: add `tabular: {table: PATH}`" in missing


def test_stopper_fields_given_flat_name_every_stopper_that_takes_them_and_the_nested_fix(sweep_file):
    # margin is a setting of all three stoppers (each its own scale), grace of the objective and fate stoppers
    [problem] = _problems(sweep_file(), ["stopping={margin: 4, grace: 0.3}"])
    assert ("stopping: grace, margin are settings of the stoppers (grace: objective and fate; margin: objective, "
            "median and fate), each with its own: nest each under the stopper it is for, e.g. stopping: {objective: "
            "{grace: 0.3, margin: 4}, median: {margin: 4}, fate: {grace: 0.3, margin: 4}}") in problem
    [problem] = _problems(sweep_file(), ["stopping={margin: 4}"])
    assert problem.endswith("stopping: margin is a setting of the objective, median and fate stoppers, each with its "
                            "own: nest it under the stopper it is for, e.g. stopping: {objective: {margin: 4}, median: "
                            "{margin: 4}, fate: {margin: 4}} (defaults differ, so choose each: margin: objective 4.0, "
                            "median 0.08, fate 0.1) — expected: early stopping besides the health rules: "
                            "{objective, median, fate}, each on | off | its settings")
    # the stoppers the file turns on are the example, with their own settings kept
    path = sweep_file("stopping: {median: on, fate: {window: 4}, margin: 0.2}\n")
    [problem] = _problems(path)
    assert problem.startswith(f"{path}:4: stopping: margin is a setting of the objective, median and fate stoppers")
    assert "e.g. stopping: {median: {margin: 0.2}, fate: {window: 4, margin: 0.2}} (defaults differ" in problem
    # a setting only one stopper takes lists no defaults
    [problem] = _problems(sweep_file(), ["stopping={signals: [kl]}"])
    assert "e.g. stopping: {fate: {signals: ['kl']}} — expected" in problem
    fixed = load_sweep(sweep_file("stopping: {median: {margin: 0.2}, fate: {window: 4, margin: 0.2}}\n"))
    assert (fixed.stopping.median.margin, fixed.stopping.fate.margin, fixed.stopping.fate.window) == (0.2, 0.2, 4)
    assert load_sweep(sweep_file(), ["stopping={objective: {margin: 4, grace: 0.3}}"]).stopping.objective.margin == 4


def test_reversed_or_empty_range_says_the_fix(sweep_file):
    [reversed_] = _problems(sweep_file(), ["parameters.kl_coef={distribution: log_uniform_values, min: 1.0, "
                                           "max: 0.001}"])
    assert reversed_.endswith("parameters.kl_coef: min (1.0) must be below max (0.001): swap them: min: 0.001, "
                              "max: 1.0")
    [empty] = _problems(sweep_file(), ["parameters.kl_coef={min: 0.01, max: 0.01}"])
    assert empty.endswith("min and max are both 0.01: a range needs min below max; for one value write "
                          "{value: 0.01}")


def test_an_error_the_command_line_caused_inside_a_field_is_located_at_the_override_not_the_files_line(sweep_file):
    # conservative.yaml:15 holds kl_coef {min: 0.001, max: 1.0}: the max the range check reads is the command line's
    conservative = REPO / "sweeps/conservative.yaml"
    [problem] = _problems(conservative, ["parameters.kl_coef.max=0.0001"])
    assert problem == ("command line 'parameters.kl_coef.max=0.0001': parameters.kl_coef: min (0.001) must be below "
                       "max (0.0001): swap them: min: 0.0001, max: 0.001")
    # a check after the schema (a negative KL coefficient) too, naming each override that went into the field
    [negative] = _problems(conservative, ["parameters.kl_coef.distribution=uniform", "parameters.kl_coef.min=-0.1"])
    assert negative.startswith("command line 'parameters.kl_coef.distribution=uniform', 'parameters.kl_coef.min=-0.1':"
                               " parameters.kl_coef: kl_coef (algorithm.kl_ctrl.kl_coef) can be -0.1")
    # the file's own error keeps its line, with an override elsewhere
    path = sweep_file("parameters:\n  kl_coef: {distribution: log_uniform_values, min: 0.1, max: 0.01}\n")
    [own] = _problems(path, ["budget.trials=3"])
    assert own.startswith(f"{path}:5: parameters.kl_coef: min (0.1) must be below max (0.01)")


def test_an_objective_window_longer_than_the_run_is_a_warning(sweep_file):
    long = load_sweep(sweep_file(), ["stopping={objective: {window: 100}}", "budget.max_steps=80"])
    assert any(w.endswith("stopping.objective.window: window 100 is longer than the run (budget.max_steps 80, at "
                          "most one value per step): it never fills, so a trial's value at a step is the mean of all "
                          "its values so far, early ones included. Use a window of a few values (the default is 2)")
               for w in long.warnings), long.warnings
    fits = load_sweep(sweep_file(), ["stopping={objective: {window: 80}}", "budget.max_steps=80"])
    assert not any("window" in w for w in fits.warnings)


def test_a_setting_under_a_short_form_keeps_what_the_short_form_said(sweep_file):
    """``scheduler: asha`` is ``{type: asha}``: ``scheduler.grace_period=20`` after it keeps the type (it was reset to
    the default ``none``, silently dropping the scheduler), and likewise ``sampler`` and ``health``."""
    path = sweep_file("sampler: random\nhealth: aggressive\n")
    sweep = load_sweep(path, ["scheduler=asha", "scheduler.grace_period=20", "sampler.options.seed=3",
                              "health.remedies=true", "budget.max_steps=40"])
    assert (sweep.scheduler.type, sweep.scheduler.grace_period) == ("asha", 20)
    assert (sweep.sampler.name, sweep.sampler.options) == ("random", {"seed": 3})
    assert (sweep.health.preset, sweep.health.remedies) == ("aggressive", True)


def test_an_asha_grace_period_past_the_last_step_is_refused(sweep_file):
    path = sweep_file("scheduler: {type: asha, grace_period: 100}\nbudget: {max_steps: 20}\n")
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    assert "scheduler.grace_period 100 is above budget.max_steps 20" in e.value.problems[0]
    assert "Lower scheduler.grace_period or raise budget.max_steps" in e.value.problems[0]
    assert load_sweep(path, ["budget.max_steps=100"]).scheduler.grace_period == 100  # equal is Ray's ASHA's limit
