"""What a pipeline run finds in its results folder that it did not put there: a file where a step's
folder goes, a FIFO where a log, a status or the progress goes, links to nothing. Each is one line
and exit 2 before anything runs (a dry run says it too), never a step failed as "an error in the
pipeline runner" over good results, and never a run blocked for ever on a FIFO."""
from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest

from common.pipeline.flow import read_cost_and_output
from helpers import assert_usage_error, pipeline_cli, read_summary, snapshot

DEFINITION = {"name": "p", "steps": [{"id": "a", "command": "echo A"}, {"id": "b", "command": "exit 3"}]}


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory) -> Path:
    """A run whose step b failed (so a --resume goes on at b): copied by each test."""
    folder = tmp_path_factory.mktemp("failed")
    (folder / "p.json").write_text(json.dumps(DEFINITION))
    assert pipeline_cli(folder / "p.json", folder / "results").returncode == 1
    return folder


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def dangling(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to("/nowhere/at/all")


def a_file(path: Path) -> None:
    shutil.rmtree(path)
    path.write_text("x")


CASES = {
    "progress-fifo": ("p/progress.json", fifo, "is a FIFO, where the run keeps a file"),
    "status-fifo": ("p/b/status.json", fifo, "is a FIFO, where the run keeps a file"),
    "log-fifo": ("p/b/stdout.log", fifo, "is a FIFO, where the run keeps a file"),
    "log-folder": ("p/b/stderr.log", folder, "is a folder, where the run keeps a file"),
    "step-folder-a-file": ("p/b", a_file, "is a file, where the run keeps a folder"),
    "step-folder-dangling": ("p/b", dangling, "is a link to '/nowhere/at/all', which does not exist"),
    "shared-a-file": ("p/shared", a_file, "is a file, where the run keeps a folder"),
    "rank-log-fifo": ("logs/rank0.log", fifo, "(a log) is a FIFO"),
    "worker-log-fifo": ("logs/rank0-cpu0.log", fifo, "(a log) is a FIFO"),
    "reserve-fifo": (".space-reserve", fifo, "(the disk-space reserve) is a FIFO"),
    "logs-dangling": ("logs", dangling, "is a link to '/nowhere/at/all', which does not exist"),
    "logs-a-file": ("logs", a_file, "is a file, where the run keeps its logs folder"),
}


@pytest.mark.parametrize("case", CASES)
def test_what_stands_in_a_runs_places_is_one_line_before_anything_runs(failed_run, tmp_path, case):
    """Before: a FIFO blocked the run for ever (SIGTERM too, for some), and a file or folder in the
    way passed --dry-run, then failed the step as an error of the runner, exit 1, over its good
    status. Now the resume and its dry run both refuse it in one line; nothing is written."""
    place, damage, said = CASES[case]
    shutil.copytree(failed_run, tmp_path / "run", symlinks=True)
    results = tmp_path / "run" / "results"
    damage(results / place)
    before = snapshot(results)
    for extra in (("--resume", "--dry-run"), ("--resume",)):
        proc = pipeline_cli(results.parent / "p.json", results, *extra)
        assert_usage_error(proc, said, "move it away")
        assert snapshot(results) == before


def test_links_devices_and_names_the_run_does_not_write_are_let_be(failed_run, tmp_path):
    """What a user may rightly put there: a step's folder and shared/ linked to scratch space, a log
    linked to a file not made yet (in a folder that is there) or sent to /dev/null, a FIFO of their
    own in logs/ under a name the run does not write, and a finished pipeline's folder archived
    (a link to where it no longer is): the resume runs, and writes through the links."""
    definition = tmp_path / "two.json"
    definition.write_text(json.dumps({"pipelines": [{"name": "done", "steps": [{"id": "a", "command": "echo A"}]},
                                                    DEFINITION]}))
    results = tmp_path / "results"
    assert pipeline_cli(definition, results).returncode == 1
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shutil.move(results / "p" / "shared", scratch / "shared")
    (results / "p" / "shared").symlink_to(scratch / "shared")
    (results / "p" / "b" / "stdout.log").unlink()
    (results / "p" / "b" / "stdout.log").symlink_to(scratch / "b.out")
    (results / "p" / "b" / "stderr.log").unlink()
    (results / "p" / "b" / "stderr.log").symlink_to("/dev/null")
    os.mkfifo(results / "logs" / "my-monitor.fifo")
    (results / "logs" / "rank0-cpu0.log").unlink()
    (results / "logs" / "rank0-cpu0.log").symlink_to("/dev/null")
    shutil.rmtree(results / "done" / "a")
    (results / "done" / "a").symlink_to("/archive/done/a")
    definition.write_text(json.dumps({"pipelines": [{"name": "done", "steps": [{"id": "a", "command": "echo A"}]},
                                                    {**DEFINITION, "steps": [DEFINITION["steps"][0],
                                                                             {"id": "b", "command": "echo B"}]}]}))
    proc = pipeline_cli(definition, results, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert (scratch / "b.out").read_text().strip() == "B"
    assert read_summary(results)["pipelines"]["p"]["status"] == "ok"


def test_every_status_a_run_writes_is_read_back(tmp_path):
    """STATUS_FIELDS (the types read_status holds a status.json to) against what the runner
    writes: ok, failed, timed out, retried, skipped, killed by a signal, over its memory."""
    from common.pipeline.flow import RunLayout, read_status

    steps = [{"id": "ok", "command": "echo hi"},
             {"id": "retried", "command": "exit 4", "max_retries": 1, "retry_delay": 0, "on_fail": "slow"},
             {"id": "slow", "command": "sleep 30", "timeout": 0.5, "on_fail": "signal"},
             {"id": "signal", "command": "kill -9 $$", "on_fail": "memory"},
             {"id": "memory", "command": "python3 -c 'b = bytearray(300 << 20); import time; time.sleep(5)'",
              "memory": "50M", "on_fail": "fails"},
             {"id": "fails", "command": "exit 3"},
             {"id": "never", "command": "true"}]
    definition = tmp_path / "kinds.json"
    definition.write_text(json.dumps({"name": "k", "steps": steps}))
    assert pipeline_cli(definition, tmp_path / "results").returncode == 1
    layout = RunLayout(tmp_path / "results", "k")
    statuses = {step["id"]: json.loads(layout.status_path(step["id"]).read_text()) for step in steps}
    assert {name: status["status"] for name, status in statuses.items()} == {
        "ok": "ok", "retried": "failed", "slow": "timeout", "signal": "failed", "memory": "failed", "fails": "failed",
        "never": "skipped"}, statuses
    assert statuses["retried"]["attempts"] == 2 and statuses["signal"]["exit_code"] == -9
    assert isinstance(statuses["memory"]["max_rss_bytes"], int), statuses["memory"]
    for step in steps:
        assert read_status(layout, step["id"]) == statuses[step["id"]], step["id"]


def test_a_fifo_a_step_leaves_where_a_later_steps_log_goes_fails_the_pipeline_instead_of_blocking(tmp_path):
    """A step that makes a FIFO in a later step's folder: that step's log could not be opened (the
    open waited for a reader for ever, and the step's timeout starts only when it runs)."""
    definition = tmp_path / "f.json"
    definition.write_text(json.dumps({"name": "f", "steps": [
        {"id": "a", "command": "mkdir -p ../b && mkfifo ../b/stderr.log"}, {"id": "b", "command": "echo B"}]}))
    proc = pipeline_cli(definition, tmp_path / "results")
    assert proc.returncode == 1, proc.stderr
    reason = read_summary(tmp_path / "results")["pipelines"]["f"]["reason"]
    assert "stderr.log' (a step's log) is a FIFO, not a regular file" in reason, reason


def test_a_steps_huge_output_is_read_in_pieces(tmp_path):
    """A prompt step's output.md is its stdout less its cost lines (``{"pipeline_cost": N}``): 40 MB on one line, without a
    newline, took 80 MB of memory and more (3 GB took 6 GB); now a piece at a time."""
    log = tmp_path / "stdout.log"
    long_line = b"x" * (40 << 20)
    with open(log, "wb") as handle:
        handle.write(b"earlier attempt\n")
        offset = handle.tell()
        handle.write(b'{"pipeline_cost": 0.25}\n' + long_line + b'\n{"pipeline_cost": 0.5}\nlast {"pipeline_cost": 9}\n'
                     b'{"pipeline_cost": 1}')
    tracemalloc.start()
    try:
        cost = read_cost_and_output(log, offset, tmp_path / "output.md")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cost == 1.75
    assert (tmp_path / "output.md").read_bytes() == long_line + b'\nlast {"pipeline_cost": 9}\n'
    assert peak < 1 << 20, peak
    assert read_cost_and_output(log, 0, None) == 1.75
