"""The apps across several nodes of a real (virtual) cluster: MPI over TCP between network
namespaces, each node its own hostname, /tmp and /dev/shm; a real Slurm with one slurmd per node.
Every run must equal a 1-rank run of the same command. Faults: tests/test_vcluster_faults.py."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import read_summary
from vcluster import REPO

pytestmark = pytest.mark.vcluster

PYTHON = str(REPO / ".venv" / "bin" / "python")
CPU = ["--gpu", "cpu", "--workers", "1", "--threads", "1", "--no-progress"]
SVM = ["-m", "mnist_svm", "3", "--dataset", "digits", "--subsample", "400", *CPU]
# 3 certainty figures, not 100: these tests compare the items' results across layouts, and the
# figures (tested in test_mnist_nn) took rank 0 about 40 s of CPU in each of the three runs
NN = ["-m", "mnist_nn", "1", "2", "--dataset", "digits", "--subsample", "300", "--max-epochs", "2", "--folds", "3",
      "--max-macs", "1e6", "--seed", "7", "--certainty-images", "3", *CPU]
TOY = [str(REPO / "tests" / "toy_app.py")]


def comparable(value):
    """A result without its timings (seconds, samples per second): what must not depend on the layout."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in ("seconds", "samples_per_s", "pid")}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def item_results(results: Path) -> dict:
    """key -> result of every item in the journal."""
    entries = [json.loads(line) for line in (results / "journal.jsonl").read_text().splitlines() if line.strip()]
    return {e["key"]: comparable(e["result"]) for e in entries if e.get("type") == "result"}


