"""``benchmarks/gpu_smoke.sh`` end to end on CPU, against the stand-ins of ``tests/standins/``.

Every line of the script runs: ``python -m verl.trainer.main_ppo`` is the stand-in ``verl_main_ppo.py`` (through
``sitecustomize.py``), ``vllm`` imports as a stand-in package, and ``nvidia-smi`` is ``tests/standins/bin/nvidia-smi``,
which reports the memory the live stand-ins' rollout workers declare. Ray sees one GPU
(``RAY_OVERRIDE_RESOURCES``, read by ``ray/_private/resource_and_label_spec.py``). The forced stop SIGKILLs the real
sweep driver, and "GPU free within 15 s" is measured against the stand-ins' processes. A copy of the script with the
old forced stop (``kill -9 $!``, which hits ``timeout`` and leaves the driver training) must fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import optuna
import psutil
import pytest

from klsweep.orchestrate._ray_session import end_orphaned_session

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_smoke.sh"
STANDINS = REPO / "tests" / "standins"
STEPS = 3

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PATH": os.pathsep.join([str(STANDINS / "bin"), str(REPO / ".venv" / "bin"), env.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(STANDINS), env.get("PYTHONPATH")])),
        "STANDIN_GPU_DIR": str(root / "gpu"),
        "STANDIN_STEP_S": "0.2",
        "STANDIN_RENDEZVOUS": "2",
        "RAY_OVERRIDE_RESOURCES": json.dumps({"GPU": 1}),
        "WORK": str(root / "work"),
        "STEPS": str(STEPS),
        # klsweep's host-wide start-up locks, private to this run: another smoke run on the host cannot hold them
        "KLSWEEP_LOCK_DIR": str(root / "locks"),
    })
    env.pop("RAY_ADDRESS", None)
    return env


def _holders(root: Path) -> list[int]:
    """Pids of the stand-ins' rollout workers that are alive (they hold the stand-in GPU's memory).

    A stand-in that ends while this reads (a driver left training finishes its trial) removes its file
    (``Rollout.close``) between the glob and the read, and its worker may exit between the two process checks: both
    count as not holding, as in ``tests/standins/bin/nvidia-smi``."""
    held = []
    for path in (root / "gpu").glob("*.json"):
        try:
            pid = json.loads(path.read_text())["pid"]
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                held.append(pid)
        except (FileNotFoundError, psutil.NoSuchProcess):
            continue
    return held


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_smoke")
    (root / "gpu").mkdir()
    (root / "locks").mkdir()
    env = _env(root)
    result = _run([str(SCRIPT)], env)
    yield root, env, result
    _end_stop_run(root)


def _end_stop_run(root: Path) -> None:
    """Ends a stop run's driver that a broken forced stop left training, its Ray, and the trials' workers."""
    stop = str(root / "work" / "stop")
    drivers = [p for p in psutil.process_iter(["cmdline"]) if stop in " ".join(p.info["cmdline"] or [])
               and "run" in (p.info["cmdline"] or [])]
    for p in drivers:
        p.send_signal(signal.SIGTERM)  # klsweep stops its trials and exits 143
    _, alive = psutil.wait_procs(drivers, timeout=60)
    for p in alive:
        p.kill()
    end_orphaned_session(Path(stop))
    deadline = time.monotonic() + 30
    while _holders(root) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = []
    for pid in _holders(root):
        try:
            left.append(psutil.Process(pid))
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    psutil.wait_procs(left, timeout=10)  # a SIGKILL is not instant: wait until they are gone (or zombies)


def test_gpu_smoke_passes_end_to_end_on_the_standins(smoke):
    root, _, result = smoke
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    # every stage ran
    for stage in ("== preconditions", "== model, data and reward", "== two trials at once on one GPU",
                  "== forced stop", "checks passed", "== PASS"):
        assert stage in out, stage
    assert "tiny Qwen2 in" in out and "flash-attn not installed: the sweep's sdpa fallback is used" in out
    work = root / "work"
    # both trials COMPLETE, read from the study itself
    storage = f"sqlite:///{work / 'sweep' / 'study.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    # the stand-in logged steps 1..3 with verl's np.mean of 10 micro-batches' kl_coef, and checkpointed
    coefs = {}
    for trial in (work / "sweep" / "tune").iterdir():
        if not (trial / "attempt-1").is_dir():
            continue
        lines = [json.loads(x) for x in (trial / "attempt-1" / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [1, 2, 3]
        swept = json.loads((trial / "params.json").read_text())["actor_rollout_ref.actor.kl_loss_coef"]
        coefs[swept] = {x["data"]["actor/kl_coef"] for x in lines}
        assert "Saving checkpoint to " + str(trial / "checkpoints" / "global_step_") in (
            trial / "attempt-1" / "stdout.log").read_text()
    assert coefs == {0.001: {0.0010000000000000002}, 0.01: {0.009999999999999998}}  # not exactly the swept value
    # the forced stop: the driver itself was killed, and the stand-ins' GPU memory was freed within 15 s
    driver = int((work / "stop.pid").read_text())
    assert f"killing the sweep driver (pid {driver}); on the GPU: pids " in out
    assert not psutil.pid_exists(driver) or psutil.Process(driver).status() == psutil.STATUS_ZOMBIE
    freed = [line for line in out.splitlines() if line.startswith("GPU free ")]
    assert len(freed) == 1 and int(freed[0].split()[2]) <= 15
    assert _holders(root) == []


def test_the_old_forced_stop_kills_timeout_and_fails(smoke, tmp_path):
    root, env, _ = smoke
    text = SCRIPT.read_text()
    new = ('''timeout 900 bash -c 'echo $$ > "$0"; exec "$@"' "$WORK/stop.pid" \\\n'''
           '''    sweep run "$WORK/gpu_smoke.yaml"''')
    old = '''timeout 900 sweep run "$WORK/gpu_smoke.yaml"'''
    assert text.count(new) == 1 and text.count('DRIVER=$(cat "$WORK/stop.pid")') == 1
    broken = (text.replace(new, old).replace('DRIVER=$(cat "$WORK/stop.pid")', "DRIVER=$TIMEOUT_PID")
              .replace('cd "$(dirname "$0")/.."', f"cd {REPO}"))
    copy = tmp_path / "gpu_smoke_old_forced_stop.sh"
    copy.write_text(broken)
    try:
        result = _run([str(copy), "--forced-stop"], env)
        out = result.stdout + result.stderr
        assert result.returncode == 1, out[-4000:]
        assert re.search(r"FAILED: GPU not free 1[6-9] s after the forced stop: pids \d+", out), out[-4000:]
        assert _holders(root), "the driver the old forced stop missed still trains on the GPU"
    finally:
        _end_stop_run(root)
    assert _holders(root) == []
