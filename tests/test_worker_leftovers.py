"""What a user's function leaves running when its worker's work is over: a thread that never ends
does not keep the worker (and so the run's end) waiting until the rank kills it, and a program it
started and never waited for does not outlive the run (holding its caller's pipes open)."""
from __future__ import annotations

import datetime
import json
import time

import psutil
import pytest

from common.run.engine import WORKER_KILL_AFTER
from common.workers.leftovers import THREAD_GRACE_SECONDS
from helpers import REPO, read_summary, run, wait_until

ENGINE = ["--gpu", "cpu", "--threads", "1", "--no-progress", "--workers", "1"]


def _sweep(function: str, folder, timeout: float, *extra: str, values: tuple = (1, 2)):
    grid = folder / "grid.json"
    grid.write_text(json.dumps({"x": list(values)}))
    return run(["-m", "common.sweep", f"sweep_functions:{function}", "--grid", str(grid), *ENGINE, *extra,
                "--results", str(folder / "r")], cwd=REPO / "tests", timeout=timeout)


@pytest.mark.parametrize("batch", [[], ["--batch", "1"]], ids=["one worker", "a worker retired after its item"])
def test_a_thread_that_never_ends_does_not_hold_the_run_until_its_worker_is_killed(tmp_path, batch):
    """Each worker gives such threads THREAD_GRACE_SECONDS, then ends. Before, it waited for them:
    the rank killed it WORKER_KILL_AFTER s after the run's end, and with --batch 1 a retired worker
    waited until the watch killed it as silent (--worker-timeout, 300 s, past this test's timeout)."""
    ran = _sweep("leaves_a_thread", tmp_path, 120, *batch, values=(1,) if batch else (1, 2))
    ended = time.time()
    assert ran.returncode == 0, ran.stderr
    log = (tmp_path / "r" / "logs" / "rank0-cpu0.log").read_text()
    said = "1 thread started by the app's code still runs (never-ends): the worker ends without waiting for it" \
        if batch else "2 threads started by the app's code still run (never-ends, never-ends): the worker ends " \
        "without waiting for them"
    warned = [line for line in log.splitlines() if f"WARNING {said} past {THREAD_GRACE_SECONDS:g} s" in line]
    assert len(warned) == 1, log
    # from the worker's last word to the run's end: its grace, not the rank's WORKER_KILL_AFTER
    since = ended - datetime.datetime.strptime(warned[0][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert since < WORKER_KILL_AFTER - 2, f"the run ended {since:.1f} s after the worker's warning"


def test_an_executors_queued_work_and_a_thread_ending_soon_finish_before_the_worker_ends(tmp_path, monkeypatch):
    """Python's exit runs what a ThreadPoolExecutor was given and waits for its threads: a worker
    ending past its threads still gives them their grace (a checkpoint written in the background)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SWEEP_MARKS", str(marks))
    ran = _sweep("writes_in_the_background", tmp_path, 120, values=(1,))
    assert ran.returncode == 0, ran.stderr
    assert sorted(path.name for path in marks.iterdir()) == ["by-a-thread-1", "by-an-executor-1"]


def test_an_item_may_work_in_processes_of_its_own(tmp_path):
    """Workers were daemonic processes, which Python forbids children: a DataLoader with
    num_workers, a multiprocessing Pool or a ProcessPoolExecutor in an item failed it ("daemonic
    processes are not allowed to have children"), and joblib fell back to one process."""
    ran = _sweep("uses_processes", tmp_path, 120)
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    expected = {1: sum(v * v for v in range(4)), 2: sum(v * v for v in range(5))}
    assert {row["point"]["x"]: row["result"] for row in rows} == {
        x: {"pool": total, "executor": total, "child_exit": 0} for x, total in expected.items()}, rows


def test_an_items_change_of_folder_is_undone_before_the_next_item(tmp_path):
    """An item that called os.chdir left the next items on its worker in its folder: their relative
    paths (a data file beside the script) then depended on which worker ran what before."""
    ran = _sweep("changes_folder", tmp_path, 120, values=(1, 2, 3))
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert [row["result"]["started_in"] for row in rows] == [str(REPO / "tests")] * 3, rows


def test_an_error_of_megabytes_is_kept_short_everywhere(tmp_path):
    """An exception whose message is 2 MB made every line of stderr 2 MB, and summary.md, status.json
    and the journal megabytes each, per attempt. Its first line is now at most 300 characters
    wherever it is shown, and at most 20,000 are kept, the start and the end."""
    from common.errors import MAX_ERROR_CHARS, MAX_LINE_CHARS

    ran = _sweep("huge_message", tmp_path, 120, "--retries", "0")
    assert ran.returncode == 1, ran.stderr
    assert max(len(line) for line in ran.stderr.splitlines()) < MAX_LINE_CHARS + 200, ran.stderr[:2000]
    assert "item x=1 failed for good: ValueError: x=1 xxx" in ran.stderr
    results = tmp_path / "r"
    for name in ("summary.md", "summary.json", "status.json", "journal.jsonl", "report.html", "logs/rank0-cpu0.log"):
        assert (results / name).stat().st_size < 10 * MAX_ERROR_CHARS, name
    failure = read_summary(results)["failed_items"][0]
    assert "characters left out" in failure["error"] and failure["error"].startswith("ValueError: x="), failure


@pytest.mark.parametrize("function, name", [("leaves_a_process", "sleep"), ("leaves_a_multiprocessing_process", "python")],
                         ids=["a program", "a multiprocessing process"])
def test_a_program_an_item_left_running_ends_with_the_run(tmp_path, monkeypatch, function, name):
    """A multiprocessing process too, for which Python's exit (multiprocessing's atexit function)
    would wait for ever: the worker's exit functions get their grace, then what is left is ended."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SWEEP_MARKS", str(marks))
    # the run's stdout and stderr are pipes: a program holding them open would keep run() reading
    # until it ends, ten minutes later, and fail on the timeout
    ran = _sweep(function, tmp_path, 60)
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
    assert len(said) == 1 and all(f"{name} (pid {pid})" in said[0] for pid in children), log
