"""What an app's items return, as rank 0 and the app's ``finish`` get it: the journal's JSON form,
the same in a run and in its resume; a value the journal cannot keep fails its item alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO, journal_entries, read_summary

ODD_APP = '''import json
import sys

import numpy as np

from common import App, Item, main


class OddApp(App):
    name = "odd"
    default_retries = 1

    def items(self):
        return [Item(key) for key in ("array", "nan", "tuple", "bad")]

    def run_item(self, state, item, seed):
        if item.key == "array":
            return {"values": np.arange(3), "scalar": np.float32(0.5)}
        if item.key == "nan":
            return {"v": float("nan")}
        if item.key == "tuple":
            return {"pair": (1, 2), "by_int": {1: "a"}}
        return {"labels": {"cat", "dog"}}  # a set: no JSON form

    def finish(self, run):
        seen = {key: [repr(record.result), type(record.result).__name__] for key, record in sorted(run.records.items())}
        with open(sys.argv[-1] + ".seen", "a") as out:
            out.write(json.dumps(seen, sort_keys=True) + "\\n")
        return {}


if __name__ == "__main__":
    raise SystemExit(main(OddApp, sys.argv[1:-1]))
'''


def test_finish_sees_the_journals_values_in_a_run_and_its_resume_and_a_set_fails_its_item(tmp_path):
    """A returned set crashed rank 0 while it wrote the journal line (50 lines of traceback, no
    summary, the whole run lost), and finish saw numpy arrays, NaN, tuples and int keys in a run but
    lists, None and str keys in its resume. Now every result reaches rank 0 as the journal keeps it,
    and the set fails its item for good, named, while the others are kept."""
    script = tmp_path / "odd_app.py"
    script.write_text(ODD_APP)
    results = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, str(script), "--gpu", "cpu", "--workers", "2", "--no-progress", "--results", str(results)]
    seen = tmp_path / "finish"
    ran = subprocess.run(argv + [str(seen)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 1, ran.stderr  # an item failed; the run did not
    assert "Traceback" not in ran.stderr, ran.stderr
    summary = read_summary(results)
    assert summary["items_done"] == 3, summary
    (failed,) = summary["failed_items"]
    assert failed["key"] == "bad", failed
    assert failed["error"].startswith("TypeError: item bad returned a value the journal cannot keep as JSON: "
                                      "Object of type set is not JSON serializable"), failed
    attempts = [e for e in journal_entries(results) if e["type"] == "attempt_failed"]
    assert len(attempts) == 1, attempts  # not retried: it would return the same
    # a resume of the finished items: every value from the journal
    resumed = subprocess.run(argv + ["--resume", str(seen)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 1, resumed.stderr
    fresh, again = [json.loads(line) for line in seen.with_name("finish.seen").read_text().splitlines()]
    assert fresh == again, (fresh, again)
    assert fresh == {"array": ["{'values': [0, 1, 2], 'scalar': 0.5}", "dict"], "nan": ["{'v': None}", "dict"],
                     "tuple": ["{'pair': [1, 2], 'by_int': {'1': 'a'}}", "dict"]}, fresh


MISTAKEN_APP = '''import sys

from common import App, Item, main


class Mistaken(App):
    name = "mistaken"

    def items(self):
        mistake = sys.argv[-1]
        if mistake == "none":
            return None
        if mistake == "dict":
            return {"a": Item("a")}
        if mistake == "not-an-item":
            return [Item("a"), ("b", {})]
        if mistake == "int-key":
            return [Item(0)]
        if mistake == "twice":
            return [Item("same"), Item("other"), Item("same")]
        if mistake == "after":
            return [Item("a"), Item("b", after=("nope",))]
        return [Item("a")]

    def run_item(self, state, item, seed):
        return {"v": 1}


class NoItems(App):
    name = "noitems"

    def run_item(self, state, item, seed):
        return {}


class NoRunItem(App):
    name = "norunitem"

    def items(self):
        return [Item("a")]


if __name__ == "__main__":
    app = {"no-items": NoItems, "no-run-item": NoRunItem}.get(sys.argv[-1], Mistaken)
    raise SystemExit(main(app, sys.argv[1:-1]))
'''

MISTAKES = {
    "none": "Mistaken.items() returned None, not a list of common.Item",
    "dict": "Mistaken.items() returned dict, not a list of common.Item",
    "not-an-item": "Mistaken.items() returned a tuple among its items, not a common.Item: ('b', {})",
    "int-key": "Mistaken.items(): an item key must be a non-empty str, not 0 (int)",
    "twice": "Mistaken.items(): the item key 'same' is given twice (keys name the items in the journal and their "
             "seeds: each must be unique)",
    "after": "Mistaken.items(): item 'b' waits for 'nope', which no item is (after names other items' keys)",
    "no-items": "NoItems defines no items(): an app returns its list of common.Item from it",
    "no-run-item": "NoRunItem defines no run_item(state, item, seed): the function each worker runs for an item",
}


def test_mistakes_in_an_apps_items_are_one_line_exit_2_and_write_nothing(tmp_path):
    """Each of these was a traceback from deep in the run (an int key crashed the workers too), after
    the results folder and its logs/ were made, and --dry-run printed duplicate keys as if fine."""
    script = tmp_path / "mistaken_app.py"
    script.write_text(MISTAKEN_APP)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for mistake, line in MISTAKES.items():
        results = tmp_path / f"results-{mistake}"
        for extra in ([], ["--dry-run"]):
            ran = subprocess.run([sys.executable, str(script), "--gpu", "cpu", "--no-progress", "--results",
                                  str(results), *extra, mistake], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=120)
            name = {"no-items": "noitems", "no-run-item": "norunitem"}.get(mistake, "mistaken")
            assert (ran.returncode, ran.stderr.splitlines()) == (2, [f"{name}: error: {line}"]), (mistake, extra, ran)
            assert not results.exists(), (mistake, extra)
