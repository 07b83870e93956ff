"""One run per results folder at a time (common/results/hold.py): real runs, real signals, real files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.results.hold import _me, read_hold, stale_because
from common.results.layout import HOLD_NAME, STATUS_NAME
from helpers import (
    REPO,
    TOY,
    assert_usage_error,
    journal_entries,
    run,
    snapshot,
    start,
    values,
    wait_for_results,
    wait_until,
)
from mount_sandbox import unavailable as mount_namespaces_unavailable


def hold_of(results: Path) -> dict:
    return json.loads((Path(results) / HOLD_NAME).read_text())


def starts(results: Path) -> int:
    return sum(1 for e in journal_entries(results) if e.get("type") == "start")


def end(process: subprocess.Popen, sig: int = signal.SIGTERM) -> subprocess.CompletedProcess:
    os.killpg(process.pid, sig)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def plant(results: Path, **fields) -> dict:
    """A hold file as another node's run leaves it."""
    results.mkdir(parents=True, exist_ok=True)
    now = time.time()
    hold = {"host": "node-that-is-not-here", "pid": 4242, "process_started": now - 100, "boot_id": "other-boot",
            "pid_namespace": "1", "slurm_job_id": "777", "slurm_restart_count": None, "since": now - 100,
            "refreshed": now, "refresh_seconds": 20.0, "token": "planted", **fields}
    (results / HOLD_NAME).write_text(json.dumps(hold))
    os.utime(results / HOLD_NAME, (hold["refreshed"], hold["refreshed"]))  # as its last refresh left it
    return hold


def test_two_runs_started_at_once_on_one_folder_one_is_refused_and_writes_nothing(tmp_path):
    results = tmp_path / "r"
    args = [TOY, "4", "--sleep", "30", "--grace", "0.5", "--results", str(results), "--no-progress"]
    first, second = start(args), start(args)
    try:
        assert wait_until(lambda: first.poll() is not None or second.poll() is not None, timeout=60)
        loser, winner = (first, second) if first.poll() is not None else (second, first)
        out, err = loser.communicate()
        refused = subprocess.CompletedProcess(loser.args, loser.returncode, out, err)
        assert_usage_error(refused, "in use by another run", f"pid {winner.pid}", "since")
        assert wait_until(lambda: starts(results) == 1, timeout=60)
        assert hold_of(results)["pid"] == winner.pid
    finally:
        stopped = end(winner)
    assert stopped.returncode == 75, stopped.stderr
    assert starts(results) == 1  # the loser never reached the journal
    assert not (results / HOLD_NAME).exists()  # a run gives its hold back as it ends


def test_a_second_run_on_a_running_folder_is_refused_with_or_without_resume(tmp_path, monkeypatch):
    results = tmp_path / "r"
    monkeypatch.setenv("SLURM_JOB_ID", "31337")
    first = start([TOY, "2", "--sleep", "60", "--grace", "0.5", "--results", str(results), "--no-progress"])
    monkeypatch.delenv("SLURM_JOB_ID")
    try:
        worker_log = results / "logs" / "rank0-cpu0.log"
        assert wait_until(lambda: (results / "status.json").exists() and worker_log.exists()
                          and "started" in worker_log.read_text(), timeout=60)
        moving = (STATUS_NAME, HOLD_NAME)  # rewritten by the first run as it goes
        before = {k: v for k, v in snapshot(results).items() if k not in moving}
        for extra, ranks in (([], 1), (["--resume"], 2)):
            proc = run([TOY, "2", "--sleep", "60", "--results", str(results), "--no-progress", *extra], ranks=ranks)
            assert_usage_error(proc, "in use by another run", f"pid {first.pid}", "Slurm job 31337", "since")
        assert {k: v for k, v in snapshot(results).items() if k not in moving} == before
    finally:
        stopped = end(first)
    assert stopped.returncode == 75, stopped.stderr


