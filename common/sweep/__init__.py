"""Your own function on every GPU of every node: a sweep in ten lines.

    from common import sweep

    def fit(params, seed, device):
        ...
        return {"error": error}

    if __name__ == "__main__":
        raise SystemExit(sweep.main(fit, grid={"C": [0.1, 1, 10], "gamma": [0.01, 0.1]}, minimise="error"))

or ``python -m common.sweep my_module:fit --grid grid.json --minimise error``. Every engine flag
works (``--gpu all``, ``--results``, ``--resume``, ``--dry-run``, ...); see docs/sweep.md.
"""
from .app import SweepApp, main

__all__ = ["SweepApp", "main"]
