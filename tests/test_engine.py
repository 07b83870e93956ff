"""The engine end to end: real mpiexec, real spawned workers, real signals."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from common.errors import counted
from helpers import (
    REPO,
    TOY,
    assert_usage_error,
    error_lines,
    journal_entries,
    markers,
    rank_pids,
    read_summary,
    run,
    snapshot,
    start,
    status_of,
    stop_run,
    values,
    wait_for_results,
    wait_until,
)


def test_one_by_one_and_two_ranks_by_two_workers_give_identical_results(tmp_path):
    one = run([TOY, "24", "--wave", "--threads", "1", "--results", str(tmp_path / "one"), "--no-progress"])
    assert one.returncode == 0, one.stderr
    many = run([TOY, "24", "--wave", "--sleep", "0.1", "--workers", "2", "--threads", "1", "--results", str(tmp_path / "many"),
                "--no-progress"], ranks=2)
    assert many.returncode == 0, many.stderr
    assert len(values(tmp_path / "one")) == 24 + 6
    assert values(tmp_path / "one") == values(tmp_path / "many")
    layout = read_summary(tmp_path / "many")["workers"]
    assert [len(rank["devices"]) for rank in layout] == [2, 2]
    ranks_used = {e["rank"] for e in journal_entries(tmp_path / "many") if e.get("type") == "result"}
    assert ranks_used == {0, 1}, "both ranks must have run items"
    for name in ("summary.md", "timeline.png", "timeline.svg", "logs/rank0-cpu0.log", "logs/rank1-cpu1.log"):
        assert (tmp_path / "many" / name).exists(), name
    assert (tmp_path / "many" / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # two ranks on one host, each with a cpu0 and a cpu1 (slots, not cores): told apart by their ranks,
    # with the threads each worker has (a CPU fit's last bits follow them)
    placement = ", ".join(f"rank {r} on {layout[r]['host']} [cpu0, cpu1; 1 thread each]" for r in (0, 1))
    assert f"- ranks: 2; workers: {placement}\n" in (tmp_path / "many" / "summary.md").read_text()
    assert f"toy: 30 items (0 already in the journal) on 2 ranks, 4 workers: {placement}" in many.stderr, many.stderr


def test_gpu_workers_are_pinned_one_gpu_each_in_pci_order(tmp_path, monkeypatch):
    """As under Slurm with GPUs 5 and 7 of a node: one worker per GPU, each seeing only its own (the
    toy app never touches CUDA, so this runs without a GPU), numbered as NVML numbers them, whatever
    order the user's environment asked CUDA for."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # a user's order must not renumber the GPUs
    proc = run([TOY, "12", "--sleep", "0.1", "--gpu", "all", "--results", str(tmp_path / "r"), "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    entries = journal_entries(tmp_path / "r")
    results = [e for e in entries if e.get("type") == "result"]
    start = next(e for e in entries if e.get("type") == "start")
    assert len(start["layout"][0]["devices"]) == 2
    assert {r["result"]["cuda_visible"] for r in results} == {"5", "7"}
    assert {r["result"]["cuda_order"] for r in results} == {"PCI_BUS_ID"}
    for r in results:  # the journal names GPUs by their number among the visible ones (as --gpu does)
        assert {"gpu0": "5", "gpu1": "7"}[r["device"]] == r["result"]["cuda_visible"], r


def test_workers_per_gpu_pins_several_workers_to_each_gpu(tmp_path, monkeypatch):
    """--workers-per-gpu 2 over GPUs 5 and 7 (fake: the toy app never touches CUDA): four workers,
    each seeing only its own GPU; results as with one worker per GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    results = tmp_path / "r"
    proc = run([TOY, "16", "--sleep", "0.2", "--gpu", "all", "--workers-per-gpu", "2", "--results", str(results),
                "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    entries = journal_entries(results)
    start = next(e for e in entries if e.get("type") == "start")
    assert start["layout"][0]["devices"] == ["gpu0.0", "gpu0.1", "gpu1.0", "gpu1.1"]
    done = [e for e in entries if e.get("type") == "result"]
    for e in done:
        assert {"gpu0": "5", "gpu1": "7"}[e["device"].split(".")[0]] == e["result"]["cuda_visible"], e
    assert len({e["device"] for e in done}) == 4, "every worker should have run items"
    assert len({e["result"]["pid"] for e in done}) == 4
    for name in ("rank0-gpu0.0", "rank0-gpu0.1", "rank0-gpu1.0", "rank0-gpu1.1"):
        assert "CUDA_VISIBLE_DEVICES=" + {"0": "5", "1": "7"}[name[9]] in (results / "logs" / f"{name}.log").read_text()
    one = run([TOY, "16", "--gpu", "all", "--results", str(tmp_path / "one"), "--no-progress"])
    assert one.returncode == 0, one.stderr
    assert values(results) == values(tmp_path / "one")
    assert_usage_error(run([TOY, "4", "--workers-per-gpu", "0", "--results", str(tmp_path / "bad")]),
                       "--workers-per-gpu")


def test_groups_run_together_and_give_the_same_results(tmp_path):
    plain = run([TOY, "20", "--results", str(tmp_path / "plain"), "--no-progress"])
    grouped = run([TOY, "20", "--group", "4", "--sleep", "0.05", "--workers", "2", "--results", str(tmp_path / "grouped"),
                   "--no-progress"], ranks=2)
    assert plain.returncode == 0 and grouped.returncode == 0, grouped.stderr
    assert values(tmp_path / "plain") == values(tmp_path / "grouped")
    records = [e for e in journal_entries(tmp_path / "grouped") if e.get("type") == "result"]
    assert {r["group_size"] for r in records} == {4}
    assert all(r["result"]["group_size"] == 4 for r in records)


def test_a_group_whose_worker_died_is_one_lost_attempt_in_the_summary(tmp_path):
    """A group's items run as one attempt: when its worker dies, each item's failed attempt was
    stamped with its own end, microseconds apart, and the summary's "attempts that failed or were
    stopped" counted the one attempt once per item (2.4 s for a 0.6 s attempt of 4 items)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    results = tmp_path / "r"
    proc = run([TOY, "8", "--group", "4", "--sleep", "0.1", "--workers", "1", "--kill-key", "item-0002",
                "--marker-dir", str(marks), "--results", str(results), "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    lost = [e for e in journal_entries(results) if e.get("type") == "attempt_failed"]
    assert sorted(e["key"] for e in lost) == ["item-0000", "item-0001", "item-0002", "item-0003"], lost
    assert len({(e["start"], e["end"]) for e in lost}) == 1, lost  # one attempt
    attempt = lost[0]["end"] - lost[0]["start"]
    assert read_summary(results)["attempt_seconds_without_result"] == pytest.approx(attempt, abs=0.002)


def _attempts_cut_off_by_the_wait(tmp_path: Path, process: subprocess.Popen) -> None:
    """A run of 3-4 s items on two workers stopped after its first two results, --grace 0.5: the attempts still running
    when the wait ended gave no result, and were neither counted nor drawn (found by a helper's
    review): their time is now among the attempts that failed or were stopped."""
    results = tmp_path / "r"
    stopped = stop_run(process, results, after=2)
    assert stopped.returncode == 75, stopped.stderr
    summary = read_summary(results)
    assert summary["status"] == "stopped" and summary["items_done"] == 2, summary
    # the two workers' next items, started as the first two ended: a bar each, cut after the wait's 0.5 s at least
    assert summary["items_cut_off"] == summary["attempts_cut_off"] == 2, summary
    assert summary["attempt_seconds_without_result"] >= 2 * 0.5, summary
    markdown = (results / "summary.md").read_text()
    assert "attempts that failed or were stopped" in markdown and "2 items still running when the wait" in markdown
    assert not [e for e in journal_entries(results) if e.get("type") == "attempt_failed"]  # not failures


def test_attempts_the_stops_wait_cut_off_are_counted(tmp_path):
    _attempts_cut_off_by_the_wait(tmp_path, start([TOY, "8", "--sleep", "3", "--workers", "2", "--gpu", "cpu",
                                                   "--threads", "1", "--grace", "0.5", "--results", str(tmp_path / "r"),
                                                   "--no-progress"]))


@pytest.mark.mpi
def test_attempts_the_stops_wait_cut_off_on_a_follower_are_counted(tmp_path):
    """4 s items: the follower's last snapshot before the stop (3.5 s after its start) shows its first
    item, not the one the wait cuts off; the one it sends at the stop shows it."""
    _attempts_cut_off_by_the_wait(tmp_path, start([TOY, "8", "--sleep", "4", "--workers", "1", "--gpu", "cpu",
                                                   "--threads", "1", "--grace", "0.5", "--results", str(tmp_path / "r"),
                                                   "--no-progress"], ranks=2))


@pytest.mark.parametrize("n_items,sleep,killed", [(12, "0.05", "item-0005"), (600, "0", "item-0400")])
def test_a_worker_killed_mid_item_is_replaced_and_the_run_completes(tmp_path, n_items, sleep, killed):
    """Also with sub-millisecond items, which travel to workers in chunks."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = run([TOY, str(n_items), "--sleep", sleep, "--workers", "2", "--kill-key", killed, "--marker-dir", str(marks),
                "--results", str(tmp_path / "r"), "--no-progress"], ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert len(values(tmp_path / "r")) == n_items
    assert markers(marks)[killed] == 2
    failed_attempts = [e["key"] for e in journal_entries(tmp_path / "r") if e.get("type") == "attempt_failed"]
    assert failed_attempts == [killed], "only the item that was running counts as failed"
    assert "SIGKILL (out of memory?" in proc.stderr  # the likeliest cause, named
    assert read_summary(tmp_path / "r")["failed_items"] == []


def test_an_item_that_always_raises_is_retried_then_reported_with_exit_code_1(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = run([TOY, "8", "--workers", "2", "--fail-key", "item-0003", "--retries", "2", "--marker-dir", str(marks),
                "--results", str(tmp_path / "r"), "--no-progress"], ranks=2)
    assert proc.returncode == 1, proc.stderr
    assert markers(marks)["item-0003"] == 3  # first attempt + 2 retries
    failed = read_summary(tmp_path / "r")["failed_items"]
    assert [f["key"] for f in failed] == ["item-0003"]
    assert "always fails" in failed[0]["error"]
    assert "item-0003" in (tmp_path / "r" / "summary.md").read_text()
    attempts = [e for e in journal_entries(tmp_path / "r") if e.get("type") == "attempt_failed"]
    assert len(attempts) == 3 and "Traceback" in attempts[0]["traceback"]
    assert len(values(tmp_path / "r")) == 7


@pytest.mark.parametrize("sig,every_rank", [(signal.SIGTERM, False), (signal.SIGUSR1, True)])
def test_stopped_run_resumes_to_the_same_results_without_recomputing(tmp_path, sig, every_rank):
    clean = run([TOY, "30", "--wave", "--workers", "2", "--results", str(tmp_path / "clean"), "--no-progress"])
    assert clean.returncode == 0, clean.stderr
    marks = tmp_path / "marks"
    marks.mkdir()
    # 0.3 s items: the whole run takes about 3 s, so a signal sent after the 6th result, however late a
    # busy machine lets this process see it, finds items still to hand out
    args = [TOY, "30", "--wave", "--sleep", "0.3", "--workers", "2", "--marker-dir", str(marks),
            "--results", str(tmp_path / "r"), "--no-progress"]
    stopped = stop_run(start(args, ranks=2), tmp_path / "r", after=6, sig=sig, every_rank=every_rank)
    assert stopped.returncode == 75, stopped.stderr
    assert "--resume" in stopped.stderr
    assert read_summary(tmp_path / "r")["status"] == "stopped"
    # which signal stopped it, written down (a walltime warning or a cancel, told apart after the job)
    assert read_summary(tmp_path / "r")["stopped_because"] == f"received {sig.name}"
    assert f"**Stopped**: received {sig.name}." in (tmp_path / "r" / "summary.md").read_text()
    # the command is the program's: summary.md says, as stderr does, that it goes under the launcher
    assert "Finish with the same launcher (2 ranks) and:" in (tmp_path / "r" / "summary.md").read_text()
    assert "; finish with the same launcher (2 ranks) and: " in stopped.stderr, stopped.stderr
    done_before = {e["key"] for e in journal_entries(tmp_path / "r") if e.get("type") == "result"}
    assert 6 <= len(done_before) < 38
    resumed = run(args + ["--resume"], ranks=2)
    assert resumed.returncode == 0, resumed.stderr
    assert values(tmp_path / "r") == values(tmp_path / "clean")
    counts = markers(marks)
    assert all(counts[key] == 1 for key in done_before), "a finished item was computed again"
    keys = [e["key"] for e in journal_entries(tmp_path / "r") if e.get("type") == "result"]
    assert len(keys) == len(set(keys)) == 38  # 30 items + 8 sums


def test_a_resume_without_threads_keeps_the_thread_count_of_the_run_it_resumes(tmp_path):
    """The default thread count is the cores over the workers: resumed with other --workers (or
    requeued onto a node with other cores) it would change, and with it the bits of a torch or BLAS
    reduction, so the resumed run would not end with an uninterrupted one's results (a walk-through
    saw mnist_nn's ensemble error move). A resume without --threads keeps the journal's, and says so."""
    results = tmp_path / "r"
    args = [TOY, "12", "--sleep", "0.3", "--gpu", "cpu", "--results", str(results), "--no-progress"]
    stopped = stop_run(start(args + ["--workers", "1"]), results, after=2)
    assert stopped.returncode == 75, stopped.stderr
    resumed = run(args + ["--workers", "2", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    starts = [entry for entry in journal_entries(results) if entry.get("type") == "start"]
    first = starts[0]["layout"][0]["threads"]
    assert len(starts) == 2 and starts[1]["layout"][0]["threads"] == first, starts
    assert f"resuming with {counted(first, 'torch/BLAS thread')} per worker, as the run being resumed" in resumed.stderr
    # kept on fewer cores per worker than it had: more threads than cores, said once, with the count that fits
    cores = len(os.sched_getaffinity(0))
    crowded = f"2 workers x {counted(first, 'thread')} on {counted(cores, 'core')}: more threads than cores"
    assert (crowded in resumed.stderr) == (2 * first > cores), resumed.stderr
    if crowded in resumed.stderr:  # it told a resume to use --threads 1, which a resume refuses
        assert "fits in a new run" in resumed.stderr and "a resume keeps the count" in resumed.stderr, resumed.stderr
    assert "more threads than cores" not in stopped.stderr


def test_a_resume_without_threads_keeps_the_threads_its_run_was_given(tmp_path):
    """--threads given to the run: the fingerprint holds it, and a resume without it was refused
    ("threads 1 (journal) vs the default (now)"), against the README's word and the default's case.
    Another count given is still refused."""
    results = tmp_path / "r"
    args = [TOY, "6", "--gpu", "cpu", "--results", str(results), "--no-progress"]
    # 1 s items: the stop after the 2nd result, however late a busy machine sends it, finds items left
    stopped = stop_run(start(args + ["--threads", "1", "--sleep", "1"]), results, after=2)
    assert stopped.returncode == 75, stopped.stderr
    assert_usage_error(run(args + ["--threads", "2", "--resume"]), "threads 1 (journal) vs 2 (now)")
    resumed = run(args + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with 1 torch/BLAS thread per worker, as the run being resumed" in resumed.stderr
    starts = [entry for entry in journal_entries(results) if entry.get("type") == "start"]
    assert [start_["layout"][0]["threads"] for start_ in starts] == [1, 1]


def test_a_resume_may_name_the_thread_count_its_run_used_by_default(tmp_path):
    """A run without --threads used the default count (its start records it); a resume naming that
    same count was refused ("threads the default (journal) vs 2 (now)"). Now it goes on; another
    count is refused with the count the run used."""
    results = tmp_path / "r"
    args = [TOY, "6", "--gpu", "cpu", "--workers", "1", "--results", str(results), "--no-progress"]
    stopped = stop_run(start(args + ["--sleep", "1"]), results, after=2)  # items left at the stop however late
    assert stopped.returncode == 75, stopped.stderr
    (used,) = {entry["threads"] for e in journal_entries(results) if e.get("type") == "start" for entry in e["layout"]}
    other = 1 if used != 1 else 2
    assert_usage_error(run(args + ["--threads", str(other), "--resume"]), f"threads {used} (journal) vs {other} (now)")
    resumed = run(args + ["--threads", str(used), "--resume"])
    assert resumed.returncode == 0, resumed.stderr


def test_a_torn_last_journal_line_is_tolerated_on_resume(tmp_path):
    args = [TOY, "10", "--results", str(tmp_path / "r"), "--no-progress"]
    assert run(args).returncode == 0
    journal = tmp_path / "r" / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    results = [i for i, line in enumerate(lines) if '"type":"result"' in line]
    # Keep everything up to the 5th result, then half of the 6th: what a crash mid-write leaves.
    journal.write_text("".join(lines[:results[5]]) + lines[results[5]][:40])
    proc = run(args + ["--resume"])
    assert proc.returncode == 0, proc.stderr
    assert len(values(tmp_path / "r")) == 10
    assert read_summary(tmp_path / "r")["items_resumed"] == 5
    again = run(args + ["--resume"])  # the torn line was cut off, not left in the middle
    assert again.returncode == 0, again.stderr
    assert read_summary(tmp_path / "r")["items_resumed"] == 10


def test_batch_replaces_workers_after_n_items(tmp_path):
    proc = run([TOY, "9", "--workers", "1", "--batch", "2", "--results", str(tmp_path / "r"), "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    pids = Counter(e["result"]["pid"] for e in journal_entries(tmp_path / "r") if e.get("type") == "result")
    assert len(pids) == 5 and max(pids.values()) == 2


@pytest.mark.mpi
def test_batch_holds_on_every_rank_when_short_items_travel_in_chunks(tmp_path):
    """No-op items are short: rank 0 hands them out in chunks, to its own workers and to a
    follower's. A chunk is cut to what a worker may still run, so none runs more than --batch."""
    proc = run([TOY, "40", "--workers", "1", "--batch", "3", "--results", str(tmp_path / "r"), "--no-progress"],
               ranks=2)
    assert proc.returncode == 0, proc.stderr
    results = [e for e in journal_entries(tmp_path / "r") if e.get("type") == "result"]
    assert sorted(e["key"] for e in results) == [f"item-{i:04d}" for i in range(40)]
    pids = Counter(e["result"]["pid"] for e in results)
    assert max(pids.values()) <= 3 and len(pids) >= 14, pids
    assert {e["rank"] for e in results} == {0, 1}


def test_longest_items_start_first(tmp_path):
    proc = run([TOY, "12", "--sleep", "0.02", "--lognormal", "1.0", "--results", str(tmp_path / "r"), "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    records = [e for e in journal_entries(tmp_path / "r") if e.get("type") == "result"]
    started = [r["key"] for r in sorted(records, key=lambda r: r["start"])]
    import argparse

    from toy_app import ToyApp  # noqa: E402

    durations = ToyApp(argparse.Namespace(n_items=12, sleep=0.02, lognormal=1.0)).durations()
    expected = [f"item-{i:04d}" for i in sorted(range(12), key=lambda i: -durations[i])]
    assert started == expected


@pytest.mark.parametrize("extra,fragment", [
    (["--gpu", "abc"], "--gpu 'abc'"),
    (["--gpu", "7"], "--gpu 7"),
    (["--workers", "0"], "--workers"),
    (["--threads", "x"], "--threads"),
    (["--threads", "100000"], "at most 1024"),
    (["--workers", "100000000"], "at most 4096"),  # before a list of a hundred million workers is made
    (["--seed", "-1"], "at least 0"),
    (["0"], "n_items"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, extra, fragment):
    args = [TOY, "4", "--results", str(tmp_path / "r")] + extra
    if extra == ["0"]:
        args = [TOY, "0", "--results", str(tmp_path / "r")]
    proc = run(args, ranks=2)
    assert_usage_error(proc, fragment)
    assert not (tmp_path / "r").exists()


def test_unwritable_results_folder_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run([TOY, "4", "--results", str(blocker / "r")], ranks=2)
    assert_usage_error(proc, "cannot write")


def test_a_folder_of_other_files_or_an_empty_path_is_never_written_into(tmp_path):
    """Results whose journal is gone, or a user's own folder: refused, left as they were."""
    results = tmp_path / "r"
    assert run([TOY, "4", "--results", str(results), "--no-progress"]).returncode == 0
    (results / "journal.jsonl").unlink()
    before = snapshot(results)
    for extra in ([], ["--resume"]):
        assert_usage_error(run([TOY, "4", "--results", str(results), *extra]), "holds files but no journal")
    assert snapshot(results) == before
    assert_usage_error(run([TOY, "4", "--results", ""], cwd=tmp_path), "empty path")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")  # the toy app claims every name (App's default)
    assert_usage_error(run([TOY, "4", "--results", str(tmp_path / "mine")]),
                       "holds files but no journal of a run (notes.txt), and toy writes a new or empty folder; "
                       "choose another --results")


def test_a_damaged_journal_header_is_refused_in_one_line(tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    (results / "journal.jsonl").write_text('{"type": "header", "fingerprint": null}\n')
    assert_usage_error(run([TOY, "4", "--results", str(results), "--resume"]), "not a run's header")


def test_a_journal_of_another_format_is_refused_and_one_from_before_the_field_resumed(tmp_path):
    """A newer version's journal (its records may mean other things) was resumed without a word."""
    results = tmp_path / "r"
    assert run([TOY, "4", "--results", str(results), "--no-progress"]).returncode == 0
    journal = results / "journal.jsonl"
    header, *records = journal.read_text().splitlines(keepends=True)
    fields = json.loads(header)
    assert fields["format"] == 1
    journal.write_text(json.dumps({**fields, "format": 99}) + "\n" + "".join(records))
    assert_usage_error(run([TOY, "4", "--results", str(results), "--resume"]),
                       "its journal is of format 99, and this multinode-gpu reads format 1")
    journal.write_text(json.dumps({**fields, "format": True}) + "\n" + "".join(records))  # True == 1 in Python
    assert_usage_error(run([TOY, "4", "--results", str(results), "--resume"]), "its journal is of format True")
    journal.write_text(json.dumps({k: v for k, v in fields.items() if k != "format"}) + "\n" + "".join(records))
    resumed = run([TOY, "4", "--results", str(results), "--resume", "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr


@pytest.mark.parametrize("content", ["random bytes", "invalid JSON", "random bytes, one line", "JSON null",
                                     "an object of no kind"])
def test_a_journal_of_random_bytes_is_the_same_damaged_one_liner_as_invalid_json(tmp_path, content):
    """A line that is JSON but no record (null: said to be "not valid JSON"; an object without a
    kind the engine writes: silently skipped by --resume) is damage like any other."""
    results = tmp_path / "r"
    assert run([TOY, "4", "--results", str(results), "--no-progress"]).returncode == 0
    journal = results / "journal.jsonl"
    lines = journal.read_bytes().split(b"\n")
    garbage = {"random bytes": os.urandom(4096).replace(b"\n", b"\xff") + b"\n",
               "invalid JSON": b'{"type": "result", "key": \n',
               "JSON null": b"null\n", "an object of no kind": b'{"this": "is not a record"}\n',
               "random bytes, one line": os.urandom(4096).replace(b"\n", b"\xff")}[content]
    if content == "random bytes, one line":
        journal.write_bytes(garbage)  # no newline at all: not a torn last line, a damaged header
    else:
        journal.write_bytes(b"\n".join(lines[:2] + [garbage] + lines[2:]))
    before = snapshot(results)
    proc = run([TOY, "4", "--results", str(results), "--resume"])
    assert_usage_error(proc, "is not a journal record; the journal is damaged", repr(str(journal)))
    assert snapshot(results) == before


def test_a_results_path_over_the_name_limit_is_one_line(tmp_path):
    results = tmp_path / ("x" * 300) / "r"
    proc = run([TOY, "4", "--results", str(results)], ranks=2)
    assert_usage_error(proc, "File name too long", "--results")
    assert list(tmp_path.iterdir()) == []
    proc = run([TOY, "4", "--results", str(tmp_path / ("y" * 300))])
    assert_usage_error(proc, "File name too long")
    assert list(tmp_path.iterdir()) == []


def test_a_newline_in_a_path_stays_inside_the_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    results = blocker / "new\nline"
    assert_usage_error(run([TOY, "4", "--results", str(results)], ranks=2), "cannot write there", repr(str(results)))
    status = run(["-m", "common.status", str(tmp_path / "no\nsuch")])
    assert status.returncode == 2 and len(status.stderr.splitlines()) == 1, status.stderr
    status = run(["-m", "common.status", str(tmp_path / ("x" * 300))])
    assert_usage_error(status, "File name too long")


def test_existing_journal_needs_resume_and_resume_needs_the_same_arguments(tmp_path):
    results = tmp_path / "r"
    assert run([TOY, "6", "--results", str(results), "--no-progress"]).returncode == 0
    before = snapshot(results)
    assert_usage_error(run([TOY, "6", "--results", str(results)], ranks=2), "--resume")
    assert_usage_error(run([TOY, "7", "--results", str(results), "--resume"], ranks=2), "n_items 6 (journal) vs 7 (now)")
    assert_usage_error(run([TOY, "6", "--seed", "3", "--results", str(results), "--resume"]), "seed")
    assert snapshot(results) == before


def test_two_ranks_on_a_node_share_its_gpus_out(tmp_path, monkeypatch):
    """mpiexec -n 2 on one node whose four GPUs both ranks see: two workers each, each pinned to its
    own GPU (the toy items report their CUDA_VISIBLE_DEVICES; they need no CUDA, which this machine
    lacks); asking both for one GPU is refused in one line."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    results = tmp_path / "r"
    proc = run([TOY, "12", "--gpu", "all", "--results", str(results), "--no-progress"], ranks=2)
    assert proc.returncode == 0, proc.stderr
    start = next(e for e in journal_entries(results) if e.get("type") == "start")
    assert [rank["devices"] for rank in start["layout"]] == [["gpu0", "gpu1"], ["gpu2", "gpu3"]]
    seen = {(e["rank"], e["device"], e["result"]["cuda_visible"]) for e in journal_entries(results)
            if e.get("type") == "result" and e["key"].startswith("item-")}
    assert seen <= {(0, "gpu0", "0"), (0, "gpu1", "1"), (1, "gpu2", "2"), (1, "gpu3", "3")}
    assert_usage_error(run([TOY, "4", "--gpu", "2", "--results", str(tmp_path / "s")], ranks=2),
                       "2 ranks on", "would share its 1 GPU")
    assert not (tmp_path / "s").exists()


def test_workers_that_cannot_start_fail_the_run_instead_of_hanging(tmp_path):
    proc = run([TOY, "5", "--workers", "2", "--broken-setup", "--results", str(tmp_path / "r"), "--no-progress"],
               ranks=2, timeout=120)
    assert proc.returncode == 1, proc.stderr
    failed = read_summary(tmp_path / "r")["failed_items"]
    assert len(failed) == 5 and "cannot load the toy data" in failed[0]["error"]
    assert "cannot load the toy data" in (tmp_path / "r" / "logs" / "rank1-cpu0.log").read_text()


def test_workers_that_die_while_starting_are_given_up(tmp_path):
    proc = run([TOY, "3", "--crashing-setup", "--results", str(tmp_path / "r"), "--no-progress"], timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "giving up" in proc.stderr
    assert len(read_summary(tmp_path / "r")["failed_items"]) == 3


def test_an_error_in_the_apps_finish_ends_every_rank_in_one_line_and_resume_writes_the_outputs(tmp_path):
    """finish() raising (the app's own code) after every item ran: one line and exit 1, every rank
    ends, summary and status say failed and why, rank 0's log has the traceback; a --resume once
    the bug is gone runs nothing again and writes the outputs."""
    args = [TOY, "4", "--results", str(tmp_path / "r"), "--no-progress"]
    proc = run(args + ["--broken-finish"], ranks=2, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in error_lines(proc.stderr) if not line.startswith("[rank ")]  # its log lines aside
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert "writing the outputs failed: RuntimeError: a bug in finish()" in lines[0] and "--resume" in lines[0]
    done = read_summary(tmp_path / "r")
    assert done["status"] == "failed" and done["items_done"] == 4 and not done["failed_items"]
    assert done["outputs_error"]["error"] == "RuntimeError: a bug in finish()"
    assert "Traceback" in (tmp_path / "r" / "logs" / "rank0.log").read_text()
    assert json.loads((tmp_path / "r" / "status.json").read_text())["state"] == "failed"
    assert "could not be written" in (tmp_path / "r" / "summary.md").read_text()
    # the status command says it too, and how to write them (it said "failed" and nothing more)
    shown = status_of(tmp_path / "r")
    assert shown.returncode == 1 and "\nerror    writing the outputs failed: RuntimeError: a bug in finish() (the " \
        "traceback is in logs/rank0.log); every result is journaled\n" in shown.stdout, shown.stdout
    assert "\nresume   after a fix, with the same launcher (2 ranks) and: " in shown.stdout and " --resume\n" in shown.stdout
    again = run(args + ["--resume"], timeout=120)
    assert again.returncode == 0, again.stderr
    assert read_summary(tmp_path / "r")["items_this_run"] == 0 and (tmp_path / "r" / "values.json").is_file()
    # finish() failing part-way beside an earlier run's outputs: it may have written some of them, so
    # the summary does not call them the earlier run's (as a stopped run's does)
    broken = run(args + ["--resume", "--broken-finish"], timeout=120)
    assert broken.returncode == 1, broken.stderr
    text = (tmp_path / "r" / "summary.md").read_text()
    assert "could not be written" in text and "earlier run's" not in text, text


def test_sigterm_to_the_whole_process_group_stops_cleanly_without_failures(tmp_path):
    """What scancel and srun do: every process, workers included, gets the signal. 16 items on 4
    workers: a third wave is still to hand out, so the run stops (with 8, a fast machine could hand
    out the second wave before the signal, finish it in the grace and end complete)."""
    args = [TOY, "16", "--sleep", "1.5", "--workers", "2", "--retries", "0", "--grace", "20",
            "--results", str(tmp_path / "r"), "--no-progress"]
    process = start(args, ranks=2)
    from helpers import wait_for_results
    wait_for_results(tmp_path / "r", 1)
    os.killpg(process.pid, signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    entries = journal_entries(tmp_path / "r")
    assert not [e for e in entries if e.get("type") in ("attempt_failed", "failed")], err
    assert read_summary(tmp_path / "r")["failed_items"] == []
    # Running items were given their grace period: the journal holds more than the first result.
    assert sum(1 for e in entries if e.get("type") == "result") >= 3


def test_a_signal_passed_on_twice_still_gives_running_items_their_grace(tmp_path):
    """Under ``srun apptainer exec`` the rank gets Slurm's USR1 twice, a moment apart: from
    slurmstepd and again from Apptainer's runtime. That is one request, not a second signal."""
    marks = tmp_path / "marks"
    marks.mkdir()
    args = [TOY, "6", "--sleep", "3", "--workers", "2", "--retries", "0", "--grace", "30", "--marker-dir", str(marks),
            "--results", str(tmp_path / "r"), "--no-progress"]
    process = start(args)
    wait_for_results(tmp_path / "r", 2)
    time.sleep(0.5)  # the next two items are running
    rank = rank_pids(tmp_path / "r")[0]
    os.kill(rank, signal.SIGUSR1)
    time.sleep(0.3)
    os.kill(rank, signal.SIGUSR1)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    entries = journal_entries(tmp_path / "r")
    assert not [e for e in entries if e.get("type") in ("attempt_failed", "failed")], err
    # the items running at the signal (two, unless a busy machine started the workers seconds apart)
    # finished in their grace period instead of being abandoned: every item started has its result
    started = {path.name for path in marks.iterdir()}
    assert {e["key"] for e in entries if e.get("type") == "result"} == started and 4 <= len(started) < 6, err



def test_a_stop_before_any_running_item_could_finish_says_more_time_is_needed(tmp_path, monkeypatch):
    """Items longer than a Slurm job's time less its warning: each requeued start is stopped before
    any finishes, and would run them again from their start at each requeue. In a Slurm job the
    closing line says so and the exit code is 76, which the batch scripts do not requeue; outside
    one (a Ctrl-C seconds into a run) neither: 75, as for any stop."""
    for job, sig in (("4242", signal.SIGUSR1), ("4242", signal.SIGINT), (None, signal.SIGUSR1)):
        if job:
            monkeypatch.setenv("SLURM_JOB_ID", job)
        else:
            monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        stalled = bool(job) and sig == signal.SIGUSR1  # the walltime warning, not a Ctrl-C in salloc
        results, marks = tmp_path / f"r{job}{sig}", tmp_path / f"marks{job}{sig}"
        marks.mkdir()
        process = start([TOY, "4", "--sleep", "60", "--workers", "2", "--grace", "0.5", "--marker-dir", str(marks),
                         "--results", str(results), "--no-progress"])
        assert wait_until(lambda marks=marks: len(list(marks.iterdir())) == 2, 60)
        os.kill(rank_pids(results)[0], sig)
        out, err = process.communicate(timeout=120)
        assert process.returncode == (76 if stalled else 75), err
        closing = error_lines(err)[-1]
        assert closing.startswith(f"toy: stopped (received {sig.name}) with 0 of 4 items done"), closing
        assert json.loads((results / "status.json").read_text())["state"] == "stopped"
        shown = status_of(results)
        assert shown.returncode == (76 if stalled else 75), shown.stdout  # what a user's script branches on
        assert ("resume   with a longer --time (no item finished in the job's time), " in shown.stdout) == stalled
        assert read_summary(results).get("no_progress", False) == stalled
        assert ("No item finished in the job's time: give the job a longer --time, then finish with:"
                in (results / "summary.md").read_text()) == stalled
        clause = "; none finished in this run's "
        assert (clause in closing) == stalled, closing
        if stalled:
            assert ("the 2 items still running when --grace ended were cut off: a job requeued with the same --time "
                    "would cut them off again; give it a longer --time; finish with") in closing, closing


def test_a_second_signal_during_the_grace_is_not_said_to_be_its_end(tmp_path, monkeypatch):
    """scancel after the walltime warning: the batch script passes the TERM on as a second USR1,
    which ends the wait for the running items before --grace does. The closing line said "when
    --grace ended". It may as well be the job's time limit (a --grace longer than the warning),
    which only the script can tell from a cancel: exit 76 still (the script does not requeue a
    cancel, nor a 76), and the line names the second signal."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    results, marks = tmp_path / "r", tmp_path / "marks"
    marks.mkdir()
    process = start([TOY, "2", "--sleep", "60", "--workers", "2", "--grace", "120", "--marker-dir", str(marks),
                     "--results", str(results), "--no-progress"])
    assert wait_until(lambda: len(list(marks.iterdir())) == 2, 60)
    rank = rank_pids(results)[0]
    os.kill(rank, signal.SIGUSR1)
    time.sleep(2.5)  # past the echo window: a signal of its own
    os.kill(rank, signal.SIGUSR1)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 76, err
    closing = error_lines(err)[-1]
    assert closing.startswith("toy: stopped (received SIGUSR1) with 0 of 2 items done; none finished in this run's "),\
        closing
    assert ("the 2 items still running when a second stop signal ended the wait for them were cut off: where it was the "
            "job's time limit (not a cancel), a job requeued with the same --time would cut them off again; give it a "
            "longer --time; finish with") in closing, closing
    assert "--grace ended" not in closing


def test_an_item_started_again_in_the_run_is_not_taken_for_one_that_never_fits(tmp_path, monkeypatch):
    """In a Slurm job, the walltime stops a run whose one item is in its second attempt (its first
    worker was killed): nothing finished, but the attempt cut off had less than the whole start,
    so a requeue may finish it: exit 75, not 76."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    results, marks = tmp_path / "r", tmp_path / "marks"
    marks.mkdir()
    process = start([TOY, "1", "--sleep", "60", "--kill-key", "item-0000", "--workers", "1", "--grace", "0.5",
                     "--marker-dir", str(marks), "--results", str(results), "--no-progress"])
    assert wait_until(lambda: len((marks / "item-0000").read_text().splitlines()) == 2
                      if (marks / "item-0000").exists() else False, 60)
    os.kill(rank_pids(results)[0], signal.SIGUSR1)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    assert "none finished in this run's" not in err, err


def test_a_stop_whose_grace_lets_every_item_finish_ends_complete(tmp_path):
    """Every item already handed out when the signal came: once they finish in their grace there is
    nothing left to resume, so the run writes its outputs and ends complete (exit 0) instead of
    "stopped with 2 of 2 items done; finish with --resume" (exit 75, no outputs)."""
    results, marks = tmp_path / "r", tmp_path / "marks"
    marks.mkdir()
    process = start([TOY, "2", "--sleep", "2", "--workers", "2", "--gpu", "cpu", "--marker-dir", str(marks),
                     "--results", str(results), "--no-progress"])
    assert wait_until(lambda: len(list(marks.iterdir())) == 2, timeout=60)  # both items run
    os.kill(process.pid, signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "received SIGTERM: handing out no more items" in err and "toy: complete: 2 of 2 items" in err, err
    assert read_summary(results)["status"] == "complete" and values(results)
    assert [e["why"] for e in journal_entries(results) if e.get("type") == "stop"] == ["received SIGTERM"]
    # the rank's log tells the same story, and stderr says each line once
    log = (results / "logs" / "rank0.log").read_text()
    assert "WARNING received SIGTERM: handing out no more items" in log and "INFO toy: complete: 2 of 2 items" in log
    assert err.count("handing out no more items") == 1 and err.count("toy: complete:") == 1, err

def test_a_worker_still_starting_lives_through_a_stop_signal_to_every_process(tmp_path, monkeypatch):
    """Slurm's walltime warning reaches every process of the job step, workers still importing
    their libraries included: it must wait for their handlers, not kill them."""
    monkeypatch.setenv("TOY_IMPORT_SLEEP", "3")
    results = tmp_path / "r"
    process = start([TOY, "4", "--sleep", "0.5", "--workers", "2", "--grace", "30", "--results", str(results),
                     "--no-progress"])
    wait_until((results / "logs" / "rank0.log").exists)
    time.sleep(0.5)  # the workers are started, and asleep in their import
    assert not list(results.glob("logs/rank0-*.log")), "the workers got past their import too soon"
    os.killpg(process.pid, signal.SIGUSR1)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    logs = err + "".join(path.read_text() for path in results.glob("logs/*.log"))
    assert "died" not in logs and "setup" not in logs, logs


def test_resume_takes_no_value_for_ordinary_apps(tmp_path):
    """--resume is a flag (only the pipelines take a target): what follows it is not its value."""
    assert_usage_error(run([TOY, "4", "--resume", "x", "--results", str(tmp_path / "r")]), "unrecognized arguments: x")
    assert not (tmp_path / "r").exists()


def test_resume_after_failures_reruns_the_later_wave_built_from_them(tmp_path):
    clean = run([TOY, "8", "--wave", "--results", str(tmp_path / "clean"), "--no-progress"])
    assert clean.returncode == 0, clean.stderr
    args = [TOY, "8", "--wave", "--retries", "0", "--results", str(tmp_path / "r"), "--no-progress"]
    failed = run(args + ["--fail-key", "item-0002"])
    assert failed.returncode == 1, failed.stderr
    assert "item-0002" not in values(tmp_path / "r")
    resumed = run(args + ["--resume"])  # the cause is gone: the failed item and the sum built without it run again
    assert resumed.returncode == 0, resumed.stderr
    assert values(tmp_path / "r") == values(tmp_path / "clean")


def test_an_app_with_an_unknown_seed_form_is_refused_in_one_line_before_any_worker(tmp_path):
    """App.seed_form is the app's own setting: a typo is one line and exit 2, not every worker's setup failing."""
    script = tmp_path / "bad_seeds.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(TOY).parent)!r})\nfrom toy_app import ToyApp\n"
                      "from common.run.runner import main\n\n\nclass BadSeeds(ToyApp):\n    seed_form = 'int64'\n\n\n"
                      "if __name__ == '__main__':\n    raise SystemExit(main(BadSeeds))\n")
    results = tmp_path / "r"
    proc = run([str(script), "4", "--results", str(results), "--no-progress"])
    assert_usage_error(proc, "BadSeeds.seed_form must be one of sequence, int32, not 'int64'")
    assert not results.exists()


@pytest.mark.parametrize("layout", [5, [{"threads": [1]}]], ids=["not-a-list", "threads-a-list"])
def test_a_damaged_start_event_is_one_line_on_two_ranks(tmp_path, layout):
    """A start event's layout is what a resume keeps the thread count from: damaged, the journal
    is refused as any damaged line is (it was a TypeError on rank 0, and rank 1 then waited for
    ever in a broadcast)."""
    results = tmp_path / "r"
    args = [TOY, "4", "--results", str(results), "--no-progress"]
    assert run(args).returncode == 0
    lines = (results / "journal.jsonl").read_text().splitlines()
    number = next(i for i, line in enumerate(lines) if json.loads(line).get("type") == "start")
    lines[number] = json.dumps(dict(json.loads(lines[number]), layout=layout))
    (results / "journal.jsonl").write_text("\n".join(lines) + "\n")
    before = snapshot(results)
    proc = run(args + ["--resume"], ranks=2, timeout=120)
    if layout == 5:
        assert_usage_error(proc, f"line {number + 1} is not a journal record; the journal is damaged")
        assert snapshot(results) == before
    else:  # a thread count that is not one: no count kept, the resume goes on
        assert proc.returncode == 0, proc.stderr


def test_a_result_line_with_an_engine_field_of_the_wrong_type_is_refused_before_the_outputs(tmp_path):
    """A result's seconds, attempt or host edited by hand: the resume went on and its report failed
    (exit 1), writing a "failed" summary over the complete run's; now one line, nothing touched."""
    results = tmp_path / "r"
    args = [TOY, "4", "--results", str(results), "--no-progress"]
    assert run(args).returncode == 0
    good = (results / "journal.jsonl").read_text()
    for field, value in (("seconds", "slow"), ("attempt", 1.5), ("host", 7), ("start", True), ("attempt", 10 ** 400)):
        lines = good.splitlines()
        number = next(i for i, line in enumerate(lines) if json.loads(line).get("type") == "result")
        lines[number] = json.dumps(dict(json.loads(lines[number]), **{field: value}))
        (results / "journal.jsonl").write_text("\n".join(lines) + "\n")
        before = snapshot(results)
        assert_usage_error(run(args + ["--resume"]), f"line {number + 1} is not a journal record; the journal is damaged")
        assert snapshot(results) == before, field


def test_an_unexpected_error_on_rank_0_before_the_run_ends_every_rank(tmp_path):
    """Rank 0 alone checks the results folder while the others wait for its answer: an error there
    that is not a usage error (an app's prepare() raising) ends the whole job at once, not rank 0
    alone with the others waiting for ever."""
    script = tmp_path / "broken_prepare.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(TOY).parent)!r})\nfrom toy_app import ToyApp\n"
                      "from common.run.runner import main\n\n\nclass BrokenPrepare(ToyApp):\n"
                      "    def prepare(self):\n        raise RuntimeError('boom in prepare')\n\n\n"
                      "if __name__ == '__main__':\n    raise SystemExit(main(BrokenPrepare))\n")
    began = time.monotonic()
    proc = run([str(script), "4", "--results", str(tmp_path / "r"), "--no-progress"], ranks=2, timeout=120)
    assert proc.returncode != 0 and "boom in prepare" in proc.stderr, proc.stderr
    assert time.monotonic() - began < 60


def test_the_start_line_counts_one_item_one_rank_and_one_worker_in_the_singular(tmp_path):
    proc = run([TOY, "1", "--workers", "1", "--results", str(tmp_path / "r"), "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "toy: 1 item (0 already in the journal) on 1 rank, 1 worker: rank 0 on " in proc.stderr, proc.stderr
    cards = (tmp_path / "r" / "report.html").read_text()
    assert '<b class="">1</b><span>rank</span>' in cards and '<b class="">1</b><span>worker</span>' in cards, cards


def test_a_dry_run_refuses_the_results_folders_the_run_refuses(tmp_path):
    """--dry-run checks the results folder as the run would, without writing: a link to nothing
    (mkdir would have said "File exists") and a read-only filesystem, the folder or one to be made in it."""
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for extra in ([], ["--dry-run"]):
        assert_usage_error(run([TOY, "2", "--results", str(dangling), *extra]),
                           f"--results {str(dangling)!r}: a symbolic link to {str(tmp_path / 'nowhere')!r}, which does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling"]
    read_only = tmp_path / "ro"
    read_only.mkdir()
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here for a read-only folder: {probe.stderr.decode().strip()}")
    for target in (read_only, read_only / "new"):
        for extra in ("", " --dry-run"):
            script = (f"mount --bind -o ro {read_only} {read_only} && "
                      f"exec {sys.executable} {TOY} 2 --results {target}{extra}")
            proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
            assert_usage_error(proc, f"--results {str(target)!r}: cannot write there (Read-only file system)")


PACKAGE_MAIN_APP = '''from common import App, Item, main


class MyApp(App):
    name = "myapp"

    def items(self):
        return [Item(f"i={i}", {"i": i}) for i in range(3)]

    def run_item(self, state, item, seed):
        return {"i": item.params["i"]}


raise SystemExit(main(MyApp))
'''


def test_an_app_class_in_a_packages_main_is_one_line_before_any_worker_dies_of_it(tmp_path):
    """The README's recipe ends in ``__main__.py``: an App defined there cannot be imported by the
    spawned workers (spawn leaves a package's __main__ out), and every worker used to die three
    times over before the run failed every item. Now: one line, exit 2, nothing written; the same
    class in a module of the package runs."""
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(PACKAGE_MAIN_APP)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "myapp", "--gpu", "cpu", "--results", str(results), "--no-progress"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert_usage_error(proc, "myapp: error: MyApp is defined where the spawned workers cannot import it from",
                       "(myapp/app.py)")
    assert not results.exists()
    helped = subprocess.run([sys.executable, "-m", "myapp", "--help"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and "--results" in helped.stdout, helped.stderr  # --help still answers
    (package / "app.py").write_text(PACKAGE_MAIN_APP.replace("raise SystemExit(main(MyApp))\n", ""))
    (package / "__main__.py").write_text("from common import main\n\nfrom myapp.app import MyApp\n\n"
                                         "raise SystemExit(main(MyApp))\n")
    proc = subprocess.run([sys.executable, "-m", "myapp", "--gpu", "cpu", "--results", str(results), "--no-progress"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert read_summary(results)["items_done"] == 3


def test_a_resume_that_finds_no_journal_says_it_starts_from_the_beginning(tmp_path):
    """A resume command with a relative --results pasted in another folder found no journal there
    and ran everything again without a word (a Slurm job's first start passes --resume too)."""
    results = tmp_path / "r"
    fresh = run([TOY, "2", "--results", str(results), "--no-progress", "--resume"], timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert f"toy: --resume: no journal in {results}, so the run starts from the beginning" in fresh.stderr
    again = run([TOY, "2", "--results", str(results), "--no-progress", "--resume"], timeout=120)
    assert again.returncode == 0 and "no journal in" not in again.stderr, again.stderr


def test_apps_of_ones_own_that_set_no_name_get_their_packages_and_never_mix(tmp_path):
    """README's recipe sets no ``name``: every such app was "app", so two of them wrote to
    results/app/, and the second's --resume (as the refusal advised) put its items into the first's
    journal. The default is now the package the class is defined in."""
    for package in ("myapp", "otherapp"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "app.py").write_text(
            "from common import App, Item\n\n\nclass Mine(App):\n    def items(self):\n"
            f"        return [Item(f'{package}-{{i}}', {{'i': i}}) for i in range(3)]\n\n"
            "    def run_item(self, state, item, seed):\n        return {'i': item.params['i']}\n")
        (tmp_path / package / "__main__.py").write_text(
            f"from common import main\nfrom {package}.app import Mine\n\nraise SystemExit(main(Mine))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))

    def app(package: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", package, "--gpu", "cpu", "--no-progress", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    for package in ("myapp", "otherapp"):
        done = app(package)
        assert done.returncode == 0 and f"{package}: complete: 3 of 3 items" in done.stderr, done.stderr
    assert sorted(path.name for path in (tmp_path / "results").iterdir()) == ["myapp", "otherapp"]
    refused = app("otherapp", "--results", str(tmp_path / "results" / "myapp"), "--resume")
    assert_usage_error(refused, "it was made with other arguments (app 'myapp' (journal) vs 'otherapp' (now))")
    # a run an earlier version made as "app", in results/app: a plain --resume (each Slurm start's)
    # goes on there, where it would have started again from nothing in results/myapp
    journal = tmp_path / "results" / "myapp" / "journal.jsonl"
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    header["fingerprint"]["app"] = "app"
    journal.write_text("\n".join([json.dumps(header)] + lines[1:3]) + "\n")  # two of its three items
    (tmp_path / "results" / "myapp").rename(tmp_path / "results" / "app")
    resumed = app("myapp", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "myapp: --resume: this run's journal is in 'results/app', the default folder of earlier versions" in \
        resumed.stderr, resumed.stderr
    assert not (tmp_path / "results" / "myapp").exists()
    assert read_summary(tmp_path / "results" / "app")["items_done"] == 3
