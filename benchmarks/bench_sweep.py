"""A sweep's overhead per item against the same work written as an App, in the same run.

Both run the same no-op function over items keyed alike (``i=0`` ... ``i=N-1``), 1 rank x 2 CPU
workers. A round runs both systems on N1 items and then both on N2 items, one system right after
the other (which goes first alternates from round to round), so that a slow spell of the machine
hits both alike; the round's slope (T2 - T1) / (N2 - N1) is the cost of one more item, start-up
excluded. The sweep's slope includes what it adds per item: the key, the call by argument names, the JSON
check of each return, and its rows in results.csv and results.jsonl. Target: within 10% of the
App's. The sweep takes 32-bit item seeds (``App.seed_form = "int32"``), cheaper to make than the
SeedSequence an App gets by default: a third system, the App given those seeds too, shows what the
sweep adds besides (reported, not judged).

Each run is timed twice: wall time, and the CPU time (user + system) of the whole process tree (the
rank, its workers, the timeline's drawing child), read from ``getrusage(RUSAGE_CHILDREN)``. On a
shared machine the wall slope is the difference of two noisy wall times; the CPU slope measures the
same work per item without the other tenants' share, so the target is judged on it.

The verdict is the median over rounds of each system's slope (one bad round moves a median little,
where the best of whole runs picked per size mixed runs of different rounds), and the spread is
reported beside it: the lowest and highest slope of each system, and of the per-round ratio
(the sweep's slope over the App's of the same round).
"""
from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from benchmarks import no_options

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
ENGINE = ["--gpu", "cpu", "--workers", "2", "--no-progress"]
#: the sweep may cost this much more per item than the App
TARGET_RATIO = 1.10
APP, SWEEP = "App (benchmarks/sweep_noop.py)", "common.sweep"
#: the App given the sweep's item seeds (a 32-bit word, not a SeedSequence): the sweep's own extra
APP_INT32 = "App with seed_form int32"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: List[str]) -> tuple:
    """(wall seconds, CPU seconds of the command's whole process tree)."""
    started, cpu = time.perf_counter(), _children_cpu()
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
    return time.perf_counter() - started, _children_cpu() - cpu


def _sweep(n_items: int, folder: Path) -> List[str]:
    grid = folder / "grid.json"
    grid.write_text(json.dumps({"i": list(range(n_items))}))
    return [PY, "-m", "common.sweep", "benchmarks.sweep_noop:noop", "--grid", str(grid), *ENGINE,
            "--results", str(folder / "r")]


def _app(n_items: int, folder: Path) -> List[str]:
    return [PY, str(REPO / "benchmarks" / "sweep_noop.py"), str(n_items), *ENGINE, "--results", str(folder / "r")]


def _app_int32(n_items: int, folder: Path) -> List[str]:
    return _app(n_items, folder) + ["--seed-form", "int32"]


