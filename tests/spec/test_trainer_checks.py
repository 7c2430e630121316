"""The trainer's checks: a verl trial's GPUs, a tabular sweep's table, and fate stopping's signals.

trainer: verl sweeps reserve exactly the GPUs verl asks for: budget.resources.gpu = trainer.n_gpus_per_node (verl's
default is 8) on one node per trial; a multi-node trial (trainer.nnodes > 1) is a Ray job that reserves its own GPUs,
so its actor reserves none. `sweep validate` of a tabular
sweep: a table recorded for another sweep, and searched categories the table did not record, are errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from klsweep.verl.config import config_dir
from klsweep.verl.late_failures import CPUS_PER_GPU

REPO = Path(__file__).resolve().parents[2]


def _problems(path, *cli) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path, list(cli))
    return e.value.problems


def test_verls_default_eight_gpus_per_node_against_one_reserved_gpu(sweep_file):
    path = sweep_file("trainer: verl\nbudget: {trials: 2, resources: {cpu: 33, gpu: 1}}\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:5: budget.resources.gpu: budget.resources.gpu is 1 but each verl trial uses "
                              "trainer.nnodes × trainer.n_gpus_per_node = 1 × 8 = 8 GPUs (n_gpus_per_node 8 is "
                              "verl's default)")
    assert "Total available GPUs 1 is less than total desired GPUs 8" in problem
    assert problem.endswith("Set budget.resources.gpu: 8, or trainer.n_gpus_per_node: 1 in overrides")


def test_no_gpu_reserved_for_a_verl_trial(sweep_file):
    (problem,) = _problems(sweep_file("trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 2\n"),
                           "budget.resources.cpu=15")
    assert "budget.resources.gpu is 0 but each verl trial uses" in problem and "1 × 2 = 2 GPUs" in problem
    assert "(n_gpus_per_node 2 is set in overrides)" in problem and "Set budget.resources.gpu: 2" in problem


def test_more_gpus_reserved_than_verl_uses(sweep_file):
    path = sweep_file("trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 4\n")
    (problem,) = _problems(path, "budget.resources.gpu=8", "budget.resources.cpu=21")
    assert "4 of the reserved GPUs would sit idle in every trial" in problem


@pytest.mark.parametrize("gpus, per_node", [(1, 1), (4, 4), (0.5, 1), (8, None)])
def test_matching_gpus_pass(sweep_file, gpus, per_node):
    text = "trainer: verl\n" + (f"overrides:\n  trainer.n_gpus_per_node: {per_node}\n" if per_node else "")
    if gpus < 1:  # two trials on one GPU: their vLLM engines' shares fit (test_late_failures)
        text += "  actor_rollout_ref.rollout.gpu_memory_utilization: 0.4\n"
    cpus = 3 * (per_node or 8) + 9  # verl's own Ray: 3 per GPU + TransferQueue's 9
    sweep = load_sweep(sweep_file(text), [f"budget.resources.gpu={gpus}", f"budget.resources.cpu={cpus}"])
    assert sweep.budget.resources.gpu == gpus


def test_a_multi_node_trial_reserves_no_gpu_for_its_own_actor(sweep_file):
    path = sweep_file("trainer: verl\noverrides:\n  trainer.nnodes: 2\n  trainer.n_gpus_per_node: 8\n")
    (problem,) = _problems(path, "budget.resources.gpu=16", "budget.resources.cpu=1")
    assert problem.startswith("command line 'budget.resources.gpu=16': budget.resources.gpu: budget.resources.gpu "
                              "is 16 but a trial of "
                              "trainer.nnodes=2 is one Ray job on the sweep's cluster, and verl reserves its 2 × 8 "
                              "GPUs itself with one placement group per node")
    assert problem.endswith("Set budget.resources.gpu: 0 (klsweep caps budget.max_concurrent to the trials the "
                            "cluster holds)")
    # no GPU for the actor, and no CPUs of a trial's own Ray: the job's CPUs are the cluster's (sweep run checks)
    sweep = load_sweep(path, ["budget.resources.gpu=0", "budget.resources.cpu=1"])
    assert sweep.overrides["trainer.nnodes"] == 2


def test_a_multi_node_trial_cannot_start_its_own_ray(sweep_file):
    path = sweep_file("trainer: verl\noverrides:\n  trainer.nnodes: 2\n  trainer.n_gpus_per_node: 1\n"
                      "  +ray_kwargs.ray_init.address: local\n")
    (problem,) = _problems(path, "budget.resources.gpu=0")
    assert "ray_kwargs.ray_init.address=local starts a private one-node Ray, but trainer.nnodes=2 needs the " \
           "sweep's cluster" in problem and problem.endswith("Remove the key")


def test_gpu_count_is_not_a_hyperparameter(sweep_file):
    path = sweep_file("trainer: verl\nparameters:\n  trainer.n_gpus_per_node: {values: [1, 2]}\n")
    (problem,) = _problems(path, "budget.resources.gpu=1", "budget.resources.cpu=12")
    assert "parameters.trainer.n_gpus_per_node: trainer.n_gpus_per_node is searched" in problem


def test_the_embedded_trainer_reserves_no_gpu(sweep_file):
    assert load_sweep(sweep_file("budget: {trials: 2, resources: {cpu: 1, gpu: 0}}\n")).budget.resources.gpu == 0


def test_gpu_smoke_sweep_validates():
    """benchmarks/gpu_smoke.yaml: one GPU per trial and verl's attention without flash-attn (klsweep[gpu] does not
    install it), the CPUs of verl's own Ray, so `sweep validate` passes on any machine with absolute paths in place
    of the placeholders."""
    import io

    from klsweep.orchestrate.plan import validate

    out = io.StringIO()
    filled = [f"overrides.data.train_files={REPO}/data/train.parquet",  # as gpu_smoke.sh fills @DATA@ and @MODEL@
              f"overrides.data.val_files={REPO}/data/test.parquet", f"overrides.actor_rollout_ref.model.path={REPO}/m"]
    assert validate(str(REPO / "benchmarks" / "gpu_smoke.yaml"), filled, out=out) == 0, out.getvalue()


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


def _table(name: str) -> str:
    return f"tabular={{table: {REPO / 'benchmarks/tabular' / name}}}"


def test_another_sweeps_table_is_one_problem_naming_what_it_was_recorded_for_and_the_right_table():
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", _table("aggressive.jsonl.gz")])
    [problem] = e.value.problems  # not also the categorical check, not a failure per trial at run time
    assert "tabular.table: " in problem
    assert ("aggressive.jsonl.gz was recorded for sweep 'aggressive' (sweeps/aggressive.yaml), which searches "
            "algorithm.kl_ctrl.kl_coef, algorithm.kl_ctrl.target_kl, algorithm.kl_ctrl.horizon, but this sweep "
            "searches actor_rollout_ref.actor.kl_loss_coef, actor_rollout_ref.actor.kl_loss_type, "
            "actor_rollout_ref.actor.loss_agg_mode") in problem
    assert problem.endswith("Fix: use benchmarks/tabular/grpo_kl.jsonl.gz") or problem.endswith(
        f"Fix: use {REPO / 'benchmarks/tabular/grpo_kl.jsonl.gz'}")


def test_same_keys_but_no_searched_category_recorded_names_the_fitting_table():
    # conservative and aggressive search the same three keys; aggressive's table recorded horizon 20000 only
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/conservative.yaml", ["trainer=tabular", _table("aggressive.jsonl.gz")])
    [problem] = e.value.problems
    assert "none of the values this sweep searches for horizon ([500, 1000, 2500, 5000]) was recorded" in problem
    assert "(it holds [20000])" in problem
    assert problem.endswith("conservative.jsonl.gz")  # the one table of the folder that fits
    assert "aggressive.jsonl.gz or" not in problem


def test_a_live_training_setting_other_than_the_recorded_one_is_refused_and_an_inert_or_bookkeeping_one_is_not():
    narrowed = "parameters.loss_agg_mode={values: [token-mean]}"
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", _table("grpo_kl.jsonl.gz"), narrowed,
                                                 "overrides.actor_rollout_ref.actor.entropy_coeff=0.01"])
    [problem] = e.value.problems
    assert "its runs were recorded with actor_rollout_ref.actor.entropy_coeff=0 (this sweep: 0.01)" in problem
    assert "Fix: generate a table from this sweep file (benchmarks/tabular/generate.py" in problem
    # another name and fewer steps: the same recorded runs serve it (steps 1..20 of each)
    sweep = load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", _table("grpo_kl.jsonl.gz"), narrowed,
                                                     "name=other", "budget.max_steps=20"])
    assert sweep.name == "other" and sweep.budget.max_steps == 20


def test_cpus_below_what_verls_own_ray_reserves(sweep_file):
    """3 CPUs per GPU bundle (verl's ResourcePoolManager.max_colocate_count) + TransferQueue's controller and
    storage units (transfer_queue.backend.SimpleStorage.num_data_storage_units, 8 by default), read here from verl's
    YAML: 33 for an 8-GPU trial, 12 for one GPU."""
    units = yaml.safe_load((Path(config_dir()) / "transfer_queue" / "transfer_queue.yaml").read_text())["backend"][
        "SimpleStorage"]["num_data_storage_units"]
    assert units == 8
    path = sweep_file("trainer: verl\n")
    (problem,) = _problems(path, "budget.resources.gpu=8", "budget.resources.cpu=32")
    assert problem.startswith(f"command line 'budget.resources.cpu=32': budget.resources.cpu: budget.resources.cpu "
                              f"is 32 but each verl trial's own Ray reserves {3 * 8 + 1 + units} CPUs (3 per GPU × 8 "
                              f"+ TransferQueue's controller and {units} storage units"), problem
    assert "verl waits for its placement groups for ever, silently" in problem
    assert problem.endswith("Set budget.resources.cpu: 33")
    assert load_sweep(path, ["budget.resources.gpu=8", "budget.resources.cpu=33"]).budget.resources.cpu == 33
    # fewer storage units need fewer CPUs; verl's own Ray given fewer CPUs than it reserves hangs too
    fewer = "overrides:\n  transfer_queue.backend.SimpleStorage.num_data_storage_units: 2\n" \
            "  trainer.n_gpus_per_node: 1\n  ray_kwargs.ray_init.num_cpus: 4\n"
    (problem,) = _problems(sweep_file("trainer: verl\n" + fewer), "budget.resources.gpu=1", "budget.resources.cpu=6")
    assert problem.startswith(f"{path}:8: overrides.ray_kwargs.ray_init.num_cpus: ray_kwargs.ray_init.num_cpus=4 "
                              "gives the trial's own Ray fewer CPUs than verl reserves in it (6: "), problem


def test_trials_sharing_a_gpu_with_verls_default_vllm_memory(sweep_file):
    """Two trials on one GPU (0.5 each, 2 at once) with verl's default gpu_memory_utilization (read from verl's
    rollout.yaml): the engines ask for the whole GPU; 0.4 each fits, as does one trial at a time."""
    default = yaml.safe_load((Path(config_dir()) / "rollout" / "rollout.yaml").read_text())["gpu_memory_utilization"]
    assert default == 0.5
    path = sweep_file("trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 1\n")
    cli = ["budget.resources.gpu=0.5", "budget.max_concurrent=2", "budget.resources.cpu=12"]
    (problem,) = _problems(path, *cli)
    key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    assert problem.startswith(f"command line 'budget.resources.gpu=0.5': budget.resources.gpu: {key} is 0.5 (verl's "
                              "default) and budget.resources.gpu is 0.5: up to 2 trials share one GPU "
                              "(budget.max_concurrent 2), whose vLLM engines ask for 2 × 0.5 = 1 of its "
                              "memory"), problem
    assert problem.endswith(f"Set {key}: 0.4 in overrides (0.8 / 2 trials), or give each trial a whole GPU "
                            "(budget.resources.gpu: 1)")
    assert load_sweep(path, cli + [f"overrides.{key}=0.4"])
    assert load_sweep(path, cli[:1] + ["budget.max_concurrent=1", "budget.resources.cpu=12"])
    # a quarter GPU each, 4 at once: 0.2 each at most; a searched value is judged at its largest
    (searched,) = _problems(sweep_file("trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 1\nparameters:\n"
                                       f"  {key}: {{values: [0.1, 0.3]}}\n"),
                            "budget.resources.gpu=0.25", "budget.max_concurrent=4", "budget.resources.cpu=12")
    assert f"parameters.{key}: {key} is 0.3 and budget.resources.gpu is 0.25: up to 4 trials" in searched
    assert f"Set {key}: 0.2 in overrides" in searched


@pytest.mark.slow  # imports verl's single controller and TransferQueue (~10 s)
def test_the_cpu_figures_are_verls_own():
    """3 CPUs a GPU is verl's ResourcePoolManager.max_colocate_count (each GPU bundle is {"CPU": 3, "GPU": 1}), and
    TransferQueue's controller and each storage unit are Ray actors of one CPU."""
    from transfer_queue.controller import TransferQueueController
    from transfer_queue.storage.simple_storage import SimpleStorageUnit
    from verl.single_controller.ray.base import ResourcePoolManager

    assert CPUS_PER_GPU == ResourcePoolManager.max_colocate_count == 3
    assert TransferQueueController._default_options["num_cpus"] == SimpleStorageUnit._default_options["num_cpus"] == 1


