"""common.sweep end to end: real mpiexec, real spawned workers, real signals, the user's function
imported from tests/sweep_functions.py as ``python -m common.sweep`` imports a user's module."""
from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import signal
import socket
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    REPO,
    assert_usage_error,
    command,
    journal_entries,
    markers,
    read_summary,
    run,
    snapshot,
    start,
    status_of,
    stop_run,
    write_json,
)

TESTS = REPO / "tests"
ENGINE = ["--gpu", "cpu", "--threads", "1", "--no-progress"]


def sweep(target: str, results: Path, *extra: str, ranks: int = 1, workers: int = 2, cwd: Path = TESTS, **kwargs):
    return run(["-m", "common.sweep", target, *extra, *ENGINE, "--workers", str(workers), "--results", str(results)],
               ranks=ranks, cwd=cwd, **kwargs)


def rows(results: Path) -> list:
    with open(Path(results) / "results.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def returns(results: Path) -> dict:
    """key -> the function's whole return, from results.jsonl."""
    return {entry["key"]: entry["result"] for entry in map(json.loads, (Path(results) / "results.jsonl").open())}


def test_a_grid_on_two_ranks_by_two_workers_equals_one_by_one(tmp_path, monkeypatch):
    grid = write_json(tmp_path / "grid.json", {"x": [1, 2, 3, 4, 5], "kind": ["a", "b"]})
    one = sweep("sweep_functions:noisy", tmp_path / "one", "--grid", str(grid), "--minimise", "loss", workers=1)
    assert one.returncode == 0, one.stderr
    monkeypatch.setenv("SWEEP_SLEEP", "0.3")  # items long enough that both ranks get some, however loaded the machine
    many = sweep("sweep_functions:noisy", tmp_path / "many", "--grid", str(grid), "--minimise", "loss", ranks=2)
    assert many.returncode == 0, many.stderr
    assert returns(tmp_path / "one") == returns(tmp_path / "many")
    table = rows(tmp_path / "many")
    assert len(table) == 10
    assert list(table[0])[:5] == ["key", "x", "kind", "repeat", "seed"]
    assert {"loss", "draw", "seconds", "host", "device"} <= set(table[0])
    assert "vector" not in table[0]  # not a scalar: in results.jsonl only
    assert {row["key"] for row in table} == {f"kind={k},x={x}" for x in range(1, 6) for k in "ab"}
    assert all(int(row["seed"]) == returns(tmp_path / "many")[row["key"]]["seed_seen"] for row in table)
    # the seed is numpy's first 32-bit word of the item's own stream (--seed 0 and its key), on any worker
    from common.items import item_seed

    assert all(int(row["seed"]) == int(item_seed(0, row["key"]).generate_state(1)[0]) for row in table)
    assert {e["rank"] for e in journal_entries(tmp_path / "many") if e.get("type") == "result"} == {0, 1}
    for name in ("summary.md", "report.html", "sweep.png", "sweep.svg", "sweep.pdf", "timeline.png"):
        assert (tmp_path / "many" / name).exists(), name
    assert (tmp_path / "many" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    best = read_summary(tmp_path / "many")["sweep"]["best"]
    assert best[0]["params"]["x"] == 3 and best == sorted(best, key=lambda e: e["mean"])
    assert many.stdout.startswith("best loss: ") and "x=3" in many.stdout
    assert "Best points by `loss`" in (tmp_path / "many" / "summary.md").read_text()
    assert (tmp_path / "many" / "summary.md").read_text().splitlines()[2] == f"**{many.stdout.splitlines()[0]}**"
    assert "sweep.png" in (tmp_path / "many" / "summary.md").read_text()


def test_items_sharing_a_32_bit_seed_are_named_and_rng_is_each_items_own(tmp_path):
    """Two keys' hashes meet in 32 bits now and then (x=30668 and x=46775 under --seed 0): their
    ``seed`` gives the same draws, which summary.md, summary.json and the closing lines now say;
    ``rng`` (the item's whole 128-bit-keyed stream) differs, and is the same on 1 worker or 2."""
    points = write_json(tmp_path / "points.json", [{"x": 30668}, {"x": 46775}, {"x": 1}])
    one = sweep("sweep_functions:draws", tmp_path / "one", "--points", str(points), "--seed", "0", workers=1)
    two = sweep("sweep_functions:draws", tmp_path / "two", "--points", str(points), "--seed", "0", workers=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    got = returns(tmp_path / "one")
    assert got == returns(tmp_path / "two")
    assert got["x=30668"]["from_seed"] == got["x=46775"]["from_seed"] != got["x=1"]["from_seed"]
    assert len({entry["from_rng"] for entry in got.values()}) == 3
    assert read_summary(tmp_path / "one")["sweep"]["shared_seeds"] == {"items": 2, "groups": [[3950628448, ["x=30668", "x=46775"]]]}
    line = "2 items share a 32-bit seed with another (x=30668 and x=46775: 3950628448), so their `seed` gives the same draws"
    assert f"note: {line}" in one.stdout
    assert line in (tmp_path / "one" / "summary.md").read_text()
    plain = sweep("sweep_functions:draws", tmp_path / "plain", "--points", str(points), "--seed", "1")
    assert "shared_seeds" not in read_summary(tmp_path / "plain")["sweep"] and "share a 32-bit seed" not in plain.stdout


def test_rng_goes_to_a_function_that_names_it_not_to_its_kwargs():
    """A wrapper passing its **kwargs on to a helper of four arguments must not meet rng."""
    from common.sweep.app import _wanted

    def wrapper(params, **rest):
        return {}

    def named(params, rng, **rest):
        return {}

    assert _wanted(wrapper) == ("params", "seed", "device", "state")
    assert _wanted(named) == ("params", "rng", "seed", "device", "state")


def test_without_a_setup_state_goes_neither_to_kwargs_nor_over_its_default():
    """No setup, no state: a **kwargs function or one whose state has a default runs (the default
    stands); only a state without default asks for a setup (refused by the caller)."""
    from common.sweep.app import _wanted

    def wrapper(params, **rest):
        return {}

    def defaulted(params, seed, device, state=None):
        return {}

    def required(params, state):
        return {}

    assert _wanted(wrapper, has_setup=False) == ("params", "seed", "device")
    assert _wanted(defaulted, has_setup=False) == ("params", "seed", "device")
    assert _wanted(defaulted, has_setup=True) == ("params", "seed", "device", "state")
    assert _wanted(required, has_setup=False) == ("params", "state")


def test_a_list_of_points_in_yaml_with_repeats_and_every_argument(tmp_path):
    points = write_json(tmp_path / "points.yaml", "- {x: 1}\n- {x: 2.5, kind: rbf}\n- {kind: \"1\"}\n")
    result = sweep("sweep_functions:everything", tmp_path / "r", "--points", str(points), "--repeats", "3",
                   "--setup", "setup", ranks=2)
    assert result.returncode == 0, result.stderr
    got = returns(tmp_path / "r")
    assert sorted(got) == sorted(["x=1", "x=1,repeat=1", "x=1,repeat=2", "kind=rbf,x=2.5", "kind=rbf,x=2.5,repeat=1",
                                  "kind=rbf,x=2.5,repeat=2", 'kind="1"', 'kind="1",repeat=1', 'kind="1",repeat=2'])
    assert got["kind=rbf,x=2.5"]["params"] == {"x": 2.5, "kind": "rbf"}
    assert len({r["seed"] for r in got.values()}) == 9, "each repeat has its own seed"
    assert {r["device"] for r in got.values()} == {"cpu"}
    assert all(r["state_pid"] == r["pid"] for r in got.values()), "setup ran in the worker that runs the item"
    assert read_summary(tmp_path / "r")["sweep"]["figure"] is None  # no --minimise: nothing to draw
    assert not (tmp_path / "r" / "sweep.png").exists()


def test_random_samples_stay_in_their_space_and_more_samples_keep_the_first(tmp_path):
    space = write_json(tmp_path / "space.json", {"lr": {"loguniform": [1e-4, 1e-1]}, "drop": {"uniform": [0, 0.5]},
                                            "layers": {"int": [1, 3]}, "kind": {"choice": ["a", "b", "c"]}})

    def planned(samples: int, seed: str = "7") -> list:
        dry = sweep("sweep_functions:noisy", tmp_path / "dry", "--space", str(space), "--samples", str(samples),
                    "--seed", seed, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        return [json.loads(line) for line in dry.stdout.splitlines()]

    six, ten = planned(6), planned(10)
    assert ten[:6] == six and len(ten) == 10
    assert planned(6, "8") != six
    for entry in ten:
        point = entry["params"]["point"]
        assert 1e-4 <= point["lr"] <= 1e-1 and 0 <= point["drop"] <= 0.5
        assert point["layers"] in (1, 2, 3) and point["kind"] in ("a", "b", "c")
    assert not (tmp_path / "dry").exists()
    # every rank draws the space from --seed: 2 ranks x 2 workers run the points planned, with the results of 1 x 1
    ran = sweep("sweep_functions:noisy", tmp_path / "r", "--space", str(space), "--samples", "6", "--seed", "7",
                "--maximise", "draw", ranks=2)
    assert ran.returncode == 0, ran.stderr
    assert sorted(returns(tmp_path / "r")) == sorted(entry["key"] for entry in six)
    alone = sweep("sweep_functions:noisy", tmp_path / "alone", "--space", str(space), "--samples", "6", "--seed", "7",
                  "--maximise", "draw", workers=1)
    assert alone.returncode == 0, alone.stderr
    assert returns(tmp_path / "alone") == returns(tmp_path / "r")
    best = read_summary(tmp_path / "r")["sweep"]["best"]
    assert best == sorted(best, key=lambda e: -e["mean"])


def test_a_script_with_sweep_main_takes_every_engine_flag(tmp_path):
    script = str(TESTS / "sweep_script.py")
    dry = run([script, "--dry-run", "--gpu", "cpu"])
    assert dry.returncode == 0, dry.stderr
    assert len(dry.stdout.splitlines()) == 16  # 4 x 2 points x 2 repeats
    result = run([script, *ENGINE, "--workers", "2", "--results", str(tmp_path / "r")], ranks=2)
    assert result.returncode == 0, result.stderr
    assert len(returns(tmp_path / "r")) == 16
    assert read_summary(tmp_path / "r")["fingerprint"]["function"] == "sweep_script:fit"
    assert result.stdout.startswith("best loss: ") and "(mean of 2 repeats) at x=3" in result.stdout
    again = run([script, *ENGINE, "--results", str(tmp_path / "r"), "--resume", "--maximise", "seed_seen"])
    assert again.returncode == 0, again.stderr  # the command line's --maximise replaces the script's minimise
    assert read_summary(tmp_path / "r")["items_this_run"] == 0
    assert (read_summary(tmp_path / "r")["sweep"]["metric"], read_summary(tmp_path / "r")["sweep"]["goal"]) == ("seed_seen", "max")


def test_sigterm_then_resume_runs_only_the_rest(tmp_path, monkeypatch):
    grid = write_json(tmp_path / "grid.json", {"x": list(range(16))})
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("SWEEP_MARKS", str(tmp_path / "marks"))
    monkeypatch.setenv("SWEEP_SLEEP", "0.8")  # about 3 s in all: the SIGTERM after the 4th result finds items left
    args = ["-m", "common.sweep", "sweep_functions:noisy", "--grid", str(grid), *ENGINE, "--workers", "2",
            "--results", str(tmp_path / "r")]
    stopped = stop_run(start(args, ranks=2, cwd=TESTS), tmp_path / "r", after=4, sig=signal.SIGTERM)
    assert stopped.returncode == 75, stopped.stderr
    assert "--resume" in stopped.stderr
    done = {e["key"] for e in journal_entries(tmp_path / "r") if e.get("type") == "result"}
    assert 4 <= len(done) < 16
    monkeypatch.setenv("SWEEP_SLEEP", "0")
    resumed = run(args + ["--resume"], ranks=2, cwd=TESTS)
    assert resumed.returncode == 0, resumed.stderr
    assert len(returns(tmp_path / "r")) == 16
    assert read_summary(tmp_path / "r")["items_resumed"] == len(done)
    counts = markers(tmp_path / "marks")
    assert len(counts) == 16 and all(n == 1 for n in counts.values()), counts


def test_a_stopped_resume_says_the_files_beside_its_summary_are_an_earlier_runs(tmp_path, monkeypatch):
    """results.csv of a complete run stays when a --resume with more points is stopped: summary.md
    (and report.html) say whose it is, a second stopped run still does, and the run that ends writes
    the files again and drops the note. The first run's ranking, not given again, is kept through the
    stops (a stopped run writes no sweep section) and named by the run that ends."""
    grid = write_json(tmp_path / "grid.json", {"x": [1, 2]})
    args = ["-m", "common.sweep", "sweep_functions:noisy", "--grid", str(grid), *ENGINE, "--workers", "1",
            "--results", str(tmp_path / "r")]
    first = run(args + ["--minimise", "loss"], cwd=TESTS)
    assert first.returncode == 0, first.stderr
    started = read_summary(tmp_path / "r")["started"]
    write_json(grid, {"x": list(range(1, 9))})
    monkeypatch.setenv("SWEEP_SLEEP", "1")  # points left at each stop, however late it comes
    note = f"**The app's files in this folder are an earlier run's** (started {started}, 2 of 2 items)"
    for _ in range(2):  # the second stop finds the note in the summary it replaces
        journaled = sum(1 for e in journal_entries(tmp_path / "r") if e.get("type") == "result")
        stopped = stop_run(start(args + ["--resume"], cwd=TESTS), tmp_path / "r", after=journaled + 1,
                           sig=signal.SIGUSR1)
        assert stopped.returncode == 75, stopped.stderr
        host = socket.gethostname().split(".")[0]  # the stop's line begins as every line of rank 0 does
        assert f"[rank 0 {host}] received SIGUSR1: handing out no more items" in stopped.stderr, stopped.stderr
        assert note in (tmp_path / "r" / "summary.md").read_text()
        assert read_summary(tmp_path / "r")["earlier_outputs"] == {"started": started, "items_done": 2, "items_total": 2}
        assert "are an earlier run" in (tmp_path / "r" / "report.html").read_text()
        assert len(rows(tmp_path / "r")) == 2
        assert read_summary(tmp_path / "r")["sweep_ranking"] == ["--minimise", "loss"]
    monkeypatch.setenv("SWEEP_SLEEP", "0")
    finished = run(args + ["--resume"], cwd=TESTS)
    assert finished.returncode == 0, finished.stderr
    assert len(rows(tmp_path / "r")) == 8
    assert "earlier run's" not in (tmp_path / "r" / "summary.md").read_text()
    assert "earlier_outputs" not in read_summary(tmp_path / "r")
    assert "the run it resumes ranked by 'loss': give --minimise loss to rank and draw it" in finished.stdout


def test_added_grid_values_run_alone_and_removed_ones_leave_the_outputs(tmp_path, monkeypatch):
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("SWEEP_MARKS", str(tmp_path / "marks"))
    grid = tmp_path / "grid.json"
    write_json(grid, {"x": [1, 2, 3]})
    first = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(grid), "--minimise", "loss")
    assert first.returncode == 0, first.stderr
    before = returns(tmp_path / "r")
    write_json(grid, {"x": [1, 2, 3, 4, 5]})
    again = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(grid), "--minimise", "loss", "--resume",
                  ranks=2)
    assert again.returncode == 0, again.stderr
    after = returns(tmp_path / "r")
    assert sorted(after) == [f"x={x}" for x in range(1, 6)]
    assert all(after[key] == value for key, value in before.items())
    assert read_summary(tmp_path / "r")["items_this_run"] == 2
    assert "journal_left_out" not in read_summary(tmp_path / "r")["sweep"] and "not in this run" not in again.stderr
    assert sum(markers(tmp_path / "marks").values()) == 5, "each point ran once"
    write_json(grid, {"x": [4, 5]})
    fewer = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(grid), "--resume")
    assert fewer.returncode == 0, fewer.stderr
    assert sorted(returns(tmp_path / "r")) == ["x=4", "x=5"] and len(rows(tmp_path / "r")) == 2
    assert read_summary(tmp_path / "r")["items_this_run"] == 0
    assert not (tmp_path / "r" / "sweep.png").exists()  # no --minimise this time: the old figure is gone
    told = "the run it resumes ranked by 'loss': give --minimise loss to rank and draw it"
    assert told in fewer.stdout and told in (tmp_path / "r" / "summary.md").read_text()
    # the three points the journal holds beyond this space are said to be left out, as the run starts and at its end
    # (no ranking to be left out of: this resume names no metric)
    left = "3 results in the journal are of items not in this run (points not in this space, or repeats or samples " \
           "past its --repeats or --samples), left out of results.csv (the journal keeps them: a --resume with the " \
           "arguments that ran them takes them again)"
    assert f"sweep: {left}\n" in fewer.stderr and f"note: {left}\n" in fewer.stdout, fewer.stderr + fewer.stdout
    assert f"{left}." in (tmp_path / "r" / "summary.md").read_text()
    assert read_summary(tmp_path / "r")["sweep"]["journal_left_out"] == 3
    ranked = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(grid), "--resume", "--minimise", "loss")
    assert "left out of results.csv and the ranking (" in ranked.stdout, ranked.stdout
    other = sweep("sweep_functions:raises", tmp_path / "r", "--grid", str(grid), "--resume")
    assert_usage_error(other, "other arguments", "function")
    # without --resume: the hint was "pass --resume to continue it", which the line above refuses
    fresh = sweep("sweep_functions:raises", tmp_path / "r", "--grid", str(grid))
    assert_usage_error(fresh, "already holds the journal of another run (function 'sweep_functions:noisy' (journal) vs "
                              "'sweep_functions:raises' (now)); choose another --results")
    assert_usage_error(sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(grid)),
                       "already holds the journal of an earlier run; pass --resume to continue it")


