"""Ctrl-C and the other stop signals while a run starts: while the program still imports (numpy,
scikit-learn), and while its workers start. Real processes, real signals to the whole process
group (what a terminal's Ctrl-C does)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import TOY, error_lines, start, stop_signals_deferred, wait_until

STOP_CODE = 75


def children_running(rank: psutil.Process, marker: str) -> list:
    """The rank's children whose command line holds ``marker``; one that is already gone or a
    zombie is not counted."""
    found = []
    for child in rank.children():
        try:
            if marker in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def worker_processes(rank: psutil.Process) -> list:
    """The rank's workers: its spawned children (not multiprocessing's resource tracker, not the
    timeline's drawing process)."""
    return children_running(rank, "spawn_main")


def worker_starts(results: Path) -> int:
    """How many worker processes began (each says 'started: pid' first thing in its log)."""
    return sum(path.read_text().count("started: pid") for path in (results / "logs").glob("rank0-*.log"))


def assert_stopped_before_the_run(process: subprocess.Popen, sig: int, app: str, results: Path) -> None:
    """``sig`` to the program's whole process group (a terminal's Ctrl-C) ends it in one line, exit
    75, before its run started: no traceback, no results folder."""
    os.killpg(process.pid, sig)
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    assert error_lines(err) == [f"{app}: stopped (received {signal.Signals(sig).name}) before the run started; "
                                f"nothing was written"], err
    assert not results.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_program_imports_is_one_line_and_writes_nothing(tmp_path, sig):
    """From the moment python -m mnist_svm defers stop signals (its first line, before numpy):
    no KeyboardInterrupt traceback from inside an import, one line, exit 75, no results folder."""
    results = tmp_path / "results"
    process = start(["-m", "mnist_svm", "2", "--dataset", "digits", "--results", str(results)])
    # the stop handlers are in place as the program starts importing numpy and scikit-learn
    assert wait_until(lambda: stop_signals_deferred(process.pid), timeout=30, every=0.001)
    assert_stopped_before_the_run(process, sig, "mnist_svm", results)


#: a user's sweep script, on a node where the engine takes 2 s to import (a loaded node, a slow
#: shared filesystem): the import hook says when it begins, then waits
SLOW_ENGINE_SCRIPT = """import sys, time
from common import sweep


class SlowEngine:
    def find_spec(self, name, path=None, target=None):
        if name == "common.sweep.app":
            print("importing", flush=True)
            time.sleep(2)
        return None


sys.meta_path.insert(0, SlowEngine())


def fit(params):
    return {"y": params["x"] * 2}


if __name__ == "__main__":
    raise SystemExit(sweep.main(fit, grid={"x": [1, 2]}))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_sweep_main_loads_the_engine_is_one_line_and_writes_nothing(tmp_path, sig):
    """A script's sweep.main defers stop signals as it is called, before the engine loads: no
    traceback, no silent death, one line, exit 75, no results folder."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_ENGINE_SCRIPT)
    results = tmp_path / "results"
    process = start([str(script), "--gpu", "cpu", "--workers", "1", "--results", str(results)])
    assert process.stdout.readline() == "importing\n"
    assert stop_signals_deferred(process.pid)  # before the engine's import, which the signal now comes in
    assert_stopped_before_the_run(process, sig, "sweep", results)


