"""The journal's last line, read the same way everywhere: a complete record without its newline is
kept (and the engine adds the newline before its next record); a torn, non-JSON tail is dropped."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO, TOY, assert_usage_error, journal_entries, read_summary, run, status_of


def _result_keys(results: Path):
    return [entry["key"] for entry in journal_entries(results) if entry.get("type") == "result"]


def test_a_last_record_without_its_newline_is_kept_through_two_resumes(tmp_path):
    results = tmp_path / "r"
    marks = tmp_path / "marks"
    marks.mkdir()
    args = [TOY, "10", "--marker-dir", str(marks), "--results", str(results), "--no-progress"]
    assert run(args).returncode == 0
    journal = results / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    positions = [i for i, line in enumerate(lines) if '"type":"result"' in line]
    last = lines[positions[5]]
    kept_key = json.loads(last)["key"]
    # the first six results, the sixth without its newline: the writer died just before it
    journal.write_text("".join(lines[:positions[5]]) + last.rstrip("\n"))
    for marker in marks.iterdir():
        marker.unlink()
    for _ in range(2):
        proc = run(args + ["--resume"])
        assert proc.returncode == 0, proc.stderr
        assert kept_key in _result_keys(results), "the record without its newline left the journal"
        assert read_summary(results)["items_done"] == 10
    assert not (marks / kept_key).exists(), f"{kept_key} was run again"
    keys = _result_keys(results)
    assert len(keys) == len(set(keys)) == 10
    assert read_summary(results)["items_resumed"] == 10
    assert all(line.endswith("\n") for line in journal.read_text().splitlines(keepends=True))


def test_every_reader_agrees_on_the_last_line(tmp_path):
    from common.observe.report_html import _tracebacks
    from common.results.journal import JournalReader, whole_lines

    header = json.dumps({"type": "header", "fingerprint": {"app": "toy"}})
    failed = json.dumps({"type": "attempt_failed", "key": "a", "traceback": "boom"})
    result = json.dumps({"type": "result", "key": "a"})
    for tail, kept in ((result, True), (result[:-5], False), (failed, True)):
        folder = tmp_path / str(len(tail))
        folder.mkdir()
        (folder / "journal.jsonl").write_text(f"{header}\n{failed}\n{tail}")
        lines, end, missing = whole_lines((folder / "journal.jsonl").read_bytes())
        assert (len(lines) == 3) == kept and missing == kept
        counts = JournalReader(folder / "journal.jsonl")
        counts.update()
        assert ("a" in counts.done) == (kept and tail == result)
        assert len(_tracebacks(folder)) == (2 if tail == failed else 1)


def test_status_counts_a_last_record_without_its_newline(tmp_path):
    """python -m common.status, a real process, over a journal whose last record lacks its newline."""
    results = tmp_path / "r"
    assert run([TOY, "4", "--results", str(results), "--no-progress"]).returncode == 0
    journal = results / "journal.jsonl"
    lines = [line for line in journal.read_text().splitlines() if '"type":"result"' in line]
    (results / "status.json").unlink()
    header = journal.read_text().splitlines()[0]
    journal.write_text(header + "\n" + "\n".join(lines))  # no newline after the fourth result
    shown = subprocess.run([sys.executable, "-m", "common.status", str(results)], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "4 done" in shown.stdout


def _killed_holding(folder: Path) -> None:
    """``folder``'s hold, taken by a process then SIGKILLed, as a run killed at its start leaves it."""
    take = "import os, sys; from common.results.hold import Hold; Hold(sys.argv[1]).acquire(); os.kill(os.getpid(), 9)"
    assert subprocess.run([sys.executable, "-c", take, str(folder)], cwd=REPO).returncode == -9


def test_a_run_killed_before_its_journal_began_is_run_again(tmp_path):
    """A SIGKILL in a run's first milliseconds leaves its hold and its rank's log, and perhaps an
    empty journal (the writer had not put the header on disk): nothing finished, so a rerun, with or
    without --resume, runs in that folder (both were refused: "holds files but no journal", "pass
    --resume", then "its journal's first line is not a run's header"). The old log is kept."""
    for name, empty_journal, extra in (("logs", False, []), ("empty", True, []), ("resume", True, ["--resume"])):
        results = tmp_path / name
        (results / "logs").mkdir(parents=True)
        _killed_holding(results)
        (results / "logs" / "rank0.log").write_text("killed at its start\n")
        if empty_journal:
            (results / "journal.jsonl").touch()
            assert_usage_error(status_of(results), "its run was killed as it started", "run it again")
        proc = run([TOY, "4", "--results", str(results), "--no-progress", *extra])
        assert proc.returncode == 0, proc.stderr
        assert journal_entries(results)[0]["type"] == "header"
        assert len(_result_keys(results)) == 4
        assert (results / "logs" / "rank0.log").read_text().startswith("killed at its start\n")


def test_a_header_torn_by_a_kill_is_written_again(tmp_path):
    from common.results.journal import Journal, JournalReader

    path = tmp_path / "journal.jsonl"
    path.write_text('{"type": "header", "finger')
    journal = Journal(path, {"fingerprint": {"app": "toy"}})
    journal.close()
    reader = JournalReader(path, strict=True).update()
    assert reader.header == {"fingerprint": {"app": "toy"}, "format": 1}
