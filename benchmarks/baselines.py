"""The baselines the engine is measured against, as small programs run in their own processes.

python benchmarks/baselines.py pool N WORKERS          multiprocessing.Pool.imap_unordered, no-op items
python -m mpi4py.futures benchmarks/baselines.py futures N    MPIPoolExecutor.map (unordered), no-op items
mpiexec -n R python benchmarks/baselines.py static SPEC WORKERS   the reference: contiguous split per rank
Each prints one JSON line.
"""
from __future__ import annotations

import json
import sys
import time


def noop(index: int) -> int:
    return index


def sleep_for(seconds: float) -> tuple:
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def run_pool(n_items: int, workers: int) -> dict:
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        done = sum(1 for _ in pool.imap_unordered(noop, range(n_items)))
    return {"done": done}


def run_futures(n_items: int) -> dict:
    from mpi4py.futures import MPIPoolExecutor

    with MPIPoolExecutor() as executor:
        done = sum(1 for _ in executor.map(noop, range(n_items), unordered=True))
    return {"done": done}


def run_static(spec_path: str, workers: int) -> dict:
    """Each rank takes its contiguous share of the items and runs it with its own workers."""
    import multiprocessing

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    durations = json.load(open(spec_path))
    share = [durations[i] for i in range(len(durations)) if i * comm.size // len(durations) == comm.rank]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        spans = list(pool.imap_unordered(sleep_for, share))
    spans = comm.gather(spans, root=0)
    if comm.rank != 0:
        return {}
    flat = [s for rank in spans for s in rank]
    return {"makespan": max(e for _, e in flat) - min(s for s, _ in flat)}


if __name__ == "__main__":
    kind = sys.argv[1]
    started = time.perf_counter()
    if kind == "pool":
        out = run_pool(int(sys.argv[2]), int(sys.argv[3]))
    elif kind == "futures":
        out = run_futures(int(sys.argv[2]))
    else:
        out = run_static(sys.argv[2], int(sys.argv[3]))
    if out:
        out["seconds"] = time.perf_counter() - started
        print(json.dumps(out))
