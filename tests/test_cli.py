"""The `sweep` command line: options and overrides in any order, --version, and results directories that are not
klsweep's are never written into or deleted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from klsweep import __version__
from klsweep.cli import main
from tests.orchestrate.conftest import sweep_file

#: Ray client's connection timeouts (ray/util/client/worker.py, 5 s growing to 30 s by default) cut to 1 s.
FAST_GIVE_UP = {"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}


def test_options_may_follow_or_precede_the_overrides(tmp_path, capsys):
    path = sweep_file(tmp_path)
    assert main(["plan", path, "-n", "1", "budget.trials=5", "seed=3"]) == 0
    after = capsys.readouterr().out
    assert main(["plan", path, "budget.trials=5", "-n", "1", "seed=3"]) == 0
    assert capsys.readouterr().out == after
    assert main(["plan", path, "-n", "1", "budget.trials=0"]) == 2  # the override after an option still counts
    assert "budget.trials" in capsys.readouterr().err


def test_a_stray_option_is_still_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", sweep_file(tmp_path), "--nope", "budget.trials=5"])
    assert e.value.code == 2 and "unrecognized arguments: --nope" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"klsweep {__version__}"


@pytest.mark.parametrize("flag", [[], ["--overwrite"], ["--resume"]])
def test_a_directory_without_a_sweep_is_neither_written_into_nor_deleted(tmp_path, capsys, flag):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("keep me")
    assert main(["run", sweep_file(tmp_path), "--out", str(notes), *flag]) == 2
    err = capsys.readouterr().err
    assert "holds files but no klsweep sweep (no sweep.json)" in err and "--out DIR" in err
    assert [p.name for p in notes.iterdir()] == ["ideas.txt"] and (notes / "ideas.txt").read_text() == "keep me"


def test_no_cluster_to_join_is_one_line_and_leaves_nothing_behind(tmp_path):
    # A port nobody listens on (`--address auto` would join any Ray this machine runs, the tests' own included):
    # Ray's client gives up after 3 connection attempts, 1 s each here (FAST_GIVE_UP).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "klsweep.cli", "run", sweep_file(tmp_path), "--out", str(out),
                          "--address", f"ray://127.0.0.1:{port}"],
                         env={**os.environ, "RAY_AUTH_MODE": "disabled", **FAST_GIVE_UP}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert f"no Ray cluster to join at --address ray://127.0.0.1:{port}" in run.stderr
    assert "Start the cluster first" in run.stderr
    assert not out.exists()  # the retry is not blocked by a half-made results directory


def test_ctrl_c_while_joining_the_cluster_leaves_nothing_behind(tmp_path):
    """Ctrl-C before any trial (here while Ray's client waits on a "cluster" that accepts its connection and never
    answers): exit 130, one line, and no results directory left to block the next `sweep run`."""
    out = tmp_path / "out"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(120)
        port = listener.getsockname()[1]
        driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", sweep_file(tmp_path), "--out", str(out),
                                   "--address", f"ray://127.0.0.1:{port}"],
                                  env={**os.environ, "RAY_AUTH_MODE": "disabled"},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            connection, _ = listener.accept()  # Ray's client has connected: the driver is inside ray.init
            with connection:
                driver.send_signal(signal.SIGINT)
                stdout, stderr = driver.communicate(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    assert driver.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert stderr.strip().splitlines()[-1] == "sweep run: interrupted (Ctrl-C)"
    assert not out.exists()


def test_a_closed_pipe_ends_a_command_quietly():
    # `sweep health check LOG | head -1`: once head has exited, the next write gets EPIPE. The read end is closed
    # before the command writes anything, so that the write fails every time (with a live reader it may not)
    proc = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "health", "check",
                             "tests/data/traces/grpo_no_signal.jsonl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    proc.stdout = None
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports it
    assert err == b""  # no BrokenPipeError traceback, no "Exception ignored" from the exit flush


def test_help_is_plain_text_and_every_resume_option_is_explained(capsys):
    """`sweep --help` showed the docstring's RST ``sweep``, and `sweep resume --help` listed --address and --quiet
    with no text."""
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "The sweep command: run | resume" in top and "``" not in top
    with pytest.raises(SystemExit):
        main(["resume", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--address ADDRESS Ray cluster address (default: the launch profile's" in text
    assert "--quiet no live table" in text


def _without_write_override() -> None:
    """Run in the child before exec: as root, drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the capability
    bounding set (prctl PR_CAPBSET_DROP, linux/prctl.h 24; capability numbers 1 and 2, linux/capability.h), so
    the program it starts obeys file permissions as any user does. A user's process obeys them already."""
    import ctypes

    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _read_only_sweep(tmp_path):
    """A finished sweep directory (tests/analysis/conftest) whose files and folders nobody may write."""
    from tests.analysis.conftest import make_sweep

    out = make_sweep(tmp_path / "copied", 4, objectives=[{"metric": "critic/score/mean", "mode": "max"}])
    for path in [out, *out.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    return out


def _sweep(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klsweep.cli", *argv], capture_output=True, text=True,
                          timeout=120, preexec_fn=_without_write_override, **kwargs)


def test_a_read_only_sweep_directory_is_said_in_one_line(tmp_path):
    """``sweep report`` on a read-only copy of a sweep ended in a PermissionError traceback (exit 1): one line
    that names the folder and the fix, exit 2; ``sweep status`` reads it as it is."""
    out = _read_only_sweep(tmp_path)
    try:
        report = _sweep("report", str(out))
        assert report.returncode == 2 and "Traceback" not in report.stderr, report.stderr
        [line] = report.stderr.splitlines()
        assert line.startswith(f"sweep report: error: cannot write the report to {out / 'report'}")
        assert "Permission denied" in line and f"sweep report {out} --out DIR" in line
        assert not (out / "report").exists()
        assert _sweep("report", str(out), "--out", str(tmp_path / "elsewhere")).returncode == 0
        assert (tmp_path / "elsewhere" / "report.html").is_file()
        status = _sweep("status", str(out))
        assert status.returncode == 0 and "copied: 4 finished" in status.stdout, status.stderr
    finally:
        for path in [out, *out.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)


def test_the_dashboard_serves_a_read_only_study_without_saving_its_figure(tmp_path):
    """optuna-dashboard on a read-only study.db: saving the KL frontier figure into the study failed with a
    StorageInternalError traceback; it is a warning, and the study is served."""
    out = _read_only_sweep(tmp_path)
    server = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "dashboard", str(out), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_without_write_override)
    try:
        url = server.stdout.readline()
        assert "http://127.0.0.1:" in url and "/dashboard/" in url, server.stderr.read()
    finally:
        server.send_signal(signal.SIGINT)
        stderr = server.communicate(timeout=60)[1]
        for path in [out, *out.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert "Traceback" not in stderr
    assert "warning: the KL frontier figure was not saved into the study" in stderr
    assert "attempt to write a readonly database" in stderr


def test_a_results_folder_under_a_file_and_a_port_past_65535_are_one_line(tmp_path, capsys):
    """A path under a file cannot be a folder for any user, root included: the same one-line error as a read-only
    folder, exit 2, for `run --out` and `report --out`. ``--port 70000`` ended in an OverflowError traceback."""
    from tests.analysis.conftest import make_sweep

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert main(["run", sweep_file(tmp_path), "--out", str(a_file / "out")]) == 2
    err = capsys.readouterr().err
    assert f"sweep run: error: cannot use {a_file / 'out'}: Not a directory." in err and "Traceback" not in err
    out = make_sweep(tmp_path / "s", 2, objectives=[{"metric": "critic/score/mean", "mode": "max"}])
    assert main(["report", str(out), "--out", str(a_file / "report")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"sweep report: error: cannot write the report to {a_file / 'report'}: Not a directory")

    with pytest.raises(SystemExit) as e:
        main(["dashboard", str(out), "--port", "70000"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "sweep dashboard: error: argument --port: 70000 is not a port: ports run from 1 to 65535 (the default is "
        "8080)")


def test_health_check_of_a_restarted_trials_progress_csv_agrees_with_its_result_json(tmp_path, capsys):
    """A remedy restarted the trial from step 7's checkpoint after step 12: Tune's progress.csv keeps the abandoned
    steps 8-12 (where the KL blew up), result.json only the run that continued (healthy). Both files get one
    verdict, HEALTHY; the progress.csv's output says which reports it left out."""
    import json

    def row(step: int, kl: float) -> dict:
        return {"step": step, "training_iteration": step, "actor/kl_loss": kl, "actor/pg_loss": 0.01,
                "actor/entropy": 0.5, "critic/score/mean": 0.4}

    abandoned = [row(s, 0.01 if s <= 7 else 0.9) for s in range(1, 13)]  # > 0.5 for 3 steps: kl_blowup stops
    went_on = [row(s, 0.01) for s in range(8, 21)]
    columns = list(abandoned[0])
    progress = tmp_path / "progress.csv"
    progress.write_text(",".join(columns) + "\n" + "".join(
        ",".join(str(r[c]) for c in columns) + "\n" for r in abandoned + went_on))
    result = tmp_path / "result.json"
    result.write_text("".join(json.dumps(r) + "\n" for r in abandoned[:7] + went_on))

    assert main(["health", "check", str(result), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "healthy"
    assert main(["health", "check", str(progress)]) == 0
    out = capsys.readouterr().out
    assert "verdict: HEALTHY" in out
    assert ("note: the log goes back to step 8 after step 12 (a restart from a checkpoint: a remedy's, or a resumed "
            "run's): its 5 abandoned reports of steps 8-12 are left out") in out
    assert "20 reports (steps 1-20)" in out  # 7 before the restart point and 13 after it


def test_wandb_online_with_a_key_but_no_route_logs_offline_and_says_so(tmp_path, monkeypatch, capsys):
    """W&B online, a key, no route to W&B: the sweep took 7 times as long and wrote no W&B data, silently. A probe
    of W&B's server (here a closed port on 127.0.0.1, refused at once) switches the sweep to offline in seconds,
    and says so; a server that answers keeps it online."""
    import time

    from klsweep.orchestrate.wandb_logging import PROBE_TIMEOUT_S, wandb_callback
    from klsweep.spec import load_sweep

    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # a key of W&B's length: wandb.login(verify=False) accepts it
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the callback sets it for offline runs: restored after
    monkeypatch.delenv("WANDB_DIR", raising=False)
    sweep = load_sweep(sweep_file(tmp_path, wandb={"mode": "online"}))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert wandb_callback(sweep, tmp_path).kwargs["mode"] == "online"
    assert "cannot be reached" not in capsys.readouterr().err
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused
        monkeypatch.setenv("WANDB_BASE_URL", url)
        started = time.monotonic()
        callback = wandb_callback(sweep, tmp_path)
        took = time.monotonic() - started
    assert callback.kwargs["mode"] == "offline" and took < PROBE_TIMEOUT_S + 5
    err = capsys.readouterr().err
    assert f"warning: wandb.mode is online but W&B at {url} cannot be reached from this machine" in err
    assert f"the sweep logs offline to {tmp_path / 'wandb'}" in err and "wandb sync" in err