FATE_ON_GAP = "stopping:\n  fate: {signals: [proxy_gap]}\n"
VERL_ONE_GPU = "trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 1\nbudget: {resources: {cpu: 12, gpu: 1}}\n"


def test_fate_on_proxy_gap_alone_is_refused_where_the_trainer_logs_no_gold_score(sweep_file):
    # proxy_gap = critic/score/mean − embedded/gold_score/mean: verl's main_ppo logs verl's metrics, no gold score
    path = sweep_file(VERL_ONE_GPU + FATE_ON_GAP)  # the fate line is line 9 (3 header lines)
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:9: stopping.fate.signals: signals [proxy_gap], but the verl trainer logs no "
                              "gold score (proxy_gap is critic/score/mean − embedded/gold_score/mean")
    assert problem.endswith("Use signals: [kl] (the reference KL of kl_placement loss), or turn stopping.fate off")
    # the fix validates; kl and proxy_gap together read the kl where proxy_gap is not logged
    assert load_sweep(path, ["stopping.fate.signals=[kl]"]).stopping.fate.signals == ["kl"]
    assert load_sweep(path, ["stopping.fate.signals=[kl, proxy_gap]"]).stopping.fate is not None
    # without a reference KL either, no signal is left: the default signals are refused too
    (neither,) = _problems(path, "kl_placement=none", "stopping.fate=on")
    assert "signals [kl, proxy_gap] on a sweep without a reference KL (kl_placement none), and the verl trainer " \
           "logs no gold score" in neither and neither.endswith("Set kl_placement: loss or reward, or turn "
                                                                 "stopping.fate off")


