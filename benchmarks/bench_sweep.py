"""A sweep's overhead per item against the same work written as an App, in the same run.

Both run the same no-op function over items keyed alike (``i=0`` ... ``i=N-1``), 1 rank x 2 CPU
workers; each is timed on whole runs of N1 and N2 items (best of ``repeats``), and the slope
(T2 - T1) / (N2 - N1) is the cost of one more item, start-up excluded. The sweep's slope includes
what it adds per item: the key, the call by argument names, the JSON check of each return, and its
rows in results.csv and results.jsonl. Target: within 10% of the App's.

Each run is timed twice: wall time, and the CPU time (user + system) of the whole process tree (the
rank, its workers, the timeline's drawing child), read from ``getrusage(RUSAGE_CHILDREN)``. On a
shared machine the wall slope is the difference of two noisy wall times; the CPU slope measures the
same work per item without the other tenants' share, so the target is judged on it.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
ENGINE = ["--gpu", "cpu", "--workers", "2", "--no-progress"]
#: the sweep may cost this much more per item than the App
TARGET_RATIO = 1.10


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list) -> tuple:
    """(wall seconds, CPU seconds of the command's whole process tree)."""
    started, cpu = time.perf_counter(), _children_cpu()
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
    return time.perf_counter() - started, _children_cpu() - cpu


def _sweep(n_items: int, folder: Path) -> list:
    grid = folder / "grid.json"
    grid.write_text(json.dumps({"i": list(range(n_items))}))
    return [PY, "-m", "common.sweep", "benchmarks.sweep_noop:noop", "--grid", str(grid), *ENGINE,
            "--results", str(folder / "r")]


def _app(n_items: int, folder: Path) -> list:
    return [PY, str(REPO / "benchmarks" / "sweep_noop.py"), str(n_items), *ENGINE, "--results", str(folder / "r")]


def overhead(n1: int = 2000, n2: int = 20000, repeats: int = 3) -> dict:
    systems = {"App (benchmarks/sweep_noop.py)": _app, "common.sweep": _sweep}
    rows: dict = {}
    for _ in range(repeats):  # interleaved: a slow spell of the machine hits both alike
        for name, make in systems.items():
            for n in (n1, n2):
                with tempfile.TemporaryDirectory() as folder:
                    wall, cpu = _timed(make(n, Path(folder)))
                row = rows.setdefault(name, {"wall": {n1: float("inf"), n2: float("inf")},
                                             "cpu": {n1: float("inf"), n2: float("inf")}})
                row["wall"][n], row["cpu"][n] = min(row["wall"][n], wall), min(row["cpu"][n], cpu)
    result = {"n1": n1, "n2": n2, "repeats": repeats, "systems": {}}
    for name, row in rows.items():
        wall, cpu = row["wall"], row["cpu"]
        result["systems"][name] = {"seconds_n1": wall[n1], "seconds_n2": wall[n2],
                                   "ms_per_item": (wall[n2] - wall[n1]) / (n2 - n1) * 1000,
                                   "cpu_seconds_n1": cpu[n1], "cpu_seconds_n2": cpu[n2],
                                   "cpu_ms_per_item": (cpu[n2] - cpu[n1]) / (n2 - n1) * 1000}
    return result


def markdown(result: dict) -> str:
    lines = [f"### Sweep against App: no-op items, slope between {result['n1']:,} and {result['n2']:,} items "
             f"(best of {result['repeats']}), 1 rank x 2 workers", "",
             f"| system | wall s, {result['n1']:,} | wall s, {result['n2']:,} | wall ms per item "
             f"| CPU s, {result['n1']:,} | CPU s, {result['n2']:,} | CPU ms per item |", "|---|---|---|---|---|---|---|"]
    for name, row in result["systems"].items():
        lines.append(f"| {name} | {row['seconds_n1']:.2f} | {row['seconds_n2']:.2f} | {row['ms_per_item']:.3f} "
                     f"| {row['cpu_seconds_n1']:.2f} | {row['cpu_seconds_n2']:.2f} | {row['cpu_ms_per_item']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    result = overhead()
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    (out / "bench_sweep.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    app, sweep = (row["cpu_ms_per_item"] for row in result["systems"].values())
    wall_app, wall_sweep = (row["ms_per_item"] for row in result["systems"].values())
    met = sweep <= app * TARGET_RATIO
    print(f"\ntarget (the sweep's CPU cost per item within 10% of the App's): {'met' if met else 'NOT met'} "
          f"({sweep / app * 100 - 100:+.1f}%; wall: {wall_sweep / wall_app * 100 - 100:+.1f}%)")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
