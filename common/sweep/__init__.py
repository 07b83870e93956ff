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
``python -m common.sweep`` defers Ctrl-C before numpy loads; and a script's ``sweep.main`` defers it
before the engine loads (the first ~0.3 s of a run here), so that a Ctrl-C or a walltime signal then
ends the run in one line, exit 75, not in a KeyboardInterrupt traceback or a silent death.

On top of the engine: may import every layer below it (the package root, results/, observe/,
workers/, ranks/, run/), not the other packages on top; nothing imports it.
"""
import sys
import threading
from typing import Any

__all__ = ["SweepApp", "main"]
#: the modules a program's own code runs as: the script's, and a spawned worker's import of it
PROGRAM_MODULES = ("__main__", "__mp_main__")


def __getattr__(name: str) -> Any:
    if name in __all__:
        if name == "main" and _asked_by_the_program():
            from common.signals import defer_stop_signals

            defer_stop_signals()  # the runner takes the stops noted meanwhile (common.signals.early_stops)
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _asked_by_the_program() -> bool:
    """Whether ``main`` is asked for by a program's own code on its main thread (a script about to
    run a sweep), not by a library or a notebook's helper thread, whose signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        return False
    frame = sys._getframe(2)  # the code that asked: 0 is this function, 1 is __getattr__
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):  # from ... import main
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__") in PROGRAM_MODULES
