"""What a hostile but realistic user does (issue 27): signals at odd moments, stdout and stderr
that are closed, piped into `head` or full, garbage in our environment variables, huge pipelines.
Real processes, real signals, real files; each case one line and the right exit code."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.signals import ECHO_SECONDS
from helpers import (
    REPO,
    TOY,
    assert_usage_error,
    error_lines,
    generate_script,
    journal_entries,
    read_summary,
    start,
    status_of,
    stop_signals_deferred,
    values,
    wait_for_results,
    wait_until,
)

STOP_CODE = 75
#: seconds between the Ctrl-Cs of a test that sends three, each to count (see the first such test)
CTRL_C_APART = ECHO_SECONDS + 2.5
SVM = ["--dataset", "digits", "--subsample", "200", "--folds", "2", "--gpu", "cpu", "--no-progress"]


def state_of(results: Path) -> str:
    return json.loads((results / "status.json").read_text())["state"]


def toy(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOY, *args], cwd=REPO, capture_output=True, text=True, timeout=180,
                          **kwargs)


# ----- item 4: too few file descriptors ----------------------------------------------------------

def test_too_low_a_limit_on_open_files_is_one_line_naming_it(tmp_path):
    """``ulimit -n 32`` (soft and hard): refused before anything starts, never a hang."""
    results = tmp_path / "results"
    proc = toy("8", "--workers", "4", "--gpu", "cpu", "--results", str(results),
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32)))
    assert_usage_error(proc, "ulimit -n", "is 32")
    assert not results.exists()


def test_a_low_soft_limit_on_open_files_is_raised(tmp_path):
    """``ulimit -Sn 32`` under a higher hard limit: the rank raises its own soft limit and runs."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip(f"the hard limit here is {hard}")
    results = tmp_path / "results"
    proc = toy("8", "--workers", "4", "--gpu", "cpu", "--results", str(results), "--no-progress",
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard)))
    assert proc.returncode == 0, proc.stderr
    assert state_of(results) == "complete"


# ----- item 8: two stop signals in quick succession --------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signals_while_the_process_exits_do_not_kill_it(tmp_path, sig):
    """A stop during start-up, then more of them while the process shuts down (the interpreter gives
    Python-handled signals their default action back then): still the one line and exit 75."""
    results = tmp_path / "results"
    process = start(["-m", "mnist_svm", "2", *SVM, "--results", str(results)])
    assert wait_until(lambda: stop_signals_deferred(process.pid), timeout=30, every=0.001)
    os.kill(process.pid, sig)
    line = process.stderr.readline()  # the "stopped ... before the run started" line: main has returned
    assert "before the run started" in line, line
    while process.poll() is None:  # the second, third, ... signal lands in the interpreter's shutdown
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(0.002)
    rest = process.stderr.read()
    assert process.wait(timeout=60) == STOP_CODE, (line, rest)
    assert "Traceback" not in rest, rest
    assert not results.exists()


