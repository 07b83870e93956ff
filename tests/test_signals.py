"""common/signals.py owns the stop signals: it imports only the standard library (an app's
``__main__`` defers signals through it before its slow imports), no other module defines a signal
of its own, and a rank's StopFlag counts a real signal once however often it is passed on."""
from __future__ import annotations

import ast
import os
import signal
import sys
from pathlib import Path

import pytest

from common import signals
from common.signals import RUN_STOP_SIGNALS, StopFlag

ROOT = Path(__file__).resolve().parent.parent
#: run as a file by each pipeline step, importing nothing of ours: its own signal stays its own
OWN_SIGNALS_ALLOWED = {ROOT / "common" / "pipeline" / "guard.py"}


def test_signals_imports_only_the_standard_library():
    tree = ast.parse(Path(signals.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_no_other_module_defines_a_signal():
    found = []
    for folder in ("common", "mnist_svm", "mnist_nn"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(signals.__file__).resolve() or path in OWN_SIGNALS_ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {target.id}" for target in targets
                          if isinstance(target, ast.Name) and target.id.endswith(("_SIGNAL", "_SIGNALS"))]
    assert not found, "define these in common/signals.py:\n" + "\n".join(found)


@pytest.fixture
def restored_handlers():
    """The test's handlers (and the signals they noted) go with it: this process runs other tests
    after it."""
    saved = {number: signal.getsignal(number) for number in RUN_STOP_SIGNALS}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


class _Failure:
    journal = True

    @staticmethod
    def describe() -> str:
        return "cannot write the journal (No space left on device)"


def test_a_signal_passed_on_twice_counts_once(restored_handlers):
    flag = StopFlag(lambda: None)
    flag.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGTERM)  # within ECHO_SECONDS: the same request, forwarded
    assert (flag.count, flag(), flag.urgent) == (1, "received SIGUSR1", False)


def test_a_write_failure_stops_the_run_and_a_journal_one_is_urgent():
    failure = None
    flag = StopFlag(lambda: failure)
    assert flag() is None and not flag.urgent
    failure = _Failure()
    assert flag() == "cannot write the journal (No space left on device)" and flag.urgent


def test_a_stop_by_a_failed_write_ends_its_wait_at_the_first_signal(restored_handlers):
    """A full disk (not the journal) stopped the run by itself; the wait for running items then ends at
    the first stop signal, as the stop line says ("a stop signal ends the wait"), not at a second."""
    failure = None
    flag = StopFlag(lambda: failure)
    flag.install()
    failure = _Failure()
    failure.journal = False
    assert flag() == "cannot write the journal (No space left on device)" and not flag.urgent
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag.count == 1 and flag.urgent
    # a signal first (it began the stop, asking for the same signal again), a failed write after: not yet
    failure = None
    flag = StopFlag(lambda: failure)
    flag.install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag() == "received SIGTERM" and not flag.urgent
    failure = _Failure()
    failure.journal = False
    assert not flag.urgent


def test_a_stop_noted_while_importing_is_taken_over(restored_handlers):
    signals.defer_stop_signals()
    os.kill(os.getpid(), signal.SIGINT)  # noted, not raised
    assert signal.SIGINT in signals.early_stops().numbers
    flag = StopFlag(lambda: None)
    flag.take_over()
    assert flag() == "received SIGINT" and signal.getsignal(signal.SIGINT) == flag._handle


def test_the_note_of_early_stops_lives_in_the_installed_handler(restored_handlers):
    """No module state: the note is the handler itself; deferring twice keeps what it noted, and a
    note taken before other handlers go in still holds what came until then."""
    signals.defer_stop_signals()
    os.kill(os.getpid(), signal.SIGUSR1)
    signals.defer_stop_signals()
    early = signals.early_stops()
    os.kill(os.getpid(), signal.SIGINT)
    assert early.numbers == [signal.SIGUSR1, signal.SIGINT]
    StopFlag(lambda: None).install()
    assert signals.early_stops().numbers == [] and early.numbers == [signal.SIGUSR1, signal.SIGINT]
