"""Walking one pipeline with real subprocesses: fallbacks, conditions, retries, loops, timeouts that
kill a step's children, memory limits, deadlines, the step environment and apptainer wrapping."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.pipeline.definition import parse_definition
from common.pipeline.flow import PipelineRunner, RunLayout
from helpers import alive


def run_pipeline(tmp_path: Path, steps, start=None, gpu=None, **fields):
    [pipeline] = parse_definition({"name": fields.pop("name", "p"), "steps": steps, **fields})
    layout = RunLayout(tmp_path / "results", pipeline.name)
    return PipelineRunner(pipeline, layout, gpu=gpu).run(start), layout


def statuses(result):
    return {step: status["status"] for step, status in result["steps"].items()}


# A step that fails its first N-1 runs and succeeds on run N (the count lives in shared/).
def flaky(succeed_on: int) -> str:
    return ('n=$(cat "$PIPELINE_SHARED/count" 2>/dev/null || echo 0); n=$((n + 1)); '
            f'echo $n > "$PIPELINE_SHARED/count"; echo "run $n"; [ $n -ge {succeed_on} ]')


def test_a_failing_step_runs_its_on_fail_and_conditions_hold(tmp_path):
    result, layout = run_pipeline(tmp_path, [
        {"id": "train", "command": "echo weights > $PIPELINE_SHARED/w.txt; echo 'out of memory' >&2; exit 7",
         "on_fail": "train-retry"},
        {"id": "train-retry", "command": "echo small-batch > $PIPELINE_SHARED/w.txt", "condition": "prev.error"},
        {"id": "cleanup-on-error", "command": "true", "condition": "prev.error"},
        {"id": "evaluate", "command": "cat $PIPELINE_SHARED/w.txt > $PIPELINE_SHARED/metrics.txt"},
        {"id": "only-if-ok", "command": "true", "condition": "prev.ok"},
    ])
    assert statuses(result) == {"train": "failed", "train-retry": "ok", "cleanup-on-error": "skipped",
                                "evaluate": "ok", "only-if-ok": "ok"}
    assert result["status"] == "ok" and result["order"] == ["train", "train-retry", "evaluate", "only-if-ok"]
    assert (layout.shared / "metrics.txt").read_text() == "small-batch\n"
    train = json.loads(layout.status_path("train").read_text())
    assert (train["status"], train["exit_code"], train["attempts"], train["reason"]) == ("failed", 7, 1, "exit code 7 (stderr: out of memory)")
    assert "out of memory" in (layout.step_dir("train") / "stderr.log").read_text()
    for step in ("train", "train-retry", "cleanup-on-error", "evaluate", "only-if-ok"):
        status = json.loads(layout.status_path(step).read_text())
        assert set(status) >= {"status", "exit_code", "attempts", "started", "ended", "gpu"}
    skipped = json.loads(layout.status_path("cleanup-on-error").read_text())
    assert skipped["status"] == "skipped" and "prev.error" in skipped["reason"]


def test_a_failed_attempts_reason_gives_the_last_line_it_wrote_to_stderr_not_an_earlier_ones(tmp_path):
    """apptainer's "FATAL: ..." or a traceback's error, in summary.md without opening stderr.log;
    a retry that says nothing is not given the first attempt's words."""
    step = ('n=$(cat "$PIPELINE_SHARED/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$PIPELINE_SHARED/n"; '
            'if [ $n = 0 ]; then printf "Traceback\\n  line\\nValueError: bad batch\\n\\n" >&2; exit 1; fi; exit 2')
    result, layout = run_pipeline(tmp_path, [{"id": "train", "command": step, "max_retries": 1}])
    assert result["reason"] == "step 'train' failed: exit code 2"
    history = json.loads(layout.status_path("train").read_text())["history"]
    assert [attempt["reason"] for attempt in history] == ["exit code 1 (stderr: ValueError: bad batch)", "exit code 2"]


def test_a_reason_keeps_no_terminal_codes_and_a_timeout_gets_the_stderr_line_too(tmp_path):
    """Colours, a NUL and a trailing colour reset are not text for summary.md or a terminal line."""
    coloured = r"printf '\033[31mFATAL:\033[0m bad\000 input\n\033[0m\n' >&2; exit 3"
    slow = "echo 'epoch 3 of 10' >&2; sleep 30"
    result, layout = run_pipeline(tmp_path, [{"id": "a", "command": coloured, "on_fail": "b"},
                                             {"id": "b", "command": slow, "timeout": 0.5}])
    assert result["steps"]["a"]["reason"] == "exit code 3 (stderr: FATAL: bad input)"
    assert result["steps"]["b"]["reason"] == "timeout after 0.5 s (stderr: epoch 3 of 10)"


