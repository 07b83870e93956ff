"""A worker's "done" lines are held and written together (a short item would otherwise spend more
time in logging than in the engine), yet the log reads as before: the formatter's very text, in
the order things happened, every line there once the worker ends or waits for work."""
from __future__ import annotations

import logging
import re
import time

from common.observe.logs import HOLD_SECONDS, worker_file_log
from helpers import TOY, run


def _formatted(handler: logging.Handler, when: float, message: str) -> str:
    """What logging itself writes for an INFO record made at ``when``."""
    record = logging.makeLogRecord({"msg": message, "levelno": logging.INFO, "levelname": "INFO", "created": when,
                                    "msecs": int((when - int(when)) * 1000) + 0.0})
    return handler.format(record)


def test_held_lines_are_the_formatters_text_and_come_before_any_later_record(tmp_path):
    path = tmp_path / "rank0-gpu0.log"
    handler = worker_file_log(str(path), "rank0-gpu0")
    now = int(time.time())
    moments = [now + 0.95, now + 0.9995, now + 1.05]  # a millisecond that must not round up, a new second
    for number, when in enumerate(moments):
        handler.hold(when, f"i={number} done in 0.001 s")
    assert not path.exists() or path.read_text() == ""  # held: nothing written yet
    warning = logging.makeLogRecord({"msg": "the next item failed", "levelno": logging.WARNING,
                                     "levelname": "WARNING", "created": now + 3})
    handler.handle(warning)
    lines = path.read_text().splitlines()
    assert lines[:3] == [_formatted(handler, when, f"i={n} done in 0.001 s") for n, when in enumerate(moments)]
    assert lines[3].endswith("WARNING the next item failed") and len(lines) == 4
    handler.close()


def test_held_lines_are_written_after_hold_seconds_on_waiting_and_on_close(tmp_path):
    path = tmp_path / "w.log"
    handler = worker_file_log(str(path), "w")
    start = time.time()
    handler.hold(start, "a done in 0.000 s")
    handler.hold(start + HOLD_SECONDS / 2, "b done in 0.000 s")
    assert not path.exists()
    handler.hold(start + HOLD_SECONDS, "c done in 0.000 s")  # the first has been held long enough: all go
    assert [line.split(" INFO ")[1] for line in path.read_text().splitlines()] == [
        "a done in 0.000 s", "b done in 0.000 s", "c done in 0.000 s"]
    handler.hold(start + 1, "d done in 0.000 s")
    handler.write_held()  # what the worker does before it waits for work
    assert path.read_text().splitlines()[-1].endswith("INFO d done in 0.000 s")
    handler.hold(start + 2, "e done in 0.000 s")
    handler.close()  # the worker's end (logging.shutdown)
    assert path.read_text().splitlines()[-1].endswith("INFO e done in 0.000 s")


def test_a_real_workers_log_has_one_done_line_per_item_in_order(tmp_path):
    """30 short items on 2 workers: every item's line is in its worker's log once the run ends,
    between the worker's first line and its last, in the order the worker ran them."""
    proc = run([TOY, "30", "--sleep", "0.01", "--gpu", "cpu", "--workers", "2", "--no-progress", "--threads", "1",
                "--results", str(tmp_path / "r")])
    assert proc.returncode == 0, proc.stderr
    done = {}
    for log_file in (tmp_path / "r" / "logs").glob("rank0-cpu*.log"):
        lines = log_file.read_text().splitlines()
        assert "started: pid" in lines[0], lines[0]
        stamps = [line[:23] for line in lines]
        assert stamps == sorted(stamps), lines  # written in the order they happened
        for line in lines:
            found = re.search(r"INFO (\S+) done in \d+\.\d{3} s$", line)
            if found:
                assert found.group(1) not in done, line
                done[found.group(1)] = log_file.name
    assert len(done) == 30, done
