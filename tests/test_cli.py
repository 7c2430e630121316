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