def _spread(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def overhead(n1: int = 2000, n2: int = 40000, rounds: int = 13) -> Dict[str, Any]:
    """Per-round slopes of both systems, interleaved, and their medians and spreads."""
    systems: Dict[str, Callable[[int, Path], List[str]]] = {APP: _app, APP_INT32: _app_int32, SWEEP: _sweep}
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in systems}
    for round_number in range(rounds):
        order = list(systems) if round_number % 2 == 0 else list(reversed(systems))
        timings: Dict[str, Dict[int, tuple]] = {name: {} for name in systems}
        for n in (n1, n2):
            for name in order:  # each size of both systems back to back: the same spell of the machine
                with tempfile.TemporaryDirectory() as folder:
                    timings[name][n] = _timed(systems[name](n, Path(folder)))
        for name, timed in timings.items():
            runs[name].append({"wall_n1": timed[n1][0], "wall_n2": timed[n2][0],
                               "cpu_n1": timed[n1][1], "cpu_n2": timed[n2][1],
                               "ms_per_item": (timed[n2][0] - timed[n1][0]) / (n2 - n1) * 1000,
                               "cpu_ms_per_item": (timed[n2][1] - timed[n1][1]) / (n2 - n1) * 1000})
    result: Dict[str, Any] = {"n1": n1, "n2": n2, "rounds": rounds, "systems": {}, "runs": runs}
    for name, rows in runs.items():
        result["systems"][name] = {
            "seconds_n1": statistics.median(r["wall_n1"] for r in rows),
            "seconds_n2": statistics.median(r["wall_n2"] for r in rows),
            "cpu_seconds_n1": statistics.median(r["cpu_n1"] for r in rows),
            "cpu_seconds_n2": statistics.median(r["cpu_n2"] for r in rows),
            "ms_per_item": statistics.median(r["ms_per_item"] for r in rows),
            "cpu_ms_per_item": statistics.median(r["cpu_ms_per_item"] for r in rows),
            "cpu_ms_per_item_spread": _spread([r["cpu_ms_per_item"] for r in rows])}
    ratios = [s["cpu_ms_per_item"] / a["cpu_ms_per_item"] for a, s in zip(runs[APP], runs[SWEEP])]
    result["round_ratio"] = _spread(ratios)
    result["round_ratio_same_seeds"] = _spread([s["cpu_ms_per_item"] / a["cpu_ms_per_item"]
                                               for a, s in zip(runs[APP_INT32], runs[SWEEP])])
    result["rounds_met"] = sum(ratio <= TARGET_RATIO for ratio in ratios)
    return result


def markdown(result: Dict[str, Any]) -> str:
    n1, n2 = f"{result['n1']:,}", f"{result['n2']:,}"
    lines = [f"### Sweep against App: no-op items, slope between {n1} and {n2} items "
             f"(median of {result['rounds']} interleaved rounds), 1 rank x 2 workers", "",
             f"| system | wall s, {n1} | wall s, {n2} | wall ms per item | CPU s, {n1} | CPU s, {n2} "
             f"| CPU ms per item | lowest - highest round |", "|---|---|---|---|---|---|---|---|"]
    for name, row in result["systems"].items():
        spread = row["cpu_ms_per_item_spread"]
        lines.append(f"| {name} | {row['seconds_n1']:.2f} | {row['seconds_n2']:.2f} | {row['ms_per_item']:.3f} "
                     f"| {row['cpu_seconds_n1']:.2f} | {row['cpu_seconds_n2']:.2f} | {row['cpu_ms_per_item']:.4f} "
                     f"| {spread['min']:.4f} - {spread['max']:.4f} |")
    ratio = result["round_ratio"]
    lines += ["", f"Per round, the sweep's CPU slope against the App's: median {ratio['median'] * 100 - 100:+.1f}% "
                  f"({ratio['min'] * 100 - 100:+.1f}% to {ratio['max'] * 100 - 100:+.1f}%); within 10% in "
                  f"{result['rounds_met']} of {result['rounds']} rounds"]
    same = result["round_ratio_same_seeds"]
    lines += ["", f"The sweep against the App given the same 32-bit item seeds (what the sweep adds besides: its key, "
                  f"the call by names, the JSON check, results.csv and results.jsonl): median "
                  f"{same['median'] * 100 - 100:+.1f}% ({same['min'] * 100 - 100:+.1f}% to "
                  f"{same['max'] * 100 - 100:+.1f}%)"]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    no_options("benchmarks.bench_sweep", __doc__, argv)
    result = overhead()
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    (out / "bench_sweep.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    app, sweep = result["systems"][APP], result["systems"][SWEEP]
    met = sweep["cpu_ms_per_item"] <= app["cpu_ms_per_item"] * TARGET_RATIO
    print(f"\ntarget (the sweep's median CPU cost per item within 10% of the App's): {'met' if met else 'NOT met'} "
          f"({sweep['cpu_ms_per_item'] / app['cpu_ms_per_item'] * 100 - 100:+.1f}%; wall: "
          f"{sweep['ms_per_item'] / app['ms_per_item'] * 100 - 100:+.1f}%)")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
