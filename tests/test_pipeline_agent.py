"""Pipelines in the format users bring: prompt steps run by an agent command (the scripted agent of
examples/pipelines), budgets, matrices, retry delays, --dry-run, --schema, a plain --resume that
goes on where the run stopped, node-wide GPU slots shared by separate runs, and no retry after a stop."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from common.pipeline import nodelock
from common.pipeline.definition import load_definition, parse_definition
from common.pipeline.flow import PipelineRunner, RunLayout, RunStopping, read_progress
from common.pipeline.report import summary_markdown
from common.pipeline.schema import SCHEMA
from helpers import (
    REPO,
    assert_usage_error,
    pipeline_command,
    rank_pids,
    read_summary,
    run,
    snapshot,
    start,
    wait_until,
    write_json,
)

EXAMPLES = REPO / "examples" / "pipelines"
AGENT = f"{sys.executable} {EXAMPLES / 'scripted_agent.py'}"


pytestmark = pytest.mark.usefixtures("private_node_slots")


def cli(definition: Path, results: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run(pipeline_command(definition, results, *extra), timeout=timeout)


def run_pipeline(tmp_path: Path, data: dict, **runner):
    [pipeline] = parse_definition(data)
    layout = RunLayout(tmp_path / "results", pipeline.name)
    return PipelineRunner(pipeline, layout, **runner), layout


def test_the_shipped_agent_example_runs_with_the_scripted_agent(tmp_path):
    results = tmp_path / "results"
    proc = cli(EXAMPLES / "agent.json", results, "--agent", AGENT)
    assert proc.returncode == 0, proc.stderr
    runs = read_summary(results)["pipelines"]
    assert sorted(runs) == ["agent-digits-lr0_02", "agent-digits-lr50"]  # one pipeline per matrix value
    assert {s: v["status"] for s, v in runs["agent-digits-lr0_02"]["steps"].items()} == {
        "train": "ok", "train-retry": "skipped", "evaluate": "ok", "report": "ok"}
    assert {s: v["status"] for s, v in runs["agent-digits-lr50"]["steps"].items()} == {
        "train": "failed", "train-retry": "ok", "evaluate": "ok", "report": "ok"}
    diverged = results / "agent-digits-lr50"
    assert "diverged: the loss became nan at learning rate 50" in (diverged / "train" / "stderr.log").read_text()
    # the prompt went in on stdin, model and tools as variables, the answer became output.md
    report = (diverged / "report" / "output.md").read_text()
    assert report.startswith("# report") and "Model: small" in report and '"learning_rate": 0.005' in report
    assert "pipeline_cost" not in report  # the cost line is counted, not part of the answer
    assert "tools: python,files" in (diverged / "train-retry" / "output.md").read_text()
    assert (diverged / "train" / "prompt.md").read_text().startswith("Train the digits CNN")
    assert runs["agent-digits-lr50"]["cost"] == pytest.approx(0.035)
    assert runs["agent-digits-lr50"]["steps"]["evaluate"]["output"] == "agent-digits-lr50/evaluate/output.md"
    markdown = (results / "summary.md").read_text()
    assert "[agent-digits-lr50/report/output.md](agent-digits-lr50/report/output.md)" in markdown


def test_a_prompt_step_without_an_agent_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_AGENT", raising=False)
    results = tmp_path / "results"
    proc = cli(EXAMPLES / "agent.json", results)
    assert_usage_error(proc, "step 'train'", "a prompt step needs an agent command", "--agent", "PIPELINE_AGENT")
    assert not results.exists()
    monkeypatch.setenv("PIPELINE_AGENT", "")  # empty: as unset (README: an empty program means its default)
    assert_usage_error(cli(EXAMPLES / "agent.json", results), "a prompt step needs an agent command")
    assert cli(EXAMPLES / "ml.json", results, "--dry-run").returncode == 0  # no prompt step: no agent needed
    # PIPELINE_AGENT configures it as well as --agent
    monkeypatch.setenv("PIPELINE_AGENT", "cat")
    definition = write_json(tmp_path / "echo.json", {"name": "echo", "steps": [{"id": "ask", "prompt": "hello agent"}]})
    proc = cli(definition, results)
    assert proc.returncode == 0, proc.stderr
    assert (results / "echo" / "ask" / "output.md").read_text() == "hello agent"


def test_an_agent_command_the_shell_cannot_read_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """--agent '"unclosed' passed the checks, and every prompt step then failed (exit 2 of sh)."""
    monkeypatch.delenv("PIPELINE_AGENT", raising=False)
    results = tmp_path / "results"
    for extra in (["--dry-run"], []):
        proc = cli(EXAMPLES / "agent.json", results, "--agent", '"unclosed', *extra)
        assert_usage_error(proc, "--agent: the shell cannot read the agent command (")  # its words: dash's, bash's
    assert not results.exists()
    monkeypatch.setenv("PIPELINE_AGENT", "cat |")
    assert_usage_error(cli(EXAMPLES / "agent.json", results), "PIPELINE_AGENT: the shell cannot read the agent command")
    # every prompt step in a container: the container's sh runs it, which may read more than this
    # node's (bash's <(...), where /bin/sh here is dash): not judged by this node's sh
    from common.errors import UsageError
    from common.pipeline.app import agent_command
    from common.pipeline.definition import parse_definition

    image = tmp_path / "image.sif"
    image.write_bytes(b"sif")
    contained = parse_definition({"name": "c", "container": str(image), "steps": [{"id": "a", "prompt": "hi"}]})
    assert agent_command("cat | tee >(wc -c)", {}, contained, "def.json") == "cat | tee >(wc -c)"
    here = parse_definition({"name": "h", "steps": [{"id": "a", "prompt": "hi"}]})
    with pytest.raises(UsageError, match="the shell cannot read the agent command"):
        agent_command('"unclosed', {}, here, "def.json")


def test_step_outputs_say_which_steps_failed_and_which_output_is_empty(tmp_path, monkeypatch):
    """summary.md's table of step outputs listed a failed prompt step's output.md as any answer,
    though the agent had written nothing before it failed: each row now gives the step's status,
    and an empty file is marked so."""
    monkeypatch.setenv("PIPELINE_AGENT", 'if [ "$PIPELINE_MODEL" = good ]; then cat; else cat > /dev/null; exit 3; fi')
    definition = write_json(tmp_path / "p.json", {"name": "p", "steps": [
        {"id": "first", "prompt": "answer me", "model": "bad", "on_fail": "second"},
        {"id": "second", "prompt": "answer me", "model": "good"}]})
    results = tmp_path / "results"
    proc = cli(definition, results)
    assert proc.returncode == 0, proc.stderr
    steps = read_summary(results)["pipelines"]["p"]["steps"]
    assert (steps["first"]["status"], steps["first"]["output_bytes"]) == ("failed", 0), steps["first"]
    assert (steps["second"]["status"], steps["second"]["output_bytes"]) == ("ok", len("answer me")), steps["second"]
    markdown = (results / "summary.md").read_text()
    assert "| p | first | failed | [p/first/output.md](p/first/output.md) (empty) | 0 |" in markdown, markdown
    assert "| p | second | ok | [p/second/output.md](p/second/output.md) | 0 |" in markdown, markdown


def test_an_agent_named_by_a_path_relative_to_the_launch_folder_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """A prompt step runs its agent in the step's own folder: ``--agent 'python3 my_agent.py'``,
    found where the user launched, made every prompt step fail ("can't open file ...train/my_agent.py"),
    and ``.venv/bin/python`` as the program "not found"; refused in one line, with the spelling that works."""
    monkeypatch.delenv("PIPELINE_AGENT", raising=False)
    shutil.copy(EXAMPLES / "scripted_agent.py", tmp_path / "my_agent.py")
    results = tmp_path / "results"

    def launched_here(*extra: str) -> subprocess.CompletedProcess:
        return run(pipeline_command(EXAMPLES / "agent.json", results, *extra), cwd=tmp_path, timeout=120)

    assert_usage_error(launched_here("--agent", f"{sys.executable} my_agent.py"), "--agent: 'my_agent.py' is a file in "
                       "this folder", "own folder", '"$PIPELINE_LAUNCH_DIR/my_agent.py"')
    (tmp_path / "my_agent.py").chmod(0o755)
    monkeypatch.setenv("PIPELINE_AGENT", "./my_agent.py --fast")
    assert_usage_error(launched_here(), "PIPELINE_AGENT: './my_agent.py' is a file", '"$PIPELINE_LAUNCH_DIR/my_agent.py"')
    assert not results.exists()
    works = launched_here("--agent", f'{sys.executable} "$PIPELINE_LAUNCH_DIR/my_agent.py"')
    assert works.returncode == 0, works.stderr
    assert (results / "agent-digits-lr0_02" / "train" / "output.md").is_file()
    # only the program and the script an interpreter runs are looked at: a command that changes folder
    # first, or a file of the step's own that is also here, is the user's business (a review's cases)
    from common.pipeline.app import _relative_file

    (tmp_path / "prompt.md").write_text("here too")
    monkeypatch.chdir(tmp_path)
    assert _relative_file('cd "$PIPELINE_LAUNCH_DIR" && python3 my_agent.py') is None
    assert _relative_file("my-agent --prompt-file prompt.md") is None
    assert _relative_file("python3 -m agent_module prompt.md") is None
    assert _relative_file("MODE=fast python3 -u my_agent.py > prompt.md") == "my_agent.py"
    assert _relative_file("env A=1 time -p python3 my_agent.py") == "my_agent.py"  # past the wrappers
    (tmp_path / "claude").write_text("")  # a bare program name is looked up on PATH, not here
    assert _relative_file("claude -p") is None and _relative_file("./claude -p") == "./claude"


def test_steps_stop_starting_once_the_reported_costs_pass_the_budget(tmp_path):
    spend = "echo answer; echo '{\"pipeline_cost\": 0.6}'"
    runner, layout = run_pipeline(tmp_path, {"name": "p", "budget": 1, "steps": [
        {"id": "a", "command": spend}, {"id": "b", "command": spend}, {"id": "c", "command": "touch $PIPELINE_SHARED/c"}]})
    result = runner.run()
    assert result["status"] == "failed" and result["cost"] == pytest.approx(1.2)
    assert result["reason"] == "budget 1 passed: the steps reported 1.2"
    assert [result["steps"][s]["status"] for s in "abc"] == ["ok", "ok", "skipped"]
    assert not (layout.shared / "c").exists()
    assert result["steps"]["a"]["cost"] == pytest.approx(0.6)
    # a resume goes on with what the kept steps spent: c still does not start, whether the resume
    # starts at c (where the run stopped) or at b
    for first in ("c", "b"):
        result = PipelineRunner(runner.pipeline, layout).run(start=first, keep_shared=True)
        assert result["status"] == "failed" and result["reason"].startswith("budget 1 passed"), (first, result)
        assert not (layout.shared / "c").exists()
    assert result["cost"] == pytest.approx(1.2) and result["steps"]["b"]["status"] == "ok"
    # and no retry either once the budget is spent
    runner, layout = run_pipeline(tmp_path, {"name": "q", "budget": 1, "steps": [
        {"id": "a", "command": "echo x >> $PIPELINE_SHARED/runs; echo '{\"pipeline_cost\": 2}'; exit 1",
         "max_retries": 5}]})
    result = runner.run()
    assert result["steps"]["a"]["attempts"] == 1 and "no retry: budget 1 passed" in result["steps"]["a"]["reason"]
    # passed by a step that failed: the clean-up after it (prev.error) does not start, and it and the
    # pipeline say the budget stopped them, not only the failure before
    runner, layout = run_pipeline(tmp_path, {"name": "r", "budget": 1, "steps": [
        {"id": "a", "command": "echo '{\"pipeline_cost\": 2}'; exit 1"},
        {"id": "clean", "condition": "prev.error", "command": "touch $PIPELINE_SHARED/cleaned"}]})
    result = runner.run()
    assert result["status"] == "failed" and not (layout.shared / "cleaned").exists()
    assert result["steps"]["clean"]["status"] == "skipped"
    assert result["steps"]["clean"]["reason"] == "budget 1 passed: the steps reported 2", result["steps"]["clean"]
    assert result["reason"].startswith("step 'a' failed: ") and result["reason"].endswith(
        "; then budget 1 passed: the steps reported 2"), result["reason"]
    # passed by the last step: nothing is left to stop, the pipeline ends as its steps did, and the
    # summary marks its cost over the budget
    runner, layout = run_pipeline(tmp_path, {"name": "last", "budget": 1, "steps": [
        {"id": "a", "command": "echo '{\"pipeline_cost\": 0.5}'"}, {"id": "b", "command": "echo '{\"pipeline_cost\": 9}'"}]})
    result = runner.run()
    assert result["status"] == "ok" and result["cost"] == pytest.approx(9.5) and result["budget"] == 1
    assert "Reported costs: last 9.5 (**over its budget of 1**)" in summary_markdown({"last": result})
    within = dict(result, cost=0.5)
    assert "Reported costs: last 0.5\n" in summary_markdown({"last": within})


def test_a_resume_from_after_an_unhandled_failure_leaves_the_pipeline_failed(tmp_path):
    """The pipeline is ok when no failure was left without an on_fail: a resume from the clean-up
    step after one (its condition prev.error) runs it, and the kept failure still stands; a plain
    --resume then starts at the failed step. A handled failure (on_fail) kept by a resume does not."""
    runner, layout = run_pipeline(tmp_path, {"name": "h", "steps": [
        {"id": "work", "command": "echo broken >&2; exit 3"},
        {"id": "cleanup", "condition": "prev.error", "command": "touch $PIPELINE_SHARED/cleaned"},
        {"id": "after", "command": "touch $PIPELINE_SHARED/after"}, {"id": "last", "command": "true"}]})
    assert runner.run()["status"] == "failed"
    again = PipelineRunner(runner.pipeline, layout).run(start="cleanup", keep_shared=True)
    assert again["status"] == "failed" and again["reason"].startswith("step 'work' failed in an earlier run: "), again
    assert again["steps"]["cleanup"]["status"] == "ok" and (layout.shared / "cleaned").exists()
    # the steps after the one it started from run as on any resume: the kept failure decides the status only
    assert [again["steps"][s]["status"] for s in ("after", "last")] == ["ok", "ok"] and (layout.shared / "after").exists()
    assert read_progress(layout)["resume_at"] == "work"
    runner, layout = run_pipeline(tmp_path, {"name": "handled", "steps": [
        {"id": "work", "command": "exit 3", "on_fail": "fallback"}, {"id": "fallback", "command": "true"},
        {"id": "report", "command": "true"}]})
    assert runner.run()["status"] == "ok"
    assert PipelineRunner(runner.pipeline, layout).run(start="report", keep_shared=True)["status"] == "ok"


def test_a_matrix_makes_one_pipeline_per_combination(tmp_path):
    pipelines = parse_definition({"name": "sweep", "matrix": {"lr": [0.01, 0.5], "batch": [16, 32]}, "steps": [
        {"id": "train-${batch}", "command": "train --lr ${lr} --batch ${batch} --home ${HOME}",
         "env": {"LR": "${lr}"}, "on_fail": "report"},
        {"id": "report", "prompt": "Report on lr ${lr}", "model": "m-${batch}"}]})
    assert [p.name for p in pipelines] == ["sweep-lr0_01-batch16", "sweep-lr0_01-batch32",
                                           "sweep-lr0_5-batch16", "sweep-lr0_5-batch32"]
    last = pipelines[-1]
    assert last.steps[0].id == "train-32" and last.steps[0].env == {"LR": "0.5"}
    assert last.steps[0].command == "train --lr 0.5 --batch 32 --home ${HOME}"  # not a matrix name: left to the shell
    assert last.steps[1].prompt == "Report on lr 0.5" and last.steps[1].model == "m-32"
    assert last.matrix == {"lr": "0.5", "batch": "32"}
    named = parse_definition({"name": "run-${lr}", "matrix": {"lr": ["a", "b"]}, "steps": [{"id": "s", "command": "true"}]})
    assert [p.name for p in named] == ["run-a", "run-b"]


def test_retry_delay_waits_longer_before_each_retry(tmp_path):
    runner, layout = run_pipeline(tmp_path, {"name": "p", "steps": [
        {"id": "flaky", "command": "exit 1", "max_retries": 3, "retry_delay": 0.3}]})
    history = runner.run()["steps"]["flaky"]["history"]
    gaps = [later["started"] - earlier["ended"] for earlier, later in zip(history, history[1:])]
    assert len(gaps) == 3
    for gap, wanted in zip(gaps, (0.3, 0.6, 1.2)):
        assert wanted <= gap < wanted + 1.0, gaps


def test_no_retry_and_no_step_starts_once_a_stop_is_asked(tmp_path):
    runs = tmp_path / "results" / "p" / "shared" / "runs"
    runner, layout = run_pipeline(tmp_path, {"name": "p", "steps": [
        {"id": "flaky", "command": "echo x >> $PIPELINE_SHARED/runs; exit 1", "max_retries": 1000, "retry_delay": 0.1},
        {"id": "after", "command": "true"}]}, stop_asked=runs.exists)  # the stop comes during the first attempt
    with pytest.raises(RunStopping):
        runner.run()
    assert len(runs.read_text().split()) == 1
    status = json.loads(layout.status_path("flaky").read_text())
    assert status["attempts"] == 1 and status["reason"].endswith("not started: the run is stopping")
    assert read_progress(layout)["resume_at"] == "flaky"
    assert not layout.status_path("after").exists()
    # asked before anything ran: no step starts at all
    runner, layout = run_pipeline(tmp_path, {"name": "q", "steps": [{"id": "a", "command": "true"}]},
                                  stop_asked=lambda: True)
    with pytest.raises(RunStopping):
        runner.run()
    assert not layout.status_path("a").exists() and read_progress(layout)["resume_at"] == "a"


def test_sigterm_ends_a_step_retrying_at_once_instead_of_retrying_through_the_grace(tmp_path):
    """issue 22: a step with many retries kept retrying through a stop's grace period."""
    definition = write_json(tmp_path / "retry.json", {"name": "retry", "steps": [
        {"id": "flaky", "command": "echo x >> $PIPELINE_SHARED/runs; sleep 0.2; exit 1", "max_retries": 1000}]})
    results = tmp_path / "results"
    process = start(["-m", "common.pipeline", str(definition), "--results", str(results), "--gpu", "cpu",
                     "--no-progress", "--grace", "120"])
    runs = results / "retry" / "shared" / "runs"
    assert wait_until(lambda: runs.exists() and len(runs.read_text().split()) >= 3, 60)
    os.kill(rank_pids(results)[0], signal.SIGTERM)
    stopped = time.monotonic()
    out, err = process.communicate(timeout=100)
    assert process.returncode == 75, err
    assert time.monotonic() - stopped < 30, "the run waited through its grace while the step kept retrying"
    count = len(runs.read_text().split())
    time.sleep(1)
    assert len(runs.read_text().split()) == count
    assert read_progress(RunLayout(results, "retry"))["resume_at"] == "flaky"