def test_a_hold_left_by_a_sigkilled_run_is_taken_over_by_resume(tmp_path):
    clean = run([TOY, "12", "--results", str(tmp_path / "clean"), "--no-progress"])
    assert clean.returncode == 0, clean.stderr
    results = tmp_path / "r"
    args = [TOY, "12", "--sleep", "0.3", "--results", str(results), "--no-progress"]
    first = start(args)
    wait_for_results(results, 3)
    killed = end(first, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert read_hold(results)["pid"] == first.pid  # left behind, naming a process that is gone
    resumed = run(args + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr
    notices = [line for line in resumed.stderr.splitlines() if "taking over" in line]
    assert len(notices) == 1 and f"pid {first.pid}" in notices[0] and "its process is gone" in notices[0], resumed.stderr
    assert values(results) == values(tmp_path / "clean")
    assert not (results / HOLD_NAME).exists()


def test_a_hold_whose_refresh_stopped_is_taken_over(tmp_path, monkeypatch):
    """A frozen run (SIGSTOP: think of a hung node) stops refreshing its hold; after three of its
    refresh periods another run takes the folder over."""
    clean = run([TOY, "16", "--results", str(tmp_path / "clean"), "--no-progress"])
    assert clean.returncode == 0, clean.stderr
    results = tmp_path / "r"
    # 16 items of 0.6 s: after the 2nd result, 4 s and more of run, two refresh periods (below)
    args = [TOY, "16", "--sleep", "0.6", "--results", str(results), "--no-progress"]
    # 2 s, and frozen just after a refresh: the refused run below must start and read the hold
    # within 3 x 2 s of that refresh, which a loaded 2-core machine (Python start-up of several
    # seconds) did not always do within 3 x 0.5 s, nor within 3 x 1.5 s less the time since a refresh
    monkeypatch.setenv("MULTINODE_GPU_HOLD_SECONDS", "2")
    first = start(args)
    monkeypatch.delenv("MULTINODE_GPU_HOLD_SECONDS")
    try:
        wait_for_results(results, 2)
        before = read_hold(results)["refreshed"]
        assert wait_until(lambda: read_hold(results)["refreshed"] != before, timeout=30, every=0.02)
        os.killpg(first.pid, signal.SIGSTOP)
        refused = run(args + ["--resume"])  # refreshed a moment ago: still held
        assert_usage_error(refused, "in use by another run", f"pid {first.pid}")
        # until it has gone more than 3 x 1.5 s without a refresh (by the rule the run applies)
        assert wait_until(lambda: stale_because(read_hold(results)) is not None,
                          timeout=30, every=0.05)
        resumed = run(args + ["--resume"])  # while the first is still there, frozen
    finally:
        end(first, signal.SIGKILL)  # never woken: it would write beside the new run
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over" in resumed.stderr and "not refreshed for" in resumed.stderr, resumed.stderr
    assert values(results) == values(tmp_path / "clean")


def test_another_hosts_hold_is_refused_while_fresh_and_taken_over_when_stale(tmp_path):
    """The Slurm requeue case: the old run's node differs (its pid means nothing here); only the
    age of its last refresh tells whether it is gone."""
    results = tmp_path / "r"
    args = [TOY, "4", "--results", str(results), "--no-progress"]
    plant(results, pid=os.getpid())  # a live pid here: it must not matter for another host's hold
    before = snapshot(results)
    assert_usage_error(run(args), "in use by another run", "host node-that-is-not-here", "pid", "Slurm job 777")
    assert snapshot(results) == before
    plant(results, refreshed=time.time() - 3600)
    proc = run(args)
    assert proc.returncode == 0, proc.stderr
    notice = [line for line in proc.stderr.splitlines() if "taking over" in line]
    assert len(notice) == 1 and "node-that-is-not-here" in notice[0] and "not refreshed for 360" in notice[0]
    assert not (results / HOLD_NAME).exists()


def test_readers_and_dry_runs_never_take_the_hold(tmp_path):
    results = tmp_path / "r"
    assert run([TOY, "4", "--results", str(results), "--no-progress"]).returncode == 0
    plant(results)
    before = snapshot(results)
    status = subprocess.run([sys.executable, "-m", "common.status", str(results)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    # a dry run is refused where the run would be (the folder is another run's), and leaves it as it was
    dry = run(["-m", "common.pipeline", "examples/pipelines/ml.json", "--results", str(results), "--dry-run"])
    assert_usage_error(dry, "in use by another run")
    assert snapshot(results) == before


def test_a_requeued_slurm_job_takes_over_its_own_earlier_hold_at_once(monkeypatch):
    now = time.time()
    earlier = {"host": "node-a", "pid": 1, "slurm_job_id": "55", "slurm_restart_count": None,
               "refreshed": now, "refresh_seconds": 20.0}
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert stale_because(earlier, now) is None  # the same incarnation on another node: alive
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert "requeued" in stale_because(earlier, now)
    monkeypatch.setenv("SLURM_JOB_ID", "56")
    assert stale_because(earlier, now) is None
    assert "not refreshed" in stale_because(earlier, now + 61)


def test_a_hold_from_before_this_hosts_reboot_is_stale():
    me = _me(20.0)
    assert stale_because({**me, "boot_id": "another-boot"}) == "its host has rebooted since"
    assert stale_because(me) is None  # this very process: alive, just refreshed


def test_another_users_live_run_is_not_gone_where_proc_hides_other_users(tmp_path):
    """/proc mounted with hidepid=2 (common on shared clusters) hides every other user's process,
    and one's own started under another group: such a run must not look gone (status would say
    GONE; a resume would take a live run's folder). Real: a private mount namespace with such a
    /proc, the check made there as the user nobody, about a live process of root's, one of
    nobody's under another group, and one that has ended."""
    why = mount_namespaces_unavailable()
    if why:
        pytest.skip(why)
    import psutil

    live = subprocess.Popen(["sleep", "120"])
    # the same user (nobody) under another group, as `sg` starts it: hidden too, yet signalable
    other_group = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65533", "--clear-groups", "sleep", "120"])
    try:
        ended = subprocess.Popen(["true"])
        ended.wait()
        wait_until(lambda: psutil.Process(other_group.pid).uids().real == 65534, timeout=30)
        holder = dict(_me(0.0), pid=live.pid, process_started=psutil.Process(live.pid).create_time())
        holders = [holder, dict(holder, pid=other_group.pid, process_started=psutil.Process(other_group.pid).create_time()),
                   dict(holder, pid=ended.pid)]
        check = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); from common.results.hold import process_gone; "
                 "holders = json.loads(sys.argv[2]); "
                 "print(json.dumps({'seen': [os.path.exists(f'/proc/{h[\"pid\"]}') for h in holders[:2]], "
                 "'gone': [process_gone(h) for h in holders]}))")
        seen = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"',
             "sh", sys.executable, "-c", check, str(REPO), json.dumps(holders)],
            capture_output=True, text=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert json.loads(seen.stdout) == {"seen": [False, False], "gone": [None, None, "its process is gone"]}
    finally:
        for process in (live, other_group):
            process.kill()
            process.wait()
