"""W&B in offline mode on a real sweep: one offline run per trial, grouped by the sweep, id = Ray Tune trial id,
config = the trial's verl overrides (wandb#2812: several trials in one W&B run), named by trial number and
parameters, tagged, with the health verdict and stop reason; offline mode needs no API key (Search-R1#141: offline
W&B on many nodes) and the key never lands in the sweep directory. The Optuna study carries its objectives' names and
the sweep's description.

wandb 0.31 has no Python reader of its run files (``wandb sync --view`` is gone), so :func:`records` reads the
``run-<id>.wandb`` file itself: W&B's LevelDB-log layout (a 7-byte file header, then 32 KiB blocks of records, each
with a 7-byte header: CRC32C, length, type FULL/FIRST/MIDDLE/LAST) holding ``wandb_internal_pb2.Record`` messages."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from wandb.proto import wandb_internal_pb2

from klsweep.cli import main
from klsweep.orchestrate.wandb_logging import wandb_callback
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import sweep_file

pytestmark = pytest.mark.slow

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"
_BLOCK, _FILE_HEADER, _HEADER = 32 * 1024, 7, 7


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    """The Record messages of a W&B run file (LevelDB log format).

    W&B's service process appends to the file while a run is open, and after ``wandb.finish`` returns (see
    :func:`finished_records`): a read can end inside a record, whose header is there but not all of its payload.
    That record and anything after it are left out (the next read gets them); a finished file has no such tail."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pending, pos = [], b"", _FILE_HEADER
    while pos + _HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if pos + _HEADER + length > len(data):  # a record still being written
            break
        payload = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            break
        pending += payload
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def test_offline_needs_no_api_key(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc from `wandb login`
    sweep = load_sweep(sweep_file(tmp_path, "wb", wandb={"mode": "offline"}))
    callback = wandb_callback(sweep, tmp_path / "out")
    callback.setup()  # Ray's WandbLoggerCallback raises "No WandB API key found" here unless told it is offline
    assert (callback.project, callback.group, callback.kwargs["dir"]) == ("wb", "wb", str(tmp_path / "out"))


#: A trial's verl process, as far as W&B goes: verl's own ``Tracking`` (verl/utils/tracking.py) built from the composed
#: ``trainer`` config, as ``RayPPOTrainer.fit`` builds it, logging one step.
VERL_TRACKING = """\
import json, sys
from verl.utils.tracking import Tracking
config = json.load(open(sys.argv[1]))
trainer = config["trainer"]
tracking = Tracking(project_name=trainer["project_name"], experiment_name=trainer["experiment_name"],
                    default_backend=trainer["logger"], config=config)
tracking.log(data={"actor/kl_loss": 0.01}, step=1)
tracking.finish()
"""


def test_verl_never_calls_wandb_init_in_a_trial(tmp_path):
    """Issue 13: with W&B on, verl's own ``trainer.logger`` used to include wandb, so verl called ``wandb.init`` in
    the trial itself, without the sweep's WANDB_MODE or WANDB_DIR: in a trial's environment with no API key every
    trial failed at start (``UsageError: No API key configured``), and online each trial made a second W&B run. The
    sweep's callback is the one W&B run of a trial; verl logs to its console and to the file the launcher reads."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from klsweep.launchers.process import trial_command
    from klsweep.spec.space import trial_overrides
    from klsweep.verl.config import config_dir

    sweep = load_sweep(sweep_file(tmp_path, "wb", trainer="verl", wandb={"mode": "offline"},
                                  overrides={"algorithm.kl_ctrl.type": "fixed", "trainer.n_gpus_per_node": 1},
                                  budget={"resources": {"cpu": 12, "gpu": 1}}))  # verl: 3 CPUs a GPU + 9
    trial_dir = tmp_path / "run_trial_0001"
    argv, env = trial_command(trial_overrides(sweep, {"kl_coef": 0.002}), trainer="verl", trial_dir=trial_dir,
                              base_env={"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")})
    assert not any(k.startswith("WANDB_") for k in env)  # the trial's verl sees no WANDB_MODE, no key
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose("ppo_trainer", overrides=argv[3:], return_hydra_config=True)
    assert list(cfg.trainer.logger) == ["console", "file"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"trainer": OmegaConf.to_container(cfg.trainer, resolve=True)}))
    (trial_dir / "attempt-1").mkdir(parents=True)
    run = subprocess.run([sys.executable, "-c", VERL_TRACKING, str(config)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = (trial_dir / "attempt-1" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1]
    assert not list(tmp_path.rglob("wandb"))  # no W&B run files anywhere


def finished_records(path: Path, timeout_s: float = 60.0) -> list[wandb_internal_pb2.Record]:
    """The records of a run file once W&B's service process has written its ``exit`` record: ``wandb.finish`` in the
    logging actor returns before that process has flushed the file, so a loaded machine can see it half written."""
    deadline = time.monotonic() + timeout_s
    while True:
        recs = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.5)


def test_offline_run_per_trial(ray_local, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_DIR", raising=False)  # run files then go to the sweep directory
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "wb", wandb={"mode": "offline"}, budget={"trials": 2, "max_steps": 2},
                      seed_trials=[{"kl_coef": 0.001}, {"kl_coef": 0.05}])  # 0.05: stopped by beta_high at step 2
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    info = json.loads((out / "sweep.json").read_text())
    study = optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}")
    trial_ids = sorted(t.user_attrs["ray_trial_id"] for t in study.trials)
    assert study.metric_names == ["val-core/arith/acc/mean@1"]  # optuna-dashboard's axis label
    assert study.user_attrs["description"] == (
        "wb: ppo on the embedded trainer, KL in reward; searches algorithm.kl_ctrl.kl_coef; "
        f"max val-core/arith/acc/mean@1; 2 trials × 2 steps; from {path}")

    run_files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    configs = []
    assert sorted(f.stem.removeprefix("run-") for f in run_files) == trial_ids
    for run_file in run_files:
        recs = finished_records(run_file)
        (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"][:1]
        assert run.run_id == run_file.stem.removeprefix("run-") and run.run_group == "wb" and run.project == "wb"
        config = {}
        for r in recs:
            if r.WhichOneof("record_type") == "config":
                config.update({item.key: json.loads(item.value_json) for item in r.config.update})
            if r.WhichOneof("record_type") == "run":
                config.update({item.key: json.loads(item.value_json) for item in r.run.config.update})
        configs.append(config)
        (trial,) = [t for t in study.trials if t.user_attrs["ray_trial_id"] == run.run_id]
        overrides = json.loads(trial.user_attrs["verl_overrides"])
        kl_coef = overrides["algorithm.kl_ctrl.kl_coef"]
        assert run.display_name == f"wb #{trial.number} kl_coef={kl_coef}"
        assert list(run.tags) == ["wb", "ppo", "embedded"]
        assert _value(config, "trial_number") == trial.number
        assert _value(config, "searched") == {"kl_coef": kl_coef}
        assert _value(config, "health") == trial.user_attrs["health"]  # the verdict and reason the study holds
        assert _value(config, "stop_reason") == trial.user_attrs["stop_reason"]
        assert overrides["trainer.logger"] == ["console", "file"]  # this callback is the trial's one W&B run
        for key in ("algorithm.kl_ctrl.kl_coef", "trainer.total_training_steps", "data.train_batch_size"):
            assert _value(config, key) == overrides[key]
        history = [r.history for r in recs if r.WhichOneof("record_type") == "history"]
        rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in h.item} for h in history]
        assert [row["training_iteration"] for row in rows] == [1, 2]  # metrics streamed per step, verl's names
        assert "val-core/arith/acc/mean@1" in rows[1] and "actor/reward_kl_penalty" in rows[0]

    assert {_value(c, "health") for c in configs} == {"healthy", "stopped"}
    for file in out.rglob("*"):
        if file.is_file():
            assert FAKE_KEY.encode() not in file.read_bytes(), file


def _value(config: dict, key: str):
    """A W&B config entry's value (run-file config items are ``{"value": ...}`` or the bare value)."""
    entry = config[key]
    return entry["value"] if isinstance(entry, dict) and "value" in entry else entry


#: β = kl_coef under the fixed controller: above 0.01 from step 4 on, so the rule fires at step 6 (for 3) and the
#: remedy restarts from the checkpoint of step 3 (its evidence began at step 4) with β 0.005, healthy to step 9.
BETA_REMEDY_FOR_3 = {"name": "beta_high", "metric": "actor/reward_kl_penalty_coeff", "above": 0.01, "after": 3,
                     "for": 3, "action": "stop", "kind": "diverged", "remedy": {"kl_coef": "*0.1"}, "max_remedies": 1}


def test_a_remedied_trial_logs_its_restart_to_a_run_of_its_own(ray_local, tmp_path, monkeypatch, capfd):
    """A remedy restarts its trial at step 3 after the trial logged steps 1-6; W&B's step only grows, so with one
    run per trial the restarted steps 4 and 5 were dropped ("Tried to log to step 4 that is less than the current
    step 6") and step 6 kept a mix of both runs. Each segment is now a run of the sweep's group: the first keeps
    steps 1-6 at β 0.05 and the note of the remedy; ``<id>-r1`` has steps 4-9 at β 0.005 and says where it came
    from. Ray's error about the logging actor's restarts (ray#53727) is not printed."""
    monkeypatch.delenv("WANDB_DIR", raising=False)
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "wbr", wandb={"mode": "offline"}, budget={"trials": 1, "max_steps": 9},
                      parameters={"kl_coef": {"values": [0.05]}, "trainer.save_freq": {"values": [1]}},
                      seed_trials=[{"kl_coef": 0.05, "trainer.save_freq": 1}],
                      health={"preset": "default", "rules": [BETA_REMEDY_FOR_3]})
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    assert "_FlushingWandbLoggingActor" not in capfd.readouterr().err
    study = optuna.load_study(study_name="wbr", storage=f"sqlite:///{out / 'study.db'}")
    (trial,) = study.trials
    trial_id = trial.user_attrs["ray_trial_id"]
    [record] = json.loads(trial.user_attrs["remedies"])
    assert (record["step"], record["from_step"], record["new"]) == (6, 3, pytest.approx(0.005))

    runs = {}
    for run_file in (out / "wandb").glob("offline-run-*/run-*.wandb"):
        recs = finished_records(run_file)
        (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
        config = {}
        for r in recs:
            if r.WhichOneof("record_type") in ("config", "run"):
                items = r.config.update if r.WhichOneof("record_type") == "config" else r.run.config.update
                config.update({item.key: json.loads(item.value_json) for item in items})
        rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for r in recs if r.WhichOneof("record_type") == "history"]
        runs[run.run_id] = (run, config, rows)
    assert sorted(runs) == [trial_id, f"{trial_id}-r1"]

    first, config, rows = runs[trial_id]
    beta = "actor/reward_kl_penalty_coeff"
    assert [(row["_step"], row[beta]) for row in rows] == [(step, 0.05) for step in range(1, 7)]
    assert _value(config, "remedy_note") == \
        "remedied: beta_high at step 6: restarted from step 3 with algorithm.kl_ctrl.kl_coef 0.05 → 0.005"
    assert first.display_name == f"wbr #{trial.number} kl_coef=0.05 save_freq=1" and "remedied" not in first.tags

    segment, config, rows = runs[f"{trial_id}-r1"]
    assert [row["_step"] for row in rows] == [4, 5, 6, 7, 8, 9]
    assert [row["training_iteration"] for row in rows] == [4, 5, 6, 7, 8, 9]
    assert [row[beta] for row in rows] == pytest.approx([0.005] * 6)
    assert segment.run_group == "wbr" and list(segment.tags) == ["wbr", "ppo", "embedded", "remedied"]
    assert segment.display_name == f"wbr #{trial.number}-r1 kl_coef=0.005 save_freq=1"
    assert _value(config, "algorithm.kl_ctrl.kl_coef") == pytest.approx(0.005)
    assert (_value(config, "restart"), _value(config, "from_step"), _value(config, "parent_run")) == (1, 3, trial_id)
    assert _value(config, "remedy_schedule") == "1× beta_high@6 from 3 kl_coef 0.05→0.005"
    assert _value(config, "health") == "healthy"