def test_max_retries_has_a_documented_maximum():
    with pytest.raises(Exception, match="max_retries must be a whole number from 0 to 1000, got 1000000000000"):
        parse_definition({"name": "p", "steps": [{"id": "a", "command": "true", "max_retries": 10 ** 12}]})


def test_a_plain_resume_goes_on_from_the_first_unfinished_step(tmp_path):
    flag = tmp_path / "fixed"
    definition = write_json(tmp_path / "p.json", {"pipelines": [
        {"name": "exp", "steps": [
            {"id": "prepare", "command": "echo $$ >> $PIPELINE_SHARED/prepared.txt"},
            {"id": "train", "command": f"echo trying >&2; test -e {flag} && touch $PIPELINE_SHARED/trained"},
            {"id": "report", "command": "test -e $PIPELINE_SHARED/trained"}]},
        {"name": "fine", "steps": [{"id": "only", "command": "echo $$ >> $PIPELINE_SHARED/runs"}]}]})
    results = tmp_path / "results"
    first = cli(definition, results)
    assert first.returncode == 1, first.stderr
    assert read_progress(RunLayout(results, "exp"))["resume_at"] == "train"
    flag.touch()
    second = cli(definition, results, "--resume")
    assert second.returncode == 0, second.stderr
    run_summary = read_summary(results)["pipelines"]["exp"]
    assert run_summary["status"] == "ok" and run_summary["resumed_from"] == "train"
    assert len((results / "exp" / "shared" / "prepared.txt").read_text().split()) == 1  # not run again
    assert not (results / "exp" / "shared.previous-1").exists()  # the shared folder was reused
    assert len((results / "fine" / "shared" / "runs").read_text().split()) == 1  # finished: skipped
    # ... and its row in the summary says so, as the kept steps of exp do
    pipelines = read_summary(results)["pipelines"]
    assert pipelines["fine"]["steps"]["only"]["previous_run"] is True
    assert pipelines["exp"]["steps"]["prepare"]["previous_run"] is True and "previous_run" not in pipelines["exp"]["steps"]["train"]
    row = next(line for line in (results / "summary.md").read_text().splitlines() if line.startswith("| fine |"))
    assert row.startswith("| fine | ok |") and row.endswith(" s (earlier run) |"), row
    # both attempts' logs are kept: a resume appends to them
    assert (results / "exp" / "train" / "stderr.log").read_text().count("trying") == 2
    history = json.loads((results / "exp" / "train" / "status.json").read_text())["history"]
    assert [h["status"] for h in history] == ["failed", "ok"]


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    results = tmp_path / "results"
    proc = cli(EXAMPLES / "agent.json", results, "--dry-run", "--agent", AGENT, "--resource", "licence=2")
    assert proc.returncode == 0, proc.stderr
    assert not results.exists()
    plan = proc.stdout
    # the gpu pool as the run sizes it: here no GPU (--gpu cpu), so one step per worker
    assert "Dry run: 2 pipelines" in plan and "pools: gpu=1 per rank (no GPU: one per worker), licence=2" in plan
    three = cli(EXAMPLES / "agent.json", results, "--dry-run", "--agent", AGENT, "--workers", "3")
    assert "pools: gpu=3 per rank (no GPU: one per worker);" in three.stdout, three.stderr
    # par() and pipelines run as many at once as there are workers: said before the run, not found out
    assert "workers: 1 on this rank, each running one step at a time, so at most 1 at once here" in plan
    assert "workers: 3 on this rank, each running one step at a time, so at most 3 at once here" in three.stdout
    assert "pipeline agent-digits-lr50; deadline 3600 s; budget 1; matrix lr=50" in plan
    assert "2. train-retry: prompt 'The first training failed." in plan
    assert "holds gpu; if prev.error; timeout 1200 s; on failure report" in plan
    bad = cli(EXAMPLES / "agent.json", results, "--dry-run")  # a dry run checks everything a run does
    assert_usage_error(bad, "needs an agent command")
    two_ranks = run(["-m", "common.pipeline", str(EXAMPLES / "ml.json"), "--results", str(results), "--gpu", "cpu",
                     "--dry-run"], ranks=2)
    assert two_ranks.returncode == 0, two_ranks.stderr
    assert two_ranks.stdout.count("Dry run:") == 1 and not results.exists()  # rank 0 prints it


