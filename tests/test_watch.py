"""Watching a job: python -m common.status on a running, finished, stopped and killed job (real
mpiexec, real signals), progress lines where stderr is not a terminal, GPU use from a fake NVML."""
from __future__ import annotations

import csv
import datetime
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Callable

import pytest

from common.observe.progress import format_seconds
from common.results.journal import JournalReader
from common.status import STALE_INTERVALS, STALE_MARGIN_SECONDS, describe
from helpers import REPO, TOY, kill_frozen, rank_pids, read_summary, run, start, wait_for_results, wait_until

FAKE_NVML = str(REPO / "tests" / "fake_nvml")


def status(results: Path, *extra: str) -> subprocess.CompletedProcess:
    return run(["-m", "common.status", str(results), *extra], timeout=60)


def status_file(results: Path) -> dict:
    try:
        return json.loads((Path(results) / "status.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def quick_status(monkeypatch):
    """Status every second and progress lines every second, so a test of seconds sees several."""
    monkeypatch.setenv("MULTINODE_GPU_STATUS_SECONDS", "1")
    monkeypatch.setenv("MULTINODE_GPU_PROGRESS_SECONDS", "1")


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four GPUs that NVML (tests/fake_nvml/pynvml.py) reports on; GPU 1 is a MIG-like slice."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE_NVML, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def test_a_running_job_seen_from_its_results_folder_then_finished(tmp_path, quick_status, fake_gpus):
    results = tmp_path / "r"
    job = start([TOY, "16", "--sleep", "1.5", "--gpu", "all", "--fail-key", "item-0003", "--retries", "0",
                 "--results", str(results)], ranks=2)
    watcher = subprocess.Popen([sys.executable, "-m", "common.status", str(results), "--watch", "0.5"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # a worker running an item on each rank (under load, one rank's workers may still be starting
        # when the other's run their first items)
        assert wait_until(lambda: status_file(results).get("state") == "running" and {
            w.get("rank") for w in status_file(results).get("workers", []) if w.get("state") == "running"} >= {0, 1},
            timeout=90), status_file(results)
        # what the command shows, asked until it too shows a worker of each rank running (it reads the
        # status file a moment later than the wait above, and the file is rewritten after 0.5, 1, 2 s,
        # then every second), and then every GPU (a rank's first snapshots may come before its GPUs'
        # first sample, a second into the run)
        seen: list = []

        def shows(pattern: str, wanted: Callable[[list], bool]) -> bool:
            shown = status(results)
            assert shown.returncode == 0, shown.stderr  # running
            seen.append(shown.stdout)
            return wanted(re.findall(pattern, shown.stdout, re.M))

        doing = r"^  (rank\d-gpu\d) .* (item-\d{4}) for (\d+)s"
        assert wait_until(lambda: shows(doing, lambda running: {w[:5] for w, _, _ in running} == {"rank0", "rank1"}),
                          timeout=60, every=0.2), seen[-1:]
        text = seen[-1]
        print(text)
        assert text.startswith("toy: running"), text
        assert re.search(r"items +\d+ of 16 done", text), text
        assert "rank 0 on" in text and "rank 1 on" in text
        # each worker's current item and for how long: two GPUs on each rank (they share the four out)
        running = re.findall(doing, text, re.M)
        assert all(int(seconds) < 30 for _, _, seconds in running), text
        sampled = r"^  (rank\d-gpu\d) .* util (\S+) .* memory (\d+)/40960 MiB"
        assert wait_until(lambda: shows(sampled, lambda gpus: len(gpus) == 4), timeout=60, every=0.2), seen[-1:]
        gpus = re.findall(sampled, seen[-1], re.M)
        assert {util for name, util, _ in gpus if name.endswith("gpu1")} == {"n/a"}  # NVML gives none for it
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 1, err
    # the watcher stops by itself once the job has ended, the last report being the final one
    watched, _ = watcher.communicate(timeout=30)
    assert watcher.returncode == 1  # the job's own code: items failed
    assert watched.count("--- ") >= 2 and watched.rstrip().splitlines()[-1].startswith("report"), watched
    ended = status(results)
    final = ended.stdout
    assert final.startswith("toy: failed") and ended.returncode == 1, final
    wall = read_summary(results)["wall_seconds"]
    assert f", ran {format_seconds(wall)}\n" in final, (wall, final)  # the wall time summary.md gives
    assert "15 of 16 done (93.8%), 1 failed, 0 handed out" in final
    assert "item-0003: RuntimeError: item item-0003 always fails" in final
    assert f"report   {results / 'report.html'}" in final

    # progress in a pipe: plain lines, each with done/total, rate and ETA (but the last: the run is over),
    # and never a carriage return
    assert "\r" not in err
    lines = re.findall(r"^toy: (\d+)/16 items done \(\d+%\)(, 1 failed)?, \S+ items/s, (ETA \S+, )?elapsed \S+$", err,
                       re.M)
    assert len(lines) >= 3, err
    assert lines[-1] == ("15", ", 1 failed", "") and all(line[2] for line in lines[:-1]), lines

    # GPU use over the run: every GPU of both ranks, sampled over time, in the CSV, the figure and the summary
    rows = list(csv.DictReader((results / "gpu_usage.csv").open()))
    assert {row["gpu"] for row in rows} == {"rank0-gpu0", "rank0-gpu1", "rank1-gpu2", "rank1-gpu3"}, rows[:3]
    for name in ("rank0-gpu0", "rank1-gpu3"):
        times = [float(row["time"]) for row in rows if row["gpu"] == name]
        assert len(times) >= 3 and times == sorted(times)
    assert all(row["util_percent"] == "" for row in rows if row["gpu"] == "rank0-gpu1")
    for suffix in (".png", ".svg", ".pdf"):
        assert (results / f"gpu_usage{suffix}").stat().st_size > 1000
    summary = read_summary(results)
    usage = summary["gpu_usage"]
    assert set(usage) == {"rank0-gpu0", "rank0-gpu1", "rank1-gpu2", "rank1-gpu3"}
    assert 25 <= usage["rank1-gpu2"]["util_mean_percent"] <= usage["rank1-gpu2"]["util_peak_percent"] <= 95
    assert usage["rank0-gpu1"]["util_mean_percent"] is None and usage["rank0-gpu1"]["memory_peak_mib"] > 0
    markdown = (results / "summary.md").read_text()
    assert "![GPU use over time](gpu_usage.png)" in markdown and "| rank0-gpu1 | n/a | n/a |" in markdown


def test_a_stopped_job_says_how_to_finish_it(tmp_path, quick_status):
    results = tmp_path / "r"
    job = start([TOY, "40", "--sleep", "0.5", "--workers", "2", "--gpu", "cpu", "--grace", "5",
                 "--results", str(results)])
    try:
        wait_for_results(results, 4)
        os.kill(rank_pids(results)[0], signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 75
    assert re.search(r"received SIGTERM: handing out no more items; waiting up to 5 s for the \d+ items? handed out to finish "
                     r"or come back \(the same signal again, 2 s or more later, ends the wait: they run again on "
                     r"--resume\)\n", err), err
    last = [line for line in err.splitlines() if line.startswith("toy: ") and " items done " in line][-1]
    assert "ETA" not in last and " elapsed " in last, err  # a stopped run's last progress line gives no ETA
    shown = status(results)
    text = shown.stdout
    assert text.startswith("toy: stopped") and shown.returncode == 75, text  # 75: --resume finishes it
    assert re.search(r"items +\d+ of 40 done", text) and "resume   with: python" in text and "--resume" in text, text


def as_if_on(results: Path, host: str) -> None:
    """Make a killed job's status and hold files say it ran on ``host`` (another node: its process
    cannot be looked at from here)."""
    for name in ("status.json", "hold.json"):
        path = Path(results) / name
        path.write_text(json.dumps(dict(json.loads(path.read_text()), host=host)))


def test_a_killed_job_is_reported_gone_once_its_status_file_is_stale(tmp_path, quick_status):
    """Killed on another node (seen from a login node): only the status file's age tells."""
    results = tmp_path / "r"
    job = start([TOY, "40", "--sleep", "0.5", "--gpu", "cpu", "--results", str(results)])
    try:
        wait_for_results(results, 3)
        assert wait_until(lambda: status_file(results).get("state") == "running", timeout=30)
        os.killpg(job.pid, signal.SIGKILL)  # the node is gone: nothing gets to write anything
        job.wait()
        as_if_on(results, "node7")
        fresh = status(results).stdout
        assert fresh.startswith("toy: running"), fresh
        # status every 1 s: stale after 4 intervals and a 5 s margin; asked (a process each time) from
        # when the file's own age says so, not every second before it
        every = float(status_file(results)["every"])
        stale = STALE_INTERVALS * every + STALE_MARGIN_SECONDS
        assert wait_until(lambda: time.time() - float(status_file(results)["updated"]) > stale, timeout=30, every=0.1)
        assert wait_until(lambda: status(results).stdout.startswith("toy: GONE?"), timeout=30, every=1.0)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    text = status(results).stdout
    assert "has not been refreshed for" in text and "--resume" in text, text
    done = sum(1 for line in (results / "journal.jsonl").read_text().splitlines() if '"type":"result"' in line)
    assert re.search(rf"items +{done} of 40 done \([\d.]+%\), 0 failed, 0 handed out", text), (done, text)
    # the stale file's running items, ETA and workers are not presented as current (a CPU job: no GPU lines)
    assert "no ETA (the job is not running)" in text and "ETA " not in text.replace("no ETA", ""), text
    assert "running" not in text.replace("not running", "") and "0 handed out" in text, text
    watched = status(results, "--watch", "1")  # ends with the job, a killed one too: after one look
    assert watched.returncode == 75 and watched.stdout.count("toy: GONE?") == 1, watched.stdout


def test_a_job_killed_on_this_host_is_reported_gone_at_once(tmp_path, quick_status):
    """Its hold names rank 0's process, which is gone: said at once (not "running" for the ~10 s the
    status file takes to go stale), with the time it ran until its last sign of life, the rate it
    made, and --watch ending after one look. A hold still refreshed says the job is alive, however
    old its status file; a hold that is not a file leaves the status file's age to tell."""
    results = tmp_path / "r"
    job = start([TOY, "40", "--sleep", "0.5", "--workers", "2", "--gpu", "cpu", "--results", str(results)])
    try:
        wait_for_results(results, 5)
        pid = status_file(results)["pid"]
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    shown = status(results)
    text = shown.stdout
    assert text.startswith(f"toy: GONE: its process is gone (rank 0, pid {pid} on "), text
    assert shown.returncode == 75, shown.stderr
    assert "--resume" in text and "rank0-cpu0" not in text, text  # no worker shown as starting or running
    # the command that finishes it, which the status file keeps (a killed job wrote no summary)
    assert re.search(r"^resume   with: python .*toy_app\.py 40 .*--resume$", text, re.M), text
    entries = [json.loads(line) for line in (results / "journal.jsonl").read_text().splitlines()]
    done = [e for e in entries if e["type"] == "result"]
    # until its last sign of life: the journal's last line, or a status refresh after it
    ran = max(max(e["end"] for e in done), status_file(results)["updated"]) - status_file(results)["started"]
    shown = re.search(r"ran at least (\S+); mean rate ([\d.]+) items/s", text)
    assert shown and shown.group(1) == format_seconds(ran), (ran, text)
    assert float(shown.group(2)) == pytest.approx(len(done) / ran, rel=0.01), text
    watched = status(results, "--watch", "1")
    assert watched.returncode == 75 and watched.stdout.count("toy: GONE:") == 1, watched.stdout
    # killed while writing its outputs: gone too (it said "finishing" for ever)
    running = (results / "status.json").read_text()
    (results / "status.json").write_text(json.dumps(dict(json.loads(running), state="finishing")))
    assert status(results).stdout.startswith(f"toy: GONE: its process is gone (rank 0, pid {pid} on "), status(results).stdout
    (results / "status.json").write_text(running)
    as_if_on(results, "node7")  # the same files seen from another host: its process cannot be looked at
    # refreshed just now (the looks above may have taken longer than the file takes to go stale)
    files = json.loads((results / "status.json").read_text())
    (results / "status.json").write_text(json.dumps(dict(files, updated=time.time())))
    assert status(results).stdout.startswith("toy: running"), status(results).stdout
    from common.status import gone  # in-process from here: the files' times set as each case needs

    files = json.loads((results / "status.json").read_text())
    quiet = files["updated"] + STALE_INTERVALS * files["every"] + STALE_MARGIN_SECONDS  # stale from then on
    stale = quiet + 2
    hold = json.loads((results / "hold.json").read_text())
    (results / "hold.json").write_text(json.dumps(dict(hold, refreshed=quiet + 1)))
    os.utime(results / "hold.json", (quiet + 1, quiet + 1))
    assert gone(results, files, stale) is None  # its hold refreshed after the status file went quiet: alive
    assert gone(results, files, stale + 3600).why.startswith("the status file has not been refreshed for")
    assert not gone(results, files, stale + 3600).certain  # the status file's silence alone: a guess
    # writing its outputs refreshes no status file, but its hold: from another host, a silent hold tells
    assert gone(results, dict(files, state="finishing"), stale) is None
    assert gone(results, dict(files, state="finishing"), stale + 3600).why.startswith(
        "its hold on the results folder has not been refreshed for 1h00m")
    (results / "hold.json").unlink()
    os.mkfifo(results / "hold.json")  # not a hold the engine wrote: never read (it would block), no traceback
    assert gone(results, files, stale).why.startswith("the status file has not been refreshed for")
    fifo = status(results)  # running or gone by now (the file's age), never a traceback
    assert fifo.returncode in (0, 75) and fifo.stderr == "", fifo.stderr


def test_a_bug_in_rank_0s_loop_leaves_a_failed_status_and_its_traceback_in_the_log(tmp_path):
    """An unexpected error in rank 0's loop (seen: a late answer the pool did not expect) left
    status.json saying "running", so the status command showed a dead run as running with an ETA
    until the file went stale, and rank0.log had no trace of it. Now the status file says failed
    and the log holds the traceback (stderr has Python's own)."""
    script = tmp_path / "buggy_app.py"
    script.write_text(f"""import sys
sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
from common import main
from common.ranks.scheduler import Scheduler
from toy_app import ToyApp

done = Scheduler.done


def done_until_the_third(self, key, result):
    if len(self.results) >= 3:
        raise RuntimeError("a bug in rank 0's loop")
    return done(self, key, result)


Scheduler.done = done_until_the_third
if __name__ == "__main__":
    raise SystemExit(main(ToyApp))
""")
    results = tmp_path / "r"
    proc = run([str(script), "10", "--sleep", "0.05", "--gpu", "cpu", "--workers", "2", "--results", str(results),
                "--no-progress"])
    assert proc.returncode == 1 and "RuntimeError: a bug in rank 0's loop" in proc.stderr, proc.stderr
    assert status_file(results)["state"] == "failed"
    shown = status(results)
    assert shown.returncode == 1 and shown.stdout.startswith("toy: failed"), shown.stdout
    # what happened, where its traceback is, and how to go on: the journal kept what finished
    assert "\nerror    rank 0 failed: RuntimeError: a bug in rank 0's loop (the traceback is in logs/rank0.log)\n" \
        in shown.stdout, shown.stdout
    assert re.search(r"^resume   after a fix, with: python .*buggy_app\.py 10 .*--resume$",
                     shown.stdout, re.M), shown.stdout
    log_text = (results / "logs" / "rank0.log").read_text()
    assert "unexpected error:" in log_text and "RuntimeError: a bug in rank 0's loop" in log_text, log_text


def test_a_folder_that_is_not_a_run_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "a-file").write_text("")
    for folder, fragment in ((tmp_path / "missing", "no such folder"), (tmp_path, "not the results folder"),
                             (tmp_path / "a-file", "is not a folder")):
        proc = status(folder)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr
    proc = status(tmp_path, "--watch", "0")
    assert proc.returncode == 2 and "--watch" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # argparse's own refusals too (they were its usage line and the error: two lines)
    for arguments, fragment in ((["--watch", "abc"], "argument --watch: invalid float value: 'abc'"),
                                (["--bogus"], "unrecognized arguments: --bogus")):
        proc = status(tmp_path, *arguments)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert proc.stderr.splitlines() == [f"python -m common.status: error: {fragment} (see --help)"], proc.stderr


def test_progress_in_a_terminal_is_a_bar(tmp_path):
    """A real pseudo-terminal as stderr: tqdm's bar, redrawn with carriage returns, no plain lines."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
    proc = subprocess.Popen([sys.executable, TOY, "6", "--sleep", "0.3", "--gpu", "cpu",
                             "--results", str(tmp_path / "r")], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=follower,
                            env=dict(os.environ, MULTINODE_GPU_PROGRESS_SECONDS="0.2"))
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the program ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    shown = b"".join(chunks).decode(errors="replace")
    assert "\r" in shown and "6/6" in shown, shown
    assert "items done (" not in shown, shown


def test_a_rank_that_falls_silent_is_shown_silent_then_lost(tmp_path, quick_status):
    import psutil

    results = tmp_path / "r"
    job = start([TOY, "40", "--sleep", "0.5", "--gpu", "cpu", "--heartbeat-timeout", "8", "--results", str(results)],
                ranks=2)
    frozen = []
    try:
        wait_for_results(results, 4)
        rank1 = psutil.Process(rank_pids(results)[1])
        frozen = [rank1] + rank1.children(recursive=True)
        for process in frozen:  # alive but silent, as a node whose network dropped
            process.send_signal(signal.SIGSTOP)
        # one look per poll: "silent" lasts a few seconds before "LOST", and two slow looks could miss it
        assert wait_until(lambda: re.search(r"rank 1 on .*silent for", status(results).stdout), timeout=30, every=0.5)
        assert wait_until(lambda: "LOST" in status(results).stdout, timeout=30, every=0.5)
        text = status(results).stdout
        assert re.search(r"^ranks +2, 1 not ok$", text, re.M) and "rank 1 on" in text and "no message for" in text
        job.communicate(timeout=120)
    finally:
        kill_frozen(frozen)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    final = status(results).stdout
    assert final.startswith("toy: complete") and "40 of 40 done" in final and "LOST" in final, final


def test_a_gone_jobs_last_gpu_sample_says_how_old_it_is(tmp_path):
    """A killed job's status file still holds its GPUs' last sample: shown as taken before the job
    went silent, with its age, never as what the GPUs do now."""
    now = 1_000_000.0
    sample = {"rank": 0, "gpu": "gpu0", "host": "node1", "util_percent": 97.0, "util_recent_percent": 95.0,
              "memory_mib": 30000.0, "memory_total_mib": 40960.0, "memory_recent_mib": 29000.0,
              "temperature_c": 70.0, "power_w": 300.0}
    state = {"app": "toy", "state": "running", "every": 1.0, "updated": now - 600.0, "started": now - 900.0,
             "items_total": 10, "items_done": 4, "gpus": [sample]}
    journal = JournalReader(tmp_path / "journal.jsonl")
    gone = describe(tmp_path, state, journal, now)
    assert gone.startswith("toy: GONE?"), gone
    assert "GPUs     last sample, taken 10m00s ago, before the job went silent (mean of the minute before it)" in gone
    assert "util 97% (95%)" in gone  # the figures themselves are kept: where the job was when it went
    running = describe(tmp_path, dict(state, updated=now - 0.5), journal, now)
    assert "GPUs     last sample (mean of the last minute)" in running and "silent" not in running, running


def test_a_rate_of_zero_from_before_the_journals_results_is_not_shown(tmp_path):
    """The first status file of a run says 0 items/s (nothing done yet); seconds later the journal
    holds results, and the status command showed "5 of 30 done ... rate 0.000 items/s". A rate of
    zero that the journal has overtaken is "n/a" until the next refresh."""
    now = 1_000_000.0
    state = {"app": "toy", "state": "running", "every": 5.0, "updated": now - 4.0, "started": now - 9.0,
             "items_total": 30, "items_done": 0, "rate_per_second": 0.0}
    journal_file = tmp_path / "journal.jsonl"
    journal_file.write_text(json.dumps({"type": "header"}) + "\n" + "".join(
        json.dumps({"type": "result", "key": f"item-{i}", "result": {}, "start": now - 8, "end": now - 5}) + "\n"
        for i in range(5)))
    journal = JournalReader(journal_file)
    journal.update()
    text = describe(tmp_path, state, journal, now)
    assert re.search(r"items +5 of 30 done", text) and "rate     n/a" in text, text
    assert "rate     0.000 items/s" in describe(tmp_path, state, JournalReader(tmp_path / "none.jsonl"), now)


def test_a_killed_jobs_done_items_are_the_ones_its_journal_kept(tmp_path):
    """The journal is written in batches, so the status file may count a result that was still
    waiting for its batch when the job was killed. Of a killed job, "done" and its mean rate are the
    journal's (what a resume keeps), and the items it lost are said to run again."""
    now = 1_000_000.0
    state = {"app": "toy", "state": "running", "every": 1.0, "updated": now - 600.0, "started": now - 610.0,
             "items_total": 40, "items_done": 6, "rate_per_second": 0.6,
             "ranks": [{"rank": 0, "host": "node1", "heard": now - 600.0}]}
    journal_file = tmp_path / "journal.jsonl"
    journal_file.write_text(json.dumps({"type": "header"}) + "\n" + "".join(
        json.dumps({"type": "result", "key": f"item-{i}", "result": {}, "start": now - 609, "end": now - 605})
        + "\n" for i in range(5)))
    journal = JournalReader(journal_file)
    journal.update()
    text = describe(tmp_path, state, journal, now)
    assert text.startswith("toy: GONE?"), text
    assert re.search(r"^items +5 of 40 done \(12\.5%\), 0 failed, 0 handed out; 1 more had finished but was not yet "
                     r"in the journal when it was killed \(a resume runs it again\)$", text, re.M), text
    assert "ran at least 10s; mean rate 0.500 items/s" in text, text
    # no rank of it is "ok" (it said "GONE: ... killed", then "rank 0 on node1: ok")
    assert "ranks    1, 1 not ok\n  rank 0 on node1: gone with the job (last heard 10m00s ago)" in text, text
    # a running job's status file counts what its journal will have in a moment
    alive = describe(tmp_path, dict(state, updated=now - 0.5, ranks=[{"rank": 0, "host": "node1", "heard": now - 0.5}]),
                     journal, now)
    assert re.search(r"^items +6 of 40 done \(15\.0%\), 0 failed, 0 handed out$", alive, re.M), alive
    assert "ranks    1\n  rank 0 on node1: ok" in alive, alive


def test_a_journal_resume_would_refuse_is_said_where_the_status_file_says_complete(tmp_path, monkeypatch):
    """The status file says complete; a damaged line mid-journal, or a journal that cannot be read,
    makes --resume refuse the folder: the status says so instead of leaving it to the resume."""
    now = 1_000_000.0
    state = {"app": "toy", "state": "complete", "every": 1.0, "updated": now - 1.0, "started": now - 10.0,
             "items_total": 2, "items_done": 2}
    journal = tmp_path / "journal.jsonl"
    good = [json.dumps({"type": "header", "format": 1}), json.dumps({"type": "result", "key": "a", "result": 1})]
    journal.write_text("\n".join([good[0], "{not json", good[1]]) + "\n")
    for text in (describe(tmp_path, state, JournalReader(journal).update(), now),
                 describe(tmp_path, None, JournalReader(journal).update(), now)):  # the journal alone
        assert "journal  journal.jsonl: line 2 is not a journal record: damaged; --resume refuses it" in text, text
    journal.write_text("\n".join(good) + "\n{torn last li")  # a kill's torn last line: resumed, not refused
    assert "journal  " not in describe(tmp_path, state, JournalReader(journal).update(), now)
    # not there yet (a job starting): nothing to say
    assert "journal  " not in describe(tmp_path, state, JournalReader(tmp_path / "none.jsonl").update(), now)
    journal.write_text("\n".join(good) + "\n")

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    reader = JournalReader(journal)
    with monkeypatch.context() as patch:
        patch.setattr("common.results.journal.read_regular", refused)
        text = describe(tmp_path, state, reader.update(), now)
        assert "journal  journal.jsonl: cannot read it (Permission denied); --resume refuses it" in text, text
    assert reader.update().problem is None  # read again (a network file system's moment): nothing to say
    # a result line a resume cannot take (no key): said too
    journal.write_text("\n".join([good[0], json.dumps({"type": "result", "result": 2}), good[1]]) + "\n")
    assert "line 2 is not a journal record: damaged; --resume refuses it" in describe(
        tmp_path, state, JournalReader(journal).update(), now)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the status command as another user")
def test_a_folder_the_user_may_not_look_into_is_one_line_and_exit_2():
    """Another user's results folder (mode 700): one line, not a PermissionError from a file in it."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as place:  # pytest's own folders are root's alone
        os.chmod(place, 0o755)
        shut = Path(place) / "shut"
        shut.mkdir(mode=0o700)
        (shut / "status.json").write_text("{}")
        proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                               "-m", "common.status", str(shut)], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=str(REPO), MPLCONFIGDIR=place, HOME=place))
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.splitlines() == [f"python -m common.status: error: '{shut}': cannot read it (Permission denied)"]


def test_a_moved_folder_says_where_it_was_beside_the_command_that_finishes_it(tmp_path):
    """The resume command names the --results the job was given; status of a moved, renamed or copied
    folder says so, and which folder to give instead."""
    now = 1_000_000.0
    here = tmp_path / "moved"
    here.mkdir()
    state = {"app": "toy", "state": "stopped", "every": 1.0, "updated": now - 1.0, "started": now - 10.0,
             "items_total": 4, "items_done": 2, "resume_command": "python toy.py 4 --results old --resume",
             "results_dir": str(tmp_path / "old")}
    text = describe(here, state, JournalReader(here / "journal.jsonl"), now)
    assert "resume   with: python toy.py 4 --results old --resume\n" in text, text
    # a run of several ranks goes on under its launcher, with as many ranks
    ranks = [{"rank": 0, "host": "a", "heard": now - 1.0}, {"rank": 1, "host": "b", "heard": now - 1.0}]
    assert "resume   with the same launcher (2 ranks) and: python toy.py 4 --results old --resume\n" in describe(
        here, dict(state, ranks=ranks), JournalReader(here / "journal.jsonl"), now)
    assert f"moved    this folder was '{tmp_path / 'old'}' when the job ran: in the command above, give --results " \
           f"'{here.resolve()}'" in text, text
    for same in (str(here), None):  # where it ran, or a status file from before the field: nothing to say
        assert "moved " not in describe(here, {**state, "results_dir": same}, JournalReader(here / "journal.jsonl"), now)
    # the folder by another path that leads to it (a link): nothing to say
    (tmp_path / "link").symlink_to(here)
    linked = {**state, "results_dir": str(tmp_path / "link"), "results_inode": os.stat(here).st_ino}
    assert "moved " not in describe(here, linked, JournalReader(here / "journal.jsonl"), now)
    # its inode where the job's path leads nowhere: renamed with mv (a review followed the old path's
    # --resume, which ran every item again), or seen through a container's bind mount: both said
    renamed = {**state, "results_inode": os.stat(here).st_ino}
    assert (f"moved    this folder was '{tmp_path / 'old'}' when the job ran, a path not found here: if it was renamed, "
            f"give --results '{here.resolve()}' in the command above") in describe(
        here, renamed, JournalReader(here / "journal.jsonl"), now)


def test_status_from_another_folder_says_where_the_job_was_launched(tmp_path, monkeypatch):
    """The commands the status command gives are the job's own, with its relative paths (--grid
    g.json, a module found where it was launched): run from elsewhere they failed ("cannot import
    'chatty3'", found by a helper's review). Seen from another folder it says where to give them."""
    now = 1_000_000.0
    launched = tmp_path / "my work"
    launched.mkdir()
    state = {"app": "sweep", "state": "stopped", "every": 1.0, "updated": now - 1.0, "started": now - 10.0,
             "items_total": 4, "items_done": 2, "resume_command": "python -m common.sweep m:fit --grid g.json --resume",
             "launch_dir": str(launched)}
    monkeypatch.chdir(tmp_path)
    text = describe(tmp_path, state, JournalReader(tmp_path / "journal.jsonl"), now)
    assert (f"folder   the job was launched in '{launched}': the command above reads its relative paths (and a "
            f"user's module) from there: cd '{launched}' first") in text, text
    monkeypatch.chdir(launched)  # there, or a file from before the field: nothing to say
    assert "folder " not in describe(tmp_path, state, JournalReader(tmp_path / "journal.jsonl"), now)
    assert "folder " not in describe(tmp_path, {**state, "launch_dir": None}, JournalReader(tmp_path / "journal.jsonl"), now)


def test_a_finished_jobs_run_time_is_the_one_its_summary_gives(tmp_path):
    """status.json is last written after the outputs (a minute of figures, for a big run); the time
    the job ran is summary.md's wall time all the same, so that the two never disagree."""
    now = 1_000_000.0
    started = datetime.datetime.fromtimestamp(now - 101.0).isoformat(timespec="seconds")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete", "wall_seconds": 70.4, "started": started}))
    state = {"app": "toy", "state": "complete", "every": 1.0, "updated": now - 1.0, "started": now - 101.0,
             "items_total": 10, "items_done": 10}
    text = describe(tmp_path, state, JournalReader(tmp_path / "journal.jsonl"), now)
    assert ", ran 1m10s\n" in text, text
    # an earlier run's summary (this one's could not be written): its time is not this run's
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete", "wall_seconds": 70.4, "started": "2001-01-01T00:00:00"}))
    assert ", ran 1m40s\n" in describe(tmp_path, state, JournalReader(tmp_path / "journal.jsonl"), now)
    # written in another time zone (the job's node), read here: the same start, with its offset
    for hours in (-5, 0, 9):
        zone = datetime.timezone(datetime.timedelta(hours=hours))
        there = datetime.datetime.fromtimestamp(now - 101.0, zone).isoformat(timespec="seconds")
        (tmp_path / "summary.json").write_text(json.dumps({"status": "complete", "wall_seconds": 70.4, "started": there}))
        assert ", ran 1m10s\n" in describe(tmp_path, state, JournalReader(tmp_path / "journal.jsonl"), now), there


def test_the_status_file_is_rewritten_soon_after_the_start_then_every_period(tmp_path, monkeypatch):
    """It was written at the start and then every 5 s: seconds into a run the status command showed
    the start's snapshot (workers "starting", nothing running) beside the journal's first results.
    The first rewrites now come after 0.5, 1, 2 and 4 s, then every period."""
    import types

    from common.results.status_file import StatusWriter
    from common.testing.inprocess import FakeClock, fake_time

    clock = FakeClock(1000.0)
    writer = StatusWriter(tmp_path, app="toy", command="python toy", layout=[{"rank": 0, "host": "h"}], items_total=1,
                          items_resumed=0, started_at=0.0, pool=None, monitor=None, every=5.0, clock=fake_time(clock))
    written = []
    monkeypatch.setattr(writer, "write", lambda leader, state: written.append(round(clock.monotonic() - 1000.0, 1)))
    leader = types.SimpleNamespace(stopping=None)
    for tenth in range(300):  # the loop's ticks, every 0.1 s for 30 s
        clock.now = 1000.0 + tenth / 10
        writer.tick(leader)
    assert written == [0.0, 0.5, 1.5, 3.5, 7.5, 12.5, 17.5, 22.5, 27.5], written


def test_followers_report_their_workers_as_soon_as_rank_0_rewrites_the_file(tmp_path):
    """A follower sent its snapshot at the start and then every 5 s: for the first seconds of a run
    the file said its workers were "starting" while they ran items (and the file is rewritten after
    0.5, 1, 2 and 4 s). It keeps the file's pace now."""
    from common.results.status_file import RankReporter
    from common.testing.inprocess import FakeClock, fake_time

    clock = FakeClock(1000.0)
    reporter = RankReporter(pool=None, monitor=None, every=5.0, clock=fake_time(clock))
    sent = []
    for tenth in range(300):  # the follower's loop, every 0.1 s for 30 s
        clock.now = 1000.0 + tenth / 10
        if reporter.due():
            sent.append(round(clock.monotonic() - 1000.0, 1))
    assert sent == [0.0, 0.5, 1.5, 3.5, 7.5, 12.5, 17.5, 22.5, 27.5], sent
    # and at once when a worker becomes ready: a review saw "rank1-cpu0 starting" for seconds after
    # it had begun its first item (the worker importing torch, ready at 2.6 s, told only at 3.5)
    import types

    worker = types.SimpleNamespace(ready=False)
    reporter = RankReporter(pool=types.SimpleNamespace(workers={"rank1-cpu0": worker}), monitor=None, every=5.0,
                            clock=fake_time(clock))
    sent = []
    for tenth in range(100):
        clock.now = 2000.0 + tenth / 10
        worker.ready = tenth >= 26
        if reporter.due():
            sent.append(round(clock.monotonic() - 2000.0, 1))
    assert sent == [0.0, 0.5, 1.5, 2.6, 3.5, 7.5], sent


def test_the_last_status_file_of_a_run_shows_no_worker_running(tmp_path):
    """The last rewrite, once the run ended, kept each follower's last snapshot, up to a period old:
    a complete run's status.json said a worker of rank 1 was still "starting" or "running item-0019"."""
    import types

    from common.results.status_file import StatusWriter

    class Pool:
        rank, host, workers, given_up = 0, "n0", {}, {"rank0-cpu1": "its setup failed"}

    monitor = types.SimpleNamespace(recent=lambda: [])
    writer = StatusWriter(tmp_path, app="toy", command="python toy", layout=[{"rank": 0, "host": "n0"},
                                                                            {"rank": 1, "host": "n1"}],
                          items_total=2, items_resumed=0, started_at=0.0, pool=Pool(), monitor=monitor, every=5.0)
    writer.absorb(1, {"rank": 1, "host": "n1", "time": 0.0, "gpus": [], "given_up": {}, "workers": [
        {"worker": "rank1-cpu0", "device": "cpu0", "pid": 11, "state": "running", "key": "item-0001", "attempt": 1,
         "since": 0.0, "together": 1},
        {"worker": "rank1-cpu1", "device": "cpu1", "pid": 12, "state": "starting"}]})
    scheduler = types.SimpleNamespace(results={"item-0000": 1, "item-0001": 2}, failed={}, in_flight={}, unresolved=0)
    records = {key: types.SimpleNamespace(start=0.0) for key in ("item-0000", "item-0001")}
    leader = types.SimpleNamespace(stopping=None, records=records, scheduler=scheduler, broken={}, lost={})
    writer.write(leader, "running")
    running = json.loads((tmp_path / "status.json").read_text())["workers"]
    assert [w["state"] for w in running] == ["given up", "running", "starting"], running
    writer.finished(leader, 0)
    final = json.loads((tmp_path / "status.json").read_text())
    assert final["state"] == "complete"
    assert [(w["worker"], w["state"]) for w in final["workers"]] == [
        ("rank0-cpu1", "given up"), ("rank1-cpu0", "ended"), ("rank1-cpu1", "ended")], final["workers"]
    assert "key" not in final["workers"][1]


def test_the_rate_counts_from_when_the_first_item_started_not_from_the_workers_start_up(tmp_path):
    """mnist_nn's workers import torch for 3.5 s before an item starts: a run 7 s old that had done 17
    items in the last 3.5 s showed "0.276 items/s, ETA 1m05s" and finished 3 s later (a review)."""
    import types

    from common.results.status_file import StatusWriter
    from common.testing.inprocess import FakeClock, fake_time

    clock = FakeClock(7.0, epoch=0.0)  # the run started at 0 (epoch seconds), now is 7
    pool = types.SimpleNamespace(rank=0, host="n0", workers={}, given_up={})
    writer = StatusWriter(tmp_path, app="nn", command="python -m mnist_nn", layout=[{"rank": 0, "host": "n0"}],
                          items_total=35, items_resumed=0, started_at=0.0, pool=pool,
                          monitor=types.SimpleNamespace(recent=lambda: []), every=5.0, clock=fake_time(clock))
    records = {f"item-{i}": types.SimpleNamespace(start=3.5 + 0.1 * i) for i in range(17)}
    scheduler = types.SimpleNamespace(results=records, failed={}, in_flight={}, unresolved=18)
    writer.write(types.SimpleNamespace(stopping=None, records=records, scheduler=scheduler, broken={}, lost={}), "running")
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["rate_per_second"] == pytest.approx(17 / 3.5) and status["eta_seconds"] == pytest.approx(18 / (17 / 3.5))


def test_a_worker_the_file_shows_starting_but_the_journal_shows_busy_is_busy_with_a_fresh_eta(tmp_path):
    """The file is up to a period older than the journal: it said "rank1-cpu0 starting" beside the
    journal's results of that worker, and kept the ETA of its own count (26 of 30 done by the
    journal, "ETA 6s" from when the file counted 12) until its next rewrite."""
    now = 1_000_000.0
    workers = [{"worker": "rank1-cpu0", "host": "n1", "state": "starting"},
               {"worker": "rank1-cpu1", "host": "n1", "state": "starting"}]
    state = {"app": "toy", "state": "running", "every": 5.0, "updated": now - 4.0, "started": now - 9.0,
             "items_total": 30, "items_done": 12, "items_this_run": 12, "items_failed": 0, "items_remaining": 18,
             "rate_per_second": 3.0, "eta_seconds": 6.0, "workers": workers}
    lines = [json.dumps({"type": "header"}), json.dumps({"type": "start", "time": now - 9.0})]
    lines += [json.dumps({"type": "result", "key": f"item-{i:04d}", "worker": "rank1-cpu0", "seconds": 0.3,
                          "end": now - 8.0 + 0.3 * i}) for i in range(26)]
    journal_file = tmp_path / "journal.jsonl"
    journal_file.write_text("\n".join(lines) + "\n")
    text = describe(tmp_path, state, JournalReader(journal_file).update(), now)
    assert "items    26 of 30 done" in text, text
    assert "rate     3.000 items/s, ETA 1s;" in text, text  # 4 left at 3 items/s
    assert "rank1-cpu0  n1  busy: 26 done in this run, 0.3s each, the last ended 0.5s ago" in text, text
    assert "rank1-cpu1  n1  starting" in text, text  # nothing of its own in the journal
    # a worker started again (after a crash: the same name) in a fresh file, its results older than it
    fresh = {**state, "updated": now - 0.2, "workers": [{"worker": "rank1-cpu0", "host": "n1", "state": "starting"}]}
    assert "rank1-cpu0  n1  starting" in describe(tmp_path, fresh, JournalReader(journal_file).update(), now)
    # a resume that runs a journaled item again (a refit after retried fits): the earlier run's result
    # leaves it to run; what is left is counted in this run, as the file counts it
    lines = [json.dumps({"type": "header"}), json.dumps({"type": "result", "key": "refit", "end": now - 500})]
    lines += [json.dumps({"type": "start", "time": now - 60})]
    lines += [json.dumps({"type": "result", "key": f"fit-{i}", "worker": "rank0-cpu0", "seconds": 1.0, "end": now - 50 + i})
              for i in range(4)]
    journal_file.write_text("\n".join(lines) + "\n")
    rerun = {**state, "items_total": 5, "items_done": 4, "items_this_run": 4, "items_remaining": 1,
             "rate_per_second": 0.01, "eta_seconds": 100.0, "workers": []}
    assert "ETA 1m40s;" in describe(tmp_path, rerun, JournalReader(journal_file).update(), now)


def test_an_item_the_journal_resolved_is_not_shown_running_and_a_stopping_job_has_no_eta(tmp_path):
    """The status file is up to 5 s older than the journal: a worker it shows on x=3 "for 6s" while
    the journal already lists x=3 as failed showed the item running and failed at once; and a job
    that is stopping showed an ETA for the items it will not run."""
    now = 1_000_000.0
    worker = {"worker": "rank0-cpu0", "host": "vm", "state": "running", "key": "x=3", "since": now - 6.0}
    other = {"worker": "rank0-cpu1", "host": "vm", "state": "running", "key": "x=4", "since": now - 1.0}
    state = {"app": "sweep", "state": "running", "every": 5.0, "updated": now - 4.0, "started": now - 20.0,
             "items_total": 10, "items_done": 2, "items_this_run": 2, "items_failed": 0, "items_remaining": 8,
             "rate_per_second": 0.5, "eta_seconds": 16.0, "workers": [worker, other]}
    journal_file = tmp_path / "journal.jsonl"
    journal_file.write_text(json.dumps({"type": "header"}) + "\n"
                            + json.dumps({"type": "failed", "key": "x=3", "error": "ValueError: no"}) + "\n")
    journal = JournalReader(journal_file).update()
    text = describe(tmp_path, state, journal, now)
    assert "rank0-cpu0  vm  x=3 ended; what it runs next shows at the next refresh" in text, text
    assert "rank0-cpu1  vm  x=4 for 1s" in text and "  x=3: ValueError: no" in text, text
    assert "ETA 14s" in text, text  # 7 left, not the file's 8: the journal's failure is fresher
    stopping = describe(tmp_path, dict(state, state="stopping"), journal, now)
    assert "no ETA (stopping)" in stopping and "ETA 14s" not in stopping, stopping
    # a resume runs an item again whose earlier result is in the journal (a refit after retried fits):
    # only what ended since this run started counts
    journal_file.write_text(json.dumps({"type": "header"}) + "\n"
                            + json.dumps({"type": "result", "key": "x=4", "end": now - 60}) + "\n"
                            + json.dumps({"type": "start", "time": now - 20}) + "\n")
    rerun = describe(tmp_path, state, JournalReader(journal_file).update(), now)
    assert "rank0-cpu1  vm  x=4 for 1s" in rerun, rerun


def test_counts_and_attempts_the_journal_has_overtaken_are_not_shown_as_the_file_has_them(tmp_path):
    """The file is up to a refresh older than the journal: "28 of 30 done, 0 failed, 5 handed out"
    (33 of 30), and a worker "on x=5 for 5s" under --item-timeout 2, whose attempt the journal had
    already seen killed (found by two helpers' reviews)."""
    now = 1_000_000.0
    workers = [{"worker": "rank0-cpu0", "host": "vm", "state": "running", "key": "x=5", "since": now - 5.0, "attempt": 1},
               {"worker": "rank0-cpu1", "host": "vm", "state": "running", "key": "x=6", "since": now - 1.0}]
    state = {"app": "sweep", "state": "running", "every": 5.0, "updated": now - 4.0, "started": now - 30.0,
             "items_total": 30, "items_done": 20, "items_this_run": 20, "items_failed": 0, "items_remaining": 10,
             "items_running": 5, "rate_per_second": 1.0, "eta_seconds": 10.0, "workers": workers}
    lines = [json.dumps({"type": "header"}), json.dumps({"type": "start", "time": now - 30.0})]
    lines += [json.dumps({"type": "result", "key": f"x={i}", "worker": "rank0-cpu1", "seconds": 0.5, "end": now - 30 + i})
              for i in range(7, 35)]
    lines += [json.dumps({"type": "attempt_failed", "key": "x=5", "worker": "rank0-cpu0", "start": now - 5.0,
                          "end": now - 2.8, "error": "timed out"})]
    journal_file = tmp_path / "journal.jsonl"
    journal_file.write_text("\n".join(lines) + "\n")
    text = describe(tmp_path, state, JournalReader(journal_file).update(), now)
    assert "items    28 of 30 done (93.3%), 0 failed, 2 handed out" in text, text
    assert "rank0-cpu0  vm  x=5: that attempt ended without a result; what it runs next shows at the next refresh" \
        in text, text
    assert "rank0-cpu1  vm  x=6 for 1s" in text, text
    # an attempt of that key that ended before the one the file shows takes nothing from it
    workers[0]["since"] = now - 2.0
    assert "rank0-cpu0  vm  x=5 for 2s" in describe(tmp_path, state, JournalReader(journal_file).update(), now)


def test_a_worker_whose_items_are_shorter_than_a_refresh_shows_its_pace_from_the_journal(tmp_path):
    """Items of under a second and a status file rewritten every 5 s: the item the file shows a worker
    on has nearly always ended, and every worker read "ended; what it runs next shows at the next
    refresh". The journal's result lines of this run give each worker's count, seconds per item (a
    group's time shared by its items) and last end instead; a worker still on its item shows its count
    beside it; one whose last item ended longer than a refresh ago may have had no more: not "busy"."""
    now = 1_000_000.0

    def running(worker: str, key: str, since: float) -> dict:
        return {"worker": worker, "host": "n1", "state": "running", "key": key, "since": now - since}

    workers = [running("rank0-gpu0", "x=7", 3.0), running("rank1-gpu0", "x=8", 2.0), running("rank1-gpu1", "g=3", 3.0),
               running("rank2-gpu0", "f=2", 4.0), running("rank3-gpu0", "z=1", 8.0)]
    state = {"app": "sweep", "state": "running", "every": 5.0, "updated": now - 3.0, "started": now - 60.0,
             "items_total": 100, "items_done": 6, "workers": workers}

    def result(key: str, worker: str, seconds: float, end: float, **more) -> str:
        return json.dumps({"type": "result", "key": key, "worker": worker, "seconds": seconds, "end": end, **more}) + "\n"

    journal_file = tmp_path / "journal.jsonl"
    earlier_run = result("x=1", "rank0-gpu0", 30.0, now - 500) + result("x=2", "rank0-gpu0", 30.0, now - 400)
    journal_file.write_text(json.dumps({"type": "header"}) + "\n" + earlier_run
                            + json.dumps({"type": "start", "time": now - 60}) + "\n"
                            + "".join(result(f"x={i}", "rank0-gpu0", 0.5 + 0.2 * i, now - 6.0 + 0.6 * i) for i in range(3, 8))
                            + result("x=2", "rank1-gpu0", 40.0, now - 2.0)
                            # a group of 4 run together: each item's line has the group's 2 s
                            + "".join(result(f"g={i}", "rank1-gpu1", 2.0, now - 1.0, group_size=4) for i in range(4))
                            + "".join(result(f"f={i}", "rank2-gpu0", 0.004, now - 0.5) for i in range(3))
                            + result("z=1", "rank3-gpu0", 1.0, now - 7.0))
    text = describe(tmp_path, state, JournalReader(journal_file).update(), now)
    # 5 items of this run (not the earlier run's 2), 0.5 + 0.2 i s for i = 3..7 on average, the last
    # (x=7) at now - 6.0 + 4.2
    assert "rank0-gpu0  n1  busy: 5 done in this run, 1.5s each, the last ended 1.8s ago" in text, text
    assert "rank1-gpu0  n1  x=8 for 2s; 1 done in this run" in text, text
    assert "rank1-gpu1  n1  busy: 4 done in this run, 0.5s each, the last ended 1.0s ago" in text, text
    assert "rank2-gpu0  n1  busy: 3 done in this run, 4ms each, the last ended 0.5s ago" in text, text
    # its last item ended 7 s ago, more than a refresh: it may have had no more (the end of a run)
    assert "rank3-gpu0  n1  z=1 ended; what it runs next shows at the next refresh" in text, text
    assert text.count("ended; what it runs next") == 1, text


def test_the_terminal_bar_says_how_many_of_its_items_failed_until_the_end():
    """The bar counts items resolved (6/6); its postfix said "failed=1" and then, once it counted
    the rest, kept "1 ok" from the moment of the failure: it follows every item now."""
    import io

    from common.observe.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    progress = Progress(6, 0, "toy", stream=Terminal())
    progress.advance(1)
    progress.advance(1, failed=True)
    assert progress.bar.postfix == "1 ok, 1 failed"
    for _ in range(4):
        progress.advance(1)
    assert progress.bar.n == 6 and progress.bar.postfix == "5 ok, 1 failed", progress.bar.postfix
    progress.bar.close()


def test_watch_into_a_reader_that_leaves_ends_quietly(tmp_path):
    """``python -m common.status R --watch 1 | head -1`` while the job runs: exit 0, no BrokenPipeError."""
    results = tmp_path / "r"
    job = start([TOY, "8", "--sleep", "2", "--gpu", "cpu", "--results", str(results), "--no-progress"])
    try:
        wait_until(lambda: (results / "status.json").exists(), timeout=60)
        watch = subprocess.Popen([sys.executable, "-m", "common.status", str(results), "--watch", "0.2"], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert watch.stdout.readline().startswith(b"--- ")
        watch.stdout.close()  # as head -1 does
        assert watch.wait(timeout=30) == 0
        assert watch.stderr.read() == b""
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_a_status_that_cannot_be_written_is_one_line_and_no_jobs_state(tmp_path):
    """``python -m common.status r > /dev/full`` was a traceback and exit 1, which the command's
    contract reads as a failed job; the job here is complete."""
    results = tmp_path / "r"
    assert run([TOY, "2", "--results", str(results), "--no-progress"]).returncode == 0
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "common.status", str(results)], cwd=REPO, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 74, done.stderr
    assert done.stderr == ("python -m common.status: error: the status could not be written to stdout (No space left "
                           "on device)\n"), done.stderr