def test_a_resume_refuses_a_parameter_named_repeat_whose_key_was_another_repeats(tmp_path):
    """A point {a: 1, repeat: 1} has the key a=1,repeat=1, as has --repeats' repeat=1 of the point
    {a: 1}: a resume that went from one to the other took the first run's result as the second
    item's ("1 already in the journal"), a wrong result. Each journaled result now says its repeat,
    and such a resume is refused in one line, either way round, leaving the folder as it was."""
    named = write_json(tmp_path / "with.json", {"a": [1], "repeat": [1]})
    plain = write_json(tmp_path / "plain.json", {"a": [1]})
    for first, then in ([["--grid", str(named)], ["--grid", str(plain), "--repeats", "2"]],
                        [["--grid", str(plain), "--repeats", "2"], ["--grid", str(named)]]):
        results = tmp_path / f"results-{len(first)}"
        ran = sweep("sweep_functions:noisy", results, *first, workers=1)
        assert ran.returncode == 0, ran.stderr
        before = snapshot(results)
        resumed = sweep("sweep_functions:noisy", results, *then, "--resume", workers=1)
        named, repeated = "a point with a parameter named 'repeat'", "--repeats' repeat=1 of a point"
        ours, theirs = (repeated, named) if "--repeats" in then else (named, repeated)
        assert_usage_error(resumed, f"cannot resume: the item a=1,repeat=1 is {ours} here, but {theirs} in the journal",
                           "rename the parameter 'repeat'")
        assert snapshot(results) == before


