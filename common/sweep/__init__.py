"""Your own function on every GPU of every node: a sweep in ten lines.

    from common import sweep

    def fit(params, seed, device):
        ...
        return {"error": error}

    if __name__ == "__main__":
        raise SystemExit(sweep.main(fit, grid={"C": [0.1, 1, 10], "gamma": [0.01, 0.1]}, minimise="error"))

or ``python -m common.sweep my_module:fit --grid grid.json --minimise error``. Every engine flag
works (``--gpu all``, ``--results``, ``--resume``, ``--dry-run``, ...); see docs/sweep.md.

Importing this package imports nothing heavy (``main`` and ``SweepApp`` load on first use), so that
``python -m common.sweep`` defers Ctrl-C before numpy loads.

On top of the engine: may import every layer below it (the package root, results/, observe/,
workers/, ranks/, run/), not the other packages on top; nothing imports it.
"""
from typing import Any

__all__ = ["SweepApp", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
