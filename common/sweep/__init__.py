"""Your own function on every GPU of every node: a sweep in ten lines.

    from common import sweep

    def fit(params, seed, device):
        ...
        return {"error": error}

    if __name__ == "__main__":
        raise SystemExit(sweep.main(fit, grid={"C": [0.1, 1, 10], "gamma": [0.01, 0.1]}, minimise="error"))

or ``python -m common.sweep my_module:fit --grid grid.json --minimise error``. Every engine flag
works (``--gpu all``, ``--results``, ``--resume``, ``--dry-run``, ...); see docs/sweep.md.

Importing this package imports nothing heavy (the engine loads as ``main`` is called, ``SweepApp``
on first use), so that
``python -m common.sweep`` defers Ctrl-C before numpy loads; and a script's call of ``sweep.main``
defers it before the engine loads (the first ~0.3 s of a run here), so that a Ctrl-C or a walltime
signal then ends the run in one line, exit 75, not in a KeyboardInterrupt traceback or a silent death.
Importing ``main`` defers nothing: a script's own processes and a notebook keep their signals.

On top of the engine: may import every layer below it (the package root, results/, observe/,
workers/, ranks/, run/), not the other packages on top; nothing imports it.
"""
import threading
from typing import Any, Callable

__all__ = ["SweepApp", "main"]


def main(function: Callable[..., Any], **options: Any) -> int:
    """Run ``function`` over ``grid=``, ``points=`` or ``space=`` (with ``samples=``) as a full engine
    program, and return its exit code: :func:`common.sweep.app.main` takes the options (``setup``,
    ``repeats``, ``minimise``/``maximise``, ``argv``). Stop signals are deferred first, on the main
    thread, so that one that comes while the engine loads ends the run in one line (exit 75)."""
    if threading.current_thread() is threading.main_thread():
        from common.signals import defer_stop_signals

        defer_stop_signals()  # the runner takes the stops noted meanwhile (common.signals.early_stops)
    from .app import main as run

    return run(function, **options)


def __getattr__(name: str) -> Any:
    if name == "SweepApp":
        from . import app

        return app.SweepApp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
