"""Planted-bug check: each deliberate bug below must make at least one of its tests fail.

The suite is made faster from time to time; this script shows that it lost no power. For each bug it copies the
repository's ``src/``, ``tests/`` and what the tests read (:data:`COPIED`) into a temporary directory, applies the bug
there (the ``old`` snippet must occur exactly once in the file), and runs::

    python -m pytest -x -q -n 0 -p no:cacheprovider <the bug's node ids>

in that copy with ``PYTHONPATH=<copy>/src:<copy>`` (Ray workers inherit it). The bug is CAUGHT when at least one test
FAILED on it (read from pytest's JUnit XML); an error in collection, a fixture or an import proves nothing
(BROKEN), and all tests passing is MISSED. Before the bugs, the same tests run once on an unmodified copy (the
baseline): a test that fails without a bug would make every CAUGHT meaningless. The working tree is never changed.

Usage::

    .venv/bin/python -m tests.planted_bugs [--only NAME ...] [--list] [--no-baseline]

Prints one line per bug (name, result, the failing test, seconds) and a count; exits 1 unless every bug is CAUGHT
(2 when the baseline fails).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: What the tests read besides src/ and tests/ (sweep files, search spaces, tabular benchmarks, the notebook, the
#: docs page of the health rules, the launcher profiles, pyproject.toml for pytest's settings).
COPIED = ("src", "tests", "sweeps", "search_spaces", "benchmarks", "notebooks", "launchers", "docs",
          "pyproject.toml", "README.md", "BENCHMARKS.md", "CONTRIBUTING.md")
#: Left out of the copy: caches that would make a run depend on an earlier one.
IGNORED = shutil.ignore_patterns(".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "*.egg-info")
#: Seconds one bug's tests may take before the bug counts as not caught.
TIMEOUT_S = 300
#: Failure messages that say the code did not even import: such a failure proves nothing about the bug.
IMPORT_FAILURES = ("ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError")


@dataclass(frozen=True)
class Bug:
    """A deliberate bug: ``old`` replaced by ``new`` in ``file`` (a path under src/klsweep) must fail ``tests``."""

    name: str
    description: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


EMB = "trainers/embedded/trainer.py"
LOSSES = "tests/trainers/embedded/test_losses.py"
MATH = "tests/trainers/embedded/test_reference_math.py"
SAMPLERS = "tests/orchestrate/test_samplers.py"
EACH_SAMPLER = f"{SAMPLERS}::test_each_sampler_name_is_optunas_sampler_with_klsweeps_settings"
#: The dispatch of _new_sampler to TPE and GP, with its two names as fields (swapped by ``tpe_gp_swapped``).
TPE_GP = ('    if name == "{first}":\n        return optuna.samplers.TPESampler(\n'
          '            **{{"n_startup_trials": startup, "multivariate": True, "n_ei_candidates": 128, **options}}, '
          'seed=seed)\n    if name == "{second}":\n        return optuna.samplers.GPSampler(')
STATUS = "tests/analysis/test_status.py"
REFUSALS = "tests/spec/test_refusals.py::test_each_refusal_names_the_line_the_field_the_value_and_the_fix"

BUGS: tuple[Bug, ...] = (
    # ---------------------------------------------------------------- embedded trainer, verl math
    Bug("token_count", "the actor loss's batch token count counts padding too",
        EMB, "batch_num_tokens=int(mask.sum()),\n", "batch_num_tokens=int(mask.numel()),\n",
        (f"{LOSSES}::test_actor_loss_closed_form_token_mean_k1_at_ratio_one",
         f"{MATH}::test_actor_loss_gradient_closed_form_token_mean",
         f"{MATH}::test_update_normalises_each_mini_batch_by_its_own_tokens_and_sequences[token-mean]")),
    Bug("global_batch_size", "the actor loss's global batch size is the response length, not the sequences",
        EMB, "global_batch_size=int(mask.shape[0]),\n        loss_scale",
        "global_batch_size=int(mask.shape[1]),\n        loss_scale",
        (f"{LOSSES}::test_seq_mean_token_sum_norm_uses_loss_scale_factor",
         f"{MATH}::test_actor_loss_closed_form")),
    Bug("response_mask_off_by_one", "the response mask stops before the first EOS instead of including it",
        "trainers/embedded/task.py", "eos_before = torch.cumsum(is_eos, dim=1) - is_eos",
        "eos_before = torch.cumsum(is_eos, dim=1)",
        ("tests/trainers/embedded/test_task.py::test_response_mask_ends_with_the_first_eos",
         "tests/trainers/embedded/test_task.py::test_proxy_rewards_length_and_gold_refuses_it",
         f"{MATH}::test_grpo_and_drgrpo_advantages_equal_the_papers")),
    Bug("kl_penalty_sign", "the KL in the reward is added to the score instead of subtracted",
        EMB, "token_level_rewards = token_level_scores - beta * kld",
        "token_level_rewards = token_level_scores + beta * kld",
        (f"{LOSSES}::test_kl_in_reward_equals_verls_apply_kl_penalty",
         f"{MATH}::test_gae_with_kl_in_reward_equals_the_papers_recursion")),
    Bug("gamma_lam_swapped", "GAE gets gamma and lam the wrong way round",
        EMB, "gamma=s.gamma, lam=s.lam", "gamma=s.lam, lam=s.gamma",
        (f"{MATH}::test_gae_with_kl_in_reward_equals_the_papers_recursion",)),
    Bug("entropy_bonus_sign", "the entropy bonus is added to the loss (entropy penalised) instead of subtracted",
        EMB, "loss = pg_loss - config.entropy_coeff * entropy_loss",
        "loss = pg_loss + config.entropy_coeff * entropy_loss",
        (f"{LOSSES}::test_seq_mean_token_sum_norm_uses_loss_scale_factor",
         f"{MATH}::test_actor_loss_closed_form")),
    Bug("rollout_n_ignored", "actor_rollout_ref.rollout.n is read as 1 whatever the overrides say",
        "trainers/embedded/config.py",
        'n = as_int(cfg.actor_rollout_ref.rollout.n, "actor_rollout_ref.rollout.n")', "n = 1",
        (f"{LOSSES}::test_adaptive_controller_matches_closed_form",
         f"{MATH}::test_grpo_and_drgrpo_advantages_equal_the_papers")),
    Bug("kl_loss_arguments_swapped", "the KL loss is KL(ref || actor): log_prob and ref_log_prob swapped",
        EMB, "kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob,",
        "kl_penalty(logprob=ref_log_prob, ref_logprob=log_prob,",
        (f"{LOSSES}::test_actor_loss_closed_form_token_mean_k1_at_ratio_one",
         f"{MATH}::test_actor_loss_gradient_closed_form_token_mean")),
    Bug("kl_loss_coef_dropped", "the KL loss enters the actor loss without its coefficient kl_loss_coef",
        EMB, "loss = loss + kl_loss * config.kl_loss_coef", "loss = loss + kl_loss",
        (f"{LOSSES}::test_actor_loss_closed_form_token_mean_k1_at_ratio_one",
         f"{MATH}::test_actor_loss_gradient_closed_form_token_mean")),
    # ---------------------------------------------------------------- search
    Bug("tpe_gp_swapped", "sampler: tpe builds Optuna's GPSampler and sampler: gp its TPESampler",
        "orchestrate/samplers.py", TPE_GP.format(first="tpe", second="gp"), TPE_GP.format(first="gp", second="tpe"),
        (f"{EACH_SAMPLER}[tpe-TPESampler-settings0]", f"{EACH_SAMPLER}[gp-GPSampler-settings1]")),
    Bug("startup_trials", "the space-filling start-up is one trial short (floor 1 instead of 2)",
        "orchestrate/samplers.py", "return max(2, min(10, trials // 16))", "return max(1, min(10, trials // 16))",
        (f"{EACH_SAMPLER}[tpe-TPESampler-settings0]", f"{EACH_SAMPLER}[gp-GPSampler-settings1]")),
    Bug("tpe_not_multivariate", "TPE samples each parameter independently (multivariate off)",
        "orchestrate/samplers.py", '"multivariate": True', '"multivariate": False',
        (f"{EACH_SAMPLER}[tpe-TPESampler-settings0]",)),
    Bug("reseeding", "every trial's sampler is seeded with the sweep seed, not the trial's seed (proposals repeat)",
        "orchestrate/samplers.py", "self._sampler = self._make(trial_seed(self._seed, trial.number))",
        "self._sampler = self._make(self._seed)",
        (f"{EACH_SAMPLER}[random-RandomSampler-settings3]",
         f"{SAMPLERS}::test_a_new_process_continues_the_sequence_instead_of_replaying_it[random]")),
    # ---------------------------------------------------------------- spec checks
    Bug("inert_override_accepted", "a fixed override of an actor/algorithm knob that has no effect is accepted",
        "spec/checks.py", "if key in presets.KNOBS or key in presets.CRITIC_KNOBS:", "if key in presets.CRITIC_KNOBS:",
        (f"{REFUSALS}[lam fixed under GRPO]",
         f"{REFUSALS}[the in-reward controller type fixed with the KL in the loss]")),
    # ---------------------------------------------------------------- searcher
    Bug("health_stop_complete", "a single-objective health stop is recorded COMPLETE instead of PRUNED",
        "orchestrate/searcher.py", "return (State.PRUNED if len(values) == 1 else State.FAIL), stop_reason",
        "return (State.COMPLETE if len(values) == 1 else State.FAIL), stop_reason",
        ("tests/orchestrate/test_searcher.py::test_a_step_run_again_replaces_the_abandoned_runs_value",
         "tests/orchestrate/test_searcher.py::test_single_objective_states")),
    # ---------------------------------------------------------------- health rules
    Bug("threshold_not_strict", "a rule's `above` holds at the threshold itself (>= instead of >)",
        "health/conditions.py", "return x > self.above if", "return x >= self.above if",
        ("tests/health/test_engine.py::test_length_halving_at_a_format_only_score_is_reward_hacking",
         "tests/health/test_check.py::test_seed_stops_the_ppo_baseline_at_115_by_entropy_and_its_timeline_shows_kl_at_337")),
    Bug("threshold_flipped", "a rule's `above` and `below` comparisons are flipped",
        "health/conditions.py", "return x > self.above if self.above is not None else x < self.below",
        "return x < self.above if self.above is not None else x > self.below",
        ("tests/health/test_engine.py::test_after_is_a_warm_up_and_any_all_combine",
         "tests/health/test_builtin.py::test_one_nan_grad_norm_warns_and_counts")),
    Bug("streak_off_by_one", "a condition's streak counts one step fewer than it held",
        "health/streak.py", "return step - self.start + 1", "return step - self.start",
        ("tests/health/test_engine.py::test_after_is_a_warm_up_and_any_all_combine",
         "tests/health/test_steps.py::test_for_and_after_are_steps_on_a_sampled_log")),
    # ---------------------------------------------------------------- remedies
    Bug("remedy_multiplier", "a remedy's `*x` multiplies by x squared",
        "orchestrate/remedy.py", '"*": value * x,', '"*": value * x * x,',
        ("tests/orchestrate/test_remedy.py::test_aliases_resolve_inert_knobs_are_skipped_and_integers_stay_integers",
         "tests/orchestrate/test_remedy_same_finding.py::test_escalating_applies_each_operation_twice",
         "tests/orchestrate/test_remedy.py::test_the_adaptive_coefficient_is_carried_and_jumps_back_without_it")),
    # ---------------------------------------------------------------- results
    Bug("trials_csv_steps_dropped", "trials.csv loses its `steps` column",
        "analysis/sweep_dir.py", '("steps", ATTR_STEPS),', "",
        (f"{STATUS}::test_status_to_a_pipe_shows_parameters_and_running_trials_on_unwrapped_lines",)),
)


@dataclass
class Outcome:
    result: str  # CAUGHT, MISSED, BROKEN, REFUSED
    detail: str
    seconds: float


def copy_repository(dest: Path) -> None:
    """Copy :data:`COPIED` from the working tree to ``dest`` (links kept as links)."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, symlinks=True, ignore=IGNORED)
        elif source.is_file():
            shutil.copy2(source, dest / name)


