"""Odd things where the run's own files should be, with real processes: a FIFO (or another file that
is not a regular one) at journal.jsonl, hold.json or status.json is refused in one line, never
waited on; ``python -m common.status`` on a folder that is not a run's results says so."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import TOY, run, status_of


def assert_one_line_refusal(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(word in lines[0] for word in words), lines[0]


@pytest.mark.parametrize("name", ["journal.jsonl", "hold.json", "status.json"])
def test_a_fifo_among_the_run_files_is_refused_in_one_line(tmp_path, name):
    results = tmp_path / "r"
    args = [TOY, "4", "--results", str(results), "--no-progress"]
    assert run(args).returncode == 0
    (results / name).unlink(missing_ok=True)  # a finished run leaves no hold
    os.mkfifo(results / name)
    for extra in ([], ["--resume"]):
        assert_one_line_refusal(run(args + extra, timeout=60), name, "FIFO")
    assert (results / "journal.jsonl").exists() or name == "journal.jsonl"
    if name != "hold.json":  # the status reader never waits on it either
        assert_one_line_refusal(status_of(results), name, "FIFO")


def test_status_of_a_pipeline_step_folder_says_it_is_not_a_results_folder(tmp_path):
    definition = tmp_path / "one.json"
    definition.write_text(json.dumps({"name": "p", "steps": [{"id": "s", "command": "true"}]}))
    results = tmp_path / "res"
    done = run(["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--results", str(results)])
    assert done.returncode == 0, done.stderr
    [step_status] = list(results.glob("*/s/status.json"))
    assert_one_line_refusal(status_of(step_status.parent), "not the results folder of a run")
    assert_one_line_refusal(status_of(step_status.parent.parent), "not the results folder of a run")
    whole = status_of(results)
    assert whole.returncode == 0 and "complete" in whole.stdout, whole.stderr
