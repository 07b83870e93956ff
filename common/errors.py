"""Errors the engine turns into exit codes."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


# Exit codes (documented in the README).
EXIT_OK = 0
EXIT_FAILED_ITEMS = 1
EXIT_USAGE = 2
EXIT_STOPPED = 75  # stopped by a signal (walltime): rerun with --resume to finish