def test_a_failure_without_on_fail_fails_the_pipeline_and_only_error_steps_run(tmp_path):
    result, layout = run_pipeline(tmp_path, [
        {"id": "train", "command": "exit 1"},
        {"id": "evaluate", "command": "touch $PIPELINE_SHARED/evaluated"},
        {"id": "notify", "command": "echo failed > $PIPELINE_SHARED/notified", "condition": "prev.error"},
        {"id": "report", "command": "true"},
    ])
    assert result["status"] == "failed" and "step 'train' failed: exit code 1" in result["reason"]
    assert statuses(result) == {"train": "failed", "evaluate": "skipped", "notify": "ok", "report": "skipped"}
    assert not (layout.shared / "evaluated").exists() and (layout.shared / "notified").exists()


def test_retries_in_place_until_success_or_max_retries(tmp_path):
    ok, layout = run_pipeline(tmp_path, [{"id": "flaky", "command": flaky(3), "max_retries": 2}], name="ok")
    assert statuses(ok) == {"flaky": "ok"} and ok["steps"]["flaky"]["attempts"] == 3
    log = (layout.step_dir("flaky") / "stdout.log").read_text()
    assert "run 1" in log and "----- attempt 3 (" in log and "run 3" in log
    assert [h["status"] for h in ok["steps"]["flaky"]["history"]] == ["failed", "failed", "ok"]
    failed, _ = run_pipeline(tmp_path, [{"id": "flaky", "command": flaky(3), "max_retries": 1}], name="failed")
    assert failed["status"] == "failed" and failed["steps"]["flaky"]["attempts"] == 2


def test_a_bounded_loop_ends_when_its_step_has_used_its_runs(tmp_path):
    result, layout = run_pipeline(tmp_path, [
        {"id": "train", "command": "echo x >> $PIPELINE_SHARED/runs; exit 1", "on_fail": "fix", "max_retries": 2},
        {"id": "fix", "command": "echo fix >> $PIPELINE_SHARED/fixes", "next": "train"},
        {"id": "evaluate", "command": "true"},
    ])
    assert result["status"] == "failed" and "reached again after its 3 runs" in result["reason"]
    assert len((layout.shared / "runs").read_text().split()) == 3
    assert len((layout.shared / "fixes").read_text().split()) == 1
    assert statuses(result)["evaluate"] == "skipped"


def test_a_loop_can_repair_and_continue(tmp_path):
    # fix needs no condition: train's next jumps over it, so only train's on_fail reaches it; and
    # without a condition its max_retries bounds the loop.
    result, layout = run_pipeline(tmp_path, [
        {"id": "train", "command": "test -e $PIPELINE_SHARED/fixed", "on_fail": "fix", "next": "evaluate"},
        {"id": "fix", "command": "touch $PIPELINE_SHARED/fixed", "next": "train", "max_retries": 2},
        {"id": "evaluate", "command": "true"},
    ])
    assert result["status"] == "ok" and result["order"] == ["train", "fix", "train", "evaluate"]
    assert result["steps"]["train"]["attempts"] == 2


def test_a_timeout_kills_the_step_and_its_children(tmp_path):
    began = time.monotonic()
    result, layout = run_pipeline(tmp_path, [
        {"id": "slow", "timeout": 1,
         "command": "sleep 300 & echo $! > $PIPELINE_SHARED/child.pid; "
                    "setsid sleep 301 & echo $! > $PIPELINE_SHARED/escaped.pid; wait"},
        {"id": "after", "command": "true"},
    ])
    assert time.monotonic() - began < 20
    slow = result["steps"]["slow"]
    assert slow["status"] == "timeout" and slow["reason"] == "timeout after 1 s"
    assert 1.0 <= slow["ended"] - slow["started"] < 10
    for name in ("child.pid", "escaped.pid"):
        pid = int((layout.shared / name).read_text())
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), f"{name}: process {pid} outlived its step"
    assert result["status"] == "failed" and statuses(result)["after"] == "skipped"