def test_the_schema_is_printed_and_the_shipped_examples_follow_it(tmp_path):
    proc = run(["-m", "common.pipeline", "--schema"])
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert schema == json.loads(json.dumps(SCHEMA))
    jsonschema.Draft202012Validator.check_schema(schema)
    for example in sorted(EXAMPLES.glob("*.json")):
        jsonschema.validate(json.loads(example.read_text()), schema)
        assert load_definition(example)
    # beside a definition or another flag, which it would silently ignore: one line, exit 2
    for extra in (["--bogus"], [str(EXAMPLES / "ml.json")]):
        assert_usage_error(run(["-m", "common.pipeline", "--schema", *extra]), "--schema takes no other arguments")


def hold_gpu_slot(lock_dir: Path, seconds: float, record: Path) -> subprocess.Popen:
    code = ("import sys, time; from common.pipeline import nodelock\n"
            "with nodelock.hold_slot(['gpu0-0'], chosen_dir=sys.argv[3]):\n"
            "    began = time.time(); time.sleep(float(sys.argv[1]))\n"
            "    open(sys.argv[2], 'a').write(f'{began} {time.time()}\\n')\n")
    return subprocess.Popen([sys.executable, "-c", code, str(seconds), str(record), str(lock_dir)], cwd=REPO)