def test_fate_on_proxy_gap_alone_passes_where_the_trainer_logs_both_scores(sweep_file):
    assert load_sweep(sweep_file(FATE_ON_GAP)).stopping.fate.signals == ["proxy_gap"]  # the embedded trainer
    # a table of embedded runs holds both scores
    sweep = load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", TABLE, "parameters.loss_agg_mode={values: "
                                                      "[token-mean]}", "stopping={fate: {signals: [proxy_gap]}}"])
    assert sweep.stopping.fate.signals == ["proxy_gap"]


def test_a_replayed_log_is_judged_by_the_scores_it_holds(sweep_file, tmp_path):
    verl_log = REPO / "tests/data/traces/grpo_no_signal.jsonl"  # verl's metrics: critic/score/mean, no gold score
    (problem,) = _problems(sweep_file(f"trainer: replay\nreplay: {{trace: {verl_log}}}\n" + FATE_ON_GAP))
    assert f"signals [proxy_gap], but the replayed log {verl_log} holds no gold score" in problem
    embedded_log = tmp_path / "embedded.jsonl"
    embedded_log.write_text('{"step": 1, "data": {"critic/score/mean": 0.6, "embedded/gold_score/mean": 0.5}}\n')
    sweep = load_sweep(sweep_file(f"trainer: replay\nreplay: {{trace: {embedded_log}}}\n" + FATE_ON_GAP))
    assert sweep.stopping.fate.signals == ["proxy_gap"]