@pytest.mark.parametrize("package", ["common.pipeline", "common.sweep", "mnist_svm", "mnist_nn"])
def test_each_program_package_defers_stop_signals_before_its_slow_imports(package):
    """``python -m PACKAGE`` imports the package before its __main__ defers stop signals: the
    package itself must import nothing slow (the pipeline's flow, steps and engine took 1-3 s here;
    the sweep's numpy 0.2 s), else a Ctrl-C or SIGTERM meanwhile ends the run in a traceback."""
    top = package.split(".")[0]
    code = (f"import sys, {package}; print(sorted(m for m in sys.modules if m.startswith('{top}.') or m == 'numpy'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr([package] if "." in package else []), proc.stdout


# ----- item 9: SIGUSR2 -------------------------------------------------------------------------

def test_sigusr2_stops_a_run_like_sigusr1(tmp_path):
    """Open MPI's mpirun forwards USR2 to the ranks: rank 0 stops as on USR1 (summary, no hold
    left, exit 75), and --resume finishes."""
    results = tmp_path / "results"
    process = start([TOY, "12", "--sleep", "0.5", "--workers", "2", "--results", str(results), "--no-progress"])
    wait_for_results(results, 2)
    os.kill(process.pid, signal.SIGUSR2)
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    assert "received SIGUSR2" in err and "Traceback" not in err, err
    assert read_summary(results)["status"] == "stopped"
    assert not (results / "hold.json").exists()
    resumed = toy("12", "--sleep", "0.5", "--workers", "2", "--results", str(results), "--no-progress", "--resume")
    assert resumed.returncode == 0, resumed.stderr


def _hangup(disposition):
    """A child's SIGHUP as given (this suite may itself run under nohup, which every child inherits)."""
    return lambda: signal.signal(signal.SIGHUP, disposition)


def test_a_closed_terminal_stops_a_run_as_sigterm_does(tmp_path):
    """A closed terminal (or a dropped ssh connection) sends SIGHUP to every process of its
    foreground group: the rank stops as on SIGTERM, giving the running items their grace, and its
    workers and multiprocessing's resource tracker live through it. It used to end the rank where
    it stood: exit 129, no summary, its hold left for a resume to wait out."""
    results = tmp_path / "results"
    process = start([TOY, "12", "--sleep", "0.5", "--workers", "2", "--grace", "30", "--results", str(results),
                     "--no-progress"], preexec_fn=_hangup(signal.SIG_DFL))
    wait_for_results(results, 2)
    os.killpg(process.pid, signal.SIGHUP)
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    assert "received SIGHUP" in err and "Traceback" not in err and "relaunching" not in err, err
    summary = read_summary(results)
    assert summary["status"] == "stopped" and summary["failed_items"] == [], summary
    assert not [e for e in journal_entries(results) if e.get("type") in ("attempt_failed", "failed")]
    assert not (results / "hold.json").exists()
    resumed = toy("12", "--sleep", "0.5", "--workers", "2", "--results", str(results), "--no-progress", "--resume")
    assert resumed.returncode == 0, resumed.stderr


def test_a_run_started_under_nohup_lives_through_a_hang_up(tmp_path):
    """``nohup`` starts a program with SIGHUP ignored so that it outlives its terminal: the run keeps
    it ignored, and so do the programs its items start (each item's ``sleep`` here), which the
    workers' own handling of the stop signals would otherwise give SIGHUP's default back. The run
    ends complete, no attempt failed."""
    results = tmp_path / "results"
    process = start([TOY, "6", "--child-seconds", "1", "--workers", "2", "--retries", "0", "--results", str(results),
                     "--no-progress"], preexec_fn=_hangup(signal.SIG_IGN))
    wait_for_results(results, 2)
    time.sleep(0.3)  # the next items' sleep programs have started
    os.killpg(process.pid, signal.SIGHUP)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert read_summary(results)["items_done"] == 6
    assert not [e for e in journal_entries(results) if e.get("type") in ("attempt_failed", "failed")], err


TWO_SWEEPS = """import sys
from common import sweep


def fit(params):
    import time
    time.sleep(0.5)
    return {"y": params["x"]}


if __name__ == "__main__":
    for name in ("a", "b"):
        code = sweep.main(fit, grid={"x": list(range(8))}, argv=["--gpu", "cpu", "--workers", "2", "--no-progress",
                                                                 "--results", sys.argv[1] + "/" + name])
    raise SystemExit(code)
"""


def test_a_second_sweep_in_the_same_program_still_stops_on_a_hang_up(tmp_path):
    """The end of a run ignores the stop signals (Python gives them their defaults back as it exits);
    a script's second ``sweep.main`` then must not take its ignored SIGHUP for nohup's."""
    script = tmp_path / "two.py"
    script.write_text(TWO_SWEEPS)
    process = start([str(script), str(tmp_path)], preexec_fn=_hangup(signal.SIG_DFL))
    wait_for_results(tmp_path / "b", 2)
    os.killpg(process.pid, signal.SIGHUP)
    _, err = process.communicate(timeout=120)
    assert process.returncode == STOP_CODE, err
    assert read_summary(tmp_path / "a")["status"] == "complete"
    assert read_summary(tmp_path / "b")["status"] == "stopped"



def test_an_item_a_sigusr2_cut_off_is_run_again_not_failed(tmp_path):
    """USR2 to the process group reaches a worker before its rank (whose stop then comes late): the
    item it cut off is not a failed attempt. Sent to one worker alone (the rank goes on), that item
    is handed out again in the run itself: complete, nothing failed, even with --retries 0."""
    results = tmp_path / "results"
    process = start([TOY, "8", "--sleep", "1", "--workers", "2", "--retries", "0", "--results", str(results),
                     "--no-progress"])
    wait_for_results(results, 2)
    busy = [e["result"]["pid"] for e in journal_entries(results) if e.get("type") == "result"][0]
    os.kill(busy, signal.SIGUSR2)  # running its second item (each takes a second)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    summary = read_summary(results)
    assert summary["failed_items"] == [] and summary["items_done"] == 8, summary
    assert "failed" not in err and "Traceback" not in err, err
    assert len({e["key"] for e in journal_entries(results) if e.get("type") == "result"}) == 8



def test_an_item_cut_off_by_sigusr2_again_and_again_is_counted_at_last(tmp_path):
    """A SIGUSR2 that cuts an item off every time (a stray loop, an item's own os._exit(140)) would hand
    it out for ever: after MAX_CUT_OFFS cut-offs the next counts as its failure, said for what it is."""
    from common.workers.pool import MAX_CUT_OFFS

    results = tmp_path / "results"
    proc = toy("4", "--usr2-key", "item-0001", "--retries", "0", "--gpu", "cpu", "--results", str(results),
               "--no-progress")
    assert proc.returncode == 1, proc.stderr
    summary = read_summary(results)
    assert [f["key"] for f in summary["failed_items"]] == ["item-0001"] and summary["items_done"] == 3, summary
    assert summary["failed_items"][0]["error"] == "worker ended by SIGUSR2", summary
    cut = [line for line in (results / "logs" / "rank0.log").read_text().splitlines()
           if "ended by SIGUSR2 while running item-0001" in line and line.endswith(": back to be run again")]
    assert len(cut) == MAX_CUT_OFFS, cut


# ----- item 10: a third Ctrl-C while rank 0 writes its outputs ----------------------------------

def test_a_third_ctrl_c_while_writing_outputs_is_one_line_and_resume_writes_them(tmp_path):
    results = tmp_path / "results"
    process = start([TOY, "4", "--results", str(results), "--no-progress", "--gpu", "cpu", "--finish-seconds", "30"])
    assert wait_until(lambda: (results / "status.json").exists() and state_of(results) == "finishing", timeout=120)
    # ECHO_SECONDS and more apart as the rank's handler sees them: each one counts (a sooner one is the
    # same signal passed on); 2.5 s over it, as a busy machine may run a handler late (1 s over was not
    # always enough with the cluster tiers running beside)
    for _ in range(3):
        os.kill(process.pid, signal.SIGINT)
        time.sleep(CTRL_C_APART)
    _, err = process.communicate(timeout=60)
    assert process.returncode == STOP_CODE, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    stopped = [line for line in error_lines(err) if "stopped" in line]
    assert len(stopped) == 1 and "while writing the outputs" in stopped[0] and "--resume" in stopped[0], err
    # the first two were said at once, not seemingly ignored for as long as the outputs took (the first
    # may come just before the outputs begin, "finishing" already in the status file: counted, not said)
    heard = [line.split("; ")[-1] for line in err.splitlines()
             if line.startswith("received SIGINT while writing the outputs: finishing them; ")]
    said = "stops now (what finished is journaled: --resume goes on from it)"
    assert heard in ([f"Ctrl-C 2 more times, 2 s or more apart, {said}", f"Ctrl-C once more {said}"],
                     [f"Ctrl-C once more {said}"]), err
    assert not (results / "values.json").exists()
    assert state_of(results) == "stopped"
    assert not (results / "hold.json").exists()
    summary = read_summary(results)  # written after all: it says what became of the outputs
    assert summary["status"] == "stopped" and summary["outputs_interrupted"] is True, summary
    assert "were being written when this run was stopped" in (results / "summary.md").read_text()
    shown = status_of(results)
    assert shown.returncode == 75 and "resume   with: python" in shown.stdout, shown.stdout
    resumed = toy("4", "--results", str(results), "--no-progress", "--gpu", "cpu", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert len(values(results)) == 4
    assert state_of(results) == "complete"



def test_a_third_ctrl_c_while_a_resume_rewrites_the_outputs_leaves_no_summary_saying_complete(tmp_path):
    """A complete run's folder, resumed to write its outputs again (a changed output flag), stopped by
    three Ctrl-Cs as they are written: the app's files may be part old, part new, so summary.md and
    summary.json no longer say "complete" (they were the old run's, left as they were)."""
    results = tmp_path / "results"
    assert toy("4", "--results", str(results), "--no-progress", "--gpu", "cpu").returncode == 0
    assert read_summary(results)["status"] == "complete"
    process = start([TOY, "4", "--results", str(results), "--no-progress", "--gpu", "cpu", "--resume",
                     "--finish-seconds", "30"])
    assert wait_until(lambda: state_of(results) == "finishing", timeout=120)
    for _ in range(3):
        os.kill(process.pid, signal.SIGINT)
        time.sleep(CTRL_C_APART)
    _, err = process.communicate(timeout=60)
    assert process.returncode == STOP_CODE, err
    summary = read_summary(results)
    assert summary["status"] == "stopped" and summary["outputs_interrupted"] is True, summary
    markdown = (results / "summary.md").read_text()
    assert markdown.startswith("# toy: stopped") and "some may be this run's and some an earlier run's" in markdown
    assert toy("4", "--results", str(results), "--no-progress", "--gpu", "cpu", "--resume").returncode == 0
    assert read_summary(results)["status"] == "complete" and "outputs_interrupted" not in read_summary(results)


# ----- item 7: closed, broken or full stdout and stderr ----------------------------------------

def test_dry_run_into_head_exits_0_quietly():
    """``--dry-run | head -1``: the reader leaves after a line; no BrokenPipeError, exit 0."""
    process = subprocess.Popen([sys.executable, "-m", "mnist_svm", "24", "--dataset", "digits", "--dry-run"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=120) == 0, err
    assert json.loads(first)["key"]
    assert err == "", err


def test_a_dry_run_or_schema_whose_printout_is_lost_to_a_full_disk_fails_in_one_line():
    """Their printout is their whole result: ``> /dev/full`` exited 0 with nothing written. A
    reader leaving (``| head``, above) and a stdout closed on purpose (``>&-``) still exit 0."""
    for argv, said in (([sys.executable, "-m", "mnist_svm", "24", "--dataset", "digits", "--dry-run"],
                        "mnist_svm: error: --dry-run: the plan could not be written to stdout (No space left on device)"),
                       ([sys.executable, "-m", "common.pipeline", "--schema"],
                        "pipeline: error: --schema: the schema could not be written to stdout (No space left on device)")):
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == 1 and proc.stderr.strip() == said, proc.stderr
        closed = subprocess.run(argv, cwd=REPO, stderr=subprocess.PIPE, text=True, timeout=120,
                                preexec_fn=lambda: os.close(1))
        assert closed.returncode == 0 and closed.stderr == "", closed.stderr


@pytest.mark.parametrize("where", ["closed", "full"])
def test_a_complete_run_with_stdout_closed_or_full_exits_0(tmp_path, where):
    """mnist_svm prints its headline on stdout at the end: stdout closed (``>&-``) or /dev/full
    changes nothing: exit 0, status.json complete, no .space-reserve left."""
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "mnist_svm", "2", *SVM, "--results", str(results)]
    if where == "closed":
        proc = subprocess.run(argv, cwd=REPO, stderr=subprocess.PIPE, text=True, timeout=240,
                              preexec_fn=lambda: os.close(1))
    else:
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert state_of(results) == "complete"
    assert read_summary(results)["status"] == "complete"
    assert not (results / ".space-reserve").exists()
    # stdout closed: the journal must not have taken descriptor 1 and received the headline
    assert "Best penalty parameter" not in (results / "journal.jsonl").read_text()


def test_a_launcher_killed_as_the_closing_lines_pass_leaves_the_run_complete(tmp_path):
    """``mpiexec -n 2 python -m mnist_svm ... | head -2``: the reader leaves, mpiexec dies of SIGPIPE
    as it passes the headline on, and hydra kills the ranks. Here rank 0 is killed the moment its
    first line reaches stdout: by then the folder says complete and its hold is released, so the
    status command does not call a finished run killed."""
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "mnist_svm", "2", *SVM, "--results", str(results)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline()
        proc.kill()
    finally:
        proc.communicate(timeout=60)
    assert first.strip(), "no closing line on stdout"
    assert state_of(results) == "complete"
    assert not (results / "hold.json").exists()
    status = status_of(results)
    assert status.returncode == 0 and "GONE" not in status.stdout, status.stdout + status.stderr


def test_stderr_full_keeps_the_exit_codes(tmp_path):
    """``2>/dev/full``: a refusal is still exit 2, a complete run still 0."""
    with open("/dev/full", "w") as full:
        refused = subprocess.run([sys.executable, TOY, "0", "--results", str(tmp_path / "r")], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=full, timeout=120)
        complete = subprocess.run([sys.executable, TOY, "3", "--gpu", "cpu", "--results", str(tmp_path / "ok")],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=full, timeout=120)
    assert refused.returncode == 2
    assert complete.returncode == 0
    assert state_of(tmp_path / "ok") == "complete"


# ----- items 5 and 11: our environment variables ------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("PIPELINE_KILL_GRACE", "abc"), ("PIPELINE_KILL_GRACE", "nan"), ("PIPELINE_KILL_GRACE", "1e300"),
    ("MULTINODE_GPU_HOLD_SECONDS", "inf"), ("MULTINODE_GPU_HOLD_SECONDS", "-1"),
    ("MULTINODE_GPU_STATUS_SECONDS", "0"), ("MULTINODE_GPU_PROGRESS_SECONDS", "soon"),
    ("MULTINODE_GPU_NO_MPI", "yes"), ("MULTINODE_GPU_NO_MPI", "2"),
])
def test_garbage_in_an_environment_variable_is_one_line_naming_it(tmp_path, name, value):
    results = tmp_path / "results"
    proc = toy("3", "--gpu", "cpu", "--results", str(results), env=dict(os.environ, **{name: value}))
    assert_usage_error(proc, name)
    assert not results.exists()


