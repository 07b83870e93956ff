"""Writing results so that a killed run never leaves a half-written file behind."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are for the whole group to read
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(value: Any) -> Any:
    """numpy scalars and arrays, Paths and tuples as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(value), indent=2, sort_keys=False) + "\n")


def new_figure(width: float, height: float, rows: int = 1, columns: int = 1, **subplots: Any) -> tuple:
    """(figure, axes) outside pyplot's global state, so no display or GUI backend is needed;
    ``subplots`` go to ``Figure.subplots`` (``squeeze``, ``gridspec_kw``, ...)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(rows, columns, **subplots)


def save_figure(fig: Any, path_without_suffix: Path) -> list:
    """Save a matplotlib figure as PNG and SVG (atomically) and close it; returns both paths."""
    import io

    import matplotlib.pyplot as plt

    base = Path(path_without_suffix)
    written = []
    for suffix, kwargs in ((".png", {"dpi": 120}), (".svg", {})):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=suffix[1:], bbox_inches="tight", **kwargs)
        target = base.with_suffix(suffix)
        atomic_write_bytes(target, buffer.getvalue())
        written.append(target)
    plt.close(fig)
    return written
