"""A user's script: sweep.main makes it a full engine program (python tests/sweep_script.py --gpu cpu ...)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import sweep  # noqa: E402


def fit(params, seed):
    import numpy as np

    return {"loss": (params["x"] - 3.0) ** 2 + float(np.random.default_rng(seed).random()), "seed_seen": seed}


if __name__ == "__main__":
    raise SystemExit(sweep.main(fit, grid={"x": [1, 2, 3, 4], "kind": ["a", "b"]}, repeats=2, minimise="loss"))
