"""The end of a run never leaves a half-updated results folder: outputs an earlier run left that
could not be replaced are refused before any work (--resume), and a summary that cannot be
written at the end is one line, exit 75. Real runs of the toy app."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, TOY, assert_usage_error, error_lines, read_summary, run, snapshot, start, wait_for_results

STOP_CODE = 75


def unfinished_run(results: Path) -> None:
    """A finished toy run whose journal then loses its last result: --resume has one item to do."""
    assert run([TOY, "4", "--results", str(results), "--no-progress"]).returncode == 0
    journal = results / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if '"type":"result"' in line)
    journal.write_text("".join(lines[:last] + lines[last + 1:]))


def chattr(flag: str, path: Path) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("name, flag", [("summary.json", "+i"), ("values.json", "+i"), ("timeline.png", "+a")])
def test_an_output_that_cannot_be_replaced_is_refused_before_any_work(tmp_path, name, flag):
    results = tmp_path / "r"
    unfinished_run(results)
    target = results / name
    if shutil.which("chattr") is None or not chattr(flag, target):
        pytest.skip("chattr +i/+a needs root (CAP_LINUX_IMMUTABLE) and a filesystem with inode flags")
    try:
        before = snapshot(results)
        proc = run([TOY, "4", "--results", str(results), "--resume"], ranks=2)
        kind = "immutable" if flag == "+i" else "append-only"
        assert_usage_error(proc, f"{str(target)!r} is {kind}", f"chattr -{flag[1]}")
        assert snapshot(results) == before  # the journal was not even opened for the missing item
    finally:
        chattr(f"-{flag[1]}", target)
    assert run([TOY, "4", "--results", str(results), "--resume"]).returncode == 0


def test_a_folder_where_summary_json_goes_is_refused_before_any_work(tmp_path):
    results = tmp_path / "r"
    unfinished_run(results)
    (results / "summary.json").unlink()
    (results / "summary.json" / "inside").mkdir(parents=True)
    before = snapshot(results)
    assert_usage_error(run([TOY, "4", "--results", str(results), "--resume"]), "summary.json' is a folder")
    assert snapshot(results) == before


def test_a_summary_that_cannot_be_written_at_the_end_is_one_line_exit_75(tmp_path):
    """Made unwritable during the run (after the check at the start): no traceback, no exit 0 over a
    stale summary; --resume then writes the outputs."""
    results = tmp_path / "r"
    process = start([TOY, "6", "--sleep", "0.5", "--results", str(results), "--no-progress"])
    wait_for_results(results, 1)
    (results / "summary.json" / "inside").mkdir(parents=True)  # os.replace cannot put a file there
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    assert "Traceback" not in err
    last = error_lines(err)[-1]
    assert last.startswith("toy: stopped: cannot write summary.json ") and "(Is a directory)" in last, err
    assert last.endswith("--resume") and repr(str(results / "summary.json")) in last, err
    shutil.rmtree(results / "summary.json")
    assert run([TOY, "6", "--results", str(results), "--resume"]).returncode == 0
    assert (results / "summary.json").is_file()


@pytest.mark.parametrize("figures", [True, False])
def test_rank_0_warms_matplotlib_up_only_when_it_will_draw(figures):
    """preload_figures(figures): markdown for report.html always; matplotlib, about a second of CPU,
    only for an app that draws (App.draws_figures) or a run with GPUs. A fresh interpreter: the
    test process may hold matplotlib already."""
    code = ("import sys; from common.results.outputs import preload_figures\n"
            f"thread = preload_figures({figures}); thread.start(); thread.join(120)\n"
            "print('markdown' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", str(figures)]


@pytest.mark.parametrize("app_module", ["mnist_svm.app", "mnist_nn.app", "common.sweep.app"])
def test_what_a_worker_imports_of_each_app_leaves_matplotlib_out(app_module):
    """A worker imports its app's module and the worker's own (to unpickle the app): matplotlib,
    which only rank 0 draws with, cost each mnist_svm worker 0.2 s of CPU more at its start."""
    code = (f"import sys, {app_module}, common.workers.worker\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_results_path_of_bytes_that_are_not_utf8_gets_its_outputs(tmp_path):
    """A folder named with bytes that are not UTF-8 (Python holds them as lone surrogates): the run's
    command line in summary.md could not be encoded, so every run there ended in a traceback after
    its last item, summary.md and report.html missing, and --resume ended the same way."""
    results = tmp_path / os.fsdecode(b"r\xff")  # 'r\udcff'
    first = run([TOY, "3", "--results", str(results), "--no-progress"])
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    written = (results / "summary.md").read_bytes()
    assert b"r\\udcff" in written and written.decode("utf-8")  # the path as stderr shows it, and UTF-8
    assert (results / "report.html").is_file()
    status = run(["-m", "common.status", str(results)], errors="backslashreplace")  # it prints the path's bytes
    assert status.returncode == 0 and status.stdout.startswith("toy: complete"), status.stdout
    again = run([TOY, "3", "--results", str(results), "--no-progress", "--resume"])
    assert again.returncode == 0, again.stderr


BROKEN_HOOK = """import sys
sys.path.insert(0, {tests!r})
from toy_app import ToyApp
from common.run.runner import main


