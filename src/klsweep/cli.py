"""The ``sweep`` command: run | resume | rebuild-study | plan | validate | status | report | dashboard | health check.

``main(argv) -> int`` returns:

- 0 on success;
- 1 for a stop verdict or a failed sweep;
- 2 for bad input: a :class:`~klsweep.errors.KlsweepError`, printed as one message without a traceback
  (``--debug`` shows it), or a path that cannot be used (an ``OSError`` naming a file: a read-only folder, a path
  under a file, a full disk), said in one line;
- 3 for an inconclusive ``health check``: no rule that can stop a run could judge the log.

Heavy modules (Ray, Optuna, torch, verl) are imported inside each command, never at start-up.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from klsweep import __version__
from klsweep.errors import KlsweepError, ResultsError


def _cmd_run(args: argparse.Namespace) -> int:
    """Run a sweep file: Ray Tune schedules the trials, Optuna proposes them, health rules stop sick ones."""
    from klsweep.orchestrate.sweep import run_sweep

    _check_storage(args.storage, args.out)
    if args.resume and args.out:
        _check_saved_storage(args.out)
    return run_sweep(
        args.sweep_file,
        args.overrides,
        out=args.out,
        storage=args.storage,
        address=args.address,
        resume=args.resume,
        overwrite=args.overwrite,
        launcher=args.launcher,
        quiet=args.quiet,
    )


def _cmd_resume(args: argparse.Namespace) -> int:
    """Continue a sweep after Ctrl-C or a killed driver, or extend a finished one (budget.trials=N)."""
    from klsweep.orchestrate.sweep import resume_sweep

    _check_saved_storage(args.run_dir)
    return resume_sweep(args.run_dir, args.overrides, address=args.address, quiet=args.quiet)


def _cmd_rebuild_study(args: argparse.Namespace) -> int:
    """Rebuild a sweep's missing, empty or corrupt study.db from its Ray Tune results (tune/)."""
    from klsweep.orchestrate.rebuild_study import rebuild_study

    return rebuild_study(args.run_dir)


def _cmd_plan(args: argparse.Namespace) -> int:
    """Print the verl overrides of the first N trials without running anything."""
    from klsweep.orchestrate.plan import plan

    return plan(args.sweep_file, args.overrides, n=args.n)


def _cmd_validate(args: argparse.Namespace) -> int:
    """Check a sweep file (schema, live/inert knobs, verl preflight); exit 2 with every problem listed."""
    from klsweep.orchestrate.plan import validate

    return validate(args.sweep_file, args.overrides)


def _cmd_status(args: argparse.Namespace) -> int:
    """Show what ran, what is running, what is left and the best trial so far, from stored state (no Ray)."""
    from klsweep.analysis.status import status

    _check_saved_storage(args.run_dir)
    return status(args.run_dir, every_command=args.commands)


def _cmd_report(args: argparse.Namespace) -> int:
    """Write report.html and PNGs for a sweep directory."""
    from klsweep.analysis.report import write_report

    return write_report(args.run_dir, out=args.out)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    """Start optuna-dashboard on the sweep's study storage (127.0.0.1 by default)."""
    from klsweep.analysis.dashboard import serve

    return serve(args.run_dir, host=args.host, port=args.port)


def _cmd_health_check(args: argparse.Namespace) -> int:
    """Replay a training log through a health rule set.

    Exit codes: 0 healthy or warned; 1 stop verdict; 2 unreadable input, or a W&B export of several runs without --run;
    3 inconclusive, when no rule that can stop a run could judge the log."""
    from klsweep.health.check import health_check
    from klsweep.spec.trial_log import trial_log_overrides

    return health_check(args.trace, preset=args.preset, rules=args.rules, as_json=args.json, run=args.run,
                        full_config=trial_log_overrides)


def _check_storage(storage: str | None, out: str | None) -> None:
    """Refuse a ``--storage`` URL that Optuna cannot open, before ``sweep run`` writes anything.

    A relative SQLite path lies in the results directory. Where that folder is still to be made (or unknown: no
    ``--out``), it is not opened.

    Raises:
        ResultsError: the URL, why Optuna cannot open it and the fix.
    """
    from klsweep.analysis.sweep_dir import storage_from_url
    from klsweep.results import resolve_storage, sqlite_path, storage_problem

    if storage is None:
        return
    file = sqlite_path(storage)
    if file is not None and not file.is_absolute():
        if out is None or ((Path(out) / file).parent == Path(out) and not Path(out).is_dir()):
            return
        storage_url = resolve_storage(storage, out)
    else:
        storage_url = storage
    problem = storage_problem(storage_url, storage_from_url)
    if problem:
        raise ResultsError(
            f"--storage {storage}: Optuna cannot open it ({problem}); nothing was written. Give a storage URL Optuna "
            "can open (sqlite:////ABSOLUTE/PATH.db in a folder that exists; a database server whose driver is "
            "installed, e.g. mysql+pymysql://USER:PASSWORD@HOST/DB with pymysql), or leave out --storage for "
            "study.db in the results directory")