def test_a_memory_limit_kills_the_step(tmp_path):
    grab = f"{sys.executable} -c \"import time; x = b'1' * (400 * 2 ** 20); time.sleep(60)\""
    began = time.monotonic()
    result, layout = run_pipeline(tmp_path, [{"id": "greedy", "command": grab, "memory": "100m"},
                                             {"id": "modest", "command": "true", "memory": "1g"}])
    assert time.monotonic() - began < 30
    greedy = result["steps"]["greedy"]
    assert greedy["status"] == "failed" and "memory limit 100.0 MiB exceeded" in greedy["reason"]
    assert greedy["max_rss_bytes"] > 100 * 2 ** 20
    assert result["status"] == "failed"


def test_a_step_that_ends_before_its_memory_is_sampled_has_no_peak_figure(tmp_path):
    """``true`` ends before the first look at its memory (all but always): null in its status.json,
    never 0 bytes (a sample on a loaded machine may catch it: then its real size)."""
    result, _ = run_pipeline(tmp_path, [{"id": "quick", "command": "true", "memory": "1g"}])
    peak = result["steps"]["quick"]["max_rss_bytes"]
    assert result["steps"]["quick"]["status"] == "ok" and (peak is None or peak > 0), result


def test_a_passed_deadline_ends_the_running_step_and_skips_the_rest(tmp_path):
    result, layout = run_pipeline(tmp_path, [{"id": "quick", "command": "true"},
                                             {"id": "long", "command": "sleep 60", "timeout": 100},
                                             {"id": "report", "command": "true", "condition": "prev.error"}],
                                  deadline_seconds=1.5)
    assert statuses(result) == {"quick": "ok", "long": "timeout", "report": "skipped"}
    assert result["steps"]["long"]["reason"] == "pipeline deadline passed"
    assert result["status"] == "failed" and "deadline of 1.5 s passed" in result["reason"]
    assert result["seconds"] < 10
    # after a failure it did not handle: the pipeline's reason says both, the steps left the deadline
    result, layout = run_pipeline(tmp_path / "after", [{"id": "a", "command": "exit 1"},
                                                       {"id": "clean", "command": "sleep 60", "condition": "prev.error"},
                                                       {"id": "last", "command": "true"}],
                                  deadline_seconds=1.5)
    assert statuses(result) == {"a": "failed", "clean": "timeout", "last": "skipped"}
    assert result["reason"] == "step 'a' failed: exit code 1; then deadline of 1.5 s passed during step 'clean'"
    assert result["steps"]["last"]["reason"] == "deadline of 1.5 s passed during step 'clean'", result["steps"]["last"]


def test_the_step_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, layout = run_pipeline(tmp_path, [
        {"id": "gpu-step", "gpu": True, "command": "echo \"$CUDA_VISIBLE_DEVICES|$PIPELINE_STEP_ID|$OUT\" > out.txt; "
                                                    "env > $PIPELINE_STEP_DIR/env.txt; pwd -P > cwd.txt",
         "env": {"OUT": "$PIPELINE_SHARED/x"}},
        {"id": "cpu-step", "command": "echo \"[$CUDA_VISIBLE_DEVICES]\" > out.txt"},
        {"id": "py-step", "python": "json:dumps"},
    ], gpu="3")
    shared = layout.shared.resolve()
    # each step runs in its own folder: relative outputs land there, never in the caller's folder
    assert not (tmp_path / "out.txt").exists()
    gpu_dir = layout.step_dir("gpu-step").resolve()
    assert (gpu_dir / "cwd.txt").read_text().strip() == str(gpu_dir)
    assert f"PIPELINE_LAUNCH_DIR={tmp_path.resolve()}" in (gpu_dir / "env.txt").read_text()
    gpu_line = (gpu_dir / "out.txt").read_text().strip()
    assert gpu_line == f"3|gpu-step|{shared}/x"
    assert (layout.step_dir("cpu-step") / "out.txt").read_text().strip() == "[]"
    assert result["steps"]["gpu-step"]["gpu"] == "3" and result["steps"]["cpu-step"]["gpu"] is None
    # json.dumps() without arguments raises: a python step that raises fails with its traceback.
    assert result["steps"]["py-step"]["status"] == "failed"
    assert "TypeError" in (layout.step_dir("py-step") / "stderr.log").read_text()


def test_a_python_step_returns_its_result(tmp_path, monkeypatch):
    module = tmp_path / "my_steps.py"
    module.write_text("import os, pathlib\n"
                      "def train():\n"
                      "    pathlib.Path(os.environ['PIPELINE_SHARED'], 'model.txt').write_text('w')\n"
                      "    return {'loss': 0.5, 'seed': os.environ['PIPELINE_SEED']}\n")
    monkeypatch.chdir(tmp_path)  # python steps import modules of the folder the pipeline was started from
    result, layout = run_pipeline(tmp_path, [{"id": "train", "python": "my_steps:train"}])
    assert result["status"] == "ok", (layout.step_dir("train") / "stderr.log").read_text()
    assert json.loads((layout.step_dir("train") / "result.json").read_text()) == {"loss": 0.5, "seed": "0"}
    assert (layout.shared / "model.txt").read_text() == "w"


