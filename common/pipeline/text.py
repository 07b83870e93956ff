"""Values in one-line messages: shortened before they are formatted, never after.

A YAML file of a few hundred bytes can hold a value whose full ``repr`` is gigabytes (nested
aliases); building that text first and cutting it afterwards would hang the error message.
"""
from __future__ import annotations

import reprlib
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 2, 3, 3, 3
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 40, 40, 40


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