@pytest.mark.parametrize("where", ["a pipe nobody reads", "/dev/full"])
def test_what_a_function_prints_to_a_stdout_that_takes_nothing_fails_no_item(tmp_path, where):
    """A sweep piped into ``| head`` (or through a tee that a Ctrl-C ended) and a full disk: the
    function's prints raised BrokenPipeError / OSError in its worker, and every item that printed
    failed ("5 failed" of 6), though the run's own lines survive such a stdout. Workers now drop
    what cannot be written, as the rank does."""
    results = tmp_path / "results"
    argv = ["-m", "common.sweep", "sweep_functions:chatty", "--grid", str(write_json(tmp_path / "g.json", {"x": [1, 2, 3, 4]})),
            "--minimise", "loss", "--retries", "0", *ENGINE, "--workers", "2", "--results", str(results)]
    if where == "/dev/full":
        sink = open("/dev/full", "w")
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)  # every write to the pipe fails with EPIPE
        sink = os.fdopen(write_end, "w")
    with sink:
        proc = subprocess.run(command(argv), cwd=TESTS, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=sink,
                              stderr=subprocess.PIPE, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "failed" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    summary = read_summary(results)
    assert summary["status"] == "complete" and summary["items_done"] == 4 and not summary["failed_items"], summary


def test_a_function_that_raises_is_retried_then_listed_and_a_bad_return_names_the_item(tmp_path):
    grid = write_json(tmp_path / "grid.json", {"x": [1, 2, 3]})
    raised = sweep("sweep_functions:raises", tmp_path / "raises", "--grid", str(grid), "--retries", "1")
    assert raised.returncode == 1, raised.stderr
    *_, closing, retry = raised.stderr.splitlines()
    assert "sweep: failed: 2 of 3 items done, 1 failed, in " in closing, raised.stderr
    assert retry.startswith("sweep: run the failed items again with: python -m common.sweep ") \
        and " --retries 1 " in retry and retry.endswith(" --resume"), raised.stderr
    failed = read_summary(tmp_path / "raises")["failed_items"]
    assert [f["key"] for f in failed] == ["x=2"] and "ValueError: x=2 is not allowed here" in failed[0]["error"]
    attempts = [e for e in journal_entries(tmp_path / "raises") if e.get("key") == "x=2" and e["type"] == "attempt_failed"]
    assert len(attempts) == 2 and all(e["traceback"].startswith("Traceback") for e in attempts)
    assert "x=2 is not allowed here" in (tmp_path / "raises" / "report.html").read_text()
    assert len(rows(tmp_path / "raises")) == 2
    bad = sweep("sweep_functions:not_json", tmp_path / "json", "--grid", str(grid), "--retries", "0")
    assert bad.returncode == 1, bad.stderr
    (failure,) = read_summary(tmp_path / "json")["failed_items"]
    assert failure["key"] == "x=1"
    assert failure["error"] == 'TypeError: item x=1 returned a value that is not JSON at ["model"]: a set'
    # a return that cannot be kept fails for good at once (the same seed would return it again): no retry
    scalar = sweep("sweep_functions:not_a_dict", tmp_path / "scalar", "--grid", str(grid), "--retries", "2")
    assert scalar.returncode == 1
    assert "returned a float, not a dict" in read_summary(tmp_path / "scalar")["failed_items"][0]["error"]
    tried = [e for e in journal_entries(tmp_path / "scalar") if e["type"] == "attempt_failed"]
    assert sorted(e["key"] for e in tried) == ["x=1", "x=2", "x=3"], tried  # one attempt each
    assert {e["traceback"] for e in tried if e["key"] == "x=1"} == {
        "TypeError: item x=1 returned a float, not a dict of JSON values\n"}


def test_a_bug_that_fails_every_item_stops_the_run_early_and_a_resume_after_the_fix_finishes(tmp_path):
    """--stop-after-failures: 40 points whose function always raises; the run stops after 2 failures
    (exit 1, which a Slurm script does not requeue, unlike a stop's 75) and says so in one closing
    line, in summary.md and status.json; after the fix, --resume runs every point."""
    (tmp_path / "fit.py").write_text("import os\n\n\ndef fit(params):\n    if os.path.exists('bug'):\n"
                                     "        raise ValueError('a bug')\n    return {'loss': params['x']}\n")
    (tmp_path / "bug").touch()
    grid = write_json(tmp_path / "grid.json", {"x": list(range(40))})
    args = ("--grid", str(grid), "--retries", "0", "--stop-after-failures", "2")
    stopped = sweep("fit:fit", tmp_path / "r", *args, cwd=tmp_path)
    assert stopped.returncode == 1, stopped.stderr
    closing = stopped.stderr.splitlines()[-1]
    assert closing.startswith("sweep: failed: 2 items failed for good (--stop-after-failures 2): stopped with 0 of 40 "
                              "items done; their errors are in "), closing
    assert " --stop-after-failures 2 " in closing and closing.endswith(" --resume"), closing
    facts = read_summary(tmp_path / "r")
    assert (facts["status"], len(facts["failed_items"])) == ("failed", 2)
    assert facts["stopped_because"] == "2 items failed for good (--stop-after-failures 2)"
    assert "Stopped before the end. After a fix, finish with:" in (tmp_path / "r" / "summary.md").read_text()
    assert "(or with a larger --stop-after-failures, where such failures are expected)" in closing
    assert json.loads((tmp_path / "r" / "status.json").read_text())["state"] == "failed"
    assert len([e for e in journal_entries(tmp_path / "r") if e["type"] == "attempt_failed"]) < 40
    shown = status_of(tmp_path / "r").stdout
    assert "sweep: failed (stopped: 2 items failed for good (--stop-after-failures 2))" in shown, shown
    assert "resume   after a fix, with: " in shown, shown
    (tmp_path / "bug").unlink()
    fixed = sweep("fit:fit", tmp_path / "r", *args, "--resume", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert read_summary(tmp_path / "r")["items_done"] == 40 and len(rows(tmp_path / "r")) == 40


def test_a_point_some_of_whose_repeats_diverged_ranks_after_those_whose_all_ran(tmp_path):
    """lr 1.0 returns NaN in some of its 6 repeats and 0.01 in the rest: it ranked first on its
    lucky repeats, and the headline read as if it were one run. Now it ranks last, said "k of 6"."""
    grid = write_json(tmp_path / "grid.json", {"lr": [0.001, 0.01, 1.0]})
    ran = sweep("sweep_functions:diverges", tmp_path / "r", "--grid", str(grid), "--repeats", "6", "--seed", "3",
                "--minimise", "loss")
    assert ran.returncode == 0, ran.stderr
    best = read_summary(tmp_path / "r")["sweep"]["best"]
    assert [entry["params"]["lr"] for entry in best] == [0.001, 0.01, 1.0]
    assert [(entry["n"], entry["repeats"]) for entry in best[:2]] == [(6, 6), (6, 6)]
    assert (best[2]["n"], best[2]["repeats"], best[2]["mean"]) == (3, 6, 0.01)  # seed 3: three odd seeds
    assert "| 3 | 1.0 | 0.01 | 0 | 3 of 6 |" in (tmp_path / "r" / "summary.md").read_text()
    assert ran.stdout.splitlines()[-1] == "best loss: 0.501 (mean of 6 repeats) at lr=0.001", ran.stdout
    assert "first result" not in ran.stderr, ran.stderr
    # a first result that diverged (NaN, which reaches rank 0 as null) is no sign of a misspelt name
    nan_first = sweep("sweep_functions:diverges", tmp_path / "nan", "--grid",
                      str(write_json(tmp_path / "lr.json", {"lr": [1.0]})), "--seed", "1", "--minimise", "loss")
    assert nan_first.returncode == 0 and "first result" not in nan_first.stderr, nan_first.stderr
    assert nan_first.stdout.splitlines()[-1] == "nothing to rank: no result holds a finite number named 'loss' (it " \
        "returned 'loss' as null; the function returned no named numbers)", nan_first.stdout  # and no other name to give
    # repeats that raised count as missing too (before, 3 finished of 3 made it a complete point)
    raised = sweep("sweep_functions:raises_mostly", tmp_path / "raised", "--grid", str(grid), "--repeats", "6", "--seed",
                   "3", "--minimise", "loss", "--retries", "0")
    assert raised.returncode == 1, raised.stderr
    ranked = read_summary(tmp_path / "raised")["sweep"]["best"]
    assert [(entry["params"]["lr"], entry["n"], entry["repeats"]) for entry in ranked] == [
        (0.001, 6, 6), (0.01, 6, 6), (1.0, 3, 6)]
    from common.sweep.report import headline  # where every point lost repeats, the best one says so

    for n, said in ((1, "the one of 6 repeats"), (2, "mean of the 2 of 6 repeats")):
        top = {"params": {"lr": 1.0}, "mean": 0.01, "n": n, "repeats": 6}
        assert headline({"metric": "loss", "best": [top]}) == [f"best loss: 0.01 ({said} that returned a finite value) "
                                                                f"at lr=1.0"]


def test_the_early_warning_of_a_misnamed_metric_and_the_resume_it_suggests():
    """The first result's warning, in-process: a null (a NaN) or a number is no sign of a misspelt
    name; the name suggested is the closest number returned, quoted for the shell, never the metric
    itself, and none where the function returned no other number."""
    from common.sweep.app import Plan
    from common.sweep.report import first_result_warning

    def warning(metric, returned, goal="min"):
        return first_result_warning(Plan(print, None, [{}], "grid", 1, metric, goal), returned)

    assert warning("loss", {"loss": None}) is None and warning("loss", {"loss": 2.5}) is None
    assert warning(None, {"x": 1}) is None
    said = warning("val_loss", {"val-loss": 0.3, "epochs": 4})
    assert said.endswith(", and a --resume with --minimise val-loss ranks the finished items without running them "
                         "again"), said
    assert "--maximise 'val loss' ranks" in warning("val_loss", {"val loss": 0.3}, goal="max")
    assert "--minimise NAME ranks" in warning("los", {"-loss": 0.3})  # read as a flag, unquoted or not
    assert "--minimise NAME ranks" in warning("accuracy", {"f1": 0.3, "loss": 1.0})  # nothing close
    assert warning("loss", {"loss": "low", "status": "ok"}).endswith(
        "(it returned 'loss' as a string; the function returned no named numbers), so nothing may be ranked; the run "
        "goes on"), warning("loss", {"loss": "low"})


def test_points_tied_with_the_best_are_counted_beside_it(tmp_path):
    """The demo's sweep named C=10 best, at the same mean as C=100 and C=1000: the line now says how
    many other points tie with it (the first in the space's order is the one named)."""
    from common.sweep.report import headline

    top = {"params": {"C": 10}, "mean": 0.0267, "n": 1, "repeats": 1}
    assert headline({"metric": "error", "best": [top], "best_ties": 2}) == [
        "best error: 0.0267 at C=10 (2 other points tie with it: the first in the space's order is named)"]
    assert headline({"metric": "error", "best": [top], "best_ties": 0}) == ["best error: 0.0267 at C=10"]
    grid = write_json(tmp_path / "grid.json", {"x": [3, 1, -1, -3]})
    ran = sweep("sweep_functions:square", tmp_path / "r", "--grid", str(grid), "--minimise", "loss")
    assert ran.returncode == 0, ran.stderr
    assert read_summary(tmp_path / "r")["sweep"]["best_ties"] == 1  # x=1 and x=-1
    assert ran.stdout.splitlines()[-1].endswith(" at x=1 (1 other point ties with it: the first in the space's order is "
                                                "named)"), ran.stdout

class _Tables(HTMLParser):
    """The cells' text of every table in an HTML page: [[[cell, ...], ...], ...]."""

    def __init__(self, page: str):
        super().__init__()
        self.tables: list = []
        self._cell = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def test_values_and_errors_with_markdowns_characters_stay_in_their_cells(tmp_path):
    """A | in a value started a new cell of summary.md's tables, so the numbers stood under the
    wrong headers (in report.html too), and `, * and _ became code and emphasis: each shows as written."""
    kinds = ["a|b", "`t`", "*b* _c_", "[l](u)", "fail | <b>x</b>"]
    grid = write_json(tmp_path / "grid.json", {"kind": kinds})
    ran = sweep("sweep_functions:raises_its_text", tmp_path / "r", "--grid", str(grid), "--retries", "0",
                "--minimise", "loss")
    assert ran.returncode == 1, ran.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    tables = _Tables(page).tables
    ranking = next(table for table in tables if table[0][:2] == ["", "kind"])
    assert ranking[0] == ["", "kind", "loss", "sd", "repeats"]
    assert [row[1:3] for row in ranking[1:]] == [["a|b", "3"], ["`t`", "3"], ['"[l](u)"', "6"], ["*b* _c_", "7"]]
    assert all(len(row) == 5 for row in ranking)
    failed = next(table for table in tables if table[0] == ["item", "error"])
    assert failed[1:] == [["kind=fail | <b>x</b>", "ValueError: fail | <b>x</b>"]]
    assert "<b>x</b>" not in page  # text, not markup
    markdown = (tmp_path / "r" / "summary.md").read_text()
    assert "| 1 | a\\|b | 3 |  | 1 |" in markdown, markdown
    # the answer under the title: the user's text escaped, and a failed run's said to be of what finished
    # (a|b and `t` are both 3 long: a tie)
    tie = " (1 other point ties with it: the first in the space's order is named)"
    assert markdown.splitlines()[2] == f"**best loss: 3.0 at kind=a\\|b{tie}** (of the items that finished: 1 item failed)"
    assert f"<strong>best loss: 3.0 at kind=a|b{tie}</strong> (of the items that finished: 1 item failed)" in page

def test_what_a_users_code_does_to_its_worker_fails_only_its_item_in_one_line(tmp_path):
    """sys.exit, an exception whose message cannot be made: each fails its item and the worker goes
    on. A message of several lines (torch's, scikit-learn's) is shown by its first, type and all. A
    return that pickle cannot send (a float of a local class; one whose __reduce__ raises) killed the
    worker, and the item was handed out again for ever; the worker now hands on every result as the
    journal keeps it (JSON: here the float 0.25), which is always sent."""
    grid = write_json(tmp_path / "grid.json", {"case": ["fine", "unpicklable", "multiline", "bad message", "exit",
                                                   "unpicklable by OSError"]})
    ran = sweep("sweep_functions:hostile", tmp_path / "r", "--grid", str(grid), "--retries", "0", workers=1, timeout=60)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    failed = {f["key"]: f["error"] for f in read_summary(tmp_path / "r")["failed_items"]}
    assert failed == {
        "case=multiline": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nSee the documentation",
        "case=bad message": "_BadMessage (its message could not be made: ValueError)",
        "case=exit": "SystemExit: bye"}
    assert "item case=multiline failed for good: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB …" \
        in ran.stderr
    assert "| case=multiline | RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB … |" \
        in (tmp_path / "r" / "summary.md").read_text()
    assert "case=multiline, attempt 1 on rank0-cpu0: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB …" \
        in html.unescape((tmp_path / "r" / "report.html").read_text())
    shown = run(["-m", "common.status", str(tmp_path / "r")])
    assert "case=multiline: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB …" in shown.stdout, shown.stdout
    assert {row["key"]: row["loss"] for row in rows(tmp_path / "r")} == {
        "case=fine": "0.5", "case=unpicklable": "0.25", "case=unpicklable by OSError": "0.25"}
    assert (tmp_path / "r" / "logs" / "rank0-cpu0.log").read_text().count("started: pid") == 1  # one worker throughout


BAD_INPUTS = [
    # (target, files {name: content}, flags, fragments of the one-line error)
    ("no_such_module:fit", {"g.json": {"x": [1]}}, ["--grid", "g.json"], ["cannot import 'no_such_module'"]),
    ("broken:fit", {"g.json": {"x": [1]}, "broken.py": "def fit(:\n"}, ["--grid", "g.json"],
     ["cannot import 'broken'", "SyntaxError"]),
    ("sweep_functions:nope", {"g.json": {"x": [1]}}, ["--grid", "g.json"], ["has no 'nope'"]),
    ("sweep_functions:NOT_A_FUNCTION", {"g.json": {"x": [1]}}, ["--grid", "g.json"], ["not a function"]),
    ("sweep_functions", {"g.json": {"x": [1]}}, ["--grid", "g.json"], ["module:function"]),
    ("sweep_functions.py:noisy", {"g.json": {"x": [1]}}, ["--grid", "g.json"],  # a file, not a module
     ["names a module, not a file: sweep_functions:noisy, got 'sweep_functions.py:noisy'"]),
    ("./sub/mine.py:fit", {"g.json": {"x": [1]}}, ["--grid", "g.json"],
     ["names a module, not a file: mine:fit, from the folder that holds it (cd 'sub')"]),
    ("sweep_functions:wrong_signature", {"g.json": {"x": [1]}}, ["--grid", "g.json"], ["takes 'x'"]),
    ("sweep_functions:awaited", {"g.json": {"x": [1]}}, ["--grid", "g.json"], ["'awaited' is defined with async def"]),
    ("sweep_functions:noisy", {"g.json": {}}, ["--grid", "g.json"], ["grid is empty"]),
    ("sweep_functions:everything", {"g.json": {"x": [1]}}, ["--grid", "g.json"],  # it would be given None
     ["'everything' takes 'state', what a setup function returns once per worker, but no setup is given"]),
    ("sweep_functions:noisy", {"g.json": {"x": 3}}, ["--grid", "g.json"], ["'x' must be a list of values, got an integer (3)"]),
    ("sweep_functions:noisy", {"g.json": {"x": {"loguniform": [1e-4, 0.1]}}}, ["--grid", "g.json"],  # a --space file
     ["the grid's 'x' is a distribution ({'loguniform': [0.0001, 0.1]}): a random space is given with --space"]),
    ("sweep_functions:noisy", {"g.json": {"x": []}}, ["--grid", "g.json"], ["'x' is an empty list"]),
    ("sweep_functions:noisy", {"g.json": [1, 2]}, ["--grid", "g.json"], ["grid must be an object of parameter -> list of values, got a list"]),
    ("sweep_functions:noisy", {"g.json": "{not json"}, ["--grid", "g.json"], ["not valid JSON"]),
    ("sweep_functions:noisy", {}, ["--grid", "missing.json"], ["cannot read it"]),
    ("sweep_functions:noisy", {"p.json": []}, ["--points", "p.json"], ["list of points is empty"]),
    ("sweep_functions:noisy", {"p.json": [{"x": 1}, {"x": 1}]}, ["--points", "p.json"], ["same as point 1"]),
    ("sweep_functions:noisy", {"p.json": [{"x": 1}, {"x": 1.0}]}, ["--points", "p.json"],
     ["point 2 (x=1.0) is the same as point 1 in numbers (x=1)"]),
    ("sweep_functions:noisy", {"g.json": {"x": [1, 2, 1.0]}}, ["--grid", "g.json"], ["lists 1 and 1.0: one number"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"choice": [1, 2, 1.0]}}}, ["--space", "s.json", "--samples", "3"],
     ["the space's 'x' (choice) lists 1 and 1.0: one number"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"normal": [0, 1]}}}, ["--space", "s.json", "--samples", "2"],
     ["unknown distribution 'normal'"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"uniform": [1, 0]}}}, ["--space", "s.json", "--samples", "2"],
     ["wrong order"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"loguniform": [0, 1]}}}, ["--space", "s.json", "--samples", "2"],
     ["must be positive"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"int": [0.5, 3]}}}, ["--space", "s.json", "--samples", "2"],
     ["integers"]),
    ("sweep_functions:noisy", {"s.json": {}}, ["--space", "s.json", "--samples", "2"], ["space is empty"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"uniform": [0, 1]}}}, ["--space", "s.json"], ["needs --samples"]),
    ("sweep_functions:noisy", {"g.json": {"x": [1]}}, ["--grid", "g.json", "--samples", "3"], ["--samples draws"]),
    ("sweep_functions:noisy", {}, [], ["--grid FILE, --points FILE or --space FILE"]),
    ("sweep_functions:noisy", {"g.json": {"x": [1]}}, ["--grid", "g.json", "--repeats", "0"], ["--repeats"]),
    ("sweep_functions:noisy", {"g.json": {"x": [1]}}, ["--grid", "g.json", "--setup", "nothing_here"],
     ["has no 'nothing_here'"]),
    ("sweep_functions:noisy", {"g.json": {"x": [1]}}, ["--grid", "g.json", "--setup", "NOT_A_FUNCTION"],
     ["--setup 'sweep_functions:NOT_A_FUNCTION' is not a function but a value of type int"]),
    ("unset:fit", {"g.json": {"x": [1]}, "unset.py": "fit = None\n"}, ["--grid", "g.json"],
     ["MODULE:FUNCTION 'unset:fit' is not a function but None"]),  # was "has no 'fit'"
    ("sweep_functions:noisy", {"g.json": {"x": [1]}}, ["--grid", "g.json", "--setup", "wrong_signature"],
     ["setup wrong_signature() cannot be called as each worker calls it", "missing a required argument: 'y'"]),
    ("sweep_functions:noisy", {"p.json": [{"x": 1}, {"x": 1, "repeat": 1}]}, ["--points", "p.json", "--repeats", "2"],
     ["parameter named 'repeat' (the point repeat=1,x=1) and --repeats can give two items one key"]),
    ("exits:fit", {"g.json": {"x": [1]}, "exits.py": "import sys\nsys.exit(3)\ndef fit(params):\n    return {}\n"},
     ["--grid", "g.json"], ["importing 'exits'", "exited the program (SystemExit: 3)"]),
    ("positional:fit", {"g.json": {"x": [1]}, "positional.py": "def fit(params, /):\n    return {}\n"},
     ["--grid", "g.json"], ["positional-only"]),
    ("yields:fit", {"g.json": {"x": [1]}, "yields.py": "def fit(params):\n    yield {'loss': 1}\n"},
     ["--grid", "g.json"], ["the sweep function 'fit' yields: it must return a dict of its values"]),
    ("sweep_functions:noisy", {"g.yaml": "x: [1]\n123: [2]\n"}, ["--grid", "g.yaml"],  # YAML's unquoted 123 is a number
     ["parameter name 123 is not a string but int", "quote a name such as 123"]),
    ("partial:fit", {"g.json": {"x": [1]}, "partial.py": "import functools\ndef base(params, scale=1):\n    return {}\n"
                     "fit = functools.partial(base, scale=2)\n"}, ["--grid", "g.json"],
     ["must be a function defined with def, got a partial", "wrap it in a def"]),
    ("instance:fit", {"g.json": {"x": [1]}, "instance.py": "class Fit:\n    def __call__(self, params):\n        return {}\n"
                      "fit = Fit()\n"}, ["--grid", "g.json"], ["must be a function defined with def, got a Fit"]),
    # what Python cannot recurse through, and what would fill the memory or overflow numpy's draws
    ("sweep_functions:noisy", {"g.json": '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"}, ["--grid", "g.json"],
     ["not valid JSON: nested too deeply"]),
    ("sweep_functions:noisy", {"g.yaml": "x: &a [*a]\n"}, ["--grid", "g.yaml"], ["contains itself"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"uniform": [-1e308, 1e308]}}}, ["--space", "s.json", "--samples", "2"],
     ["too far apart for a float"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"int": [0, 10 ** 20]}}}, ["--space", "s.json", "--samples", "2"],
     ["within 64-bit integers"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"int": [0, 10 ** 400]}}}, ["--space", "s.json", "--samples", "2"],
     ["within 64-bit integers"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"loguniform": [1, 10 ** 400]}}}, ["--space", "s.json", "--samples", "2"],
     ["within a float's range"]),
    ("sweep_functions:noisy", {"s.json": {"x": {"uniform": [0, 1]}}}, ["--space", "s.json", "--samples", "100000000"],
     ["100,000,000 items", "split the sweep"]),
    ("sweep_functions:noisy", {"g.json": {"x": [1, 2]}}, ["--grid", "g.json", "--repeats", "100000000"],
     ["2 points x --repeats 100000000 is 200,000,000 items"]),
    ("sweep_functions:noisy", {"g.json": {name: list(range(10)) for name in "abcdefg"}}, ["--grid", "g.json"],
     ["the grid: 10,000,000 points"]),
    ("sweep_functions:noisy", {}, ["--grid", "/dev/zero"], ["larger than 256 MiB: not a sweep's parameters"]),
    # a key given twice: the later one silently won (JSON and YAML alike)
    ("sweep_functions:noisy", {"g.json": '{"x": [1], "x": [2, 3]}'}, ["--grid", "g.json"],
     ["not valid JSON: duplicate key 'x'"]),
    ("sweep_functions:noisy", {"s.yaml": "lr: {uniform: [0, 1]}\nlr: {uniform: [1, 2]}\n"},
     ["--space", "s.yaml", "--samples", "2"], ["not valid YAML: duplicate key 'lr'"]),
]