class Broken(ToyApp):
    def {hook}(self, *args):
        {body}


if __name__ == "__main__":
    raise SystemExit(main(Broken))
"""


@pytest.mark.parametrize("hook", ["summary_markdown", "headline"])
def test_an_app_whose_summary_part_or_closing_lines_raise_still_ends_with_its_summary(tmp_path, hook):
    """An app's summary_markdown or headline raising (its own bug) after its outputs were written:
    before, a traceback, no summary.md (summary_markdown) and status.json left at "finishing", so
    the status command said the run was writing its outputs for ever. Now one line, the traceback
    in the rank's log, the summary written and the run complete."""
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_HOOK.format(tests=str(Path(TOY).parent), hook=hook, body=f'raise RuntimeError("boom in {hook}")'))
    results = tmp_path / "r"
    ran = run([str(script), "3", "--results", str(results), "--no-progress"])
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    said = "its part of summary.md could not be made" if hook == "summary_markdown" else "its closing lines could not be made"
    assert f"toy: {said}: RuntimeError: boom in {hook} (the traceback is in logs/rank0.log)" in ran.stderr, ran.stderr
    assert f"boom in {hook}" in (results / "logs" / "rank0.log").read_text()
    markdown = (results / "summary.md").read_text()
    assert markdown.startswith("# toy: complete")
    assert ("own part of this summary could not be made" in markdown) == (hook == "summary_markdown")
    status = run(["-m", "common.status", str(results)])
    assert status.stdout.startswith("toy: complete"), status.stdout


def test_an_app_whose_headline_returns_none_still_ends_complete(tmp_path):
    """A headline without its return (None, not a list of lines) was iterated outside the guard: a
    TypeError traceback after the outputs were written."""
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_HOOK.format(tests=str(Path(TOY).parent), hook="headline", body="pass"))
    ran = run([str(script), "3", "--results", str(tmp_path / "r"), "--no-progress"])
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stdout == "" and "toy: complete: 3 of 3 items" in ran.stderr


