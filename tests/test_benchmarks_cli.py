"""The benchmarks' own command lines and tables: --help says what a benchmark does instead of
starting it, a name that is no benchmark is one line and exit 2, and bench_peers' table has rows
and notes only for the workloads it ran."""
from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.bench_peers import markdown, summarise
from helpers import REPO


@pytest.mark.parametrize("module", ["benchmarks", "benchmarks.bench_engine", "benchmarks.bench_sweep"])
def test_help_describes_a_benchmark_without_running_it(module, tmp_path):
    ran = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert ran.returncode == 0 and ran.stdout.startswith(f"usage: python -m {module}"), ran
    assert not (tmp_path / "bench-results").exists()  # nothing ran


def test_a_name_that_is_no_benchmark_is_one_line_and_exit_2(tmp_path):
    ran = subprocess.run([sys.executable, "-m", "benchmarks", "bench_nope"], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert ran.returncode == 2 and ran.stdout == "", ran
    assert ran.stderr.splitlines()[-1] == ("python -m benchmarks: error: no benchmark 'bench_nope': choose from "
                                           "bench_engine, bench_peers, bench_sweep, bench_scale, bench_svm, bench_nn")
    assert "Traceback" not in ran.stderr and not (tmp_path / "bench-results").exists()


def noop_run(system: str, ms: float) -> dict:
    return {"system": system, "workload": "noop", "round": 0, "ms_per_item": ms, "launch_to_first_s": 0.1,
            "last_to_exit_s": 0.05, "complete": True, "each_once": True, "version": f"{system} 1"}


def test_bench_peers_table_has_rows_only_for_the_workloads_run():
    systems = ["ppe", "dask", "ours-1x2"]
    runs = [noop_run("ppe", 0.1), noop_run("dask", 2.0), noop_run("ours-1x2", 0.05)]
    text = markdown(runs, systems, summarise(runs, systems), 1, 30.0)
    assert "| 5,000 no-op items, ms per item | 0.100 | 2.000 (20.00x) | 0.050 (0.50x) |" in text
    for absent in ("SIGKILLed", "SIGSTOPped", "rerun", "not run (its checkpointing", "hung-worker"):
        assert absent not in text, (absent, text)
    runs.append({"system": "ours-1x2", "workload": "resume", "round": 0, "complete": True, "recomputed": 2})
    text = markdown(runs, systems, summarise(runs, systems), 1, 30.0)
    assert ("| whole job SIGKILLed after 150 of 400 results, then rerun: items recomputed | not run (its checkpointing "
            "not set up) | not run (its checkpointing not set up) | 2 |") in text
    assert "The rerun row:" in text and "hung-worker" not in text
    assert "lognormal" not in text  # the skew workloads did not run either
    # a kill alone: its row, and none of the no-op or skew rows
    runs = [dict(system=system, workload="kill", round=0, complete=True, each_once=True, fault_delay_s=0.5)
            for system in systems]
    text = markdown(runs, systems, summarise(runs, systems), 1, 30.0)
    assert "| one worker SIGKILLed: completes, each result once; the item's delay | yes, +0.50 s | yes, +0.50 s | " \
           "yes, +0.50 s |" in text
    for absent in ("no-op", "launch", "lognormal", "rerun", "hung-worker"):
        assert absent not in text, (absent, text)
