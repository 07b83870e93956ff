"""argparse types for the values users give on command lines: a number in a range, a folder; and
the parser whose bad argument is one line.

Owned here, at the bottom of the package, so that the engine's flags (``common.run.cli``), the data
flags every app shares (``common.data``) and the apps' own flags refuse bad values in the same
words, one line and exit code 2.
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any, Callable

from .errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose bad argument is a :class:`UsageError` (one line, exit code 2, no usage block),
    with no prefixes of flags taken for the flag (--fold for --folds)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see --help)")


def at_least(minimum: float, kind: Callable = int, maximum: float = math.inf) -> Callable[[str], Any]:
    """An argparse type: a finite number no smaller than ``minimum`` (and no larger than ``maximum``).
    inf and 1e400 (which float() makes inf) are refused: no option means "never" by it."""

    def convert(text: str) -> Any:
        shown = _shortened(text)
        try:
            value = kind(text)
        except ValueError:
            digits = _WHOLE_NUMBER.match(text)
            if kind is int and digits:  # past Python's 4300-digit limit
                if digits.group(1) == "-":
                    raise argparse.ArgumentTypeError(f"must be at least {_plain(minimum)}, got {shown}") from None
                raise argparse.ArgumentTypeError(f"must be at most {_plain(maximum)}, got {shown}" if maximum < math.inf
                                                 else f"too large, got {shown}") from None
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, got {shown!r}") from None
        if isinstance(value, float) and math.isnan(value):  # no number, rather than a number too small
            raise argparse.ArgumentTypeError(f"expected a number, got {shown!r}")
        if isinstance(value, float) and math.isinf(value) and value > 0:
            raise argparse.ArgumentTypeError(f"expected a finite number, got {shown!r}" + (
                f" (at most {_plain(maximum)})" if maximum < math.inf else ""))
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be at least {_plain(minimum)}, got {shown}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {_plain(maximum)}, got {shown}")
        return value

    convert.__name__ = kind.__name__
    return convert


#: a whole number written in ASCII digits (int() also reads other scripts' digits, but not "²")
_WHOLE_NUMBER = re.compile(r"^\s*([+-]?)[0-9]+\s*$")


def _shortened(text: str, keep: int = 24) -> str:
    """A value as a message shows it: a number of thousands of digits by its first ones and its length."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}... ({len(text):,} characters)"


def _plain(number: float) -> str:
    """4294967295, not 4.29497e+09; 0.5 as 0.5."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def folder(text: str) -> Path:
    """An argparse type: a folder path, never empty (an empty path would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty path")
    return Path(text)
