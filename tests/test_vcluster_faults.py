"""A lost node never hangs the job: faults injected into runs across the virtual cluster's nodes
(tests/vcluster.py). Each run must end by itself, and end with the results of an uninterrupted run
(after --resume where the launcher ended the whole job). Each test prints how long the loss took
to be detected and the job to end."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import read_summary, values
from test_vcluster import TOY, generated_script
from vcluster import REPO

pytestmark = pytest.mark.vcluster

HEARTBEAT = 5  # --heartbeat-timeout of these runs
ARGS = ["48", "--sleep", "0.5", "--threads", "1", "--no-progress", "--heartbeat-timeout", str(HEARTBEAT)]
CPU = ["--gpu", "cpu", "--workers", "1"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict:
    """The uninterrupted run's values (one rank on this host)."""
    results = tmp_path_factory.mktemp("clean") / "r"
    done = subprocess.run([sys.executable, *TOY, *ARGS, *CPU, "--results", str(results)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return values(results)


def results_count(results: Path) -> int:
    try:
        return sum('"type":"result"' in line for line in (results / "journal.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def wait_for(condition, timeout: float, what: str) -> float:
    """Seconds until ``condition()`` held."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not after {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - start


def fresh(vcluster, name: str) -> Path:
    results = vcluster.shared / name
    shutil.rmtree(results, ignore_errors=True)
    return results


def lost_after(results: Path, fault_at: float, host: str = "") -> float:
    """Seconds from the fault to rank 0's 'rank_lost' journal record (of ``host``)."""
    for line in (results / "journal.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("type") == "rank_lost" and entry.get("host", "").startswith(host):
            return entry["time"] - fault_at
    raise AssertionError("no rank was declared lost")


def no_python_left(vcluster, node: str) -> bool:
    return not any(Path(f"/proc/{pid}/comm").read_text().startswith("python")
                   for pid in vcluster.processes(node) if Path(f"/proc/{pid}/comm").exists())


# ----- hydra (mpiexec across nodes) -----
def test_hydra_a_node_whose_rank_is_killed_ends_the_job_and_resume_completes(vcluster, clean):
    results = fresh(vcluster, "hydra-kill")
    program = [*TOY, *ARGS, *CPU, "--results", str(results)]
    job = vcluster.popen("node1", vcluster.hydra(program, vcluster.nodes))
    wait_for(lambda: results_count(results) >= 6, 120, "first results")
    fault_at = time.monotonic()
    assert vcluster.kill_python("node3")
    job.communicate(timeout=60)
    ended = time.monotonic() - fault_at
    print(f"hydra, node3's rank and workers SIGKILLed: the job ended {ended:.1f} s later (mpiexec exit {job.returncode})")
    assert ended < 30
    done_before = results_count(results)
    resumed = vcluster.run("node1", vcluster.hydra([*program, "--resume"], vcluster.nodes), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert read_summary(results)["items_resumed"] == done_before
    assert values(results) == clean


def test_hydra_a_node_whose_link_drops_is_lost_and_the_run_completes_without_it(vcluster, clean):
    results = fresh(vcluster, "hydra-cut")
    job = vcluster.popen("node1", vcluster.hydra([*TOY, *ARGS, *CPU, "--results", str(results)], vcluster.nodes))
    try:
        wait_for(lambda: results_count(results) >= 6, 120, "first results")
        fault_at, wall = time.monotonic(), time.time()
        vcluster.cut_link("node3")
        out, err = job.communicate(timeout=HEARTBEAT + 120)
        ended = time.monotonic() - fault_at
        detected = lost_after(results, wall)
        left = wait_for(lambda: no_python_left(vcluster, "node3"), HEARTBEAT + 30, "node3's rank stopping by itself")
        print(f"hydra, node3's link cut: lost after {detected:.1f} s (--heartbeat-timeout {HEARTBEAT}), job ended "
              f"{ended:.1f} s after the cut (exit {job.returncode}); node3's rank and workers gone "
              f"{ended + left:.1f} s after")
    finally:
        vcluster.restore_link("node3")
    assert job.returncode == 0, err
    report = read_summary(results)
    assert report["status"] == "complete" and [r["host"] for r in report["lost_ranks"]] == ["node3"]
    assert "lost rank 2 on node3" in (results / "summary.md").read_text()
    assert values(results) == clean


# ----- Slurm (generated scripts, srun --mpi=pmi2) -----
def submit(vcluster, results: Path, nodes: int, *sbatch_args: str) -> str:
    vcluster.wait_nodes_up()  # an earlier fault may have left a node DOWN for a while
    script = generated_script(vcluster, nodes, [str(REPO / "tests" / "toy_app.py"), *ARGS])
    done = vcluster.run("node1", ["sbatch", "--parsable", f"--output={vcluster.shared}/slurm-%j.out", *sbatch_args,
                                  str(script), *ARGS, "--results", str(results)], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def first_results(vcluster, results: Path, job: str = "") -> None:
    """Until the run has journaled a few results (the moment to inject a fault)."""
    try:
        wait_for(lambda: results_count(results) >= 6, 120, "first results")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{job_log(vcluster, job) if job else ''}\n{vcluster.squeue()}\n"
                             f"{vcluster.logs()}") from None


def job_state(vcluster, job: str) -> str:
    return vcluster.job_field(job, "JobState")


def job_log(vcluster, job: str) -> str:
    path = vcluster.shared / f"slurm-{job}.out"
    return path.read_text() if path.exists() else ""


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "")


def wait_job(vcluster, job: str, timeout: float) -> float:
    return wait_for(lambda: job_state(vcluster, job) in ENDED, timeout, f"job {job} to end")


@pytest.mark.parametrize("fault", ["kill", "cut"])
def test_slurm_a_lost_node_leaves_the_job_going_and_it_completes(vcluster, clean, fault):
    vcluster.require_slurm()
    results = fresh(vcluster, f"slurm-{fault}")
    job = submit(vcluster, results, 2)
    try:
        first_results(vcluster, results, job)
        wall = time.time()
        if fault == "kill":
            assert vcluster.kill_python("node2")
        else:
            vcluster.cut_link("node2")
        ended = wait_job(vcluster, job, HEARTBEAT + 180)
    finally:
        vcluster.restore_link("node2")
    log = job_log(vcluster, job)
    report = read_summary(results)
    assert job_state(vcluster, job) == "COMPLETED", log
    assert report["status"] == "complete", log
    if fault == "cut":  # silent: rank 0 carries on without it (and should Slurm declare the node DOWN
        # first, ending the job, --requeue and --resume finish it: the journal keeps the loss)
        detected = lost_after(results, wall, "node2")
        print(f"slurm, node2's link cut: lost after {detected:.1f} s (--heartbeat-timeout {HEARTBEAT}); "
              f"job completed {ended:.1f} s after the cut (restarts: {vcluster.job_field(job, 'Restarts')})")
    else:  # rank 0 loses it and completes, then ends the step with MPI_Abort; the script starts the step again
        assert "starting it again with --resume" in log, log
        assert log.count("sending to rank 1 failed") <= 1 and "error stack" not in log, log  # one line, not a stack
        print(f"slurm, node2's rank and workers SIGKILLed: step restarted with --resume; job completed {ended:.1f} s "
              f"after the kill")
    assert values(results) == clean


def test_slurm_scancel_of_the_whole_job_then_resubmission_completes(vcluster, clean):
    vcluster.require_slurm()
    results = fresh(vcluster, "slurm-scancel")
    job = submit(vcluster, results, 2)
    first_results(vcluster, results, job)
    vcluster.run("node1", ["scancel", job], check=True)
    ended = wait_job(vcluster, job, 60)
    print(f"slurm, scancel: job {job_state(vcluster, job)} {ended:.1f} s later with {results_count(results)} results journaled")
    again = submit(vcluster, results, 2)  # the script adds --resume
    wait_job(vcluster, again, 300)
    log = job_log(vcluster, again)
    assert job_state(vcluster, again) == "COMPLETED", log
    assert read_summary(results)["items_resumed"] > 0
    assert values(results) == clean


def test_slurm_a_batch_host_that_dies_with_its_slurmd_is_requeued_and_resumes(vcluster, clean):
    vcluster.require_slurm()
    results = fresh(vcluster, "slurm-node-death")
    job = submit(vcluster, results, 2, "--nodelist=node2,node3")
    try:
        first_results(vcluster, results, job)
        fault_at = time.monotonic()
        vcluster.kill_node("node2")  # its slurmd, the batch shell, the rank and workers; its link down
        requeued = wait_for(lambda: int(vcluster.job_field(job, "Restarts") or 0) >= 1, 180, "the requeue")
        print(f"slurm, batch host node2 died with its slurmd: job requeued {requeued:.1f} s later")
        vcluster.revive("node2")  # the node comes back (the job asked for node2 by name)
        ended = wait_job(vcluster, job, 300)
    finally:
        vcluster.revive("node2")
    log = job_log(vcluster, job)
    assert job_state(vcluster, job) == "COMPLETED", log
    print(f"... and completed {ended:.1f} s after the requeue ({time.monotonic() - fault_at:.1f} s after the death)")
    assert values(results) == clean
