"""Memory sizes as users write them ("16g", "512m", "1.5GiB", 1073741824) in bytes."""
from __future__ import annotations

import re
from typing import Union

from ..errors import short

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
#: Larger sizes are surely typos (and overflow what /proc reports).
MAX_BYTES = 2 ** 63
#: Smaller limits kill any step at once (an interpreter alone needs more).
MIN_BYTES = 2 ** 20
_FACTORS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}


def parse_memory(value: Union[str, int]) -> int:
    """Bytes in ``value``; units are powers of 1024 (k, m, g, t, with optional 'b' or 'ib')."""
    if isinstance(value, bool):
        raise ValueError(f"memory must be a size such as '16g' or '512m', got {short(value)}")
    if isinstance(value, float) and value.is_integer():  # 17179869184.0: an integer to JSON Schema
        value = int(value)
    if isinstance(value, int):
        number, unit, bare = value, "", True
    elif isinstance(value, str) and _SIZE.fullmatch(value):
        match = _SIZE.fullmatch(value)
        number, unit = float(match.group(1)), match.group(2).lower()
        bare = not match.group(2) and not match.group(3)  # no unit at all, not even "b"
    else:
        raise ValueError(f"memory must be a size such as '16g' or '512m', got {short(value)}")
    try:
        size = int(number * _FACTORS[unit])
    except OverflowError:  # more digits than a float holds
        size = MAX_BYTES + 1
    if size > MAX_BYTES:
        text = str(value) if len(str(value)) <= 30 else f"{str(value)[:30]}... ({len(str(value))} characters)"
        raise ValueError(f"memory must be at most 2**63 bytes, got {text}")
    if size <= 0:
        raise ValueError(f"memory must be more than 0 bytes, got {short(value)}")
    if size < MIN_BYTES:  # no program starts in less: a unit left out ("memory": 16 meant 16g)
        shown = f"{number:g}"
        hint = f" (a number without a unit is bytes: write '{shown}g' for {shown} GiB)" if bare else ""
        raise ValueError(f"memory must be at least 1 MiB, got {short(value)}, which is {size} bytes{hint}")
    return size


def format_bytes(size: float) -> str:
    """'1.5 GiB' for reports."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