def test_node_wide_slots_are_taken_by_one_process_at_a_time_and_freed_when_it_dies(tmp_path):
    record = tmp_path / "held.txt"
    holders = [hold_gpu_slot(tmp_path / "locks", 0.8, record) for _ in range(2)]
    for holder in holders:
        assert holder.wait(30) == 0
    (a_start, a_end), (b_start, b_end) = sorted(tuple(map(float, line.split())) for line in record.read_text().splitlines())
    assert b_start >= a_end
    killed = hold_gpu_slot(tmp_path / "locks", 300, record)
    assert wait_until(lambda: (tmp_path / "locks" / "gpu0-0.lock").exists() and
                      (tmp_path / "locks" / "gpu0-0.lock").read_text().strip() == str(killed.pid), 30)
    killed.kill()
    killed.wait()
    with nodelock.hold_slot(["gpu0-0"], timeout=5, chosen_dir=str(tmp_path / "locks")) as slot:  # the kernel let go
        # of the dead holder's lock
        assert slot == "gpu0-0"
    assert nodelock.slot_names("0", 2, 4) == ["gpu0-0", "gpu0-1"] and nodelock.slot_names(None, 0, 2) == ["cpu-0", "cpu-1"]


def test_two_separate_runs_on_one_node_share_its_gpu_capacity(tmp_path):
    definition = write_json(tmp_path / "hold.json", {"name": "p", "steps": [
        {"id": "hold", "gpu": True, "command": "sleep 5"}]})  # 5 s: the two runs may start seconds apart here
    base = ["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--no-progress", "--resource", "gpu=1"]
    runs = [start(base + ["--results", str(tmp_path / f"r{i}")]) for i in range(2)]
    for process in runs:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    earlier, later = sorted((json.loads((tmp_path / f"r{i}" / "p" / "hold" / "status.json").read_text())
                             for i in range(2)), key=lambda status: status["started"])
    spans = [(earlier["started"], earlier["ended"]), (later["started"], later["ended"])]
    assert later["started"] >= earlier["ended"], f"capacity 1 on one node: the second run's GPU step overlapped {spans}"
    # it queued while the other held the slot, and waited for it: not merely started later
    assert later["started"] - later["queued_seconds"] < earlier["ended"] and later["queued_seconds"] > 1.0, \
        (spans, later["queued_seconds"])


