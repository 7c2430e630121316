"""Launch profiles: names, default Ray addresses, and the shipped cluster files (parsed, and the `sweep run` command
inside each parsed by the CLI's own argument parser)."""

from __future__ import annotations

import re
import shlex
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

from klsweep.cli import _parser
from klsweep.launchers.profiles import PROFILES, ray_address
from klsweep.spec.schema import Sweep

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "launchers"


def sweep_commands(text: str) -> list[list[str]]:
    """Every ``sweep run ...`` command in ``text`` as argv, shell variables replaced by a placeholder word."""
    commands = []
    for match in re.finditer(r"\bsweep run [^\n']+", text):
        line = match.group(0).replace('"$@"', "")
        line = re.sub(r"\$\(.*?\)|\$\{?\w+\}?", "VAR", line)
        commands.append(shlex.split(line))
    return commands


def parse_run(argv: list[str]):
    assert argv[:2] == ["sweep", "run"], argv
    return _parser().parse_args(argv[1:])


def test_profile_names_match_the_sweep_file_schema():
    assert set(PROFILES) == set(typing.get_args(Sweep.model_fields["launcher"].annotation))
    for profile in PROFILES.values():
        assert profile.file is None or (LAUNCHERS / profile.file).is_file()


def test_ray_address_defaults():
    assert ray_address("local") is None
    assert [ray_address(name) for name in ("ray-cluster", "kuberay", "slurm")] == ["auto"] * 3
    assert ray_address("local", "10.0.0.1:6379") == "10.0.0.1:6379"
    with pytest.raises(ValueError, match="local, ray-cluster, kuberay, slurm"):
        ray_address("k8s")