def test_resume_from_a_step_keeps_the_earlier_steps(tmp_path):
    steps = [{"id": "prepare", "command": "echo $$ > $PIPELINE_SHARED/data.txt"},
             {"id": "use", "command": "test -e $PIPELINE_SHARED/go && cp $PIPELINE_SHARED/data.txt $PIPELINE_SHARED/used.txt"}]
    first, layout = run_pipeline(tmp_path, steps)
    assert statuses(first) == {"prepare": "ok", "use": "failed"}
    data = (layout.shared / "data.txt").read_text()
    prepared = json.loads(layout.status_path("prepare").read_text())
    (layout.shared / "go").touch()
    second, _ = run_pipeline(tmp_path, steps, start="use")
    assert second["status"] == "ok" and second["order"] == ["use"]
    assert second["steps"]["prepare"]["previous_run"] and second["steps"]["prepare"]["started"] == prepared["started"]
    assert (layout.shared / "data.txt").read_text() == data == (layout.shared / "used.txt").read_text()


@pytest.fixture
def fake_apptainer(tmp_path, monkeypatch):
    """Apptainer cannot be installed here: a stand-in that records its arguments and runs the
    command that follows the image, as ``apptainer exec`` does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apptainer"
    script.write_text("#!/bin/sh\n"
                      "printf '%s\\n' \"$@\" > \"$PIPELINE_STEP_DIR/apptainer-args.txt\"\n"
                      "shift  # exec\n"
                      "while [ $# -gt 0 ]; do\n"
                      "  case \"$1\" in --nv) shift;; --bind) shift 2;; *) shift; break;; esac\n"
                      "done\n"
                      "exec \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PIPELINE_APPTAINER", raising=False)
    return script


def test_container_steps_run_through_apptainer_exec(tmp_path, fake_apptainer):
    image = tmp_path / "torch.sif"
    image.write_bytes(b"not really an image")
    result, layout = run_pipeline(tmp_path, [
        {"id": "train", "gpu": True, "container": str(image), "command": "echo inside > $PIPELINE_SHARED/inside.txt",
         "mounts": [{"host_path": str(tmp_path), "container_path": "/data", "readonly": True},
                    {"host_path": "/scratch", "container_path": "/scratch"}]},
    ], gpu="0")
    assert result["status"] == "ok", (layout.step_dir("train") / "stderr.log").read_text()
    args = (layout.step_dir("train") / "apptainer-args.txt").read_text().splitlines()
    run_dir = str(layout.run_dir.resolve())
    assert args[:6] == ["exec", "--nv", "--bind", f"{run_dir}:{run_dir}", "--bind", f"{run_dir}/shared:/shared"]
    assert args[6:11] == ["--bind", f"{tmp_path}:/data:ro", "--bind", "/scratch:/scratch", str(image)]
    assert args[11:13] == ["/bin/sh", "-c"]
    assert (layout.shared / "inside.txt").read_text() == "inside\n"


def test_a_resume_runs_its_first_step_whatever_its_condition(tmp_path):
    steps = [{"id": "train", "command": "exit 1", "on_fail": "train-retry"},
             {"id": "train-retry", "command": "test -e $PIPELINE_SHARED/go", "condition": "prev.error"},
             {"id": "evaluate", "command": "true"}]
    first, layout = run_pipeline(tmp_path, steps)
    assert statuses(first) == {"train": "failed", "train-retry": "failed", "evaluate": "skipped"}
    (layout.shared / "go").touch()
    second, _ = run_pipeline(tmp_path, steps, start="train-retry")
    assert second["status"] == "ok" and second["order"] == ["train-retry", "evaluate"]
    retry = json.loads(layout.status_path("train-retry").read_text())
    assert retry["status"] == "ok" and retry["attempts"] == 1


def test_arrivals_at_a_bounded_step_count_its_skips(tmp_path):
    # w always fails; x (bounded, no condition) is skipped after it; y handles the error and goes
    # back to w. Counting only x's runs, this would loop for ever.
    result, layout = run_pipeline(tmp_path, [
        {"id": "w", "command": "echo w >> $PIPELINE_SHARED/runs; exit 1"},
        {"id": "x", "command": "true", "max_retries": 0},
        {"id": "y", "command": "true", "condition": "prev.error", "next": "w"}])
    assert result["status"] == "failed" and "step 'x' reached 2 times, more than its 1" in result["reason"]
    assert len((layout.shared / "runs").read_text().split()) == 2


def test_a_run_from_the_first_step_sets_the_old_shared_files_aside(tmp_path):
    steps = [{"id": "train", "command": "test -e $PIPELINE_SHARED/metrics.json || touch $PIPELINE_SHARED/first"},
             {"id": "report", "command": "test ! -e $PIPELINE_SHARED/stale"}]
    first, layout = run_pipeline(tmp_path, steps)
    assert first["status"] == "ok"
    (layout.shared / "stale").write_text("from the first run")
    second, _ = run_pipeline(tmp_path, steps)
    assert second["status"] == "ok", "the report saw the first run's file"
    assert (layout.run_dir / "shared.previous-1" / "stale").read_text() == "from the first run"
    assert (layout.shared / "first").exists()
    third, _ = run_pipeline(tmp_path, steps, start="report")  # a resume from a later step keeps shared/
    assert third["status"] == "ok" and (layout.shared / "first").exists()
    assert not (layout.run_dir / "shared.previous-2").exists()


def test_a_pool_refused_by_the_engine_fails_the_step_with_its_reason(tmp_path):
    def refusing(pool, count=1, timeout=None):  # what common.workers.worker.acquire raises on a "refused" reply
        raise ValueError(f"unknown resource pool {pool!r}")

    [pipeline] = parse_definition({"name": "p", "steps": [{"id": "a", "command": "true", "resources": ["licence"]}]})
    result = PipelineRunner(pipeline, RunLayout(tmp_path, "p"), acquire=refusing).run()
    assert result["status"] == "failed"
    assert result["steps"]["a"]["reason"] == "pool 'licence' refused: unknown resource pool 'licence'"


DETACH = ("(setsid sh -c 'echo $$ > $PIPELINE_SHARED/{name}.pid; exec {program}' &); "
          "while [ ! -s $PIPELINE_SHARED/{name}.pid ]; do sleep 0.05; done")


def wait_dead(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.mark.timeout(60)
def test_the_memory_limit_counts_a_grandchild_in_a_session_of_its_own(tmp_path):
    """The step's shell runs a shell whose child left the session (setsid) but still has that
    parent: it is found through its parent (neither a session member nor an orphan to adopt)."""
    greedy = f'{sys.executable} -c "import time; x = bytes(range(256)) * (300 * 4096); time.sleep(60)"'
    inner = f"setsid {greedy} & echo $! > $PIPELINE_SHARED/greedy.pid; wait"
    result, layout = run_pipeline(tmp_path, [{"id": "hold", "memory": "100m", "timeout": 20,
                                              "command": f"sh -c '{inner}'; true"}])
    assert "memory limit 100.0 MiB exceeded" in result["steps"]["hold"]["reason"], result["steps"]["hold"]
    pid = int((layout.shared / "greedy.pid").read_text())
    assert wait_dead(pid), f"the grandchild {pid} outlived its step"


@pytest.mark.timeout(60)
def test_limits_reach_processes_that_detach_completely(tmp_path):
    greedy = f'{sys.executable} -c "import time; x = bytes(range(256)) * (300 * 4096); time.sleep(60)"'
    result, layout = run_pipeline(tmp_path, [
        {"id": "slow", "timeout": 1, "command": DETACH.format(name="slow", program="sleep 773") + "; sleep 300",
         "on_fail": "greedy"},
        {"id": "greedy", "memory": "100m", "timeout": 20, "on_fail": "leaves",
         "command": DETACH.format(name="greedy", program=greedy) + "; sleep 300"},
        {"id": "leaves", "timeout": 20, "command": DETACH.format(name="leaves", program="sleep 774")}])
    assert statuses(result) == {"slow": "timeout", "greedy": "failed", "leaves": "ok"}
    assert "memory limit 100.0 MiB exceeded" in result["steps"]["greedy"]["reason"]
    for name in ("slow", "greedy", "leaves"):
        pid = int((layout.shared / f"{name}.pid").read_text())
        assert wait_dead(pid), f"{name}: the detached process {pid} outlived its step"


def test_the_shipped_example_reports_when_both_trainings_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    examples = Path(__file__).parents[1] / "examples" / "pipelines"
    data = json.loads((examples / "ml.json").read_text())
    for step in data["steps"][:2]:
        step["env"]["DATASET"] = "no-such-dataset"
    [pipeline] = parse_definition(data)
    layout = RunLayout(tmp_path / "results", pipeline.name)
    result = PipelineRunner(pipeline, layout, definition_dir=examples).run()  # its steps: examples/pipelines/ml_steps
    assert statuses(result) == {"train": "failed", "train-retry": "failed", "evaluate": "skipped", "report": "failed"}
    report = (layout.shared / "report.md").read_text()
    assert "train-retry" in report and "no-such-dataset" in report


def test_a_step_dies_with_its_worker(tmp_path):
    """SIGKILL leaves no time for clean-up: PR_SET_PDEATHSIG (SIGKILL) ends the step all the same."""
    pid_file = tmp_path / "step.pid"
    script = ("import sys; from pathlib import Path; from common.pipeline.definition import parse_definition; "
              "from common.pipeline.flow import PipelineRunner, RunLayout; "
              "[p] = parse_definition({'name': 'p', 'steps': [{'id': 'hold', 'command': "
              f"\"trap '' TERM; echo $$ > {pid_file}; exec sleep 300\"}}]}}); "
              f"PipelineRunner(p, RunLayout(Path({str(tmp_path)!r}), 'p')).run()")
    runner = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[1])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    step = int(pid_file.read_text())
    runner.kill()
    runner.wait()
    assert wait_dead(step), f"the step {step} outlived its worker"


def test_env_values_expand_whole_variable_names_once():
    """A step's env expanded $PIPELINE_NAME inside $PIPELINE_NAMES ("p9S") and $PIPELINE_SHARED
    inside $PIPELINE_SHARED_BACKUP ("/r/p/shared_BACKUP"): names are now whole, as a shell reads
    them, unknown ones are left for the program, and a value is expanded once."""
    from common.pipeline.steps import expand

    variables = {"PIPELINE_NAME": "p9", "PIPELINE_SHARED": "/r/p9/shared", "PIPELINE_RUN_ID": "$PIPELINE_NAME"}
    assert expand("$PIPELINE_NAMES|${PIPELINE_NAME}S|$PIPELINE_SHARED_BACKUP|$PIPELINE_SHARED/x", variables) == (
        "$PIPELINE_NAMES|p9S|$PIPELINE_SHARED_BACKUP|/r/p9/shared/x")
    assert expand("$HOME ${USER} $$ $1 $PIPELINE_RUN_ID", variables) == "$HOME ${USER} $$ $1 $PIPELINE_NAME"
    assert expand("cost-${PIPELINE_NAME}-$PIPELINE_NAME.", variables) == "cost-p9-p9."


def test_the_summary_table_says_why_a_step_was_skipped_and_which_were_not_reached():
    """A review of the runner's outputs: a skipped step read "skipped" beside "cleanup ok", its reason
    only in its status.json; a stopped pipeline's steps never reached read "-", which the docs call
    "not reached" and summary.json "missing". A pipeline not started keeps "-" in each cell."""
    from common.pipeline.report import pipelines_table

    long_reason = "condition prev.error: the previous step did not fail, and " + "x" * 80
    table = pipelines_table({
        "p-a": {"status": "failed", "steps": {"train": {"status": "failed", "seconds": 1.0},
                                              "evaluate": {"status": "skipped", "reason": "an earlier step failed"},
                                              "report": {"status": "skipped", "reason": long_reason}}},
        "p-b": {"status": "stopped", "steps": {"train": {"status": "ok", "seconds": 2.0},
                                               "evaluate": {"status": "missing"}, "report": {"status": "missing"}}},
        "p-c": {"status": "not started", "steps": {"train": {"status": "missing"}, "evaluate": {"status": "missing"},
                                                   "report": {"status": "missing"}}}})
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| p-a | failed | FAILED 1.0 s | skipped: an earlier step failed | skipped: condition "
                              "prev.error: the previous step did not fail"), rows[0]
    assert rows[0].endswith("... |") and len(rows[0].split(" | ")[-1]) <= len("skipped: ") + 60 + 2, rows[0]
    assert rows[1] == "| p-b | stopped | ok 2.0 s | not reached | not reached |"
    assert rows[2] == "| p-c | not started | - | - | - |"
    piped = pipelines_table({"p": {"status": "failed", "steps": {"s": {"status": "skipped", "reason": "a | b"}}}})
    assert piped.splitlines()[2] == "| p | failed | skipped: a \\| b |"