def test_garbage_in_an_environment_variable_is_refused_by_the_pipeline_app_too(tmp_path):
    definition = tmp_path / "p.json"
    definition.write_text(json.dumps({"name": "p", "steps": [{"id": "a", "command": "true"}]}))
    proc = subprocess.run([sys.executable, "-m", "common.pipeline", str(definition), "--results",
                           str(tmp_path / "r"), "--gpu", "cpu"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PIPELINE_KILL_GRACE="abc"))
    assert_usage_error(proc, "PIPELINE_KILL_GRACE")


@pytest.mark.parametrize("value", ["0", "false", ""])
def test_no_mpi_off_values_leave_mpi_on(tmp_path, value):
    """``MULTINODE_GPU_NO_MPI=0`` under mpiexec -n 2 is one run of 2 ranks, not two racing runs."""
    results = tmp_path / "results"
    proc = subprocess.run([os.path.join(sys.prefix, "bin", "mpiexec"), "-n", "2", sys.executable, TOY, "4",
                           "--gpu", "cpu", "--results", str(results), "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, MULTINODE_GPU_NO_MPI=value))
    assert proc.returncode == 0, proc.stderr
    assert read_summary(results)["ranks"] == 2


def test_garbage_no_mpi_under_mpiexec_is_one_line_from_rank_0(tmp_path):
    """Refused before MPI is joined: only the launcher's rank 0 says it."""
    results = tmp_path / "results"
    proc = subprocess.run([os.path.join(sys.prefix, "bin", "mpiexec"), "-n", "2", sys.executable, TOY, "4",
                           "--gpu", "cpu", "--results", str(results)], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env=dict(os.environ, MULTINODE_GPU_NO_MPI="yes"))
    assert_usage_error(proc, "MULTINODE_GPU_NO_MPI")
    assert not results.exists()


def test_ranks_started_without_mpi4py_are_one_line_not_a_run_each(tmp_path):
    """mpiexec -n 2 (srun the same) where mpi4py cannot be imported: each rank fell back to a world
    of its own, and the two raced as two runs of rank 0 for one results folder (on a cluster: N
    nodes' allocation for one node's work). Now one line, from the launcher's rank 0, and exit 2."""
    blocker = tmp_path / "no_mpi4py"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoMpi4py:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mpi4py' or name.startswith('mpi4py.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'mpi4py'\", name=name)\n"
        "sys.meta_path.insert(0, NoMpi4py())\n")
    results = tmp_path / "results"
    proc = subprocess.run([os.path.join(sys.prefix, "bin", "mpiexec"), "-n", "2", sys.executable, TOY, "4",
                           "--gpu", "cpu", "--results", str(results), "--no-progress"], cwd=REPO, capture_output=True,
                          text=True, timeout=240, env=dict(os.environ, PYTHONPATH=str(blocker)))
    assert_usage_error(proc, "the launcher started 2 ranks, but MPI joined this one to a world of 1: mpi4py is not "
                             "installed in this Python")
    assert not results.exists()


def test_a_stray_pmi_size_without_its_launcher_is_one_line(tmp_path):
    """PMI_SIZE=4 left in the environment (a launcher whose PMI the MPI library does not speak, as
    srun --mpi=pmix for the mpich wheel): MPI made a world of one; one line, exit 2."""
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, TOY, "4", "--gpu", "cpu", "--results", str(results)], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, PMI_SIZE="4"))
    assert_usage_error(proc, "the launcher started 4 ranks, but MPI joined this one to a world of 1: the launcher "
                             "and the MPI library do not work together")
    assert not results.exists()


