"""A results folder that fills up mid-run: a small tmpfs, really full (root only; skipped otherwise)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from common.results.journal import read_journal
from helpers import REPO, TOY, read_summary, run, start, values, wait_for_results


@contextlib.contextmanager
def small_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where``, unmounted afterwards whatever happens."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path) -> Path:
    """Take every byte left on ``folder``'s filesystem."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"\0")
    except OSError:
        pass
    os.close(fd)
    return filler


def test_a_disk_that_fills_mid_run_stops_it_in_one_line_and_resume_finishes(tmp_path):
    clean = run([TOY, "200", "--workers", "2", "--results", str(tmp_path / "clean"), "--no-progress"])
    assert clean.returncode == 0, clean.stderr
    with small_filesystem(tmp_path / "small", "1m") as small:
        results = small / "r"
        args = [TOY, "200", "--sleep", "0.05", "--workers", "2", "--results", str(results), "--no-progress"]
        process = start(args)
        wait_for_results(results, 20)
        filler = fill(small)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 75, err
        assert "Traceback" not in err and "Logging error" not in err, err
        lines = [line for line in err.splitlines() if line.strip()]
        last = lines[-1]
        assert (results / "journal.jsonl").read_bytes().endswith(b"\n")  # a line cut by the full disk is cut off
        _, journaled = read_journal(results / "journal.jsonl")
        assert last.startswith("toy: stopped: cannot write the journal ") and str(results / "journal.jsonl") in last
        assert "(No space left on device)" in last and "free some space" in last
        assert f"; {len(journaled)} of 200 items are safely journaled;" in last
        assert last.endswith(" ".join(args) + " --resume")
        assert 20 <= len(journaled) < 200
        # Nothing but the notice of the stop and, where a worker's log filled up, one line per log.
        assert all(line.startswith(("[rank 0", "cannot write the worker log ")) for line in lines[:-1]), err
        report = read_summary(results)  # the reserve made room for it
        assert report["status"] == "stopped" and report["no_space"] is True
        assert report["items_journaled"] == len(journaled)
        markdown = (results / "summary.md").read_text()
        assert "Stopped for lack of space" in markdown
        if report["items_done"] > len(journaled):  # results that came with no room left to journal them
            assert (f"; {len(journaled)} of those done are journaled (the others run again on --resume)\n"
                    in markdown), markdown

        filler.unlink()
        resumed = run(args + ["--resume"])
        assert resumed.returncode == 0, resumed.stderr
        assert values(results) == values(tmp_path / "clean")
        _, journaled_now = read_journal(results / "journal.jsonl")
        assert sorted(journaled_now) == sorted(values(results))


def test_a_log_that_cannot_be_written_falls_back_to_stderr_once(tmp_path):
    """The handler of a worker's log on a full disk: one notice, then its warnings on stderr; no
    '--- Logging error ---' and no exception in the program that logs."""
    with small_filesystem(tmp_path / "small", "64k") as small:
        fill(small)
        program = textwrap.dedent(f"""
            import logging
            from common.observe.logs import worker_file_log
            log = logging.getLogger("w")
            log.addHandler(worker_file_log({str(small / "worker.log")!r}, "rank0-cpu0"))
            log.setLevel(logging.INFO)
            for i in range(3):
                log.info("item %d done " + "x" * 5000, i)
                log.error("item %d failed", i)
            print("still running")
        """)
        proc = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "still running\n", proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("cannot write the worker log ") and "No space left on device" in lines[0], lines
    assert [line.split("] ", 1)[1] for line in lines[1:]] == [f"ERROR item {i} failed" for i in range(3)], lines


def test_an_item_whose_output_finds_no_space_stops_the_run_instead_of_failing(tmp_path):
    """An item that writes its own output (here the toy's marker file; mnist_nn's saved models)
    on a full disk: the run stops (exit 75), nothing counts as failed, and --resume completes."""
    clean = run([TOY, "60", "--results", str(tmp_path / "clean"), "--no-progress"])
    assert clean.returncode == 0, clean.stderr
    with small_filesystem(tmp_path / "small", "256k") as small:
        results = tmp_path / "r"
        args = [TOY, "60", "--sleep", "0.1", "--workers", "2", "--retries", "3", "--marker-dir", str(small),
                "--results", str(results), "--no-progress"]
        process = start(args)
        wait_for_results(results, 6)
        filler = fill(small)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 75, err
        assert "Traceback" not in err and "failed for good" not in err and "retrying" not in err, err
        last = err.splitlines()[-1]
        _, journaled = read_journal(results / "journal.jsonl")
        assert last.startswith("toy: stopped: cannot write an output of item item-00"), last
        assert "(No space left on device)" in last and f"; {len(journaled)} of 60 items are safely journaled;" in last
        report = read_summary(results)
        assert report["failed_items"] == [] and report["no_space"] is True
        filler.unlink()
        resumed = run(args + ["--resume"])
        assert resumed.returncode == 0, resumed.stderr
    assert values(results) == values(tmp_path / "clean")
