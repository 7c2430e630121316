"""Where a command's CPU time goes, by kind of process: the table of CONTRIBUTING.md, "Tests".

Runs the command and, every 0.3 s until it ends, reads the CPU time (user + system, ``/proc/PID/stat`` fields 14
and 15) and the command line of every process on the machine. A process's last reading is its total; a process
alive at the start counts only what it used after. A process that lives under 0.3 s is missed. Linux only.

Usage::

    .venv/bin/python benchmarks/suite_cpu.py [--top N] -- .venv/bin/pytest -q

Prints the command's exit code, its wall time, the machine's busy CPU-seconds (``/proc/stat``) and one line per kind
of process: CPU-seconds, count, mean. Run it on an otherwise idle machine: every process on it is counted.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def _busy_ticks() -> int:
    """All CPUs' non-idle ticks since boot (``/proc/stat``: user nice system irq softirq steal)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


def _sample(seen: dict[tuple[str, str], list], baseline: bool) -> None:
    """Update ``seen[(pid, start)] = [cpu_s, cmdline, cpu_s at the first sample]`` for every live process."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        cpu, key = (int(fields[11]) + int(fields[12])) / TICKS, (pid, fields[19])
        entry = seen.setdefault(key, [cpu, cmd or stat[stat.index("(") + 1:stat.rindex(")")], cpu if baseline else 0.0])
        entry[0] = cpu
        if cmd:  # Ray's workers rename themselves (ray::IDLE, ray::ImplicitFunc): keep the latest name
            entry[1] = cmd


def kind(cmd: str) -> str:
    """The kind of process a command line names."""
    if cmd.startswith("ray::"):
        return cmd.split()[0]
    match = re.search(r"(?:klsweep\.cli|bin/sweep) (\w+)", cmd)
    if match:
        return f"sweep {match.group(1)}"
    if "exec(eval(sys.stdin" in cmd or "bin/pytest" in cmd:
        return "pytest and its xdist workers"
    for name in ("gcs_server", "raylet", "dashboard.py", "log_monitor.py", "monitor.py", "verl.trainer.main_ppo",
                 "klsweep.trainers.embedded", "klsweep.launchers.supervisor", "klsweep.launchers.own_ray"):
        if name in cmd:
            return name
    return "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=25, help="kinds to print (default 25)")
    parser.add_argument("command", nargs="+", help="the command to run (after --)")
    args = parser.parse_args(argv)
    seen: dict[tuple[str, str], list] = {}
    _sample(seen, baseline=True)
    busy, start = _busy_ticks(), time.monotonic()
    process = subprocess.Popen(args.command)
    while process.poll() is None:
        time.sleep(0.3)
        _sample(seen, baseline=False)
    wall, busy = time.monotonic() - start, (_busy_ticks() - busy) / TICKS
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, cmd, first in seen.values():
        if cpu > first:
            totals[kind(cmd)][0] += cpu - first
            totals[kind(cmd)][1] += 1
    print(f"exit {process.returncode}, {wall:.0f} s wall, {busy:.0f} CPU-s busy on the machine, "
          f"{sum(t[0] for t in totals.values()):.0f} CPU-s seen in processes")
    for name, (cpu, count) in sorted(totals.items(), key=lambda item: -item[1][0])[:args.top]:
        print(f"{cpu:8.1f} CPU-s {int(count):5d} processes {cpu / count:6.2f} each  {name}")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
