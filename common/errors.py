"""Errors the engine turns into exit codes, and how a path, a count, a value or its type goes into a one-line
message (and user text into a cell of summary.md's tables).

Values are shortened before they are formatted, never after: a YAML file of a few hundred bytes can
hold a value whose full ``repr`` is gigabytes (nested aliases); building that text first and
cutting it afterwards would hang the error message.
"""
import json
import re
import reprlib
from types import MappingProxyType
from typing import Any, Optional


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


class ItemFailed(Exception):
    """Raised by an item's code to fail the item with its message alone: an outcome of the item (a
    pipeline whose step failed), not a bug, so its traceback (the engine's own frames) is not what
    the log, the journal and report.html show. ``retry=False``: the item fails for good at once,
    whatever ``--retries`` says (another attempt would fail the same way: a value the item returned
    that the app cannot keep). ``shown_as``: the type its failure is named by (else its class's).
    Both are also class attributes: a subclass whose ``__init__`` does not call this one keeps them."""

    retry: bool = True
    shown_as: Optional[str] = None

    def __init__(self, *args: Any, retry: bool = True, shown_as: Optional[str] = None) -> None:
        super().__init__(*args)
        self.retry = retry
        self.shown_as = shown_as


# Exit codes (documented in the README).
EXIT_OK = 0
EXIT_FAILED_ITEMS = 1
#: the same code where nothing ran but the printout that was the result was lost (a full disk)
EXIT_NOT_WRITTEN = EXIT_FAILED_ITEMS
EXIT_USAGE = 2
EXIT_STOPPED = 75  # stopped by a signal (walltime): rerun with --resume to finish
#: stopped as for EXIT_STOPPED, in a Slurm job, with no item of the run finished and items cut off at the
#: end of --grace: a requeue with the same --time would cut them off again (the batch scripts do not requeue)
EXIT_NO_PROGRESS = 76
#: the status command's own output could not be written (sysexits' EX_IOERR): its other codes are the
#: job's states, so not 1, which is "failed"
EXIT_STATUS_NOT_WRITTEN = 74

#: Failed.kind: the attempt raised or its worker died (FAILED); its worker was killed by the rank's
#: watch, for the item's --item-timeout or a setup past --setup-timeout (TIMED_OUT), or for its
#: silence past --worker-timeout (SILENT). The timeline colours each.
FAILED, TIMED_OUT, SILENT = "failed", "timeout", "silent"


def quoted(path: object) -> str:
    """A path (or any user-given text) for a one-line message: quoted, newlines and other
    control characters escaped, so the message stays one line."""
    return repr(str(path))


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: "1 item", "2 items", "0 items"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


#: a value's type as a JSON or YAML file's reader calls it, with its article
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", tuple: "a list",
          dict: "an object", type(None): "null"}


def kind_of(value: object) -> str:
    """"an integer", "a string", "an object", ... for "must be X, got Y" messages about what a user
    wrote (a JSON or YAML file, a call's argument); Python's own name, with its article, otherwise."""
    name = _KINDS.get(type(value))
    if name is not None:
        return name
    python = type(value).__name__
    return f"{'an' if python[:1].lower() in 'aeiou' else 'a'} {python}"


#: the most of an item's error (its message, its traceback) kept in the journal, summary.json and the
#: status file: a message of megabytes (a whole array in it) made each of them megabytes, per attempt
MAX_ERROR_CHARS = 20_000
#: the most of a failure's first line shown on stderr, in summary.md and by the status command
MAX_LINE_CHARS = 300


def capped(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text``, or its start and end with what was left out said between them (a traceback's last
    line is the error itself)."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    return f"{text[:head]}\n… ({len(text) - head - tail:,} characters left out) …\n{text[-tail:]}"


def described(error: BaseException) -> str:
    """What an item's exception says, for its failure: "Type: message" (the message whole, lines
    and all, up to MAX_ERROR_CHARS: the summary's JSON keeps it), or the type alone. An exception
    whose ``str`` itself raises still gets a line, instead of taking its worker down."""
    name = getattr(error, "shown_as", None) or type(error).__name__
    try:
        message = str(error)
    except Exception as inner:  # noqa: BLE001 -- a user's class: anything
        return f"{name} (its message could not be made: {type(inner).__name__})"
    return capped(f"{name}: {message}" if message else name)


def error_line(error: str) -> str:
    """A failure's first line, for the progress lines and summary.md's table: the exception's type
    and the start of its message (torch's and scikit-learn's run over several lines; at most
    MAX_LINE_CHARS of it), with "…" where some was left out (summary.json and the logs keep more)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if len(lines[0]) > MAX_LINE_CHARS:
        return lines[0][:MAX_LINE_CHARS] + " …"
    return lines[0] + (" …" if len(lines) > 1 else "")


#: what Markdown would read as a cell's end (|), emphasis, code, a link, an escape or HTML; an
#: underscore unless it stands between two letters or digits (learning_rate stays as written; the
#: inner ones of __init__ too need it)
_MARKDOWN_SPECIAL = re.compile(r"[\\`*\[\]|]|(?<![^\W_])_|_(?![^\W_])")
#: an ampersand that would start a character reference (&lt;, &#60;): Markdown would show the character
_REFERENCE = re.compile(r"&(?=#?\w+;)")


def markdown_cell(text: str) -> str:
    """User text (an item's key, a parameter's value, an error) as one cell of a Markdown table in
    summary.md, and so in report.html, shown as written: a ``|`` in a value would otherwise start a
    new cell and shift the numbers under the wrong headers."""
    text = " ".join(str(text).splitlines())
    text = _REFERENCE.sub("&amp;", text)
    return _MARKDOWN_SPECIAL.sub(lambda match: "\\" + match.group(0), text).replace("<", "&lt;")

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 2, 3, 3, 3
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 40, 40, 40


def as_written(value: Any, limit: int = 60) -> str:
    """``short``, with a JSON or YAML file's own spelling of its literals (``true``, ``false``,
    ``null``): for the values of a definition a user wrote, not of Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = short(value, limit)
    if isinstance(value, (dict, list)) and "..." not in text:  # whole and small: JSON's spelling inside it too
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    return text


#: JSON's names for the types a parsed JSON or YAML document holds
JSON_TYPES = MappingProxyType({dict: "an object", list: "an array", str: "a string", int: "a number",
                               float: "a number", bool: "a boolean", type(None): "null"})


def json_type(value: Any) -> str:
    """"an object", "an array", "null", ...: what a value of a JSON or YAML document is."""
    return JSON_TYPES.get(type(value), type(value).__name__)


def short(value: Any, limit: int = 60) -> str:
    """A ``repr`` of ``value`` of about ``limit`` characters at most, on one line."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            text = repr(value)
        except ValueError:  # more digits than Python turns into text
            return "a number of more than 4300 digits"
        return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
    if isinstance(value, (bytes, bytearray)):
        return repr(bytes(value[:limit])) + (f"... ({len(value)} bytes)" if len(value) > limit else "")
    if isinstance(value, (dict, list, tuple, set)):
        try:
            return _REPR.repr(value)
        except (ValueError, RecursionError):
            return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
