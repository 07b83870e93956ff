"""Engine overhead per item and load balance, each against its baseline in the same run.

Overhead: wall time of whole runs with N1 and N2 no-op items; the slope (T2 - T1) / (N2 - N1) is
the cost of one more item, start-up excluded. Same number of workers (2) everywhere.
Load balance: 2 ranks x 2 workers, lognormal sleep items; makespan against the ideal bound
max(total / workers, longest item), and against the reference's static contiguous split.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import numpy as np

from benchmarks import no_options
from common.results.layout import ResultsLayout

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
MPIEXEC = os.path.join(sys.prefix, "bin", "mpiexec")
TOY = str(REPO / "tests" / "toy_app.py")
BASELINES = str(REPO / "benchmarks" / "baselines.py")


def timed(command: list) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
    return time.perf_counter() - started


def ours(n_items: int, ranks: int, workers: int, folder: Path, extra: list = ()) -> list:
    command = [PY, TOY, str(n_items), "--workers", str(workers), "--gpu", "cpu", "--no-progress",
               "--results", str(folder), *extra]
    return [MPIEXEC, "-n", str(ranks), *command] if ranks > 1 else command


def overhead(n1: int = 300, n2: int = 3000, repeats: int = 3) -> dict:
    """Seconds per additional no-op item for each system (best of ``repeats``)."""
    systems = {
        "multinode-gpu, 1 rank x 2 workers": lambda n, d: ours(n, 1, 2, d),
        "multinode-gpu, 2 ranks x 1 worker": lambda n, d: ours(n, 2, 1, d),
        "multiprocessing.Pool(2).imap_unordered": lambda n, d: [PY, BASELINES, "pool", str(n), "2"],
        "mpi4py.futures.MPIPoolExecutor, 2 workers": lambda n, d: [MPIEXEC, "-n", "3", PY, "-m", "mpi4py.futures",
                                                                    BASELINES, "futures", str(n)],
    }
    rows = {}
    for name, make in systems.items():
        times = {}
        for n in (n1, n2):
            best = float("inf")
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as folder:
                    best = min(best, timed(make(n, Path(folder) / "r")))
            times[n] = best
        rows[name] = {"seconds_n1": times[n1], "seconds_n2": times[n2],
                      "ms_per_item": (times[n2] - times[n1]) / (n2 - n1) * 1000}
    return {"n1": n1, "n2": n2, "systems": rows}


def load_balance(n_items: int = 200, mean: float = 0.1, sigma: float = 1.0, ascending: bool = False) -> dict:
    durations = np.random.default_rng(12345).lognormal(0.0, sigma, n_items)
    durations = np.sort(durations) if ascending else durations
    durations = durations / durations.mean() * mean  # what toy_app --lognormal [--ascending] uses
    workers = 4
    ideal = max(durations.sum() / workers, durations.max())
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "r"
        extra = ["--sleep", str(mean), "--lognormal", str(sigma)] + (["--ascending"] if ascending else [])
        subprocess.run(ours(n_items, 2, 2, results, extra),
                       check=True, cwd=REPO, capture_output=True)
        records = [json.loads(line) for line in ResultsLayout(results).journal.read_text().splitlines()]
        records = [r for r in records if r.get("type") == "result"]
        dynamic = max(r["end"] for r in records) - min(r["start"] for r in records)
        spec = Path(folder) / "durations.json"
        spec.write_text(json.dumps(durations.tolist()))
        out = subprocess.run([MPIEXEC, "-n", "2", PY, BASELINES, "static", str(spec), "2"], check=True,
                             cwd=REPO, capture_output=True, text=True).stdout
        static = json.loads(out.strip().splitlines()[-1])["makespan"]
    return {"items": n_items, "order": "ascending" if ascending else "random", "workers": workers, "total_work_s": float(durations.sum()),
            "longest_item_s": float(durations.max()), "ideal_s": float(ideal),
            "dynamic_makespan_s": dynamic, "dynamic_over_ideal_percent": (dynamic / ideal - 1) * 100,
            "static_makespan_s": static, "static_over_ideal_percent": (static / ideal - 1) * 100}


def markdown(result: dict) -> str:
    over = result["overhead"]
    lines = [f"### Engine overhead per item (no-op items; slope between {over['n1']} and {over['n2']} items)", "",
             "| system | wall s, N1 | wall s, N2 | ms per item |", "|---|---|---|---|"]
    for name, row in over["systems"].items():
        lines.append(f"| {name} | {row['seconds_n1']:.2f} | {row['seconds_n2']:.2f} | {row['ms_per_item']:.3f} |")
    for balance in result["load_balance"]:
        lines += ["", f"### Load balance: {balance['items']} lognormal sleep items (sigma 1, mean 0.1 s, "
                      f"{balance['order']} order), 2 ranks x 2 workers", "",
                  "| schedule | makespan s | over ideal |", "|---|---|---|",
                  f"| ideal bound max(total/workers, longest) | {balance['ideal_s']:.2f} | 0% |",
                  f"| multinode-gpu (dynamic, longest first) | {balance['dynamic_makespan_s']:.2f} | "
                  f"{balance['dynamic_over_ideal_percent']:+.1f}% |",
                  f"| static contiguous split per rank (reference) | {balance['static_makespan_s']:.2f} | "
                  f"{balance['static_over_ideal_percent']:+.1f}% |"]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    no_options("benchmarks.bench_engine", __doc__, argv)
    result = {"overhead": overhead(), "load_balance": [load_balance(), load_balance(ascending=True)]}
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    (out / "bench_engine.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    ours = [row["ms_per_item"] for name, row in result["overhead"]["systems"].items() if name.startswith("multinode")]
    futures = result["overhead"]["systems"]["mpi4py.futures.MPIPoolExecutor, 2 workers"]["ms_per_item"]
    met = (max(ours) <= 1.0 and max(ours) <= futures
           and all(b["dynamic_over_ideal_percent"] <= 5.0 for b in result["load_balance"]))
    print(f"\ntargets (<= 1 ms per item, no worse than mpi4py.futures, makespan within 5% of ideal): "
          f"{'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
