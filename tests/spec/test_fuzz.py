"""Property tests: malformed sweep files give SweepFileError (or load), never another exception."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from klsweep.errors import SweepFileError
from klsweep.orchestrate.plan import validate
from klsweep.spec import load_sweep
from klsweep.spec.schema import Sweep

REPO = Path(__file__).resolve().parents[2]
VALID = [p.read_text() for p in sorted((REPO / "sweeps").glob("*.yaml"))]
FIELDS = [*Sweep.model_fields, "values", "value", "distribution", "min", "max", "when", "metric", "mode", "trials",
          "kl_coef", "target_kl", "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.type", "preset"]
WORDS = ["ppo", "grpo", "drgrpo", "embedded", "verl", "loss", "reward", "both", "adaptive", "log_uniform", "tpe",
         "grid", "asha", "on", "off", "yes", "null", "k3+", "full", "-1", "0", "1e-3", "nan", ".inf"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.sampled_from(WORDS), st.text(max_size=12))
keys = st.one_of(st.sampled_from(FIELDS), st.text(min_size=1, max_size=10))
trees = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(keys, kids, max_size=5)), max_leaves=25)
documents = st.dictionaries(keys, trees, max_size=8)

_TMP = Path(tempfile.mkdtemp(prefix="klsweep-fuzz-"))


def _load(content: bytes, overrides=()) -> None:
    path = _TMP / "sweep.yaml"
    path.write_bytes(content)
    try:
        load_sweep(path, overrides)
    except SweepFileError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)


def fast(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@fast(400)
@given(documents)
def test_random_yaml_trees(doc):
    _load(yaml.safe_dump(doc, allow_unicode=True).encode())


@st.composite
def mutated(draw):
    lines = draw(st.sampled_from(VALID)).splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "replace_value", "insert_text", "tab", "dedent"]))
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "replace_value" and ":" in lines[i]:
            lines[i] = lines[i].split(":", 1)[0] + ": " + draw(st.sampled_from(WORDS + ["{", "[1, 2", "{min: 1}"]))
        elif kind == "insert_text":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.text(max_size=6)) + lines[i][at:]
        elif kind == "tab":
            lines[i] = "\t" + lines[i]
        else:
            lines[i] = lines[i].lstrip()
        if not lines:
            lines = [""]
    return "\n".join(lines)


overrides = st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(
    ["budget.trials", "budget", "parameters.kl_coef.max", "overrides.data.train_batch_size", "seed_trials.0.kl_coef",
     "name.x", "sampler", "health", "kl_placement", "objective.0.mode", "parameters.x"]),
    st.sampled_from(WORDS + ["{values: [1]}", "[", "4", "{}"])), max_size=3)


@fast(400)
@given(mutated(), overrides)
def test_mutated_valid_files_and_cli_overrides(text, cli):
    _load(text.encode("utf-8", "surrogatepass"), cli)


@fast(250)
@given(st.binary(max_size=200))
def test_random_bytes(content):
    _load(content)


BASE = "name: f\nalgorithm: grpo\nobjective: {metric: m, mode: max}\nbudget: {trials: 2}\n"


@pytest.mark.slow
@fast(12)
@given(st.lists(st.sampled_from([
    "overrides:\n  actor_rollout_ref.actor.kl_loss_type: k4\n",
    "overrides:\n  data.train_batch_size: 7\n",
    "overrides:\n  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 64\n",
    "trainer: verl\n",
    "kl_placement: none\n",
    "parameters:\n  loss_agg_mode: {values: [token-mean, seq-sum]}\n",
    "sampler: {name: tpe, options: {n_startup: 3}}\n",
    "overrides:\n  actor_rollout_ref.actor.use_dynamic_bsz: on\n",
]), max_size=3, unique=True))
def test_validate_never_raises(parts):
    path = _TMP / "v.yaml"
    path.write_text(BASE + "".join(parts))
    assert validate(str(path), [], out=io.StringIO()) in (0, 2)
