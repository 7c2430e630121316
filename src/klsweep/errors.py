"""Exceptions klsweep raises for user mistakes.

The CLI turns every :class:`KlsweepError` into one message and exit code 2 (``--debug`` shows the traceback);
anything else is a bug in klsweep.
"""


class KlsweepError(Exception):
    """Base class of errors caused by user input (files, overrides, paths). Its message is shown as is."""


class SweepFileError(KlsweepError):
    """A sweep file (or a command-line override of it) is malformed or inconsistent.

    Args:
        problems: one line per problem, each naming the file, line when known, dotted field path and the fix.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class OverrideError(KlsweepError):
    """A verl override (``key=value``) is unknown, misspelled or has an invalid value.

    The message names the key, the value, the valid values and the closest valid key when there is one.

    Args:
        problems: one message per bad override, each starting with ``KEY=VALUE`` (default: the message alone).
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems) if problems else [message]
        super().__init__(message)


class PreflightError(KlsweepError):
    """A trial configuration that verl would reject (or silently misuse), found before any trial starts."""


class TraceReadError(KlsweepError):
    """A training log could not be read (unknown format, no step lines, unreadable file)."""


class ResultsError(KlsweepError):
    """A sweep directory is missing, incomplete or would be overwritten."""


class ClusterError(KlsweepError):
    """The Ray cluster a sweep was told to join (``--address``, a launch profile) cannot be reached."""
