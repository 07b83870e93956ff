"""Errors the engine turns into exit codes, and how a path or a count goes into a one-line message."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


# Exit codes (documented in the README).
EXIT_OK = 0
EXIT_FAILED_ITEMS = 1
EXIT_USAGE = 2
EXIT_STOPPED = 75  # stopped by a signal (walltime): rerun with --resume to finish


def quoted(path: object) -> str:
    """A path (or any user-given text) for a one-line message: quoted, newlines and other
    control characters escaped, so the message stays one line."""
    return repr(str(path))


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: "1 item", "2 items", "0 items"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
