"""The same 20,000 no-op calls as a sweep and as an App, for ``benchmarks.bench_sweep``.

python -m common.sweep benchmarks.sweep_noop:noop --grid GRID    the sweep (GRID: {"i": [0, 1, ...]})
python benchmarks/sweep_noop.py N                                 the App: items i=0 ... i=N-1, each calling noop()
python benchmarks/sweep_noop.py N --seed-form int32               the same App given the sweep's 32-bit seeds
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.app import App  # noqa: E402
from common.items import SEED_FORMS, Item  # noqa: E402


def noop() -> Dict[str, Any]:
    """Nothing: what remains of a run is the machinery's cost."""
    return {}


class NoopApp(App):
    """Items keyed as the sweep keys them, each calling :func:`noop`; no outputs of its own."""

    name = "noop"

    def __init__(self, args: Any):
        super().__init__(args)
        self.seed_form = args.seed_form  # the workers get it with the app

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument("n_items", type=int)
        parser.add_argument("--seed-form", choices=SEED_FORMS, default=App.seed_form,
                            help="the item seeds run_item gets (App.seed_form)")

    def fingerprint(self) -> Dict[str, Any]:
        return {"n_items": self.args.n_items}

    def items(self) -> List[Item]:
        return [Item(f"i={i}", {"point": {"i": i}, "repeat": 0}) for i in range(self.args.n_items)]

    def draws_figures(self) -> bool:
        return False  # as the sweep without --minimise/--maximise

    def run_item(self, state: Any, item: Item, seed: Any) -> Any:
        return noop()


if __name__ == "__main__":
    from common.run.runner import main

    raise SystemExit(main(NoopApp))
