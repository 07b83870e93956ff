"""The workload as an app of ours, as its users write one: items, ``run_item``, ``main``.

python -m benchmarks.peers.ours SPEC [engine options: --workers, --gpu, --results, ...]
(or, copied beside work.py, ``PYTHONPATH=OTHER_CHECKOUT python ours.py SPEC ...``)
"""
from __future__ import annotations

import json
from pathlib import Path

from common.app import App
from common.items import Item
from common.run.runner import main

try:
    from .work import work
except ImportError:  # a copy beside work.py, run as a script on another checkout's engine (bench_peers --baseline-tree)
    from work import work  # type: ignore[no-redef]


class PeerApp(App):
    name = "peers"
    description = "bench_peers' workload (sleep items, maybe one that kills or stops its worker)"

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("spec", type=Path, help="the workload's JSON (bench_peers writes it)")

    def fingerprint(self):
        return {"spec": str(self.args.spec)}

    def items(self):
        spec = json.loads(self.args.spec.read_text())
        fault_index = spec.get("fault_index", -1)
        # cost: the duration the user knows (a hint: longest first), as for a grid of fits, where the peers
        # are given the items longest first too; else all alike (the items in their order)
        known = bool(spec.get("longest_first"))
        return [Item(f"{i:05d}", {"i": i, "seconds": s, "fault": spec["fault"] if i == fault_index else "",
                                  "marker_dir": spec["marker_dir"]}, cost=max(s, 1e-9) if known else 1.0)
                for i, s in enumerate(spec["durations"])]

    def draws_figures(self):
        return False  # as a user's app that writes no figures says

    def run_item(self, state, item, seed):
        return list(work(item.params["i"], item.params["seconds"], item.params["fault"], item.params["marker_dir"]))


if __name__ == "__main__":
    raise SystemExit(main(PeerApp))
