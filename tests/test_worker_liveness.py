"""A hung worker or a runaway item never holds the run (issue 19): real processes, real signals.

A worker that is stopped (SIGSTOP) or stuck in C code holding the GIL says nothing: it is killed
after --worker-timeout, its item runs elsewhere. An item past --item-timeout is killed with its
worker, retried, then failed. A slow item under the limit, in a worker that keeps talking, is left alone.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import psutil

from helpers import TOY, alive, assert_usage_error, journal_entries, read_summary, run, start, values, wait_until

TIMEOUT = 3  # --worker-timeout in these tests (the default is 300)


def _failed_attempts(results: Path) -> list:
    return [e for e in journal_entries(results) if e.get("type") == "attempt_failed"]


def _markers(folder: Path) -> Counter:
    return Counter({p.name: len(p.read_text().splitlines()) for p in folder.iterdir()})


def _logs(results: Path, pattern: str) -> str:
    return "".join(path.read_text() for path in sorted((results / "logs").glob(pattern)))


def test_a_stopped_worker_is_killed_after_the_timeout_and_its_item_runs_elsewhere(tmp_path):
    # item-0006 lasts 3 s: the SIGSTOP below finds it running even when this process is slow to see its marker
    args = [TOY, "16", "--wave", "--sleep", "0.5", "--workers", "2", "--threads", "1", "--no-progress",
            "--worker-timeout", str(TIMEOUT), "--slow-key", "item-0006", "--slow-seconds", "3"]
    clean = run(args + ["--results", str(tmp_path / "clean")])
    assert clean.returncode == 0, clean.stderr
    marks, results = tmp_path / "marks", tmp_path / "r"
    marks.mkdir()
    process = start(args + ["--marker-dir", str(marks), "--results", str(results)], ranks=2)
    victim = None
    try:
        marker = marks / "item-0006"
        assert wait_until(lambda: marker.exists() and marker.read_text().strip(), timeout=120)  # its pid written
        victim = psutil.Process(int(marker.read_text().split()[0]))
        victim.send_signal(signal.SIGSTOP)  # mid-item: it is alive, and says nothing
        stopped_at = time.time()
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        if victim is not None and alive(victim.pid):
            victim.kill()
    assert process.returncode == 0, err
    assert values(results) == values(tmp_path / "clean")
    failed = _failed_attempts(results)
    assert [e["key"] for e in failed] == ["item-0006"], failed
    assert failed[0]["error"].startswith("worker silent for 3 s (stopped or hung)"), failed[0]["error"]
    detected = failed[0]["end"] - stopped_at
    print(f"stopped worker detected and killed {detected:.2f} s after its SIGSTOP (--worker-timeout {TIMEOUT})")
    assert TIMEOUT - 1 < detected < TIMEOUT + 3, detected
    assert _markers(marks)["item-0006"] == 2  # run again, by another worker
    assert not alive(victim.pid), "the stopped worker was killed"
    assert read_summary(results)["failed_items"] == []
    rank, worker = failed[0]["worker"].split("-")[0], failed[0]["worker"]
    assert "item-0006" in err and "worker silent" in err
    assert "worker silent" in _logs(results, f"{rank}.log") and "item-0006" in _logs(results, f"{rank}.log")
    assert "while running item-0006: killed by its rank (SIGKILL)" in _logs(results, f"{worker}.log")


def test_a_worker_stuck_in_c_code_holding_the_gil_is_caught(tmp_path):
    """libc's sleep through ctypes.PyDLL keeps the GIL: the heartbeat thread cannot run, as when a
    native library hangs without releasing it. The worker's log shows where it was stuck."""
    args = [TOY, "8", "--sleep", "0.2", "--workers", "2", "--no-progress", "--worker-timeout", str(TIMEOUT)]
    clean = run(args + ["--results", str(tmp_path / "clean")])
    assert clean.returncode == 0, clean.stderr
    marks, results = tmp_path / "marks", tmp_path / "r"
    marks.mkdir()
    began = time.monotonic()
    proc = run(args + ["--gil-key", "item-0003", "--marker-dir", str(marks), "--results", str(results)])
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - began < 60  # the stuck call would have lasted an hour
    assert values(results) == values(tmp_path / "clean")
    failed = _failed_attempts(results)
    assert [e["key"] for e in failed] == ["item-0003"] and "worker silent" in failed[0]["error"], failed
    hung_pid = int((marks / "item-0003").read_text().split()[0])
    assert not alive(hung_pid)
    worker_log = _logs(results, f"{failed[0]['worker']}.log")
    assert "while running item-0003: killed by its rank (SIGKILL)" in worker_log
    assert "in run_item" in worker_log.split("killed by its rank")[1], "faulthandler's stack of the stuck call"