def test_ray_cluster_yaml_is_a_valid_cluster_launcher_config():
    from ray.autoscaler._private.util import prepare_config, validate_config

    text = (LAUNCHERS / "ray-cluster.yaml").read_text()
    config = yaml.safe_load(text)
    validate_config(prepare_config(config))  # what `ray up` does: defaults filled in, then Ray's own schema
    assert any(c.startswith("RAY_AUTH_MODE=disabled ray start --head --port=6379")
               for c in config["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=disabled ray start --address=$RAY_HEAD_IP:6379" in config["worker_start_ray_commands"]
    assert any("[gpu]" in c for c in config["setup_commands"])
    (run,) = sweep_commands(text)
    args = parse_run(run)
    assert (args.launcher, args.address) == ("ray-cluster", "auto")


def test_kuberay_yaml_is_a_rayjob_running_the_sweep():
    job = yaml.safe_load((LAUNCHERS / "kuberay.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    args = parse_run(shlex.split(job["spec"]["entrypoint"]))
    assert (args.launcher, args.address) == ("kuberay", "auto")
    cluster = job["spec"]["rayClusterSpec"]
    (worker,) = cluster["workerGroupSpecs"]
    container = worker["template"]["spec"]["containers"][0]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) > 0
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    head_mounts = {m["mountPath"] for m in head["volumeMounts"]}
    runs = "/" + args.out.strip("/").split("/")[0]
    assert runs in mounts and runs in head_mounts  # results on a volume every pod shares


def test_slurm_sbatch_starts_ray_then_the_sweep():
    path = LAUNCHERS / "slurm.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert "#SBATCH --gpus-per-node=" in text
    head = text.index("ray start --head")
    worker = text.index('ray start --address="$HEAD_IP:$PORT"')
    (run,) = sweep_commands(text)
    args = parse_run(run)
    assert args.launcher == "slurm" and args.address == "VAR:VAR"
    assert head < worker < text.index("sweep run")


def test_every_profile_sets_ray_auth_mode_for_ray_start_and_the_driver():
    """Ray 2.60 turns token auth on for a new local Ray, or a `ray start` on a node with a token file, when
    RAY_AUTH_MODE is unset: every cluster file sets it where Ray starts and where the sweep driver runs."""
    text = (LAUNCHERS / "ray-cluster.yaml").read_text()
    config = yaml.safe_load(text)
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=disabled ray start ") for c in starts)
    assert "RAY_AUTH_MODE=disabled sweep run " in text

    cluster = yaml.safe_load((LAUNCHERS / "kuberay.yaml").read_text())["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]  # the head runs the driver (the entrypoint)
    for pod in pods:
        for container in pod["template"]["spec"]["containers"]:
            assert {"name": "RAY_AUTH_MODE", "value": "disabled"} in container["env"], container["name"]

    script = (LAUNCHERS / "slurm.sbatch").read_text()
    export = script.index("export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}")
    assert export < script.index("ray start --head") and export < script.index("sweep run")
    out = subprocess.run(["bash", "-c", script[export:].splitlines()[0] + '; echo "$RAY_AUTH_MODE"'],
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "disabled"


def test_gpu_smoke_script_parses():
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_smoke.sh")], check=True)


@pytest.mark.slow
def test_gpu_smoke_sweep_passes_preflight(tmp_path):
    """The GPU smoke sweep loads, and both trials pass preflight against the installed verl 0.9.1 with no warning
    (they checkpoint at klsweep's default cadence); with the overrides benchmarks/gpu_smoke.sh adds, two trials
    share the one GPU."""
    import pandas as pd

    from klsweep.spec.load import load_sweep
    from klsweep.spec.space import seed_params, trial_overrides
    from klsweep.verl.preflight import preflight

    text = (REPO / "benchmarks" / "gpu_smoke.yaml").read_text()
    path = tmp_path / "gpu_smoke.yaml"
    model, data = tmp_path / "qwen", tmp_path / "data"  # as gpu_smoke.sh makes them: preflight reads them
    model.mkdir()
    data.mkdir()
    for name, rows in (("train.parquet", 256), ("test.parquet", 32)):  # gpu_smoke.sh's sizes
        pd.DataFrame({"data_source": ["openai/gsm8k"] * rows, "ability": ["math"] * rows}).to_parquet(data / name)
    path.write_text(text.replace("@MODEL@", str(model)).replace("@DATA@", str(data)))
    sweep = load_sweep(path, ["budget.max_steps=3"])
    assert sweep.trainer == "verl" and sweep.budget.trials == 2 and sweep.budget.resources.gpu == 1
    trials = [trial_overrides(sweep, p) for p in seed_params(sweep)]
    assert [t["actor_rollout_ref.actor.kl_loss_coef"] for t in trials] == [0.001, 0.01]
    for overrides in trials:
        assert preflight(overrides, runs_verl=True) == []
        assert overrides["trainer.total_training_steps"] == 3
    script = (REPO / "benchmarks" / "gpu_smoke.sh").read_text()
    shared = load_sweep(path, ["budget.max_concurrent=2", "budget.resources.gpu=0.5", "budget.resources.cpu=12"])
    assert all(f"{arg}" in script for arg in ("budget.max_concurrent=2", "budget.resources.gpu=0.5"))
    assert shared.budget.max_concurrent * shared.budget.resources.gpu == 1


EXAMPLE = "sweeps/verl_gsm8k_grpo.yaml"
PROFILE_FILES = ["README.md", "kuberay.yaml", "ray-cluster.yaml", "slurm.sbatch"]


@pytest.mark.parametrize("name", PROFILE_FILES)
def test_every_launcher_file_runs_the_example_verl_sweep_that_exists(name):
    text = (LAUNCHERS / name).read_text()
    assert (REPO / EXAMPLE).is_file()
    assert EXAMPLE in text
    assert re.findall(r"sweeps/[\w.-]+\.yaml", text) and all(
        (REPO / f).is_file() for f in re.findall(r"sweeps/[\w.-]+\.yaml", text)), name
    if name.endswith(".md"):  # the commands are the table's code spans (the prose also says `sweep run FILE`)
        text = "\n".join(re.findall(r"`([^`\n]*sweep run [^`\n]*)`", text)).replace("'", " ")
    commands = sweep_commands(text)
    assert commands
    for argv in commands:
        sweep_file = parse_run(argv).sweep_file
        assert sweep_file in ("VAR", "FILE") or sweep_file.endswith(EXAMPLE), (name, argv)


def test_the_example_sweep_reads_its_data_and_model_from_the_shared_path_the_profiles_mount():
    from klsweep.spec.load import load_sweep

    sweep = load_sweep(REPO / EXAMPLE)
    assert sweep.trainer == "verl"
    paths = [sweep.overrides[k] for k in ("data.train_files", "data.val_files", "actor_rollout_ref.model.path")]
    assert all(p.startswith("/shared/") for p in paths), paths  # absolute: verl does not expand ~
    job = yaml.safe_load((LAUNCHERS / "kuberay.yaml").read_text())
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [w["template"]["spec"] for w in
                                                             cluster["workerGroupSpecs"]]
    claims = set()
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/shared"]
            claims.add(volumes[mount["name"]]["persistentVolumeClaim"]["claimName"])
    assert claims == {"klsweep-shared"}  # one claim, at the same path on every pod
    args = parse_run(shlex.split(job["spec"]["entrypoint"]))
    assert args.sweep_file == "/klsweep/" + EXAMPLE and args.out.startswith("/shared/")
    text = (LAUNCHERS / "kuberay.yaml").read_text()
    assert "/shared/data/gsm8k" in text and "/shared/models/Qwen2.5-0.5B-Instruct" in text


def test_a_kuberay_gpu_pod_holds_a_trial_per_gpu_of_the_example_sweep():
    from klsweep.spec.load import load_sweep

    sweep = load_sweep(REPO / EXAMPLE)
    (worker,) = yaml.safe_load((LAUNCHERS / "kuberay.yaml").read_text())["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    trials = int(limits["nvidia.com/gpu"]) / sweep.budget.resources.gpu
    assert trials == sweep.budget.max_concurrent == 8
    assert float(limits["cpu"]) >= trials * sweep.budget.resources.cpu  # 8 x 12


def test_slurm_ray_steps_ask_for_the_nodes_cpus_and_gpus():
    """srun does not inherit --cpus-per-task from sbatch (SLURM >= 22.05) and a step without a GPU option sees no
    GPU: every srun that starts Ray asks for both."""
    text = (LAUNCHERS / "slurm.sbatch").read_text()
    steps = re.findall(r"^\s*srun ((?:[^\n]*\\\n)*[^\n]*)", text, flags=re.M)
    ray_steps = [shlex.split(step.replace("\\\n", " ")) for step in steps if "ray start" in step]
    assert len(ray_steps) == 2
    for argv in ray_steps:
        assert '--cpus-per-task=$CPUS' in argv and '--gpus-per-task=$GPUS' in argv, argv
    assert "#SBATCH --cpus-per-task=" in text and "#SBATCH --gpus-per-node=" in text
    start = text.index("GPUS=${SLURM_GPUS_PER_NODE:-8}")
    block = "\n".join(text[start:].splitlines()[:3])
    for given, want in (("h100:8", "8 16"), ("4", "4 16"), ("", "8 16")):
        env = {"PATH": "/usr/bin:/bin", "SLURM_CPUS_PER_TASK": "16"}
        if given:
            env["SLURM_GPUS_PER_NODE"] = given
        out = subprocess.run(["bash", "-c", block + '; echo "$GPUS $CPUS"'], env=env, capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == want, given
