"""Reading a step's settings from its environment, with defaults and clear errors."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from common import atomic_write_json as write_json  # noqa: F401  (the steps' way to write JSON)


def setting(name: str, default: Any, kind: Callable[[str], Any] = str) -> Any:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return kind(text)
    except ValueError:
        raise SystemExit(f"{name}={text!r}: expected a {kind.__name__}") from None


def shared_dir() -> Path:
    """The run's shared folder (the current folder when run by hand)."""
    return Path(os.environ.get("PIPELINE_SHARED", "."))


def run_dir() -> Path:
    return Path(os.environ.get("PIPELINE_RUN_DIR", "."))


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
