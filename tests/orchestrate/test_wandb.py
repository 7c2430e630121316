"""W&B in offline mode on a real sweep: one offline run per trial, grouped by the sweep, id = Ray Tune trial id,
config = the trial's verl overrides (wandb#2812: several trials in one W&B run); offline mode needs no API key
(Search-R1#141: offline W&B on many nodes) and the key never lands in the sweep directory.

wandb 0.31 has no Python reader of its run files (``wandb sync --view`` is gone), so :func:`records` reads the
``run-<id>.wandb`` file itself: W&B's LevelDB-log layout (a 7-byte file header, then 32 KiB blocks of records, each
with a 7-byte header: CRC32C, length, type FULL/FIRST/MIDDLE/LAST) holding ``wandb_internal_pb2.Record`` messages."""

from __future__ import annotations

import json
import struct
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
    """The Record messages of a W&B run file (LevelDB log format)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pending, pos = [], b"", _FILE_HEADER
    while pos + _HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
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
                      seed_trials=[{"kl_coef": 0.001}, {"kl_coef": 0.002}])
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    info = json.loads((out / "sweep.json").read_text())
    study = optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}")
    trial_ids = sorted(t.user_attrs["ray_trial_id"] for t in study.trials)

    run_files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
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
        (trial,) = [t for t in study.trials if t.user_attrs["ray_trial_id"] == run.run_id]
        overrides = json.loads(trial.user_attrs["verl_overrides"])
        for key in ("algorithm.kl_ctrl.kl_coef", "trainer.total_training_steps", "data.train_batch_size"):
            value = config[key]["value"] if isinstance(config[key], dict) and "value" in config[key] else config[key]
            assert value == overrides[key]
        history = [r.history for r in recs if r.WhichOneof("record_type") == "history"]
        rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in h.item} for h in history]
        assert [row["training_iteration"] for row in rows] == [1, 2]  # metrics streamed per step, verl's names
        assert "val-core/arith/acc/mean@1" in rows[1] and "actor/reward_kl_penalty" in rows[0]

    for file in out.rglob("*"):
        if file.is_file():
            assert FAKE_KEY.encode() not in file.read_bytes(), file