def test_the_formats_own_variable_names_are_read(monkeypatch):
    from common.pipeline.app import configured_pools, queue_timeout

    environ = {"SWARM_RESOURCE_gpu": "2", "SWARM_RESOURCE_licence": "1", "PIPELINE_RESOURCE_LICENCE": "3"}
    assert configured_pools([], environ) == {"gpu": 2, "licence": 3}  # ours win where both are set
    assert queue_timeout(None, {"SWARM_QUEUE_TIMEOUT": "12"}) == 12.0
    assert queue_timeout(None, {"SWARM_QUEUE_TIMEOUT": "12", "PIPELINE_QUEUE_TIMEOUT": "5"}) == 5.0


def test_a_results_folder_left_by_a_dry_run_is_untouched(tmp_path):
    """A user's own file beside the run is kept (the pipelines write only their own folders and the
    engine's outputs: --results . beside the definition works); a folder named like a pipeline,
    with no journal of a run, is someone else's: refused, the dry run as the run."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "keep.txt").write_text("mine")
    before = snapshot(results)
    proc = cli(EXAMPLES / "ml.json", results, "--dry-run")
    assert proc.returncode == 0 and "digits-cnn" in proc.stdout, proc.stdout + proc.stderr
    assert snapshot(results) == before
    (results / "digits-cnn").mkdir()
    (results / "digits-cnn" / "notes.md").write_text("mine too")
    before = snapshot(results)
    for extra in (["--dry-run"], []):
        proc = cli(EXAMPLES / "ml.json", results, *extra)
        assert_usage_error(proc, "holds files but no journal of a run (digits-cnn), which this run would overwrite")
    assert snapshot(results) == before


def test_a_dry_run_refuses_what_the_run_would_and_says_what_a_resume_skips(tmp_path):
    results = tmp_path / "results"
    definition = write_json(tmp_path / "two.json", {"pipelines": [
        {"name": "fine", "steps": [{"id": "a", "command": "true"}]},
        {"name": "broken", "steps": [{"id": "a", "command": "true"}, {"id": "b", "command": "exit 3"}]}]})
    assert cli(definition, results).returncode == 1
    before = snapshot(results)
    assert_usage_error(cli(definition, results, "--dry-run"), "already holds the journal")
    plan = cli(definition, results, "--dry-run", "--resume")
    assert plan.returncode == 0, plan.stderr
    assert "finished: --resume skips it" in plan.stdout and "--resume goes on at step 'b'" in plan.stdout, plan.stdout
    # from a step: that pipeline alone runs, and the plan said nothing of the others (as if they ran)
    plan = cli(definition, results, "--dry-run", "--resume", "broken/a")
    assert plan.returncode == 0, plan.stderr
    assert "resume from step 'a'" in plan.stdout and "not run: --resume broken/a runs 'broken' alone" in plan.stdout, \
        plan.stdout
    assert snapshot(results) == before


def test_a_step_waiting_for_a_node_wide_slot_gives_up_when_the_run_stops(tmp_path):
    holder = hold_gpu_slot(tmp_path / "locks", 300, tmp_path / "held.txt")  # another run holds the GPU
    try:
        assert wait_until(lambda: (tmp_path / "locks" / "gpu0-0.lock").exists() and
                          (tmp_path / "locks" / "gpu0-0.lock").read_text().strip() == str(holder.pid), 30)
        asked_at = time.monotonic() + 1.0
        runner, layout = run_pipeline(tmp_path, {"name": "p", "steps": [
            {"id": "train", "gpu": True, "command": "touch $PIPELINE_SHARED/ran"}]},
            gpu="0", node_slots=["gpu0-0"], stop_asked=lambda: time.monotonic() > asked_at)
        with pytest.raises(RunStopping):
            runner.run()
        assert time.monotonic() - asked_at < 5
        assert not (layout.shared / "ran").exists()
        assert json.loads(layout.status_path("train").read_text())["reason"] == "not started: the run is stopping"
        assert read_progress(layout)["resume_at"] == "train"
    finally:
        holder.kill()
        holder.wait()


def test_the_pipelines_table_has_as_many_cells_in_each_row_as_its_header():
    """Pipelines without a step record (each killed with its worker before writing one) too."""
    from common.pipeline.report import pipelines_table

    for pipelines in ({"p1": {"status": "failed", "steps": {}}},
                      {"p1": {"status": "ok", "steps": {"a": {"status": "ok", "seconds": 1.0}}},
                       "p2": {"status": "failed", "steps": {}}}):
        lines = pipelines_table(pipelines).splitlines()
        assert len({line.count("|") for line in lines}) == 1, lines


def test_an_evaluation_failed_in_a_pipeline_that_went_on_is_named_with_its_resume():
    """The format document: "if training completes but evaluation fails, resume from the evaluation
    step". Its example's evaluate goes on to report when it fails, so the pipeline ends ok and a
    plain --resume would not run it again: the answer, summary.md and the closing lines name it."""
    from common.pipeline import report

    pipelines = {"ml": {"status": "ok", "steps": {  # resumed now from evaluate: train failed before it
                     "train": {"status": "failed", "seconds": 1.0, "previous_run": True},
                     "train-retry": {"status": "ok", "seconds": 1.0, "previous_run": True},
                     "evaluate": {"status": "failed", "seconds": 1.0}, "report": {"status": "ok", "seconds": 1.0}}},
                 "other": {"status": "ok", "steps": {"a": {"status": "timeout", "seconds": 3.0}}},
                 "old": {"status": "ok", "steps": {  # ended in an earlier run: still named
                     "x": {"status": "failed", "previous_run": True}, "y": {"status": "ok", "previous_run": True}}},
                 "broken": {"status": "failed", "reason": "step 'a' failed", "steps": {"a": {"status": "failed"}}}}
    assert report.handled_failures(pipelines) == ["ml/evaluate", "other/a", "old/x"]
    assert report.answer(pipelines) == ("4 pipelines: 3 ok, 1 failed; failed along the way (their pipeline "
                                        "went on): ml/evaluate, other/a, old/x")
    assert report.headline(pipelines)[1].endswith("the same command with --resume RUN/STEP (one of those: "
                                                  "--resume ml/evaluate, ...)")
    one = {"ml": pipelines["ml"]}
    assert report.headline(one)[1].endswith("the same command with --resume ml/evaluate")
    assert "add `--resume ml/evaluate` (that step and those after it)" in report.summary_markdown(one)
    # a pipeline that failed later, unhandled, at report (its progress.json's resume_at): the failure
    # handled before it is named; one without that record (its worker killed) names none
    failed_later = {"ml": {"status": "failed", "resume_at": "report", "steps": {
        "train": {"status": "ok"}, "evaluate": {"status": "failed"}, "report": {"status": "failed"}}}}
    assert report.handled_failures(failed_later) == ["ml/evaluate"]
    del failed_later["ml"]["resume_at"]
    assert report.handled_failures(failed_later) == []
    ok = {"ml": {"status": "ok", "steps": {"evaluate": {"status": "ok", "seconds": 1.0}}}}
    assert report.headline(ok) == [] and report.answer(ok) == "1 pipeline: 1 ok"
    assert "along the way" not in report.summary_markdown(ok)


def test_a_lock_folder_that_cannot_be_made_is_refused_when_the_run_starts(tmp_path, monkeypatch):
    """PIPELINE_LOCK_DIR, where GPU steps take their node-wide slots: one line and exit 2 at the
    start, not a failure of every GPU step later."""
    results = tmp_path / "results"
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("PIPELINE_LOCK_DIR", str(tmp_path / "a-file" / "locks"))
    assert_usage_error(cli(EXAMPLES / "ml.json", results, "--resource", "gpu=1"), "PIPELINE_LOCK_DIR",
                       f"the node-wide GPU slots cannot live there: Not a directory: '{tmp_path / 'a-file' / 'locks'}'")
    monkeypatch.setenv("PIPELINE_LOCK_DIR", str(tmp_path / "a-file"))  # was "[Errno 17] File exists: ..."
    assert_usage_error(cli(EXAMPLES / "ml.json", results, "--resource", "gpu=1"),
                       f"PIPELINE_LOCK_DIR: the node-wide GPU slots cannot live there: '{tmp_path / 'a-file'}' exists "
                       f"and is not a folder")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # a link to nothing: also "exists" to mkdir
    monkeypatch.setenv("PIPELINE_LOCK_DIR", str(tmp_path / "dangling"))
    assert_usage_error(cli(EXAMPLES / "ml.json", results, "--resource", "gpu=1"),
                       f"'{tmp_path / 'dangling'}' exists and is not a folder")
    assert not results.exists()


def test_a_step_ended_while_it_waits_for_its_pool_is_recorded_as_not_started(tmp_path):
    """The rank ends its worker (a stop past its grace) while a step still waits for the gpu pool:
    the step never ran, and was recorded "interrupted", which a stopped run's summary shows as
    FAILED. It is now "not started", as a step the stop kept from starting (one ended while it
    runs stays "interrupted": test_pipeline_cli's SIGTERM test)."""
    from common.pipeline.flow import STOPPING

    def ended_while_waiting(pool, count, timeout):
        raise KeyboardInterrupt  # what the worker's end raises in the middle of the wait

    runner, layout = run_pipeline(tmp_path, {"name": "p", "steps": [
        {"id": "train", "resources": ["gpu"], "command": "touch $PIPELINE_SHARED/ran"}]}, acquire=ended_while_waiting)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert not (layout.shared / "ran").exists()
    status = json.loads(layout.status_path("train").read_text())
    assert status["reason"] == STOPPING and [h["reason"] for h in status["history"]] == [STOPPING], status


def test_costs_that_add_past_the_largest_float_stay_a_number_json_holds(tmp_path):
    """Two reported costs of 1e308 made inf, written as Infinity into status.json and the result,
    which strict JSON readers (jq, a browser) refuse; the total now stops at the largest float."""
    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text[:200]}"))

    huge = "echo '{\"pipeline_cost\": 1e308}'; echo '{\"pipeline_cost\": 1e308}'"
    runner, layout = run_pipeline(tmp_path, {"name": "p", "budget": 1, "steps": [
        {"id": "a", "command": huge}, {"id": "b", "command": huge}]})
    result = runner.run()
    assert result["status"] == "failed" and result["cost"] == sys.float_info.max, result
    assert strict(layout.status_path("a").read_text())["cost"] == sys.float_info.max
    assert strict(json.dumps(result))["cost"] == sys.float_info.max
