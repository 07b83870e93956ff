"""``main(AppClass)``: the entry point an app's ``__main__`` calls (the engine is :mod:`common.run.engine`).

This module imports nothing heavy: each spawned worker imports its app's main module, and with it
this one, before it runs its first item. The engine (MPI, the journal, the scheduler, the outputs:
about 0.08 s of CPU) is imported only when ``main`` is called, which only a rank does.
"""
from __future__ import annotations

from typing import List, Optional


def main(app_class: type, argv: Optional[List[str]] = None) -> int:
    """Run an app from the command line on this rank; returns the exit code (same on every rank)."""
    from common.run.engine import main as run

    return run(app_class, argv)
