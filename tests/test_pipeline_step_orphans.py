"""A pipeline step's program dies with its worker, also when a shell forked it (``/bin/sh -c 'sleep
600'``): after SIGKILL of the worker (also when the program put itself in a process group of its
own), and after SIGHUP to the run's process group (a closed terminal, which stops the run as SIGTERM
does). Real processes: the pipeline app, its worker, the shell and sleep."""
from __future__ import annotations

import json
import os
import signal
import sys

import psutil
import pytest

from common.results.layout import ResultsLayout
from helpers import start, wait_until


def _sleep_of(run_pid: int, seconds: str):
    """The step's ``sleep SECONDS``, a descendant of the run's rank process."""
    try:
        for process in psutil.Process(run_pid).children(recursive=True):
            try:
                if process.cmdline() == ["sleep", seconds]:
                    return process
            except psutil.Error:
                continue
    except psutil.Error:
        return None
    return None


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _hangup_at_its_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _alive(processes: list) -> list:
    """(pid, name, status) of those of ``processes`` that still exist."""
    alive = []
    for process in processes:
        try:
            alive.append((process.pid, process.name(), process.status()))
        except psutil.Error:
            continue
    return alive


def _log_tails(folder) -> dict:
    """The last lines of each log in ``folder``."""
    return {path.name: path.read_text(errors="replace").splitlines()[-3:] for path in sorted(folder.glob("*.log"))}


#: sleep in a process group of its own, still in the step's session
OWN_GROUP = f"""{sys.executable} -c 'import os; os.setpgid(0, 0); os.execvp("sleep", ["sleep", "600"])'"""


@pytest.mark.parametrize("how,command", [("SIGKILL of the worker", "sleep 600"),
                                         ("SIGHUP to the run's process group", "sleep 600"),
                                         ("SIGKILL of the worker", OWN_GROUP)])
def test_a_forked_step_program_dies_with_its_worker(tmp_path, how, command):
    seconds = "600"
    definition = tmp_path / "hold.json"
    definition.write_text(json.dumps({"name": "hold", "steps": [{"id": "wait", "command": command}]}))
    # SIGHUP as a closed terminal sends it, at its default (under nohup, which CI runs may be started
    # with, every process inherits it ignored, and the run rightly lives on)
    # a hang-up stops the run as SIGTERM does: the running step has --grace, then its worker ends it
    process = start(["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--workers", "1", "--grace", "1",
                     "--results", str(tmp_path / "res")], preexec_fn=_hangup_at_its_default)
    sleep = None
    try:
        assert wait_until(lambda: _sleep_of(process.pid, seconds) is not None, timeout=120), "the step never started"
        sleep = _sleep_of(process.pid, seconds)
        assert sleep.parent().name() == "sh"  # dash forks it: only the shell is the worker's own
        chain = sleep.parents()  # sh, the guard, the worker, the rank, ...
        if how.startswith("SIGKILL"):
            worker = next(p for p in chain if p.ppid() == process.pid)
            worker.send_signal(signal.SIGKILL)
        else:
            os.killpg(process.pid, signal.SIGHUP)
        assert wait_until(lambda: _gone(sleep), timeout=5 if how.startswith("SIGKILL") else 30), (
            f"sleep {sleep.pid} outlived its worker ({how}); still alive: {_alive(chain)}; "
            f"worker logs: {_log_tails(ResultsLayout(tmp_path / 'res').logs)}")
        if how.startswith("SIGHUP"):  # stopped, as on SIGTERM: --resume runs the step again
            _, err = process.communicate(timeout=60)
            assert process.returncode == 75, err
    finally:
        if sleep is not None and not _gone(sleep):
            sleep.kill()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