def test_failed_items_say_how_to_run_them_again_and_a_resume_says_what_it_ran(tmp_path):
    """A failed run said nowhere that --resume runs its failed items again; a resume said "6 of 6
    items in 0.1 s" with nothing to tell that 5 came from the run before; and a resume with nothing
    left to run listed the earlier run's timeline as its own."""

    results = tmp_path / "r"
    args = [TOY, "6", "--gpu", "cpu", "--workers", "2", "--results", str(results), "--no-progress"]
    failed = run(args + ["--fail-key", "item-0001", "--retries", "0"])
    assert failed.returncode == 1, failed.stderr
    command = " ".join(["python", TOY, *args[1:], "--fail-key", "item-0001", "--retries", "0", "--resume"])
    *_, closing, retry = error_lines(failed.stderr)
    assert closing.startswith("toy: failed: 5 of 6 items done, 1 failed, in "), failed.stderr
    # the outputs' time apart from the items' (mnist_nn's figures took 18 s after 100%, said nowhere)
    said = read_summary(results)
    assert f"the items ended in {said['wall_seconds']:.1f} s; writing the outputs" in failed.stderr
    assert f" s, the outputs {said['outputs_seconds']:.1f} s more; results in " in closing, closing
    assert retry == f"toy: run the failed items again with: {command}", failed.stderr
    assert f"1 item failed. Run it again (after a fix, or for a failure of the moment) with:\n\n    {command}\n" \
        in (results / "summary.md").read_text()
    shown = subprocess.run([sys.executable, "-m", "common.status", str(results)], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 1 and f"\nretry    the failed items with: {command}\n" in shown.stdout
    # the same failure again on a resume: the earlier run's items are among those done, not the failed
    still = run(args + ["--fail-key", "item-0001", "--retries", "0", "--resume"])
    assert still.returncode == 1 and "toy: failed: 5 of 6 items done (5 from an earlier run), 1 failed, in " \
        in still.stderr, still.stderr
    resumed = run(args + ["--resume", "--spawn-markers", str(tmp_path / "spawned-first")])
    assert resumed.returncode == 0, resumed.stderr
    assert "toy: complete: 6 of 6 items (5 from an earlier run) in " in resumed.stderr, resumed.stderr
    assert len(list((tmp_path / "spawned-first").iterdir())) == 2  # one item to run: its 2 workers started
    assert "- wall time: " in (results / "summary.md").read_text() and " s (this run); item time" in \
        (results / "summary.md").read_text()
    assert read_summary(results)["timeline_plot"] == "timeline.png"  # its one item
    # nothing left: the outputs written again, no timeline of its own, and no worker started only to be
    # ended (mnist_nn's imported torch and its data first; one whose set-up had begun took 10 s to end)
    again = run(args + ["--resume", "--spawn-markers", str(tmp_path / "spawned")])
    assert again.returncode == 0 and "6 of 6 items (6 from an earlier run)" in again.stderr, again.stderr
    assert not (tmp_path / "spawned").exists()
    assert read_summary(results)["timeline_plot"] is None
    assert "timeline.png" not in (results / "summary.md").read_text() + (results / "report.html").read_text()


def test_a_resume_of_a_complete_multi_rank_run_starts_no_worker_on_any_rank(tmp_path):
    """Every rank learns from rank 0 that nothing is left before it starts its workers: a follower
    started its own (each importing and setting up the app) only to end them at once."""
    results = tmp_path / "r"
    args = [TOY, "6", "--gpu", "cpu", "--workers", "2", "--results", str(results), "--no-progress"]
    first = run(args + ["--spawn-markers", str(tmp_path / "spawned-first")], ranks=2)
    assert first.returncode == 0, first.stderr
    assert len(list((tmp_path / "spawned-first").iterdir())) == 4  # 2 ranks x 2 workers
    again = run(args + ["--resume", "--spawn-markers", str(tmp_path / "spawned")], ranks=2)
    assert again.returncode == 0 and "6 of 6 items (6 from an earlier run)" in again.stderr, again.stderr
    assert not (tmp_path / "spawned").exists()
    assert read_summary(results)["items_done"] == 6



def test_a_run_stopped_after_failures_has_no_part_of_the_app_in_its_summary(tmp_path):
    """--stop-after-failures ends a run "failed" without its outputs: the app's part of summary.md
    (made from what its finish() returns) would speak of outputs not written, or an earlier run's."""
    results = tmp_path / "r"
    proc = run([TOY, "30", "--sleep", "0.2", "--fail-key", "item-0000", "--retries", "0", "--stop-after-failures", "1",
                "--workers", "1", "--results", str(results), "--no-progress"])
    assert proc.returncode == 1, proc.stderr
    text = (results / "summary.md").read_text()
    assert text.startswith("# toy: failed") and "**Stopped**: 1 item failed for good" in text, text
    assert "## Toy values" not in text and not (results / "values.json").exists()
    proc = run([TOY, "30", "--retries", "0", "--workers", "1", "--results", str(results), "--no-progress", "--resume"])
    assert proc.returncode == 0 and "## Toy values" in (results / "summary.md").read_text()


def test_a_summary_says_how_many_of_the_items_done_a_full_disk_let_be_journaled():
    """Results that came after the disk filled are done but not journaled: a resume runs them again,
    and summary.md's items line says so (it said "16 of 16 done", the closing line "14 ... journaled")."""
    import argparse

    from common.app import App
    from common.run.engine import _summary_markdown

    class Plain(App):
        name = "plain"

    summary = {"status": "stopped", "command": "python -m plain", "items_done": 16, "items_total": 16,
               "items_resumed": 0, "failed_items": [], "ranks": 1,
               "workers": [{"rank": 0, "host": "vm", "devices": ["cpu0"]}], "wall_seconds": 3.0,
               "item_seconds_total": 2.0, "lost_ranks": [], "gpu_usage": {}, "items_journaled": 14}
    app = Plain(argparse.Namespace())
    text = _summary_markdown(app, summary, with_app_part=False)
    assert "- items: 16 of 16 done (0 from an earlier run), 0 failed; 14 of those done are journaled (the others " \
           "run again on --resume)\n" in text, text
    assert "journaled" not in _summary_markdown(app, {**summary, "items_journaled": 16}, with_app_part=False)
