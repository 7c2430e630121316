"""`sweep resume` after the driver was killed with SIGKILL mid-sweep: the study and Tune agree again, nothing is lost
or run twice, no trial stays RUNNING, the budget is reached, `budget.trials=N` extends the finished sweep, and no
process of the killed driver's private Ray outlives the resume (klsweep.orchestrate._ray_session), while another Ray
session's processes are never touched.

The sweep runs as a real `sweep run` process (its own private Ray), killed from outside like a lost login node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from klsweep.orchestrate import _ray_session
from klsweep.results import SweepRecord, default_storage
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import started_sweep_dir, sweep_file

pytestmark = [pytest.mark.slow, pytest.mark.fault]

TRIALS, STEPS = 6, 6
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def _sweep(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "klsweep.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _study(out: Path) -> optuna.Study:
    info = json.loads((out / "sweep.json").read_text())
    return optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}")


def _finished(out: Path) -> int:
    try:
        return sum(t.state in FINISHED for t in _study(out).trials)
    except Exception:  # study not created yet
        return 0


def _tune_trial_ids(out: Path) -> list[str]:
    """Ray Tune trial ids from the trial folders in the Tune directory (``run_trial_<id>_<n>_...``).

    Not from result.json or params.json: a trial that started and finished between two saves of the driver's state
    has only its checkpoints in the sweep directory after a SIGKILL (the driver had not synced the rest yet)."""
    return [folder.name.split("_")[2] for folder in (out / "tune").glob("run_trial_*") if folder.is_dir()]


def _alive(processes: dict[psutil.Process, str], timeout: float) -> list[str]:
    """Names of the processes still alive (zombies count as gone) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for process, name in processes.items():
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{process.pid} {name}")
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _named(processes: list[psutil.Process]) -> dict[psutil.Process, str]:
    """``{process: its first two arguments}``, leaving out the processes that ended since they were listed (Ray starts
    and ends workers on its own: a finished trial's actor, an idle worker)."""
    named = {}
    for process in processes:
        try:
            named[process] = " ".join(process.cmdline()[:2])
        except psutil.NoSuchProcess:
            continue
    return named


def _session_processes(session_dir: str) -> dict[psutil.Process, str]:
    """Every live process of a Ray session, found with psutil (independently of the module under test): its command
    line names the session directory, or it holds a file under it open (Ray's workers and agents, whose process
    title ``ray::<name>`` replaced their arguments), the driver that started it aside."""
    found = {}
    for process in psutil.process_iter():
        try:
            argv = process.cmdline()
            named = any(arg == session_dir or session_dir + "/" in arg or arg.endswith("=" + session_dir)
                        for arg in argv)
            if named or (argv and argv[0].startswith("ray::")
                         and any(f.path.startswith(session_dir + "/") for f in process.open_files())):
                found[process] = " ".join(argv)  # whole: a long venv path pushes "raylet" far right
        except psutil.Error:
            pass
    return found


def _running(processes: dict[psutil.Process, str]) -> list[str]:
    """The processes still running now (a zombie or a reused pid counts as gone)."""
    alive = []
    for process, name in processes.items():
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.pid} {name}")
        except psutil.NoSuchProcess:
            pass
    return alive


def _check_consistent(out: Path, budget: int) -> None:
    study = _study(out)
    trials = study.trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    ray_ids = [t.user_attrs.get("ray_trial_id") for t in trials]
    assert None not in ray_ids and len(set(ray_ids)) == len(ray_ids)  # each Tune trial told once
    assert len(trials) == budget and all(t.state in FINISHED for t in trials)
    params = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(params)) == len(params)  # no parameter set proposed twice across the resume (optuna#3255)
    tune_ids = _tune_trial_ids(out)
    assert set(ray_ids) <= set(tune_ids)  # every study trial ran as a Tune trial
    # A trial in flight when the driver died, whose start the driver had not saved yet, is re-run by the resumed
    # sweep under a new Tune id (the study trial Optuna had proposed for it is adopted, so its params are re-used):
    # its folder stays behind, unfinished. There are at most max_concurrent of them.
    abandoned = set(tune_ids) - set(ray_ids)
    assert len(abandoned) <= 2
    # each trial's result.json ends at the step the study holds: a trial that ended just before the kill keeps the
    # rows the killed driver had not synced from its Ray session yet
    for trial in trials:
        (result,) = (out / "tune").glob(f"run_trial_{trial.user_attrs['ray_trial_id']}_*/result.json")
        assert json.loads(result.read_text().splitlines()[-1])["step"] == trial.user_attrs["steps"], trial.number
    # An abandoned trial's result.json holds the rows the killed driver received (written row by row), each step
    # once and in order. It may hold its last step: a short trial's last result can reach the driver just before the
    # kill, and Tune ends the trial and the study hears of it only after that result.
    for trial_id in abandoned:
        for result in (out / "tune").glob(f"run_trial_{trial_id}_*/result.json"):
            steps = [json.loads(line)["step"] for line in result.read_text().splitlines()]
            assert steps == list(range(1, len(steps) + 1)) and len(steps) <= STEPS, (trial_id, steps)


