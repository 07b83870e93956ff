"""``python -m common.pipeline`` through the engine: the shipped example on digits, resource pools
that serialise or overlap GPU steps, resume from a step, and pipelines over 2 ranks x 2 workers."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from common.pipeline import proctree
from helpers import (
    REPO,
    alive,
    assert_usage_error,
    journal_entries,
    pipeline_cli,
    pipeline_command,
    rank_pids,
    read_summary,
    run,
    snapshot,
    start,
    wait_until,
    write_json,
)

EXAMPLE = REPO / "examples" / "pipelines" / "ml.json"
TINY = {"EPOCHS": "2", "N_CONV_LAYER": "4", "N_HIDDEN_LAYER": "32"}


pytestmark = pytest.mark.usefixtures("private_node_slots")


def start_pipeline(definition: Path, results: Path, *extra: str):
    """The pipeline CLI in the background, on CPU (to signal it while it runs)."""
    return start(pipeline_command(definition, results, *extra))


def step_status(results: Path, run_id: str, step: str) -> dict:
    return json.loads((results / run_id / step / "status.json").read_text())


def tiny_example(name: str, **train_env) -> dict:
    """The shipped example with tiny epochs (and optional changes to train's settings)."""
    data = json.loads(EXAMPLE.read_text())
    data["name"] = name
    for step in data["steps"]:
        if step["id"].startswith("train"):
            step["env"].update(TINY)
    data["steps"][0]["env"].update(train_env)
    return data


def test_the_shipped_example_end_to_end_with_its_fallbacks(tmp_path):
    shutil.copytree(EXAMPLE.parent / "ml_steps", tmp_path / "ml_steps")  # beside the definition, as shipped
    good = tiny_example("good")
    diverges = tiny_example("diverges", LEARNING_RATE="50")  # loss becomes NaN: train-retry takes over
    bad_eval = tiny_example("bad-eval")
    bad_eval["steps"][2]["env"]["DATASET"] = "no-such-dataset"  # evaluation fails: the report explains
    definition = write_json(tmp_path / "ml.json", {"pipelines": [good, diverges, bad_eval]})
    results = tmp_path / "results"
    proc = pipeline_cli(definition, results, "--workers", "2", "--retries", "0")
    assert proc.returncode == 1, proc.stderr  # bad-eval failed
    runs = read_summary(results)["pipelines"]
    assert {name: run["status"] for name, run in runs.items()} == {"good": "ok", "diverges": "ok", "bad-eval": "failed"}
    assert [f["key"] for f in read_summary(results)["failed_items"]] == ["bad-eval"]

    shared = results / "good" / "shared"
    state = torch.load(shared / "checkpoints" / "model_final.pt", weights_only=True)
    assert state["conv.weight"].shape[0] == 4
    training = json.loads((shared / "training_metrics.json").read_text())
    assert len(training["loss_per_epoch"]) == 2 and training["val_accuracy"] > 0.5
    metrics = json.loads((shared / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.5 and metrics["n_test"] == 450
    assert len(metrics["precision"]) == len(metrics["recall"]) == len(metrics["f1"]) == 10
    assert len(metrics["confusion_matrix"]) == 10 and sum(map(sum, metrics["confusion_matrix"])) == 450
    assert "Confusion matrix" in (shared / "eval_report.md").read_text()
    assert "test accuracy" in (shared / "report.md").read_text()
    assert {s: v["status"] for s, v in runs["good"]["steps"].items()} == {
        "train": "ok", "train-retry": "skipped", "evaluate": "ok", "report": "ok"}

    assert {s: v["status"] for s, v in runs["diverges"]["steps"].items()} == {
        "train": "failed", "train-retry": "ok", "evaluate": "ok", "report": "ok"}
    assert "diverged" in (results / "diverges" / "train" / "stderr.log").read_text()
    report = (results / "diverges" / "shared" / "report.md").read_text()
    assert "`train-retry` trained the model instead" in report

    assert {s: v["status"] for s, v in runs["bad-eval"]["steps"].items()} == {
        "train": "ok", "train-retry": "skipped", "evaluate": "failed", "report": "failed"}
    report = (results / "bad-eval" / "shared" / "report.md").read_text()
    assert "What went wrong" in report and "no-such-dataset" in report

    markdown = (results / "summary.md").read_text()
    assert "| pipeline | status | train | train-retry | evaluate | report |" in markdown
    assert "| diverges | ok | FAILED" in markdown


def test_a_resume_with_another_seed_or_threads_is_refused(tmp_path):
    """The engine fingerprints its own arguments for every app: a pipelines run resumed under
    another --seed (or --threads) would finish with mixed seeds."""
    definition = write_json(tmp_path / "p.json", {"name": "exp", "steps": [{"id": "a", "command": "echo $PIPELINE_SEED"}]})
    results = tmp_path / "results"
    first = pipeline_cli(definition, results, "--seed", "1")
    assert first.returncode == 0, first.stderr
    journal = (results / "journal.jsonl").read_bytes()
    for extra in (["--seed", "2"], ["--seed", "1", "--threads", "2"]):
        again = run(["-m", "common.pipeline", str(definition), "--results", str(results), "--gpu", "cpu",
                     "--threads", "1", "--no-progress", "--resume", *extra])
        assert again.returncode == 2 and len(again.stderr.splitlines()) == 1, again.stderr
        assert "other arguments" in again.stderr and extra[-2].lstrip("-") in again.stderr, again.stderr
    assert (results / "journal.jsonl").read_bytes() == journal
    assert pipeline_cli(definition, results, "--seed", "1", "--resume").returncode == 0


def sleepers(count: int, seconds: float, gpu: bool = True) -> dict:
    return {"pipelines": [{"name": f"p{i}", "steps": [{"id": "hold", "gpu": gpu, "command": f"sleep {seconds}"}]}
                          for i in range(count)]}


def intervals(results: Path, count: int) -> list:
    return sorted((s["started"], s["ended"]) for s in (step_status(results, f"p{i}", "hold") for i in range(count)))


def test_gpu_pool_of_capacity_1_serialises_gpu_steps_and_2_lets_them_overlap(tmp_path):
    definition = write_json(tmp_path / "two.json", sleepers(2, 1.5))
    one = pipeline_cli(definition, tmp_path / "one", "--workers", "2", "--resource", "gpu=1")
    assert one.returncode == 0, one.stderr
    (a_start, a_end), (b_start, b_end) = intervals(tmp_path / "one", 2)
    assert b_start >= a_end, "capacity 1: the second GPU step must start after the first ended"
    queued = [step_status(tmp_path / "one", f"p{i}", "hold")["queued_seconds"] for i in range(2)]
    assert max(queued) > 1.0  # the waiting was queueing, not part of the step's time
    two = pipeline_cli(definition, tmp_path / "two", "--workers", "2", "--resource", "gpu=2")
    assert two.returncode == 0, two.stderr
    (a_start, a_end), (b_start, b_end) = intervals(tmp_path / "two", 2)
    assert b_start < a_end, "capacity 2: both GPU steps run at once"


def test_a_step_that_waits_longer_than_the_queue_timeout_fails(tmp_path):
    definition = write_json(tmp_path / "two.json", {"pipelines": [
        {"name": f"p{i}", "steps": [{"id": "hold", "resources": ["licence"], "command": "sleep 3"}]} for i in range(2)]})
    results = tmp_path / "r"
    proc = pipeline_cli(definition, results, "--workers", "2", "--retries", "0", "--resource", "licence=1",
                        "--queue-timeout", "0.5")
    assert proc.returncode == 1, proc.stderr
    states = sorted(step_status(results, f"p{i}", "hold")["status"] for i in range(2))
    assert states == ["failed", "ok"]
    waited = [step_status(results, f"p{i}", "hold") for i in range(2)]
    reason = [s["reason"] for s in waited if s["status"] == "failed"][0]
    assert "queue timeout 0.5 s while waiting for pool 'licence'" in reason


def test_resume_from_a_step_skips_earlier_steps_and_sees_their_shared_files(tmp_path):
    flag = tmp_path / "fixed"
    definition = write_json(tmp_path / "p.json", {"name": "exp", "steps": [
        {"id": "prepare", "command": "echo $$ >> $PIPELINE_SHARED/prepared.txt"},
        {"id": "train", "command": f"test -e {flag} && cp $PIPELINE_SHARED/prepared.txt $PIPELINE_SHARED/trained.txt"},
        {"id": "report", "command": "cat $PIPELINE_SHARED/trained.txt"}]})
    results = tmp_path / "results"
    first = pipeline_cli(definition, results, "--retries", "0")
    assert first.returncode == 1, first.stderr
    assert step_status(results, "exp", "train")["status"] == "failed"
    prepared = (results / "exp" / "shared" / "prepared.txt").read_text()
    prepare_status = step_status(results, "exp", "prepare")

    # from train again, failing again: the summary marks prepare, which it kept, as the earlier run's
    again = pipeline_cli(definition, results, "--resume", "exp/train", "--retries", "0")
    assert again.returncode == 1, again.stderr
    failed = read_summary(results)["pipelines"]["exp"]
    assert failed["status"] == "failed" and failed["steps"]["prepare"]["previous_run"] is True, failed
    assert "previous_run" not in failed["steps"]["train"], failed
    row = next(line for line in (results / "summary.md").read_text().splitlines() if line.startswith("| exp |"))
    assert row.split(" | ")[2].endswith("(earlier run)") and "(earlier run)" not in row.split(" | ")[3], row

    flag.touch()
    second = pipeline_cli(definition, results, "--resume", "exp/train")
    assert second.returncode == 0, second.stderr
    assert (results / "exp" / "shared" / "prepared.txt").read_text() == prepared  # prepare did not run again
    assert step_status(results, "exp", "prepare") == prepare_status
    assert (results / "exp" / "shared" / "trained.txt").read_text() == prepared
    assert step_status(results, "exp", "report")["status"] == "ok"
    run_summary = read_summary(results)["pipelines"]["exp"]
    assert run_summary["status"] == "ok" and run_summary["resumed_from"] == "train"
    assert run_summary["steps"]["prepare"]["previous_run"] is True

    # Plain --resume now skips the pipeline: it finished (through the resume).
    third = pipeline_cli(definition, results, "--resume")
    assert third.returncode == 0, third.stderr
    assert read_summary(results)["items_this_run"] == 0
    assert (results / "exp" / "shared" / "prepared.txt").read_text() == prepared


def test_four_pipelines_over_two_ranks_by_two_workers(tmp_path):
    definition = write_json(tmp_path / "four.json", {"pipelines": [
        {"name": f"p{i}", "steps": [
            {"id": "train", "gpu": True, "command": "sleep 1.5; echo $PIPELINE_RUN_ID > $PIPELINE_SHARED/model.txt"},
            {"id": "evaluate", "command": "cp $PIPELINE_SHARED/model.txt $PIPELINE_SHARED/metrics.txt"}]}
        for i in range(4)]})
    results = tmp_path / "results"
    proc = pipeline_cli(definition, results, "--workers", "2", ranks=2)
    assert proc.returncode == 0, proc.stderr
    runs = read_summary(results)["pipelines"]
    assert sorted(runs) == ["p0", "p1", "p2", "p3"] and all(r["status"] == "ok" for r in runs.values())
    for i in range(4):
        assert (results / f"p{i}" / "shared" / "metrics.txt").read_text() == f"p{i}\n"
    ranks = {e["rank"] for e in journal_entries(results) if e.get("type") == "result"}
    assert ranks == {0, 1}
    assert [len(rank["devices"]) for rank in read_summary(results)["workers"]] == [2, 2]


def test_sigterm_stops_the_run_and_ends_the_running_step_with_its_children(tmp_path):
    # The step and its child ignore SIGTERM: only the SIGKILL after the step's kill grace (5 s)
    # ends them, still before the engine kills the worker (10 s), so the status gets written.
    definition = write_json(tmp_path / "long.json", {"pipelines": [
        {"name": "long", "steps": [
            {"id": "hold", "command": "trap '' TERM; sleep 300 & echo $! > $PIPELINE_SHARED/child.pid; wait"}]},
        {"name": "quick", "steps": [{"id": "q", "command": "true"}]}]})
    results = tmp_path / "results"
    process = start_pipeline(definition, results, "--grace", "1", "--workers", "2")
    child_file = results / "long" / "shared" / "child.pid"
    wait_until(lambda: child_file.exists() and child_file.read_text().strip())
    assert wait_until(lambda: (results / "quick" / "q" / "status.json").exists(), 60)  # the other one ran
    child = int(child_file.read_text())
    os.kill(rank_pids(results)[0], signal.SIGTERM)
    stopped = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    assert time.monotonic() - stopped < 30
    assert "--resume" in err
    assert wait_until(lambda: not alive(child), 5), f"the step's child {child} outlived the stopped run"
    status = step_status(results, "long", "hold")
    assert status["reason"] == "interrupted: the run was stopped"
    # the attempt the stop cut short is in the step's history, which a resume then adds to
    assert [(h["status"], h["reason"]) for h in status["history"]] == [("failed", "interrupted: the run was stopped")]
    # the summary's table: the step the stop cut short is stopped, not failed (no step failed for the stop)
    shown = read_summary(results)["pipelines"]["long"]
    assert shown["status"] == "stopped" and shown["steps"]["hold"]["status"] == "stopped", shown
    assert "| long | stopped | stopped " in (results / "summary.md").read_text()
    # a later run of the other pipeline alone lists this one as its earlier run left it: stopped, not failed
    again = pipeline_cli(definition, results, "--resume", "quick/q")
    assert again.returncode == 0, again.stderr
    shown = read_summary(results)["pipelines"]["long"]
    assert shown["status"] == "unfinished" and shown["steps"]["hold"]["status"] == "stopped", shown


def test_a_pipeline_cut_off_in_a_slurm_job_is_requeued_not_said_to_have_made_no_progress(tmp_path, monkeypatch):
    """A run that finished no item, its items cut off, exits 76 in a Slurm job (not requeued): a
    requeue would cut them off again. Not a pipeline run: its first step may have finished, and
    the next start goes on from the second, so it exits 75 and is requeued."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    definition = write_json(tmp_path / "two.json", {"name": "two", "steps": [
        {"id": "first", "command": "true"},
        {"id": "second", "command": "touch $PIPELINE_SHARED/started; sleep 60"}]})
    results = tmp_path / "results"
    process = start_pipeline(definition, results, "--grace", "0.5")
    assert wait_until((results / "two" / "shared" / "started").exists), "the second step did not start"
    os.kill(rank_pids(results)[0], signal.SIGUSR1)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    assert "none finished in this run's" not in err, err


def test_slurms_walltime_warning_to_every_process_lets_the_running_step_finish(tmp_path):
    """Slurm signals every process of a job step: the rank, its workers and the steps they run.
    A step must live through its --grace, not die of the USR1 meant for the rank."""
    definition = write_json(tmp_path / "warned.json", {"name": "warned", "steps": [
        {"id": "work", "command": "touch $PIPELINE_SHARED/started; sleep 3; echo ok > $PIPELINE_SHARED/done"}]})
    results = tmp_path / "results"
    process = start_pipeline(definition, results, "--grace", "60")
    assert wait_until((results / "warned" / "shared" / "started").exists), "the step did not start"
    everyone = [info.pid for info in proctree.members(rank_pids(results)[0])] + [rank_pids(results)[0]]
    for pid in set(everyone):  # what slurmstepd does with a signal for the step
        with contextlib.suppress(ProcessLookupError):  # the step's `touch`, listed while it exited
            os.kill(pid, signal.SIGUSR1)
    out, err = process.communicate(timeout=60)
    assert process.returncode in (0, 75), err
    assert step_status(results, "warned", "work")["status"] == "ok", err
    assert (results / "warned" / "shared" / "done").read_text() == "ok\n"


def test_a_stopped_run_says_in_its_summary_where_each_pipeline_stands(tmp_path):
    """Stopped (walltime, a signal), the summary lists every pipeline: the one whose next step the
    stop kept from starting is "stopped" with its done step, the others "not started"; none of
    them "failed". The resume then finishes all of them."""
    definition = write_json(tmp_path / "three.json", {"name": "p", "matrix": {"n": ["0", "1", "2"]}, "steps": [
        {"id": "first", "command": "touch $PIPELINE_SHARED/started; sleep 3"}, {"id": "second", "command": "true"}]})
    results = tmp_path / "results"
    process = start_pipeline(definition, results, "--workers", "1", "--threads", "1")
    assert wait_until(lambda: any(results.glob("p-n*/shared/started"))), "no step started"
    os.kill(rank_pids(results)[0], signal.SIGUSR1)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    runs = read_summary(results)["pipelines"]
    running = next(path.parent.parent.name for path in results.glob("p-n*/shared/started"))
    assert {name: run["status"] for name, run in runs.items()} == {
        name: "stopped" if name == running else "not started" for name in ("p-n0", "p-n1", "p-n2")}, runs
    assert {step: status["status"] for step, status in runs[running]["steps"].items()} == {
        "first": "ok", "second": "missing"}
    assert runs[running]["reason"] == "" and read_summary(results)["failed_items"] == []
    markdown = (results / "summary.md").read_text()
    assert f"| {running} | stopped | ok " in markdown and "| not started | - | - |" in markdown, markdown
    assert "why it failed" not in markdown, markdown
    resumed = pipeline_cli(definition, results, "--workers", "1", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert {run["status"] for run in read_summary(results)["pipelines"].values()} == {"ok"}


@pytest.mark.parametrize("damage", [b"\x00\xff garbage", b"[]", b'{"state": "failed", "resume_at": "zz"}'],
                         ids=["bytes", "a-list", "no-such-step"])
def test_a_damaged_progress_file_is_refused_instead_of_starting_the_pipeline_again(tmp_path, damage):
    """progress.json says where a plain --resume goes on; damaged, the pipeline silently ran again
    from its first step and set its shared/ aside. Now one line naming the file and the ways on."""
    definition = write_json(tmp_path / "f.json", {"name": "f", "steps": [
        {"id": "a", "command": "echo a > $PIPELINE_SHARED/a"}, {"id": "b", "command": "exit 3"}]})
    results = tmp_path / "results"
    assert pipeline_cli(definition, results).returncode == 1
    (results / "f" / "progress.json").write_bytes(damage)
    before = snapshot(results)
    assert_usage_error(pipeline_cli(definition, results, "--resume"), "progress.json", "cannot say where to go on",
                       "--resume f/STEP", "remove the file")
    assert snapshot(results) == before


@pytest.mark.parametrize("edit", [{"history": "x"}, {"attempts": "many"}, {"attempts": None}, {"seconds": "slow"},
                                  {"cost": "lots", "output": "x"}],
                         ids=["not-a-status", "attempts", "attempts-null", "seconds", "cost"])
def test_a_damaged_step_status_counts_as_not_run_and_the_summary_is_still_written(tmp_path, edit):
    """A status.json that is no step status (edited by hand) made the report fail with a KeyError
    and a "failed" summary; one with a field of the wrong type made it, and every later --resume,
    end in a traceback. The step now counts as not run."""
    definition = write_json(tmp_path / "f.json", {"name": "f", "steps": [
        {"id": "a", "command": "true"}, {"id": "b", "command": "exit 3"}]})
    results = tmp_path / "results"
    assert pipeline_cli(definition, results).returncode == 1
    status = results / "f" / "a" / "status.json"
    status.write_text(json.dumps(edit if "history" in edit else {**json.loads(status.read_text()), **edit}))
    again = pipeline_cli(definition, results, "--resume")  # goes on at b, which fails again
    assert again.returncode == 1 and "writing the outputs failed" not in again.stderr, again.stderr
    steps = read_summary(results)["pipelines"]["f"]["steps"]
    assert steps["a"]["status"] == "missing" and steps["b"]["status"] == "failed", steps


def test_the_summary_shows_every_pipeline_with_its_newest_run(tmp_path):
    definition = write_json(tmp_path / "two.json", {"pipelines": [
        {"name": name, "steps": [{"id": "prepare", "command": "true"}, {"id": "work", "command": "true"}]}
        for name in ("a", "b")]})
    results = tmp_path / "results"
    assert pipeline_cli(definition, results).returncode == 0
    resumed = pipeline_cli(definition, results, "--resume", "a/work")
    assert resumed.returncode == 0, resumed.stderr
    runs = read_summary(results)["pipelines"]
    assert sorted(runs) == ["a", "b"] and runs["a"]["resumed_from"] == "work" and runs["b"]["status"] == "ok"
    assert "| b | ok |" in (results / "summary.md").read_text()
    again = pipeline_cli(definition, results, "--resume")
    assert again.returncode == 0, again.stderr
    assert read_summary(results)["items_this_run"] == 0
    runs = read_summary(results)["pipelines"]
    assert runs["a"]["resumed_from"] == "work", "the newer record, from the resume, is the one that counts"
    assert runs["b"]["resumed_from"] is None


def test_a_plain_resume_after_a_failed_resume_from_a_step_goes_on_from_it(tmp_path):
    """A complete run, then --resume p/check fails: a plain --resume said "complete" (exit 0) and
    showed every step ok, from the journal's older record, while check/status.json said failed. Now
    the pipeline counts as unfinished, goes on from the failed step and ends with its real outcome;
    PIPELINE_SEED stays the pipeline's (from --seed and its name) whichever step a run starts from."""
    flag = tmp_path / "fail-check"
    definition = write_json(tmp_path / "p.json", {"name": "p", "steps": [
        {"id": "make", "command": f'echo "$PIPELINE_SEED" > {tmp_path}/seed-make'},
        {"id": "check", "command": f'echo "$PIPELINE_SEED" >> {tmp_path}/seed-check; test ! -e {flag} && '
                                   f'echo checked > "$PIPELINE_RUN_DIR/check/output.md"'}]})
    results = tmp_path / "results"
    assert pipeline_cli(definition, results).returncode == 0
    flag.write_text("")
    failed = pipeline_cli(definition, results, "--resume", "p/check")
    assert failed.returncode == 1, failed.stderr
    # the output.md of the run before is not the failed step's (it was listed as if it were)
    assert read_summary(results)["pipelines"]["p"]["steps"]["check"].get("output") is None
    assert "p/check/output.md" not in (results / "summary.md").read_text()
    planned = pipeline_cli(definition, results, "--resume", "--dry-run")  # says what the resume then does
    assert planned.returncode == 0 and "--resume goes on at step 'check'" in planned.stdout, planned.stdout
    again = pipeline_cli(definition, results, "--resume")  # the flag still there: check fails again
    closing = next(line for line in reversed(again.stderr.splitlines())
                   if line.startswith(("pipeline: complete: ", "pipeline: failed: ", "pipeline: stopped")))
    assert again.returncode == 1 and closing.startswith("pipeline: failed: "), again.stderr
    assert read_summary(results)["pipelines"]["p"]["status"] == "failed", read_summary(results)["pipelines"]["p"]
    assert "| p | failed |" in (results / "summary.md").read_text()
    flag.unlink()
    fixed = pipeline_cli(definition, results, "--resume")
    assert fixed.returncode == 0, fixed.stderr
    runs = read_summary(results)["pipelines"]["p"]
    assert runs["status"] == "ok" and runs["resumed_from"] == "check", runs
    assert runs["steps"]["check"]["output"] == "p/check/output.md"  # written again by this attempt
    assert read_summary(results)["items_this_run"] == 1
    assert pipeline_cli(definition, results, "--resume").returncode == 0  # finished now: nothing runs
    assert read_summary(results)["items_this_run"] == 0
    seeds = (tmp_path / "seed-check").read_text().split()
    assert len(seeds) == 4 and len(set(seeds)) == 1, seeds
    assert seeds[0] == (tmp_path / "seed-make").read_text().strip()


def test_a_stopped_resume_from_a_step_says_a_command_that_finishes_it(tmp_path):
    """Its finish command kept the target after dropping --resume ("... p/work --grace 1 --resume"),
    which the parser refuses as an unknown positional argument. Now it is the plain --resume, which
    goes on from the step the stop left, and finishes the pipeline."""
    definition = write_json(tmp_path / "p.json", {"name": "p", "steps": [
        {"id": "make", "command": "true"},
        # long only while the file 'hold' is there: the stop always finds it running, the other runs pass quickly
        {"id": "work", "command": f"touch {tmp_path}/started; if [ -e {tmp_path}/hold ]; then sleep 60; fi"},
        {"id": "last", "command": "true"}]})
    results = tmp_path / "results"
    assert pipeline_cli(definition, results).returncode == 0
    (tmp_path / "started").unlink()
    (tmp_path / "hold").touch()
    process = start_pipeline(definition, results, "--resume", "p/work", "--grace", "0")
    assert wait_until(lambda: (tmp_path / "started").exists()), "the step did not start"
    os.kill(rank_pids(results)[0], signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    command = read_summary(results)["resume_command"]
    assert command.endswith(" --grace 0 --resume") and "p/work" not in command, command
    assert command in err, err
    words = command.split()
    assert words[:3] == ["python", "-m", "common.pipeline"], command
    (tmp_path / "hold").unlink()
    finished = run(words[1:], timeout=120)
    assert finished.returncode == 0, finished.stderr
    runs = read_summary(results)["pipelines"]["p"]
    assert runs["status"] == "ok" and runs["resumed_from"] == "work", runs


def test_a_failed_pipeline_still_reports_what_its_steps_cost(tmp_path):
    """A pipeline failed by its budget (or by a step) had no cost in summary.json and no "Reported
    costs" line, the one case where the cost is the reason; it is what its steps reported."""
    spend = "echo '{\"pipeline_cost\": 0.6}'"
    definition = write_json(tmp_path / "p.json", {"name": "p", "budget": 1, "steps": [
        {"id": "a", "command": spend}, {"id": "b", "command": spend}, {"id": "c", "command": "true"}]})
    results = tmp_path / "results"
    ran = pipeline_cli(definition, results)
    assert ran.returncode == 1, ran.stderr
    failed = read_summary(results)["pipelines"]["p"]
    assert failed["status"] == "failed" and failed["reason"] == "budget 1 passed: the steps reported 1.2", failed
    assert failed["cost"] == 1.2 and failed["budget"] == 1, failed
    assert "Reported costs: p 1.2 (**over its budget of 1**)" in (results / "summary.md").read_text()
    # the pipeline's outcome, not a bug: its message, without a traceback of the runner's own frames
    (attempt,) = [e for e in journal_entries(results) if e["type"] == "attempt_failed"]
    assert attempt["traceback"] == "PipelineFailed: pipeline p: budget 1 passed: the steps reported 1.2\n", attempt
    report = (results / "report.html").read_text()
    assert "budget 1 passed" in report and "Traceback (most recent call last)" not in report, report
    # the --resume it offers counts what the steps spent: it would fail again at once, unless the budget is raised
    note = f'pipeline p: the steps before c, where a --resume goes on, spent 1.2 of its budget of 1; a --resume ' \
           f'counts that and would fail again at once: raise "budget" in {definition} first'
    assert f"pipeline: {note}\npipeline: run the failed items again" in ran.stderr, ran.stderr
    assert f"1 item failed. A plain resume would not do for some: {note}. Then run it again with:" \
        in (results / "summary.md").read_text()
    assert read_summary(results)["retry_notes"] == [note]
    again = pipeline_cli(definition, results, "--resume")
    assert again.returncode == 1 and note in again.stderr, again.stderr
    write_json(definition, {"name": "p", "budget": 2, "steps": [
        {"id": "a", "command": spend}, {"id": "b", "command": spend}, {"id": "c", "command": "true"}]})
    raised = pipeline_cli(definition, results, "--resume")
    assert raised.returncode == 0 and "budget" not in raised.stderr, raised.stderr
    resumed = read_summary(results)["pipelines"]["p"]
    assert resumed["status"] == "ok" and resumed["resumed_from"] == "c" and resumed["cost"] == 1.2, resumed
    # over the budget by the failed step's own cost: the resume runs that step anew, without it: no note
    other = write_json(tmp_path / "q.json", {"name": "q", "budget": 1, "steps": [
        {"id": "a", "command": "echo '{\"pipeline_cost\": 0.2}'"},
        {"id": "b", "command": "echo '{\"pipeline_cost\": 0.9}'; exit 1"}]})
    failed_step = pipeline_cli(other, tmp_path / "q")
    assert failed_step.returncode == 1 and "budget" not in failed_step.stderr, failed_step.stderr
    assert read_summary(tmp_path / "q")["retry_notes"] == []


def test_a_retry_that_fails_before_its_walk_begins_is_told_by_its_own_error(tmp_path):
    """The runner of a retried pipeline can fail before it first writes progress.json (here: its
    step left a dangling link where shared/ goes, and the retry cannot make the folder): the file
    still holds the first attempt's "failed" reason, and the summary must give the retry's own
    error, not that stale reason."""
    definition = write_json(tmp_path / "p.json", {"name": "p", "steps": [
        {"id": "a", "command": 'rm -rf "$PIPELINE_SHARED" && ln -s /nonexistent "$PIPELINE_SHARED"; exit 1'}]})
    results = tmp_path / "results"
    ran = pipeline_cli(definition, results, "--retries", "1")
    assert ran.returncode == 1, ran.stderr
    progress = json.loads((results / "p" / "progress.json").read_text())
    assert progress["state"] == "failed" and progress["reason"] == "step 'a' failed: exit code 1", progress  # stale
    failed = read_summary(results)["pipelines"]["p"]
    assert failed["status"] == "failed", failed
    assert failed["reason"].startswith("FileExistsError: ") and "shared" in failed["reason"], failed


def test_a_failure_handled_before_the_one_a_pipeline_failed_at_is_named_with_its_resume(tmp_path):
    """The shipped example with its evaluation failing: evaluate goes on to report (on_fail), which
    fails for it, and summary.md gave only report's error, while a plain --resume goes on at report
    and fails the same way. The handled failure before it is named, with the --resume that runs it."""
    definition = write_json(tmp_path / "ml.json", {"name": "ml", "steps": [
        {"id": "train", "command": "true"},
        {"id": "evaluate", "command": "echo checkpoint corrupt >&2; exit 1", "on_fail": "report"},
        {"id": "report", "command": "sleep 1; echo evaluation failed >&2; exit 1"}]})
    results = tmp_path / "results"
    failed = pipeline_cli(definition, results)
    assert failed.returncode == 1, failed.stderr
    runs = read_summary(results)["pipelines"]
    assert runs["ml"]["status"] == "failed" and runs["ml"]["resume_at"] == "report", runs
    markdown = (results / "summary.md").read_text()
    assert "failed along the way (their pipeline went on): ml/evaluate" in markdown, markdown
    assert "add `--resume ml/evaluate` (that step and those after it)" in markdown, markdown
    # the failed pipeline's time, though it gave no result: "item time: 0.0 s" said none ran
    lost = read_summary(results)["attempt_seconds_without_result"]
    assert lost >= 1.0, lost
    assert f"; attempts that failed or were stopped: {lost:.1f} s more\n" in markdown, markdown
    again = pipeline_cli(definition, results, "--resume", "ml/evaluate", "--dry-run")
    assert again.returncode == 0 and "evaluate" in again.stdout, again.stdout + again.stderr
