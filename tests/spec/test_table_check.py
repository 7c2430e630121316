"""`sweep validate` of a tabular sweep: searched categories the table did not record are errors (issue 16)."""

from __future__ import annotations

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from tests.conftest import REPO

TABLE = f"tabular={{table: {REPO / 'benchmarks/tabular/grpo_kl.jsonl.gz'}}}"


def test_unrecorded_category_is_named_with_the_fix():
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", TABLE])
    [problem] = [p for p in e.value.problems if "did not record" in p]
    # grpo_kl searches 4 loss_agg_modes; the shipped table recorded token-mean only
    assert "parameters.loss_agg_mode" in problem
    assert "['seq-mean-token-mean', 'seq-mean-token-sum-norm', 'token-sum']" in problem
    assert "holds ['token-mean']" in problem
    assert "'parameters.loss_agg_mode={values: [token-mean]}'" in problem
    assert len(e.value.problems) == 1  # kl_loss_type's 5 values are all recorded


def test_the_suggested_override_validates():
    sweep = load_sweep(REPO / "sweeps/grpo_kl.yaml",
                       ["trainer=tabular", TABLE, "parameters.loss_agg_mode={values: [token-mean]}"])
    assert sweep.parameters["loss_agg_mode"].values == ["token-mean"]
