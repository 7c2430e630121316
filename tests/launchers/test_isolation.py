"""Two verl trials on one host: never the same weight-sync socket, never two vLLM start-ups at once on a GPU.

The stand-in (``fake_trainer.py``) names its socket as verl 0.9.1 does, from the job id of the Ray it starts, and
models vLLM's start-up profiling window (its docstring cites verl's and vLLM's files)."""

from __future__ import annotations

import json
import socket
import threading
import uuid

import pytest

from klsweep.launchers import isolation
from klsweep.launchers.failures import TrialFailed
from klsweep.launchers.process import attempt_dir, run_process_trial

from .conftest import ran, wait_for


def _run_together(runs):
    """Run each ``(overrides, trial_dir, kwargs)`` in its own thread; ``{trial_dir: steps reported or exception}``."""
    results = {}

    def one(overrides, trial_dir, kwargs):
        seen = []
        try:
            run_process_trial(overrides, trainer="verl", trial_dir=trial_dir, report=lambda m: seen.append(m["step"]),
                              **kwargs)
            results[trial_dir] = seen
        except Exception as e:  # the test asserts on it
            results[trial_dir] = e

    threads = [threading.Thread(target=one, args=run) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.fixture
def locks(tmp_path, monkeypatch):
    """Lock files and private /tmp folders of this test in its own folder."""
    folder = tmp_path / "locks"
    folder.mkdir()
    monkeypatch.setenv(isolation.LOCK_DIR_ENV, str(folder))
    isolation._working_variant.cache_clear()
    yield folder
    isolation._working_variant.cache_clear()


@pytest.mark.slow
def test_two_verl_trials_on_one_host_never_share_a_weight_sync_socket(verl_standin, tmp_path, locks):
    """Each trial starts its own real Ray, whose first job id is 01000000 on any host, so both name the same socket
    path; they sync at the same time (the rendezvous) and hold it most of each step. They succeed only when each
    sees its own /tmp; a host that gives none refuses the second trial, naming the reason."""
    meet = tmp_path / "meet"
    meet.mkdir()
    overrides = {"trainer.total_training_steps": 6, "weight_sync": 0.15, "interval": 0.01, "rendezvous": str(meet)}
    a, b = tmp_path / "a", tmp_path / "b"
    results = _run_together([(overrides, a, {}), (overrides, b, {})])

    paths = {json.loads(f.read_text())["path"] for d in (a, b) for f in d.glob("attempt-*/socket.json")}
    assert paths == {"/tmp/rl-colocate-zmq-01000000-replica-0-rank-0.sock"}
    if isolation.private_tmp_available()[0]:
        assert results == {a: [1, 2, 3, 4, 5, 6], b: [1, 2, 3, 4, 5, 6]}
    else:
        refused = [e for e in results.values() if isinstance(e, TrialFailed)]
        assert len(refused) == 1 and refused[0].kind == "config", results
        assert "another verl trial runs on this host" in refused[0].message


def test_without_a_private_tmp_a_second_verl_trial_is_refused(verl_standin, tmp_path, locks, monkeypatch):
    """The host's slot is taken before the first trial's process starts (its supervisor.json), so the stand-in needs
    no Ray here."""
    monkeypatch.setenv(isolation.PRIVATE_TMP_ENV, "0")
    first = tmp_path / "first"
    overrides = {"trainer.total_training_steps": 30, "interval": 0.1, "own_ray": 0}
    thread = threading.Thread(target=run_process_trial, args=(overrides,),
                              kwargs={"trainer": "verl", "trial_dir": first, "report": lambda m: None})
    thread.start()
    try:
        wait_for(attempt_dir(first, 1) / "supervisor.json", timeout=60)
        with pytest.raises(TrialFailed) as refused:
            run_process_trial({"trainer.total_training_steps": 2, "own_ray": 0}, trainer="verl",
                              trial_dir=tmp_path / "second",
                              report=lambda m: None)
    finally:
        thread.join(60)
    assert refused.value.kind == "config"
    message = refused.value.message
    assert f"trial {first}" in message and "KLSWEEP_PRIVATE_TMP=0 is set" in message
    assert "01000000" in message and "Fix: run one verl trial per node" in message
    assert json.loads((tmp_path / "second" / "failure.json").read_text())["kind"] == "config"
    assert not (attempt_dir(tmp_path / "second", 1) / "supervisor.json").exists()  # never started
    assert (attempt_dir(first, 1) / "exit.json").exists()
    assert json.loads((attempt_dir(first, 1) / "exit.json").read_text())["returncode"] == 0


def test_engines_sharing_a_gpu_never_start_together(verl_standin, tmp_path, locks, monkeypatch):
    """Two trials on one GPU, both ready to start their engine at once (the rendezvous): the second process starts
    only after the first one's first step, so their start-up windows never overlap and neither fails vLLM's
    profiling assertion. A trial on another GPU is not held back: its window overlaps."""
    monkeypatch.setenv("FAKE_GPU_DIR", str(tmp_path / "gpus"))
    meet = tmp_path / "meet"
    meet.mkdir()
    gpu, other = f"test-{uuid.uuid4().hex[:8]}", f"test-{uuid.uuid4().hex[:8]}"
    overrides = {"trainer.total_training_steps": 2, "engine_start": 1.0, "own_ray": 0, "rendezvous": str(meet),
                 "rendezvous_s": 3}
    runs = [(overrides, tmp_path / name, {"gpu_ids": [g]}) for name, g in (("a", gpu), ("b", gpu), ("c", other))]
    results = _run_together(runs)

    assert results == {tmp_path / name: [1, 2] for name in "abc"}
    windows = [json.loads(line) for line in (tmp_path / "gpus" / "windows.jsonl").read_text().splitlines()]
    shared = sorted((w for w in windows if w["gpu"] == gpu), key=lambda w: w["start"])
    assert len(shared) == 2 and shared[0]["end"] <= shared[1]["start"]
    alone = next(w for w in windows if w["gpu"] == other)
    assert any(w["start"] < alone["end"] and alone["start"] < w["end"] for w in shared)


@pytest.mark.slow
def test_the_dashboard_agent_of_a_trials_own_ray_gets_a_free_port(verl_standin, tmp_path, locks):
    """Port 52365, every Ray's default for its dashboard agent, is taken (by this test when nothing on the host holds
    it yet, as the sweep's own Ray would): the trial's Ray still binds its agent, on another port."""
    holder = socket.socket()
    try:
        holder.bind(("0.0.0.0", 52365))
        holder.listen(1)
    except OSError:
        pass  # another Ray on this host holds it already
    try:
        run_process_trial({"trainer.total_training_steps": 1, "agent_port": 1}, trainer="verl", trial_dir=tmp_path,
                          report=lambda m: None)
    finally:
        holder.close()
    (run,) = ran(tmp_path)  # a slow Ray start is started again as a new attempt
    port = json.loads((run / "agent.json").read_text())["port"]
    assert port not in (None, -1, 52365) and port > 0
