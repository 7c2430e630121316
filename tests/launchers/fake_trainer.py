"""A stand-in training process for the launcher tests: ``python -m fake_trainer key=value ...``.

Writes verl's file-logger lines ``{"step": N, "data": {...}}`` to ``$VERL_FILE_LOGGER_PATH`` like
``verl.utils.tracking.FileLogger``, and can be told to misbehave:

- always: writes ``$PWD/env.json`` with the ``CUDA_VISIBLE_DEVICES`` it got.
- ``steps=N interval=S``: N lines, S seconds apart; line N has ``actor/kl_loss = N / 100`` and ``actor/entropy = 1/N``.
- ``val_before_train=1``: first a step-0 line with only ``val-core/fake/acc/mean@1 = 0.25``, as verl's v1 trainer logs
  its validation before training (``verl/trainer/ppo/v1/trainer_base.py``).
- ``half_line=1``: after the steps, the first half of one more line, without its newline (a writer killed mid-line).
- ``grandchildren=1``: first starts three sleeping descendants, as verl's own Ray does: a plain child, a child in its
  own session (escapes ``killpg``), and an orphan (its parent exits at once). Their pids go to ``$PWD/tree.json``.
- ``ignore_term=1``: ignores SIGTERM (only SIGKILL ends it).
- ``linger=S``: stays S seconds after the last step before it exits (verl closes its loggers and shuts its own Ray
  down after the last step; a process that exits right after its last line ends before any reader can see it).
- ``hang=1``: sleeps forever after the last step.
- ``crash=1``: after the steps, writes ``$FAKE_TRAINER_STDERR`` to stderr and exits with ``exit=`` (default 1);
  ``crash=SIGKILL`` kills itself with SIGKILL instead; ``crash=once``: crashes only in the trial's first attempt.
"""

import json
import os
import signal
import subprocess
import sys
import time

args = dict(a.split("=", 1) for a in sys.argv[1:])
with open("env.json", "w") as f:  # what the launcher gave it
    json.dump({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "cwd": os.getcwd()}, f)
if args.get("ignore_term") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.get("grandchildren") == "1":
    plain = subprocess.Popen(["sleep", "600"])
    session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    orphan_parent = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!"], stdout=subprocess.PIPE, text=True)
    orphan = int(orphan_parent.stdout.readline())
    orphan_parent.wait()
    with open("tree.json", "w") as f:
        json.dump({"trainer": os.getpid(), "plain": plain.pid, "session": session.pid, "orphan": orphan}, f)

out = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)
if args.get("val_before_train") == "1":
    out.write(json.dumps({"step": 0, "data": {"val-core/fake/acc/mean@1": 0.25}}).encode() + b"\n")
for step in range(1, int(args.get("steps", "3")) + 1):
    time.sleep(float(args.get("interval", "0.02")))
    data = {"actor/kl_loss": step / 100, "actor/entropy": 1 / step}
    out.write(json.dumps({"step": step, "data": data}).encode() + b"\n")
    print(f"step:{step} - actor/kl_loss:{step / 100:.3f}", flush=True)

if args.get("half_line") == "1":
    line = json.dumps({"step": int(args.get("steps", "3")) + 1, "data": {"actor/kl_loss": 0.5}}).encode()
    out.write(line[: len(line) // 2])
time.sleep(float(args.get("linger", "0")))
if args.get("hang") == "1":
    while True:
        time.sleep(1)
crash = args.get("crash")
if crash == "once":
    crash = None if os.path.exists("../crashed-once") else "1"
    open("../crashed-once", "w").close()
if crash == "SIGKILL":
    os.kill(os.getpid(), signal.SIGKILL)
if crash:
    sys.stderr.write(os.environ.get("FAKE_TRAINER_STDERR", "") + "\n")
    sys.exit(int(args.get("exit", "1")))