def test_sweep_main_imported_or_asked_for_but_not_called_leaves_the_signals_alone(tmp_path):
    """Only a call defers: a program that imports main (a notebook, a script's own subprocesses,
    which import it again) or a library that takes it keeps Ctrl-C and SIGTERM as they were."""
    from common import sweep

    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    assert callable(sweep.main)
    from common.sweep import main

    assert main is sweep.main
    assert {number: signal.getsignal(number) for number in before} == before
    # Python's own Ctrl-C first, as an interactive one has it (a test runner's worker may ignore SIGINT,
    # which its children inherit)
    program = ("import os, signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "from common.sweep import main\nfrom common import sweep\nsweep.main\n"
               "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
    proc = subprocess.run([sys.executable, "-c", program], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGINT and proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_that_kills_a_program_the_checks_run_is_a_stop_not_a_refusal(tmp_path, sig):
    """A Ctrl-C or SIGTERM to the whole group while the app's checks run a program (a data set's
    download): the program dies of it and the check fails, but what the user is told is the stop (exit
    75, which a batch script requeues), not that check's refusal (exit 2), which the stop caused."""
    results = tmp_path / "results"
    process = start([TOY, "2", "--checking-seconds", "30", "--workers", "1", "--results", str(results)])
    assert process.stdout.readline() == "checking\n"
    time.sleep(0.2)  # its sleep has started
    assert_stopped_before_the_run(process, sig, "toy", results)


@pytest.mark.parametrize("after", [0.0, 0.5, 1.5])
def test_ctrl_c_while_workers_start_restarts_none_and_prints_no_traceback(tmp_path, after):
    """Workers that still import (TOY_IMPORT_SLEEP stands for torch) when Ctrl-C reaches the whole
    process group: none dies of it, none is started again, the run stops cleanly (exit 75)."""
    results = tmp_path / "results"
    os.environ["TOY_IMPORT_SLEEP"] = "2"
    try:
        process = start([TOY, "8", "--workers", "2", "--results", str(results), "--no-progress"])
    finally:
        del os.environ["TOY_IMPORT_SLEEP"]
    rank = psutil.Process(process.pid)

    assert wait_until(lambda: len(worker_processes(rank)) == 2, timeout=60, every=0.01)
    time.sleep(after)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "could not start" not in err and "starting it again" not in err, err
    assert worker_starts(results) <= 2
    logs = "".join(path.read_text() for path in (results / "logs").glob("*.log"))
    assert "Traceback" not in logs and "could not start" not in logs, logs


def test_a_worker_whose_setup_swallows_the_rank_s_signal_still_ends(tmp_path):
    """The rank ends a worker still in its set-up with WORKER_TERMINATE_SIGNAL, whose handler raises
    an exception wherever the worker is; code there that swallows it (here a bare ``except:``; in
    mnist_nn, something in its set-up's imports, in about one start in three) left the worker to say
    it was ready and wait for items until the rank killed it 10 s later. The handler's note is checked once
    the set-up returns: the worker ends then, saying so in its log."""
    assert_a_starting_worker_ends_soon(tmp_path, "--swallowing-setup", "30")


def assert_a_starting_worker_ends_soon(tmp_path: Path, *flags: str) -> None:
    """Ctrl-C to the rank of a toy run with ``flags`` once its one worker has started: the run ends
    (exit 75) well before the rank's SIGKILL of the worker 10 s later, which says in its log that
    its rank's signal ended it."""
    results = tmp_path / "results"
    process = start([TOY, "2", "--workers", "1", *flags, "--results", str(results), "--no-progress"])
    assert wait_until(lambda: worker_starts(results) == 1, timeout=60, every=0.02)
    asked = time.monotonic()
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    took = time.monotonic() - asked
    assert process.returncode == STOP_CODE, err
    assert took < 6, took  # was 10 s and more: the rank's SIGKILL
    assert "stopping: ended by SIGUSR2" in (results / "logs" / "rank0-cpu0.log").read_text()


def test_a_signal_swallowed_before_the_set_up_ends_the_worker_before_it(tmp_path):
    """The rank's signal can also be swallowed by what the worker runs before the app's set-up: numpy.random's
    import runs Cython code that calls Python inside a bare ``except`` (a handler that raises there raises
    into it; seen in CI about once in a few hundred runs), here a ``seed_form`` property that does the
    same (for up to 3 s). A set-up that then waits (here 30 s) was waited for until the rank's SIGKILL, 10 s later: the
    worker now checks the note before the set-up."""
    assert_a_starting_worker_ends_soon(tmp_path, "--swallowing-seed-form", "3", "--swallowing-setup", "30")


def test_a_worker_whose_item_swallows_the_rank_s_signal_ends_after_the_item(tmp_path):
    """The same for an item's code: past --grace the rank ends the busy worker with the signal; the
    item's bare except swallowed it, and the worker sent its answer and waited for the next item
    until the rank killed it 10 s later. It ends as the item returns."""
    results = tmp_path / "results"
    process = start([TOY, "2", "--workers", "1", "--swallow-key", "item-0000", "--slow-seconds", "60", "--grace", "1",
                     "--results", str(results), "--no-progress"])
    assert wait_until(lambda: worker_starts(results) == 1, timeout=60, every=0.02)
    time.sleep(1.0)  # the item is in its sleep
    asked = time.monotonic()
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    took = time.monotonic() - asked
    assert process.returncode == STOP_CODE, err
    assert took < 6, took  # the grace (1 s) and the item's end; was 11 s: the rank's SIGKILL
    assert "stopping" in (results / "logs" / "rank0-cpu0.log").read_text()


def test_no_worker_is_started_again_once_a_stop_was_asked(tmp_path):
    """A worker that dies during the stop's grace period (here SIGKILLed) is not replaced: its item
    runs again on --resume; the other running item finishes."""
    results = tmp_path / "results"
    process = start([TOY, "6", "--sleep", "4", "--workers", "2", "--results", str(results), "--no-progress"])
    rank = psutil.Process(process.pid)
    assert wait_until(lambda: worker_starts(results) == 2 and (results / "logs" / "rank0-cpu1.log").exists(), timeout=60)
    time.sleep(1)  # both workers busy with their first item
    os.kill(process.pid, signal.SIGINT)
    time.sleep(0.5)
    victim = worker_processes(rank)[0]
    victim.kill()
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    time.sleep(0.5)
    assert worker_starts(results) == 2, err  # no third worker
    assert "starting it again" not in err and "Traceback" not in err, err


#: a worker's entry point, run as its pool runs it, whose rank ends it while it opens its log: the
#: rank's signal (WORKER_TERMINATE_SIGNAL) comes between its handler and the loop that expects it
ENDED_WHILE_OPENING_ITS_LOG = """
import multiprocessing, os, sys
sys.path.insert(0, {repo!r})
import common.workers.worker as worker
from common.signals import WORKER_TERMINATE_SIGNAL

def opened_log(*args):
    os.kill(os.getpid(), WORKER_TERMINATE_SIGNAL)  # handled at once: raised inside this call
    raise AssertionError("not reached")

if __name__ == "__main__":
    import atexit
    worker.worker_file_log = opened_log
    rank_end, worker_end = multiprocessing.Pipe()
    atexit.register(print, "ended quietly")  # a worker ends with os._exit, after its atexit functions
    worker.worker_main(worker_end, None, "cpu0", "rank0-cpu0", os.devnull, 0, 1)
    print("not reached: the worker's end is its process's")
"""


def test_a_worker_ended_by_its_rank_before_it_has_a_log_ends_quietly(tmp_path):
    """A run that ended while a worker still started (a second worker of a short run, CI at load)
    sent it the rank's signal before it reached its loop: it died with a traceback on the run's stderr."""
    script = tmp_path / "worker.py"
    script.write_text(ENDED_WHILE_OPENING_ITS_LOG.format(repo=str(Path(__file__).resolve().parents[1])))
    from common.signals import WORKER_TERMINATED_EXIT

    ended = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    # the code that tells its rank the signal ended it (not a failed start of its device)
    assert ended.returncode == WORKER_TERMINATED_EXIT and "Traceback" not in ended.stderr, ended.stderr
    assert ended.stdout == "ended quietly\n"


def test_the_walltime_signal_to_every_process_leaves_multiprocessings_resource_tracker_alive(tmp_path):
    """srun passes the walltime's USR1 to every process of the step, multiprocessing's resource
    tracker among them, which ignores only SIGINT and SIGTERM: it died, and the next worker started
    (--batch 1: one per item) relaunched it, "process died unexpectedly, relaunching. Some resources
    might leak." The tracker now starts with the stop signals blocked."""
    results = tmp_path / "results"
    process = start([TOY, "8", "--sleep", "0.3", "--workers", "1", "--batch", "1", "--results", str(results),
                     "--no-progress"])
    rank = psutil.Process(process.pid)
    assert wait_until(lambda: len(children_running(rank, "resource_tracker")) == 1, timeout=60)
    (first,) = children_running(rank, "resource_tracker")
    first.send_signal(signal.SIGUSR1)
    first.send_signal(signal.SIGUSR2)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "resource_tracker" not in err and "relaunching" not in err, err
    assert "8 of 8 items" in err, err