def test_an_item_past_the_item_timeout_is_killed_retried_then_failed(tmp_path):
    marks, results = tmp_path / "marks", tmp_path / "r"
    marks.mkdir()
    began = time.monotonic()
    proc = run([TOY, "8", "--sleep", "0.2", "--workers", "2", "--slow-key", "item-0001", "--slow-seconds", "120",
                "--item-timeout", "2", "--retries", "1", "--marker-dir", str(marks), "--results", str(results),
                "--no-progress"], ranks=2)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - began < 90
    assert _markers(marks)["item-0001"] == 2  # first attempt + 1 retry
    for pid in (marks / "item-0001").read_text().split():
        assert not alive(int(pid)), "a timed-out item's worker is killed (its GPU memory freed with it)"
    failed = read_summary(results)["failed_items"]
    assert [f["key"] for f in failed] == ["item-0001"]
    assert failed[0]["error"].startswith("timed out after 2 s")
    assert "| item-0001 | timed out after 2 s" in (results / "summary.md").read_text()
    attempts = _failed_attempts(results)
    assert [e["key"] for e in attempts] == ["item-0001", "item-0001"]
    for attempt in attempts:
        assert 2 <= attempt["end"] - attempt["start"] < 5, attempt
    assert len(values(results)) == 7
    for attempt in attempts:
        rank = attempt["worker"].split("-")[0]
        assert "item-0001 timed out after 2 s" in _logs(results, f"{rank}.log")
        assert "item-0001 timed out after 2 s (--item-timeout): killed by its rank" in _logs(results, f"{attempt['worker']}.log")


def test_an_item_killed_for_its_timeout_fails_even_if_it_answers_during_the_stack_dump(tmp_path):
    """Items a little over --item-timeout answer in the 0.2 s between the stack dump and the SIGKILL:
    each item the run said it was killing fails (it was kept as a success before, and its worker
    killed all the same), is counted as an attempt (no endless retry), and the run ends."""
    results = tmp_path / "r"
    proc = run([TOY, "6", "--sleep", "0.45", "--workers", "2", "--item-timeout", "0.3", "--retries", "0",
                "--results", str(results), "--no-progress"], timeout=120)
    killed = {line.split(": ")[1].split(" timed out after")[0] for line in _logs(results, "rank0.log").splitlines()
              if "timed out after 0.3 s (--item-timeout); killing it" in line}
    failed = {f["key"] for f in read_summary(results)["failed_items"]}
    assert killed and killed == failed, (killed, failed)
    assert proc.returncode == (1 if failed else 0), proc.stderr
    kept = {e["key"] for e in journal_entries(results) if e.get("type") == "result"}
    assert not kept & killed and kept | failed == {f"item-{i:04d}" for i in range(6)}, (kept, failed)
    assert all(a["error"].startswith("timed out after 0.3 s") for a in _failed_attempts(results))


def test_a_slow_item_under_the_limit_and_tiny_items_are_left_alone(tmp_path):
    """A worker that sleeps (the GIL released) keeps sending heartbeats: a --worker-timeout far
    shorter than its item does not touch it, nor does an --item-timeout it stays under. Items far
    below a millisecond (sent in chunks) are timed one by one and never killed."""
    results = tmp_path / "r"
    proc = run([TOY, "4", "--slow-key", "item-0001", "--slow-seconds", "4", "--item-timeout", "8",
                "--worker-timeout", "1", "--results", str(results), "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert not _failed_attempts(results)
    slow = next(e for e in journal_entries(results) if e.get("type") == "result" and e["key"] == "item-0001")
    assert slow["seconds"] >= 4
    tiny = run([TOY, "600", "--workers", "2", "--item-timeout", "1", "--worker-timeout", "1",
                "--results", str(tmp_path / "tiny"), "--no-progress"], ranks=2)
    assert tiny.returncode == 0, tiny.stderr
    assert not _failed_attempts(tmp_path / "tiny") and len(values(tmp_path / "tiny")) == 600


def test_a_setup_that_never_returns_is_killed_after_the_setup_timeout(tmp_path):
    """Its heartbeat goes on, so neither --worker-timeout nor --item-timeout ever ended it: the run
    waited for ever. Each start counts as failed; after 3 the device is given up and the items fail."""
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"x": [1, 2]}))
    started = time.monotonic()
    ran = run(["-m", "common.sweep", "sweep_functions:noop", "--setup", "hangs", "--grid", str(grid), "--gpu", "cpu",
               "--workers", "1", "--setup-timeout", "1", "--results", str(tmp_path / "r"), "--no-progress"],
              cwd=Path(__file__).parent, timeout=120)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert time.monotonic() - started < 60
    # "after 1 s", or 2 where the rank's loop was slow on a loaded machine
    assert len(re.findall(r"worker still starting after \d+ s \(--setup-timeout 1\); killing it", ran.stderr)) == 3, \
        ran.stderr
    assert "giving up on cpu0 after 3 failed starts: its setup ran past 1 s (--setup-timeout)" in ran.stderr
    failed = {f["key"]: f["error"] for f in read_summary(tmp_path / "r")["failed_items"]}
    assert failed == {key: "no worker could start: its setup ran past 1 s (--setup-timeout)" for key in ("x=1", "x=2")}


