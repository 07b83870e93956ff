"""One workload through one peer, written as that peer's users write it; the results (index, start,
end, arrival at the driver), the version and any error go to OUT as JSON.

python -m benchmarks.peers.run SYSTEM SPEC OUT      (mpi4py: under mpiexec -n 3 python -m mpi4py.futures)
SYSTEM: ppe, mpi4py, dask, ray, parsl, joblib. Each imports its peer only here, so a peer not
installed costs nothing to the others.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, Dict, List

from .work import work

Args = List[tuple]


def run_ppe(calls: Args, workers: int) -> Dict[str, Any]:
    import concurrent.futures as cf

    out = []
    with cf.ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(work, *call) for call in calls]
        for future in cf.as_completed(futures):
            out.append((*future.result(), time.time()))
    return {"results": out, "version": f"Python {sys.version.split()[0]}"}


def run_mpi4py(calls: Args, workers: int) -> Dict[str, Any]:
    import mpi4py
    from mpi4py.futures import MPIPoolExecutor, as_completed

    out = []
    with MPIPoolExecutor() as pool:
        futures = [pool.submit(work, *call) for call in calls]
        for future in as_completed(futures):
            out.append((*future.result(), time.time()))
    return {"results": out, "version": f"mpi4py {mpi4py.__version__}"}


def run_dask(calls: Args, workers: int) -> Dict[str, Any]:
    import dask
    from dask.distributed import Client, LocalCluster, as_completed

    out = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        futures = [client.submit(work, *call, pure=False) for call in calls]
        for _, result in as_completed(futures, with_results=True):
            out.append((*result, time.time()))
    return {"results": out, "version": f"dask {dask.__version__}"}


def run_ray(calls: Args, workers: int) -> Dict[str, Any]:
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(work)
    pending = [remote.remote(*call) for call in calls]
    out = []
    while pending:
        done, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=0.01)
        now = time.time()
        out.extend((*result, now) for result in ray.get(done))
    ray.shutdown()
    return {"results": out, "version": f"ray {ray.__version__}"}


def run_parsl(calls: Args, workers: int) -> Dict[str, Any]:
    import concurrent.futures as cf
    import os

    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    config = Config(executors=[HighThroughputExecutor(max_workers_per_node=workers, provider=LocalProvider())],
                    retries=1, run_dir=os.path.join(calls[0][3], "runinfo"))  # its logs: in the run's scratch folder
    out = []
    with parsl.load(config):
        app = parsl.python_app(work)
        futures = [app(*call) for call in calls]
        for future in cf.as_completed(futures):
            out.append((*future.result(), time.time()))
    return {"results": out, "version": f"parsl {parsl.__version__}"}


def run_joblib(calls: Args, workers: int) -> Dict[str, Any]:
    import joblib
    from joblib import Parallel, delayed

    out = [(*result, time.time()) for result in
           Parallel(n_jobs=workers, return_as="generator_unordered")(delayed(work)(*call) for call in calls)]
    return {"results": out, "version": f"joblib {joblib.__version__}"}


SYSTEMS: Dict[str, Callable[[Args, int], Dict[str, Any]]] = {
    "ppe": run_ppe, "mpi4py": run_mpi4py, "dask": run_dask, "ray": run_ray, "parsl": run_parsl, "joblib": run_joblib}


def main(argv: List[str]) -> int:
    system, spec_path, out_path = argv
    spec = json.loads(open(spec_path).read())
    calls = [(i, s, spec["fault"] if i == spec.get("fault_index", -1) else "", spec["marker_dir"])
             for i, s in enumerate(spec["durations"])]
    if spec.get("longest_first"):  # as a user who knows the durations submits them (ours: its cost hints)
        calls.sort(key=lambda call: -call[1])
    try:
        answer = SYSTEMS[system](calls, spec["workers"])
    except BaseException as error:  # what the user sees: the run fails (a broken pool, an aborted job)
        answer = {"results": [], "error": f"{type(error).__name__}: {error}".splitlines()[0][:200]}
    answer["ended"] = time.time()
    with open(out_path, "w") as handle:
        json.dump(answer, handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