def one_rank(program: list, results: Path) -> subprocess.CompletedProcess:
    """The reference: the same command as one rank on this host."""
    done = subprocess.run([sys.executable, *program, "--results", str(results)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """program -> the results folder of its 1-rank run on this host, made once per session (the
    hydra and the Slurm runs of one command compare with the same one)."""
    made = {}

    def results_of(program: list) -> Path:
        if tuple(program) not in made:
            made[tuple(program)] = tmp_path_factory.mktemp("one-rank") / "results"
            one_rank(program, made[tuple(program)])
        return made[tuple(program)]
    return results_of


def hydra(cluster, program: list, results: Path, nodes: int = 3, timeout: float = 600) -> subprocess.CompletedProcess:
    return cluster.run("node1", cluster.hydra([*program, "--results", str(results)], cluster.nodes[:nodes]),
                       timeout=timeout)


def test_the_nodes_are_separate_hosts_and_mpi_crosses_the_network(vcluster):
    names = [vcluster.run(node, ["hostname"]).stdout.strip() for node in vcluster.nodes]
    assert names == vcluster.nodes
    ids = {vcluster.run(node, ["cat", "/proc/sys/kernel/random/boot_id", "/etc/machine-id"]).stdout for node in vcluster.nodes}
    assert len(ids) == 3, "each node has its own boot_id and machine-id"
    mark = f"/tmp/{vcluster.tag}-private"
    vcluster.run("node1", ["touch", mark], check=True)
    assert [vcluster.run(node, ["test", "-e", mark]).returncode for node in vcluster.nodes] == [0, 1, 1], \
        "each node's /tmp is its own"
    assert vcluster.run("node2", ["test", "-d", str(vcluster.shared)]).returncode == 0, "the shared folder is seen"
    program = ["-c", "import socket; from mpi4py import MPI; c = MPI.COMM_WORLD; hosts = c.gather(socket.gethostname()); "
                     "c.rank or print(c.size, *hosts)"]
    done = vcluster.run("node1", vcluster.hydra(program, vcluster.nodes), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "node1", "node2", "node3"]
    traced = vcluster.run("node1", vcluster.hydra(program, vcluster.nodes), env={"UCX_LOG_LEVEL": "info"}, timeout=120)
    links = [line for line in (traced.stdout + traced.stderr).splitlines() if "inter-node" in line]
    assert links and all("tcp/eth0" in line for line in links), "MPI took a shortcut through shared memory"


@pytest.mark.parametrize("program", [SVM, NN], ids=["mnist_svm", "mnist_nn"])
def test_an_app_on_three_nodes_equals_one_rank(vcluster, program, reference):
    one = reference(program)
    results = vcluster.shared / f"three-{program[1]}"
    shutil.rmtree(results, ignore_errors=True)
    done = hydra(vcluster, program, results)
    assert done.returncode == 0, done.stderr
    assert read_summary(results)["status"] == "complete"
    assert {w["host"] for w in read_summary(results)["workers"]} == {"node1", "node2", "node3"}
    ran_on = {e["host"] for e in map(json.loads, (results / "journal.jsonl").read_text().splitlines())
              if e.get("type") == "result"}
    assert len(ran_on) >= 2, f"items ran on {ran_on} only"
    assert item_results(results) == item_results(one)
    if program[1] == "mnist_svm":
        assert np.array_equal(np.load(results / "validation_error.npy"), np.load(one / "validation_error.npy"),
                              equal_nan=True)
    for rank, node in enumerate(vcluster.nodes):
        assert f" {node} " in (results / "logs" / f"rank{rank}.log").read_text(), "a rank's log names its host"


def pipeline_outcome(results: Path) -> dict:
    """Each pipeline's status, each step's status and exit code, and the files its steps made."""
    outcome = {}
    for key, result in item_results(results).items():
        steps = {name: (step["status"], step.get("exit_code")) for name, step in result["steps"].items()}
        made = sorted(str(p.relative_to(results)) + "=" + p.read_text() for p in (results / key).rglob("*.txt"))
        outcome[key] = (result["status"], steps, made)
    return outcome


def squares(vcluster) -> list:
    """A pipelines file (a matrix of 6, two steps each) on the shared folder, as a program."""
    definition = vcluster.shared / "squares.json"
    definition.write_text(json.dumps({
        "name": "square",
        "matrix": {"n": [str(n) for n in range(6)]},
        "steps": [{"id": "compute", "command": "sleep 0.5; echo $((${n} * ${n})) > square.txt; hostname > host.log"},
                  {"id": "check", "command": "test -s ../compute/square.txt && cat ../compute/square.txt > seen.txt"}],
    }))
    return ["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--workers", "1", "--no-progress"]


def test_pipelines_on_three_nodes_equal_one_rank(vcluster, reference):
    program = squares(vcluster)
    one = reference(program)
    results = vcluster.shared / "three-pipelines"
    shutil.rmtree(results, ignore_errors=True)
    done = hydra(vcluster, program, results)
    assert done.returncode == 0, done.stderr
    assert read_summary(results)["status"] == read_summary(one)["status"] == "complete"
    assert pipeline_outcome(results) == pipeline_outcome(one)
    hosts = {p.read_text().strip() for p in results.rglob("host.log")}
    assert len(hosts) >= 2, f"the pipelines ran on {hosts} only"


def test_the_harness_signals_a_nodes_processes_by_namespace_and_runs_batch_jobs(vcluster):
    sleeper = vcluster.popen("node2", ["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while not any(Path(f"/proc/{pid}/comm").read_text().strip() == "sleep" for pid in vcluster.processes("node2")):
            assert time.monotonic() < deadline, "the sleep never showed up in node2"
            time.sleep(0.05)
        others = set(vcluster.processes("node1")) | set(vcluster.processes("node3"))
        slurmd = vcluster.slurmd("node2") if not vcluster.slurm_reason else None
        hit = vcluster.kill_node_processes("node2", signal.SIGKILL)
        assert hit and not set(hit) & others
        assert sleeper.wait(10) == -signal.SIGKILL
        assert slurmd is None or vcluster.slurmd("node2") == slurmd, "only_job leaves slurmd alone"
    finally:
        sleeper.kill()
    if vcluster.slurm_reason:
        return
    job = vcluster.sbatch("#!/bin/sh\n#SBATCH -N 2\nsrun hostname | sort\n", wait=True, timeout=120)
    assert vcluster.job_state(job) == "COMPLETED", vcluster.logs()
    assert vcluster.job_output(job).split() == ["node1", "node2"]


def generated_script(vcluster, nodes: int, program: list) -> Path:
    """A batch script from ``python -m common.slurm`` (CPU, one rank per node)."""
    made = subprocess.run([sys.executable, "-m", "common.slurm", "--nodes", str(nodes), "--cpu", "--ntasks-per-node", "1",
                           "--cpus-per-task", "1", "--time", "00:20:00", "--venv", str(REPO / ".venv"), "--", *program],
                          cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    script = vcluster.shared / f"job-{abs(hash(tuple(program)))}.sbatch"
    script.write_text(made.stdout)
    return script


@pytest.mark.parametrize("which", ["mnist_svm", "mnist_nn", "pipelines"])
def test_a_generated_slurm_script_on_two_nodes_equals_one_rank(vcluster, which, reference):
    vcluster.require_slurm()
    program = {"mnist_svm": SVM, "mnist_nn": NN}.get(which) or squares(vcluster)
    one = reference(program)
    results = vcluster.shared / f"slurm-{which}"
    shutil.rmtree(results, ignore_errors=True)
    app_args = program[2:]  # the script runs 'python -m MODULE' with the arguments given to sbatch
    script = generated_script(vcluster, 2, [program[1], *app_args])
    job = vcluster.sbatch(script, *app_args, "--results", str(results), wait=True)
    log = vcluster.job_output(job)
    assert vcluster.job_state(job) == "COMPLETED", log + vcluster.logs()
    assert read_summary(results)["ranks"] == 2, log
    assert read_summary(results)["status"] == "complete", log
    assert {w["host"] for w in read_summary(results)["workers"]} == {"node1", "node2"}
    if which == "pipelines":
        assert pipeline_outcome(results) == pipeline_outcome(one)
    else:
        assert item_results(results) == item_results(one)


#: a rank that joins its job through the engine, and says which MPICH netmod it runs on
NETMOD_PROBE = ("import os, sys; sys.path.insert(0, %r); from common.ranks.mpi import world; w = world(); "
                "print(w.rank, w.allgather(os.environ.get('MPIR_CVAR_CH4_NETMOD')))" % str(REPO))


def test_mpi_starts_every_time_under_srun_pmi2(vcluster):
    """Slurm's pmi2 plugin reads a PMI-1 request with one read() of 1024 bytes: MPICH's UCX
    address (nine long segments) made MPI_Init fail at random. The engine picks OFI there."""
    vcluster.require_slurm()
    for attempt in range(8):
        done = vcluster.run("node1", ["srun", "-N2", "--ntasks-per-node=1", "--gres=gpu:2", "--mpi=pmi2", PYTHON,
                                      "-c", NETMOD_PROBE], timeout=120)
        assert done.returncode == 0, f"attempt {attempt}: {done.stderr}"
        assert "pmi2" not in done.stderr, done.stderr
        assert sorted(done.stdout.split("\n")[:2]) == ["0 ['ofi', 'ofi']", "1 ['ofi', 'ofi']"], done.stdout


def test_followers_hear_rank_0_all_the_while_it_writes_outputs_longer_than_the_timeout(vcluster):
    """Over srun's pmi2 the ranks talk through MPICH's OFI netmod (libfabric tcp): a message leaves
    only while its sender calls into MPI. Rank 0's heartbeats while it wrote its outputs never did,
    so a follower gave rank 0 up after --heartbeat-timeout and the step ended abnormally (mnist_nn,
    whose outputs take 30 s here, was requeued again and again)."""
    vcluster.require_slurm()
    results = vcluster.shared / "slurm-slow-outputs"
    shutil.rmtree(results, ignore_errors=True)
    done = vcluster.run("node1", ["srun", "-N2", "--ntasks-per-node=1", "--mpi=pmi2", PYTHON, *TOY, "4", "--gpu", "cpu",
                                  "--workers", "1", "--no-progress", "--heartbeat-timeout", "4", "--finish-seconds", "12",
                                  "--results", str(results)], timeout=180)
    assert done.returncode == 0, done.stderr
    assert "lost rank 0" not in done.stderr, done.stderr
    assert read_summary(results)["status"] == "complete" and read_summary(results)["ranks"] == 2


def test_slurm_gres_pins_each_worker_to_its_own_fake_gpu(vcluster):
    vcluster.require_slurm()
    results = vcluster.shared / "slurm-gres"
    shutil.rmtree(results, ignore_errors=True)
    done = vcluster.run("node1", ["srun", "-N2", "--ntasks-per-node=1", "--gres=gpu:2", "--mpi=pmi2", PYTHON, *TOY, "8",
                                  "--sleep", "2", "--gpu", "all", "--threads", "1", "--no-progress", "--results", str(results)],
                        timeout=300)
    assert done.returncode == 0, done.stderr
    assert [w["devices"] for w in read_summary(results)["workers"]] == [["gpu0", "gpu1"]] * 2
    assert [w["host"] for w in read_summary(results)["workers"]] == ["node1", "node2"]
    # every worker says what it was given as it starts (2 s items: a worker that starts late still
    # starts before the end, but which workers get items is a race)
    for rank in range(2):
        for gpu in range(2):
            started = (results / "logs" / f"rank{rank}-gpu{gpu}.log").read_text().splitlines()[0]
            assert f"device gpu{gpu}, CUDA_VISIBLE_DEVICES={gpu}," in started, started
    # and the app's items saw the same, each in its own worker
    entries = [json.loads(line) for line in (results / "journal.jsonl").read_text().splitlines() if line.strip()]
    seen = {(e["host"], e["worker"], e["result"]["cuda_visible"]) for e in entries if e.get("type") == "result"}
    assert len(seen) >= 2, seen
    for host, worker, visible in seen:
        assert visible in ("0", "1") and worker.endswith(f"gpu{visible}"), (host, worker, visible)


def test_a_results_folder_some_node_cannot_see_is_named_in_one_warning(vcluster):
    results = Path("/tmp/private-results")  # every node's /tmp is its own
    vcluster.run("node1", ["rm", "-rf", str(results)])
    done = hydra(vcluster, TOY + ["4", *CPU], results, nodes=2, timeout=300)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "not visible from" in line]
    assert len(warnings) == 1 and "node2" in warnings[0] and "node2:/tmp/private-results/logs" in warnings[0], done.stderr
    assert "node1" not in warnings[0].split("not visible from")[1].split(":")[0]


def test_a_data_dir_some_node_cannot_see_is_one_line_naming_that_node(vcluster):
    from test_data import write_idx

    data = Path("/tmp/private-data")  # on node1's /tmp only
    staging = vcluster.shared / "idx"
    staging.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, shape in (("train-images-idx3-ubyte", (50, 28, 28)), ("t10k-images-idx3-ubyte", (20, 28, 28))):
        write_idx(staging / stem, rng.integers(0, 255, shape, dtype=np.uint8))
    for stem, count in (("train-labels-idx1-ubyte", 50), ("t10k-labels-idx1-ubyte", 20)):
        write_idx(staging / stem, (np.arange(count) % 10).astype(np.uint8))
    vcluster.run("node1", ["sh", "-c", f"rm -rf {data} && cp -r {staging} {data}"], check=True)
    results = vcluster.shared / "unseen-data"
    shutil.rmtree(results, ignore_errors=True)
    done = hydra(vcluster, ["-m", "mnist_svm", "2", "--dataset", "fashion-mnist", "--data-dir", str(data), *CPU],
                 results, nodes=2, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "on node2 (rank 1)" in lines[0] and str(data) in lines[0], done.stderr
    assert not results.exists(), "nothing may be written"
