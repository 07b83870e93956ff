"""The journal writes results in batches: a SIGKILL (of the writer, of the whole job) loses at most
the bounded window that common/results/journal.py states, never more."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from common.results.journal import MAX_LINES, WINDOW_LINES, WINDOW_SECONDS, read_journal
from helpers import REPO, TOY, journal_entries, start, wait_for_results

# A real Journal in its own process: it adds a result every half millisecond and says so on stdout
# after each add (the add, and any batch it writes, is done by then); the test SIGKILLs it.
WRITER = r"""
import sys, time
from pathlib import Path
from common.app import Record
from common.results.journal import Journal
journal = Journal(Path(sys.argv[1]), {"fingerprint": {}})
n = 0
while True:
    journal.append_result(Record(key=f"k{n:06d}", result={"n": n}))
    journal.maybe_sync()
    print(n, time.monotonic(), flush=True)
    n += 1
    time.sleep(0.0005)
"""


def test_a_sigkilled_writer_loses_only_the_last_window_of_results(tmp_path):
    path = tmp_path / "journal.jsonl"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    first = writer.stdout.readline()  # it has started (imports take a while on a busy machine)
    time.sleep(1.0)
    writer.send_signal(signal.SIGKILL)
    # through the same reader: communicate(timeout=...) reads the pipe's descriptor directly, past
    # the lines readline() already took into this reader's buffer (a CI run lost 13 of them so)
    out = first + writer.stdout.read()
    writer.wait(timeout=30)
    added = [(int(n), float(t)) for n, t in (line.split() for line in out.splitlines() if line.count(" ") == 1)]
    assert len(added) > 200, "the writer hardly ran"
    _, records = read_journal(path)
    last = added[-1][1]
    missing = [(n, t) for n, t in added if f"k{n:06d}" not in records]
    # every result added more than the window's seconds before the writer's last add is on disk...
    assert all(last - t < WINDOW_SECONDS for _, t in missing), (WINDOW_SECONDS, [last - t for _, t in missing][:5])
    # ...and never more than the window's lines are held back; what is there is a prefix, whole lines
    assert len(missing) <= WINDOW_LINES
    assert sorted(records) == [f"k{n:06d}" for n, _ in added[:len(records)]]


def test_a_whole_job_sigkilled_loses_only_results_of_its_last_moments(tmp_path):
    """2 ranks (real mpiexec) of 1 worker, 20 ms items; each item notes when it ended. After a
    SIGKILL of every process of the job, each item that ended more than a second before the kill is
    in the journal (the window is 0.15 s of results reaching rank 0, plus their way there: a follower
    sends its results of 2 ms together; a busy machine adds its delays)."""
    done = tmp_path / "done"
    done.mkdir()
    results = tmp_path / "r"
    job = start([TOY, "3000", "--sleep", "0.02", "--workers", "1", "--done-dir", str(done), "--results", str(results),
                 "--no-progress"], ranks=2)
    try:
        wait_for_results(results, 40, timeout=60)
        time.sleep(0.5)
    finally:
        running = job.poll() is None
        killed_at = time.time()
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate(timeout=60)
    assert running, "the run ended before the kill"
    journaled = {e["key"] for e in journal_entries(results) if e.get("type") == "result"}
    ended = {path.name: float(path.read_text()) for path in done.iterdir() if not path.name.startswith(".")}
    lost = {key: killed_at - at for key, at in ended.items() if key not in journaled}
    assert len(journaled) >= 40 and len(ended) >= len(journaled)
    assert len(ended) < MAX_LINES, "killed after a batch filled up by count: the time window was not tested"
    assert all(age < 1.0 for age in lost.values()), sorted(lost.values())[-5:]
    assert len(lost) <= WINDOW_LINES
    header = json.loads((results / "journal.jsonl").read_text().splitlines()[0])
    assert header["type"] == "header"


def test_a_batch_goes_to_disk_when_the_journals_own_clock_says_it_is_old_enough(tmp_path):
    """The journal measures a batch's age on the clock it is given: real seconds passing on a
    simulated clock that stands still write nothing; the clock moving past sync_every does."""
    from common.app import Record
    from common.results.journal import Journal
    from common.testing.inprocess import FakeClock, fake_time

    clock = FakeClock()
    journal = Journal(tmp_path / "journal.jsonl", {"fingerprint": {}}, sync_every=0.15, clock=fake_time(clock))
    journal.append_result(Record(key="a", result={"n": 1}))
    time.sleep(0.5)  # past sync_every on the system's clock
    journal.maybe_sync()
    time.sleep(0.3)  # the writer thread's time, were it handed anything
    assert [entry["type"] for entry in journal_entries(tmp_path)] == ["header"]
    clock.advance(0.2)
    journal.maybe_sync()
    deadline = time.monotonic() + 30
    while len(journal_entries(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [entry.get("key") for entry in journal_entries(tmp_path)] == [None, "a"]
    journal.close()


def test_the_hold_and_the_progress_line_read_the_clock_they_are_given(tmp_path):
    """Rank 0's hold is stamped, and its progress line's rate and ETA measured, on its clock."""
    from common.observe.progress import Progress
    from common.results.hold import Hold
    from common.testing.inprocess import FakeClock, fake_time

    clock = FakeClock()
    assert Hold(tmp_path, clock=fake_time(clock)).me["since"] == clock.time()
    progress = Progress(40, 0, "toy", enabled=False, clock=fake_time(clock))
    clock.advance(5)
    progress.advance(10)
    assert progress.line() == "toy: 10/40 items done (25%), 2 items/s, ETA 15s, elapsed 5s"
