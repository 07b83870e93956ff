"""What a user's function leaves running when its worker's work is over: a thread that never ends
does not keep the worker (and so the run's end) waiting until the rank kills it, and a program it
started and never waited for does not outlive the run (holding its caller's pipes open)."""
from __future__ import annotations

import json
import time

import psutil
import pytest

from common.run.engine import WORKER_KILL_AFTER
from helpers import REPO, run, wait_until

ENGINE = ["--gpu", "cpu", "--threads", "1", "--no-progress", "--workers", "1"]


def _sweep(function: str, folder, timeout: float, *extra: str):
    grid = folder / "grid.json"
    grid.write_text(json.dumps({"x": [1, 2]}))
    return run(["-m", "common.sweep", f"sweep_functions:{function}", "--grid", str(grid), *ENGINE, *extra,
                "--results", str(folder / "r")], cwd=REPO / "tests", timeout=timeout)


@pytest.mark.parametrize("batch", [[], ["--batch", "1"]], ids=["one worker", "a new worker for each item"])
def test_a_thread_that_never_ends_does_not_hold_the_run_until_its_worker_is_killed(tmp_path, batch):
    """--batch 1: each worker retires after its item, and before, waited for the thread until the
    watch killed it as silent (--worker-timeout, 300 s)."""
    started = time.monotonic()
    ran = _sweep("leaves_a_thread", tmp_path, 120, *batch)
    took = time.monotonic() - started
    assert ran.returncode == 0, ran.stderr
    # before: the worker's exit waited for the threads, and the rank killed it WORKER_KILL_AFTER s later
    assert took < WORKER_KILL_AFTER, f"the run took {took:.1f} s"
    log = (tmp_path / "r" / "logs" / "rank0-cpu0.log").read_text()
    said = "1 thread(s) started by the app's code still run (never-ends)" if batch else \
        "2 thread(s) started by the app's code still run (never-ends, never-ends)"
    assert log.count(f"WARNING {said}: the worker ends without waiting for them") == (2 if batch else 1), log
    assert "killed" not in (tmp_path / "r" / "logs" / "rank0.log").read_text()


def test_a_program_an_item_left_running_ends_with_the_run(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SWEEP_MARKS", str(marks))
    # the run's stdout and stderr are pipes: a program holding them open would keep run() reading
    # until it ends, ten minutes later, and fail on the timeout
    ran = _sweep("leaves_a_process", tmp_path, 60)
    assert ran.returncode == 0, ran.stderr
    children = sorted(int(path.read_text()) for path in marks.iterdir())
    assert len(children) == 2

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_until(lambda: all(gone(pid) for pid in children), timeout=10)
    log = (tmp_path / "r" / "logs" / "rank0-cpu0.log").read_text()
    said = [line for line in log.splitlines() if "WARNING 2 process(es) started by the app's code still ran at the end, "
            "and are ended: " in line]
    assert len(said) == 1 and all(f"sleep (pid {pid})" in said[0] for pid in children), log