def test_bad_timeouts_are_one_line_exit_2(tmp_path):
    for flag, value in (("--item-timeout", "-1"), ("--worker-timeout", "abc"), ("--item-timeout", "nan"),
                        ("--setup-timeout", "-5")):
        assert_usage_error(run([TOY, "4", flag, value, "--results", str(tmp_path / "r")]), flag)
    assert not (tmp_path / "r").exists()


def test_a_pipeline_past_the_item_timeout_is_ended_with_every_process_of_its_step(tmp_path):
    """A step's shell waits for its own child (which would keep a GPU): the worker's whole process
    tree goes. A step longer than --worker-timeout is left alone: its worker only waits for it."""
    token = f"{time.time() % 1000 + 1000:.3f}"  # a sleep this run's step alone runs
    definition = tmp_path / "hang.json"
    definition.write_text(json.dumps({"pipelines": [
        {"name": "hang", "steps": [{"id": "s1", "command": f"sleep {token}; true"}, {"id": "s2", "command": "true"}]},
        {"name": "slow", "steps": [{"id": "s1", "command": "sleep 2.5; true"}]}]}))
    results = tmp_path / "r"
    proc = run(["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--workers", "2", "--item-timeout", "5",
                "--worker-timeout", "1", "--retries", "0", "--results", str(results), "--no-progress"])
    assert proc.returncode == 1, proc.stderr
    assert [f["key"] for f in read_summary(results)["failed_items"]] == ["hang"], proc.stderr
    assert "timed out after 5 s" in read_summary(results)["failed_items"][0]["error"]
    # the killed step is in the summary (its worker died before it could write its status.json)
    assert read_summary(results)["pipelines"]["hang"]["steps"]["s1"]["status"] == "failed"
    table = [line for line in (results / "summary.md").read_text().splitlines() if line.startswith("| pipeline | status")]
    assert table == ["| pipeline | status | s1 | s2 |"]
    # its time is not known (no status.json), and the step it never reached still has its column
    assert "| hang | failed | FAILED (ended with its worker) | not reached |" in (results / "summary.md").read_text()

    def step_gone() -> bool:
        return not [p for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])]
    assert wait_until(step_gone, timeout=5), "the step's child outlived its killed worker"


def test_a_worker_whose_rank_died_while_it_imported_ends_before_its_setup(tmp_path, monkeypatch):
    """Linux's parent-death signal, asked for once the app's module has imported, never comes for a
    rank already dead: such a worker went on to its setup (loading data, a GPU context) for nothing."""
    results = tmp_path / "r"
    monkeypatch.setenv("TOY_IMPORT_SLEEP", "1.5")
    rank = start([TOY, "4", "--gpu", "cpu", "--workers", "2", "--results", str(results), "--no-progress"])
    try:
        def workers():
            try:
                return [child for child in psutil.Process(rank.pid).children()
                        if "spawn_main" in " ".join(child.cmdline())]
            except psutil.Error:
                return []
        assert wait_until(lambda: len(workers()) == 2, 30), "no workers started"
        importing = workers()
        os.kill(rank.pid, signal.SIGKILL)
        rank.wait(10)
        assert wait_until(lambda: not any(alive(worker.pid) for worker in importing), 20)
    finally:
        if rank.poll() is None:
            rank.kill()
    logs = [path for path in (results / "logs").iterdir() if path.name != "rank0.log"]
    assert all("started" not in path.read_text() for path in logs), [path.read_text() for path in logs]