# ----- item 12: a pipeline of thousands of steps ------------------------------------------------

def test_a_pipeline_of_3000_steps_is_planned(tmp_path):
    definition = tmp_path / "long.json"
    steps = [{"id": f"s{i}", "command": "true"} for i in range(3000)]
    definition.write_text(json.dumps({"name": "long", "steps": steps}))
    proc = subprocess.run([sys.executable, "-m", "common.pipeline", str(definition), "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RecursionError" not in proc.stderr and "s2999" in proc.stdout


# ----- item 13: tracebacks on odd files and values ---------------------------------------------

def test_a_hold_of_this_host_with_pid_minus_1_is_judged_by_its_age(tmp_path):
    """A hold.json naming this host with ``pid: -1`` (psutil raised ValueError): not a process to
    look up; a fresh one is refused in one line as any live hold."""
    results = tmp_path / "results"
    results.mkdir()
    now = time.time()
    hold = {"host": __import__("socket").gethostname(), "pid": -1, "process_started": now,
            "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
            "pid_namespace": str(os.stat("/proc/self/ns/pid").st_ino), "since": now, "refreshed": now,
            "refresh_seconds": 20.0, "token": "x"}
    (results / "hold.json").write_text(json.dumps(hold))
    proc = toy("3", "--gpu", "cpu", "--results", str(results))
    assert_usage_error(proc, "in use by another run", "pid -1")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("status") / "results"
    proc = toy("3", "--gpu", "cpu", "--results", str(results), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return results


@pytest.mark.parametrize("field, value", [("every", "often"), ("items_total", "many"), ("workers", "abc"),
                                          ("ranks", 3), ("updated", [1])])
def test_status_with_a_wrong_typed_field_reads_the_journal_instead(tmp_path, finished_run, field, value):
    results = tmp_path / "results"
    __import__("shutil").copytree(finished_run, results)
    status = json.loads((results / "status.json").read_text())
    status[field] = value
    (results / "status.json").write_text(json.dumps(status))
    proc = status_of(results)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout.startswith("toy: complete"), (proc.stdout, proc.stderr)


@pytest.mark.parametrize("damage", ["list key", "string fingerprint"])
def test_status_with_odd_journal_records_prints_no_traceback(tmp_path, finished_run, damage):
    results = tmp_path / "results"
    __import__("shutil").copytree(finished_run, results)
    journal = results / "journal.jsonl"
    lines = journal.read_text().splitlines()
    if damage == "list key":
        lines.append(json.dumps({"type": "result", "key": ["item-0000"], "result": {}}))
        lines.append(json.dumps({"type": "failed", "key": "item-0009", "error": 5}))
    else:
        header = json.loads(lines[0])
        header["fingerprint"] = "abc"
        lines[0] = json.dumps(header)
        (results / "status.json").unlink()
    journal.write_text("\n".join(lines) + "\n")
    proc = status_of(results)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout, (proc.stdout, proc.stderr)


@pytest.mark.parametrize("period", ["inf", "1e300", "nan"])
def test_status_watch_with_an_absurd_period_is_one_line(finished_run, period):
    proc = status_of(finished_run, "--watch", period)
    assert_usage_error(proc, "--watch")


# ----- item 15: the Slurm script generator -----------------------------------------------------


@pytest.mark.parametrize("walltime", ["\u0661\u0662:00:00", "01:\uff10\uff10:00", "\u0967-00:00:00"])
def test_slurm_time_with_non_ascii_digits_is_refused(walltime):
    """Python's \\d takes Arabic-Indic or full-width digits; sbatch refuses them only after submission."""
    assert_usage_error(generate_script("--gpus-per-node", "1", "--time", walltime, "--", "mnist_svm", "2"), "--time")


@pytest.mark.parametrize("count", [str(10 ** 30), "1001", "-1"])
def test_slurm_max_requeues_is_bounded(count):
    assert_usage_error(generate_script("--gpus-per-node", "1", "--max-requeues", count, "--", "mnist_svm", "2"),
                       "--max-requeues")


def test_slurm_container_takes_an_apptainer_sandbox_folder(tmp_path):
    sandbox = tmp_path / "sandbox"
    (sandbox / ".singularity.d").mkdir(parents=True)
    made = generate_script("--gpus-per-node", "1", "--container", str(sandbox), "--", "mnist_svm", "2")
    assert made.returncode == 0 and made.stdout.startswith("#!/bin/bash"), made.stderr
    assert str(sandbox) in made.stdout
    assert_usage_error(generate_script("--gpus-per-node", "1", "--container", str(tmp_path), "--", "mnist_svm", "2"),
                       "--container", "not an Apptainer sandbox")


# ----- a working folder deleted under the shell ----------------------------------------------------

@pytest.mark.parametrize("program", [[TOY, "4", "--gpu", "cpu"], ["-m", "common.pipeline", "run.json", "--gpu", "cpu"]])
def test_a_deleted_working_folder_is_one_line_and_writes_nothing(tmp_path, program):
    """A job script's ``cd`` into a folder another job then removed: one line and exit 2 before
    anything is written (not a traceback from the first relative path or worker start, with a
    journal and logs left behind that make a rerun refuse the folder)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f'cd "{gone}" && rmdir "{gone}" && exec "$0" "$@"'
    proc = subprocess.run(["sh", "-c", script, sys.executable, *program, "--results", str(tmp_path / "results")],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert_usage_error(proc, "the current folder cannot be read", "cd into a folder that exists")
    assert not (tmp_path / "results").exists()


def test_a_runs_settings_are_every_variable_read_once_into_one_record():
    """read_all: each setting of ALL in its RunSettings field, from the environment given, defaults
    where unset; what the run hands on is that record, not the variables read again later."""
    from common import settings
    from common.pipeline.flow import PipelineRunner, RunLayout

    assert sorted(settings.FIELDS, key=settings.ALL.index) == list(settings.ALL)
    given = {"MULTINODE_GPU_NO_MPI": "1", "MULTINODE_GPU_HOLD_SECONDS": "7", "MULTINODE_GPU_PROGRESS_SECONDS": "9",
             "MULTINODE_GPU_STATUS_SECONDS": "2", "PIPELINE_KILL_GRACE": "3", "PIPELINE_LOCK_DIR": "/tmp/l",
             "PIPELINE_APPTAINER": "ap", "PIPELINE_CONTAINER": "img.sif"}
    assert settings.read_all(given) == settings.RunSettings(True, 7.0, 9.0, 2.0, 3.0, "/tmp/l", "ap", "img.sif")
    assert settings.read_all({}) == settings.RunSettings(False, 20.0, 30.0, 5.0, 5.0, None, None, None)
    ran = settings.read_all({"PIPELINE_KILL_GRACE": "1"})
    runner = PipelineRunner(None, RunLayout(Path("/nonexistent"), "p"), base_env={"PIPELINE_KILL_GRACE": "abc"},
                            run_settings=ran)
    assert runner.settings is ran  # the run's, not the garbage of an environment read again


def test_the_queue_timeout_and_slurm_variables_are_read_by_the_settings_module():
    """Every variable of ours is a setting; the pipeline's queue timeout, under both its names (ours
    winning), is checked by the pipeline app only, where --queue-timeout replaces it and nothing else
    refuses a SWARM_QUEUE_TIMEOUT set for the format's own tools; an empty seconds setting is its
    default, as unset (a job script's VAR=); Slurm's job, restart count and GPU variables are read in
    one place."""
    from common import settings
    from common.errors import UsageError
    from common.pipeline.app import queue_timeout

    assert settings.QUEUE_TIMEOUT not in settings.ALL and settings.SWARM_QUEUE_TIMEOUT not in settings.ALL
    settings.read_all({"SWARM_QUEUE_TIMEOUT": "2h"})  # not ours to refuse for an mnist run
    assert queue_timeout(None, {"SWARM_QUEUE_TIMEOUT": "12", "PIPELINE_QUEUE_TIMEOUT": ""}) == 12.0
    assert queue_timeout(60.0, {"SWARM_QUEUE_TIMEOUT": "2h"}) == 60.0  # the flag wins, unread
    assert settings.value(settings.HOLD_SECONDS, {"MULTINODE_GPU_HOLD_SECONDS": " "}) == 20.0
    # a period of a file rewritten or a line printed: 1e-300 would print tens of thousands of lines a second
    for period in (settings.HOLD_SECONDS, settings.PROGRESS_SECONDS, settings.STATUS_SECONDS):
        with pytest.raises(UsageError, match=f"{period.name}='1e-300': must be at least 0.1 and at most "):
            settings.value(period, {period.name: "1e-300"})
        assert settings.value(period, {period.name: "0.1"}) == 0.1
    assert settings.value(settings.KILL_GRACE, {"PIPELINE_KILL_GRACE": "0.01"}) == 0.01  # not a period
    for bad in ("soon", "0", "nan", "1e12"):
        with pytest.raises(UsageError, match=f"SWARM_QUEUE_TIMEOUT='{bad}': "):
            queue_timeout(None, {"SWARM_QUEUE_TIMEOUT": bad})
    assert settings.slurm_job({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}) == ("77", "2")
    assert settings.slurm_job({"SLURM_JOB_ID": ""}) == (None, None) and not settings.in_slurm_job({})
    assert settings.slurm_gpus({"SLURM_JOB_GPUS": "(null)", "SLURM_GPUS_ON_NODE": "2"}) == "SLURM_GPUS_ON_NODE=2"
    assert settings.slurm_gpus({"SLURM_STEP_GPUS": "0", "SLURM_JOB_GPUS": "N/A"}) is None


def test_open_mpis_own_variables_win_over_those_an_outer_launcher_left():
    """mpirun inside `srun --pty bash` (MpiDefault=pmi2): each rank also sees the PMI_SIZE=1 and
    PMI_RANK=0 the outer srun left. The world check accepts the size Open MPI gave, and only its
    rank 0 speaks for the launch."""
    from common import settings

    inherited = {"PMI_SIZE": "1", "PMI_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}
    assert settings.launcher_sizes(inherited) == [4, 1] and settings.launcher_rank(inherited) == 2
    assert settings.launcher_sizes({"PMI_SIZE": "2", "PMI_RANK": "1"}) == [2]
    assert settings.launcher_sizes({"PMI_SIZE": "x"}) == [] and settings.launcher_sizes({}) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the app as another user")
def test_a_logs_folder_the_user_may_not_write_is_named_in_one_line():
    """A results folder the user may write, whose logs/ (another's, read-only) they may not: said
    of logs/, before anything is written or printed (the folder itself was blamed, after a line)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as place:  # pytest's own folders are root's alone
        os.chmod(place, 0o755)
        results = Path(place) / "results"
        (results / "logs").mkdir(parents=True)
        results.chmod(0o777)
        (results / "logs").chmod(0o555)
        proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, TOY,
                               "3", "--gpu", "cpu", "--results", str(results)], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, MPLCONFIGDIR=place, HOME=place))
        assert_usage_error(proc, f"--results '{results}': cannot write in its logs/ folder (Permission denied)")
        assert sorted(p.name for p in results.rglob("*")) == ["logs"]
        results.chmod(0o700)  # another user's folder, not to be entered: still one line (it was a traceback)
        for dry in ([], ["--dry-run"]):
            proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                                   TOY, "3", "--gpu", "cpu", "--results", str(results), *dry], cwd=REPO,
                                  capture_output=True, text=True, timeout=120, env=dict(os.environ, MPLCONFIGDIR=place,
                                                                                        HOME=place))
            assert_usage_error(proc, f"--results '{results}': cannot write there (Permission denied)")


def test_a_seed_of_hundreds_of_digits_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mnist_svm", "2", "--dataset", "digits", "--seed", "9" * 400,
                           "--results", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "argument --seed: must be at most" in done.stderr and not (tmp_path / "r").exists()
    # --retries had no bound: an item that always fails would be tried for ever
    done = subprocess.run([sys.executable, "-m", "mnist_svm", "2", "--dataset", "digits", "--retries", "9" * 400,
                           "--results", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "argument --retries: must be at most 1000, got 99999" in done.stderr, done.stderr


def test_a_results_path_that_is_no_utf8_keeps_its_log(tmp_path):
    """A folder name holding a byte that is no UTF-8 (Python decodes it to a surrogate): the run's
    log failed at its first line naming the path ("surrogates not allowed") and went to stderr for
    the rest of the run, keeping 3 lines."""
    results = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xffname"))
    done = toy("3", "--gpu", "cpu", "--workers", "1", "--results", str(results), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "cannot write" not in done.stderr, done.stderr
    log = (results / "logs" / "rank0.log").read_text(encoding="utf-8")
    assert "complete: 3 of 3 items" in log and "bad\\udcffname" in log, log