def _check_saved_storage(run_dir: str) -> None:
    """Refuse a sweep directory whose saved storage (``sweep.json``) Optuna cannot open, with the fix.

    A SQLite file whose folder exists is left to the command's own check of the study, which never creates it.

    Raises:
        ResultsError: the storage, why Optuna cannot open it, and either ``sweep run ... --overwrite`` (no trial
            ran there) or what makes it reachable again (trial results are in ``tune/``).
    """
    from klsweep.analysis.study_file import ran_trials
    from klsweep.analysis.sweep_dir import storage_from_url
    from klsweep.results import SWEEP_FILE, SweepRecord, sqlite_path, storage_problem

    if not (Path(run_dir) / SWEEP_FILE).is_file():
        return  # not a sweep directory: the command says so
    record = SweepRecord.read(run_dir)
    url = record.storage_url(run_dir)
    file = sqlite_path(url)
    if file is not None and file.parent.is_dir():
        return
    problem = storage_problem(url, storage_from_url)
    if problem is None:
        return
    if ran_trials(run_dir):
        fix = ("its trials' results are in tune/: make the storage reachable again (install its driver, start its "
               "server), then run this command again")
    else:
        fix = ("no trial ran there: start the sweep again with a storage that opens: "
               f"{shlex.join(['sweep', 'run', record.sweep_file, *record.overrides, '--out', run_dir])} "
               "--overwrite (add --storage URL, or none for study.db in the folder)")
    raise ResultsError(f"{run_dir}: its Optuna storage {record.storage} ({SWEEP_FILE}) cannot be opened "
                       f"({problem}); {fix}")


def _port(text: str) -> int:
    """A TCP port given on the command line: 0 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give a number from 1 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: ports run from 1 to 65535 (the default is 8080)")
    return port


def _trial_count(text: str) -> int:
    """``sweep plan -n``: a whole number of trials, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number: give how many trials to show, e.g. -n 4") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} trials: give how many trials to show, at least 1, e.g. -n 4")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sweep", description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("--debug", action="store_true", help="show tracebacks of input errors")
    p.add_argument("--version", action="version", version=f"klsweep {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn, **kw) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=fn.__doc__.splitlines()[0], description=fn.__doc__, **kw)
        sp.set_defaults(fn=fn)
        return sp

    r = add("run", _cmd_run)
    r.add_argument("sweep_file")
    r.add_argument("overrides", nargs="*", help="dotted sweep-file fields, e.g. budget.trials=4 budget.max_steps=20")
    r.add_argument("--out", help="results directory (default runs/<name>)")
    r.add_argument("--storage", help="Optuna storage URL (default sqlite:///<out>/study.db)")
    r.add_argument("--address", help="Ray cluster address (default: a private local Ray)")
    r.add_argument("--launcher", help="launch profile: local, ray-cluster, kuberay, slurm")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help="continue the sweep already in the results directory")
    g.add_argument("--overwrite", action="store_true", help="delete the results directory first")
    r.add_argument("--quiet", action="store_true", help="no live table")

    rs = add("resume", _cmd_resume)
    rs.add_argument("run_dir")
    rs.add_argument("overrides", nargs="*", help="e.g. budget.trials=32 to extend a finished sweep")
    rs.add_argument("--address", help="Ray cluster address (default: the launch profile's, else a private local "
                                      "Ray; an --address given to `sweep run` is not saved: give it again)")
    rs.add_argument("--quiet", action="store_true", help="no live table")

    rb = add("rebuild-study", _cmd_rebuild_study)
    rb.add_argument("run_dir")

    pl = add("plan", _cmd_plan)
    pl.add_argument("sweep_file")
    pl.add_argument("overrides", nargs="*")
    pl.add_argument("-n", type=_trial_count, help="number of trials to show (default 4; at most budget.trials)")

    v = add("validate", _cmd_validate)
    v.add_argument("sweep_file")
    v.add_argument("overrides", nargs="*")

    st = add("status", _cmd_status)
    st.add_argument("run_dir")
    st.add_argument("--commands", action="store_true",
                    help="every command that reproduces the best trial(s): the trainer's own (embedded) too, not only "
                         "verl's")

    rp = add("report", _cmd_report)
    rp.add_argument("run_dir")
    rp.add_argument("--out", help="folder for report.html and PNGs (default <run_dir>/report)")

    d = add("dashboard", _cmd_dashboard)
    d.add_argument("run_dir")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=_port,
                   help="port to serve on (default 8080, or a free port when 8080 is in use; 0: any free port)")

    h = sub.add_parser("health", help="health rules: check a log against a rule set")
    hs = h.add_subparsers(dest="health_command", required=True)
    hc = hs.add_parser("check", help=_cmd_health_check.__doc__, description=_cmd_health_check.__doc__)
    hc.set_defaults(fn=_cmd_health_check)
    hc.add_argument("trace", help="verl jsonl, verl console log, W&B CSV export, or Ray Tune progress.csv/result.json")
    hg = hc.add_mutually_exclusive_group()
    hg.add_argument("--preset", help="built-in preset: default, seed, conservative, aggressive (default: default)")
    hg.add_argument("--rules", help="a YAML file of rules")
    hc.add_argument("--json", action="store_true", help="machine-readable output")
    hc.add_argument("--run", metavar="NAME", help="the run to judge in a W&B export that holds several")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sweep`` console script. Returns the exit code."""
    parser = _parser()
    # Options may follow the overrides and overrides the options (`sweep run FILE --out DIR budget.trials=2`), as
    # in Hydra and W&B command lines: what argparse leaves over joins the overrides, in command-line order.
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.fn(args)
    except KlsweepError as e:
        if args.debug:
            raise
        print(f"sweep {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # before OSError, its base: `sweep ... | head` closed the pipe; end quietly as `cat` does
        # Python's advice (docs.python.org/3/library/signal.html, "Note on SIGPIPE"): point stdout at devnull so the
        # interpreter's flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command ended by a closed pipe
    except OSError as e:
        if e.filename is None or args.debug:  # not a path of the user's: a bug to see whole
            raise
        # a folder that cannot be written (read-only, a path under a file, a full disk): the path and the fix
        print(f"sweep {args.command}: error: cannot use {e.filename}: {e.strerror or e}. Give a folder you can write "
              "(--out DIR where the command takes one); --debug shows where it failed", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `sweep run`/`resume` say more once their results directory holds a sweep
        print(f"sweep {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