def test_resume_after_driver_sigkill(tmp_path):
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "crash", parameters={"kl_coef": {"distribution": "log_uniform_values", "min": 0.0005,
                                                                 "max": 0.005}},
                      budget={"trials": TRIALS, "max_steps": STEPS}, health="default")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 400
    while _finished(out) < 2:
        assert driver.poll() is None, f"the sweep ended before it could be killed:\n{driver.stdout.read()}"
        assert time.monotonic() < deadline, "two trials did not finish in time"
        time.sleep(0.5)
    ray_processes = _named(psutil.Process(driver.pid).children(recursive=True))
    recorded = json.loads((out / _ray_session.RAY_SESSION_FILE).read_text())
    assert recorded["driver"]["pid"] == driver.pid
    old_session = _session_processes(recorded["session_dir"]) | ray_processes
    assert {"raylet", "gcs_server"} <= {entry["name"] for entry in recorded["processes"]}
    assert any("ray::DashboardAgent" in name for name in old_session.values()), old_session
    done_before = {t.user_attrs["ray_trial_id"]: (t.state, t.values) for t in _study(out).trials if t.state in FINISHED}
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    killed_at = time.monotonic()
    # the driver's private Ray goes down with it: GCS, raylet and the trial workers within seconds
    core = {p: name for p, name in ray_processes.items() if "Agent" not in name}
    assert not (alive := _alive(core, timeout=10)), alive

    # `sweep status` reads the crashed sweep without Ray: its counts are the study's
    status = _sweep("status", str(out))
    study = _study(out)
    running = sum(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)
    finished = sum(t.state in FINISHED for t in study.trials)
    assert status.returncode == 0, status.stderr
    assert (f"crash: {finished} finished, {running} running (or interrupted), {TRIALS - len(study.trials)} not started"
            in status.stdout), status.stdout
    assert running > 0 and "sweep resume" in status.stdout, status.stdout

    left = _running(old_session)
    resumed_at = time.monotonic()
    resumed = _sweep("resume", str(out), "--quiet")
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr, resumed.stderr
    if left and resumed_at - killed_at < 40:  # the agents' own exit comes ~60 s after the kill: the resume ended them
        assert f"processes of Ray session {recorded['session_name']}" in resumed.stderr, (left, resumed.stderr)
    _check_consistent(out, TRIALS)
    after = {t.user_attrs["ray_trial_id"]: (t.state, t.values) for t in _study(out).trials}
    kept = {k: after[k] for k in done_before}
    assert kept == done_before, (kept, done_before)  # finished trials kept as they were, not re-run

    # Ray's DashboardAgent and RuntimeEnvAgent outlive their raylet by ~60 s; the resume ended them (or they had
    # ended): nothing of the old session outlives it
    assert not _running(old_session | _session_processes(recorded["session_dir"]))
    assert json.loads((out / _ray_session.RAY_SESSION_FILE).read_text())["session_dir"] != recorded["session_dir"]

    extended = _sweep("resume", str(out), "budget.trials=8", "--quiet")
    assert extended.returncode in (0, 1), extended.stdout + extended.stderr
    _check_consistent(out, 8)


DRIVER = """
import sys, time
import ray
from klsweep.orchestrate import _ray_session
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
ray.get(ray.remote(lambda: 1).remote())  # a worker too
_ray_session.record_session(sys.argv[1])
print("ready", flush=True)
time.sleep(600)
"""