def plant(root: Path, bug: Bug) -> str | None:
    """Apply ``bug`` in the copy at ``root``; the reason it cannot be applied, or None."""
    path = root / "src" / "klsweep" / bug.file
    if not path.is_file():
        return f"src/klsweep/{bug.file} does not exist (moved?): update the bug"
    text = path.read_text()
    count = text.count(bug.old)
    if count != 1:
        return f"`old` occurs {count} times in src/klsweep/{bug.file}, not exactly once: update the bug"
    path.write_text(text.replace(bug.old, bug.new))
    return None


def run_pytest(root: Path, node_ids: list[str], exitfirst: bool = True) -> tuple[list[tuple[str, str]], list[str],
                                                                               str]:
    """Run pytest on ``node_ids`` in the copy at ``root``: (failed tests with their message, errors, output tail)."""
    junit = root / "junit.xml"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    # -n 0: one process, not pyproject's xdist workers (a few tests each: four workers' start-up would dominate)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *node_ids]
    if exitfirst:
        command.insert(3, "-x")
    # its own session, so that a timeout ends pytest and whatever it started (Ray's processes), and nothing else
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return [], [f"timed out after {TIMEOUT_S} s"], ""
    tail = output[-2000:]
    failed, errors = [], []
    if junit.is_file():
        for case in ET.parse(junit).iter("testcase"):
            node = _node_id(case)
            for child in case:
                if child.tag == "failure":
                    failed.append((node, child.get("message") or ""))
                elif child.tag == "error":
                    errors.append(f"{node}: {(child.get('message') or '')[:200]}")
    if not failed and not errors and proc.returncode != 0:  # e.g. 4: a node id that no longer exists
        last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        errors.append(f"pytest exited {proc.returncode}: {last}")
    return failed, errors, tail