def test_a_remedy_of_an_optimizer_key_is_refused_on_verl_whose_checkpoint_restores_it(sweep_file):
    """verl's checkpoint load restores the optimizer's param groups (lr among them) and the lr scheduler, so a
    restarted verl run keeps the checkpoint's lr (FSDPCheckpointManager.load_checkpoint in
    verl/utils/checkpoint/fsdp_checkpoint_manager.py). The embedded trainer sets it again after its load."""
    import inspect

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    loads = inspect.getsource(FSDPCheckpointManager.load_checkpoint)
    assert "self.optimizer.load_state_dict(" in loads and "self.lr_scheduler.load_state_dict(" in loads
    rules = ("health:\n  preset: default\n  rules:\n    - {name: lr_down, metric: ref_kl, above: 0.5, action: stop, "
             "remedy: {actor_rollout_ref.actor.optim.lr: '*0.5'}}\n")
    (problem,) = _problems(sweep_file(VERL_ONE_GPU + rules))
    assert "health.rules.0.remedy.actor_rollout_ref.actor.optim.lr: the remedy changes actor_rollout_ref.actor." \
           "optim.lr, which a verl run restarted from its checkpoint does not take" in problem
    assert "Prescribe a KL knob" in problem
    assert load_sweep(sweep_file(rules)).health.rules[0].remedy  # the embedded trainer takes it
    assert load_sweep(sweep_file(VERL_ONE_GPU + rules.replace("actor_rollout_ref.actor.optim.lr", "kl_coef")))