@pytest.mark.parametrize("target,files,flags,fragments", BAD_INPUTS,
                         ids=[f"{i}-{case[0].split(':')[-1]}-{'-'.join(case[2][:1]) or 'none'}"
                              for i, case in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, target, files, flags, fragments):
    (tmp_path / "sweep_functions.py").write_text((TESTS / "sweep_functions.py").read_text())
    for name, content in files.items():
        write_json(tmp_path / name, content)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = sweep(target, tmp_path / "results", *flags, cwd=tmp_path)
    assert_usage_error(result, "sweep: error:", *fragments)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == before


def test_bad_input_on_two_ranks_is_still_one_line(tmp_path):
    write_json(tmp_path / "g.json", {"x": [1], "y": 3})
    result = sweep("sweep_functions:noisy", tmp_path / "results", "--grid", str(tmp_path / "g.json"), ranks=2)
    assert_usage_error(result, "'y' must be a list")
    assert not (tmp_path / "results").exists()


def test_the_two_examples_run_and_find_a_good_point(tmp_path):
    svm = run([str(REPO / "examples" / "sweep" / "svm_digits.py"), *ENGINE, "--workers", "2",
               "--results", str(tmp_path / "svm")], ranks=2)
    assert svm.returncode == 0, svm.stderr
    best = read_summary(tmp_path / "svm")["sweep"]["best"][0]
    assert best["mean"] < 0.05 and len(rows(tmp_path / "svm")) == 20
    net = run([str(REPO / "examples" / "sweep" / "torch_digits.py"), *ENGINE, "--workers", "2",
               "--results", str(tmp_path / "torch")])
    assert net.returncode == 0, net.stderr
    best = read_summary(tmp_path / "torch")["sweep"]["best"][0]
    assert best["mean"] < 0.2 and best["n"] == 3 and len(rows(tmp_path / "torch")) == 18
    assert {row["device"] for row in rows(tmp_path / "torch")} <= {"cpu0", "cpu1"}


def test_the_fast_paths_give_what_the_general_ones_gave():
    """Keys made from a grid's texts, the C-speed check of a flat return and results.jsonl written
    field by field: each equal to what point_key, to_jsonable and json.dumps make of the same values."""
    import math

    import numpy as np

    from common.app import Record
    from common.items import Item
    from common.results.outputs import to_jsonable
    from common.sweep import report
    from common.sweep.app import checked_result
    from common.sweep.space import grid_space, point_key

    points, keys = grid_space({"x": [1, 2.5, "a,b"], "C": [True, None], "b": [[1, 2], {"k": "v"}]})
    assert len(points) == 12 and keys == [point_key(point) for point in points]
    for value in ({}, {"loss": 0.5, "n": 3, "ok": True, "name": "x", "none": None}, {"loss": math.nan}, {"a": 0.5, "b": math.nan, "c": "x"},
                  {"a": math.inf, "b": -0.0, "n": 2}, {"a": 1.5, "ok": False, "none": None},
                  {"loss": np.float64(0.25)}, {"v": [1, (2, 3)]}, {1: "int key"}):
        got = checked_result("k", value)
        assert got == to_jsonable(dict(value)) and got is not value
        assert [type(v) for v in got.values()] == [type(v) for v in to_jsonable(dict(value)).values()]
    # an int just short of 2**1024 has no float either (float() rounds it up); one of 5,000 digits has no str()
    with pytest.raises(TypeError, match="past a float's range"):
        checked_result("k", {"n": 2 ** 1024 - 2 ** 970})
    assert checked_result("k", {"n": 2 ** 1024 - 2 ** 970 - 1}) == {"n": 2 ** 1024 - 2 ** 970 - 1}
    with pytest.raises(TypeError, match="an integer of about 5001 digits"):
        checked_result("k", {"n": [10 ** 5000]})
    with pytest.raises(TypeError, match=r"returned the names 1 and '1', which are one name in JSON \('1'\)"):
        checked_result("k", {1: 2.0, "1": 3.0})  # one of them was silently lost
    with pytest.raises(TypeError, match=r"returned the names True and 'true'"):
        checked_result("k", {True: 1, "true": 2})
    with pytest.raises(TypeError, match="not JSON at .*a longdouble"):  # its item() is numpy's again: no recursion
        checked_result("k", {"loss": np.longdouble(0.5)})
    # numpy's NaN as Python's: None, as a resume reads it back from the journal (it was NaN, then None)
    assert checked_result("k", {"loss": np.float64(math.nan), "v": np.array([1.0, math.nan])}) == \
        {"loss": None, "v": [1.0, None]} == json.loads(json.dumps(checked_result("k", {"loss": math.nan, "v": [1.0, math.nan]})))
    items, rows = [], []
    for number, (seconds, host) in enumerate([(0.25, "h"), (3, "h"), (math.inf, "h"), (0.5, None)]):
        items.append(Item(f"x={number}", {"point": {"x": number}, "repeat": 0}))
        rows.append(Record(f"x={number}", {"seed": 7, "return": {"v": "é\n\"", "w": [1.5]}}, seconds, host=host))
    _, lines = report._tables(list(zip(items, rows)), ["x"], ["v"])
    assert lines.splitlines() == [json.dumps({"key": item.key, "point": item.params["point"], "repeat": 0, "seed": 7,
                                              "result": record.result["return"],
                                              # strict JSON: a time that is not finite is null
                                              "seconds": round(record.seconds, 6) if math.isfinite(record.seconds) else None,
                                              "host": record.host, "device": ""}, allow_nan=False)
                                  for item, record in zip(items, rows)]
    # one parameter: its point written as {"x": value} for an int or str, json.dumps' way for the others
    items = [Item(f"x={number}", {"point": point, "repeat": 0}) for number, point in enumerate(
        [{"x": 2 ** 70}, {"x": "é\n\"a,b"}, {"x": True}, {"x": None}, {"x": 0.5}, {"x": [1]}, {"x": 3, "y": 1}, {}])]
    rows = [Record(item.key, {"seed": 7, "return": {}}, 0.25, host="h", device="cpu0") for item in items]
    table, lines = report._tables(list(zip(items, rows)), ["x"], [])
    assert lines.splitlines() == [json.dumps({"key": item.key, "point": item.params["point"], "repeat": 0, "seed": 7,
                                              "result": {}, "seconds": 0.25, "host": "h", "device": "cpu0"})
                                  for item in items]
    expected = io.StringIO()
    csv.writer(expected, lineterminator="\n").writerows(
        [["key", "x", "repeat", "seed", "seconds", "host", "device"]]
        + [[item.key, report._cell(item.params["point"].get("x", "")), 0, 7, 0.25, "h", "cpu0"] for item in items])
    assert table == expected.getvalue()


def test_a_grid_takes_a_tensor_or_a_generator_as_its_values_and_hints_only_for_one_value():
    """torch.logspace(...) was refused with advice to write [[0.001, ...]] (one point whose value is a
    list), a generator with ["<generator object ...>"]: both are their values now, as a numpy array
    and a range were. The one-value hint is given where one value was written, not for an object."""
    import itertools

    import torch

    from common.errors import UsageError
    from common.sweep.space import grid_space

    assert grid_space({"lr": torch.tensor([0.5, 0.25])})[1] == ["lr=0.5", "lr=0.25"]
    assert grid_space({"x": (i for i in range(3))})[1] == ["x=0", "x=1", "x=2"]
    with pytest.raises(UsageError, match="gives more than 1,000,000 values \\(an endless iterator\\?\\)"):
        grid_space({"x": itertools.count()})  # it used to be refused; it must not hang
    with pytest.raises(UsageError, match=r"got an integer \(3\); write \[3\] for one value$"):
        grid_space({"x": 3})
    with pytest.raises(UsageError, match=r"must be a list of values, got an object \(<object object at .*>\)$"):
        grid_space({"x": object()})


def test_two_parameters_whose_names_pick_the_same_stream_are_refused():
    """Each parameter's draws come from a stream its name's CRC-32 picks; "plumless" and "buckeroo"
    share one, so they drew the same numbers (perfectly correlated samples, silently). Refused in one
    line, naming both; names that differ keep their values."""
    from common.errors import UsageError
    from common.sweep.space import sample_points

    with pytest.raises(UsageError, match="the space's 'buckeroo' and 'plumless' would draw the same random numbers"):
        sample_points({"buckeroo": {"uniform": [0, 1]}, "plumless": {"uniform": [0, 1]}}, 3, 7)
    alone = sample_points({"plumless": {"uniform": [0, 1]}}, 3, 7)
    assert [p["plumless"] for p in sample_points({"plumless": {"uniform": [0, 1]}, "other": {"int": [1, 3]}}, 3, 7)] \
        == [p["plumless"] for p in alone]


def test_torch_tensors_in_a_return_are_their_numbers():
    """{"loss": loss} with loss a tensor (on the GPU where there is one) is what a torch user returns:
    it was refused as "not JSON ... a Tensor", asking for .item() on every value."""
    import torch

    from common.sweep.app import checked_result

    returned = {"loss": torch.tensor(0.25), "grad": torch.tensor([1.5, -2.0], requires_grad=True) * 1,
                "steps": torch.tensor(7), "half": torch.tensor(0.5, dtype=torch.bfloat16)}
    got = checked_result("k", returned)
    assert got == {"loss": 0.25, "grad": [1.5, -2.0], "steps": 7, "half": 0.5}
    assert [type(v) for v in got.values()] == [float, list, int, float]
    assert checked_result("k", {"loss": torch.tensor(float("nan"))}) == {"loss": None}  # as a Python NaN
    with pytest.raises(TypeError, match="not JSON"):
        checked_result("k", {"z": torch.tensor(1 + 2j)})


def test_the_seed_a_function_receives_is_numpys_first_word_of_the_items_stream():
    """item_seed32 works the word out without numpy's generate_state: the same for many items."""
    import random

    import numpy as np

    from common.items import item_seed, item_seed32

    draw = random.Random(11)
    for _ in range(5000):
        sequence = item_seed(draw.choice([0, 7, draw.randrange(2 ** 64)]), f"x={draw.random()},repeat={draw.randrange(9)}")
        assert item_seed32(sequence) == int(sequence.generate_state(1)[0])
    other = np.random.SeedSequence(5, pool_size=8)
    assert item_seed32(other) == int(other.generate_state(1)[0])


def test_the_workers_shortcut_to_that_word_equals_numpys_for_seeds_of_every_size():
    """ItemSeeds.word32 mixes the run's seed into numpy's pool once and each key's words after it:
    the same word as the item's SeedSequence, for seeds of one to seven 32-bit words."""
    import random

    from common.items import ItemSeeds, item_seed

    draw = random.Random(12)
    for seed in [0, 1, 25328, 2 ** 32 - 1, 2 ** 32, 2 ** 64 + 5, 2 ** 128 - 1, 2 ** 128 + 3, 2 ** 200 + 7,
                 *(draw.randrange(2 ** bits) for bits in (31, 63, 95, 160) for _ in range(3))]:
        seeds = ItemSeeds(seed)
        assert seeds._first is not None, "the shortcut, not numpy's way"
        for _ in range(200):
            key = f"x={draw.random()},repeat={draw.randrange(9)}"
            assert seeds.word32(key) == int(item_seed(seed, key).generate_state(1)[0]), (seed, key)
            assert seeds.maker("int32")(key) == seeds.word32(key)
        assert seeds.maker("sequence")("k").spawn_key == item_seed(seed, "k").spawn_key


def test_the_shortcut_falls_back_to_numpy_where_its_self_check_fails(monkeypatch):
    import common.items as items

    monkeypatch.setattr(items, "_run_mixed", lambda seed: (12345, ((1, 2),) * 4))  # a wrong mix
    seeds = items.ItemSeeds(7)
    assert seeds._first is None
    assert seeds.word32("x=1") == int(items.item_seed(7, "x=1").generate_state(1)[0])
    with pytest.raises(ValueError, match="seed_form must be one of sequence, int32"):
        seeds.maker("int64")


UNGUARDED = """from common import sweep


def fit(params):
    return {"y": params["x"] * 2}


"""


def test_a_script_calling_sweep_main_unguarded_is_one_line_naming_the_line(tmp_path):
    """Each worker imports the script: without `if __name__ == "__main__":` it would start a sweep of
    its own. Found before anything is written; called from a function, each worker says it."""
    script = write_json(tmp_path / "unguarded.py", UNGUARDED + 'raise SystemExit(sweep.main(fit, grid={"x": [1, 2]}))\n')
    result = run([str(script), *ENGINE, "--results", str(tmp_path / "r")], cwd=tmp_path)
    assert_usage_error(result, "unguarded.py:8:", "if __name__ ==")
    assert not (tmp_path / "r").exists()
    # written as most such scripts are, without raise SystemExit(...): exit 2 all the same (it was 0)
    script = write_json(tmp_path / "bare.py", UNGUARDED + 'sweep.main(fit, grid={"x": [1, 2]})\n')
    assert_usage_error(run([str(script), *ENGINE, "--results", str(tmp_path / "b")], cwd=tmp_path), "bare.py:8:")
    script = write_json(tmp_path / "via_function.py", UNGUARDED + 'def go():\n    return sweep.main(fit, grid={"x": [1]})\n\n\n'
                   'raise SystemExit(go())\n')
    result = run([str(script), *ENGINE, "--results", str(tmp_path / "f")], cwd=tmp_path)
    assert result.returncode == 1 and "sweep.main ran inside a worker" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    guarded = write_json(tmp_path / "guarded.py", UNGUARDED + 'if __name__ == "__main__":\n'
                    '    raise SystemExit(sweep.main(fit, grid={"x": [1, 2]}))\n')
    assert run([str(guarded), "--help"], cwd=tmp_path).stdout.startswith(f"usage: python {guarded}")
    assert run([str(guarded), *ENGINE, "--results", str(tmp_path / "g")], cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("source", ["python -c", "standard input", "python -m package", "python -m package, unguarded"])
def test_a_function_defined_in_code_with_no_file_is_one_line_and_writes_nothing(tmp_path, source):
    """python -c, python - (and a notebook's or an interpreter's __main__, which has no file either),
    a package's __main__.py (which spawn leaves out on purpose): the spawned workers cannot import
    the function. Before, every check passed, the workers died with three tracebacks each and a
    results folder of failed items was written. A package's call without `if __name__ == ...` was
    told to add it first, then refused for its package (found by a helper's review): one answer now."""
    call = 'raise SystemExit(sweep.main(fit, grid={"x": [1, 2]}))\n'
    code = UNGUARDED + (call if source.endswith("unguarded") else 'if __name__ == "__main__":\n    ' + call)
    where = {"python -c": ["-c", code], "standard input": ["-"]}.get(source, ["-m", "mypackage"])
    (tmp_path / "mypackage").mkdir()
    (tmp_path / "mypackage" / "__init__.py").write_text("")
    (tmp_path / "mypackage" / "__main__.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n" + code)
    result = run([*where, *ENGINE, "--results", str(tmp_path / "r")], cwd=tmp_path,
                 input=code if source == "standard input" else None)
    assert_usage_error(result, "the function 'fit' is defined where the workers cannot import it from",
                       "put it in a .py file of its own")
    assert not (tmp_path / "r").exists()


def test_a_scripts_plain_sweep_main_statement_still_exits_with_the_runs_code(tmp_path):
    """``sweep.main(...)`` as a statement, its code dropped: the script ended 0 after failed items or a
    refusal, so a Slurm job never saw a failure (nor a stop's 75 to requeue on). A non-zero code
    is now the process's all the same; an assigned one is left to the script, also where another
    statement follows it on its line (which the line alone could not tell)."""
    body = UNGUARDED.replace('return {"y": params["x"] * 2}', 'return {"y": 1 / (params["x"] - 2)}')
    script = write_json(tmp_path / "plain.py", body + 'if __name__ == "__main__":\n'
                        '    sweep.main(fit, grid={"x": [1, 2]})\n    print("after main")\n')
    failed = run([str(script), *ENGINE, "--retries", "0", "--results", str(tmp_path / "r")], cwd=tmp_path)
    assert failed.returncode == 1 and "after main" not in failed.stdout, (failed.stdout, failed.stderr)
    assert run([str(script), *ENGINE, "--repeats", "0", "--results", str(tmp_path / "s")], cwd=tmp_path).returncode == 2
    ok = write_json(tmp_path / "ok.py", UNGUARDED + 'if __name__ == "__main__":\n    sweep.main(fit, grid={"x": [1, 2]})\n')
    assert run([str(ok), *ENGINE, "--results", str(tmp_path / "t")], cwd=tmp_path).returncode == 0
    kept = write_json(tmp_path / "kept.py", body + 'if __name__ == "__main__":\n'  # on one line with what follows
                      '    code = sweep.main(fit, grid={"x": [1, 2]}); print("kept", code)\n')
    assigned = run([str(kept), *ENGINE, "--retries", "0", "--results", str(tmp_path / "u")], cwd=tmp_path)
    assert assigned.returncode == 0 and "kept 1" in assigned.stdout, (assigned.stdout, assigned.stderr)
    given = write_json(tmp_path / "given.py", body + 'if __name__ == "__main__":\n'  # its code given to a call
                       '    print("code was", sweep.main(fit, grid={"x": [1, 2]}))\n')
    printed = run([str(given), *ENGINE, "--retries", "0", "--results", str(tmp_path / "v")], cwd=tmp_path)
    assert printed.returncode == 0 and "code was 1" in printed.stdout, (printed.stdout, printed.stderr)


@pytest.mark.parametrize("arguments, fragment", [
    ('repeats=0', "repeats must be a whole number of at least 1, got 0"),
    ('repeats=2.5', "repeats must be a whole number of at least 1, got 2.5"),
    ('space={"x": {"uniform": [0, 1]}}, samples=-1', "samples must be a whole number of at least 1, got -1"),
    ('minimise="y", maximise="y"', "takes minimise= or maximise=, not both"),
    ('minimize="y", maximize="z"', "takes minimise= or maximise=, not both"),  # the American spelling: the same
    ('minimise="y", minimize="z"', "takes minimise= or minimize=, not both"),  # one would silently win
    ('minimise=3', "minimise must be the name of a value the function returns, got an integer"),
])
def test_sweep_mains_own_arguments_are_checked_as_the_flags_are(tmp_path, arguments, fragment):
    """What the command line's flags refuse (--repeats 0, both goals) is refused from Python too: one
    line, exit 2, nothing written (it completed 0 items, maximised for both goals, or left a logs
    folder behind a traceback)."""
    space = "" if "space=" in arguments else 'grid={"x": [1, 2]}, '
    script = write_json(tmp_path / "script.py", UNGUARDED + 'if __name__ == "__main__":\n'
                   f'    raise SystemExit(sweep.main(fit, {space}{arguments}))\n')
    result = run([str(script), *ENGINE, "--results", str(tmp_path / "r")], cwd=tmp_path)
    assert_usage_error(result, "sweep: error: sweep.main", fragment)
    assert not (tmp_path / "r").exists()


def test_sweep_mains_values_that_the_command_line_replaces_or_numpy_gives_are_taken(tmp_path):
    """--repeats on the command line replaces sweep.main's (even a bad one); numpy's whole numbers
    are whole numbers, and its floats are values (np.float64 was refused as "not a value JSON can hold")."""
    script = write_json(tmp_path / "script.py", "import numpy as np\n" + UNGUARDED + 'if __name__ == "__main__":\n'
                   '    raise SystemExit(sweep.main(fit, grid={"x": [np.float64(0.5), 2]}, repeats=np.int64(0)))\n')
    assert run([str(script), *ENGINE, "--results", str(tmp_path / "r"), "--repeats", "2"], cwd=tmp_path).returncode == 0
    assert read_summary(tmp_path / "r")["items_total"] == 4
    assert sorted({row["x"] for row in rows(tmp_path / "r")}) == ["0.5", "2"]
    write_json(tmp_path / "script.py", script.read_text().replace("np.int64(0)", "np.int64(3)"))
    assert run([str(script), *ENGINE, "--results", str(tmp_path / "s")], cwd=tmp_path).returncode == 0
    assert read_summary(tmp_path / "s")["items_total"] == 6


def test_a_numpy_array_in_a_grid_is_its_list_of_values():
    """sweep.main(fit, grid={"lr": np.logspace(-2, -1, 2)}): what a researcher writes first (it was
    refused, with a hint to wrap the array in a list); a NaN in it is still refused."""
    import numpy as np

    from common.errors import UsageError
    from common.sweep.space import grid_space

    points, keys = grid_space({"lr": np.logspace(-2, -1, 2), "depth": np.arange(2, 4)})
    assert (points, keys) == grid_space({"lr": [0.01, 0.1], "depth": [2, 3]}) and "depth=2,lr=0.01" in keys
    assert all(type(point["depth"]) is int for point in points)
    with pytest.raises(UsageError, match="not a value JSON can hold"):
        grid_space({"lr": np.array([0.1, np.nan])})
    # a range is its numbers (it was refused with a hint to write ["range(1, 4)"], a string); a set
    # has no order to keep from run to run: refused, saying to give a list
    assert grid_space({"layers": range(1, 4)}) == grid_space({"layers": [1, 2, 3]})
    with pytest.raises(UsageError, match="'x' is a set, whose order is not kept from one run to the next: give a list"):
        grid_space({"x": {0.1, 0.2}})


def test_a_named_pipe_nobody_writes_to_is_one_line_not_a_wait_for_ever(tmp_path, monkeypatch):
    """--grid FIFO: open() blocked for ever, through SIGTERM (the deferred stop handler let it
    retry), and only SIGKILL ended the sweep. Now a bounded wait and one line; once a writer comes
    the file is read."""
    import threading

    import common.userfile as userfile
    from common.errors import UsageError
    from common.sweep.space import load_file

    fifo = tmp_path / "grid.json"
    os.mkfifo(fifo)
    monkeypatch.setattr(userfile, "PIPE_WAIT_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(UsageError, match="--grid '.*grid.json': a named pipe that nothing came through for 0.5 s"):
        load_file(fifo, "--grid")
    assert time.monotonic() - started < 5
    monkeypatch.setattr(userfile, "PIPE_WAIT_SECONDS", 30.0)  # a writer that comes late on a busy machine
    writer = threading.Timer(0.2, lambda: fifo.write_text('{"x": [1, 2]}'))
    writer.start()
    assert load_file(fifo, "--grid") == {"x": [1, 2]}
    writer.join()


def test_yaml_reads_an_exponent_without_a_dot_as_a_number(tmp_path):
    """lr: [1e-3, 1.5e3] is two numbers, as in JSON and YAML 1.2: PyYAML (YAML 1.1) made them the
    strings "1e-3" and "1.5e3", and the function got text. A quoted one stays a string."""
    from common.sweep.space import load_file

    grid = write_json(tmp_path / "g.yaml", 'lr: [1e-3, 1.5e3, 2E+2, .5e1, 0.01, 5, "1e-3", 3e, 1_000, ._e3]\n')
    assert load_file(grid, "--grid") == {"lr": [0.001, 1500.0, 200.0, 5.0, 0.01, 5, "1e-3", "3e", 1000, "._e3"]}
    assert [type(v) for v in load_file(grid, "--grid")["lr"][:4]] == [float] * 4


def test_yaml_reads_plain_words_and_numbers_as_yaml_1_2_does(tmp_path):
    """A grid of country codes [no, se] reached the function as [False, "se"]: PyYAML (YAML 1.1) made
    booleans of yes/no/on/off, octal of a leading zero (010 was 8), base 60 of colons (1:30 was 90)
    and dates of dates (refused: not a JSON value).
    Read as YAML 1.2 (and JSON) read them; true/false stay booleans, 0o17 and 0x1f numbers. A pipeline
    step's gpu: yes is refused with the reason."""
    from common.sweep.space import load_file

    grid = write_json(tmp_path / "g.yaml", "country: [no, se, yes, On, off, n]\nflag: [true, False, TRUE]\n"
                                      "n: [010, -07, 0o17, 0x1f, 1:30, +5, 1_000]\nnothing: [~, null]\n"
                                      "day: [2024-01-01, 2024-01-01 10:00:00, =]\n"
                                      "more: [1_, 1__0, 1:30.5, .inf, 1., !!int 0b11]\n")
    assert load_file(grid, "--grid") == {"country": ["no", "se", "yes", "On", "off", "n"], "flag": [True, False, True],
                                         "n": [10, -7, 15, 31, "1:30", 5, 1000], "nothing": [None, None],
                                         "day": ["2024-01-01", "2024-01-01 10:00:00", "="],
                                         "more": ["1_", "1__0", "1:30.5", math.inf, 1.0, 3]}
    assert [type(v) for v in load_file(grid, "--grid")["n"]] == [int, int, int, int, str, int, int]
    definition = write_json(tmp_path / "p.yaml", "name: p\nsteps:\n  - id: a\n    command: 'true'\n    gpu: yes\n")
    proc = run(["-m", "common.pipeline", str(definition), "--dry-run", "--gpu", "cpu", "--results", str(tmp_path / "r")])
    assert_usage_error(proc, "gpu must be true or false, got 'yes' (a word in YAML 1.2, which YAML 1.1 made a boolean)")


def test_a_metric_no_result_holds_is_said_on_stdout_with_the_names_returned(tmp_path):
    """--minimise with a misspelt name: the run completes (results.csv has every value), and its last
    line says nothing was ranked and what the function returned, instead of passing for a run with
    no metric. It is said as the first result comes too (not hours later, at the end), with the
    --resume that ranks the results without running them again, which works."""
    result = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(write_json(tmp_path / "g.json", {"x": [1, 2]})),
                   "--minimise", "los", workers=1)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    # the numbers it returned, not every name (a string or a list is not what --minimise takes)
    returned = "the function returned numbers named 'loss', 'draw', 'seed_seen'"
    hint = "a --resume with --minimise loss ranks the finished items without running them again"
    assert last == f"nothing to rank: no result holds a finite number named 'los' ({returned}); {hint}", last
    early = f"sweep: the first result holds no number named 'los' ({returned}), so nothing may be ranked; the run " \
            f"goes on, and {hint}"
    logged = result.stderr.splitlines()
    assert sum(line.endswith(early) for line in logged) == 1, result.stderr
    assert [line.endswith(early) for line in logged].index(True) < \
        ["the items ended in" in line for line in logged].index(True), logged
    assert early in (tmp_path / "r" / "logs" / "rank0.log").read_text()  # the run's story, afterwards
    again = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(tmp_path / "g.json"), "--resume",
                  "--minimise", "loss", workers=1)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1].startswith("best loss: "), again.stdout
    assert "2 of 2 items (2 from an earlier run)" in again.stderr and "first result" not in again.stderr, again.stderr
    # a name it returns, but not as a number: said so; no number is close to it
    named = sweep("sweep_functions:noisy", tmp_path / "k", "--grid", str(tmp_path / "g.json"), "--minimise", "kind",
                  workers=1)
    assert named.stdout.strip().splitlines()[-1] == "nothing to rank: no result holds a finite number named 'kind' " \
        f"(it returned 'kind' as a string; {returned}); a --resume with --minimise NAME ranks the finished items " \
        "without running them again", named.stdout
    assert "sweep: the first result holds no number named 'kind' (it returned 'kind' as a string;" in named.stderr
    # a return of many numbers: the first 20 of them (10,000 made a line of 89 KB)
    result = sweep("sweep_functions:many_numbers", tmp_path / "m", "--grid", str(tmp_path / "g.json"),
                   "--minimise", "los", workers=1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith(
        "(the function returned numbers named " + ", ".join(repr(f"m{i}") for i in range(20)) + " and 10 more); a "
        "--resume with --minimise NAME ranks the finished items without running them again"), \
        result.stdout


def test_parameters_named_as_results_csv_columns_and_values_past_the_float_range(tmp_path):
    """A parameter named like one of results.csv's own columns is written as param.NAME; values near
    the float limit still give the ranking and every file but a figure that cannot be laid out."""
    grid = write_json(tmp_path / "g.json", {"param.seed": [0], "seed": [1, 2], "host": ["h"], "x": [1]})
    result = sweep("sweep_functions:noisy", tmp_path / "r", "--grid", str(grid))
    assert result.returncode == 0, result.stderr
    header = (tmp_path / "r" / "results.csv").read_text().splitlines()[0].split(",")
    assert len(header) == len(set(header)) and {"param.seed", "param.host", "x", "seed", "host"} <= set(header)
    # the parameter named "param.seed" (two columns had one name), whichever comes first; "seed" is param.seed
    assert {row["param.param.seed"] for row in rows(tmp_path / "r")} == {"0"}
    assert {row["param.seed"] for row in rows(tmp_path / "r")} == {"1", "2"}
    write_json(tmp_path / "huge.py", "def fit(params, seed):\n    return {'loss': 1.7e308 if seed % 2 else -1.7e308}\n")
    grid = write_json(tmp_path / "g4.json", {"x": [1, 2, 3, 4]})
    result = sweep("huge:fit", tmp_path / "h", "--grid", str(grid), "--repeats", "4", "--minimise", "loss", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert len(rows(tmp_path / "h")) == 16 and read_summary(tmp_path / "h")["sweep"]["best"]
    assert "No figure: the figure of 'loss' could not be drawn" in (tmp_path / "h" / "summary.md").read_text()
    # a point whose metric is NaN (or missing) is not ranked, and the summary says so
    write_json(tmp_path / "nan.py", "def fit(params):\n    return {'loss': float('nan') if params['x'] > 2 else params['x']}\n")
    result = sweep("nan:fit", tmp_path / "n", "--grid", str(grid), "--minimise", "loss", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(rows(tmp_path / "n")) == 4 and [b["key"] for b in read_summary(tmp_path / "n")["sweep"]["best"]] == ["x=1", "x=2"]
    assert read_summary(tmp_path / "n")["sweep"]["unranked"] == 2
    assert ("2 points returned no finite `loss` (NaN, infinite or missing) and are not ranked; results.csv has them."
            in (tmp_path / "n" / "summary.md").read_text())
    # a string or a bool is not called missing: the note gives one (a reviewer's {"error": "0.4"})
    write_json(tmp_path / "odd.py", "def fit(params):\n    return {'loss': {1: '0.4', 2: True}.get(params['x'], 1.0)}\n")
    result = sweep("odd:fit", tmp_path / "o", "--grid", str(grid), "--minimise", "loss", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("2 points returned no finite `loss` (NaN, infinite, missing, or not a number, such as '0.4') and are not "
            "ranked" in (tmp_path / "o" / "summary.md").read_text())
    # results.jsonl is strict JSON: an infinite value is null there (Infinity is not JSON), inf in results.csv
    write_json(tmp_path / "inf.py", "def fit(params):\n    return {'loss': float('inf'), 'curve': [1.0, -float('inf')]}\n")
    result = sweep("inf:fit", tmp_path / "i", "--grid", str(grid), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "i" / "results.jsonl").read_text().splitlines()
    parsed = [json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in results.jsonl")) for line in lines]
    assert [entry["result"] for entry in parsed] == [{"loss": None, "curve": [1.0, None]}] * 4
    assert {row["loss"] for row in rows(tmp_path / "i")} == {"inf"}


def test_an_integer_past_the_float_range_fails_its_item_and_is_not_taken_from_a_journal(tmp_path, monkeypatch):
    """results.csv, the statistics and the figures take floats: an int of 10**400 fails its item in
    one line (it used to pass, and then the outputs failed after every item had run), and a
    journal an earlier version wrote with one is refused in one line, not resumed into the same failure."""
    write_json(tmp_path / "big.py", "import os\n\n\ndef fit(params):\n"
                               "    return {'error': 10 ** 400 if params['x'] == 2 and not os.environ.get('SMALL') else 0.5}\n")
    grid = write_json(tmp_path / "g.json", {"x": [1, 2]})
    result = sweep("big:fit", tmp_path / "r", "--grid", str(grid), "--minimise", "error", "--retries", "0", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "item x=2 returned an integer of about 401 digits at [\"error\"], past a float's range" in result.stderr
    assert [item["key"] for item in read_summary(tmp_path / "r")["failed_items"]] == ["x=2"] and len(rows(tmp_path / "r")) == 1
    # a journal holding the value, as an earlier version let it through
    monkeypatch.setenv("SMALL", "1")
    smaller = sweep("big:fit", tmp_path / "s", "--grid", str(grid), "--minimise", "error", cwd=tmp_path)
    assert smaller.returncode == 0, smaller.stderr
    journal = tmp_path / "s" / "journal.jsonl"
    lines = journal.read_text().splitlines()
    edited = [line.replace('"error":0.5', '"error":' + "1" + "0" * 400) if '"key":"x=2"' in line else line for line in lines]
    assert edited != lines
    journal.write_text("\n".join(edited) + "\n")
    before = snapshot(tmp_path / "s")
    assert_usage_error(sweep("big:fit", tmp_path / "s", "--grid", str(grid), "--minimise", "error", "--resume", cwd=tmp_path),
                       "its journal's result of x=2", "an integer of about 401 digits", "an earlier version let it through")
    assert snapshot(tmp_path / "s") == before


@pytest.mark.parametrize("fails", ["raise RuntimeError('no data')", "sys.exit('no data')"])
def test_a_run_where_no_item_ran_shows_no_timeline(tmp_path, fails):
    """Also a setup that calls sys.exit: it was "worker exited with code 1" (the message on raw stderr);
    now its SystemExit is the reason given, as an item's is."""
    grid = write_json(tmp_path / "g.json", {"x": [1, 2]})
    write_json(tmp_path / "setup_fails.py", f"import sys\n\n\ndef setup(device):\n    {fails}\n\n\n"
                                       "def fit(params, state):\n    return {}\n")
    result = sweep("setup_fails:fit", tmp_path / "r", "--grid", str(grid), "--setup", "setup", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    why = "RuntimeError: no data" if fails.startswith("raise") else "SystemExit: no data"
    assert f"after 3 failed starts: {why}" in result.stderr, result.stderr
    assert read_summary(tmp_path / "r")["timeline_plot"] is None and not (tmp_path / "r" / "timeline.png").exists()
    assert "timeline" not in (tmp_path / "r" / "summary.md").read_text()
    assert "is missing" not in (tmp_path / "r" / "report.html").read_text()


def test_a_dry_run_refuses_what_the_run_would_and_lists_what_a_resume_would_run(tmp_path):
    results = tmp_path / "r"
    assert sweep("sweep_functions:noisy", results, "--grid", str(write_json(tmp_path / "g3.json", {"x": [1, 2, 3]}))
                 ).returncode == 0
    before = snapshot(results)
    grown = write_json(tmp_path / "g4.json", {"x": [1, 2, 3, 4]})
    assert_usage_error(sweep("sweep_functions:noisy", results, "--grid", str(grown), "--dry-run"),
                       "already holds the journal")
    assert_usage_error(sweep("sweep_functions:everything", results, "--grid", str(grown), "--setup", "setup",
                             "--dry-run", "--resume"), "cannot resume", "other arguments")
    left = sweep("sweep_functions:noisy", results, "--grid", str(grown), "--dry-run", "--resume")
    assert left.returncode == 0, left.stderr
    assert [json.loads(line)["key"] for line in left.stdout.splitlines()] == ["x=4"]
    # --resume is a flag: the function named after it is still the positional argument
    after = run(["-m", "common.sweep", "--results", str(results), "--grid", str(grown), "--dry-run", "--resume",
                 "sweep_functions:noisy", *ENGINE], cwd=TESTS)
    assert after.returncode == 0 and after.stdout == left.stdout, after.stderr
    # nothing left: said in one line, not an empty answer
    done = sweep("sweep_functions:noisy", results, "--grid", str(tmp_path / "g3.json"), "--dry-run", "--resume")
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert done.stderr.strip().splitlines()[-1] == "sweep: nothing to run: the journal holds every item (3)", done.stderr
    assert snapshot(results) == before

    # abbreviated flags are not taken for the flag they start (--resum for --resume, --result for --results)
    wrong = run(["-m", "common.sweep", "sweep_functions:noisy", "--grid", str(grown), "--result", str(results),
                 "--dry-run", "--resum", *ENGINE], cwd=TESTS)
    assert_usage_error(wrong, "unrecognized arguments: --result", "--resum",  # and what was meant, where it is close
                       "(did you mean --results for --result, --resume for --resum?) (see --help)")


def test_the_figure_draws_a_grid_with_0_on_a_log_axis_and_no_best_line_through_samples(monkeypatch):
    """A grid with 0 (weight decay 0, 1e-5, ..., 1e-2) was drawn on a linear axis, four of its five
    values on top of each other at 0; random samples had their "best" line join all 200 points."""
    import random

    from common.sweep import report

    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: drawn.append(fig))
    grid = [{"params": {"wd": w, "lr": lr}, "mean": w * 10 + lr, "n": 1} for w in [0, 1e-5, 1e-4, 1e-3, 1e-2]
            for lr in [0.1, 0.01]]
    draws = random.Random(1)
    samples = [{"params": {"a": draws.random(), "b": draws.random()}, "mean": draws.random(), "n": 1} for _ in range(200)]
    for entry in grid + samples:
        entry["min"] = entry["max"] = entry["mean"]
    report._figure(grid, ["wd", "lr"], "loss", "min", Path("unused"))
    report._figure(samples, ["a", "b"], "loss", "min", Path("unused"))
    (wd, lr), (a, b) = (fig.axes for fig in drawn)

    def best_lines(ax):
        return [line for line in ax.get_lines() if line.get_color() == "tab:red"]

    assert wd.get_xscale() == "symlog" and lr.get_xscale() == "linear"
    assert len(best_lines(wd)) == len(best_lines(lr)) == 1 and not best_lines(a) and not best_lines(b)
    # a big grid (50 x 4 values) still gets its line, and values that are not numbers stand in the
    # grid's order, not the ranking's (a reviewer's "opt": null, adam, true was drawn adam, true, null)
    points = [{"a": a, "opt": opt} for a in range(50) for opt in [None, "adam", True, "sgd"]]
    ranked = sorted(({"params": p, "mean": abs(p["a"] - 20) + {None: 3, "adam": 1, True: 2, "sgd": 4}[p["opt"]],
                      "n": 1} for p in points), key=lambda entry: entry["mean"])
    for entry in ranked:
        entry["min"] = entry["max"] = entry["mean"]
    report._figure(ranked, ["a", "opt"], "loss", "min", Path("unused"), points)
    big, categories = drawn[-1].axes
    assert len(best_lines(big)) == 1
    assert [label.get_text() for label in categories.get_xticklabels()] == ["null", "adam", "true", "sgd"]


def test_a_spaces_choices_stand_in_the_figure_in_the_order_listed(monkeypatch):
    """Drawn points give a choice's values in the order drawn (seed 1: tanh, gelu, elu, relu, by a
    review): the figure takes the space's own list first."""
    from common.sweep import report
    from common.sweep.app import _choices
    from common.sweep.space import sample_points

    space = {"x": {"uniform": [0, 5]}, "act": {"choice": ["relu", "gelu", "tanh", "elu"]}}
    points = sample_points(space, 12, 1)
    assert list(dict.fromkeys(point["act"] for point in points)) != ["relu", "gelu", "tanh", "elu"]  # else no test
    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: drawn.append(fig))
    ranked = [{"params": point, "mean": point["x"], "min": point["x"], "max": point["x"], "n": 1} for point in points]
    report._figure(ranked, ["x", "act"], "loss", "min", Path("unused"), _choices(space) + points)
    assert [label.get_text() for label in drawn[0].axes[1].get_xticklabels()] == ["relu", "gelu", "tanh", "elu"]


def test_a_resume_finds_a_run_in_the_default_folder_of_earlier_versions(tmp_path):
    """Until sweep scripts and modules had default folders of their own, every sweep's was
    results/sweep: a --resume without --results of such a run (a Slurm job requeued after an
    update) would have started it again from nothing in results/MODULE. It goes on there instead,
    and says so; another function's journal there is left alone."""
    (tmp_path / "mine.py").write_text("def fit(params):\n    return {'loss': params['x']}\n\n"
                                      "def other(params):\n    return {'loss': -params['x']}\n")
    (tmp_path / "grid.json").write_text(json.dumps({"x": [1, 2, 3]}))
    common = ["--grid", "grid.json", *ENGINE, "--workers", "1"]
    earlier = run(["-m", "common.sweep", "mine:fit", *common, "--results", "results/sweep"], cwd=tmp_path)
    assert earlier.returncode == 0, earlier.stderr
    resumed = run(["-m", "common.sweep", "mine:fit", *common, "--resume"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert ("sweep: --resume: this run's journal is in 'results/sweep', the default folder of earlier versions "
            "(now 'results/mine'): resuming it there") in resumed.stderr
    assert "3 of 3 items (3 from an earlier run)" in resumed.stderr and not (tmp_path / "results/mine").exists()
    other = run(["-m", "common.sweep", "mine:other", *common, "--resume"], cwd=tmp_path)
    assert other.returncode == 0 and "default folder of earlier versions" not in other.stderr, other.stderr
    assert len(rows(tmp_path / "results" / "mine")) == 3  # run from the start, in its own folder


def test_the_figure_draws_a_best_line_only_where_points_share_values(tmp_path):
    """20 random samples of two floats got a red "best" line in each panel, joining every point (the
    documentation says it is drawn for a grid's values, not random samples'), and the legend was on
    the first panel whatever had a line. In-process, on ranked entries as the report makes them."""
    from common.sweep.report import _figure

    rng = np.random.default_rng(0)

    def entries(points):
        return [{"params": point, "mean": float(rng.random()), "min": 0.0, "max": 1.0, "n": 1} for point in points]

    def lines(fig):
        return [any(line.get_label().startswith("best") for line in ax.get_lines()) for ax in fig.axes if ax.get_visible()]

    def legend_panel(fig):
        return [ax.get_legend() is not None for ax in fig.axes if ax.get_visible()]

    samples = [{"lr": float(rng.uniform(1e-4, 1)), "dropout": float(rng.uniform(0, 0.5))} for _ in range(20)]
    fig = _figure(entries(samples), ["lr", "dropout"], "acc", "max", tmp_path / "samples")
    assert lines(fig) == [False, False] and legend_panel(fig) == [True, False]
    grid = [{"C": c, "gamma": g} for c in (0.1, 1.0, 10.0) for g in (0.01, 0.1)]
    assert lines(_figure(entries(grid), ["C", "gamma"], "error", "min", tmp_path / "grid")) == [True, True]
    # a random float beside a random choice: the choice's panel has the line, and the legend with it
    mixed = [{"lr": float(rng.uniform(0, 1)), "kind": ["a", "b", "c"][i % 3]} for i in range(12)]
    fig = _figure(entries(mixed), ["lr", "kind"], "error", "min", tmp_path / "mixed", mixed)
    assert lines(fig) == [False, True] and legend_panel(fig) == [False, True]
    # one parameter: its line is the curve itself, however many values; so is the one that varies beside
    # a fixed one (a grid's single batch size), which has no line (one value) and no legend
    single = [{"x": float(x)} for x in rng.uniform(0, 1, 40)]
    assert lines(_figure(entries(single), ["x"], "loss", "min", tmp_path / "single")) == [True]
    fixed = [{"lr": lr, "batch": 32} for lr in np.geomspace(1e-4, 1, 10)]
    fig = _figure(entries(fixed), ["lr", "batch"], "loss", "min", tmp_path / "fixed")
    assert lines(fig) == [True, False] and legend_panel(fig) == [True, False]
    # a point that gave no finite value (lr 1.0 diverged) is not ranked: what the space shares is read from it
    wide = [{"lr": lr, "batch": b} for lr in np.geomspace(1e-4, 1, 50) for b in (32, 64)]
    assert lines(_figure(entries(wide[:-1]), ["lr", "batch"], "loss", "min", tmp_path / "diverged", wide)) == [True, True]
    # random integers that repeat now and then (21 values in 25 samples): a zigzag still, no line
    ints = [{"layers": int(n), "lr": float(rng.uniform(0, 1))} for n in rng.integers(1, 201, 25)]
    assert len({p["layers"] for p in ints}) < 25
    assert lines(_figure(entries(ints), ["layers", "lr"], "loss", "min", tmp_path / "ints")) == [False, False]