@pytest.mark.fault
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_with_wandb_ends_the_driver_with_its_runs_written(tmp_path, signum, status):
    """Ray's W&B callback waited ``upload_timeout`` (1800 s) at the experiment's end for the logging actor of each
    trial a Ctrl-C or SIGTERM interrupted: that actor was never told to finish its run, and the driver froze without
    a word. Now the driver prints its summary and exits with 130 (Ctrl-C to the process group, as a terminal sends
    it) or 143 (SIGTERM to the driver alone, as SLURM and Kubernetes send it) well within their 30 s grace period
    before SIGKILL (about 8 s measured here on 2 busy cores); the interrupted trial's offline run file is complete
    (it has W&B's ``exit`` record), so ``wandb sync`` uploads it."""
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "wbi", wandb={"mode": "offline"}, parameters={"kl_coef": {"values": [0.001]}},
                      budget={"trials": 1, "max_concurrent": 1, "max_steps": 5000})  # cannot end before the signal
    env = {k: v for k, v in os.environ.items() if k != "WANDB_DIR"}
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env={**env, "RAY_AUTH_MODE": "disabled"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (any(f.stat().st_size for f in out.glob("tune/*/result.json"))
                   and any(out.glob("wandb/offline-run-*/run-*.wandb"))):  # steps reported and logged to W&B
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "the trial did not start logging"
            time.sleep(0.2)
        if signum == signal.SIGINT:
            os.killpg(driver.pid, signal.SIGINT)
        else:
            driver.send_signal(signal.SIGTERM)
        try:  # the grace period SLURM (KillWait) and Kubernetes (terminationGracePeriodSeconds) give by default
            stdout, stderr = driver.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the driver was still running 30 s after the signal")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == status, stdout + stderr
    assert stdout.splitlines()[-1] == f"continue with: sweep resume {out}"
    run_files = list(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert run_files
    for run_file in run_files:  # W&B's service process may still be flushing it as the driver exits
        kinds = [r.WhichOneof("record_type") for r in finished_records(run_file)]
        assert "exit" in kinds and "history" in kinds, run_file