def test_cleanup_ends_every_process_of_a_killed_drivers_ray(tmp_path, capsys):
    """SIGKILL of a driver that started a private Ray: its agents outlive it by a minute; the next start in the
    results directory ends every process of that session, agents included, and says so in one line."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        recorded = json.loads((tmp_path / _ray_session.RAY_SESSION_FILE).read_text())
        session = _session_processes(recorded["session_dir"])
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= {name.split()[0] for name in session.values()}
    finally:
        driver.kill()
        driver.wait()
    core = {p: name for p, name in session.items() if "Agent" not in name and "ray::" not in name}
    deadline = time.monotonic() + 15
    while _running(core) and time.monotonic() < deadline:  # raylet and GCS die with the driver (PR_SET_PDEATHSIG)
        time.sleep(0.2)
    assert _running(session), "nothing of the session was left to clean up"

    ended = _ray_session.end_orphaned_session(tmp_path)

    assert not _running(session | _session_processes(recorded["session_dir"]))
    assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(ended)
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"ended {len(ended)} processes of Ray session {recorded['session_name']}")
    assert f"sweep driver {driver.pid} is gone" in line
    assert not (tmp_path / _ray_session.RAY_SESSION_FILE).exists()
    assert _ray_session.end_orphaned_session(tmp_path) == []  # nothing recorded any more


def _spawn(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


def test_cleanup_never_touches_another_ray_session(ray_local, tmp_path, capsys):
    """The tests' own Ray, a process naming another session (whose name extends the recorded one's), a ``ray::``
    process holding another session's files, and a non-Ray process reading the recorded session's logs all survive;
    the recorded session's own processes do not. A record whose driver still runs is left alone."""
    ours = {p: name for p, name in _session_processes(ray_local._private.worker._global_node.get_session_dir_path())
            .items() if not name.startswith("ray::") or "Agent" in name}  # workers come and go on their own
    assert any("raylet" in name for name in ours.values()) and any("Agent" in name for name in ours.values())

    recorded_dir = tmp_path / "ray" / "session_2000-01-01_00-00-00_000000_1"
    other_dir = tmp_path / "ray" / "session_2000-01-01_00-00-00_000000_12"  # the recorded name is a prefix of it
    for d in (recorded_dir, other_dir):
        (d / "logs").mkdir(parents=True)
    (recorded_dir / "logs" / "raylet.out").touch()
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    spared = {
        "names another session": _spawn([*sleep, f"--session-dir={other_dir}", f"--log_dir={other_dir}/logs"]),
        "ray:: holding another session's file": _spawn(
            ["bash", "-c", f"exec -a ray::Decoy sleep 600 3>>{other_dir}/logs/decoy.out"]),
        "not Ray, reading the session's log": _spawn(
            ["bash", "-c", f"exec sleep 600 3<{recorded_dir}/logs/raylet.out"]),
    }
    ended_expected = {
        "names the session": _spawn([*sleep, f"--session-dir={recorded_dir}"]),
        "ray:: holding the session's file": _spawn(
            ["bash", "-c", f"exec -a ray::Mine sleep 600 3>>{recorded_dir}/logs/worker.out"]),
    }
    children = {**spared, **ended_expected}
    try:
        time.sleep(1.0)  # bash has exec'd, python is up
        record = {"session_dir": str(recorded_dir), "session_name": recorded_dir.name, "processes": [],
                  "driver": {"pid": 0, "start_ticks": 0}}  # no process has pid 0: the driver is gone
        path = tmp_path / _ray_session.RAY_SESSION_FILE

        # while the recording driver runs, nothing is touched
        live = spared["names another session"].pid
        path.write_text(json.dumps(record | {"driver": {"pid": live, "start_ticks": _ray_session._start_ticks(live)}}))
        assert _ray_session.end_orphaned_session(tmp_path) == []
        assert f"sweep driver {live} that recorded" in capsys.readouterr().err
        assert all(process.poll() is None for process in children.values())

        # once it is gone, only the recorded session's processes end
        path.write_text(json.dumps(record))
        ended = _ray_session.end_orphaned_session(tmp_path)
        assert len(ended) == 2 and "ray::Mine" in ended, ended
        for what, process in ended_expected.items():
            assert process.wait(timeout=5) is not None, what
        for what, process in spared.items():
            assert process.poll() is None, f"{what}: ended"
        assert len(_running(ours)) == len(ours), f"the tests' own Ray lost some of {sorted(ours.values())}"
        assert ray_local.get(ray_local.put(1)) == 1
    finally:
        for process in children.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def test_overwrite_ends_the_killed_drivers_ray(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    path = sweep_file(tmp_path, "again", budget={"trials": 1, "max_steps": 2})
    sweep = load_sweep(path)  # a sweep directory, as a killed `sweep run` leaves it: its record, then its Ray's
    SweepRecord(name=sweep.name, sweep_file=path, study_name=sweep.name, storage=default_storage(),
                objectives=[o.model_dump() for o in sweep.objectives], sweep=sweep.model_dump(mode="json")).write(out)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(out)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        recorded = json.loads((out / _ray_session.RAY_SESSION_FILE).read_text())
        session = _session_processes(recorded["session_dir"])
    finally:
        driver.kill()
        driver.wait()
    rerun = _sweep("run", path, "--out", str(out), "--overwrite", "--quiet")
    assert rerun.returncode in (0, 1), rerun.stdout + rerun.stderr
    assert not _running(session | _session_processes(recorded["session_dir"]))
    assert f"processes of Ray session {recorded['session_name']}" in rerun.stderr


def test_resume_of_a_driver_killed_before_its_first_trial(tmp_path):
    # SIGKILL while Ray starts leaves sweep.json and the driver lock, no study and no Tune experiment: the resume runs
    # the sweep from its first trial instead of refusing with "the study is not in its storage yet"
    path = sweep_file(tmp_path, "early", budget={"trials": 1, "max_steps": 2})
    out = started_sweep_dir(tmp_path, path)
    resumed = _sweep("resume", str(out), "--quiet")
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    assert "the driver ended before the sweep's first trial" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    _check_consistent(out, 1)


def test_resume_of_a_driver_killed_before_tune_took_its_enqueued_seed_trial(tmp_path):
    """SIGKILL after the study was created with its seed trial enqueued (WAITING), before Tune asked for it: the
    resume runs the whole budget, the seed trial among it once, and status counts no trial that never ran."""
    from klsweep.spec.space import seed_params

    path = sweep_file(tmp_path, "enqueued", seed_trials=[{"kl_coef": 0.001}], budget={"trials": 2, "max_steps": 2})
    out = started_sweep_dir(tmp_path, path)
    sweep = load_sweep(path)
    study = optuna.create_study(study_name=sweep.name, storage=f"sqlite:///{out / 'study.db'}", direction="maximize")
    study.enqueue_trial(seed_params(sweep)[0])  # what OptunaSearch's _setup_study does with points_to_evaluate
    status = _sweep("status", str(out))
    assert "0 finished, 0 running (or interrupted), 2 not started" in status.stdout, status.stdout + status.stderr
    resumed = _sweep("resume", str(out), "--quiet")
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    _check_consistent(out, 2)
    assert [t.params for t in _study(out).trials].count(seed_params(sweep)[0]) == 1


def _rows(out: Path) -> tuple[Path, list[dict]]:
    """The trial folder and the ``result.json`` rows of a one-trial sweep (a killed driver's half line left out)."""
    (folder,) = [p.parent for p in (out / "tune").glob("run_trial_*/result.json")]
    rows = []
    for line in (folder / "result.json").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return folder, rows


def test_a_trial_running_at_a_driver_sigkill_continues_from_its_newest_checkpoint(tmp_path):
    """A driver SIGKILLed a few steps into a trial: `sweep resume` continues the trial after the newest checkpoint the
    driver registered (every 2 steps: test_freq), Tune's result.json holds each step 1-40 once, and W&B gets one
    run: the resumed part logs to the trial's run id with ``resume="allow"`` (Ray's callback passes
    ``resume=False``: a second run of the same id, counting on from the checkpoint)."""
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "ckpt", parameters={"kl_coef": {"values": [0.001]}}, wandb={"mode": "offline"},
                      health={"preset": "default", "remedies": False}, budget={"trials": 1, "max_steps": 40})
    env = {k: v for k, v in os.environ.items() if k != "WANDB_DIR"}
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env={**env, "RAY_AUTH_MODE": "disabled"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list((out / "tune").glob("run_trial_*/result.json")) or len(_rows(out)[1]) < 6:
            assert driver.poll() is None, driver.stdout.read()
            assert time.monotonic() < deadline, "the trial did not reach step 6"
            time.sleep(0.05)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    folder, rows = _rows(out)
    checkpoint = max(r["step"] for r in rows if r.get("checkpoint_dir_name")
                     and (folder / r["checkpoint_dir_name"]).is_dir())
    assert 0 < checkpoint < 40

    resumed = subprocess.run([sys.executable, "-m", "klsweep.cli", "resume", str(out), "--quiet"],
                             env={**env, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True, timeout=400)
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    _, rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(1, 41)), (  # no step twice, none skipped
        checkpoint, resumed.returncode, resumed.stdout[-3000:], resumed.stderr[-6000:])
    restart = [r["step"] for r in rows if r["iterations_since_restore"] == 1]
    # the resume continued after the newest checkpoint the driver registered: the newest one logged, or the one
    # before it when the kill came between the row (logged first) and the checkpoint's registration (Tune's save)
    assert restart[0] == 1 and restart[1] - 1 in (checkpoint, checkpoint - 2) and len(restart) == 2, restart

    from tests.orchestrate.test_wandb import records  # W&B's run-file reader

    runs = []
    for run_file in out.glob("wandb/offline-run-*/run-*.wandb"):
        recs = records(run_file)
        if not any(r.WhichOneof("record_type") == "run" for r in recs):  # SIGKILLed before W&B wrote its header
            continue
        (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"][:1]
        steps = [r.history.step.num for r in recs if r.WhichOneof("record_type") == "history"]
        runs.append((run.run_id, run.resume, steps))
    trial_id = rows[0]["trial_id"]
    assert {run_id for run_id, _, _ in runs} == {trial_id}  # one W&B run: the resume appends to it (wandb sync)
    assert all(resume for _, resume, _ in runs)  # wandb.init(resume="allow")
    assert max(steps[0] for _, _, steps in runs if steps) == restart[1]  # the resumed part
