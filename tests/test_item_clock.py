"""An item's recorded time is its own: what every worker needs anyway is loaded before the
worker says it is ready, not inside the first item it runs (whose record, timeline bar and
--item-timeout would otherwise include it). A real run with real worker processes."""
from __future__ import annotations

import textwrap

from helpers import REPO, journal_entries, run

#: an app whose module imports no numpy: what its workers hold when their first item's clock
#: starts is what the engine loaded for them
APP = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(REPO)!r})
    from common.app import App
    from common.items import Item

    class Clocked(App):
        name = "clocked"

        def items(self):
            return [Item(f"i={{i}}", {{}}) for i in range(6)]

        def setup_worker(self, device):
            # setup_worker runs last before the worker says it is ready
            return {{"numpy_random_loaded": "numpy.random" in sys.modules}}

        def run_item(self, state, item, seed):
            return state

    if __name__ == "__main__":
        from common.run.runner import main
        raise SystemExit(main(Clocked))
""")


def test_the_seeds_library_is_loaded_before_the_first_item_is_timed(tmp_path):
    """numpy.random (item_seed's SeedSequence: 0.1-0.2 s to import here) is in every worker before
    it is ready, so the first item of each worker is not charged for it."""
    app = tmp_path / "clocked.py"
    app.write_text(APP)
    results = tmp_path / "results"
    proc = run([str(app), "--workers", "2", "--gpu", "cpu", "--no-progress", "--results", str(results)])
    assert proc.returncode == 0, proc.stderr
    records = [entry for entry in journal_entries(results) if entry.get("type") == "result"]
    assert len(records) == 6
    assert all(entry["result"] == {"numpy_random_loaded": True} for entry in records), records