def _node_id(case: ET.Element) -> str:
    """``path::name`` of a JUnit test case (pytest writes the module's dotted path as ``classname``)."""
    classname, name = case.get("classname") or "", case.get("name") or ""
    parts = [part for part in classname.split(".") if part]  # "" for a collection error
    for i in range(len(parts), 0, -1):  # the longest prefix that is a file; the rest is a test class
        module = Path(*parts[:i]).with_suffix(".py")
        if (REPO / module).is_file():
            return "::".join([module.as_posix(), *parts[i:], name])
    return f"{classname}::{name}" if classname else name


def check(bug: Bug) -> Outcome:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"planted-{bug.name}-") as tmp:
        root = Path(tmp)
        copy_repository(root)
        refused = plant(root, bug)
        if refused:
            return Outcome("REFUSED", refused, time.perf_counter() - start)
        failed, errors, tail = run_pytest(root, list(bug.tests))
    seconds = time.perf_counter() - start
    real = [(node, message) for node, message in failed if not message.startswith(IMPORT_FAILURES)]
    if real:
        return Outcome("CAUGHT", real[0][0], seconds)
    if failed or errors:
        first = failed[0][0] + ": " + failed[0][1][:200] if failed else errors[0]
        return Outcome("BROKEN", f"no assertion failed; {first}", seconds)
    return Outcome("MISSED", "all tests passed" + ("" if "passed" in tail else f" ({tail.strip()[-200:]})"), seconds)


