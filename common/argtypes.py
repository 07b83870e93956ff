"""argparse types for the values users give on command lines: a number in a range, a folder.

Owned here, at the bottom of the package, so that the engine's flags (``common.run.cli``), the data
flags every app shares (``common.data``) and the apps' own flags refuse bad values in the same
words, one line and exit code 2.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable


def at_least(minimum: float, kind: Callable = int, maximum: float = math.inf) -> Callable[[str], Any]:
    """An argparse type: a number no smaller than ``minimum`` (and no larger than ``maximum``)."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, got {text!r}") from None
        if math.isnan(value):  # no number, rather than a number too small
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be at least {_plain(minimum)}, got {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {_plain(maximum)}, got {text}")
        return value

    convert.__name__ = kind.__name__
    return convert


def _plain(number: float) -> str:
    """4294967295, not 4.29497e+09; 0.5 as 0.5."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def folder(text: str) -> Path:
    """An argparse type: a folder path, never empty (an empty path would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty path")
    return Path(text)