def baseline(bugs: list[Bug]) -> bool:
    """Every bug's tests pass on an unmodified copy (one pytest run), and the copy imports its own klsweep."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="planted-baseline-") as tmp:
        root = Path(tmp)
        copy_repository(root)
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
        where = subprocess.run([sys.executable, "-c", "import klsweep; print(klsweep.__file__)"], cwd=root, env=env,
                               capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(root)):
            print(f"baseline: the copy imports klsweep from {where!r}, not from the copy")
            return False
        node_ids = list(dict.fromkeys(node for bug in bugs for node in bug.tests))
        failed, errors, tail = run_pytest(root, node_ids, exitfirst=False)
    seconds = time.perf_counter() - start
    if failed or errors:
        print(f"baseline: FAILED without any bug ({seconds:.0f} s); fix these first:")
        for line in [f"  {node}: {message[:200]}" for node, message in failed] + [f"  {e}" for e in errors]:
            print(line)
        print(tail)
        return False
    print(f"baseline: the bugs' tests pass on an unmodified copy ({seconds:.0f} s)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.planted_bugs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="check these bugs only")
    parser.add_argument("--list", action="store_true", help="list the bugs and their tests, run nothing")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the tests without any bug")
    args = parser.parse_args(argv)
    bugs = list(BUGS)
    if args.only:
        unknown = sorted(set(args.only) - {bug.name for bug in BUGS})
        if unknown:
            parser.error(f"unknown bug(s) {', '.join(unknown)}; --list shows the names")
        bugs = [bug for bug in BUGS if bug.name in args.only]
    if args.list:
        for bug in bugs:
            print(f"{bug.name:26} src/klsweep/{bug.file}: {bug.description}")
            for node in bug.tests:
                print(f"{'':26}   {node}")
        return 0
    if not args.no_baseline and not baseline(bugs):
        return 2
    counts: dict[str, int] = {}
    for bug in bugs:
        outcome = check(bug)
        counts[outcome.result] = counts.get(outcome.result, 0) + 1
        print(f"{bug.name:26} {outcome.result:8} {outcome.seconds:6.1f} s  {outcome.detail}", flush=True)
    caught = counts.get("CAUGHT", 0)
    others = ", ".join(f"{n} {result.lower()}" for result, n in sorted(counts.items()) if result != "CAUGHT")
    print(f"{caught}/{len(bugs)} bugs caught" + (f"; {others}" if others else ""))
    return 0 if caught == len(bugs) else 1


if __name__ == "__main__":
    sys.exit(main())
